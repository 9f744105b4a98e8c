"""Rendering of ``serving_report``'s results: the markdown tables (one per condition, with the legend and
the server-side checkpoint account) and the regime map figure (issue 24 item 7). Split from
:mod:`benchmarks.serving_report`, which computes what these render."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

from benchmarks import ckpt_account
from dasc_compile.errors import DascInputError

__all__ = ["LEGEND", "markdown", "read_json_file", "regime_map"]


def read_json_file(path: Path, what: str):
    """``path``'s JSON, or one ``error:`` line naming the file and what it should be."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DascInputError(f"{path}: not a readable {what} ({type(exc).__name__}: {exc})") from None


#: What the table's terms mean (printed above the tables).
LEGEND = ("n: the arm's runs (trace seeds). Ratios pair an arm's run with the baseline's run of the same seed "
          "and summarise the per-seed ratios: mean (SD) [min, max], then the number of pairs; (—) where one pair "
          "gives no spread. Hit rate: cached prompt tokens / prompt tokens; bound: the same if every earlier "
          "turn's prefix were cached. Later turns: turns 2+ whose prefix hit the previous reply's end, only the "
          "previous prompt's end, or nothing (lost). Dense drift: its closing run / its opening run of the same "
          "seed in one call. Capacity: cached states with no request running / while R requests run (the "
          "running requests' native slots subtracted).")


def _f(x, nd=3) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _n(x) -> str:
    return "—" if x is None else str(x)


def markdown(objs: Sequence[dict]) -> str:
    """One table per condition: per arm mean TTFT (s), ratios to Dense/INT8 (mean, SD, range),
    E2E ratio, hit rate vs bound, hit/miss TTFT, queue/prefill, hit account, n, capacity with no request
    running / under load ("—" where arms.json predates the second)."""
    out = []
    if objs:
        out += [f"Model: {objs[0]['model']}; decays: {objs[0]['decays']}.", "", LEGEND, ""]
    for cond in dict.fromkeys((o["protocol"], o["replay"], o["pad_tokens"], o["reply_clip"], o["clients"], o["rate"])
                              for o in objs):
        rows = [o for o in objs if (o["protocol"], o["replay"], o["pad_tokens"], o["reply_clip"], o["clients"],
                                    o["rate"]) == cond]
        p, rep, pad, clip, c, rate = cond
        d = next((o for o in rows if o["arm"] == "dense"), None)
        out.append(f"### {p}, {rep}, pad {pad}, reply clip {clip}, " + (f"{c} clients" if c else f"rate {rate}/s")
                   + f"; initial prompt mean {_f(rows[0]['initial_prompt_mean'], 0)} tokens, context max "
                     f"{rows[0]['context_max']}"
                   + (f"; Dense drift over a call {_f(d['dense_drift']['mean'])} (n={d['dense_drift']['n']})"
                      if d and d.get("dense_drift") and d["dense_drift"]["n"] else ""))
        out.append("")
        out.append("| arm | n | mean TTFT s (SD) | TTFT / Dense: mean (SD) [min, max], pairs | TTFT / INT8: mean, pairs | E2E / Dense | "
                   "hit rate (bound) | TTFT hit / miss s | queue / prefill s | later turns: reply-end / prompt-end / lost | capacity / under load |")
        out.append("|---|---:|---|---|---|---|---|---|---|---|---:|")
        for o in rows:
            sp, r = o["mean_ttft_spread"], o["ttft_ratio_vs_dense_spread"]
            ri, ha = o["ttft_ratio_vs_int8_spread"], o["hit_account"]
            out.append(f"| {o['arm']} | {sp['n']} | {_f(sp['mean'])} ({_f(sp['sd'])}) | "
                       + (f"{_f(r['mean'])} ({_f(r['sd'])}) [{_f(r['min'])}, {_f(r['max'])}], {r['n']}" if r and r["n"] else "—")
                       + f" | {_f(ri['mean']) + ', ' + str(ri['n']) if ri and ri['n'] else '—'} | "
                       f"{_f(o['mean_e2e_ratio_vs_dense'])} | "
                       f"{_f(o['hit_rate'])} ({_f(o['reuse_bound'])}) | {_f(o['ttft_hit_s'])} / {_f(o['ttft_miss_s'])} | "
                       f"{_f(o['queue_s'])} / {_f(o['prefill_s'])} | {ha['later_turns']}: {ha['reply_end']} / "
                       f"{ha['prompt_end']} / {ha['lost']} | {_n(o['capacity'])} / {_n(o.get('capacity_under_load'))} |")
        out.append("")
        out.extend(ckpt_account.markdown_rows(rows))
    return "\n".join(out)


def regime_map(summaries: Sequence[Path], out: Path) -> None:
    """Mean-TTFT ratio to Dense (mean and range over seeds) against the mean initial prompt, one
    series per (arm, protocol, replay, rate); from ``summary.json`` files of this module."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if out.suffix.lower() != ".png":
        raise DascInputError(f"--out {out}: the regime map is a PNG image; give a file name ending in .png")
    if not out.parent.is_dir():
        raise DascInputError(f"--out {out}: folder {out.parent} does not exist")
    loaded = [(p, read_json_file(p, "serving_report summary.json")) for p in summaries]
    for p, doc in loaded:
        if not isinstance(doc, list) or not all(isinstance(o, dict) for o in doc):
            raise DascInputError(f"{p}: expected a serving_report summary.json (a list of arm objects)")
    objs = [o for _, doc in loaded for o in doc
            if o.get("ttft_ratio_vs_dense_spread") and o["ttft_ratio_vs_dense_spread"]["n"]]
    if not objs:
        raise DascInputError("regime map: no arm with a Dense-paired TTFT ratio in " + ", ".join(map(str, summaries)))
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    series = {}
    for o in objs:
        lab = f"{o['arm']} ({o['protocol']}, {o['replay']}" + (f", rho {o['rho']}" if o.get("rho") else "") + ")"
        series.setdefault(lab, []).append(o)
    for lab, os_ in sorted(series.items()):
        os_.sort(key=lambda o: o["initial_prompt_mean"])
        x = [o["initial_prompt_mean"] for o in os_]
        y = [o["ttft_ratio_vs_dense_spread"]["mean"] for o in os_]
        lo = [m - o["ttft_ratio_vs_dense_spread"]["min"] for m, o in zip(y, os_)]
        hi = [o["ttft_ratio_vs_dense_spread"]["max"] - m for m, o in zip(y, os_)]
        ax.errorbar(x, y, yerr=[lo, hi], marker="o", capsize=3, ls="none",
                    label=f"{lab}, n={'/'.join(str(o['ttft_ratio_vs_dense_spread']['n']) for o in os_)}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(0.6, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("mean initial prompt (tokens)")
    ax.set_ylabel("mean TTFT / Dense (paired by trace seed; bars: range)")
    ax.set_title("Where a cache hit shortens TTFT (dummy weights, one H200; n = trace seeds per point)", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
