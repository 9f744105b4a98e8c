"""What ``dasc sweep`` prints: one table per TP degree (a row per w_max and INT8 setting), the recommended
operating point with its exact ``dasc compile`` command and SGLang flags, the JSON document and the plot.

JSON (``--json``; ``sweep_format`` 1: adding a key keeps it, removing or changing one bumps it):
``model`` (path, model_type, family, decay_sha256, provenance kind and line), ``policy`` (the fields every
point shares), ``grid`` (w_max, tp, int8 lists), ``sizing`` (budget_bytes, max_running_requests, strategy,
overlap_schedule, refresh_slots; null without ``--budget``), ``baselines`` (per TP: the Dense and SGLang
INT8 arms of ``dasc size``), ``rows`` (per plan: w_max, tp_size, balance, int8, name, n_units, n_kept,
kept_fraction, c_temp_ragged, c_temp_padded, layout_gain, c_ckpt (Eq. 6, the TP bottleneck rank's),
bytes_compressed_per_slot, bytes_dense_per_slot, w_replay_cap (tokens, Eq. 7), warnings, ``arm`` (the
dasc arm of ``dasc size`` or null) and ``quality`` (``dasc eval``'s arms for the plan or null)),
``eval`` (protocol of the ``dasc eval`` run or null), ``quality_budget`` and ``recommendation``
(``w_max`` and one ``{tp_size, int8, compile, sglang}`` command pair per TP x INT8 point, or null), ``notes``
and ``wall_s``. Infinite ratios are the string ``"Infinity"``.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from rich.console import Console
from rich.table import Table

from dasc_compile.console import counted
from dasc_compile.inspect import _json_safe
from dasc_compile.plan_views import fmt_quality, fmt_ratio
from dasc_compile.provenance import figure_label, figure_line, provenance_kind, short_line
from dasc_compile.sweep import SweepResult, SweepRow

__all__ = ["SWEEP_FORMAT", "commands_for", "render", "sweep_json", "plot_sweep"]

SWEEP_FORMAT = 1
_METRIC_NAME = {"kl": "KL(dense||arm)", "nll_delta": "NLL - dense"}


def _times(n: int, dense: int) -> str:
    """``"2.56x"`` of Dense's figure; none when Dense keeps no cached state under load."""
    return f"{n / dense:.2f}x" if dense else "Dense 0"


def _q(row: SweepRow, arm: str, metric: str) -> str:
    if row.quality is None or arm not in row.quality:
        return "-"
    return fmt_quality(row.quality[arm][metric])


def commands_for(result: SweepResult, row: SweepRow, user_flags: list[str], plan_dir: Optional[Path]) -> dict:
    """The ``dasc compile`` command that writes ``row``'s plan and the SGLang launch flags that serve it.

    ``user_flags``: the compile flags the user gave the sweep (``--policy FILE``, ``--a-s``, ...), kept as
    given; the point's ``--wmax``, ``--tp``, ``--balance`` and INT8 setting are added. The SGLang flags
    are the dasc arm's from ``dasc size`` with a budget, else ``--dasc-plan`` and what the runtime needs.
    """
    from dasc_runtime.size_options import settle_size_options

    pol = row.plan.policy
    path = str(plan_dir / row.name) if plan_dir is not None else row.name
    compile_args = ["dasc", "compile", str(result.model), *user_flags, "--wmax", str(pol.w_max)]
    if pol.tp_size > 1 or result.grid.base.tp_size != 1:
        compile_args += ["--tp", str(pol.tp_size)]
    if pol.balance != "off" and "--balance" not in user_flags:
        compile_args += ["--balance", pol.balance]
    if bool(pol.int8) != bool(result.grid.base.int8) or pol.int8:
        compile_args.append("--int8" if pol.int8 else "--no-int8")
    compile_args += ["--out", path]
    model_dir = result.model if result.model.is_dir() else result.model.parent
    sglang = ["python", "-m", "sglang.launch_server", "--model-path", str(model_dir)]
    if row.arm is not None:
        sglang += list(row.arm.flags)
    else:
        s = result.sizing
        settled = settle_size_options(row.plan, strategy="extra_buffer", overlap_schedule=True,
                                      refresh_slots=None if s is None else s.refresh_slots)
        sglang += (["--disable-overlap-schedule"] if not settled.overlap_schedule else []) + \
            list(settled.extra_flags) + ["--dasc-plan", path]
    return {"tp_size": pol.tp_size, "int8": bool(pol.int8), "compile": shlex.join(compile_args),
            "sglang": shlex.join(sglang)}


