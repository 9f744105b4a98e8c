"""Where a mean-TTFT ratio comes from: an exact shift-share account of one arm against the baseline (Dense),
paired by trace seed (issue 24: "the decomposition says which term kept it: queue, prefill, restore cost,
capacity").

Each successful request of a run falls in one class (``chat_replay`` records):

* ``first``: turn 0 (the conversation's first prompt: no arm holds it, though with a shared system prompt an
  arm may serve the shared part);
* ``hit``: a later turn served from its own conversation's checkpoint (``cached_tokens`` beyond the shared part
  of the prompt, ``shared_tokens``: beyond 0 without a shared prefix);
* ``lost``: a later turn with no such hit although its reuse bound was beyond the shared part (its checkpoint
  was evicted);
* ``fresh``: a later turn with nothing of its own to reuse.
The rule is :func:`benchmarks.turn_account.turn_class`.

A run's mean TTFT is ``T = sum_c w_c t_c`` (``w_c``: the class's share of the run's requests, ``t_c``: its
mean TTFT, s). For the baseline run D and the arm's run X of one seed, exactly::

    T_X - T_D = sum_c (w_c^X - w_c^D) * tbar_c        capacity: which later turns each arm kept
              + sum_c wbar_c * (t_c^X - t_c^D)          cost per request, class by class

with ``tbar``, ``wbar`` the two runs' averages. Where a class is empty in one run its mean is taken from the
other run (its weight there is 0, so the identity still holds). Divided by ``T_D`` the terms add up to
``ratio - 1``. The ``first`` cost term is first-use slowness and noise (both arms miss there, but for a shared
system prompt's block, which either may serve: then it also holds whether the block was served); ``hit`` is the
cost of serving a hit (dasc: restoring a compressed checkpoint; queue wait shows in every class); ``lost``
the cost of a miss.

Where one arm has no request of a class (Dense with no hit at all, say), the cost of that class in that arm is
not seen, and a change of cost, such as a shorter queue, shows in the capacity term. The second account splits
the same difference by where the time went, from SGLang's request metrics (``--enable-metrics``): ``queue``
(mean ``queue_s`` of the arm minus the baseline's, over ``T_D``), ``prefill`` (``prefill_s``) and ``other``
(the rest of TTFT: waiting between prefill chunks behind decode steps, the client), which add up to
``ratio - 1`` too (nan where the server sent no metrics).

Two counterfactuals, from the baseline's own per-class costs:

* ``capacity_only``: the ratio if the arm's per-request costs equalled the baseline's (``1 + capacity/T_D``);
* ``lost_needed``: how many later turns the baseline would have to lose, the arm as measured, for the pair to
  reach the ``target`` ratio: ``L_D + n_D (T_X / target - T_D) / (t_lost^D - t_hit^D)`` (None when the
  baseline has no hit or no lost turn to price them).

    python -m benchmarks.ttft_account WORK [WORK ...] --arm dasc-nr-w16 [--baseline dense] [--target 0.70]
        [--exclude-call N] [--exclude-run FILE] [--out account.md]

WORK: unpacked ``run_chat`` work folders (as for ``benchmarks.serving_report``, whose run selection and
exclusions this reuses). Runs of more than one condition (replay, pad and its shared prefix, clients or rate) give
one table per
condition, headed by it, each with its own mean. Refusals: one line ``error: ...``, exit 2, nothing written.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Sequence

from benchmarks.cli_args import OneLineParser, check_out_file, open_fraction, path_named, write_out_file
from benchmarks.run_exclusions import add_run_exclusions
from benchmarks.serving_runs import collect, runs_by_draw
from benchmarks.turn_account import turn_class
from dasc_compile.errors import DascInputError

CLASSES = ("first", "hit", "lost", "fresh")


def class_means(records: Sequence[dict]) -> dict:
    """``{class: (count, mean TTFT s or nan)}`` over the successful records, ``"n"``: their number, and
    ``"queue_s"`` / ``"prefill_s"``: the mean of SGLang's request metrics over them (nan unless every record
    has both)."""
    ok = [r for r in records if r["success"]]
    out: dict = {"n": len(ok)}
    for c in CLASSES:
        t = [r["ttft_s"] for r in ok if turn_class(r) == c]
        out[c] = (len(t), statistics.fmean(t) if t else math.nan)
    for k in ("queue_s", "prefill_s"):      # SGLang's request metrics; nan where the server sent none
        v = [r[k] for r in ok if isinstance(r.get(k), (int, float)) and not math.isnan(r[k])]
        out[k] = statistics.fmean(v) if ok and len(v) == len(ok) else math.nan
    return out


def account(base: dict, arm: dict, *, target: float = 0.70) -> dict:
    """The shift-share account of one seed's pair (module docstring).

    Args:
        base, arm: :func:`class_means` of the baseline's and the arm's run of the same trace seed.
        target: the ratio ``lost_needed`` solves for (issue 24's protocol-B target: 0.70).

    Returns: ``ratio`` (T_X / T_D), ``t_base_s`` / ``t_arm_s`` (mean TTFT, s), ``capacity`` (the mix term over
    T_D), ``cost_<class>`` (each class's cost term over T_D; with ``capacity`` they add up to ``ratio - 1``),
    ``component_queue`` / ``component_prefill`` / ``component_other`` (the split by where the time went, over
    T_D; they add up to ``ratio - 1``),
    ``lost_base`` / ``lost_arm`` (later turns lost), ``later`` (later turns of the baseline),
    ``capacity_only`` and ``lost_needed`` (None where it cannot be priced).

    Raises:
        DascInputError: a run without successful requests.
    """
    if not base["n"] or not arm["n"]:
        raise DascInputError("a run of the pair has no successful request")
    t = {}
    for c in CLASSES:
        tb, tx = base[c][1], arm[c][1]
        # an empty class takes the other run's mean (weight 0 there); empty in both: weight 0 in both
        t[c] = (tx if math.isnan(tb) else tb, tb if math.isnan(tx) else tx)
        if math.isnan(t[c][0]):
            t[c] = (0.0, 0.0)
    w = {c: (base[c][0] / base["n"], arm[c][0] / arm["n"]) for c in CLASSES}
    t_base = sum(w[c][0] * t[c][0] for c in CLASSES)
    t_arm = sum(w[c][1] * t[c][1] for c in CLASSES)
    capacity = sum((w[c][1] - w[c][0]) * (t[c][0] + t[c][1]) / 2 for c in CLASSES)
    cost = {c: (w[c][0] + w[c][1]) / 2 * (t[c][1] - t[c][0]) for c in CLASSES}
    priced = base["hit"][0] > 0 and base["lost"][0] > 0 and base["lost"][1] > base["hit"][1]
    lost_needed = (base["lost"][0] + base["n"] * (t_arm / target - t_base) / (base["lost"][1] - base["hit"][1])
                   if priced else None)
    comp = {k: (arm[f"{k}_s"] - base[f"{k}_s"]) / t_base for k in ("queue", "prefill")}
    comp["other"] = (t_arm - t_base) / t_base - comp["queue"] - comp["prefill"]
    return {"ratio": t_arm / t_base, "t_base_s": t_base, "t_arm_s": t_arm,
            "capacity": capacity / t_base, **{f"cost_{c}": cost[c] / t_base for c in CLASSES},
            **{f"component_{k}": v for k, v in comp.items()},
            "lost_base": base["lost"][0], "lost_arm": arm["lost"][0],
            "later": base["n"] - base["first"][0],
            "capacity_only": 1 + capacity / t_base, "lost_needed": lost_needed}


def pairs(runs: Sequence[dict], *, arm: str, baseline: str) -> tuple[list[tuple[tuple, dict, dict]], list[str]]:
    """(condition, baseline run, arm run) per condition and trace draw, from :func:`benchmarks.serving_runs.collect`
    (role ``arm``), paired by :func:`benchmarks.serving_runs.runs_by_draw`, and the draws left out because
    one of the two runs was unstable (its open-loop queue grew: not averaged, as in ``serving_report``).
    Raises DascInputError when a draw has two runs of one arm, or when no stable pair is found."""
    out, unstable = [], []
    for cond in sorted({r["cond"] for r in runs}, key=str):
        by = runs_by_draw([r for r in runs if r["cond"] == cond and r["role"] == "arm" and r["arm"] in (arm, baseline)])
        for (a, d) in sorted(by):
            if a == arm and (baseline, d) in by:
                pair = (by[(baseline, d)], by[(arm, d)])
                if all(r["stable"] for r in pair):
                    out.append((cond, *pair))
                else:
                    unstable.append(d)
    if not out:
        have = sorted({r["arm"] for r in runs})
        if arm not in have:
            raise DascInputError(f"--arm {arm}: no run of that arm here (arms with runs here: "
                                 f"{', '.join(have) or 'none'})")
        why = f" ({len(unstable)} with an unstable run: {', '.join(unstable)})" if unstable else ""
        raise DascInputError(f"no trace seed has both a stable {baseline} run and a stable {arm} run{why} (arms with "
                             f"runs here: {', '.join(have) or 'none'})")
    return out, unstable


def condition_label(cond: tuple) -> str:
    """A condition key of :func:`benchmarks.serving_runs.collect` (protocol, replay, pad, clip, clients, rate,
    conversations per seed, shared prefix tokens) as the heading of its table, e.g. 'closed-loop-paper, recorded-reply, pad 6000, reply
    clip 256, 24 clients'."""
    protocol, replay, pad, clip, clients, rate, _, shared = cond
    return (f"{protocol}, {replay}, pad {pad}" + (f" (first {shared} shared)" if shared else "")
            + f", reply clip {clip}, " + (f"{clients} clients" if clients else f"rate {rate}/s"))


def _f(x, nd=3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _s(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:+.3f}"


def _row(label: str, a: dict, lost: str) -> str:
    return (f"| {label} | {_f(a['t_base_s'])} | {_f(a['t_arm_s'])} | {_f(a['ratio'])} | {_s(a['capacity'])} | "
            f"{_s(a['cost_first'])} | {_s(a['cost_hit'])} | {_s(a['cost_lost'])} | {lost} | {_f(a['capacity_only'])} | "
            f"{_f(a['lost_needed'], 1)} | {_s(a['component_queue'])} | {_s(a['component_prefill'])} | "
            f"{_s(a['component_other'])} |")


def table(rows: Sequence[tuple[str, dict]], *, arm: str, baseline: str, target: float) -> str:
    """Markdown: one row per seed (its trace draw), then the mean over seeds."""
    head = (f"| seed | T {baseline} s | T {arm} s | ratio | capacity | cost first | cost hit | cost lost | "
            f"lost {baseline} / {arm} (of later) | capacity only | {baseline} lost needed for {target:g}x | "
            "queue | prefill | other |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n")
    lines = [_row(draw, a, f"{a['lost_base']} / {a['lost_arm']} (of {a['later']})") for draw, a in rows]
    acc = [a for _, a in rows]
    mean = {k: statistics.fmean(a[k] for a in acc) for k in acc[0] if k != "lost_needed"}
    need = [a["lost_needed"] for a in acc if a["lost_needed"] is not None]
    mean["lost_needed"] = statistics.fmean(need) if need else None
    lines.append(_row(f"mean (n = {len(acc)})", mean, f"{_f(mean['lost_base'], 1)} / {_f(mean['lost_arm'], 1)}"))
    return head + "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = OneLineParser(
        prog="python -m benchmarks.ttft_account", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Split each trace seed's mean-TTFT ratio (arm / baseline) exactly into terms, as shares of the "
                    "baseline's mean TTFT.",
        epilog="Columns: capacity = the change in which later turns each arm kept (hit or lost); cost first / hit / "
               "lost = the change in what a\nrequest of that class cost (first: first-use slowness and noise, and with a shared "
               "system prompt whether\nits block was served; hit: serving a hit, e.g. a dasc restore); queue / prefill / other = the same "
               "difference split by SGLang's request metrics; capacity only = the ratio\nif the arm's per-request "
               "costs equalled the baseline's; lost needed = how many later turns the baseline would have to\nlose, "
               "at its own costs, for the pair to reach --target. The terms of each split add up to ratio - 1. "
               "Details: the module\ndocstring (benchmarks/ttft_account.py).")
    ap.add_argument("works", nargs="+", type=Path, help="run_chat work folders (unpacked)")
    ap.add_argument("--arm", required=True, help="the arm to account for, e.g. dasc-nr-w16")
    ap.add_argument("--baseline", default="dense", help="the arm it is compared with (default dense)")
    ap.add_argument("--target", type=open_fraction, default=0.70,
                    help="the ratio in (0, 1) the 'lost needed' column solves for (default 0.70: the open-loop target "
                         "of the serving benchmarks)")
    add_run_exclusions(ap)
    ap.add_argument("--out", type=path_named("a file name such as account.md"), default=None,
                    help="also write the table to this markdown file (an existing one only with --overwrite)")
    ap.add_argument("--overwrite", action="store_true", help="replace the file --out names")
    try:
        a = ap.parse_intermixed_args(argv)
        if not a.arm.strip() or not a.baseline.strip():
            raise DascInputError("--arm / --baseline: expected an arm name (e.g. dasc-nr-w16), got an empty one")
        if a.arm == a.baseline:
            raise DascInputError(f"--arm {a.arm} is also the baseline; give another arm, or another --baseline")
        if a.out is not None:
            check_out_file(a.out, a.overwrite)
        runs = collect(a.works, exclude_calls=a.exclude_call, exclude_runs=a.exclude_run,
                       baseline_run=a.baseline_run)
        stable_pairs, unstable = pairs(runs, arm=a.arm, baseline=a.baseline)
        by_cond: dict[tuple, list] = {}
        for cond, b, x in stable_pairs:        # one table (and one mean) per condition: never pooled across them
            by_cond.setdefault(cond, []).append(
                (b["draw"], account(class_means(b["records"]), class_means(x["records"]), target=a.target)))
        text = "\n".join((f"### {condition_label(c)}\n\n" if len(by_cond) > 1 else "")
                          + table(rows, arm=a.arm, baseline=a.baseline, target=a.target)
                          for c, rows in by_cond.items())
        if unstable:
            text += (f"\nLeft out, a run unstable (its queue grew; not averaged): {', '.join(unstable)}.\n")
        if a.out is not None:
            write_out_file(a.out, text)
    except DascInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    from dasc_compile.cli_exit import finish, run_guarded     # Ctrl-C, a closed pipe: one line, no traceback
    finish(run_guarded(main))
