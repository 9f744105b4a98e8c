"""Rendering of ``serving_report``'s results: the markdown tables (one per condition, with the legend and
the server-side checkpoint account) and the regime map figure (issue 24 item 7). Split from
:mod:`benchmarks.serving_report`, which computes what these render."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Sequence

from benchmarks import ckpt_account
from benchmarks.card import card_label
from benchmarks.chat_trace import CHECKPOINT_ALIGN
from benchmarks.serving_pool import group_label, pool_seed_ratios
from dasc_compile.errors import DascInputError

__all__ = ["LEGEND", "markdown", "pool_points", "read_json_file", "regime_map"]


def read_json_file(path: Path, what: str):
    """``path``'s JSON, or one ``error:`` line naming the file and what it should be (a missing file and a folder
    are said so plainly, not as Python's exception)."""
    if not Path(path).exists():
        raise DascInputError(f"{path}: does not exist (expected the {what})")
    if Path(path).is_dir():
        raise DascInputError(f"{path}: is a folder, not the {what}")
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DascInputError(f"{path}: not a readable {what} ({type(exc).__name__}: {exc})") from None


#: What the table's terms mean (printed above the tables).
LEGEND = ("n: the arm's runs (trace seeds). Ratios pair an arm's run with the baseline's run of the same seed "
          "and summarise the per-seed ratios: mean (SD) [min, max], then the number of pairs; (—) where one pair "
          "gives no spread. Hit rate: cached prompt tokens / prompt tokens; bound: the same if every earlier "
          "turn's prefix were cached. Later turns: turns 2+ whose prefix hit the previous reply's end, only the "
          "previous prompt's end, or nothing (lost). Drift: the call's baseline arm (Dense unless the call named "
          "another), its closing run / its opening run of the same seed in one call. Capacity: cached states with no request running / while R requests run (the "
          "running requests' native slots subtracted).")


def _f(x, nd=3) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _n(x) -> str:
    return "—" if x is None else str(x)


def _drift(o: dict) -> dict:
    """The arm's drift spread (summaries written before the ``drift`` key have ``dense_drift`` only)."""
    return o.get("drift") or o["dense_drift"]


def _arm_label(arm: str) -> str:
    return {"dense": "Dense", "int8": "INT8"}.get(arm, arm)


