"""``dasc inspect``: explain a compiled plan to a person (rich tables) or a machine (one JSON
document), reading only the plan artifact (DESIGN.md "Plan artifact").

What is shown, and where it comes from in the paper:
  * per-layer global-unit counts r_l out of n_l and ragged offsets o_{l-1} (§4.1, App. B Scheme 2);
  * the ratios C_temp (ragged, padded), layout gain R_max / r_bar and C_ckpt (Eq. 6, §4.1);
  * per-rank payloads for SGLang's contiguous head sharding, the compute-head permutation and
    storage balancing, the bottleneck rank and usable slots (App. B.1, Fig. 9, App. C.1);
  * the dasc-wr refresh window cap (Eq. 7);
  * the retained fraction r_{l,h} per (layer, head) (App. A.1 Figs. 5-8) and the histogram of
    retention horizons H_s (Eq. 3), as data.

The plan is read by :func:`dasc_compile.schema.load_plan` (the one reader). The derived data
(retained fractions, per-rank tables, number formats) live in :mod:`dasc_compile.plan_views`, shared
with the PNG (``--plot``: heatmap, horizon histogram, per-rank bytes) that
:func:`dasc_compile.plot.plot_plan` draws.

The keys of :func:`inspect_json` are documented in docs/cli.md ("dasc inspect --json keys").
"""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from dasc_compile.plan_views import (
    by_rank,
    fmt_bytes,
    fmt_ratio,
    fmt_tokens,
    head_summary,
    is_initialisation_draw,
    kept_per_head,
    permuted_layer_ids,
    provenance_kind,
)
from dasc_compile.provenance import figure_label
from dasc_compile.schema import UNIT_KINDS, Plan

#: Version of the ``--json`` document layout; bump when a key is removed, renamed or changes meaning.
INSPECT_FORMAT = 1


# ----------------------------------------------------------------------------------------------
# --json


