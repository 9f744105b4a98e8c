"""What one TP rank stores per compressed state checkpoint (paper §4.1, App. B Scheme 2, App. B.1).

A :class:`RankLayout` is derived once from the plan and this rank's place in the TP group. It
names, for SGLang's active temporal state of this rank ``[L, slots, H/P, d_v, d_k]`` (SGLang 0.5.17
``MambaPool``, ``Mamba2StateShape`` / ``KimiLinearStateShape``: the last two axes are d_v, d_k for
both GDN and KDA), which units are global (kept) and where they sit in the ragged slot:

* GDN (``gdn_head``): a unit is one value head ``[d_v, d_k]``; flat unit id over the rank's layers
  ``f = l * (H/P) + j``.
* KDA (``kda_column``): a unit is the column ``S[j, :, k]`` (``[d_v]``); ``f = (l * (H/P) + j) * d_k + k``.

Packed (ragged) order is layer by layer, kept units sorted inside a layer, so layer l occupies
rows ``[o_l, o_l + r_l)`` of the slot (``o`` = ragged offsets). With storage balancing the slot is
``slot_width`` rows wide on every rank and a :class:`~dasc_compile.schema.StorageMap` says where each
packed row lives; otherwise the slot is exactly the rank's ``n_local`` rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from dasc_compile.schema import DascInputError, Plan, StorageMap
from dasc_runtime.indexing import rank_kept_units, state_index_from_kept

__all__ = ["RankLayout", "rank_layout"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, kw_only=True)
class RankLayout:
    """One rank's compressed-slot layout (frozen; built by :func:`rank_layout`).

    Attributes:
        unit_kind: ``gdn_head`` or ``kda_column``.
        num_layers: L, recurrent layers of the served model (SGLang's mamba layer count).
        heads_local: value heads on this rank (H_v / P).
        d_v / d_k: head dims of the temporal state ``[H/P, d_v, d_k]``.
        units_per_layer: units of one layer on this rank (H/P for GDN, H/P * d_k for KDA).
        rank_units: per layer, sorted rank-local unit ids ``j * units_per_head + k`` that are kept.
        offsets: ragged offsets, length L + 1 (``offsets[l]`` = first packed row of layer l).
        n_local: packed units of this rank (sum of kept counts, ``offsets[-1]``).
        width: rows allocated per slot (``n_local``, or ``slot_width`` with storage balancing).
        kept_flat: int64 ``[n_local]``, flat unit ids in packed order.
        local_flat: int64 ``[L * units_per_layer - n_local]``, flat ids of the omitted (local) units.
        int8: store kept units as symmetric INT8 with per-(layer, head, k) scales (App. E.1).
        temporal_dtype / conv_dtype: torch dtypes of the active temporal / conv state.
        storage: the plan's storage map when ``balance != off`` (units cross ranks), else None.
        tp_rank / tp_size: this rank and the TP degree the layout was built for.
    """

    unit_kind: str
    num_layers: int
    heads_local: int
    d_v: int
    d_k: int
    units_per_layer: int
    rank_units: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    n_local: int
    width: int
    kept_flat: torch.Tensor
    local_flat: torch.Tensor
    int8: bool
    temporal_dtype: torch.dtype
    conv_dtype: torch.dtype
    storage: Optional[StorageMap]
    tp_rank: int
    tp_size: int

    @property
    def unit_shape(self) -> tuple[int, ...]:
        """Shape of one stored unit: ``(d_v, d_k)`` for GDN, ``(d_v,)`` for KDA."""
        return (self.d_v, self.d_k) if self.unit_kind == "gdn_head" else (self.d_v,)

    @property
    def scale_shape(self) -> tuple[int, ...]:
        """Shape of one unit's INT8 scales: ``(d_k,)`` for GDN (one per k, over d_v), ``()`` for KDA."""
        return (self.d_k,) if self.unit_kind == "gdn_head" else ()

    @property
    def keeps_everything(self) -> bool:
        """True when no unit is omitted (the plan reproduces the dense temporal state)."""
        return self.local_flat.numel() == 0


def rank_layout(plan: Plan, tp_rank: int, tp_size: int, num_layers: int | None = None) -> RankLayout:
    """Build this rank's layout from ``plan`` (App. B Scheme 2 per rank; Fig. 9 (b) storage map).

    Args:
        plan: the loaded plan.
        tp_rank / tp_size: this process's attention-TP rank and degree.
        num_layers: recurrent layers the served model holds (checked against the plan), optional.
    Returns:
        the :class:`RankLayout`.
    Raises:
        DascInputError: TP degree other than the plan's, ``balance = hybrid`` (needs the
            compute-head permutation of the loaded weights, not implemented), or a layer count
            that differs from the plan's.
    """
    tp = plan.tp
    if tp_size != tp.tp_size:
        raise DascInputError(
            f"dasc plan was compiled for tp_size={tp.tp_size}, the server runs attention TP size {tp_size}; "
            f"recompile with --tp-size {tp_size}")
    if not 0 <= tp_rank < tp_size:
        raise DascInputError(f"TP rank {tp_rank} is outside [0, {tp_size})")
    if tp.balance == "hybrid":
        raise DascInputError(
            "dasc plan uses balance=hybrid (compute-head permutation of the loaded weights), which this runtime "
            "does not apply yet; recompile with --balance storage or --balance off")
    L = len(plan.layers)
    if num_layers is not None and num_layers != L:
        raise DascInputError(f"dasc plan has {L} recurrent layers, the served model has {num_layers}")
    m = plan.model
    kda = m.unit_kind == "kda_column"
    hl = tp.heads_per_rank
    uph = m.head_k_dim if kda else 1
    upl = hl * uph
    units = rank_kept_units(plan, tp_rank)
    # the rank's StateIndex (host) carries the ragged order; flat unit id f = l * upl + u
    index = state_index_from_kept(units, heads=hl, unit_kind=m.unit_kind, dk=m.head_k_dim)
    offsets = index.offsets.tolist()
    kept = index.unit_layer * upl + index.unit_index
    local = torch.nonzero(index.unit_row.reshape(-1) < 0).flatten()
    n_local = offsets[-1]
    storage = tp.storage if tp.balance == "storage" else None
    width = storage.slot_width if storage is not None else n_local
    pol = plan.policy
    return RankLayout(
        unit_kind=m.unit_kind, num_layers=L, heads_local=hl, d_v=m.head_v_dim, d_k=m.head_k_dim,
        units_per_layer=upl, rank_units=tuple(tuple(x) for x in units), offsets=tuple(offsets),
        n_local=n_local, width=width, kept_flat=kept, local_flat=local, int8=pol.int8,
        temporal_dtype=_DTYPES[pol.temporal_dtype], conv_dtype=_DTYPES[pol.conv_dtype],
        storage=storage, tp_rank=tp_rank, tp_size=tp_size,
    )
