"""Machine-readable serving results (issue 14 item 5) and the regime map (item 3).

``summary.json`` of a run directory is a list with one object per arm and condition, with these
keys only: ``arm, model, w_max, decays, regime, rate, decode_clip, seeds, mean_ttft_s,
mean_ttft_ratio_vs_dense, mean_ttft_ratio_vs_int8, mean_e2e_ratio_vs_dense, p95_ttft_s, hit_rate,
capacity``. As in ``plot_serving.py`` (paper App. C.3) a statistic is computed within one seed and
then averaged over seeds (P95 and hit rate too); a ratio is the mean of per-seed ratios, paired by
seed (null without a paired baseline). ``capacity`` is the arm's checkpoint capacity in slots
(SGLang INT8: its INT8 pool slots only). ``rate`` (conversations/s): the open loop's Poisson
arrival rate; for a closed loop, the conversations of a run divided by Dense's wall time (the
arrival rate an open loop would need to offer the same conversations per second; measured, not a
parameter, but it places both kinds of run on one axis and tells a run's closed-loop conditions
apart).

* closed loop (``serve_bench.py`` runs, ``ARM_sSEED.json.gz`` + ``arms.json`` + ``manifest.json``
  in sub-directories): runs are grouped into conditions by (concurrency, decode clip,
  conversations, TP degree); an (arm, seed) met twice keeps the first sub-directory's run.
* open loop (``run_open_loop.py``'s ``manifest.json`` + ``ARM/result.json[.gz]``): the seeds are
  the measured windows of each arm's run.

    python -m benchmarks.serving_summary closed benchmarks/results/2026-11-29-h200-kimi-linear-48b --decays init
    python -m benchmarks.serving_summary open benchmarks/results/RUN --decays paper-calibrated
    python -m benchmarks.serving_summary map benchmarks/results/*/summary.json --out benchmarks/figures/regime-map.png
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Iterable, Sequence

from benchmarks.plot_serving import paired_ratios
from dasc_compile.errors import DascInputError

KEYS = ("arm", "model", "w_max", "decays", "regime", "rate", "decode_clip", "seeds", "mean_ttft_s",
        "mean_ttft_ratio_vs_dense", "mean_ttft_ratio_vs_int8", "mean_e2e_ratio_vs_dense", "p95_ttft_s",
        "hit_rate", "capacity")
CALIBRATED_LABEL = "synthetic, calibrated to published statistics; not trained weights"
DEFAULT_MODEL = "Kimi-Linear-48B-A3B (dummy weights)"


def _read(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _w_max(arm: str):
    m = re.match(r"dasc-nr-w(\d+)", arm)
    return int(m.group(1)) if m else None


def _capacity(launch: dict | None):
    """Checkpoint capacity of an arm's launch record (INT8: its pool slots only, see module docstring)."""
    if not launch:
        return None
    return launch["ckpt_slots"] if launch.get("kind") == "int8" and "ckpt_slots" in launch else launch.get("capacity")


def spread(vals: Sequence[float]) -> dict:
    """mean, SD (n - 1; 0 for one value), min and max of per-seed values."""
    v = [x for x in vals if x is not None and not math.isnan(x)]
    if not v:
        return {"mean": None, "sd": None, "min": None, "max": None, "n": 0}
    return {"mean": sum(v) / len(v), "sd": statistics.stdev(v) if len(v) > 1 else 0.0, "min": min(v), "max": max(v),
            "n": len(v)}


