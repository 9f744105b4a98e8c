# Input checks shared by the rendered kernel modules and the plain-PyTorch reference.
#
# This file is a normal Python module (``dasc_templates.checks``, imported by
# ``dasc_runtime.reference``) and is also pasted verbatim into every rendered kernel module by
# ``state_kernels.py.jinja``, so that a module in a plan directory imports nothing from dasc.
# Keep it free of Jinja delimiters (two opening braces, brace-percent, brace-hash) and of
# ``from __future__`` imports; it is part of the kernel cache key.
#
# Layouts checked here (SGLang 0.5.17 ``MambaPool`` and dasc's ragged pool, DESIGN.md):
#   dense temporal     [L, S+1, H, dv, dk]   any strides on L and S, [H, dv, dk] row-major
#   dense conv i       [L, S+1, *shape_i]    any strides on L and S, shape_i row-major
#   ragged temporal    [C+1, R, dv, dk] (gdn_head, mamba2_head) or [C+1, R, dv] (kda_column)
#   ragged INT8 scales [C+1, R, dk]     (gdn_head, mamba2_head) or [C+1, R]     (kda_column)
#   ragged conv i      [L, C+1, *shape_i]    (same as the dense conv tensor, fewer slots)
#   scratch            [L, N, H, dv, dk]     (dasc-wr refresh source)
#   unit_row           int64 [L, H * units_per_head], ragged row of each unit or -1 (local)
# Slot 0 of every pool is SGLang's reserved padding slot and is never read or written here.

import dataclasses
import math
from typing import Optional, Sequence, Tuple

import torch

MAX_BATCH = 65535  # the slot batch runs on grid axis 1 of every launch
# Unit kinds whose unit is a whole head state [dv, dk]: a copy of UnitKind.whole_head in
# dasc_compile/schema/units.py (this file imports nothing from dasc; tests/kernels checks the two agree).
WHOLE_HEAD_KINDS = ("gdn_head", "mamba2_head")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PoolSpec:
    """What one rank's state pools must look like.

    Attributes:
        num_layers: L, recurrent layers. heads: H, value heads on this rank.
        dv / dk: value and key dims of one head's state ``[dv, dk]``.
        unit_kind: ``gdn_head`` / ``mamba2_head`` (unit = head, ``[dv, dk]``) or ``kda_column``
            (unit = column ``S[h, :, k]``, ``[dv]``).
        conv_shapes: inner shape of each conv tensor (``MambaPool.State.conv`` order).
        temporal_dtype / conv_dtype / scale_dtype: expected dtypes; ``None`` skips the check.
    """

    num_layers: int
    heads: int
    dv: int
    dk: int
    unit_kind: str
    conv_shapes: Tuple[Tuple[int, ...], ...]
    temporal_dtype: Optional[torch.dtype] = None
    conv_dtype: Optional[torch.dtype] = None
    scale_dtype: Optional[torch.dtype] = None

    @property
    def whole_head(self) -> bool:
        """A unit is a head's whole ``[dv, dk]`` state (every kind but ``kda_column``)."""
        return self.unit_kind in WHOLE_HEAD_KINDS

    @property
    def units_per_head(self) -> int:
        return 1 if self.whole_head else self.dk

    @property
    def unit_shape(self) -> Tuple[int, ...]:
        return (self.dv, self.dk) if self.whole_head else (self.dv,)

    @property
    def scale_shape(self) -> Tuple[int, ...]:
        """Per-row INT8 scale shape: one scale per (layer, head, k), shared over dv (Eq. 8)."""
        return (self.dk,) if self.whole_head else ()


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _check_tensor(name: str, t, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} must be on {device} like the other pools, got {t.device}")


def _check_dtype(name: str, t: torch.Tensor, dtype: Optional[torch.dtype]) -> None:
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} must have dtype {dtype}, got {t.dtype}")


def _check_rows_contiguous(name: str, t: torch.Tensor, lead: int, what: str) -> None:
    """Axes ``lead:`` must be row-major contiguous; the leading axes may have any positive stride."""
    shape, strides = t.shape, t.stride()
    expect = 1
    for axis in range(len(shape) - 1, lead - 1, -1):
        if shape[axis] != 1 and strides[axis] != expect:
            raise ValueError(
                f"{name} must have contiguous {what} (only the first {lead} axes may be strided), "
                f"got strides {list(strides)} for shape {_shape(t)}")
        expect *= shape[axis]
    for axis in range(lead):
        if shape[axis] > 1 and strides[axis] <= 0:
            raise ValueError(f"{name} must have a positive stride on axis {axis}, got {list(strides)}")


