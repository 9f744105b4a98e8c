"""Replay a multi-turn serving trace against a running SGLang server (paper App. C.3, Fig. 4).

Each of ``--concurrency`` client threads takes the next conversation of the trace and sends its
T turns one after another (turn k+1 leaves when turn k's stream has ended), so the number of
requests in flight is at most ``min(concurrency, conversations)``; the server's own
``--max-running-requests`` limit then decides how many run at once. Prompts are token ids
(``input_ids``, the server runs with ``--skip-tokenizer-init``), each turn's prompt is built from
the *recorded* replies (:func:`build_trace.turn_requests`), and the decode length is forced with
``ignore_eos``, so every arm (dense checkpoints, INT8 checkpoints, dasc) sees identical requests.

Per request it records, following SGLang 0.5.17's ``benchmark/serving.py``
(``async_request_sglang_generate``):
  * TTFT (s): request sent -> first streamed event that carries a generated token;
  * E2E latency (s): request sent -> end of the stream (``data: [DONE]``);
  * cached tokens: ``meta_info.cached_tokens`` of the last event (prefix-cache hit, tokens).
That module itself is not imported: it needs aiohttp/numpy/transformers and keys TTFT on a
``text`` field that ``--skip-tokenizer-init`` servers do not send. This client uses only the
standard library (threads + http.client), so it runs on the GPU machine as it is.

Outputs ``<out>.json`` (config, summary, per-request records) and ``<out>.md`` (the arm's table).
``benchmarks/plot_serving.py`` combines several arms.

Example (server already started with --skip-tokenizer-init --load-format dummy
--max-running-requests 32):
    python3 -m benchmarks.serve_bench --trace benchmarks/traces/sharegpt_qwen_n128_d512_s0.json.gz \\
        --url http://127.0.0.1:30000 --arm dense --checkpoint-capacity 64 \\
        --concurrency 256 --max-running-requests 32 --vocab-size 151936 --out out/dense_s0
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import queue
import random
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence
from urllib.parse import urlsplit

from benchmarks.build_trace import TurnRequest, load_trace, turn_requests
from dasc_compile.errors import DascInputError

RESULT_FORMAT = "dasc-serving-result"
RESULT_VERSION = 1
# server_info fields copied into the result for auditing (those the server has)
SERVER_INFO_KEYS = ("model_path", "load_format", "skip_tokenizer_init", "max_running_requests",
                    "max_mamba_cache_size", "mamba_full_memory_ratio", "mamba_scheduler_strategy",
                    "mamba_ssm_dtype", "disable_radix_cache", "page_size", "chunked_prefill_size",
                    "mem_fraction_static", "max_total_num_tokens", "version")


@dataclass(kw_only=True)
class RequestRecord:
    """Measurements of one /generate request; times in seconds, lengths in tokens.

    Attributes:
        conv / turn: 0-indexed conversation (trace order) and turn; source_id: ShareGPT id.
        prompt_tokens: tokens sent; max_new_tokens: decode length asked for.
        start_s: send time relative to the start of the replay.
        ttft_s / e2e_s: time to first token / end-to-end latency (NaN when failed).
        cached_tokens: ``meta_info.cached_tokens``; completion_tokens: tokens generated.
        server_prompt_tokens: ``meta_info.prompt_tokens`` (should equal prompt_tokens).
        success / error: outcome; error is "" on success.
    """

    conv: int
    turn: int
    source_id: str
    prompt_tokens: int
    max_new_tokens: int
    start_s: float = 0.0
    ttft_s: float = math.nan
    e2e_s: float = math.nan
    cached_tokens: int = 0
    completion_tokens: int = 0
    server_prompt_tokens: int = 0
    success: bool = False
    error: str = ""


def _meta_tokens(event: dict) -> int:
    meta = event.get("meta_info") or {}
    n = meta.get("completion_tokens")
    return int(n) if n is not None else len(event.get("output_ids") or ())


def send_generate(host: str, port: int, req: TurnRequest, *, timeout_s: float,
                  path: str = "/generate") -> RequestRecord:
    """POST one streaming /generate request and time it (SGLang 0.5.17 http_server.py format).

    The body is ``{"input_ids", "sampling_params": {max_new_tokens, ignore_eos: true,
    temperature: 0}, "stream": true}``; the answer is server-sent events ``data: {json}`` ending
    with ``data: [DONE]``. Network or server errors are recorded in the result (``success``
    False, ``error`` set), never raised.
    """
    rec = RequestRecord(conv=req.conv, turn=req.turn, source_id="",
                        prompt_tokens=len(req.input_ids), max_new_tokens=req.max_new_tokens)
    body = json.dumps({
        "input_ids": list(req.input_ids),
        "sampling_params": {"max_new_tokens": req.max_new_tokens, "ignore_eos": True,
                            "temperature": 0.0},
        "stream": True,
    }).encode()
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    t0 = time.perf_counter()
    last = None
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            rec.error = f"HTTP {resp.status}: {resp.read(300).decode(errors='replace')}"
            return rec
        done = False
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                rec.e2e_s = time.perf_counter() - t0
                break
            last = data
            if math.isnan(rec.ttft_s):
                now = time.perf_counter()
                event = json.loads(data)
                if "error" in event:
                    rec.error = f"server error: {json.dumps(event['error'])[:300]}"
                    return rec
                if _meta_tokens(event) >= 1:
                    rec.ttft_s = now - t0
        if not done or last is None:
            rec.error = "stream ended without data: [DONE]"
            return rec
        event = json.loads(last)
        if "error" in event:
            rec.error = f"server error: {json.dumps(event['error'])[:300]}"
            return rec
        meta = event.get("meta_info") or {}
        rec.cached_tokens = int(meta.get("cached_tokens") or 0)
        rec.completion_tokens = _meta_tokens(event)
        rec.server_prompt_tokens = int(meta.get("prompt_tokens") or 0)
        if math.isnan(rec.ttft_s):
            rec.error = "no generated token in the stream"
            return rec
        rec.success = True
        return rec
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec.error = f"{type(e).__name__}: {e}"
        return rec
    finally:
        conn.close()


def run_replay(url: str, requests_by_conv: Sequence[Sequence[TurnRequest]], *,
               source_ids: Sequence[str], concurrency: int, timeout_s: float = 3600.0,
               order: Sequence[int] | None = None, progress: bool = False
               ) -> tuple[list[RequestRecord], float]:
    """Replay conversations with ``concurrency`` client threads; turns in order within each.

    Args:
        url: server base URL, e.g. ``http://127.0.0.1:30000``.
        requests_by_conv: per conversation, its T requests in turn order.
        source_ids: per conversation, the trace id (copied into the records).
        order: the order in which threads pick conversations (default: trace order).
    Returns:
        (records sorted by (conv, turn), wall-clock seconds of the whole replay).
    """
    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for c in (order if order is not None else range(len(requests_by_conv))):
        todo.put(c)
    records: list[RequestRecord] = []
    lock = threading.Lock()
    total = sum(len(r) for r in requests_by_conv)
    t_start = time.perf_counter()

    def worker() -> None:
        while True:
            try:
                c = todo.get_nowait()
            except queue.Empty:
                return
            for req in requests_by_conv[c]:
                sent = time.perf_counter() - t_start
                rec = send_generate(host, port, req, timeout_s=timeout_s)
                rec.start_s, rec.source_id = sent, source_ids[c]
                with lock:
                    records.append(rec)
                    if progress and len(records) % max(1, total // 20) == 0:
                        print(f"  {len(records)}/{total} requests, "
                              f"{time.perf_counter() - t_start:.1f}s", file=sys.stderr, flush=True)

    threads = [threading.Thread(target=worker, daemon=True)
               for _ in range(max(1, min(concurrency, len(requests_by_conv))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t_start
    records.sort(key=lambda r: (r.conv, r.turn))
    return records, wall


def percentile(values: Sequence[float], q: float) -> float:
    """q-th percentile with linear interpolation between order statistics (numpy's default
    ``np.percentile``, which SGLang's benchmark uses); NaN for no values."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def summarize(records: Sequence[RequestRecord], *, arm: str, checkpoint_capacity: int | None,
              wall_s: float) -> dict:
    """The arm's table row: all-request statistics (paper App. C.3), seconds and tokens.

    TTFT/E2E mean and P95 are over the successful requests (all requests when none failed, as
    in the paper: hits and misses alike). cache_hit_token_rate = sum(cached_tokens) /
    sum(prompt_tokens) over the successful requests. per_turn gives the same for each turn.
    """
    ok = [r for r in records if r.success]

    def block(rs: Sequence[RequestRecord]) -> dict:
        prompt = sum(r.prompt_tokens for r in rs)
        cached = sum(r.cached_tokens for r in rs)
        return {
            "requests": len(rs),
            "ttft_mean_s": _mean([r.ttft_s for r in rs]),
            "ttft_p95_s": percentile([r.ttft_s for r in rs], 95),
            "e2e_mean_s": _mean([r.e2e_s for r in rs]),
            "e2e_p95_s": percentile([r.e2e_s for r in rs], 95),
            "prompt_tokens": prompt, "cached_tokens": cached,
            "cache_hit_token_rate": cached / prompt if prompt else math.nan,
        }

    turns = sorted({r.turn for r in records})
    out = {"arm": arm, "checkpoint_capacity": checkpoint_capacity, **block(ok),
           "failed": len(records) - len(ok), "wall_s": wall_s,
           "decode_mismatch": sum(1 for r in ok if r.completion_tokens != r.max_new_tokens),
           "per_turn": [{"turn": t, **block([r for r in ok if r.turn == t])} for t in turns]}
    out["requests_total"] = len(records)
    return out