def _recommended_rows(result: SweepResult) -> list[SweepRow]:
    return [r for r in result.rows if r.plan.policy.w_max == result.recommended]


def render(result: SweepResult, con: Console, *, user_flags: list[str], plan_dir: Optional[Path]) -> None:
    """Print the sweep: header, one table per TP degree, notes, the recommendation (module docstring)."""
    src, first = result.source, result.rows[0].plan
    con.print(f"dasc sweep {result.model}: {src.spec.model_type}, {len(src.spec.recurrent_layer_ids)} "
              f"{src.spec.family} layers, {first.totals.n_units:,} units; {short_line(src.provenance)}", markup=False)
    s, ev = result.sizing, result.eval_doc
    arm = result.grid.base.load_policy
    both = len(result.grid.int8) > 1
    for tp in result.grid.tp:
        rows = [r for r in result.rows if r.plan.policy.tp_size == tp]
        title = f"TP {tp}" + (f", balance {rows[0].plan.policy.balance}" if tp > 1 else "")
        if s is not None:
            dense, int8 = result.baselines[tp]
            used = (f" (Dense's {dense.native_slots:,} + 1 slots use {dense.budget_bytes:,} B)"
                    if dense.budget_bytes != s.budget_bytes else "")
            title += (f"; budget {s.budget_bytes:,} B per rank{used}, R = {s.max_running_requests}: Dense capacity "
                      f"{dense.capacity:,} ({dense.capacity_under_load:,} under load), SGLang INT8 {int8.capacity:,} "
                      f"({int8.capacity_under_load:,} under load)")
        t = Table(title=title, title_justify="left")
        cols = ["w_max"] + (["int8"] if both else []) + ["kept units", "kept %", "C_temp", "C_temp padded",
                                                         "layout gain", "C_ckpt"]
        if s is not None:
            cols += ["dasc pool slots", "capacity (x Dense)", "under load (x Dense)"]
        if ev is not None:
            cols += [f"dasc-{arm} NLL-dense", f"dasc-{arm} KL", "Random KL (mean ± SD)"]
        for c in cols:
            t.add_column(c, justify="right")
        for r in rows:
            p, tot = r.plan, r.plan.totals
            mark = " *" if result.recommended == p.policy.w_max else ""
            cells = [f"{p.policy.w_max}{mark}"] + (["on" if p.policy.int8 else "off"] if both else []) + [
                f"{tot.n_kept:,}/{tot.n_units:,}", f"{100 * tot.n_kept / tot.n_units:.1f}",
                fmt_ratio(tot.c_temp_ragged), fmt_ratio(tot.c_temp_padded), fmt_ratio(tot.layout_gain),
                fmt_ratio(p.tp.c_ckpt_tp)]
            if s is not None:
                d, i8 = result.baselines[tp]
                below = " < INT8" if r.arm.capacity_under_load < i8.capacity_under_load else ""
                cells += [f"{r.arm.ckpt_slots:,}", f"{r.arm.capacity:,} ({r.arm.capacity / d.capacity:.2f}x)",
                          f"{r.arm.capacity_under_load:,} ({_times(r.arm.capacity_under_load, d.capacity_under_load)})"
                          f"{below}"]
            if ev is not None:
                cells += [_q(r, arm, "nll_delta"), _q(r, arm, "kl"), _q(r, "random", "kl")]
            t.add_row(*cells)
        con.print(t)
    if s is not None:
        con.print("capacity = cached states an arm holds at equal state memory with no request running, as `dasc "
                  "size` counts them (dasc: native + compressed slots); under load = while R requests run, when the "
                  "M' = k*R native slots are theirs: the compressed pool alone, what serving sees; '< INT8': fewer "
                  "than SGLang's INT8 pool keeps at the same budget, so that arm should not beat it on hits", markup=False)
    if ev is not None:
        pr = ev["protocol"]
        con.print(f"quality: dasc eval on {counted(pr['n_prompts'], 'prompt')} ({pr['prompt_source']}), prefix {pr['prefix_len']} "
                  f"tokens, nats per token; Random = count-matched random masks, {len(pr['random_seeds'])} seeds; "
                  f"the same for every TP and INT8 setting of a w_max (dasc eval does not model INT8 storage)",
                  markup=False)
    qb = result.quality_budget
    if qb is None:
        return
    flag = {"kl": "--max-kl", "nll_delta": "--max-nll-delta"}[qb["metric"]]
    if result.recommended is None:
        w0 = min(r.plan.policy.w_max for r in result.rows)
        v = (result.rows[0].quality or {}).get(qb["arm"], {}).get(qb["metric"])
        shown = _q(result.rows[0], qb["arm"], qb["metric"]) if v is None else f"{v:.3g}"   # 0.0000 read as passing
        con.print(f"no swept w_max meets {flag} {qb['max']}: the smallest, {w0}, gives dasc-{qb['arm']} "
                  f"{_METRIC_NAME[qb['metric']]} {shown}", markup=False)
        return
    con.print(f"* recommended: w_max {result.recommended}, the largest swept w_max whose dasc-{qb['arm']} "
              f"{_METRIC_NAME[qb['metric']]} is <= {qb['max']} with every smaller one's too", markup=False)
    for row in _recommended_rows(result):
        c = commands_for(result, row, user_flags, plan_dir)
        con.print(f"  TP {c['tp_size']}{', int8' if c['int8'] else ''}:", markup=False)
        int8 = result.baselines[row.plan.policy.tp_size][1] if result.sizing is not None else None
        if int8 is not None and row.arm.capacity_under_load < int8.capacity_under_load:
            con.print(f"    note: under load this arm keeps {row.arm.capacity_under_load:,} cached states, fewer than "
                      f"SGLang INT8's {int8.capacity_under_load:,} at the same budget", markup=False)
        con.print(f"    {c['compile']}", markup=False)
        con.print(f"    {c['sglang']}", markup=False)


