"""One TP rank's compressed-slot layout, built once from the plan (paper §4.1, App. B Scheme 2, App. B.1).

SGLang 0.5.17's active temporal state on a rank is ``[L, slots, H/P, d_v, d_k]`` (``MambaPool``;
``Mamba2StateShape`` / ``KimiLinearStateShape``: the last two axes are d_v, d_k for GDN and KDA
alike). A plan says which units of it are global (kept); this module turns that into everything the
pool, the PyTorch store/load and the generated kernels index with:

* a unit: GDN (``gdn_head``) one value head ``[d_v, d_k]``, id on its rank ``u = j``; KDA
  (``kda_column``) the column ``S[j, :, k]`` (``[d_v]``), ``u = j * d_k + k`` (j: the head's index
  among the rank's H/P heads). Flat id over the
  rank's layers ``f = l * units_per_layer + u``;
* ragged (packed) order: layer by layer, kept units ascending inside a layer, so layer l owns rows
  ``[o_l, o_(l+1))`` of a slot (``o`` = ragged offsets, ``o_0 = 0``, ``o_(l+1) = o_l + r_l``);
* :class:`StateIndex`: the small int64 tensors the kernels read (``unit_row`` above all, the
  ragged row of each unit or -1 for a local = omitted unit; the head work lists; the INT8 scale
  order, App. E.1);
* :class:`RankLayout`: the rank's whole layout, which owns its :class:`StateIndex` (so the index is
  built once and moved to the pool device once) plus the flat kept / local id lists, the model's
  :class:`~dasc_compile.schema.UnitSpec` (unit shape, INT8 scales, bytes, dtypes), slot width and
  the storage map.

Unit kinds are data (``dasc_compile.schema.units.UNIT_KINDS``): code here asks a kind whether a unit
is a whole head, never compares kind names.

With storage balancing a slot is ``slot_width`` rows wide on every rank and the plan's
:class:`~dasc_compile.schema.StorageMap` says where each packed row lives (Fig. 9 (b)); otherwise a
slot is exactly the rank's ``n_kept`` rows. Heads are sharded contiguously over TP ranks as SGLang
does (rank r holds value heads ``[r*H_r, (r+1)*H_r)``), or as the plan's compute-head permutation
says (App. B.1 (a)).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence

import torch

from dasc_compile.schema import DascInputError, Plan, StorageMap, UnitSpec
from dasc_compile.schema.units import lookup_unit_kind

__all__ = ["StateIndex", "RankLayout", "build_rank_layout", "build_state_index", "state_index_from_kept",
           "rank_kept_units", "ragged_pool_shapes", "torch_dtype"]

_INDEX_TENSORS = ("unit_layer", "unit_index", "offsets", "unit_row", "kept_heads", "local_heads", "scale_lhk")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a plan dtype name (``float32`` -> ``torch.float32``).

    Raises:
        DascInputError: a name the schema's dtype table (:meth:`UnitSpec.itemsize`) does not know.
    """
    UnitSpec.itemsize(name)
    return getattr(torch, name[6:] if name.startswith("torch.") else name)


@dataclass(frozen=True, kw_only=True)
class StateIndex:
    """The kernels' index tensors of one rank; all int64 and on one device.

    Attributes:
        unit_layer / unit_index: ``[R]``: ragged row j holds unit ``unit_index[j]`` of layer ``unit_layer[j]``.
        offsets: ``[L+1]`` ragged offsets.
        unit_row: ``[L, H * units_per_head]``: ragged row of each unit, -1 for a local (omitted) unit.
        kept_heads / local_heads: flat head ids ``l * H + h`` holding at least one kept / local unit,
            ascending: the work lists of ``pack`` / ``pack_int8`` and of ``refresh_copy``.
        scale_lhk: ``[n_scales, 3]`` (layer, head on the rank, k) of each INT8 scale in storage order
            (per slot ``[R, d_k]`` scales for GDN heads, ``[R]`` for KDA columns).
        heads: H on this rank. units_per_head: 1 (GDN) or d_k (KDA). dk: key dim d_k.
        unit_kind: ``gdn_head`` | ``kda_column``.
    """

    unit_layer: torch.Tensor
    unit_index: torch.Tensor
    offsets: torch.Tensor
    unit_row: torch.Tensor
    kept_heads: torch.Tensor
    local_heads: torch.Tensor
    scale_lhk: torch.Tensor
    heads: int
    units_per_head: int
    dk: int
    unit_kind: str

    @property
    def num_layers(self) -> int:
        """L, recurrent layers indexed."""
        return self.unit_row.shape[0]

    @property
    def num_rows(self) -> int:
        """R = sum_l r_l, ragged rows per slot on this rank."""
        return self.unit_layer.shape[0]

    @property
    def scale_shape(self) -> tuple[int, ...]:
        """Per-slot INT8 scale shape: ``(R, dk)`` (GDN) or ``(R,)`` (KDA)."""
        return (self.num_rows, self.dk) if lookup_unit_kind(self.unit_kind).whole_head else (self.num_rows,)

    def to(self, device) -> "StateIndex":
        """The same index with every tensor on ``device`` (no copy when already there)."""
        return replace(self, **{f: getattr(self, f).to(device) for f in _INDEX_TENSORS})


