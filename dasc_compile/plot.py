"""``dasc inspect --plot``: draw a compiled plan as one PNG (matplotlib), from the plan artifact only.

Panels, and where they come from in the paper:
  * the retained-fraction heatmap r_{l,h} (layer x head, as in App. A.1 Figs. 5-8);
  * the histogram of retention horizons H_s (Eq. 3) pooled over layers, with W_max marked;
  * under TP, bytes per slot on each rank for the contiguous / compute / storage stages and the
    bottleneck rank (App. B.1, Fig. 9).

The data behind the panels (retained fractions, provenance check, per-rank tables) live in
:mod:`dasc_compile.plan_views`, shared with the text and JSON reports of :mod:`dasc_compile.inspect`;
matplotlib is imported only when :func:`plot_plan` runs.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dasc_compile.figures import save_png
from dasc_compile.plan_views import by_rank, fmt_ratio, is_initialisation_draw, retained_fraction_matrix
from dasc_compile.provenance import figure_label, figure_line
from dasc_compile.schema import UNIT_KINDS, Plan

__all__ = ["plot_plan"]


def _log_bin_bounds(edges: list[float]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Left / right bar bounds of each horizon bin on a log axis, and tick labels.

    Bin i is [edge_i, edge_{i+1}), the last is [edge_-1, inf]. A zero left edge is drawn from half
    the next edge; the open last bin is drawn one octave wide.
    """
    e = [float(x) for x in edges]
    right = e[1:] + [e[-1] * 2 if e[-1] > 0 else 1.0]
    left = [x if x > 0 else (r / 2 if r > 0 else 0.5) for x, r in zip(e, right)]
    return np.asarray(left), np.asarray(right), [_edge_label(x) for x in e]


def _edge_label(x: float) -> str:
    """``2^k`` for powers of two from 2^4 up, else the plain number."""
    if x >= 16 and math.log2(x).is_integer():
        return f"2^{int(math.log2(x))}"
    return f"{x:g}"