def check_temporal(spec: PoolSpec, temporal, *, name: str = "temporal") -> int:
    """Check an active temporal pool ``[L, S+1, H, dv, dk]``; returns its slot count S+1."""
    _check_tensor(name, temporal, None)
    want = (spec.num_layers, None, spec.heads, spec.dv, spec.dk)
    if temporal.dim() != 5 or any(w is not None and w != s for w, s in zip(want, temporal.shape)):
        raise ValueError(
            f"{name} must have shape [L={spec.num_layers}, slots+1, H={spec.heads}, "
            f"dv={spec.dv}, dk={spec.dk}], got {_shape(temporal)}")
    _check_dtype(name, temporal, spec.temporal_dtype)
    _check_rows_contiguous(name, temporal, 2, "[H, dv, dk] rows")
    return temporal.shape[1]


def check_dense(spec: PoolSpec, temporal, conv) -> int:
    """Check an active (SGLang ``MambaPool``) pool, temporal and conv; returns its slot count S+1."""
    slots = check_temporal(spec, temporal)
    check_conv(spec, conv, slots, name="conv", device=temporal.device)
    return slots


def check_conv(spec: PoolSpec, conv, slots: Optional[int], *, name: str, device) -> int:
    """Check a list of conv tensors ``[L, slots, *shape_i]``; returns the slot count."""
    if not isinstance(conv, (list, tuple)):
        raise ValueError(f"{name} must be a list of conv tensors, got {type(conv).__name__}")
    if len(conv) != len(spec.conv_shapes):
        raise ValueError(f"{name} must hold {len(spec.conv_shapes)} tensor(s), got {len(conv)}")
    for i, (c, inner) in enumerate(zip(conv, spec.conv_shapes)):
        cname = f"{name}[{i}]"
        _check_tensor(cname, c, device)
        if c.dim() != 2 + len(inner) or c.shape[0] != spec.num_layers or tuple(c.shape[2:]) != tuple(inner):
            dims = ", ".join(str(d) for d in inner)
            raise ValueError(f"{cname} must have shape [L={spec.num_layers}, slots+1, {dims}], got {_shape(c)}")
        if slots is None:
            slots = c.shape[1]
        elif c.shape[1] != slots:
            raise ValueError(f"{cname} must have {slots} slots like the temporal pool, got {c.shape[1]}")
        _check_dtype(cname, c, spec.conv_dtype)
        _check_rows_contiguous(cname, c, 2, "per-slot conv rows")
    return slots if slots is not None else 0


def check_ragged(spec: PoolSpec, comp_temporal, comp_conv, *, dtype: Optional[torch.dtype],
                 device, name: str = "comp_temporal", comp_scale=None) -> Tuple[int, int]:
    """Check a compressed pool; returns (slot count C+1, ragged rows R)."""
    _check_tensor(name, comp_temporal, device)
    unit = spec.unit_shape
    if comp_temporal.dim() != 2 + len(unit) or tuple(comp_temporal.shape[2:]) != unit:
        dims = "dv={}, dk={}".format(*unit) if len(unit) == 2 else f"dv={unit[0]}"
        raise ValueError(
            f"{name} must have shape [slots+1, R, {dims}] ({spec.unit_kind} units), got {_shape(comp_temporal)}")
    _check_dtype(name, comp_temporal, dtype)
    _check_rows_contiguous(name, comp_temporal, 1, "ragged rows")
    slots, rows = comp_temporal.shape[0], comp_temporal.shape[1]
    if comp_scale is not None:
        _check_tensor("comp_scale", comp_scale, device)
        want = (slots, rows) + spec.scale_shape
        if tuple(comp_scale.shape) != want:
            raise ValueError(f"comp_scale must have shape {list(want)} (one scale per kept (layer, head, k)), "
                             f"got {_shape(comp_scale)}")
        if not comp_scale.dtype.is_floating_point:
            raise ValueError(f"comp_scale must have a floating dtype, got {comp_scale.dtype}")
        _check_dtype("comp_scale", comp_scale, spec.scale_dtype)
        _check_rows_contiguous("comp_scale", comp_scale, 1, "per-slot scales")
    check_conv(spec, comp_conv, slots, name="comp_conv", device=device)
    return slots, rows


def check_unit_row(spec: PoolSpec, unit_row, *, device) -> None:
    """``unit_row`` int64 ``[L, H * units_per_head]``, contiguous (values are checked when built)."""
    _check_tensor("unit_row", unit_row, device)
    want = (spec.num_layers, spec.heads * spec.units_per_head)
    if tuple(unit_row.shape) != want:
        raise ValueError(f"unit_row must have shape [L, H * units_per_head] = {list(want)}, got {_shape(unit_row)}")
    if unit_row.dtype != torch.int64:
        raise ValueError(f"unit_row must have dtype torch.int64, got {unit_row.dtype}")
    if not unit_row.is_contiguous():
        raise ValueError("unit_row must be contiguous, got strides " + str(list(unit_row.stride())))