def condition_objects(runs: Sequence[dict], *, model: str, decays: str, regime: str, rate, decode_clip,
                      capacity: dict) -> list[dict]:
    """The summary objects of one condition. ``runs``: per-seed summaries with ``arm``, ``_seed``,
    ``ttft_mean_s``, ``ttft_p95_s``, ``e2e_mean_s``, ``cache_hit_token_rate``."""
    ratios = {b: paired_ratios(runs, b) for b in ("dense", "int8")}
    out = []
    for arm in dict.fromkeys(r["arm"] for r in runs):
        mine = sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["_seed"])

        def rat(base: str, key: str):
            v = ratios[base].get(arm, {}).get(key)
            return v[0] if v else None

        out.append({"arm": arm, "model": model, "w_max": _w_max(arm), "decays": decays, "regime": regime,
                    "rate": rate, "decode_clip": decode_clip, "seeds": [r["_seed"] for r in mine],
                    "mean_ttft_s": spread([r["ttft_mean_s"] for r in mine])["mean"],
                    "mean_ttft_ratio_vs_dense": rat("dense", "ttft_mean_s"),
                    "mean_ttft_ratio_vs_int8": rat("int8", "ttft_mean_s"),
                    "mean_e2e_ratio_vs_dense": rat("dense", "e2e_mean_s"),
                    "p95_ttft_s": spread([r["ttft_p95_s"] for r in mine])["mean"],
                    "hit_rate": spread([r["cache_hit_token_rate"] for r in mine])["mean"],
                    "capacity": capacity.get(arm)})
    return out


def closed_loop(run_dir: Path, *, decays: str, model: str) -> tuple[list[dict], list[dict]]:
    """Summary objects of a directory of closed-loop runs (module docstring), and the per-seed rows."""
    groups: dict[tuple, dict] = {}
    for sub in sorted(p for p in run_dir.iterdir() if p.is_dir()):
        files = sorted(sub.glob("*_s*.json.gz")) + sorted(sub.glob("*_s*.json"))
        if not files:
            continue
        man = _read(sub / "manifest.json") if (sub / "manifest.json").is_file() else {}
        arms = {a["arm"]: a for a in (_read(sub / "arms.json") if (sub / "arms.json").is_file() else [])}
        tp = (man.get("args") or {}).get("gpus_per_arm", 1)
        for f in files:
            obj = _read(f)
            c, s = obj["config"], dict(obj["summary"])
            key = (c["concurrency"], c.get("decode_clip"), c["conversations"], tp)
            g = groups.setdefault(key, {"runs": {}, "capacity": {}, "walls": []})
            if (s["arm"], c["seed"]) in g["runs"]:
                continue
            s["_seed"], s["_conversations"] = c["seed"], c["conversations"]
            g["runs"][(s["arm"], c["seed"])] = s
            g["capacity"].setdefault(s["arm"], _capacity(arms.get(s["arm"])) or s.get("checkpoint_capacity"))
    objs, rows = [], []
    for (conc, clip, n_conv, tp), g in groups.items():
        runs = list(g["runs"].values())
        base = [r for r in runs if r["arm"] == "dense"] or runs
        rate = statistics.mean(r["_conversations"] / r["wall_s"] for r in base)
        objs += condition_objects(runs, model=model + (f", TP {tp}" if tp != 1 else ""), decays=decays,
                                  regime="closed-loop", rate=round(rate, 4), decode_clip=clip, capacity=g["capacity"])
        rows += [{"condition": f"closed loop C={conc}, N={n_conv}, clip {clip}, TP {tp}", **r} for r in runs]
    if not objs:
        hint = " (it holds a manifest.json with arms: an open-loop run? use 'open')" \
            if (run_dir / "manifest.json").is_file() else ""
        raise DascInputError(f"{run_dir}: no closed-loop results (ARM_sSEED.json[.gz] in sub-directories){hint}")
    return objs, rows


def open_loop(run_dir: Path, *, decays: str, model: str, exclude: Sequence[str] = ()) -> tuple[list[dict], list[dict]]:
    """Summary objects of a ``run_open_loop.py`` work directory (its windows are the seeds).

    ``exclude``: arms left out (a run that is not a valid measurement; its raw data stays beside it).
    Raises DascInputError when an excluded arm is not in the manifest.
    """
    man = _read(run_dir / "manifest.json")
    unknown = [n for n in exclude if n not in man["arms"]]
    if "dense" in exclude:
        raise DascInputError("--exclude dense: every ratio is taken against Dense; keep it")
    if unknown:
        raise DascInputError(f"--exclude: no arm {unknown} in {run_dir / 'manifest.json'}")
    runs, cap, clip, rate = [], {}, None, None
    for name, rec in man["arms"].items():
        if name in exclude:
            continue
        res = next((f for f in (run_dir / name / "result.json", run_dir / name / "result.json.gz") if f.is_file()), None)
        if res is None:
            continue
        obj = _read(res)
        clip, rate = obj["config"]["decode_clip"], obj["config"]["params"]["rate"]
        cap[name] = _capacity(rec.get("launch"))
        for w in obj["summary"]["windows"]:
            runs.append({**w, "arm": name, "_seed": w["seed"]})
    if not runs:
        raise DascInputError(f"{run_dir}: no arm has a result.json")
    objs = condition_objects(runs, model=model, decays=decays, regime="open-loop", rate=round(rate, 4),
                             decode_clip=clip, capacity=cap)
    return objs, [{"condition": f"open loop rate {rate:.3f}/s, clip {clip}", **r} for r in runs]