def markdown(objs: Sequence[dict]) -> str:
    """One table per condition: per arm mean TTFT (s), ratios to Dense/INT8 (mean, SD, range),
    E2E ratios to Dense and INT8, hit rate vs bound, hit/miss TTFT, queue/prefill, hit account, n, capacity with no request
    running / under load ("—" where arms.json predates the second)."""
    out = []
    if objs:
        out += [f"Model: {objs[0]['model']}; decays: {objs[0]['decays']}"
                + (f"; GPU: {objs[0]['gpu']}." if objs[0].get("gpu") else "; GPU not recorded."), "", LEGEND, ""]
    def key(o: dict) -> tuple:
        return (o["protocol"], o["replay"], o["pad_tokens"], o.get("shared_prefix_tokens") or 0, o["reply_clip"],
                o["clients"], o["rate"])

    for cond in dict.fromkeys(key(o) for o in objs):
        rows = [o for o in objs if key(o) == cond]
        p, rep, pad, shared, clip, c, rate = cond
        ds = [o for o in rows if (o.get("drift") or o.get("dense_drift") or {}).get("n")]   # each call's baseline
        out.append(f"### {p}, {rep}, pad {pad}" + (f" (first {shared} shared)" if shared else "")
                   + f", reply clip {clip}, " + (f"{c} clients" if c else f"rate {rate}/s" + (f" (rho {rows[0]['rho']})" if rows[0].get("rho") else ""))
                   + f"; initial prompt mean {_f(rows[0]['initial_prompt_mean'], 0)} tokens, context max "
                     f"{rows[0]['context_max']}"
                   + "".join(f"; {_arm_label(d['arm'])} drift over a call {_f(_drift(d)['mean'])} (n={_drift(d)['n']})"
                             for d in ds)
                   + ("; baseline: each seed's closing run (the one after the other arms)"
                      if rows[0].get("baseline_run") == "closing" else ""))
        out.append("")
        out.append("| arm | n | mean TTFT s (SD) | TTFT / Dense: mean (SD) [min, max], pairs | TTFT / INT8: mean, pairs | E2E / Dense | E2E / INT8 | "
                   "hit rate (bound) | TTFT hit / miss s | queue / prefill s | later turns: reply-end / prompt-end / lost | capacity / under load |")
        out.append("|---|---:|---|---|---|---|---|---|---|---|---|---:|")
        for o in rows:
            sp, r = o["mean_ttft_spread"], o["ttft_ratio_vs_dense_spread"]
            ri, ha = o["ttft_ratio_vs_int8_spread"], o["hit_account"]
            out.append(f"| {o['arm']} | {sp['n']} | {_f(sp['mean'])} ({_f(sp['sd'])}) | "
                       + (f"{_f(r['mean'])} ({_f(r['sd'])}) [{_f(r['min'])}, {_f(r['max'])}], {r['n']}" if r and r["n"] else "—")
                       + f" | {_f(ri['mean']) + ', ' + str(ri['n']) if ri and ri['n'] else '—'} | "
                       f"{_f(o['mean_e2e_ratio_vs_dense'])} | {_f(o.get('mean_e2e_ratio_vs_int8'))} | "
                       f"{_f(o['hit_rate'])} ({_f(o['reuse_bound'])}) | {_f(o['ttft_hit_s'])} / {_f(o['ttft_miss_s'])} | "
                       f"{_f(o['queue_s'])} / {_f(o['prefill_s'])} | {ha['later_turns']}: {ha['reply_end']} / "
                       f"{ha['prompt_end']} / {ha['lost']} | {_n(o['capacity'])} / {_n(o.get('capacity_under_load'))} |")
        out.append("")
        if shared:      # what changes in the legend's terms
            out += [shared_line(rows) + " With a shared prefix the bound counts the shared part another "
                    "conversation started before; a later turn that hit no more than it is lost.", ""]
        if any(o.get("live_conversations_max") for o in rows):
            out += ["Live conversations (first request to last reply, think time included; the working set the "
                    "cached states must cover): " + "; ".join(
                        f"{o['arm']} mean {_f(o.get('live_conversations_mean'), 1)}, peak {_n(o.get('live_conversations_max'))}"
                        f" (capacity under load {_n(o.get('capacity_under_load'))})" for o in rows) + ".", ""]
        line = lost_turns_line(rows)
        out += [line, ""] if line else []
        if p == "open-loop":
            out += ["Requests in flight (of " + str(rows[0]["max_running"]) + " running at once): "
                    + "; ".join(f"{o['arm']} {_f(o.get('inflight_arrivals_mean'), 2)} while conversations arrive, "
                                f"{_f(o['inflight_mean'], 2)} over the run, peak {_n(o.get('inflight_max'))}"
                                + ("" if o["stable"] else " (UNSTABLE: the queue grew in "
                                   + ", ".join(map(str, o.get("unstable_seeds") or ["some runs"]))
                                   + "; left out of the means and ratios)") for o in rows) + ".", ""]
        out.extend(ckpt_account.markdown_rows(rows))
    return "\n".join(out)


def shared_line(rows: Sequence[dict]) -> str:
    """One line per condition with a shared system prompt: first turns served from another conversation's
    checkpoint in the shared part, and lost later turns that found only that part (counted lost,
    :func:`benchmarks.turn_account.turn_class`)."""
    def mid(ha: dict) -> str:
        return f" (sent mid-run {_n(ha.get('first_shared_hits_mid'))} of {_n(ha.get('first_turns_mid'))})" \
            if ha.get("first_turns_mid") else ""

    def whole(ha: dict) -> str:        # reports written before the count existed have none
        if ha.get("first_shared_whole") is None:
            return ""
        tail = f", mid-run {_n(ha.get('first_shared_whole_mid'))}" if ha.get("first_turns_mid") else ""
        return f" [the whole part {_n(ha.get('first_shared_whole'))}{tail}]"
    return ("Shared system prompt: first turns served from the shared part (of those a closed loop sends after its "
            f"first clients' conversations) [of them, served the whole shared part, to SGLang's {CHECKPOINT_ALIGN}-token "
            "cache chunk] / lost later turns that found only the shared part: " + "; ".join(
                f"{o['arm']} {_n(o['hit_account'].get('first_shared_hits'))}{mid(o['hit_account'])}"
                f"{whole(o['hit_account'])} / {_n(o['hit_account'].get('lost_shared_hit'))}" for o in rows) + ".")