def sweep_json(result: SweepResult, *, user_flags: list[str], plan_dir: Optional[Path]) -> dict:
    """The ``--json`` document (module docstring)."""
    src = result.source
    rows = []
    for r in result.rows:
        p, tot = r.plan, r.plan.totals
        rows.append({"w_max": p.policy.w_max, "tp_size": p.policy.tp_size, "balance": p.policy.balance,
                     "int8": bool(p.policy.int8), "name": r.name, "n_units": tot.n_units, "n_kept": tot.n_kept,
                     "kept_fraction": tot.n_kept / tot.n_units, "c_temp_ragged": tot.c_temp_ragged,
                     "c_temp_padded": tot.c_temp_padded, "layout_gain": tot.layout_gain, "c_ckpt": p.tp.c_ckpt_tp,
                     "bytes_compressed_per_slot": p.tp.bottleneck_bytes_per_slot,
                     "bytes_dense_per_slot": p.tp.bytes_dense_per_slot, "w_replay_cap": p.refresh.w_replay_cap,
                     "warnings": r.warnings, "arm": asdict(r.arm) if r.arm is not None else None,
                     "quality": r.quality})
    rec = None
    if result.recommended is not None:
        rec = {"w_max": result.recommended,
               "commands": [commands_for(result, r, user_flags, plan_dir) for r in _recommended_rows(result)]}
    ev = result.eval_doc
    return _json_safe({
        "sweep_format": SWEEP_FORMAT,
        "model": {"path": str(result.model), "model_type": src.spec.model_type, "family": src.spec.family,
                  "decay_sha256": src.fingerprint.decay_sha256,
                  "provenance": {"kind": provenance_kind(src.provenance), "line": short_line(src.provenance)}},
        "policy": result.grid.base.model_dump(exclude={"w_max", "tp_size", "int8"}),
        "grid": {"w_max": list(result.grid.w_max), "tp": list(result.grid.tp), "int8": list(result.grid.int8)},
        "sizing": asdict(result.sizing) if result.sizing is not None else None,
        "baselines": {str(tp): {"dense": asdict(d), "int8": asdict(i)} for tp, (d, i) in result.baselines.items()},
        "rows": rows,
        "eval": None if ev is None else {"protocol": ev["protocol"], "dasc_eval_version": ev["dasc_eval_version"]},
        "quality_budget": result.quality_budget,
        "recommendation": rec,
        "notes": result.notes,
        "wall_s": round(result.wall_s, 3),
    })