def _json_safe(x: Any) -> Any:
    """Replace non-finite floats by the strings plan.json uses ("Infinity", "-Infinity", "NaN")."""
    if isinstance(x, float) and not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def inspect_json(plan: Plan) -> dict:
    """The machine-readable inspection document (keys documented in docs/cli.md).

    Every value is plain JSON: ``json.dumps(doc, allow_nan=False)`` succeeds; infinite values
    (e.g. horizons of units that never decay) are the string ``"Infinity"``, as in plan.json.
    Token counts are tokens, ``bytes_*`` are bytes per state checkpoint (one slot).

    Raises:
        DascInputError: a layer's unit ids are inconsistent (see
            :func:`dasc_compile.plan_views.kept_per_head`).
    """
    layers = []
    for lp in plan.layers:
        per_head = kept_per_head(lp)
        layers.append({
            "layer_id": lp.layer_id,
            "recurrent_index": lp.recurrent_index,
            "family": lp.family,
            "num_heads": lp.num_heads,
            "units_per_head": lp.units_per_head,
            "n_units": lp.n_units,
            "n_kept": lp.n_kept,
            "n_local": lp.n_units - lp.n_kept,
            "kept_fraction": lp.n_kept / lp.n_units if lp.n_units else 0.0,
            "offset": lp.offset,
            "offset_end": lp.offset + lp.n_kept,
            "kept_per_head": per_head,
            "retained_fraction_per_head": [c / lp.units_per_head for c in per_head],
            "refresh_window": lp.refresh_window,
            "horizon_quantiles": lp.horizon_quantiles.model_dump(),
            "horizon_histogram": list(lp.horizon_histogram),
            "horizon_local_max": lp.horizon_local_max,
            "horizon_global_min": lp.horizon_global_min,
            "bytes_temporal_dense": lp.bytes_temporal_dense,
            "bytes_temporal_kept": lp.bytes_temporal_kept,
            "bytes_conv": lp.bytes_conv,
        })
    tp = plan.tp
    stages = {"contiguous": by_rank(tp.payload_contiguous), "compute": by_rank(tp.payload_compute),
              "storage": by_rank(tp.payload_storage)}
    ranks = []
    for r in range(tp.tp_size):
        entry: dict[str, Any] = {"rank": r}
        for name, table in stages.items():
            p = table.get(r)
            entry[name] = None if p is None else p.model_dump(exclude={"rank"})
        ranks.append(entry)
    model = plan.model.model_dump(exclude={"provenance"})
    doc = {
        "inspect_format": INSPECT_FORMAT,
        "schema_version": plan.schema_version,
        "dasc_version": plan.dasc_version,
        "content_hash": plan.content_hash,
        "provenance": {"note": plan.model.provenance, "kind": provenance_kind(plan),
                       "initialisation_draw": is_initialisation_draw(plan)},
        "model": model,
        "fingerprint": plan.fingerprint.model_dump(),
        "policy": plan.policy.model_dump(mode="json"),
        "selection": plan.selection,
        "layers": layers,
        "head_summary": head_summary(plan),
        "totals": plan.totals.model_dump(),
        "refresh": {"load_policy": plan.policy.load_policy, "w_replay_cap": plan.refresh.w_replay_cap,
                    "any_local": plan.refresh.any_local},
        "tp": {
            "tp_size": tp.tp_size,
            "balance": tp.balance,
            "heads_per_rank": tp.heads_per_rank,
            "bottleneck_rank": tp.bottleneck_rank,
            "bottleneck_bytes_per_slot": tp.bottleneck_bytes_per_slot,
            "bytes_dense_per_slot": tp.bytes_dense_per_slot,
            "c_ckpt_tp": tp.c_ckpt_tp,
            "usable_slots": tp.usable_slots,
            "m_remote": tp.m_remote,
            "slot_width": tp.storage.slot_width if tp.storage is not None else None,
            "storage_targets": list(tp.storage.targets) if tp.storage is not None else None,
            "bytes_per_unit": tp.bytes_per_unit,
            "kept_per_rank_layer": [list(row) for row in tp.kept_per_rank_layer],
            "permuted_layer_ids": permuted_layer_ids(plan),
            "ranks": ranks,
        },
        "kernels": plan.kernels.model_dump() if plan.kernels is not None else None,
        "horizon_bin_edges": list(plan.horizon_bin_edges),
    }
    return _json_safe(doc)


# ----------------------------------------------------------------------------------------------
# rich report


def _opt(x: Any) -> str:
    return "-" if x is None else f"{x:,}"


def _layer_mix(m) -> str:
    """How the model's layers split, adding up to ``num_hidden_layers``: e.g. "24 recurrent + 4
    full-attention + 24 MLP / MoE (no state) of 52 layers" (Nemotron-H's pattern has stateless MLP
    blocks), or for Falcon-H1, which runs Mamba2 beside attention in every layer, "36 layers, each
    with a recurrent mixer beside full attention"."""
    rec, attn = set(m.recurrent_layer_ids), set(m.full_attention_layer_ids)
    n, both = m.num_hidden_layers, rec & attn
    rest = n - len(rec | attn)
    tail = [f"{rest} MLP / MoE (no state)"] if rest > 0 else []
    if not both:
        return " + ".join([f"{len(rec)} recurrent", f"{len(attn)} full-attention", *tail]) + f" of {n} layers"
    if both == rec == attn and not tail:
        return f"{n} layers, each with a recurrent mixer beside full attention"
    parts = [f"{len(both)} with a recurrent mixer beside full attention"]
    parts += [f"{len(rec - attn)} recurrent only"] if rec - attn else []
    parts += [f"{len(attn - rec)} full-attention only"] if attn - rec else []
    return " + ".join(parts + tail) + f" of {n} layers"


