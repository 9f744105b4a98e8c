"""Derived views of a compiled plan, shared by the text / JSON report (:mod:`dasc_compile.inspect`) and
the picture (:mod:`dasc_compile.plot`); computed from the plan artifact only.

* the retained fraction r_{l,h} per (layer, head) (App. A.1 Figs. 5-8): :func:`kept_per_head`,
  :func:`retained_fraction_matrix`, :func:`head_summary`;
* per-rank payload tables (App. B.1, Fig. 9): :func:`by_rank`, :func:`permuted_layer_ids`;
* provenance (MODELS.md: initialisation draw, paper-calibrated, trained): :func:`provenance_kind`,
  :func:`is_initialisation_draw` (the kinds live in :mod:`dasc_compile.provenance`);
* how bytes, ratios, horizons and quality figures are written for a person: :func:`fmt_bytes`,
  :func:`fmt_ratio`, :func:`fmt_tokens`, :func:`fmt_quality`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dasc_compile.errors import DascInputError
from dasc_compile.provenance import provenance_kind as _note_kind
from dasc_compile.schema import LayerPlan, Plan, RankPayload
from dasc_compile.schema.units import fmt_bytes  # noqa: F401  (re-exported: the CLI's views use it from here)

__all__ = ["by_rank", "fmt_bytes", "fmt_ratio", "fmt_tokens", "head_summary", "is_initialisation_draw",
           "kept_per_head", "permuted_layer_ids", "provenance_kind", "retained_fraction_matrix"]

def provenance_kind(plan: Plan) -> str:
    """Where the plan's decay values came from: ``initialisation-draw`` | ``paper-calibrated`` |
    ``real-A_log+synthetic-dt_bias`` | ``trained`` (:func:`dasc_compile.provenance.provenance_kind`)."""
    return _note_kind(plan.model.provenance)


def is_initialisation_draw(plan: Plan) -> bool:
    """True when the plan's provenance says its decay values were drawn at initialisation (MODELS.md)."""
    return provenance_kind(plan) == "initialisation-draw"


def kept_per_head(layer: LayerPlan) -> list[int]:
    """Global (kept) units per head of one layer: int list ``[H]``.

    Flat unit id ``u = h * units_per_head + k`` (:mod:`dasc_compile.schema.plan`), so head ``h`` = ``u // units_per_head``.
    GDN (units_per_head = 1): each entry is 0 or 1; KDA: 0..d_k kept key channels.

    Raises:
        DascInputError: ``n_units != num_heads * units_per_head`` or a kept unit id is outside
            ``[0, n_units)`` (a malformed plan).
    """
    H, U = layer.num_heads, layer.units_per_head
    if U <= 0 or layer.n_units != H * U:
        raise DascInputError(f"plan layer {layer.layer_id}: n_units {layer.n_units} != num_heads {H} "
                             f"* units_per_head {U}")
    counts = [0] * H
    for u in layer.kept_units:
        if not 0 <= u < layer.n_units:
            raise DascInputError(f"plan layer {layer.layer_id}: kept unit {u} outside [0, {layer.n_units})")
        counts[u // U] += 1
    return counts


def retained_fraction_matrix(plan: Plan) -> tuple[list[int], np.ndarray]:
    """Retained fraction r_{l,h} of every (recurrent layer, head) pair (paper App. A.1, Figs. 5-8).

    KDA: the fraction of a head's d_k key channels that are global,
    r_{l,h} = (1/d_k) * sum_k 1[H_s(l,h,k) > W_max]; GDN: 1.0 if the head is kept else 0.0.

    Returns:
        ``(layer_ids, matrix)``: ``layer_ids`` are the model layer indices (0-indexed) of the
        recurrent layers in plan order, length L; ``matrix`` is float64 ``[L, H_max]`` in [0, 1],
        NaN where a layer has fewer than ``H_max`` heads. Full-attention layers are not rows.
    Raises:
        DascInputError: a layer's unit ids are inconsistent (see :func:`kept_per_head`).
    """
    h_max = max((lp.num_heads for lp in plan.layers), default=0)
    mat = np.full((len(plan.layers), h_max), np.nan, dtype=np.float64)
    for i, lp in enumerate(plan.layers):
        mat[i, :lp.num_heads] = np.asarray(kept_per_head(lp), dtype=np.float64) / lp.units_per_head
    return [lp.layer_id for lp in plan.layers], mat


def head_summary(plan: Plan) -> dict[str, Any]:
    """Counts of layer-head pairs that are mixed (0 < r < 1), all omitted (r = 0), all retained
    (r = 1), and the min / max over layers of the mean retained fraction (App. A.1 captions)."""
    _, mat = retained_fraction_matrix(plan)
    vals = mat[~np.isnan(mat)]
    means = [float(np.nanmean(row)) for row in mat if not np.all(np.isnan(row))]
    return {
        "pairs": int(vals.size),
        "mixed": int(((vals > 0) & (vals < 1)).sum()),
        "all_omitted": int((vals == 0).sum()),
        "all_retained": int((vals == 1).sum()),
        "layer_mean_fraction_min": min(means) if means else None,
        "layer_mean_fraction_max": max(means) if means else None,
    }


def by_rank(payloads: list[RankPayload]) -> dict[int, RankPayload]:
    """``{rank: payload}`` of one placement stage's per-rank payload list."""
    return {p.rank: p for p in payloads}


def permuted_layer_ids(plan: Plan) -> list[int] | None:
    """Model layer ids whose compute-head order is not the identity; None without a permutation."""
    if plan.tp.permutation is None:
        return None
    return [p.layer_id for p in plan.tp.permutation if p.head_order != sorted(p.head_order)]


def fmt_ratio(x: float) -> str:
    """A compression ratio: ``1.40x``, or ``inf`` when nothing is kept."""
    return "inf" if math.isinf(x) else f"{x:.2f}x"


def fmt_tokens(x: float) -> str:
    """A horizon in tokens: ``inf``, ``3.47``, ``180.2``, ``12,345``, ``3.1e+07``."""
    if math.isinf(x):
        return "inf"
    if x < 10:
        return f"{x:.2f}"
    if x < 1000:
        return f"{x:.1f}"
    return f"{x:,.0f}" if x < 1e7 else f"{x:.1e}"


def fmt_quality(v, digits: int = 4) -> str:
    """A quality figure (ΔNLL, KL: a number, or Random's ``{"mean", "sd"}``) to ``digits`` decimals, ``-`` when not
    measured; a value that rounds to zero prints ``0.0000``, not ``-0.0000`` (dasc eval's and sweep's tables)."""
    if isinstance(v, dict):
        return "-" if v.get("mean") is None else f"{fmt_quality(v['mean'], digits)} ± {fmt_quality(v['sd'], digits)}"
    return "-" if v is None else f"{round(v, digits) + 0.0:.{digits}f}"
