"""Preparation steps of the open-loop driver (``benchmarks/run_open_loop.py``, module docstring steps 1-2):
the warm-up of every server, the load calibration on one, and the TTFT probe.

Each takes the driver (``run_open_loop.Driver``: arguments ``a``, the manifest, ``log``, ``left``) and
talks to the servers over HTTP (``benchmarks/serve_bench.py``); none raises on a failed request except
:func:`calibrate` when every request failed (RuntimeError).
"""

from __future__ import annotations

import threading
import time

from benchmarks import serve_bench as sb
from benchmarks import ttft_probe as tp
from benchmarks.build_trace import load_trace, turn_requests

__all__ = ["warm_up", "calibrate", "probe"]


def _requests(trace, clip: int, vocab: int, turns: int | None = None):
    """Every conversation's requests of ``trace`` (the first ``turns`` of each), replies clipped at ``clip``."""
    _, convs = load_trace(trace)
    return [turn_requests(i, c, vocab_size=vocab, decode_clip=clip)[: turns or None] for i, c in enumerate(convs)]


def warm_up(d, names: list[str]) -> None:
    """Untimed, all servers at once, then flush: ``--warmup-conversations`` two-turn conversations of
    the warm trace, then one never-cached request at each TTFT-probe length, one at a time, so the
    measured trace's long prompts (chunked prefill up to the context length) are not compiled on first
    use inside a measured run (the 2026-12-01 run's first 512-token and 16k-token requests paid ~1 s)."""
    reqs = _requests(d.a.warm_trace, 32, d.a.vocab_size, turns=2)[-d.a.warmup_conversations:]
    lengths = tp.probe_lengths(d.a.ttft_probe_lengths or tp.DEFAULT_LENGTHS, d.a.context_length)
    singles = tp.probe_requests(lengths, 1, d.a.vocab_size) if lengths else []

    def one(n: str) -> None:
        url = f"http://127.0.0.1:{d.manifest['arms'][n]['port']}"
        t = time.monotonic()
        recs, _ = sb.run_replay(url, reqs, source_ids=[""] * len(reqs), concurrency=d.a.max_running_requests,
                                timeout_s=120)
        failed = sum(1 for r in recs if not r.success)
        for q in singles:
            failed += 0 if sb.send_generate("127.0.0.1", d.manifest["arms"][n]["port"], q, timeout_s=120).success else 1
        sb._http(url, "POST", "/flush_cache")
        d.manifest["arms"][n]["warmup"] = {"s": round(time.monotonic() - t, 1), "failed": failed,
                                           "long_prompts": lengths}

    ts = [threading.Thread(target=one, args=(n,)) for n in names]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def calibrate(d, name: str) -> dict:
    """Median E2E latency S (s) of single first turns of the measured trace (one in flight), replies
    clipped as in the run, the first two dropped, times ``--batch-margin`` (module docstring, step 2).
    The median, not the mean: one first-use compile in the sample inflated the 2026-12-01 mean ~1.7x."""
    import statistics

    url = f"http://127.0.0.1:{d.manifest['arms'][name]['port']}"
    reqs = _requests(d.a.trace, d.a.decode_clip, d.a.vocab_size, turns=1)[-(d.a.calibration_requests + 2):]
    recs, wall = sb.run_replay(url, reqs, source_ids=[""] * len(reqs), concurrency=1, timeout_s=60)
    sb._http(url, "POST", "/flush_cache")
    ok = [r for r in sorted(recs, key=lambda r: r.start_s)[2:] if r.success]
    if not ok:
        raise RuntimeError(f"calibration on {name}: every request failed ({recs[0].error if recs else 'none sent'})")
    e2e = statistics.median(r.e2e_s for r in ok)
    return {"arm": name, "requests": len(ok), "e2e_single_s": e2e, "statistic": "median",
            "e2e_single_mean_s": statistics.mean(r.e2e_s for r in ok), "batch_margin": d.a.batch_margin,
            "service_s": e2e * d.a.batch_margin, "ttft_s": statistics.median(r.ttft_s for r in ok), "wall_s": wall}


def probe(d, name: str) -> dict:
    """The TTFT probe on arm ``name`` (module docstring, step 2; ``benchmarks/ttft_probe.py``), logged
    in one line. Returns its record; an error is recorded in it (and logged), never raised."""
    a = d.a
    lengths = tp.probe_lengths(a.ttft_probe_lengths, a.context_length)
    if a.no_ttft_probe or not lengths:
        why = "--no-ttft-probe" if a.no_ttft_probe else (f"no --ttft-probe-lengths left below --context-length "
                                                         f"{a.context_length} - {tp.CONTEXT_MARGIN}")
        d.log(f"ttft probe: skipped ({why})")
        return {"arm": name, "skipped": why}
    try:
        res = tp.run_probe(f"http://127.0.0.1:{d.manifest['arms'][name]['port']}", lengths, reps=a.ttft_probe_reps,
                           vocab_size=a.vocab_size, budget_s=min(a.ttft_probe_max_s, max(0.0, d.left() / 4)))
    except Exception as e:      # noqa: BLE001 -- the probe must never end the run
        res = {"lengths": lengths, "reps": a.ttft_probe_reps, "error": f"{type(e).__name__}: {e}"}
    d.log(f"ttft probe on {name}: {tp.probe_line(res)}")
    return {"arm": name, **res}