def lost_turns_line(rows: Sequence[dict]) -> str:
    """One line per condition: each arm's lost later turns split by why (``benchmarks.turn_account``) and the
    median time a lost and a hit turn's conversation had been away; empty for summaries without the split."""
    if not any(o["hit_account"].get("lost_reply_stored") is not None for o in rows):
        return ""
    return ("Lost later turns, by why (a reply-end checkpoint was stored and evicted before the turn came back / "
            "the reply crossed no tracking boundary, so only a prompt-end one could be hit); median time away (the previous "
            "reply's end to this turn's scheduling: think time plus queue), lost vs hit turns: " + "; ".join(
                f"{o['arm']} {o['hit_account']['lost']} ({_n(o['hit_account'].get('lost_reply_stored'))} / "
                f"{_n(o['hit_account'].get('lost_prompt_only'))}), {_f((o.get('away_median_s') or {}).get('lost'), 1)} s"
                f" vs {_f((o.get('away_median_s') or {}).get('hit'), 1)} s" for o in rows) + ".")


def first_timed_note(runs: Sequence[dict]) -> str:
    """A closing line naming the counted runs that were their arm's first timed run in the work folder
    (first-use slowness that excluding the start-up call does not remove when an arm never ran there);
    empty when there are none."""
    hit = sorted(f"{r['arm']} seed {r['seed']} (call {r['call'].rsplit('#', 1)[-1]})"
                 for r in runs if r.get("first_timed"))
    if not hit:
        return ""
    return ("\nCounted runs that were their arm's first timed run (first-use slowness not excluded): "
            + "; ".join(hit) + ".\n")


def pool_points(docs: Sequence[list]) -> list[dict]:
    """The regime map's points: one per (arm, protocol, replay, rate, context pad), pooling the per-seed
    mean-TTFT ratios to Dense of every summary given (``ttft_ratio_vs_dense_by_seed``).

    A trace seed (``<trace>/<seed>``) measured in two summaries (two sessions that reused it) is one
    draw: its ratios are averaged and it counts once in ``n``. An object without per-seed ratios (summaries written before
    they were kept) stays a point of its own, from its ``ttft_ratio_vs_dense_spread``.

    Returns: dicts ``label``, ``pad``, ``x`` (mean initial prompt, tokens), ``mean``, ``min``, ``max``,
    ``n`` (distinct trace seeds), ``repeated`` (seeds measured more than once), ``seeds``.
    """
    points = []
    for doc in docs:
        for o in doc:
            sp = o.get("ttft_ratio_vs_dense_spread")
            if sp and sp.get("n") and not o.get("ttft_ratio_vs_dense_by_seed"):
                points.append({"label": group_label(o), "pad": o.get("pad_tokens"), "x": o["initial_prompt_mean"],
                               "mean": sp["mean"], "min": sp["min"], "max": sp["max"], "n": sp["n"],
                               "repeated": [], "seeds": o.get("seeds")})
    for (lab, pad, _), g in pool_seed_ratios(docs, "ttft_ratio_vs_dense_by_seed").items():
        vals = [sum(v) / len(v) for _, v in sorted(g["seeds"].items())]
        points.append({"label": lab, "pad": pad, "x": sum(g["x"]) / len(g["x"]), "mean": sum(vals) / len(vals),
                       "min": min(vals), "max": max(vals), "n": len(vals),
                       "repeated": sorted(s for s, v in g["seeds"].items() if len(v) > 1),
                       "seeds": sorted(g["seeds"])})
    return points


