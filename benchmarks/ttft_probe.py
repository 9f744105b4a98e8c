"""TTFT against uncached prompt length on one running server: how much of TTFT a cache hit can remove.

The 2026-12-01 open-loop run (benchmarks/notes/2026-12-01-h200-open-loop-calibrated-kimi.md) found
TTFT about 85-95 ms whatever was cached: at its prompt lengths the prefill a hit saves was a small
share of TTFT. This probe measures that split directly, on the same server as the run: single
``/generate`` requests, one in flight at a time, of prompts that cannot hit the prefix cache
(every request's token ids are a range of its own, disjoint from every other request's, below
the served vocabulary), ``max_new_tokens`` 1, at a few lengths, each repeated; the cache is
flushed after. It reports the mean TTFT per length and the least-squares line

    ttft_ms = a + b * tokens / 1000

(``a``: the per-request cost a hit cannot remove, ms; ``b``: prefill, ms per 1,000 uncached
tokens). Requests are sent and timed by ``serve_bench.send_generate`` (TTFT = first streamed
event carrying a generated token). Lengths run interleaved (all lengths, then again), so a drift
over the probe does not fall on one length.

Used by ``benchmarks/run_open_loop.py`` after its calibration (``manifest["ttft_probe"]``).
"""

from __future__ import annotations

import http.client
import math
import statistics
import time
from typing import Sequence
from urllib.parse import urlsplit

from benchmarks import serve_bench as sb
from benchmarks.build_trace import TurnRequest

__all__ = ["DEFAULT_LENGTHS", "CONTEXT_MARGIN", "probe_lengths", "probe_requests", "fit_line", "run_probe",
           "probe_line"]

#: prompt lengths probed by default (tokens): the open-loop traces' range and a 16k context
DEFAULT_LENGTHS = (512, 2048, 4096, 8192, 16000)
#: tokens left free below the served context length (the one generated token, and slack)
CONTEXT_MARGIN = 64


def probe_lengths(lengths: Sequence[int], context_length: int) -> list[int]:
    """The lengths probed (tokens): each clipped to ``context_length - CONTEXT_MARGIN``, dropped
    when that leaves none (<= 0), duplicates after clipping kept once, in the given order."""
    cap = context_length - CONTEXT_MARGIN
    out: list[int] = []
    for n in lengths:
        n = min(int(n), cap)
        if n > 0 and n not in out:
            out.append(n)
    return out


def probe_requests(lengths: Sequence[int], reps: int, vocab_size: int) -> list[TurnRequest]:
    """``reps`` rounds over ``lengths``: request j holds the ids ``[s_j, s_j + L_j)`` with
    ``s_j`` the tokens of the requests before it, so no two requests share an id (nor a prefix).

    Returns:
        requests in send order, ``conv = -2`` (not a trace conversation), ``turn = j``,
        ``max_new_tokens = 1``.
    Raises:
        ValueError: the ranges do not fit below ``vocab_size`` (names both figures).
    """
    need = reps * sum(lengths)
    if need > vocab_size:
        raise ValueError(f"the probe needs {need} distinct token ids ({reps} x {list(lengths)}), "
                         f"the vocabulary holds {vocab_size}")
    out, start = [], 0
    for _ in range(reps):
        for n in lengths:
            out.append(TurnRequest(conv=-2, turn=len(out), input_ids=tuple(range(start, start + n)),
                                   max_new_tokens=1))
            start += n
    return out


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x`` over the points; returns ``(a, b)``.

    Raises:
        ValueError: fewer than two distinct x.
    """
    if len(set(xs)) < 2:
        raise ValueError(f"a line needs two distinct lengths, got {sorted(set(xs))}")
    b, a = statistics.linear_regression(xs, ys)
    return a, b


def run_probe(url: str, lengths: Sequence[int], *, reps: int, vocab_size: int, budget_s: float = 60.0,
              timeout_s: float = 60.0) -> dict:
    """Send the probe to ``url`` one request at a time, then ``POST /flush_cache``.

    Args:
        lengths: prompt lengths in tokens (already :func:`probe_lengths`); reps: rounds over them.
        budget_s: no request is started after this many seconds (the rest are recorded as not sent).
        timeout_s: per-request timeout (s), never beyond what is left of ``budget_s`` (at least 5 s).
    Returns:
        ``{"lengths", "reps", "requests": [{"tokens", "ttft_ms", "cached_tokens", "ok", "error"}],
        "per_length": [{"tokens", "requests", "ttft_ms_mean"}], "fit": {"a_ms", "b_ms_per_1k_tokens",
        "points"} or None, "wall_s", "error"}``: ``error`` is None, or why the probe stopped or
        gave no line (the first failed request stops it: one at a time, a failure means the
        server is in trouble). Never raises for a server problem.
    """
    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    res: dict = {"lengths": list(lengths), "reps": reps, "requests": [], "per_length": [], "fit": None,
                 "wall_s": 0.0, "error": None}
    t0 = time.monotonic()
    try:
        reqs = probe_requests(lengths, reps, vocab_size)
        for i, req in enumerate(reqs):
            left = budget_s - (time.monotonic() - t0)
            if left <= 0:
                res["error"] = f"time budget {budget_s:.0f} s spent: {len(reqs) - i} of {len(reqs)} requests not sent"
                break
            r = sb.send_generate(host, port, req, timeout_s=max(5.0, min(timeout_s, left)))
            res["requests"].append({"tokens": r.prompt_tokens, "ttft_ms": r.ttft_s * 1e3 if r.success else None,
                                    "cached_tokens": r.cached_tokens, "ok": r.success, "error": r.error})
            if not r.success:
                res["error"] = f"request {i} ({r.prompt_tokens} tokens) failed: {r.error[:200]}"
                break
    except ValueError as e:
        res["error"] = str(e)
    finally:
        try:
            sb._http(url, "POST", "/flush_cache")
        except (OSError, http.client.HTTPException) as e:
            res["error"] = res["error"] or f"/flush_cache after the probe failed: {e}"
    ok = [r for r in res["requests"] if r["ok"]]
    for n in lengths:
        ms = [r["ttft_ms"] for r in ok if r["tokens"] == n]
        if ms:
            res["per_length"].append({"tokens": n, "requests": len(ms), "ttft_ms_mean": sum(ms) / len(ms)})
    try:
        a, b = fit_line([r["tokens"] / 1000 for r in ok], [r["ttft_ms"] for r in ok])
        res["fit"] = {"a_ms": a, "b_ms_per_1k_tokens": b, "points": len(ok)}
    except ValueError as e:
        res["error"] = res["error"] or f"no fit: {e}"
    res["wall_s"] = round(time.monotonic() - t0, 2)
    return res


def probe_line(res: dict) -> str:
    """One log line: mean TTFT per length and the fitted line (or the error)."""
    means = ", ".join(f"{p['tokens']}: {p['ttft_ms_mean']:.1f}" for p in res.get("per_length") or [])
    fit = res.get("fit")
    line = (f"TTFT ms by uncached prompt tokens {{{means or 'none'}}}; "
            + (f"fit {fit['a_ms']:.1f} ms + {fit['b_ms_per_1k_tokens']:.2f} ms per 1k tokens ({fit['points']} requests"
               if fit else "(no fit")
            + f", {res.get('wall_s', math.nan):.1f} s)")
    return line + (f"; error: {res['error']}" if res.get("error") else "")