def write_summary(run_dir: Path, objs: Sequence[dict]) -> Path:
    """Write ``run_dir/summary.json`` (the objects with exactly :data:`KEYS`)."""
    for o in objs:
        if tuple(o) != KEYS:
            raise DascInputError(f"summary object for {o.get('arm')!r}: keys {list(o)} are not {list(KEYS)}")
    path = run_dir / "summary.json"
    path.write_text(json.dumps(list(objs), indent=1) + "\n")
    return path


def spread_markdown(rows: Sequence[dict]) -> str:
    """Per condition and arm: mean, SD and range over seeds of mean TTFT, P95 TTFT, mean E2E and hit rate."""
    lines = ["| condition | arm | seeds | mean TTFT (s): mean, SD, range | P95 TTFT (s): mean, range "
             "| mean E2E (s): mean, SD | hit rate |", "|---|---|---:|---|---|---|---:|"]
    for cond in dict.fromkeys(r["condition"] for r in rows):
        for arm in dict.fromkeys(r["arm"] for r in rows if r["condition"] == cond):
            rs = [r for r in rows if r["condition"] == cond and r["arm"] == arm]
            t, p, e, h = (spread([r[k] for r in rs]) for k in ("ttft_mean_s", "ttft_p95_s", "e2e_mean_s",
                                                                 "cache_hit_token_rate"))
            lines.append(f"| {cond} | {arm} | {t['n']} | {t['mean']:.3f}, {t['sd']:.3f}, {t['min']:.3f}-{t['max']:.3f} "
                         f"| {p['mean']:.3f}, {p['min']:.3f}-{p['max']:.3f} | {e['mean']:.3f}, {e['sd']:.3f} "
                         f"| {h['mean']:.3f} |")
    return "\n".join(lines) + "\n"


