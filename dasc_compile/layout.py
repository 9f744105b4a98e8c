"""Ragged layout and byte accounting (paper §4.1 Eq. 6, App. B Schemes 1-2, App. C.1, App. E.1).

All byte figures are per state checkpoint (one slot) unless named otherwise.
"""

from __future__ import annotations

import math
from typing import Sequence

from dasc_compile.arch import ArchSpec
from dasc_compile.policy import Policy

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}


def dtype_bytes(name: str) -> int:
    """Bytes per element of a state dtype name (``float32`` -> 4, ``bfloat16`` -> 2, ...)."""
    return DTYPE_BYTES[name]


def unit_bytes(spec: ArchSpec, policy: Policy) -> int:
    """Bytes of one kept temporal unit as stored in the compressed pool.

    GDN head unit ``[d_v, d_k]``: d_v*d_k*itemsize; KDA column ``[d_v]``: d_v*itemsize. With
    ``policy.int8`` (App. E.1 Eq. 8) the payload is 1 byte per element plus one scale per
    (layer, head, k) in the temporal dtype: a GDN head carries d_k scales, a KDA column one.
    """
    elems = spec.head_v_dim * (spec.head_k_dim if spec.units_per_head == 1 else 1)
    scales = spec.head_k_dim if spec.units_per_head == 1 else 1
    if policy.int8:
        return elems * 1 + scales * dtype_bytes(policy.temporal_dtype)
    return elems * dtype_bytes(policy.temporal_dtype)


def dense_unit_bytes(spec: ArchSpec, policy: Policy) -> int:
    """Bytes of one unit in the dense (uncompressed) temporal state, at ``temporal_dtype``."""
    elems = spec.head_v_dim * (spec.head_k_dim if spec.units_per_head == 1 else 1)
    return elems * dtype_bytes(policy.temporal_dtype)


def dense_temporal_bytes_per_layer(spec: ArchSpec, policy: Policy, tp_size: int = 1) -> int:
    """One layer's dense temporal state ``[H_v / P, d_v, d_k]`` in bytes."""
    h, dv, dk = spec.temporal_shape(tp_size)
    return h * dv * dk * dtype_bytes(policy.temporal_dtype)


def conv_bytes_per_layer(spec: ArchSpec, policy: Policy, tp_size: int = 1) -> int:
    """One layer's conv state on one rank, bytes: (conv_dim / P) * (K - 1) * itemsize(conv_dtype)."""
    return spec.conv_numel(tp_size) * dtype_bytes(policy.conv_dtype)


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


def usable_slots(budget_bytes: int | None, bytes_per_slot: int) -> int | None:
    """floor(B / bytes_per_slot) - 1, slot 0 reserved as in SGLang (App. C.1); at least 0.

    ``None`` when no budget was given.
    """
    if budget_bytes is None:
        return None
    if bytes_per_slot <= 0:
        raise ValueError(f"bytes_per_slot must be > 0, got {bytes_per_slot}")
    return max(0, budget_bytes // bytes_per_slot - 1)