def state_index_from_kept(kept: Sequence[Sequence[int]], *, heads: int, unit_kind: str, dk: int,
                          device: torch.device | str = "cpu") -> StateIndex:
    """Build a :class:`StateIndex` from the kept units of each layer (ids on the rank).

    Args:
        kept: for each recurrent layer, the unit ids on the rank that are kept (any order, no repeats),
            each in ``[0, heads * units_per_head)``.
        heads: H on this rank. unit_kind: ``gdn_head`` | ``kda_column``. dk: key dim d_k.
        device: where the tensors go.
    Raises:
        DascInputError: unknown unit kind, a unit id out of range or repeated within a layer.
    """
    whole_head = lookup_unit_kind(unit_kind).whole_head
    uph = 1 if whole_head else dk
    n_units = heads * uph
    layers, units, offsets = [], [], [0]
    unit_row = torch.full((len(kept), n_units), -1, dtype=torch.int64)
    for l, ids in enumerate(kept):
        ids = sorted(int(u) for u in ids)
        if ids and (ids[0] < 0 or ids[-1] >= n_units):
            raise DascInputError(f"state index: layer {l} kept unit ids must lie in [0, {n_units}), got {ids[0]}..{ids[-1]}")
        if len(set(ids)) != len(ids):
            raise DascInputError(f"state index: layer {l} repeats a kept unit id")
        start = offsets[-1]
        unit_row[l, ids] = torch.arange(start, start + len(ids), dtype=torch.int64)
        layers += [l] * len(ids)
        units += ids
        offsets.append(start + len(ids))
    unit_layer = torch.tensor(layers, dtype=torch.int64)
    unit_index = torch.tensor(units, dtype=torch.int64)
    if whole_head:                                   # d_k scales per head unit, one per column unit
        ks = torch.arange(dk, dtype=torch.int64)
        scale_lhk = torch.stack([unit_layer.repeat_interleave(dk), unit_index.repeat_interleave(dk),
                                 ks.repeat(len(units))], dim=1)
    else:
        scale_lhk = torch.stack([unit_layer, unit_index // dk, unit_index % dk], dim=1)
    per_head = (unit_row >= 0).reshape(len(kept), heads, uph)
    kept_heads = torch.nonzero(per_head.any(dim=2).reshape(-1)).reshape(-1)
    local_heads = torch.nonzero((~per_head).any(dim=2).reshape(-1)).reshape(-1)
    index = StateIndex(unit_layer=unit_layer, unit_index=unit_index,
                       offsets=torch.tensor(offsets, dtype=torch.int64), unit_row=unit_row,
                       kept_heads=kept_heads, local_heads=local_heads,
                       scale_lhk=scale_lhk.reshape(-1, 3), heads=heads, units_per_head=uph, dk=dk,
                       unit_kind=unit_kind)
    return index.to(device)


def rank_kept_units(plan: Plan, tp_rank: int) -> list[list[int]]:
    """Per recurrent layer, the sorted kept unit ids of TP rank ``tp_rank`` of ``plan``, as ids on that rank.

    The one place the runtime maps a plan's ``LayerPlan.kept_units`` (original head numbering) to a
    rank's own ids ``j * units_per_head + k`` (j indexes the rank's ``[H/P, d_v, d_k]`` temporal
    state), through ``plan.tp.rank_kept_units`` (SGLang's contiguous head sharding, or the plan's
    compute-head permutation, App. B.1 (a)). Concatenated over layers this is the rank's packed
    (ragged) order.

    Returns:
        ``L`` lists of int unit ids, each ascending.
    Raises:
        ValueError: ``tp_rank`` outside ``[0, tp_size)`` (callers check first and raise
            DascInputError with their own message).
    """
    return plan.tp.rank_kept_units([list(layer.kept_units) for layer in plan.layers], tp_rank)


def build_state_index(plan: Plan, *, tp_rank: int = 0, device: torch.device | str = "cpu") -> StateIndex:
    """:class:`StateIndex` of TP rank ``tp_rank`` of ``plan`` (kernel tests and benchmarks; the
    runtime takes it from :attr:`RankLayout.index`).

    Raises:
        DascInputError: tp_rank outside ``[0, tp_size)``.
    """
    if not 0 <= tp_rank < plan.tp.tp_size:
        raise DascInputError(f"plan.json: tp_rank must lie in [0, {plan.tp.tp_size}), got {tp_rank}")
    return state_index_from_kept(rank_kept_units(plan, tp_rank), heads=plan.tp.heads_per_rank,
                                 unit_kind=plan.model.unit_kind, dk=plan.model.head_k_dim, device=device)


@dataclass(frozen=True, kw_only=True)
class RankLayout:
    """One rank's compressed-slot layout (frozen; built by :func:`build_rank_layout`).

    Attributes:
        spec: the model's :class:`~dasc_compile.schema.UnitSpec` (kind, d_v, d_k, dtypes, INT8).
        num_layers: L, recurrent layers of the served model (SGLang's mamba layer count).
        heads_per_rank: value heads on this rank (H_v / P); the temporal state is ``[H/P, d_v, d_k]``.
        units_per_layer: units of one layer on this rank (H/P for GDN, H/P * d_k for KDA).
        rank_units: per layer, sorted ids on the rank ``j * units_per_head + k`` of the kept units.
        offsets: ragged offsets, length L + 1 (``offsets[l]`` = first packed row of layer l).
        n_kept: packed (kept, global) units of this rank, ``offsets[-1]``.
        width: rows allocated per slot (``n_kept``, or ``slot_width`` with storage balancing).
        index: the kernels' :class:`StateIndex` (on the same device as ``kept_flat``).
        kept_flat: int64 ``[n_kept]``, flat unit ids in packed order.
        local_flat: int64 ``[L * units_per_layer - n_kept]``, flat ids of the omitted (local) units.
        storage: the plan's storage map when ``balance != off`` (units cross ranks), else None.
        tp_rank / tp_size: this rank and the TP degree the layout was built for.
    """

    spec: UnitSpec
    num_layers: int
    heads_per_rank: int
    units_per_layer: int
    rank_units: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    n_kept: int
    width: int
    index: StateIndex
    kept_flat: torch.Tensor
    local_flat: torch.Tensor
    storage: Optional[StorageMap]
    tp_rank: int
    tp_size: int

    @property
    def unit_kind(self) -> str:
        """``gdn_head`` | ``kda_column`` (``UnitSpec.kind``)."""
        return self.spec.kind

    @property
    def d_v(self) -> int:
        """Value dim of a head's temporal state ``[d_v, d_k]``."""
        return self.spec.d_v

    @property
    def d_k(self) -> int:
        """Key dim of a head's temporal state ``[d_v, d_k]``."""
        return self.spec.d_k

    @property
    def int8(self) -> bool:
        """Kept units are stored as symmetric INT8 with per-(layer, head, k) scales (App. E.1)."""
        return self.spec.int8

    @property
    def temporal_dtype(self) -> torch.dtype:
        """Torch dtype of the active temporal state (and of the INT8 scales)."""
        return torch_dtype(self.spec.temporal_dtype)

    @property
    def conv_dtype(self) -> torch.dtype:
        """Torch dtype of the conv state (stored whole in the pool)."""
        return torch_dtype(self.spec.conv_dtype)

    @property
    def unit_shape(self) -> tuple[int, ...]:
        """Shape of one stored unit: ``(d_v, d_k)`` for GDN, ``(d_v,)`` for KDA (``UnitSpec.unit_shape``)."""
        return self.spec.unit_shape

    @property
    def scale_shape(self) -> tuple[int, ...]:
        """Shape of one unit's INT8 scales in the pool: the unit's shape without its d_v axis (the
        scale is shared over d_v, Eq. 8): ``(d_k,)`` for GDN, ``()`` for KDA, as the kernels store them."""
        return self.spec.unit_shape[1:]

    @property
    def keeps_everything(self) -> bool:
        """True when no unit is omitted (the plan reproduces the dense temporal state)."""
        return self.local_flat.numel() == 0

    @property
    def device(self) -> torch.device:
        """Where the index tensors live."""
        return self.kept_flat.device

    def to(self, device) -> "RankLayout":
        """The same layout with its index tensors on ``device`` (``self`` when already there)."""
        dev = torch.device(device)
        if self.kept_flat.device == dev:
            return self
        return replace(self, index=self.index.to(dev), kept_flat=self.kept_flat.to(dev),
                       local_flat=self.local_flat.to(dev))


def build_rank_layout(plan: Plan, tp_rank: int, tp_size: int, num_layers: int | None = None, *,
                      device: torch.device | str = "cpu") -> RankLayout:
    """Build this rank's layout from ``plan`` (App. B Scheme 2 per rank; Fig. 9 (b) storage map).

    Args:
        plan: the loaded plan.
        tp_rank / tp_size: this process's attention-TP rank and degree.
        num_layers: recurrent layers the served model holds (checked against the plan), optional.
        device: where the index tensors go (the pool moves them to its own device once otherwise).
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
            f"launch with --tp-size {tp.tp_size}, or compile a plan for this server with dasc compile --tp {tp_size}")
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
    units = rank_kept_units(plan, tp_rank)
    index = state_index_from_kept(units, heads=tp.heads_per_rank, unit_kind=m.unit_kind, dk=m.head_k_dim)
    upl = tp.heads_per_rank * index.units_per_head
    offsets = tuple(index.offsets.tolist())
    kept = index.unit_layer * upl + index.unit_index            # flat id f = l * upl + u, packed order
    local = torch.nonzero(index.unit_row.reshape(-1) < 0).flatten()
    storage = tp.storage if tp.balance == "storage" else None
    layout = RankLayout(
        spec=UnitSpec.from_plan(plan), num_layers=L, heads_per_rank=tp.heads_per_rank, units_per_layer=upl,
        rank_units=tuple(tuple(x) for x in units), offsets=offsets, n_kept=offsets[-1],
        width=storage.slot_width if storage is not None else offsets[-1], index=index, kept_flat=kept,
        local_flat=local, storage=storage, tp_rank=tp_rank, tp_size=tp_size,
    )
    return layout.to(device)


def ragged_pool_shapes(constants: dict, *, num_slots: int, num_rows: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Shapes and dtype names of one rank's ragged pool with ``num_slots`` usable slots (+1 reserved).

    Args:
        constants: a kernel module's ``CONSTANTS`` (``Plan.kernels.constants``).
    Returns:
        ``{"comp_temporal": ..., "comp_q": ..., "comp_scale": ..., "comp_conv0": ...}``; the INT8
        entries only when ``constants["INT8"]``. Bytes per slot follow from these (App. C.1:
        payload + scales + conv).
    """
    c, slots = constants, num_slots + 1
    gdn = lookup_unit_kind(c["UNIT_KIND"]).whole_head
    unit = (c["DV"], c["DK"]) if gdn else (c["DV"],)
    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    if c["INT8"]:
        shapes["comp_q"] = ((slots, num_rows) + unit, "int8")
        shapes["comp_scale"] = ((slots, num_rows) + ((c["DK"],) if gdn else ()), c["SCALE_DTYPE"])
    else:
        shapes["comp_temporal"] = ((slots, num_rows) + unit, c["TEMPORAL_DTYPE"])
    for i in range(c["NUM_CONV"]):
        shapes[f"comp_conv{i}"] = ((c["NUM_LAYERS"], slots, c[f"CONV{i}_ROWS"], c[f"CONV{i}_COLS"]), c["CONV_DTYPE"])
    return shapes
