"""Byte accounting of state checkpoints and the ragged layout (paper §4.1 Eq. 6, App. B Schemes 1-2,
App. C.1, App. E.1).

All byte figures are per state checkpoint (one slot) unless named otherwise. Shapes and bytes of one
unit, one layer's dense temporal state and its conv state come from
:class:`~dasc_compile.schema.units.UnitSpec` (``spec.unit_spec(policy)``); this module turns them into
the per-layer and whole-model figures the plan records. The usable-slots formula is
:func:`dasc_compile.schema.units.usable_slots` (shared with the runtime).
"""

from __future__ import annotations

import math
from typing import Sequence

from dasc_compile.archspec import ArchSpec
from dasc_compile.policy import Policy

__all__ = ["compression_ratios", "conv_bytes_per_layer", "dense_temporal_bytes_per_layer", "dense_unit_bytes",
           "ragged_offsets", "ratio", "unit_bytes"]


def unit_bytes(spec: ArchSpec, policy: Policy) -> int:
    """Bytes of one kept temporal unit as stored in the compressed pool (:attr:`UnitSpec.unit_bytes`).

    GDN head unit ``[d_v, d_k]``: d_v*d_k*itemsize; KDA column ``[d_v]``: d_v*itemsize. With
    ``policy.int8`` (App. E.1 Eq. 8) the payload is 1 byte per element plus one scale per
    (layer, head, k) in the temporal dtype: a GDN head carries d_k scales, a KDA column one.

    Raises:
        DascInputError: a dtype name the schema's dtype table does not know.
    """
    return spec.unit_spec(policy).unit_bytes


def dense_unit_bytes(spec: ArchSpec, policy: Policy) -> int:
    """Bytes of one unit in the dense (uncompressed) temporal state, at ``temporal_dtype``."""
    return spec.unit_spec(policy).dense_unit_bytes


def dense_temporal_bytes_per_layer(spec: ArchSpec, policy: Policy, tp_size: int = 1) -> int:
    """One layer's dense temporal state ``[H_v / P, d_v, d_k]`` on one rank, bytes."""
    return spec.unit_spec(policy).temporal_layer_bytes(spec.num_value_heads // tp_size)


def conv_bytes_per_layer(spec: ArchSpec, policy: Policy, tp_size: int = 1) -> int:
    """One layer's conv state on one rank, bytes: (conv_dim / P) * (K - 1) * itemsize(conv_dtype).

    Raises:
        DascInputError: ``tp_size`` does not divide the conv channels (see :meth:`UnitSpec.conv_layer_shape`).
    """
    return spec.unit_spec(policy).conv_bytes_per_layer(tp_size)


def ragged_offsets(kept_counts: Sequence[int]) -> list[int]:
    """Ragged offsets o_0 = 0, o_l = o_{l-1} + r_l (App. B Scheme 2); length L + 1."""
    out = [0]
    for r in kept_counts:
        out.append(out[-1] + int(r))
    return out


def ratio(num: float, den: float) -> float:
    """num / den, with x / 0 = inf (x > 0) and 0 / 0 = 1."""
    if den == 0:
        return 1.0 if num == 0 else math.inf
    return num / den


def compression_ratios(n_units: Sequence[int], kept: Sequence[int]) -> dict[str, float]:
    """C_temp ragged = sum n / sum r; padded = sum n / (L * R_max); layout gain = R_max / r_bar
    (Eq. 6 and §4.1)."""
    L = len(n_units)
    sum_n, sum_r = sum(n_units), sum(kept)
    r_max = max(kept) if kept else 0
    r_mean = sum_r / L if L else 0.0
    return {
        "c_temp_ragged": ratio(sum_n, sum_r),
        "c_temp_padded": ratio(sum_n, L * r_max),
        "layout_gain": ratio(r_max, r_mean),
        "r_max": r_max,
        "r_mean": r_mean,
    }
