"""Digit-only recall accuracy of a trained checkpoint on fresh rows from benchmarks.train.data.Batches.

    PYTHONPATH=. python benchmarks/results/2026-12-04-cpu-recall-screen/eval_digits.py CKPT_DIR --data .dev/train/prep --seq 256 [--min-gap 0]
        [--rows 64] [--seed 999] [--json OUT]

Recall rows only (recall_frac 1.0), a seed the training never used. Teacher-forced greedy, as scoring.py, but
split into: the space token before the value, the first digit, later digits; per kind (needle/multikey/kv).
Loads train_state/exact.pt (fp32) when present, else the bf16 checkpoint.
"""

import json
import sys
from pathlib import Path

import torch

from benchmarks.cli_args import OneLineParser
from benchmarks.train.data import KINDS, Batches
from benchmarks.train.models import load_model
from benchmarks.train.tokenizer import load_tokenizer
from benchmarks.train.train import load_stream


def main():
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpt", type=Path)
    ap.add_argument("--data", type=Path, default=Path(".dev/train/prep"))
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--min-gap", type=int, default=0)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--seed", type=int, default=999)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    torch.set_flush_denormal(True)
    tok = load_tokenizer(a.data / "tokenizer")
    stream, _ = load_stream(a.data)
    model = load_model(a.ckpt)
    ex = a.ckpt / "train_state" / "exact.pt"
    if ex.exists():
        model.load_state_dict(torch.load(ex, map_location="cpu")["model"])
    model.eval()
    digit_ids = torch.tensor([tok.token_to_id(str(d)) for d in range(10)])
    b = Batches(stream, tok, a.seq, 16, a.seed, 1.0, a.min_gap)
    tally = {}   # (kind, part) -> [hit, n]
    with torch.no_grad():
        for step in range((a.rows + 15) // 16):
            xb, mask, kind = b.get(step)
            logits = model(input_ids=xb[:, :-1], use_cache=False).logits
            pred, tgt, m = logits.argmax(-1), xb[:, 1:], mask[:, 1:]
            is_digit = torch.isin(tgt, digit_ids)
            prev_digit = torch.zeros_like(is_digit)
            prev_digit[:, 1:] = is_digit[:, :-1]
            for r in range(xb.shape[0]):
                k = KINDS[int(kind[r])]
                for part, sel in (("space", m[r] & ~is_digit[r]), ("digit1", m[r] & is_digit[r] & ~prev_digit[r]),
                                  ("digit_rest", m[r] & is_digit[r] & prev_digit[r]), ("digits", m[r] & is_digit[r]),
                                  ("all", m[r])):
                    for kk in (k, "any"):
                        t = tally.setdefault((kk, part), [0, 0])
                        t[0] += int((pred[r][sel] == tgt[r][sel]).sum())
                        t[1] += int(sel.sum())
    out = {f"{k}/{p}": (h / n if n else None, n) for (k, p), (h, n) in sorted(tally.items())}
    for key, (acc, n) in out.items():
        print(f"{key:22s} {'-' if acc is None else f'{acc:.3f}'}  (n={n})")
    if a.json:
        a.json.write_text(json.dumps({"ckpt": str(a.ckpt), "seq": a.seq, "min_gap": a.min_gap, "rows": a.rows,
                                      "seed": a.seed, "acc": out}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
