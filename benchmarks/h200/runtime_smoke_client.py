"""Client of the H200 runtime smoke: the same long prefix twice, then prefix + suffix (stdlib only).

Usage: python benchmarks/h200/runtime_smoke_client.py PORT LABEL OUT_JSON
Prints one line per request (prompt / cached tokens, output ids) and writes them to OUT_JSON.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request


def post(base: str, body: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(base + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode())


def main(port: int, label: str, out_json: str) -> int:
    base = f"http://127.0.0.1:{port}"
    prefix = list(range(1000, 1700))                       # 700 tokens
    sp = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}
    reqs = [("r1 prefix(700)", prefix), ("r2 same prefix again", prefix),
            ("r3 prefix+100", prefix + list(range(5000, 5100)))]
    rows = []
    for name, ids in reqs:
        t = time.time()
        r = post(base, {"input_ids": ids, "sampling_params": sp})
        m = r.get("meta_info", {})
        row = {"req": name, "seconds": round(time.time() - t, 3), "prompt_tokens": m.get("prompt_tokens"),
               "cached_tokens": m.get("cached_tokens"), "output_ids": r.get("output_ids")}
        rows.append(row)
        print(f"[{label}] {name}: prompt_tokens={row['prompt_tokens']} cached_tokens={row['cached_tokens']} "
              f"time={row['seconds']}s output_ids={row['output_ids']}", flush=True)
    with open(out_json, "w") as f:
        json.dump({"label": label, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
