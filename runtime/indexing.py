"""Small index tensors that drive the state-checkpoint kernels (paper §4.1, App. B Scheme 2).

A plan's per-layer kept-unit lists become, for one TP rank:

* ``unit_layer`` / ``unit_index`` int64 ``[R]``: ragged row j holds unit ``unit_index[j]``
  (rank-local flat id ``u = h * units_per_head + k``) of recurrent layer ``unit_layer[j]``;
  rows are layer-major and sorted by unit id inside a layer;
* ``offsets`` int64 ``[L+1]``: ragged offsets o_0 = 0, o_l = o_(l-1) + r_l (layer l owns rows
  ``[o_(l-1), o_l)``);
* ``unit_row`` int64 ``[L, H * units_per_head]``: the inverse map, ragged row of each unit or
  -1 for a local (omitted) unit. This is the tensor every kernel reads;
* ``kept_heads`` / ``local_heads`` int64: flat ids ``l * H + h`` of the heads holding at least one
  kept / local unit, ascending: the work lists of ``pack`` (and ``pack_int8``) and of
  ``refresh_copy``, so that no program is launched for a head it would skip;
* the INT8 scale layout (App. E.1): per ragged slot the scales are ``[R, dk]`` (GDN head: one
  per k of the kept head) or ``[R]`` (KDA column: one per kept column); ``scale_lhk`` int64
  ``[n_scales, 3]`` names the (layer, rank-local head, k) of every scale in storage order.

Heads are sharded contiguously over TP ranks as SGLang does (rank r holds value heads
``[r*H_r, (r+1)*H_r)``), or as the plan's compute-head permutation says (App. B.1 (a)).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import torch

from dasc_compile.schema import DascInputError, Plan


@dataclass(frozen=True, kw_only=True)
class StateIndex:
    """Index tensors of one rank (see module docstring); all int64 and on one device.

    Attributes:
        unit_layer / unit_index: ``[R]``. offsets: ``[L+1]``. unit_row: ``[L, H * units_per_head]``.
        kept_heads / local_heads: ``[P]`` flat head ids ``l * H + h`` with a kept / local unit.
        scale_lhk: ``[n_scales, 3]`` (layer, head, k) of each INT8 scale in storage order.
        heads: H on this rank. units_per_head: 1 (GDN) or d_k (KDA). dk: key dim.
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
        return self.unit_row.shape[0]

    @property
    def num_rows(self) -> int:
        """R = sum_l r_l, ragged rows per slot on this rank."""
        return self.unit_layer.shape[0]

    @property
    def scale_shape(self) -> tuple[int, ...]:
        """Per-slot INT8 scale shape: ``(R, dk)`` (GDN) or ``(R,)`` (KDA)."""
        return (self.num_rows, self.dk) if self.unit_kind == "gdn_head" else (self.num_rows,)

    def to(self, device) -> "StateIndex":
        return replace(self, **{f: getattr(self, f).to(device) for f in
                                ("unit_layer", "unit_index", "offsets", "unit_row", "kept_heads",
                                 "local_heads", "scale_lhk")})


def state_index_from_kept(kept: Sequence[Sequence[int]], *, heads: int, unit_kind: str, dk: int,
                          device: torch.device | str = "cpu") -> StateIndex:
    """Build a :class:`StateIndex` from rank-local kept units per layer.

    Args:
        kept: for each recurrent layer, the rank-local flat unit ids kept (any order, no repeats),
            each in ``[0, heads * units_per_head)``.
        heads: H on this rank. unit_kind: ``gdn_head`` | ``kda_column``. dk: key dim d_k.

    Raises:
        DascInputError: a unit id out of range or repeated within a layer.
    """
    if unit_kind not in ("gdn_head", "kda_column"):
        raise DascInputError(f"state index: unit_kind must be gdn_head or kda_column, got {unit_kind!r}")
    uph = 1 if unit_kind == "gdn_head" else dk
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
    if unit_kind == "gdn_head":
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


def build_state_index(plan: Plan, *, tp_rank: int = 0, device: torch.device | str = "cpu") -> StateIndex:
    """:class:`StateIndex` of TP rank ``tp_rank`` of ``plan``.

    The rank-local kept units come from ``plan.tp.rank_local_units`` (SGLang's contiguous head
    sharding, or the compute-head permutation of App. B.1 (a) when the plan has one), so the
    ragged order is the rank's packing order that storage balancing (Fig. 9 (b)) indexes.

    Raises:
        DascInputError: tp_rank outside ``[0, tp_size)``.
    """
    if not 0 <= tp_rank < plan.tp.tp_size:
        raise DascInputError(f"plan.json: tp_rank must lie in [0, {plan.tp.tp_size}), got {tp_rank}")
    return state_index_from_kept(rank_kept_units(plan, tp_rank), heads=plan.tp.heads_per_rank,
                                 unit_kind=plan.model.unit_kind, dk=plan.model.head_k_dim, device=device)


def rank_kept_units(plan: Plan, tp_rank: int) -> list[list[int]]:
    """Per recurrent layer, the sorted rank-local kept unit ids of TP rank ``tp_rank`` of ``plan``.

    The one place the runtime maps a plan's ``LayerPlan.kept_units`` (original head numbering) to a
    rank's local ids ``j * units_per_head + k`` (j indexes the rank's ``[H/P, d_v, d_k]`` temporal
    state), through ``plan.tp.rank_local_units`` (SGLang's contiguous head sharding, or the plan's
    compute-head permutation, App. B.1 (a)). Concatenated over layers this is the rank's packed
    (ragged) order; :func:`build_state_index` and ``dasc_runtime.pool_layout.rank_layout`` both
    build on it.

    Returns:
        ``L`` lists of int unit ids, each ascending.
    Raises:
        ValueError: ``tp_rank`` outside ``[0, tp_size)`` (callers check first and raise
            DascInputError with their own message).
    """
    return plan.tp.rank_local_units([list(layer.kept_units) for layer in plan.layers], tp_rank)


def ragged_pool_shapes(constants: dict, *, num_slots: int, num_rows: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Shapes and dtype names of one rank's ragged pool with ``num_slots`` usable slots (+1 reserved).

    Returns ``{"comp_temporal": ..., "comp_q": ..., "comp_scale": ..., "comp_conv0": ...}``;
    the INT8 entries only when ``constants["INT8"]``. Bytes per slot follow from these
    (App. C.1: payload + scales + conv).
    """
    c, slots = constants, num_slots + 1
    gdn = c["UNIT_KIND"] == "gdn_head"
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
