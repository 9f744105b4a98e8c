"""Client of the dasc-wr H200 smoke (benchmarks/h200/wr_smoke.sh): the same requests to every server (stdlib only).

Usage: python benchmarks/h200/wr_smoke_client.py OUT_JSON LABEL=PORT [LABEL=PORT ...]

Per server, in order (greedy, ``ignore_eos``):
  short: a 100-token prompt twice (16 tokens each). The 2nd is a cache hit on the checkpoint SGLang
         keeps at token 64 (its extra_buffer strategy checkpoints on 64-token boundaries). Under
         dasc-wr with w_replay_cap >= 64 the window is the whole cached prefix (W = n_p = 64). A
         keep-all plan (nothing omitted, refresh skipped) must give exactly Dense's hit output.
  agree: the 1100-token prompt ``LONG`` once (miss; checkpoint at 1088), then ``LONG`` + 40 tokens
         with rid ``agree-LABEL``, 1 output token and the top-20 logprobs of it: the next-token
         distribution after the restore (and, under wr, the refresh) of the checkpoint at 1088.
         benchmarks/wr_reference_check.py compares it with `dasc eval`'s arms on a CPU.
  long:  ``LONG`` 11 more times with 1 output token: hits on the checkpoint at 1088, restored with
         W = min(1088, w_replay_cap) replayed tokens. The request latency of a 1-token request is
         its TTFT (prefill + one sample, HTTP included); the first hit is dropped.
Prints one line per server and writes everything to OUT_JSON.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import urllib.request

SHORT = list(range(2000, 2100))
LONG = list(range(3000, 4100))
AGREE = LONG + list(range(5000, 5040))
TOP = 20


def post(port: int, ids: list, new: int, timeout: float = 30, **extra) -> tuple[dict, float]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new, "temperature": 0, "ignore_eos": True},
            **extra}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read().decode())
    return out, time.perf_counter() - t


def run(label: str, port: int) -> dict:
    rows = {"label": label}
    a, _ = post(port, SHORT, 16)
    b, _ = post(port, SHORT, 16)
    rows["short"] = {"first": a.get("output_ids"), "hit": b.get("output_ids"),
                     "hit_cached": b.get("meta_info", {}).get("cached_tokens")}
    post(port, LONG, 1)
    g, _ = post(port, AGREE, 1, rid=f"agree-{label}", return_logprob=True, top_logprobs_num=TOP)
    meta = g.get("meta_info", {})
    top = (meta.get("output_top_logprobs") or [[]])[0]
    rows["agree"] = {"rid": f"agree-{label}", "prompt_len": len(AGREE), "cached": meta.get("cached_tokens"),
                     "output_ids": g.get("output_ids"),
                     "top": [[float(t[0]), int(t[1])] for t in top if t is not None]}
    lat, cached = [], []
    for _ in range(11):
        r, dt = post(port, LONG, 1)
        lat.append(dt)
        cached.append(r.get("meta_info", {}).get("cached_tokens"))
    lat = lat[1:]
    rows["long"] = {"ttft_s": lat, "cached": cached, "mean_ms": 1e3 * statistics.mean(lat),
                    "sd_ms": 1e3 * statistics.stdev(lat)}
    return rows


def main(out_json: str, servers: list[str]) -> int:
    results = []
    for spec in servers:
        label, port = spec.split("=")
        try:
            r = run(label, int(port))
        except Exception as exc:                                  # a server that did not come up
            r = {"label": label, "error": f"{type(exc).__name__}: {exc}"}
        results.append(r)
        if "error" in r:
            print(f"[{label}] ERROR {r['error']}", flush=True)
            continue
        print(f"[{label}] short: hit cached {r['short']['hit_cached']}, first {r['short']['first']}, "
              f"hit {r['short']['hit']}", flush=True)
        print(f"[{label}] agree: cached {r['agree']['cached']} of {r['agree']['prompt_len']}, top-3 "
              f"{r['agree']['top'][:3]}", flush=True)
        print(f"[{label}] long: cached {r['long']['cached']}, 1-token latency {r['long']['mean_ms']:.1f} ms "
              f"+- {r['long']['sd_ms']:.1f} (n={len(r['long']['ttft_s'])})", flush=True)
    dense = next((r for r in results if r["label"] == "dense" and "error" not in r), None)
    if dense is not None:
        for r in results:
            if "error" not in r:
                r["short_hit_equals_dense_hit"] = r["short"]["hit"] == dense["short"]["hit"]
                r["short_hit_equals_dense_miss"] = r["short"]["hit"] == dense["short"]["first"]
                print(f"[{r['label']}] short hit output == dense hit: {r['short_hit_equals_dense_hit']}, "
                      f"== dense miss: {r['short_hit_equals_dense_miss']}", flush=True)
    with open(out_json, "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
