"""Where the full-attention heads of a trained reference look when it has to recall a needle, and whether it recalls.

Prompts are built from benchmarks/train/data.py's own pieces (its tokenizer call, filler sentences, keys, values
and the two needle / question / answer templates), as its filler-haystack needle rows are, but with the gap set:
``lead`` filler tokens, the queried needle, exactly ``gap`` tokens of filler (in half of the prompts two
distractor needles with other keys sit inside the gap), the question and the answer " <digits>"; no BOS (training
rows have none). Gaps default to short (96) and long (1024) tokens; prompt i of a gap uses seed ``seed * 1000 + i``.

Measured, with the model's own transformers class (``attn_implementation="eager"``, ``output_attentions=True``,
fp32 on CPU), at each query position whose next token is an answer digit:

- per full-attention layer and head, the attention mass on the buckets :data:`BUCKETS`: ``sink`` (the first
  ``--sink`` positions), ``recent`` (the last ``--recent`` positions up to the query itself), ``key`` (the queried
  needle's key tokens), ``value`` (its value tokens: " " and the digits right after "<key> is"), ``needle_rest``
  (its other tokens), ``distractor`` (the other needles), ``question`` (the question and answer tokens before the
  recent window: the question names the key too), ``other`` (the filler); a position belongs to the
  first bucket of that order that holds it (:func:`position_labels`). Also ``target``: mass on the one needle
  token the next answer token copies (part of ``value``: where an induction / copy head would look);
- the entropy of each head's row (nats), its argmax: offset from that target (0: on it) and bucket, and the token
  strings it puts most mass on (summed over positions holding the same token);
- the model's teacher-forced greedy accuracy on the digits, exact match of the whole answer (teacher-forced
  greedy = greedy decoding when every token is right), and the mean log-prob of the correct digits
  (chance: log 0.1 = -2.30). ``--no-rope`` (Qwen3-Next only) sets the rotary cos / sin to 1 / 0: the trained GDN
  model with position-free attention, as Kimi-Linear's MLA is (it applies no rotary at all).

    python -m benchmarks.train.attention_probe plans/reference/kda-hybrid-11m-sharegpt --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.cli_args import OneLineParser, int_at_least
from benchmarks.train.data import TEMPLATES, Batches

BUCKETS = ("sink", "key", "value", "needle_rest", "distractor", "question", "recent", "other")
_SPAN_BUCKETS = ("key", "value", "needle_rest", "distractor", "question")      # precedence after sink, recent


def position_labels(q: int, spans: dict, n_sink: int, recent: int) -> torch.Tensor:
    """Bucket index (into :data:`BUCKETS`) of each key position ``0..q`` seen by query ``q``.

    ``spans`` maps ``key`` / ``value`` / ``needle_rest`` / ``distractor`` / ``question`` to lists of absolute
    positions. Precedence: sink (``pos < n_sink``), recent (``pos > q - recent``), then key, value, needle_rest,
    distractor, question, and other for the rest."""
    lab = torch.full((q + 1,), BUCKETS.index("other"), dtype=torch.long)
    for name in reversed(_SPAN_BUCKETS):                         # lowest precedence first, overwritten after
        idx = [p for p in spans.get(name, ()) if 0 <= p <= q]
        if idx:
            lab[idx] = BUCKETS.index(name)
    lab[max(0, q - recent + 1):] = BUCKETS.index("recent")
    lab[:min(n_sink, q + 1)] = BUCKETS.index("sink")
    return lab


def bucket_masses(probs: torch.Tensor, q: int, spans: dict, n_sink: int = 4, recent: int = 16) -> torch.Tensor:
    """Attention mass per bucket: ``[H, len(BUCKETS)]`` float64 from ``probs`` ``[H, S]`` (query ``q``'s row of each
    head; entries past ``q`` are ignored). Rows that sum to 1 over ``0..q`` give masses that sum to 1."""
    lab = position_labels(q, spans, n_sink, recent)
    out = torch.zeros(probs.shape[0], len(BUCKETS), dtype=torch.float64)
    return out.index_add_(1, lab, probs[:, :q + 1].double())


def row_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each row of ``probs`` ``[H, S]``."""
    return torch.special.entr(probs.double()).sum(-1)


def _helpers(tok) -> Batches:
    """data.py's Batches, used only for its helpers (``_enc``, ``_filler``, ``keys``, ``_keys``, ``_value``): the
    placeholder token stream is never drawn from (no recall rows: a seq this short could not hold one)."""
    return Batches(np.zeros(200, dtype=np.uint16), tok, seq=64, batch=1, seed=0, recall_frac=0.0)