def load_summaries(paths: Sequence[Path]) -> list[list]:
    """Read ``summary.json`` files of this module (each a list of arm objects). An arm object without a ``gpu``
    is labelled "card not recorded" by pooling and the map, and kept apart from every card's series.

    Raises:
        DascInputError: a file is missing, not JSON, or not a list of objects (the message names it).
    """
    docs, seen = [], {}
    for p in paths:
        key = Path(p).resolve()
        if key in seen:       # the same file twice is not a second measurement of its seeds
            raise DascInputError(f"{p}: given twice (also as {seen[key]}); give each summary.json once")
        seen[key] = p
        doc = read_json_file(p, "serving_report summary.json")
        if not isinstance(doc, list) or not all(isinstance(o, dict) for o in doc):
            raise DascInputError(f"{p}: expected a serving_report summary.json (a list of arm objects)")
        for o in doc:       # what pooling and the map read; older objects without ratios are left to them
            if any(k in o for k in ("ttft_ratio_vs_dense_by_seed", "ttft_ratio_vs_int8_by_seed",
                                    "ttft_ratio_vs_dense_spread")):
                _check_arm_object(p, o)
        docs.append(doc)
    return docs


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_ratios(x) -> bool:
    return x is None or (isinstance(x, dict) and all(map(_is_num, x.values())))


#: What pooling and the map read from each arm object of a summary.json: field -> (test, what it must be).
_ARM_FIELDS = {"arm": (lambda v: isinstance(v, str), "a string"),
               "protocol": (lambda v: isinstance(v, str), "a string"),
               "replay": (lambda v: isinstance(v, str), "a string"),
               "initial_prompt_mean": (_is_num, "a number"),
               "pad_tokens": (_is_int, "an integer"),
               "shared_prefix_tokens": (_is_int, "an integer"),
               "clients": (lambda v: v is None or _is_int(v), "an integer or null"),
               "rate": (lambda v: v is None or _is_num(v), "a number or null"),
               "ttft_ratio_vs_dense_by_seed": (_is_ratios, "null or an object of per-seed ratios (numbers)"),
               "ttft_ratio_vs_int8_by_seed": (_is_ratios, "null or an object of per-seed ratios (numbers)"),
               "gpu": (lambda v: v is None or isinstance(v, str), "the card's name (a string) or null")}
_OPTIONAL = {"ttft_ratio_vs_dense_by_seed", "ttft_ratio_vs_int8_by_seed", "gpu", "shared_prefix_tokens"}


def _check_arm_object(path, o: dict) -> None:
    """One line naming the file, the arm and the field when an arm object lacks what pooling reads."""
    name = o.get("arm") if isinstance(o.get("arm"), str) else "?"
    for field, (ok, what) in _ARM_FIELDS.items():
        if field not in o:
            if field in _OPTIONAL:
                continue
            raise DascInputError(f"{path}: arm {name}: field {field!r} is missing; expected {what} "
                                 f"(a serving_report summary.json)")
        if not ok(o[field]):
            raise DascInputError(f"{path}: arm {name}: field {field!r} is {str(o[field])[:60]!r}; expected {what} "
                                 f"(a serving_report summary.json)")


def _marker(label: str) -> str:
    """A series' marker by its arm (the label's first word): a square for SGLang's INT8 pool, a triangle for dasc-wr,
    a circle for the rest, so that an arm reads the same in every colour."""
    arm = label.split(" ", 1)[0]
    return "s" if arm == "int8" else "^" if arm.startswith("dasc-wr") else "o"


#: Protocol A's client count (24 on 8 running); a series with more clients is drawn hollow (:func:`_face`).
BASE_CLIENTS = 24


def _face(label: str) -> str | None:
    """A series' marker face: ``"none"`` (hollow) when its label names more clients than :data:`BASE_CLIENTS`
    (a working set beyond INT8's checkpoints), else None (filled, in the series' colour)."""
    m = re.search(r"(\d+) clients", label)
    return "none" if m and int(m.group(1)) > BASE_CLIENTS else None