def _head_dims(m) -> str:
    """Head counts and state dims in the family's own terms (``UnitKind.head_name`` / ``dim_names``)."""
    kind = UNIT_KINDS[m.unit_kind]
    d_v, d_k = kind.dim_names
    state = f"{m.head_v_dim} x {m.head_k_dim} ({d_v} x {d_k})"
    if m.num_key_heads == m.num_value_heads:
        return f"{m.num_value_heads} {kind.head_name}s of {state}"
    return f"H_v {m.num_value_heads}, H_k {m.num_key_heads}; {kind.head_name} state {state}"


def _kv_table(title: str, rows: list[tuple[str, str]]) -> Table:
    t = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    for k, v in rows:
        t.add_row(k, v)
    return t


def render_report(plan: Plan, console: Console) -> None:
    """Print the human report of ``plan`` to ``console`` (rich tables; nothing is returned).

    Sections: header and provenance (a red panel when the decay values are an initialisation
    draw, not trained), the warnings ``dasc compile`` gave (``plan_checks.plan_warnings``: nothing kept,
    w_max 0, ...), policy and fingerprint, per-layer table (r_l / n_l, ragged offsets
    [o_{l-1}, o_l), H_s quantiles, W per layer, bytes), layer-head summary (App. A.1), totals and
    ratios (Eq. 6), refresh window (Eq. 7), per-rank payloads (App. B.1, Fig. 9) and kernels.

    Raises:
        DascInputError: a layer's unit ids are inconsistent (see
            :func:`dasc_compile.plan_views.kept_per_head`).
    """
    m, pol, t = plan.model, plan.policy, plan.totals
    console.rule(f"[bold]dasc plan[/bold]  {escape(m.model_type)} ({escape(', '.join(m.architectures))})")
    if is_initialisation_draw(plan):
        console.print(Panel(
            f"[bold]provenance: {escape(m.provenance)}[/bold]\n"
            "The decay values this plan was compiled from are an initialisation draw, not trained "
            "weights: the selection, ratios and loads below describe that draw, not the released model.",
            title="[bold red]WARNING: decay values not trained[/bold red]", border_style="red"))
    elif provenance_kind(plan) != "trained":
        what = ("synthesised to match figures published about the trained model (median decay, layer-head "
                "structure, capacity): the counts and ratios below follow those figures, but which unit is kept "
                "is not the trained model's" if provenance_kind(plan) == "paper-calibrated" else
                "partly synthetic: A_log is trained, dt_bias is drawn to match published per-layer statistics, "
                "so the horizons below are not the trained model's")
        console.print(Panel(
            f"[bold]provenance: {escape(m.provenance)}[/bold]\nThe decay values this plan was compiled from are {what}.",
            title=f"[bold yellow]{escape(figure_label(m.provenance) or '')}[/bold yellow]", border_style="yellow"))
    else:
        console.print(f"[bold]provenance:[/bold] {escape(m.provenance)}", highlight=False)
    from dasc_compile.plan_checks import plan_warnings

    for w in plan_warnings(plan):
        console.print(f"[bold yellow]warning:[/bold yellow] {escape(w)}", highlight=False)

    sel = "horizon (H_s > W_max)" if plan.selection == "horizon" else \
        f"random, count-matched (seed {pol.random_seed})"
    console.print(_kv_table("Plan", [
        ("model", f"{m.family} / {m.unit_kind}: {_layer_mix(m)}; {_head_dims(m)}"),
        ("selection", f"{sel}, W_max = {pol.w_max} tokens, a_s = {pol.a_s}, eps = {pol.eps:g}"),
        ("load policy", f"dasc-{pol.load_policy}"),
        ("state dtypes", f"temporal {pol.temporal_dtype}{' stored as INT8' if pol.int8 else ''}, "
                         f"conv {pol.conv_dtype}"),
        ("TP", f"P = {pol.tp_size}, balance {pol.balance}"),
        ("artifact", f"schema v{plan.schema_version}, dasc {plan.dasc_version}, content {plan.content_hash[:16] or '-'}"),
        ("fingerprint", f"config {plan.fingerprint.config_sha256[:16]}, decay {plan.fingerprint.decay_sha256[:16]} "
                        f"({len(plan.fingerprint.decay_tensors)} tensors)"),
    ]), highlight=False)
    console.print()

    lt = Table(title="Per-layer global units and ragged offsets", title_justify="left")
    for name, just in [("layer", "right"), ("rec", "right"), ("kept r_l", "right"), ("n_l", "right"),
                       ("kept %", "right"), ("offsets [o, o+r)", "right"), ("H_s min", "right"),
                       ("H_s p50", "right"), ("H_s max", "right"), ("W_l wr", "right"),
                       ("temporal kept", "right"), ("temporal dense", "right")]:
        lt.add_column(name, justify=just)
    loads = plan.tp.kept_per_rank_layer if plan.tp.tp_size > 1 else None
    if loads is not None:
        lt.add_column("kept per rank", justify="left")
    for i, lp in enumerate(plan.layers):
        q = lp.horizon_quantiles
        extra = [" ".join(f"{row[i]:,}" for row in loads)] if loads is not None else []
        lt.add_row(str(lp.layer_id), str(lp.recurrent_index), f"{lp.n_kept:,}", f"{lp.n_units:,}",
                   f"{100 * lp.n_kept / lp.n_units:.1f}" if lp.n_units else "-",
                   f"[{lp.offset}, {lp.offset + lp.n_kept})", fmt_tokens(q.min), fmt_tokens(q.p50),
                   fmt_tokens(q.max), str(lp.refresh_window), fmt_bytes(lp.bytes_temporal_kept),
                   fmt_bytes(lp.bytes_temporal_dense), *extra)
    console.print(lt, highlight=False)
    console.print("H_s: static retention horizon of the layer's units (tokens, Eq. 3); a unit is kept when "
                  "H_s > W_max. W_l wr: the tokens dasc-wr replays for the layer's omitted units (Eq. 7: the next "
                  "power of two above their longest H_s, at least 4, at most W_max; 0 when nothing is omitted).",
                  highlight=False)
    hs = head_summary(plan)
    kind = UNIT_KINDS[m.unit_kind]
    if hs["pairs"] and kind.whole_head:   # a head is kept or omitted whole: no mixed pairs to report
        console.print(f"layer-head pairs: {hs['pairs']}; {kind.head_name}s kept {hs['all_retained']}, omitted "
                      f"{hs['all_omitted']} (unit: {kind.unit_name}); layer kept fraction "
                      f"{hs['layer_mean_fraction_min']:.3f} .. {hs['layer_mean_fraction_max']:.3f}", highlight=False)
    elif hs["pairs"]:
        console.print(f"layer-head pairs: {hs['pairs']}; mixed (0 < r < 1) {hs['mixed']}, all omitted "
                      f"{hs['all_omitted']}, all retained {hs['all_retained']} (unit: {kind.unit_name}s); layer mean "
                      f"retained fraction {hs['layer_mean_fraction_min']:.3f} .. {hs['layer_mean_fraction_max']:.3f}",
                      highlight=False)

    console.print()
    console.print(_kv_table("Totals and ratios (TP = 1, per state checkpoint)", [
        ("units", f"kept {t.n_kept:,} of {t.n_units:,} over L = {t.num_recurrent_layers} layers "
                  f"(R_max {t.r_max:,}, r_bar {t.r_mean:,.2f}); unit {fmt_bytes(t.unit_bytes)}"),
        ("C_temp ragged", f"{fmt_ratio(t.c_temp_ragged)}   (sum n / sum r)"),
        ("C_temp padded", f"{fmt_ratio(t.c_temp_padded)}   (sum n / (L R_max)); layout gain "
                          f"{fmt_ratio(t.layout_gain)} (R_max / r_bar)"),
        ("temporal", f"{fmt_bytes(t.bytes_temporal_kept)} kept of {fmt_bytes(t.bytes_temporal_dense)} dense"),
        ("conv", fmt_bytes(t.bytes_conv)),
        ("checkpoint", f"{fmt_bytes(t.bytes_compressed_checkpoint)} compressed vs "
                       f"{fmt_bytes(t.bytes_dense_checkpoint)} dense ({t.bytes_compressed_checkpoint:,} / "
                       f"{t.bytes_dense_checkpoint:,} B)"),
        ("C_ckpt", f"{fmt_ratio(t.c_ckpt)}   (Eq. 6)"),
        ("usable slots", (f"{_opt(t.usable_slots)} compressed vs {_opt(t.usable_slots_dense)} dense"
                          + (f" for a compressed pool of {fmt_bytes(pol.pool_budget_bytes)} (the native slots of "
                             "running requests come on top; dasc size --budget fits both in one state budget)"
                             if pol.pool_budget_bytes else
                             " (compile with --pool-budget SIZE to count them, or see dasc size)"))
                         if t.usable_slots is not None or pol.tp_size == 1
                         else "the pool budget is per rank: see the per-rank table below"),
    ]), highlight=False)

    if plan.refresh.any_local:
        use = "used by dasc-wr" if pol.load_policy == "wr" else "not used: dasc-nr zero-fills local units"
        refresh = (f"refresh window: W_replay = min(n_p, {plan.refresh.w_replay_cap}) tokens (Eq. 7; {use})")
    else:
        refresh = "refresh window: 0 (no unit is omitted; refresh is skipped)"
    console.print(refresh, highlight=False)

    console.print()
    _render_tp(plan, console)
    if plan.kernels is not None:
        k = plan.kernels
        console.print()
        console.print(_kv_table("Kernels", [("file", escape(k.file)), ("key", escape(k.key)),
                                            ("ops", escape(", ".join(k.ops)))]),
                      highlight=False)