def build_prompt(b: Batches, gap: int, seed: int, n_distract: int, template: int) -> dict:
    """One needle prompt (module docstring): token ids, answer positions, the needle-token position each answer
    token copies, and the bucket spans (absolute positions)."""
    gen = torch.Generator().manual_seed(seed)
    needle_t, question_t, answer_t = TEMPLATES[template]
    keys = b._keys(gen, 1 + n_distract)
    values = [b._value(gen) for _ in keys]

    def hay(n: int) -> list[int]:                                  # data.py's filler haystack
        out: list[int] = []
        while len(out) < n:
            out += b._filler[int(torch.randint(0, len(b._filler), (1,), generator=gen))]
        return out[:n]

    text = needle_t.format(k=keys[0], v=values[0])
    enc = b.tok.encode(text, add_special_tokens=False)
    ks, vs = text.index(keys[0]), text.index(" " + values[0], text.index(keys[0]))
    ke, ve = ks + len(keys[0]), vs + 1 + len(values[0])
    kin = [i for i, (s, e) in enumerate(enc.offsets) if s < ke and e > ks]
    vin = [i for i, (s, e) in enumerate(enc.offsets) if s < ve and e > vs]
    distract = [b._enc(needle_t.format(k=k, v=v)) for k, v in zip(keys[1:], values[1:])]
    lead = hay(int(torch.randint(48, 161, (1,), generator=gen)))
    gap_ids = hay(gap - sum(map(len, distract)))
    d_pos = []
    for d in distract:                                             # at random depths inside the gap
        at = int(torch.randint(0, len(gap_ids) + 1, (1,), generator=gen))
        gap_ids[at:at] = d
        d_pos = [p + len(d) if p >= at else p for p in d_pos] + list(range(at, at + len(d)))
    n0 = len(lead)
    ids = lead + list(enc.ids) + gap_ids
    d_abs = [n0 + len(enc.ids) + p for p in d_pos]
    ids += b._enc(question_t.format(k=keys[0]))
    ans = b._enc(answer_t.format(v=values[0]))
    if ans != [enc.ids[i] for i in vin]:
        raise AssertionError(f"answer tokens {ans} differ from the needle's value tokens")
    a0 = len(ids)
    ids += ans
    spans = {"key": [n0 + i for i in kin], "value": [n0 + i for i in vin], "distractor": d_abs,
             "question": list(range(len(lead) + len(enc.ids) + gap, len(ids))),
             "needle_rest": [n0 + i for i in range(len(enc.ids)) if i not in kin and i not in vin]}
    return {"ids": ids, "answers": list(range(a0, a0 + len(ans))), "targets": [n0 + i for i in vin],
            "spans": spans, "gap": gap, "n_needles": 1 + n_distract, "template": template}


def probe_prompt(model, p: dict, attn_layers: list[int], n_sink: int, recent: int, name=str) -> dict:
    """Forward one prompt; per-head bucket masses / entropy / argmax / most-attended token strings (``name``: id ->
    string) at the digit queries, and the answer scores."""
    x = torch.tensor([p["ids"]])
    with torch.no_grad():
        out = model(input_ids=x, output_attentions=True, use_cache=False)
    logp = torch.log_softmax(out.logits[0].double(), -1)
    digits = p["answers"][1:]                                      # answer[0] is " ", not recalled
    ok = [int(logp[a - 1].argmax()) == p["ids"][a] for a in p["answers"]]
    res = {"gap": p["gap"], "n_needles": p["n_needles"], "len": len(p["ids"]), "exact": all(ok),
           "digit_acc": sum(ok[1:]) / len(digits),
           "digit_logp": float(np.mean([float(logp[a - 1, p["ids"][a]]) for a in digits])), "heads": {}}
    for li, att in zip(attn_layers, out.attentions):
        for j, a in enumerate(digits):
            q, tgt = a - 1, p["targets"][j + 1]
            row = att[0, :, q, :].float()                              # [H, S]
            m = bucket_masses(row, q, p["spans"], n_sink, recent)
            lab = position_labels(q, p["spans"], n_sink, recent)
            am = row[:, :q + 1].argmax(-1)
            for h in range(row.shape[0]):
                r = res["heads"].setdefault(f"L{li}.h{h}", {"mass": [], "target": [], "entropy": [], "offset": [],
                                                               "argmax_bucket": [], "tokens": {}})
                by_id = torch.zeros(int(x.max()) + 1).index_add_(0, x[0, :q + 1], row[h, :q + 1])
                for v, t in zip(*by_id.topk(min(4, by_id.numel()))):      # mass by token string, top 4
                    r["tokens"][name(int(t))] = r["tokens"].get(name(int(t)), 0.0) + float(v)
                r["mass"].append(m[h].tolist())
                r["target"].append(float(row[h, tgt]))
                r["entropy"].append(float(row_entropy(row[h:h + 1, :q + 1])[0]))
                r["offset"].append(int(am[h]) - tgt)
                r["argmax_bucket"].append(BUCKETS[int(lab[am[h]])])
    return res


