"""A stand-in for ``python -m sglang.launch_server`` to rehearse the serving drivers on a CPU.

Accepts (and ignores) every SGLang flag, serves ``/health``, ``/server_info``, ``/flush_cache`` and a
streaming ``/generate`` in the ``--skip-tokenizer-init`` format (``output_ids`` + ``meta_info``, the
the events benchmarks/chat_replay.py reads). It models what the benchmark depends on, in
the crudest form: at most ``--max-running-requests`` requests run at once (the rest wait), a
request's first token takes ``FAKE_BASE_S + uncached prompt tokens * FAKE_PREFILL_S_PER_TOKEN``,
then one token per ``FAKE_TOKEN_S``; the prefix cache keeps the ``K`` most recently used sequences
(each prompt, and at the end of a request the prompt plus the generated ids but the last, as SGLang
caches a finished request) and reports the longest common prefix with one of them, rounded down to
64 tokens, where K comes
from the arm's flags (Dense ``M - 3 R``, SGLang INT8 ``--int8-mamba-ckpt-size``, dasc
``M' - 3 R + --dasc-pool-slots``). Generated ids depend on the prompt (so a served reply differs from
the recorded one). With ``--enable-metrics`` the last event's ``meta_info`` carries ``queue_time``,
``forward_entry_time`` and ``prefill_finished_time`` as SGLang's request metrics do.
A dasc arm (``--dasc-pool-slots``) prints a checkpoint account line at each ``/flush_cache``, in the
runtime's format (runtime/account.py), counting its prompt and reply-end entries.
``FAKE_STARTUP_S`` delays /health, ``FAKE_DIE=1`` exits at start.
Not a model of SGLang's latency: a rehearsal of the drivers' plumbing, timing and outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> int:
    ap = argparse.ArgumentParser()
    for f in ("--port", "--max-running-requests", "--max-mamba-cache-size", "--int8-mamba-ckpt-size",
              "--dasc-pool-slots"):
        ap.add_argument(f, type=int, default=None)
    ap.add_argument("--enable-metrics", action="store_true")
    a, _ = ap.parse_known_args()
    if os.environ.get("FAKE_DIE") == "1":
        print("fake: dying at start as asked", flush=True)
        return 3
    base = float(os.environ.get("FAKE_BASE_S", "0.01"))
    per_tok = float(os.environ.get("FAKE_PREFILL_S_PER_TOKEN", "0.00002"))
    tok_s = float(os.environ.get("FAKE_TOKEN_S", "0.002"))
    r = a.max_running_requests or 8
    if a.int8_mamba_ckpt_size:
        k = a.int8_mamba_ckpt_size
    else:
        k = max(1, (a.max_mamba_cache_size or 5 * r) - 3 * r + (a.dasc_pool_slots or 0))
    ready_at = time.monotonic() + float(os.environ.get("FAKE_STARTUP_S", "0"))
    cache: OrderedDict[tuple, list] = OrderedDict()     # sequence -> [origin, reused]
    kinds = ("stored", "reused", "evicted_unused", "evicted_reused")
    account = {k: {"chunk": 0, "prompt": 0, "decode": 0, "reply": 0} for k in kinds}
    hits = [0]

    def put(seq: tuple, origin: str) -> None:
        if seq not in cache:
            cache[seq] = [origin, False]
            account["stored"][origin] += 1
        cache.move_to_end(seq)
        while len(cache) > k:
            _, (o, used) = cache.popitem(last=False)
            account["evicted_reused" if used else "evicted_unused"][o] += 1
    lock = threading.Lock()
    slots = threading.Semaphore(r)
    print(f"fake: Mamba Cache is allocated. max_mamba_cache_size: {a.max_mamba_cache_size}, cache K={k}", flush=True)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _reply(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if time.monotonic() < ready_at:
                return self._reply(503, b"starting")
            self._reply(200, json.dumps({"max_running_requests": r, "version": "fake"}).encode())

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/flush_cache":
                with lock:
                    if a.dasc_pool_slots and any(v for d in account.values() for v in d.values()):
                        print("fake: dasc account: " + json.dumps({"origins": account,
                                                                    "tiers": {"hits_compressed": hits[0]}}), flush=True)
                    cache.clear()
                    for d in account.values():
                        d.update(dict.fromkeys(d, 0))
                    hits[0] = 0
                return self._reply(200, b"")
            payload = json.loads(body)
            ids = tuple(payload["input_ids"])
            queued = time.time()
            with slots:
                entry = time.time()
                with lock:
                    best = 0
                    for s in cache:
                        n = 0
                        for x, y in zip(ids, s):
                            if x != y:
                                break
                            n += 1
                        if n > best:
                            best, hit = n, s
                    cached = best // 64 * 64
                    if cached:
                        cache.move_to_end(hit)
                        hits[0] += 1
                        if not cache[hit][1]:
                            cache[hit][1] = True
                            account["reused"][cache[hit][0]] += 1
                    put(ids, "prompt")
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def chunk(b: bytes) -> None:
                    self.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")
                    self.wfile.flush()

                time.sleep(base + (len(ids) - cached) * per_tok)
                prefilled = time.time()
                out = []
                n_new = payload["sampling_params"]["max_new_tokens"]
                for i in range(n_new):
                    if i:
                        time.sleep(tok_s)
                    out.append((hash(ids[-8:]) + 31 * i) % 50000 + 1000)
                    meta = {"prompt_tokens": len(ids), "completion_tokens": len(out), "cached_tokens": cached}
                    if a.enable_metrics and i == n_new - 1:
                        meta.update(queue_time=entry - queued, forward_entry_time=entry,
                                    prefill_finished_time=prefilled)
                    chunk(b"data: " + json.dumps({"output_ids": out, "meta_info": meta}).encode() + b"\n\n")
                with lock:
                    put(ids + tuple(out[:-1]), "reply")
            chunk(b"data: [DONE]\n\n")
            chunk(b"")

    class Server(ThreadingHTTPServer):
        request_queue_size = 512
        daemon_threads = True

    Server(("127.0.0.1", a.port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