def _render_tp(plan: Plan, console: Console) -> None:
    tp = plan.tp
    if tp.tp_size == 1:
        console.print(f"TP = 1: the single rank stores {fmt_bytes(tp.bottleneck_bytes_per_slot)} per slot "
                      f"(no placement maps)", highlight=False)
        return
    rt = Table(title=f"Per-rank state-checkpoint payloads (TP = {tp.tp_size}, balance {tp.balance})",
               title_justify="left")
    rt.add_column("rank", justify="right")
    for stage in ("contiguous", "compute", "storage"):
        rt.add_column(f"{stage} units", justify="right")
        rt.add_column(f"{stage} bytes/slot", justify="right")
    stages = [by_rank(tp.payload_contiguous), by_rank(tp.payload_compute), by_rank(tp.payload_storage)]
    for r in range(tp.tp_size):
        cells = [str(r) + (" *" if r == tp.bottleneck_rank else "")]
        for table in stages:
            p = table.get(r)
            if p is None:
                cells += ["-", "-"]
            else:
                units = f"{p.n_kept:,}" if p.n_alloc == p.n_kept else f"{p.n_kept:,} (alloc {p.n_alloc:,})"
                cells += [units, fmt_bytes(p.bytes_per_slot)]
        rt.add_row(*cells)
    console.print(rt, highlight=False)
    lines = [f"bottleneck rank {tp.bottleneck_rank} (*): {fmt_bytes(tp.bottleneck_bytes_per_slot)} per slot vs "
             f"{fmt_bytes(tp.bytes_dense_per_slot)} dense per rank; C_ckpt under TP {fmt_ratio(tp.c_ckpt_tp)}; "
             f"usable slots {_opt(tp.usable_slots)}"]
    if tp.storage is not None:
        lines.append(f"storage balancing: M_remote = {tp.storage.m_remote:,} (units stored off their compute rank); "
                     f"slot width {tp.storage.slot_width:,} units; targets "
                     f"{' / '.join(f'{x:,}' for x in tp.storage.targets)} (per rank)")
    perm = permuted_layer_ids(plan)
    if perm is not None:
        lines.append(f"compute-head permutation: {len(perm)} of {len(tp.permutation)} layers reordered")
    for line in lines:
        console.print(line, highlight=False)