def regime_map(summaries: Sequence[Path], out: Path) -> None:
    """Mean-TTFT ratio to Dense (mean and range over trace seeds, pooled over the summaries by
    :func:`pool_points`) against the mean initial prompt, one series per (arm, protocol, replay, clients, rate);
    beside it, where closed-loop summaries pair arms with SGLang's INT8 pool, the ratio to INT8 against the
    client count (the working set). From ``summary.json`` files of this module. Each series is one card's (its
    label names it)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dasc_compile.eval.plotting import save_figure

    if out.suffix.lower() != ".png":
        raise DascInputError(f"--out {out}: the regime map is a PNG image; give a file name ending in .png")
    if not out.parent.is_dir():
        raise DascInputError(f"--out {out}: folder {out.parent} does not exist")
    docs = load_summaries(summaries)
    points = pool_points(docs)
    if not points:
        raise DascInputError("regime map: no arm with a Dense-paired TTFT ratio in " + ", ".join(map(str, summaries)))
    vs_int8 = [({**g, "pad": pad}, [sum(v) / len(v) for _, v in sorted(g["seeds"].items())])
               for (_, pad, _), g in pool_seed_ratios(docs, "ttft_ratio_vs_int8_by_seed").items()
               if g["protocol"] == "closed-loop-paper" and g["clients"]]
    fig, axes = plt.subplots(1, 2 if vs_int8 else 1, figsize=(15 if vs_int8 else 9, 6.6), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 2]} if vs_int8 else None)
    ax = axes[0][0]
    series: dict = {}
    for pt in points:
        series.setdefault(pt["label"], []).append(pt)
    step = 60.0     # tokens between series at one context, so that error bars do not hide each other
    for i, (lab, pts) in enumerate(sorted(series.items())):
        pts.sort(key=lambda pt: pt["x"])
        dx = (i - (len(series) - 1) / 2) * step
        ax.errorbar([pt["x"] + dx for pt in pts], [pt["mean"] for pt in pts],
                    yerr=[[pt["mean"] - pt["min"] for pt in pts], [pt["max"] - pt["mean"] for pt in pts]],
                    marker=_marker(lab), color=plt.get_cmap("tab20")(i % 20), capsize=3, ls="none",
                    mfc=_face(lab), label=f"{lab}, n={'/'.join(str(pt['n']) for pt in pts)}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(0.6, color="grey", lw=0.8, ls="--")
    ax.set_xlabel(f"mean initial prompt (tokens; series offset by {step:.0f} tokens each for legibility)")
    ax.set_ylabel("mean TTFT / Dense (paired by trace seed; bars: range)")
    ax.set_title("Where a cache hit shortens TTFT (dummy weights; one GPU, named in each label)\n"
                 "n = trace seeds per point, left to right; squares: SGLang INT8, triangles: dasc-wr; "
                 f"hollow: more than {BASE_CLIENTS} clients", fontsize=9)
    # below the axes: at ~10k tokens a dozen series stack, and a legend inside covered some of them
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    if vs_int8:                     # the capacity step: the same arms against SGLang's INT8 pool, over client count
        bx = axes[0][1]
        arms: dict = {}
        for g, vals in vs_int8:     # one series per arm, replay and context pad: only the client count varies
            if g["arm"] != "dense":     # Dense / INT8 is the left panel's INT8 point turned over
                arms.setdefault(f"{g['arm']} ({g['replay']}, pad {g['pad']}, {card_label(g['gpu'])})", []).append(
                    (g["clients"], vals))
        for i, (arm, pts) in enumerate(sorted(arms.items())):
            pts.sort(key=lambda cv: cv[0])
            means = [sum(v) / len(v) for _, v in pts]
            dx = (i - (len(arms) - 1) / 2) * 0.4        # clients between arms at one count, for legibility
            # markers only: between two measured client counts nothing was run, and the step is not a line
            bx.errorbar([c + dx for c, _ in pts], means, yerr=[[m - min(v) for m, (_, v) in zip(means, pts)],
                                                               [max(v) - m for m, (_, v) in zip(means, pts)]],
                        marker=_marker(arm), capsize=3, ls="none",
                        label=f"{arm}, n={'/'.join(str(len(v)) for _, v in pts)}")
        bx.axhline(1.0, color="grey", lw=0.8)
        bx.set_xlabel("closed-loop clients on 8 running (the working set; offset by arm)")
        bx.set_ylabel("mean TTFT / SGLang INT8 (paired by trace seed; bars: range)")
        bx.set_title("Against INT8's pool, by working set (protocol A)", fontsize=10)
        bx.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    fig.tight_layout()
    save_figure(fig, out, f"--out {out}")