def _fmt(x, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.{nd}f}"
    return str(x)


TABLE_HEAD = ("| arm | checkpoint capacity | requests | failed | mean TTFT (s) | P95 TTFT (s) "
              "| mean E2E (s) | P95 E2E (s) | cache-hit token rate |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|")


def table_row(s: dict) -> str:
    """One Markdown row of :data:`TABLE_HEAD` from a :func:`summarize` dict."""
    return (f"| {s['arm']} | {_fmt(s['checkpoint_capacity'])} | {s['requests']} | {s['failed']} "
            f"| {_fmt(s['ttft_mean_s'])} | {_fmt(s['ttft_p95_s'])} | {_fmt(s['e2e_mean_s'])} "
            f"| {_fmt(s['e2e_p95_s'])} | {_fmt(s['cache_hit_token_rate'])} |")


def markdown_report(result: dict) -> str:
    """The arm's Markdown: config line, summary table, per-turn table."""
    s, c = result["summary"], result["config"]
    lines = [f"# Serving arm `{s['arm']}`", "",
             f"trace `{c['trace']}` ({c['conversations']} conversations, {s['requests_total']} "
             f"requests), client concurrency {c['concurrency']}, server max-running-requests "
             f"{_fmt(c['max_running_requests'])}, order seed {_fmt(c['seed'])}, vocab mapping "
             f"{_fmt(c['vocab_size'])}, wall {s['wall_s']:.1f} s, decode-length mismatches "
             f"{s['decode_mismatch']}.", "", TABLE_HEAD, table_row(s), "",
             "| turn | requests | mean TTFT (s) | P95 TTFT (s) | mean E2E (s) | P95 E2E (s) "
             "| cache-hit token rate |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for t in s["per_turn"]:
        lines.append(f"| {t['turn'] + 1} | {t['requests']} | {_fmt(t['ttft_mean_s'])} "
                     f"| {_fmt(t['ttft_p95_s'])} | {_fmt(t['e2e_mean_s'])} "
                     f"| {_fmt(t['e2e_p95_s'])} | {_fmt(t['cache_hit_token_rate'])} |")
    return "\n".join(lines) + "\n"


def _http(url: str, method: str, path: str, timeout_s: float = 30.0) -> tuple[int, bytes]:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=timeout_s)
    try:
        conn.request(method, path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def server_info(url: str) -> dict:
    """Selected fields of GET /server_info ({} when the server does not answer it)."""
    try:
        status, body = _http(url, "GET", "/server_info")
        info = json.loads(body) if status == 200 else {}
    except (OSError, http.client.HTTPException, ValueError):
        return {}
    out = {k: info[k] for k in SERVER_INFO_KEYS if k in info}
    states = info.get("internal_states") or []
    if states and isinstance(states[0], dict):
        out["internal_state"] = {k: v for k, v in states[0].items()
                                 if isinstance(v, (int, float, str, bool))}
    return out


def write_json(path: Path, obj: dict) -> None:
    """Write JSON via a temporary file and os.replace (NaN written as null)."""
    def clean(x):
        if isinstance(x, float) and math.isnan(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(clean(obj), indent=1))
    os.replace(tmp, path)


def main(argv: Iterable[str] | None = None) -> int:
    """CLI: replay one arm; exit 0, 1 when any request failed, 2 on bad input (DascInputError)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--arm", required=True, help="arm name, e.g. dense / int8 / dasc-nr-w64")
    ap.add_argument("--checkpoint-capacity", type=int, required=True,
                    help="state checkpoint slots of this arm (recorded, plotted on the x axis)")
    ap.add_argument("--concurrency", type=int, default=256, help="client concurrency")
    ap.add_argument("--max-running-requests", type=int, default=None,
                    help="the server's --max-running-requests (recorded; checked vs /server_info)")
    ap.add_argument("--vocab-size", type=int, default=None,
                    help="served model's vocab; ids >= it are mapped to id %% vocab_size")
    ap.add_argument("--num-conversations", type=int, default=None, help="use the first N only")
    ap.add_argument("--decode-clip", type=int, default=None,
                    help="clip every decode length to this many tokens (prompts are unchanged: they hold "
                         "the recorded replies); scales a run down without rebuilding the trace")
    ap.add_argument("--seed", type=int, default=None,
                    help="permute the order in which conversations start (default: trace order)")
    ap.add_argument("--warmup", type=int, default=1, help="short untimed requests before the run")
    ap.add_argument("--no-flush", action="store_true", help="skip POST /flush_cache before the run")
    ap.add_argument("--timeout", type=float, default=3600.0, help="per-request timeout (s)")
    ap.add_argument("--out", required=True, help="output prefix: writes PREFIX.json and PREFIX.md")
    a = ap.parse_args(argv)
    try:
        header, convs = load_trace(a.trace)
        if a.num_conversations is not None:
            if not 1 <= a.num_conversations <= len(convs):
                raise DascInputError(f"--num-conversations: expected 1..{len(convs)}, "
                                     f"got {a.num_conversations}")
            convs = convs[: a.num_conversations]
        if a.vocab_size is not None and a.vocab_size < 2:
            raise DascInputError(f"--vocab-size: expected >= 2, got {a.vocab_size}")
        if a.concurrency < 1:
            raise DascInputError(f"--concurrency: expected >= 1, got {a.concurrency}")
        if a.decode_clip is not None and a.decode_clip < 1:
            raise DascInputError(f"--decode-clip: expected >= 1 tokens, got {a.decode_clip}")
    except DascInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    reqs = [turn_requests(i, c, vocab_size=a.vocab_size, decode_clip=a.decode_clip) for i, c in enumerate(convs)]
    remapped = (sum(1 for c in convs for s in c.segments for t in s if t >= a.vocab_size)
                if a.vocab_size else 0)
    order = list(range(len(convs)))
    if a.seed is not None:
        random.Random(a.seed).shuffle(order)
    info = server_info(a.url)
    warnings = []
    if a.max_running_requests is not None and info.get("max_running_requests") not in (
            None, a.max_running_requests):
        warnings.append(f"server reports max_running_requests={info['max_running_requests']}, "
                        f"--max-running-requests says {a.max_running_requests}")
    u = urlsplit(a.url)
    for i in range(a.warmup):     # ids unrelated to the trace; the flush below drops them
        w = TurnRequest(conv=-1, turn=i, input_ids=tuple(range(100 + i, 164 + i)), max_new_tokens=8)
        wr = send_generate(u.hostname or "127.0.0.1", u.port or 80, w, timeout_s=a.timeout)
        if not wr.success:
            warnings.append(f"warmup {i} failed: {wr.error}")
    if not a.no_flush:
        try:
            status, body = _http(a.url, "POST", "/flush_cache")
            if status != 200:
                warnings.append(f"/flush_cache answered {status}: {body[:200]!r}")
        except (OSError, http.client.HTTPException) as e:
            warnings.append(f"/flush_cache failed: {e}")
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    records, wall = run_replay(a.url, reqs, source_ids=[c.source_id for c in convs],
                               concurrency=a.concurrency, timeout_s=a.timeout, order=order,
                               progress=True)
    summary = summarize(records, arm=a.arm, checkpoint_capacity=a.checkpoint_capacity, wall_s=wall)
    config = {"trace": str(a.trace), "trace_params": header.get("params"),
              "tokenizer": (header.get("tokenizer") or {}).get("name"),
              "conversations": len(convs), "url": a.url, "concurrency": a.concurrency,
              "max_running_requests": a.max_running_requests, "vocab_size": a.vocab_size,
              "ids_remapped": remapped, "seed": a.seed, "warmup": a.warmup,
              "decode_clip": a.decode_clip,
              "flushed": not a.no_flush, "server_info": info, "warnings": warnings}
    result = {"format": RESULT_FORMAT, "version": RESULT_VERSION, "config": config,
              "summary": summary, "requests": [asdict(r) for r in records]}
    out = Path(a.out)
    write_json(out.with_name(out.name + ".json"), result)
    md = markdown_report(result)
    out.with_name(out.name + ".md").write_text(md)
    print(md)
    errors = [r.error for r in records if not r.success]
    if errors:
        print(f"{len(errors)} requests failed; first: {errors[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