def summarise(results: list[dict]) -> dict:
    """Per gap: accuracy figures and, per head, mean masses / target mass / entropy and argmax statistics."""
    out = {}
    for gap in sorted({r["gap"] for r in results}):
        rs = [r for r in results if r["gap"] == gap]
        g = {"prompts": len(rs), "exact": float(np.mean([r["exact"] for r in rs])),
             "digit_acc": float(np.mean([r["digit_acc"] for r in rs])),
             "digit_logp": float(np.mean([r["digit_logp"] for r in rs])), "heads": {}}
        for n in (1, 3):
            sub = [r for r in rs if r["n_needles"] == n]
            if sub:
                g[f"exact_{n}needle"] = float(np.mean([r["exact"] for r in sub]))
        for h in rs[0]["heads"]:
            mass = np.array([m for r in rs for m in r["heads"][h]["mass"]])
            off = np.array([o for r in rs for o in r["heads"][h]["offset"]])
            bk = [b for r in rs for b in r["heads"][h]["argmax_bucket"]]
            tk: dict = {}
            for r in rs:
                for t, v in r["heads"][h]["tokens"].items():
                    tk[t] = tk.get(t, 0.0) + v / len(mass)
            g["heads"][h] = {"mass": dict(zip(BUCKETS, mass.mean(0).round(4).tolist())),
                             "target": round(float(np.mean([t for r in rs for t in r["heads"][h]["target"]])), 4),
                             "entropy": round(float(np.mean([e for r in rs for e in r["heads"][h]["entropy"]])), 3),
                             "argmax_at_target": round(float(np.mean(off == 0)), 3),
                             "argmax_offset_median": float(np.median(off)),
                             "argmax_bucket": {b: round(bk.count(b) / len(bk), 3) for b in BUCKETS if b in bk},
                             "top_tokens": {t: round(v, 3) for t, v in sorted(tk.items(), key=lambda kv: -kv[1])[:4]}}
        out[str(gap)] = g
    return out


def table(summary: dict) -> str:
    """Markdown: accuracy per gap, then one row per (gap, head)."""
    acc = ["| gap | prompts | exact | exact, 1 needle | exact, 3 needles | digit acc | digit log-prob |",
           "|---|---|---|---|---|---|---|"]
    for gap, g in summary.items():
        acc.append(f"| {gap} | {g['prompts']} | {g['exact']:.2f} | {g.get('exact_1needle', math.nan):.2f} | "
                   f"{g.get('exact_3needle', math.nan):.2f} | {g['digit_acc']:.2f} | {g['digit_logp']:.2f} |")
    lines = ["| gap | head | " + " | ".join(BUCKETS) + " | target | entropy | argmax@target | argmax offset (median) | "
             "top tokens (mass) |", "|" + "---|" * (len(BUCKETS) + 7)]
    for gap, g in summary.items():
        for h, s in g["heads"].items():
            top = ", ".join(f"`{t}` {v:.2f}" for t, v in list(s["top_tokens"].items())[:2])
            lines.append(f"| {gap} | {h} | " + " | ".join(f"{s['mass'][c]:.3f}" for c in BUCKETS)
                         + f" | {s['target']:.3f} | {s['entropy']:.2f} | {s['argmax_at_target']:.2f} | "
                         f"{s['argmax_offset_median']:+.0f} | {top} |")
    return "\n".join(acc) + "\n\n" + "\n".join(lines)


def _gaps(text: str) -> list[int]:
    """``--gaps``: comma-separated positive token counts."""
    try:
        gaps = [int(g) for g in text.split(",")]
    except ValueError:
        gaps = []
    if not gaps or min(gaps) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive token counts, e.g. 96,1024; got {text!r}")
    return gaps