def regime_map(summaries: Sequence[Path], out: Path) -> None:
    """The mean-TTFT ratio dasc / Dense of every dasc arm over arrival rate x reply length (one PNG).

    Open-loop runs are circles, closed-loop runs squares; colour is the ratio (blue below 1: dasc
    faster). Each point is labelled with its arm and decays.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    pts = []
    for p in summaries:
        try:
            doc = json.loads(Path(p).read_text())
        except ValueError as e:
            raise DascInputError(f"{p}: not JSON ({e})") from None
        if not isinstance(doc, list) or not all(isinstance(o, dict) and set(KEYS) <= set(o) for o in doc):
            raise DascInputError(f"{p}: not a serving summary.json (expected a list of objects with {list(KEYS)})")
        for o in doc:
            if o["w_max"] is not None and o["mean_ttft_ratio_vs_dense"] is not None and o["rate"] is not None:
                pts.append(o)
    if not pts:
        raise DascInputError("no dasc arm with a ratio against Dense in the summaries")
    fig, ax = plt.subplots(figsize=(10, 5.6))
    norm = TwoSlopeNorm(vmin=min(0.5, min(o["mean_ttft_ratio_vs_dense"] for o in pts)), vcenter=1.0,
                        vmax=max(1.2, max(o["mean_ttft_ratio_vs_dense"] for o in pts)))
    conds = sorted({(o["decode_clip"], o["rate"], o["regime"]) for o in pts})
    xpos, last = {}, {}
    for clip, rate, regime in conds:          # conditions at nearly the same rate side by side
        x = rate
        if clip in last and x < last[clip] * 1.35:
            x = last[clip] * 1.35
        xpos[(clip, rate, regime)] = last[clip] = x
    for clip, rate, regime in conds:
        mine = sorted((o for o in pts if (o["decode_clip"], o["rate"], o["regime"]) == (clip, rate, regime)),
                      key=lambda o: (o["w_max"], o["arm"]))
        x = xpos[(clip, rate, regime)]
        for i, o in enumerate(mine):
            y = clip * (1.22 ** i)            # the arms of one condition stacked upwards
            sc = ax.scatter([x], [y], c=[o["mean_ttft_ratio_vs_dense"]], cmap="coolwarm", norm=norm, s=80,
                            marker="o" if regime == "open-loop" else "s", edgecolors="k", linewidths=0.6)
            ax.annotate(f"{o['arm'].replace('dasc-nr-', '')} {o['mean_ttft_ratio_vs_dense']:.2f}", (x, y),
                        textcoords="offset points", xytext=(6, -3), fontsize=6.5)
        tag = "calibrated" if mine[0]["decays"] == "paper-calibrated" else mine[0]["decays"]
        ax.annotate(f"{'open' if regime == 'open-loop' else 'closed'} loop\n{rate:.2f}/s, {tag}", (x, clip),
                    textcoords="offset points", xytext=(-14, -22), fontsize=6.5, color="0.25")
    ax.set_xlim(min(xpos.values()) / 1.6, max(xpos.values()) * 2.2)
    ax.set_ylim(min(c for c, _, _ in conds) / 1.8, max(c for c, _, _ in conds) * 1.22 ** 8)
    ax.set_yscale("log", base=2)
    ax.set_xscale("log")
    ax.set_xlabel("conversation arrival rate (conversations/s; closed loop: conversations / Dense's wall time; "
                  "columns at nearly one rate are set apart)", fontsize=8)
    ax.set_ylabel("reply length: decode clip (tokens; arms of one run stacked upwards)")
    fig.colorbar(sc, ax=ax, label="mean TTFT, dasc-nr / Dense (paired by seed; open loop: by window)")
    ax.set_title("When dasc-nr lowers TTFT: circles open loop, squares closed loop (queue-bound)", fontsize=9)
    calibrated = any(o["decays"] == "paper-calibrated" for o in pts)
    fig.text(0.01, 0.005, ("'calibrated' points: decays " + CALIBRATED_LABEL + "; " if calibrated else "")
             + "'init': initialisation draw; all runs: dummy weights, H200", fontsize=7, color="0.3")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out, dpi=150)
    plt.close(fig)


def main(argv: Iterable[str] | None = None) -> int:
    """CLI (module docstring): exit 0, or 2 with one ``error:`` line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=["closed", "open", "map"])
    ap.add_argument("paths", nargs="+", type=Path, help="run directory (closed / open) or summary.json files (map)")
    ap.add_argument("--decays", choices=["init", "paper-calibrated", "trained"], default=None,
                    help="what the plans' decay values are (required for closed / open)")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", type=Path, default=None, help="map: the PNG to write")
    ap.add_argument("--exclude", action="append", default=[],
                    help="open: leave this arm out of summary.json (repeatable; say why in the run's note)")
    a = ap.parse_args(argv)
    try:
        if a.kind != "map" and a.decays is None:
            raise DascInputError(f"{a.kind}: --decays is required (init | paper-calibrated | trained): it labels "
                                 "every summary object and the regime map")
        if a.kind == "map":
            if a.out is None:
                raise DascInputError("map: --out PNG is required")
            if not a.out.parent.is_dir():
                raise DascInputError(f"--out {a.out}: folder {a.out.parent} does not exist")
            regime_map(a.paths, a.out)
            print(f"wrote {a.out}")
            return 0
        for d in a.paths:
            if not d.is_dir():
                raise DascInputError(f"{d}: expected a run directory")
            if a.exclude and a.kind != "open":
                raise DascInputError("--exclude applies to open-loop runs only")
            objs, rows = (open_loop(d, decays=a.decays, model=a.model, exclude=a.exclude) if a.kind == "open"
                          else closed_loop(d, decays=a.decays, model=a.model))
            print(f"wrote {write_summary(d, objs)} ({len(objs)} arms x conditions)")
            print(spread_markdown(rows))
    except (DascInputError, OSError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