def check_head_list(spec: PoolSpec, name: str, heads, *, device) -> int:
    """A head work list: int64 ``[P]`` flat head ids ``l * H + h`` (values are checked when built)."""
    _check_tensor(name, heads, device)
    if heads.dim() != 1 or heads.dtype != torch.int64 or not heads.is_contiguous():
        raise ValueError(f"{name} must be a contiguous 1-D torch.int64 tensor of flat head ids l * H + h, "
                         f"got {heads.dtype} of shape {_shape(heads)}")
    if heads.shape[0] > spec.num_layers * spec.heads:
        raise ValueError(f"{name} must hold at most L * H = {spec.num_layers * spec.heads} ids, got {heads.shape[0]}")
    return heads.shape[0]


def check_slot_ids(name: str, slots, *, num_slots: int, device, check_values: bool,
                destination: bool, batch: Optional[int] = None) -> int:
    """Slot ids: int64 ``[N]`` on ``device``; values in ``[1, num_slots - 1]``, destinations unique.

    The value checks copy the ids to the host (one synchronisation); pass
    ``check_values=False`` on hot paths whose ids come from SGLang's allocators.
    """
    _check_tensor(name, slots, device)
    if slots.dim() != 1 or slots.dtype != torch.int64:
        raise ValueError(f"{name} must be a 1-D torch.int64 tensor, got {slots.dtype} of shape {_shape(slots)}")
    n = slots.shape[0]
    if n < 1 or n > MAX_BATCH:
        raise ValueError(f"{name} must hold 1..{MAX_BATCH} slot ids, got {n}")
    if batch is not None and n != batch:
        raise ValueError(f"{name} must hold {batch} slot ids (one per source), got {n}")
    if not slots.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got stride {slots.stride(0)}")
    if check_values:
        values = slots.tolist()
        bad = [v for v in values if v < 1 or v >= num_slots]
        if bad:
            raise ValueError(f"{name} must hold slot ids in [1, {num_slots - 1}] (slot 0 is reserved), got {bad[:8]}")
        if destination and len(set(values)) != len(values):
            seen, rep = set(), []
            for v in values:
                if v in seen:
                    rep.append(v)
                seen.add(v)
            raise ValueError(f"{name} must not repeat a destination slot, got repeated {sorted(set(rep))[:8]}")
    return n


def check_scratch(spec: PoolSpec, scratch, *, batch: int, dtype: Optional[torch.dtype], device) -> None:
    """dasc-wr scratch state ``[L, N, H, dv, dk]``; any strides on L and N, rows contiguous."""
    _check_tensor("scratch", scratch, device)
    want = (spec.num_layers, batch, spec.heads, spec.dv, spec.dk)
    if tuple(scratch.shape) != want:
        raise ValueError(f"scratch must have shape [L, N, H, dv, dk] = {list(want)}, got {_shape(scratch)}")
    _check_dtype("scratch", scratch, dtype)
    _check_rows_contiguous("scratch", scratch, 2, "[H, dv, dk] rows")


def spec_from_tensors(temporal, conv, comp_temporal) -> PoolSpec:
    """Infer a :class:`PoolSpec` from tensor shapes (used by the reference ops).

    The unit kind follows the ragged pool's rank: 4-D ``[C+1, R, dv, dk]`` is ``gdn_head``,
    3-D ``[C+1, R, dv]`` is ``kda_column``.
    """
    _check_tensor("temporal", temporal, None)
    if temporal.dim() != 5:
        raise ValueError(f"temporal must have shape [L, slots+1, H, dv, dk], got {_shape(temporal)}")
    _check_tensor("comp_temporal", comp_temporal, None)
    if comp_temporal.dim() not in (3, 4):
        raise ValueError(f"comp_temporal must have shape [slots+1, R, dv, dk] or [slots+1, R, dv], "
                         f"got {_shape(comp_temporal)}")
    if not isinstance(conv, (list, tuple)):
        raise ValueError(f"conv must be a list of conv tensors, got {type(conv).__name__}")
    L, _, H, dv, dk = temporal.shape
    kind = "gdn_head" if comp_temporal.dim() == 4 else "kda_column"
    shapes = tuple(tuple(int(s) for s in c.shape[2:]) if isinstance(c, torch.Tensor) else () for c in conv)
    return PoolSpec(num_layers=L, heads=H, dv=dv, dk=dk, unit_kind=kind, conv_shapes=shapes,
                    temporal_dtype=temporal.dtype,
                    conv_dtype=conv[0].dtype if conv and isinstance(conv[0], torch.Tensor) else None)


def element_count(shape: Sequence[int]) -> int:
    return int(math.prod(shape))