def plot_sweep(result: SweepResult, out: Path) -> None:
    """Write a PNG: C_ckpt (and, with a budget, capacity over Dense's with no request running and, dashed, under
    load) against w_max per TP and INT8 setting, and with ``--eval`` the quality of the plans' arm beside the
    Random band (mean +- SD), with the recommended w_max marked and the one-line provenance under the panels.

    Raises:
        DascInputError: ``out`` does not end in ``.png`` or cannot be written.
    """
    from dasc_compile.figures import check_png, pyplot, save_png, sd_band

    out = check_png(out)
    plt = pyplot()

    panels = 1 + (result.sizing is not None) + (result.eval_doc is not None)
    fig, axes = plt.subplots(1, panels, figsize=(4.6 * panels, 3.6), squeeze=False)
    axes = list(axes[0])
    series = sorted({(r.plan.policy.tp_size, bool(r.plan.policy.int8)) for r in result.rows})
    for tp, i8 in series:
        rows = [r for r in result.rows if (r.plan.policy.tp_size, bool(r.plan.policy.int8)) == (tp, i8)]
        xs = [r.plan.policy.w_max for r in rows]
        label = f"TP {tp}" + (" int8" if i8 else "")
        axes[0].plot(xs, [r.plan.tp.c_ckpt_tp for r in rows], "o-", label=label)
        if result.sizing is not None:
            d = result.baselines[tp][0]
            line, = axes[1].plot(xs, [r.arm.capacity / d.capacity for r in rows], "o-", label=label)
            if d.capacity_under_load:
                axes[1].plot(xs, [r.arm.capacity_under_load / d.capacity_under_load for r in rows], "s--",
                             color=line.get_color(), label=f"{label} under load")
    axes[0].set_ylabel("C_ckpt (bottleneck rank)")
    if result.sizing is not None:
        axes[1].set_ylabel("cached states / Dense's")
        axes[1].axhline(1.0, color="black", ls=":", lw=1)
        for tp in sorted({t for t, _ in series}):      # SGLang INT8 under load: the bar a dasc arm must clear
            d, i8 = result.baselines[tp]
            if d.capacity_under_load:
                axes[1].axhline(i8.capacity_under_load / d.capacity_under_load, color="gray", ls="-.", lw=1,
                                label=f"SGLang INT8 under load, TP {tp}")
    if result.eval_doc is not None:
        ax, arm = axes[-1], result.grid.base.load_policy
        qb = result.quality_budget
        metric = qb["metric"] if qb is not None else "kl"
        rows = sorted({r.plan.policy.w_max: r for r in result.rows}.items())
        xs = [w for w, _ in rows]
        ax.plot(xs, [r.quality[arm][metric] for _, r in rows], "o-", label=f"dasc-{arm}")
        m = [r.quality["random"][metric]["mean"] for _, r in rows]
        sd = [r.quality["random"][metric]["sd"] for _, r in rows]
        ax.fill_between(xs, *sd_band(metric, m, sd), color="gray", alpha=0.3, label="Random ±SD")
        if qb is not None:
            ax.axhline(qb["max"], color="crimson", ls=":", lw=1, label=f"budget {qb['max']}")
        ax.set_ylabel(f"{_METRIC_NAME[metric]}, nats/token")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("w_max (tokens)")
        ax.grid(alpha=0.3)
        if result.recommended is not None:
            ax.axvline(result.recommended, color="green", ls="--", lw=1)
        ax.legend(fontsize=7)
    fig.suptitle(f"dasc sweep: {result.source.spec.model_type} ({result.source.spec.family})", fontsize=10)
    note = result.source.provenance
    label = figure_label(note)
    text = f"{label.upper()} (dasc inspect shows the provenance note)" if label is not None else figure_line(note)
    fig.supxlabel(text.replace("$", r"\$"), fontsize=8, color="black" if label is None else "crimson")
    fig.tight_layout()
    save_png(fig, out, 110)
