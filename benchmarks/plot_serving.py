"""Combine serving-arm results into one table and a TTFT / E2E vs checkpoint-capacity figure.

Reads result files written by ``benchmarks/serve_bench.py``. Files with the same arm name are
runs of that arm under different seeds: as in the paper (App. C.3, Table 4) each statistic is
computed within a run and then averaged over the runs (P95 is not pooled). The figure follows
Fig. 4(a-c): mean TTFT and mean E2E latency against the arm's state checkpoint capacity, one
point per arm; with several runs the bar spans their smallest and largest mean.

    python -m benchmarks.plot_serving out/dense_s*.json out/int8_s*.json out/dasc_s*.json \\
        --out out/serving
writes ``out/serving.png`` and ``out/serving.md``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from pathlib import Path
from typing import Iterable, Sequence

from benchmarks.serve_bench import RESULT_FORMAT, TABLE_HEAD, table_row
from dasc_compile.errors import DascInputError

STATS = ("ttft_mean_s", "ttft_p95_s", "e2e_mean_s", "e2e_p95_s", "cache_hit_token_rate")


def load_results(paths: Sequence[str | Path]) -> list[dict]:
    """The ``summary`` of each result file (DascInputError for a file that is not a result)."""
    out = []
    for p in paths:
        try:
            raw = Path(p).read_bytes()
            obj = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
        except (OSError, ValueError) as e:
            raise DascInputError(f"{p}: cannot read result JSON ({e})") from None
        if not isinstance(obj, dict) or obj.get("format") != RESULT_FORMAT:
            raise DascInputError(f"{p}: expected a {RESULT_FORMAT!r} file from serve_bench.py")
        summ = dict(obj["summary"])
        summ["_seed"] = (obj.get("config") or {}).get("seed")
        out.append(summ)
    return out


def paired_ratios(summaries: Sequence[dict], baseline: str,
                  keys: Sequence[str] = ("ttft_mean_s", "e2e_mean_s")) -> dict[str, dict[str, tuple]]:
    """Per arm and statistic: the ratio arm / ``baseline`` paired by seed (same conversation order).

    For every seed both arms ran, ``arm[key] / baseline[key]``; returns
    ``{arm: {key: (mean, min, max, n_seeds)}}`` for arms sharing at least one seed with the
    baseline (the baseline itself included, at 1.0). Runs without a seed are not paired.
    """
    by: dict[tuple[str, object], dict] = {}
    for s in summaries:
        if s.get("_seed") is not None:
            if (s["arm"], s["_seed"]) in by:
                raise DascInputError(f"arm {s['arm']!r} has two runs with seed {s['_seed']}: pair them one "
                                     "to one (pass each run once)")
            by[(s["arm"], s["_seed"])] = s
    base = {seed: s for (arm, seed), s in by.items() if arm == baseline}
    out: dict[str, dict[str, tuple]] = {}
    for arm in dict.fromkeys(s["arm"] for s in summaries):
        per = {}
        for k in keys:
            rs = [by[(arm, seed)][k] / b[k] for seed, b in sorted(base.items(), key=lambda x: str(x[0]))
                  if (arm, seed) in by and b.get(k) and by[(arm, seed)].get(k) is not None]
            if rs:
                per[k] = (sum(rs) / len(rs), min(rs), max(rs), len(rs))
        if per:
            out[arm] = per
    return out


def ratio_markdown(summaries: Sequence[dict], baselines: Sequence[str]) -> str:
    """Table of seed-paired ratios of mean TTFT and mean E2E against each baseline arm present."""
    present = {s["arm"] for s in summaries}
    bases = [b for b in baselines if b in present]
    if not bases:
        return ""
    rat = {b: paired_ratios(summaries, b) for b in bases}
    head = ["arm"] + [f"{k} / {b}" for b in bases for k in ("mean TTFT", "mean E2E")]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for arm in dict.fromkeys(s["arm"] for s in summaries):
        cells = [arm]
        for b in bases:
            for k in ("ttft_mean_s", "e2e_mean_s"):
                v = rat[b].get(arm, {}).get(k)
                cells.append(f"{v[0]:.3f} ({v[1]:.3f}-{v[2]:.3f}, {v[3]} seeds)" if v else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(["Seed-paired ratios (mean of per-seed ratios; range over seeds):", "", *lines]) + "\n"


def combine_arms(summaries: Sequence[dict]) -> list[dict]:
    """One row per arm name (first-appearance order): per-run statistics averaged over runs.

    Each row has the :data:`STATS` means, ``requests`` and ``failed`` summed, ``runs``, and
    ``ttft_mean_range`` / ``e2e_mean_range`` = (min, max) of the per-run means (seconds).
    Raises:
        DascInputError: runs of one arm disagree on checkpoint capacity, or an arm has none.
    """
    arms: dict[str, list[dict]] = {}
    for s in summaries:
        arms.setdefault(s["arm"], []).append(s)
    rows = []
    for arm, runs in arms.items():
        caps = {r.get("checkpoint_capacity") for r in runs}
        if len(caps) != 1 or None in caps:
            raise DascInputError(
                f"arm {arm!r}: every run needs the same --checkpoint-capacity, got {sorted(caps, key=str)}")
        row = {"arm": arm, "checkpoint_capacity": caps.pop(), "runs": len(runs),
               "requests": sum(r["requests"] for r in runs),
               "failed": sum(r["failed"] for r in runs)}
        for k in STATS:
            vals = [r[k] for r in runs if r.get(k) is not None and not math.isnan(r[k])]
            row[k] = sum(vals) / len(vals) if vals else math.nan
        for k in ("ttft_mean_s", "e2e_mean_s"):
            vals = [r[k] for r in runs if r.get(k) is not None]
            row[k[:-2] + "_range"] = (min(vals), max(vals)) if vals else (math.nan, math.nan)
        rows.append(row)
    return rows


def combined_markdown(rows: Sequence[dict]) -> str:
    """The combined table (one row per arm; statistics averaged over that arm's runs)."""
    lines = ["# Serving arms (statistics averaged over runs)", "", TABLE_HEAD]
    lines += [table_row(r) for r in rows]
    lines += ["", "runs per arm: " + ", ".join(f"{r['arm']}={r['runs']}" for r in rows)]
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict], path: str | Path) -> None:
    """Two panels, mean TTFT and mean E2E latency (s) vs checkpoint capacity, one labelled point per
    arm with a bar from its smallest to its largest per-run mean; writes a PNG to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, title in ((axes[0], "ttft_mean", "mean TTFT (s)"),
                           (axes[1], "e2e_mean", "mean E2E latency (s)")):
        for i, r in enumerate(rows):
            y = r[key + "_s"]
            lo, hi = r[key + "_range"]
            ax.errorbar([r["checkpoint_capacity"]], [y], yerr=[[y - lo], [hi - y]], fmt="o",
                        color=f"C{i % 10}", capsize=3, label=r["arm"])
            ax.annotate(r["arm"], (r["checkpoint_capacity"], y), textcoords="offset points",
                        xytext=(5, 4), fontsize=8)
        ax.set_xlabel("state checkpoint capacity (slots)")
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
    # every point is labelled with its arm, so no legend (it hid points); say what the bars are
    fig.text(0.5, 0.005, "bars: smallest to largest per-run mean over the runs (seeds) of each arm",
             ha="center", va="bottom", fontsize=7, color="0.35")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main(argv: Iterable[str] | None = None) -> int:
    """CLI: combine result files; exit 0, or 2 on bad input (DascInputError)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+", help="result JSON files from serve_bench.py")
    ap.add_argument("--out", required=True, help="output prefix: writes PREFIX.png and PREFIX.md")
    ap.add_argument("--baseline", action="append", default=None,
                    help="arm to compare against, paired by seed (repeatable; default: dense and int8)")
    ap.add_argument("--capacity", action="append", default=[], metavar="ARM=SLOTS",
                    help="replace the checkpoint capacity an arm's runs recorded (repeatable), e.g. when the "
                         "recorded figure counted slots that cannot hold a checkpoint")
    a = ap.parse_args(argv)
    try:
        summaries = load_results(a.results)
        for item in a.capacity:
            arm, sep, val = item.partition("=")
            if not sep or not val.strip().isdigit() or not any(x["arm"] == arm for x in summaries):
                raise DascInputError(f"--capacity {item!r}: expected ARM=SLOTS with an arm present in the results")
            for x in summaries:
                if x["arm"] == arm:
                    x["checkpoint_capacity"] = int(val)
        rows = combine_arms(summaries)
    except DascInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(a.out)
    md = combined_markdown(rows)
    rt = ratio_markdown(summaries, a.baseline or ["dense", "int8"])
    if rt:
        md += "\n" + rt
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_name(out.name + ".md").write_text(md)
    plot(rows, out.with_name(out.name + ".png"))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