def _check_bundle(bundle: Path) -> None:
    """One line naming what a trained reference folder lacks; raises ValueError."""
    if not bundle.is_dir():
        raise ValueError(f"{bundle}: not a folder; give a trained reference such as plans/reference/kda-hybrid-11m-sharegpt")
    missing = [f for f in ("config.json", "tokenizer.json") if not (bundle / f).is_file()]
    if not any(bundle.glob("*.safetensors")):
        missing.append("*.safetensors")
    if missing:
        raise ValueError(f"{bundle}: no {', '.join(missing)}; the probe needs a trained reference's weights and tokenizer "
                         f"(plans/reference/*-hybrid-*-sharegpt)")
    try:
        cfg = json.loads((bundle / "config.json").read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{bundle / 'config.json'}: not JSON ({exc})") from None
    if not isinstance(cfg, dict) or "full_attention" not in (cfg.get("layer_types") or []):
        raise ValueError(f"{bundle / 'config.json'}: layer_types names no full_attention layer; the probe reads "
                         f"those layers' attention")


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path, help="a trained reference folder (config.json, weights, tokenizer.json)")
    ap.add_argument("--json", type=Path, help="write the per-prompt results and the summary here")
    ap.add_argument("--gaps", type=_gaps, default="96,1024", help="comma-separated gaps in tokens (default 96,1024)")
    ap.add_argument("--no-rope", action="store_true",
                    help="ablation: rotary cos 1 / sin 0 in every attention layer (Qwen3-Next only; Kimi's MLA has none)")
    ap.add_argument("--n", type=int_at_least(1), default=16, help="prompts per gap (half with 2 distractor needles)")
    ap.add_argument("--seed", type=int_at_least(0), default=0)
    ap.add_argument("--sink", type=int_at_least(0), default=4, help="first positions counted as the sink")
    ap.add_argument("--recent", type=int_at_least(1), default=16, help="last positions counted as recent (query included)")
    a = ap.parse_args(argv)
    try:
        _check_bundle(a.bundle)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.json and (a.json.is_dir() or not a.json.parent.is_dir()):
        print(f"error: --json {a.json}: expected a file path in an existing folder", file=sys.stderr)
        return 2
    from tokenizers import Tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    try:
        cfg = AutoConfig.from_pretrained(a.bundle)
        if a.no_rope and cfg.model_type != "qwen3_next":
            ap.error(f"--no-rope: only Qwen3-Next models have a rotary embedding to switch off; {a.bundle / 'config.json'} "
                     f"has model_type {cfg.model_type!r}")
        if cfg.model_type == "kimi_linear":        # the trainer's KDA arithmetic (tested equal to transformers')
            from benchmarks.train.kda_chunk import use_chunk_kda_in_transformers
            use_chunk_kda_in_transformers()
        model = AutoModelForCausalLM.from_pretrained(a.bundle, dtype=torch.float32, attn_implementation="eager").eval()
    except Exception as exc:      # noqa: BLE001 (transformers refuses a bad config / weights with many classes)
        why = " ".join(x.strip() for x in str(exc).splitlines() if x.strip())[:300] or type(exc).__name__
        print(f"error: {a.bundle}: transformers cannot load it as a trained reference ({why})", file=sys.stderr)
        return 2
    if a.no_rope:
        model.model.rotary_emb.register_forward_hook(lambda m, i, o: (torch.ones_like(o[0]), torch.zeros_like(o[1])))
    attn_layers = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
    tok = Tokenizer.from_file(str(a.bundle / "tokenizer.json"))
    b = _helpers(tok)
    t0, results = time.time(), []
    for gap in a.gaps:
        for i in range(a.n):
            p = build_prompt(b, gap, a.seed * 1000 + i, n_distract=2 * (i % 2), template=(i // 2) % 2)
            results.append(probe_prompt(model, p, attn_layers, a.sink, a.recent, tok.id_to_token))
    summary = summarise(results)
    print(f"# {a.bundle} ({type(model).__name__}{', no RoPE' if a.no_rope else ''}), full-attention layers {attn_layers}, "
          f"{len(results)} prompts in {time.time() - t0:.0f} s\n")
    print(table(summary))
    if a.json:
        a.json.write_text(json.dumps({"bundle": str(a.bundle), "class": type(model).__name__,
                                      "attn_layers": attn_layers, "args": {k: str(v) for k, v in vars(a).items()},
                                      "buckets": BUCKETS, "summary": summary, "prompts": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