def plot_plan(plan: Plan, png_path: str | Path) -> None:
    """Draw the plan as a PNG at ``png_path`` (:func:`dasc_compile.figures.save_png`).

    Panels: (1) heatmap of the retained fraction r_{l,h} (rows: recurrent layers labelled by model
    layer index; columns: heads; KDA: fraction of d_k key channels kept, GDN: kept / omitted
    head), as in App. A.1 Figs. 5-8; (2) histogram of the retention horizons H_s (Eq. 3) of all
    units, pooled over layers, on a log-x axis over ``plan.horizon_bin_edges`` with W_max
    marked; (3) when ``tp_size > 1``, bytes per slot on each rank for the contiguous / compute /
    storage stages with the bottleneck rank marked (App. B.1, Fig. 9). A footer under the panels carries
    the provenance line: in red capitals (:func:`dasc_compile.provenance.figure_label`) when the decay values
    are not trained weights (initialisation draw, paper-calibrated, real A_log plus synthetic dt_bias), else
    ``"trained weights: <note>"`` (:func:`dasc_compile.provenance.figure_line`).

    Raises:
        DascInputError: the PNG cannot be written (missing directory, permissions), or a layer's
            unit ids are inconsistent.
    """
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator
    import matplotlib

    out = Path(png_path)
    layer_ids, mat = retained_fraction_matrix(plan)
    L, H = mat.shape
    tp, pol = plan.tp, plan.policy
    kda = bool(plan.layers) and plan.layers[0].units_per_head > 1
    heat_h = min(14.0, max(3.0, 0.22 * L + 1.4))
    fig = Figure(figsize=(12, heat_h + 4.6), layout="constrained")
    gs = fig.add_gridspec(2, 2 if tp.tp_size > 1 else 1, height_ratios=[heat_h, 4.0])

    # (1) retained-fraction heatmap
    ax = fig.add_subplot(gs[0, :])
    viridis = matplotlib.colormaps["viridis"]
    if kda:
        cmap, norm = viridis, None
    else:
        cmap = ListedColormap([viridis(0.0), viridis(1.0)])
        norm = BoundaryNorm([-0.5, 0.5, 1.5], 2)
    im = ax.imshow(mat if L else np.zeros((1, 1)), aspect="auto", interpolation="nearest", cmap=cmap,
                   norm=norm, vmin=None if norm else 0.0, vmax=None if norm else 1.0)
    step_y = max(1, math.ceil(L / 40))
    ax.set_yticks(range(0, L, step_y), [str(layer_ids[i]) for i in range(0, L, step_y)],
                  fontsize=8 if L > 24 else 9)
    step_x = max(1, math.ceil(H / 32))
    ax.set_xticks(range(0, H, step_x), [str(h) for h in range(0, H, step_x)], fontsize=8 if H > 16 else 9)
    kind = UNIT_KINDS[plan.model.unit_kind]
    ax.set_xlabel(f"{kind.head_name} h")
    ax.set_ylabel("model layer index (recurrent layers only)")
    d_v, d_k = kind.dim_names
    how = (f"fraction of the d_k = {plan.model.head_k_dim} key channels kept per head" if kda
           else f"{plan.model.family} {kind.head_name} [{d_v} {plan.model.head_v_dim}, {d_k} {plan.model.head_k_dim}] "
                f"kept (global) or omitted (local)")
    sel = "H_s > W_max" if plan.selection == "horizon" else f"random count-matched, seed {pol.random_seed}"
    ax.set_title(f"Retained fraction r(l, h) at W_max = {pol.w_max} tokens ({sel}): {how}", fontsize=10)
    cb = fig.colorbar(im, ax=ax, fraction=0.04, pad=0.01)
    if kda:
        cb.set_label("retained fraction r(l, h)")
    else:
        cb.set_ticks([0, 1], labels=["omitted", "kept"])

    # (2) horizon histogram, pooled over layers
    axh = fig.add_subplot(gs[1, 0])
    counts = np.zeros(len(plan.horizon_bin_edges), dtype=np.int64)
    for lp in plan.layers:
        counts[:len(lp.horizon_histogram)] += np.asarray(lp.horizon_histogram[:len(counts)], dtype=np.int64)
    left, right, labels = _log_bin_bounds(plan.horizon_bin_edges)
    axh.bar(left, counts, width=right - left, align="edge", color=viridis(0.35), edgecolor="white", linewidth=0.5)
    axh.set_xscale("log", base=2)
    axh.set_xlim(left[0], right[-1])
    if pol.w_max is not None and pol.w_max > 0:
        axh.axvline(pol.w_max, color="crimson", linestyle="--", linewidth=1.2, label=f"W_max = {pol.w_max}")
        axh.legend(loc="upper right", fontsize=8)
    t = plan.totals
    kept_pct = f" ({100 * t.n_kept / t.n_units:.1f}%)" if t.n_units else ""
    axh.set_title(f"Retention horizons H_s of all {t.n_units:,} units ({t.num_recurrent_layers} layers); "
                  f"kept {t.n_kept:,}{kept_pct}", fontsize=10)
    axh.set_xlabel(f"H_s, tokens (log scale; first bin [0, {right[0]:g}), last bin >= {labels[-1]}, incl. inf)")
    axh.set_ylabel("units")
    axh.yaxis.set_major_locator(MaxNLocator(integer=True))

    # (3) per-rank bytes per slot
    if tp.tp_size > 1:
        axr = fig.add_subplot(gs[1, 1])
        ranks = np.arange(tp.tp_size)
        peak = max([p.bytes_per_slot for p in tp.payload_contiguous + tp.payload_compute + tp.payload_storage]
                   + [1])
        div, unit = next((1024.0 ** k, u) for k, u in ((3, "GiB"), (2, "MiB"), (1, "KiB"), (0, "B"))
                         if peak >= 1024.0 ** k)
        width = 0.27
        all_vals = []
        for j, (name, pl) in enumerate([("contiguous", tp.payload_contiguous), ("compute", tp.payload_compute),
                                        ("storage", tp.payload_storage)]):
            by = by_rank(pl)
            vals = [by[r].bytes_per_slot / div if r in by else 0.0 for r in ranks]
            all_vals += vals
            axr.bar(ranks + (j - 1) * width, vals, width=width, label=name, color=viridis(0.15 + 0.35 * j))
        dense = tp.bytes_dense_per_slot / div
        axr.axhline(dense, color="gray", linestyle=":", linewidth=1.2, label="dense per rank")
        lo, hi = min(all_vals + [dense]), max(all_vals + [dense])
        # Imbalance between ranks is often a few percent: zoom in rather than start at 0, and say so.
        zoom = lo > 0.5 * hi
        bottom = max(0.0, lo - 0.25 * (hi - lo) - 1e-9 * hi) if zoom else 0.0
        axr.set_ylim(bottom, hi + 0.3 * (hi - bottom))
        axr.set_xticks(ranks, [f"{r}*" if r == tp.bottleneck_rank else str(r) for r in ranks])
        axr.set_xlabel("TP rank (* bottleneck)")
        axr.set_ylabel(f"bytes per slot ({unit})" + ("; axis does not start at 0" if zoom else ""))
        axr.set_title(f"Per-rank payload, TP = {tp.tp_size}, balance {tp.balance}: C_ckpt {fmt_ratio(tp.c_ckpt_tp)}",
                      fontsize=10)
        axr.legend(fontsize=8, loc="upper center", ncol=4)

    def plain(x: str) -> str:  # keep matplotlib from reading '$...$' in plan strings as mathtext
        return x.replace("$", r"\$")

    title = f"dasc plan: {plain(plan.model.model_type)} ({plan.model.family}, {len(layer_ids)} recurrent layers)"
    fig.suptitle(title, fontsize=12, fontweight="bold")
    import textwrap

    label = figure_label(plan.model.provenance)
    if label is not None:   # every generated decay source is named on the figure itself
        tail = " - these figures describe no trained model" if is_initialisation_draw(plan) else ""
        note = textwrap.fill(f"{label.upper()}{tail} (dasc inspect shows the provenance note)", width=150)
        fig.supxlabel(note, color="crimson", fontsize=9, fontweight="bold")  # constrained layout makes room
    else:                   # trained weights are named too, so no figure goes out without its source
        fig.supxlabel(textwrap.fill(plain(figure_line(plan.model.provenance, width=300)), width=150), fontsize=9)

    save_png(fig, out, 110)
