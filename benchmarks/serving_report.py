"""Tables, ``summary.json`` and the regime map from ``benchmarks/run_chat.py`` runs (issue 24 item 7).

A **condition** is (protocol, replay, context pad and its shared prefix, reply clip, clients or rate); within it each
arm has one run per trace seed. A statistic is computed within one run (one seed) and then summarised
over seeds: mean, SD, range and P95 (linear interpolation between order statistics, as numpy's
default) of the per-seed values. Ratios to Dense (and to SGLang's INT8 arm) are paired by seed:
``ratio_s = stat(arm, s) / stat(dense, s)``, then summarised the same way. A call's drift is Dense's
mean TTFT on its closing run over its opening run of the same seed (``run_order.schedule``).

Per run: the statistics of :func:`benchmarks.serving_runs.run_stats` (that module's docstring). Per arm, beside them:
* ``capacity`` / ``capacity_under_load`` (per arm, from arms.json): cached-state slots with no request
  running / while R run (:mod:`benchmarks.serving_arms`; None where arms.json predates the key);
* ``server_account``: what the dasc arms' servers counted themselves (checkpoints stored, reused and
  evicted unused, by where they were stored; :mod:`benchmarks.ckpt_account`);
* ``hit_account`` (later turns summed over seeds, with the lost ones split by why) and
  ``away_median_s`` (``{"lost": s, "hit": s}``: the median over the pooled seeds of the time a lost /
  hit turn's conversation had been away; :mod:`benchmarks.turn_account`);

    python -m benchmarks.serving_report WORK [WORK ...] --out benchmarks/results/RUN --model "..." --decays paper-calibrated
        [--x-sat X]    # open-loop runs: Dense's saturation throughput (`rates`), so that rho = rate / X is reported
        [--gpu-name "NVIDIA H200"]   # folders whose servers.json records no card (before 2026-12-06)
    python -m benchmarks.serving_report map RUN1/summary.json RUN2/summary.json ... --out benchmarks/figures/regime-map.png
    python -m benchmarks.serving_report pooled RUN1/summary.json RUN2/summary.json ... --pad 6000   # seeds pooled over sessions
    python -m benchmarks.serving_report rates WORK --rho 0.5 0.7 0.9      # protocol B's offered loads
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Iterable, Sequence

from benchmarks import ckpt_account
from benchmarks.card import add_gpu_name_option, one_card
from benchmarks.cli_args import (OneLineParser, check_out_file, int_at_least, nonempty, number_above_zero,
                                 open_fraction, path_named, refuse_to_replace, write_out_file)
from benchmarks.serving_pool import pooled_table, spread
from benchmarks.run_exclusions import add_run_exclusions
from benchmarks.serving_runs import collect, runs_by_draw
from benchmarks.serving_tables import first_timed_note, load_summaries, markdown, regime_map
from dasc_compile.errors import DascInputError

#: ``--decays``: where a run's plans took their decay values from; a fixed list, so that a typo cannot start a
#: series of its own in the pooled tables and the regime map.
DECAYS = ("paper-calibrated", "init", "trained")

SUMMARY_KEYS = ("arm", "model", "w_max", "decays", "regime", "rate", "decode_clip", "seeds", "mean_ttft_s",
                "mean_ttft_ratio_vs_dense", "mean_ttft_ratio_vs_int8", "mean_e2e_ratio_vs_dense", "p95_ttft_s",
                "hit_rate", "capacity", "capacity_under_load",
                "protocol", "rho", "seed_kind", "clients", "max_running", "reply_clip", "inflight_mean", "stable",
                "replay", "reuse_bound", "ttft_hit_s", "ttft_miss_s", "prefill_tokens_saved")


def _median(xs: Sequence[float]):
    """The median of ``xs``, ``None`` when empty."""
    return statistics.median(xs) if xs else None


def _w_max(arm: str):
    m = re.match(r"dasc-(?:nr|wr)-w(\d+)", arm)
    return int(m.group(1)) if m else None


def _capacity(launch: dict | None):
    if not launch:
        return None
    return launch["ckpt_slots"] if launch["kind"] == "int8" else launch["capacity"]


def _capacity_under_load(launch: dict | None):
    """Slots an arm keeps cached while R requests run (``serving_arms`` module docstring). An arms.json
    written before the key gets it from the recorded slots and flags, by the same rule
    (``dasc_runtime.sizing.capacity_under_load``); None without a launch record."""
    if not launch:
        return None
    if launch.get("capacity_under_load") is not None:
        return launch["capacity_under_load"]
    if not all(k in launch for k in ("native_slots", "ckpt_slots", "flags")):
        return None
    from dasc_runtime.sizing import capacity_under_load, slots_per_running_request

    flags = launch["flags"]

    def flag(name, default):
        return flags[flags.index(name) + 1] if name in flags else default

    k = slots_per_running_request(flag("--mamba-radix-cache-strategy", "extra_buffer"),
                                  overlap_schedule="--disable-overlap-schedule" not in flags)
    return capacity_under_load(native_slots=launch["native_slots"], pool_slots=launch["ckpt_slots"],
                               running_reserve=k * int(flag("--max-running-requests", 8)))


def summarize(runs: Sequence[dict], *, model: str, decays: str, rho_of_rate: dict | None = None,
              baseline_run: str = "opening") -> list[dict]:
    """One object per (condition, arm): the issue's keys plus spreads (``*_spread``), the hit
    account and the drift of each call. Ratios are paired by seed within the condition. An open-loop run whose
    queue grew (``stable`` False, :func:`benchmarks.serving_runs.stability`) is listed in ``unstable_seeds`` and
    left out of the means, spreads and ratios (its mean TTFT grows with the run's length); the in-flight
    figures count every run.
    baseline_run: which run of the baseline arm ``runs`` counts per seed (:func:`collect`), kept as the
    objects' ``baseline_run``."""
    objs = []
    for cond in sorted({r["cond"] for r in runs}, key=str):
        rs_ = [r for r in runs if r["cond"] == cond and r["role"] == "arm"]
        by = runs_by_draw(rs_)
        drift: dict[str, list[float]] = {}        # the call's baseline arm (run_chat --baseline): closing / opening run
        for r in runs:
            if r["cond"] == cond and r["role"] == "drift":
                first = [x for x in rs_ if x["call"] == r["call"] and x["arm"] == r["arm"] and x["draw"] == r["draw"]]
                if first:
                    drift.setdefault(r["arm"], []).append(r["mean_ttft_s"] / first[0]["mean_ttft_s"])
        protocol, replay, pad, clip, clients, rate, per_seed, shared = cond
        for arm in sorted({r["arm"] for r in rs_}, key=lambda a: (a != "dense", a != "int8", a)):
            mine = sorted((r for r in rs_ if r["arm"] == arm), key=lambda r: (r["trace"], r["seed"]))
            one_trace = len({r["trace"] for r in mine}) == 1

            # an open-loop run whose queue grew is reported (unstable_seeds, the in-flight line), not averaged:
            # its mean TTFT depends on how long the run lasted (issue 24 item 2)
            steady = [r for r in mine if r["stable"]]

            def ratios_by_seed(base: str, key: str) -> dict:
                """{"<trace>/<seed>": this arm's ``key`` over ``base``'s in the same draw, both runs stable};
                summaries keep the mean-TTFT ones so that the regime map can pool sessions."""
                return {r["draw"]: r[key] / by[(base, r["draw"])][key] for r in steady
                        if (base, r["draw"]) in by and by[(base, r["draw"])]["stable"]}

            def ratios(base: str, key: str) -> list[float]:
                return list(ratios_by_seed(base, key).values())

            def by_seed(base: str) -> dict | None:
                return None if arm == base else ratios_by_seed(base, "mean_ttft_s")

            def s(key: str) -> dict:
                return spread([r[key] for r in steady])

            rt_d, rt_i, re_d = ratios("dense", "mean_ttft_s"), ratios("int8", "mean_ttft_s"), ratios("dense", "mean_e2e_s")
            re_i = ratios("int8", "mean_e2e_s")
            o = {"arm": arm, "model": model, "w_max": _w_max(arm), "decays": decays,
                 "regime": f"pad{pad}" + (f"-shared{shared}" if shared else ""), "rate": rate, "decode_clip": clip, "seeds": [r["seed"] if one_trace else r["draw"] for r in mine],
                 "traces": sorted({r["trace"] for r in mine}),
                 "mean_ttft_s": s("mean_ttft_s")["mean"],
                 "mean_ttft_ratio_vs_dense": spread(rt_d)["mean"] if arm != "dense" else None,
                 "mean_ttft_ratio_vs_int8": spread(rt_i)["mean"] if arm != "int8" else None,
                 "mean_e2e_ratio_vs_dense": spread(re_d)["mean"] if arm != "dense" else None,
                 "mean_e2e_ratio_vs_int8": spread(re_i)["mean"] if arm != "int8" and re_i else None,
                 "p95_ttft_s": s("p95_ttft_s")["mean"], "hit_rate": s("hit_rate")["mean"],
                 "capacity": _capacity(mine[0]["launch"]),
                 "capacity_under_load": _capacity_under_load(mine[0]["launch"]),
                 "protocol": protocol, "rho": (rho_of_rate or {}).get(rate), "seed_kind": "trace",
                 "clients": clients, "max_running": mine[0]["max_running"], "reply_clip": clip,
                 "inflight_mean": spread([r["inflight_mean"] for r in mine])["mean"],
                 "stable": all(r["stable"] for r in mine),
                 "unstable_seeds": [r["draw"] for r in mine if not r["stable"]],
                 "inflight_arrivals_mean": spread([r["inflight_arrivals_mean"] for r in mine])["mean"],
                 "inflight_max": max(r["inflight_max"] for r in mine),
                 "live_conversations_mean": spread([r.get("live_conversations_mean") for r in mine])["mean"],
                 "live_conversations_max": max((r.get("live_conversations_max") or 0 for r in mine), default=0),
                 "replay": replay, "reuse_bound": s("reuse_bound")["mean"], "ttft_hit_s": s("ttft_hit_s")["mean"],
                 "ttft_miss_s": s("ttft_miss_s")["mean"], "prefill_tokens_saved": s("prefill_tokens_saved")["mean"],
                 # beyond the keys: spreads over seeds, the hit account, what each run was
                 "pad_tokens": pad, "shared_prefix_tokens": shared, "conversations_per_seed": per_seed,
                 "initial_prompt_mean": s("initial_prompt_mean")["mean"],
                 "context_max": max(r["context_max"] for r in mine),
                 "ttft_ratio_vs_dense_spread": spread(rt_d) if arm != "dense" else None,
                 "ttft_ratio_vs_int8_spread": spread(rt_i) if arm != "int8" and rt_i else None,
                 "e2e_ratio_vs_dense_spread": spread(re_d) if arm != "dense" else None,
                 "e2e_ratio_vs_int8_spread": spread(re_i) if arm != "int8" and re_i else None,
                 "ttft_ratio_vs_dense_by_seed": by_seed("dense"), "ttft_ratio_vs_int8_by_seed": by_seed("int8"),
                 "mean_ttft_spread": s("mean_ttft_s"), "mean_e2e_spread": s("mean_e2e_s"),
                 "hit_account": {k: sum(r[k] for r in mine) for k in ("later_turns", "reply_end", "prompt_end", "lost",
                                                                         "lost_reply_stored", "lost_prompt_only",
                                                                         "first_shared_hits", "first_turns_mid",
                                                                         "first_shared_whole", "first_shared_whole_mid",
                                                                         "first_shared_hits_mid", "lost_shared_hit")},
                 "away_median_s": {k: _median([g for r in mine for g in r[f"away_{k}_s"]])
                                        for k in ("lost", "hit")},
                 "server_account": ckpt_account.aggregate((r.get("account") for r in mine),
                                                           without=sum(bool(r.get("account_missing")) for r in mine)),
                 "queue_s": s("queue_s")["mean"], "prefill_s": s("prefill_s")["mean"],
                 "failed": sum(r["failed"] for r in mine), "dense_drift": spread(drift.get("dense", [])) if arm == "dense" else None,
                 "drift": spread(drift[arm]) if arm in drift else None, "baseline_run": baseline_run}
            objs.append(o)
    return objs


def open_loop_rates(runs: Sequence[dict], rhos: Sequence[float], *, baseline: str = "dense") -> dict:
    """Protocol B's offered loads from Dense's *measured* saturation throughput (issue 24 item 2).

    A closed-loop run whose clients outnumber the running slots keeps the server busy, so its
    completed conversations per second, ``conversations_per_seed / wall_s``, is the throughput at
    saturation ``X_sat`` (conversations/s). Protocol B offers ``rate = rho * X_sat`` conversation
    starts per s; the work a conversation brings is the same with or without think time.

    Args:
        runs: :func:`collect` output of closed-loop runs at the trace and clip protocol B will use.
        rhos: target utilisations, each in (0, 1).
    Returns:
        ``{"x_sat": spread over the baseline's seeds, "saturated": bool (mean in-flight >= running
        slots in every run), "rates": {rho: rate}}``.
    Raises:
        DascInputError: no closed-loop baseline run, a rho outside (0, 1), or baseline runs of more than one
            condition (replay, pad, clip, clients, conversations per seed, shared prefix): one throughput per
            condition, never pooled across them; the message lists them so that ``--pad`` / ``--replay`` can pick
            one (runs that differ only in their shared prefix: give the folders of one).
    """
    if any(not 0 < r < 1 for r in rhos):
        raise DascInputError(f"--rho: expected utilisations in (0, 1), got {list(rhos)}")
    base = [r for r in runs if r["arm"] == baseline and r["role"] == "arm" and r["cond"][0] == "closed-loop-paper"]
    if not base:
        raise DascInputError(f"no closed-loop run of {baseline!r} to measure its saturation throughput from")
    conds = sorted({r["cond"] for r in base}, key=str)
    if len(conds) > 1:
        raise DascInputError(f"{baseline} ran closed loop under {len(conds)} conditions ("
                             + "; ".join(f"{c[1]}, pad {c[2]}" + (f" (first {c[7]} shared)" if c[7] else "")
                                         + f", clip {c[3]}, {c[4]} clients" for c in conds)
                             + "): give --pad and/or --replay to pick one")
    runs_by_draw(base)      # refuses a seed counted twice (a folder given twice, or a seed re-run)
    x = spread([r["cond"][6] / r["wall_s"] for r in base])
    return {"x_sat": x, "saturated": all(r["inflight_mean"] >= r["max_running"] for r in base),
            "rates": {rho: rho * x["mean"] for rho in rhos}}


def write_pair(out: Path, files: dict) -> None:
    """Write ``files`` (``{name: text}``) into folder ``out`` all or none: each to a hidden temporary file first,
    then renamed into place, so a failure leaves the folder's earlier files as they were.

    Raises:
        DascInputError: naming the file that could not be written and why.
    """
    tmps = []
    try:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DascInputError(f"--out {out}: cannot write {' and '.join(files)} there, the folder cannot be made "
                                 f"({e.strerror or type(e).__name__})") from None
        for name, text in files.items():
            dest = out / name
            if dest.is_dir():
                raise DascInputError(f"--out {out}: {name} there is a folder; expected a file name free for it")
            tmp = out / f".{name}.tmp"
            try:
                tmp.write_text(text)
            except OSError as e:
                raise DascInputError(f"--out {out}: cannot write {name} there "
                                     f"({e.strerror or type(e).__name__})") from None
            tmps.append((tmp, dest))
        for tmp, dest in tmps:
            tmp.replace(dest)
        tmps = []
    finally:
        for tmp, _ in tmps:
            tmp.unlink(missing_ok=True)


SUBCOMMANDS = ("rates", "map", "pooled")


def main(argv: Iterable[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        first = argv[0] if argv else ""
        if first and first not in SUBCOMMANDS and not first.startswith("-") and "/" not in first \
                and not Path(first).exists():      # `pool`, `mpa`: not a folder, and no subcommand either
            raise DascInputError(f"{first}: no such work folder, and not a subcommand ({', '.join(SUBCOMMANDS)})")
        if argv[:1] == ["rates"]:
            ap = OneLineParser(prog="python -m benchmarks.serving_report rates",
                               description="protocol B's offered rates from Dense's measured closed-loop "
                                           "saturation throughput")
            ap.add_argument("works", nargs="+", type=Path, help="run_chat work folders with closed-loop Dense runs")
            ap.add_argument("--rho", type=open_fraction, nargs="+", default=[0.5, 0.7, 0.9],
                            help="utilisations in (0, 1) (default 0.5 0.7 0.9); it takes every number after it, "
                                 "so put work folders before it or end it with --")
            ap.add_argument("--exclude-call", type=int_at_least(0), action="append", default=[],
                            help="leave out this call's runs (index in manifest.json 'calls'; repeatable)")
            ap.add_argument("--pad", type=int_at_least(0), default=None,
                            help="keep the runs of one context pad (tokens), e.g. 6000")
            ap.add_argument("--replay", choices=("served-reply", "recorded-reply"), default=None,
                            help="keep the runs of one replay condition")
            add_gpu_name_option(ap)
            a = ap.parse_intermixed_args(argv[1:])
            if any(not 0 < r < 1 for r in a.rho):
                raise DascInputError(f"--rho: expected utilisations in (0, 1), got {a.rho}")
            runs = collect(a.works, exclude_calls=a.exclude_call)    # its errors name their folder already
            kept = [r for r in runs if (a.pad is None or r["cond"][2] == a.pad)
                    and (a.replay is None or r["cond"][1] == a.replay)]
            if runs and not kept:
                raise DascInputError(f"no run at --pad {a.pad} / --replay {a.replay} (present: "
                                     + "; ".join(sorted({f"pad {r['cond'][2]}, {r['cond'][1]}" for r in runs}))
                                     + ")")
            runs = kept
            try:
                card = one_card(runs, a.gpu_name)       # X_sat is one card's: never averaged over two
                rates = {**open_loop_rates(runs, a.rho), "gpu": card}
            except DascInputError as e:
                raise DascInputError(f"{', '.join(map(str, a.works))}: {e}") from None
            print(json.dumps(rates, indent=1))
            return 0
        if argv[:1] == ["map"]:
            ap = OneLineParser(prog="python -m benchmarks.serving_report map",
                               description="the regime map: mean-TTFT ratio to Dense over context and load")
            ap.add_argument("summaries", nargs="+", type=path_named("a summary.json file"),
                            help="summary.json files of serving_report")
            ap.add_argument("--out", type=path_named("a file name such as map.png"), required=True,
                            help="the figure to write (.png); an existing one only with --overwrite")
            ap.add_argument("--overwrite", action="store_true", help="replace the figure --out names")
            a = ap.parse_intermixed_args(argv[1:])
            refuse_to_replace(a.out, [a.out], a.overwrite)
            regime_map(a.summaries, a.out)
            print(f"wrote {a.out}")
            return 0
        if argv[:1] == ["pooled"]:
            ap = OneLineParser(prog="python -m benchmarks.serving_report pooled",
                               description="per-seed TTFT ratios to Dense and INT8 pooled over sessions "
                                           "(a seed measured twice counts once)")
            ap.add_argument("summaries", nargs="+", type=path_named("a summary.json file"),
                            help="summary.json files of serving_report")
            ap.add_argument("--pad", type=int_at_least(0), default=None,
                            help="keep one context pad (tokens), e.g. 6000")
            ap.add_argument("--out", type=path_named("a file name such as pooled.md"), default=None,
                            help="also write the table to this markdown file (an existing one only with --overwrite)")
            ap.add_argument("--overwrite", action="store_true", help="replace the file --out names")
            a = ap.parse_intermixed_args(argv[1:])
            if a.out is not None:
                check_out_file(a.out, a.overwrite)
            docs = load_summaries(a.summaries)
            try:
                table = pooled_table(docs, pad=a.pad)
            except DascInputError as e:
                raise DascInputError(f"{', '.join(map(str, a.summaries))}: {e}") from None
            if a.out is not None:
                write_out_file(a.out, table + "\n")
            print(table)
            return 0
        ap = OneLineParser(
            prog="python -m benchmarks.serving_report",
            description="summary.json and tables.md from benchmarks/run_chat.py work folders (issue 24 item 7)",
            epilog="Also: `serving_report rates WORK ...` (protocol B's offered rates from Dense's closed-loop "
                   "saturation throughput), `serving_report map SUMMARY.json ... --out PNG` (the regime map) and "
                   "`serving_report pooled SUMMARY.json ... [--pad N]` (per-seed ratios pooled over sessions).")
        ap.add_argument("works", nargs="+", type=Path, help="run_chat work folders (unpacked)")
        ap.add_argument("--out", type=path_named("a folder name"), required=True,
                        help="folder for summary.json and tables.md (a folder holding either only with --overwrite)")
        ap.add_argument("--overwrite", action="store_true",
                        help="replace the summary.json and tables.md already in --out (e.g. a committed run's)")
        ap.add_argument("--model", required=True, type=nonempty("the served model's name"),
                        help="the served model as the tables and summary.json name it, e.g. 'Kimi-Linear-48B-A3B "
                             "(16 of 256 experts, dummy weights)'")
        ap.add_argument("--decays", required=True, choices=DECAYS,
                        help="where the plans' decays came from (summary.json 'decays'): paper-calibrated (synthetic, "
                             "calibrated to published statistics: plans/reference/*-calibrated), init (an "
                             "initialisation draw), trained (read from trained weights)")
        add_run_exclusions(ap)
        add_gpu_name_option(ap)
        ap.add_argument("--x-sat", type=number_above_zero("conversations/s"), default=None,
                        help="Dense's saturation throughput, conversations/s (`serving_report rates`): open-loop runs "
                             "are reported at rho = rate / x_sat; required when the folders hold open-loop runs")
        a = ap.parse_intermixed_args(argv)
        if a.out.exists() and not a.out.is_dir():
            raise DascInputError(f"--out {a.out}: exists and is not a folder; give the folder for summary.json and "
                                 f"tables.md")
        refuse_to_replace(a.out, [a.out / "summary.json", a.out / "tables.md"], a.overwrite)
        runs = collect(a.works, exclude_calls=a.exclude_call, exclude_runs=a.exclude_run,
                       baseline_run=a.baseline_run)
        if not runs:
            raise DascInputError("no successful run in " + ", ".join(map(str, a.works)))
        gpu = one_card(runs, a.gpu_name)
        rates = sorted({r["cond"][5] for r in runs if r["cond"][5] is not None})
        if a.x_sat is not None and not rates:
            raise DascInputError("--x-sat: these folders hold no open-loop run (it sets open-loop runs' rho); "
                                 "leave it out")
        if rates and a.x_sat is None:
            raise DascInputError(f"open-loop runs at rate(s) {', '.join(map(str, rates))} /s: give --x-sat (Dense's "
                                 f"saturation throughput from `serving_report rates`) so that they are reported at "
                                 f"rho = rate / x_sat")
        objs = summarize(runs, model=a.model, decays=a.decays,
                         rho_of_rate={r: round(r / a.x_sat, 3) for r in rates} if rates else None,
                         baseline_run=a.baseline_run)
        for o in objs:
            o["gpu"] = gpu
        text = markdown(objs) + first_timed_note(runs)
        write_pair(a.out, {"summary.json": json.dumps(objs, indent=1), "tables.md": text})
        print(text)
        return 0
    except DascInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from dasc_compile.cli_exit import finish, run_guarded     # Ctrl-C, a closed pipe: one line, no traceback
    finish(run_guarded(main))
