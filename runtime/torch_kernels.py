"""The state-checkpoint kernels written in plain PyTorch (same keyword signatures, same checks).

Each function mirrors a host wrapper of the rendered kernel module
(``templates/state_kernels.py.jinja``) and runs the same input checks
(``dasc_templates.checks``); the unit kind is read from the ragged pool's rank
(``[C+1, R, dv, dk]`` GDN head, ``[C+1, R, dv]`` KDA column). Tests compare the Triton kernels with
these bit for bit (copies, zero-fill) and with exact equality (INT8, Eq. 8). :func:`quantize_int8`
/ :func:`dequantize_int8` are also the one Eq. 8 implementation the runtime's
:class:`~dasc_runtime.ops.TorchOps` uses.

Layouts (SGLang 0.5.17): dense temporal ``[L, S+1, H, dv, dk]`` with dk fastest for GDN and
KDA alike (fla's KDA kernels address ``h*V*K + v*K + k``), so a KDA unit ``S[h, :, k]`` is
``temporal[l, s, h, :, k]``; conv tensors ``[L, S+1, *shape]`` are copied whole.
"""

from __future__ import annotations

from typing import Sequence

import torch

from dasc_compile.schema.units import UNIT_KINDS, lookup_unit_kind
from dasc_templates.checks import (PoolSpec, check_dense, check_head_list, check_ragged, check_scratch,
                                   check_slot_ids, check_temporal, check_unit_row, spec_from_tensors)

QMAX = 127           # Eq. 8: symmetric INT8 range [-QMAX, QMAX]
SCALE_FLOOR = 1e-8   # Eq. 8: lower bound on max |S| before dividing by QMAX


def _kept(unit_row: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(layer, unit, row) int64 ``[R]`` of every kept unit, in ragged-row order."""
    layer, unit = torch.nonzero(unit_row >= 0, as_tuple=True)
    rows = unit_row[layer, unit]
    order = torch.argsort(rows)
    return layer[order], unit[order], rows[order]


def _unit_view(spec: PoolSpec, temporal: torch.Tensor) -> torch.Tensor:
    """``temporal`` as ``[L, S+1, n_units, *unit_shape]`` (a copy for KDA: columns become rows)."""
    L, S = temporal.shape[:2]
    if lookup_unit_kind(spec.unit_kind).whole_head:
        return temporal
    return temporal.transpose(-1, -2).reshape(L, S, spec.heads * spec.dk, spec.dv)


def _write_units(spec: PoolSpec, temporal: torch.Tensor, layer: torch.Tensor, slot: torch.Tensor,
                 unit: torch.Tensor, values: torch.Tensor) -> None:
    """temporal[layer, slot, unit] = values (``[..., *unit_shape]``), broadcasting index tensors."""
    if lookup_unit_kind(spec.unit_kind).whole_head:
        temporal[layer, slot, unit] = values
    else:
        temporal[layer, slot, unit // spec.dk, :, unit % spec.dk] = values


def _checked(temporal, conv, comp, comp_conv, src_slots, dst_slots, unit_row, *, ragged_is_src, check_slots,
             comp_scale=None) -> PoolSpec:
    spec = spec_from_tensors(temporal, conv, comp)
    dense_slots = check_dense(spec, temporal, conv)
    comp_slots, _ = check_ragged(spec, comp, comp_conv, device=temporal.device,
                                 dtype=torch.int8 if comp_scale is not None else temporal.dtype,
                                 name="comp_q" if comp_scale is not None else "comp_temporal",
                                 comp_scale=comp_scale)
    check_unit_row(spec, unit_row, device=temporal.device)
    n = check_slot_ids("src_slots", src_slots, num_slots=comp_slots if ragged_is_src else dense_slots,
                       device=temporal.device, check_values=check_slots, destination=False)
    check_slot_ids("dst_slots", dst_slots, num_slots=dense_slots if ragged_is_src else comp_slots,
                   device=temporal.device, check_values=check_slots, destination=True, batch=n)
    return spec


def pack(*, temporal: torch.Tensor, conv: Sequence[torch.Tensor], src_slots: torch.Tensor,
         comp_temporal: torch.Tensor, comp_conv: Sequence[torch.Tensor], dst_slots: torch.Tensor,
         unit_row: torch.Tensor, kept_heads: torch.Tensor, check_slots: bool = True) -> None:
    """PyTorch ``pack``: ``comp_temporal[dst[n], row] = unit(temporal[l, src[n]], u)``; conv copied.

    Shapes as the kernel's ``pack``: temporal ``[L, S+1, H, dv, dk]``, comp_temporal
    ``[C+1, R, dv, dk]`` (GDN) or ``[C+1, R, dv]`` (KDA), conv / comp_conv lists of
    ``[L, S+1 | C+1, *shape]``, slots int64 ``[N]``, unit_row int64 ``[L, H*units_per_head]``;
    ``kept_heads`` (the kernel's work list) is only checked for shape, this copies
    every kept unit that ``unit_row`` names.

    Raises:
        ValueError: as the kernel's ``pack``.
    """
    spec = _checked(temporal, conv, comp_temporal, comp_conv, src_slots, dst_slots, unit_row,
                    ragged_is_src=False, check_slots=check_slots)
    check_head_list(spec, "kept_heads", kept_heads, device=temporal.device)
    layer, unit, rows = _kept(unit_row)
    units = _unit_view(spec, temporal)[layer[None, :], src_slots[:, None], unit[None, :]]   # [N, R, *unit]
    comp_temporal[dst_slots[:, None], rows[None, :]] = units
    for c, cc in zip(conv, comp_conv):
        cc[:, dst_slots] = c[:, src_slots]


def load(*, comp_temporal: torch.Tensor, comp_conv: Sequence[torch.Tensor], src_slots: torch.Tensor,
         temporal: torch.Tensor, conv: Sequence[torch.Tensor], dst_slots: torch.Tensor,
         unit_row: torch.Tensor, check_slots: bool = True) -> None:
    """PyTorch ``load`` (dasc-nr restore): zero the destination slots, scatter kept units, copy conv.

    Raises:
        ValueError: as the kernel's ``load``.
    """
    spec = _checked(temporal, conv, comp_temporal, comp_conv, src_slots, dst_slots, unit_row,
                    ragged_is_src=True, check_slots=check_slots)
    layer, unit, rows = _kept(unit_row)
    temporal[:, dst_slots] = 0
    values = comp_temporal[src_slots[:, None], rows[None, :]]                                 # [N, R, *unit]
    _write_units(spec, temporal, layer[None, :], dst_slots[:, None], unit[None, :], values)
    for c, cc in zip(conv, comp_conv):
        c[:, dst_slots] = cc[:, src_slots]


def refresh_copy(*, scratch: torch.Tensor, temporal: torch.Tensor, dst_slots: torch.Tensor,
                 unit_row: torch.Tensor, local_heads: torch.Tensor, check_slots: bool = True) -> None:
    """PyTorch ``refresh_copy`` (dasc-wr): ``temporal[l, dst[n], u] = scratch[l, n, u]`` for local units only.

    The unit kind cannot be read from a ragged pool here, so it follows ``unit_row``'s width:
    H columns (GDN heads) or H * dk columns (KDA columns).

    Raises:
        ValueError: as the kernel's ``refresh_copy``.
    """
    if not isinstance(temporal, torch.Tensor) or temporal.dim() != 5:
        raise ValueError(f"temporal must have shape [L, slots+1, H, dv, dk], got "
                         f"{list(temporal.shape) if isinstance(temporal, torch.Tensor) else type(temporal).__name__}")
    L, _, H, dv, dk = temporal.shape
    width = unit_row.shape[-1] if isinstance(unit_row, torch.Tensor) and unit_row.dim() == 2 else -1
    columns = width == H * dk and dk != 1                       # d_k units per head, else one
    kind = next(k.name for k in UNIT_KINDS.values() if k.whole_head != columns)
    spec = PoolSpec(num_layers=L, heads=H, dv=dv, dk=dk, unit_kind=kind, conv_shapes=(),
                    temporal_dtype=temporal.dtype)
    slots = check_temporal(spec, temporal)
    check_unit_row(spec, unit_row, device=temporal.device)
    n = check_slot_ids("dst_slots", dst_slots, num_slots=slots, device=temporal.device,
                       check_values=check_slots, destination=True)
    check_scratch(spec, scratch, batch=n, dtype=temporal.dtype, device=temporal.device)
    check_head_list(spec, "local_heads", local_heads, device=temporal.device)
    layer, unit = torch.nonzero(unit_row < 0, as_tuple=True)
    values = _unit_view(spec, scratch)[layer[None, :], torch.arange(n, device=scratch.device)[:, None], unit[None, :]]
    _write_units(spec, temporal, layer[None, :], dst_slots[:, None], unit[None, :], values)


def quantize_int8(units: torch.Tensor, *, scale_dtype: torch.dtype, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Paper Eq. 8 on kept units: symmetric INT8, one scale per (layer, head, k) over dv.

    Args:
        units: ``[..., dv, dk]`` (GDN heads) or ``[..., dv]`` (KDA columns), any float dtype.
        scale_dtype: storage dtype of the scale (the temporal dtype, App. E.1).
        kind: ``gdn_head`` | ``kda_column``.

    Returns:
        ``(q, s)``: q int8 of ``units``' shape; s ``[..., dk]`` (GDN) or ``[...]`` (KDA) at
        ``scale_dtype``. a = max_v |S|, s = max(a, 1e-8) / 127 in FP32 then rounded to
        scale_dtype, q = clip(round(S / s), -127, 127) with torch.round (half to even).

    Both divisions are correctly rounded IEEE FP32 divisions on every device, as in the kernels
    (``div_rn``). The divisor 127 is therefore a tensor, not a Python number: PyTorch's CUDA
    ``div`` turns division by a host scalar into multiplication by its FP32 reciprocal
    (aten/src/ATen/native/cuda/BinaryDivTrueKernel.cu), which differs from a / 127 in the last
    bit for about 4 % of the scales.
    """
    x = units.to(torch.float32)
    axis = -2 if lookup_unit_kind(kind).whole_head else -1       # the d_v axis of the unit
    amax = x.abs().amax(dim=axis, keepdim=True).clamp(min=SCALE_FLOOR)
    scale = torch.div(amax, torch.full_like(amax, QMAX)).to(scale_dtype)
    q = torch.round(x / scale.to(torch.float32)).clamp(-QMAX, QMAX).to(torch.int8)
    return q, scale.squeeze(axis)


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, *, kind: str, out_dtype: torch.dtype) -> torch.Tensor:
    """S_hat = q * s in FP32, cast to ``out_dtype`` (App. E.1: dequantised once on reuse)."""
    s = scale.to(torch.float32).unsqueeze(-2 if lookup_unit_kind(kind).whole_head else -1)
    return (q.to(torch.float32) * s).to(out_dtype)


def pack_int8(*, temporal: torch.Tensor, conv: Sequence[torch.Tensor], src_slots: torch.Tensor,
              comp_q: torch.Tensor, comp_scale: torch.Tensor, comp_conv: Sequence[torch.Tensor],
              dst_slots: torch.Tensor, unit_row: torch.Tensor, kept_heads: torch.Tensor,
              check_slots: bool = True) -> None:
    """PyTorch ``pack_int8`` (App. E.1, Eq. 8); shapes as the kernel's ``pack_int8``.

    Raises:
        ValueError: as the kernel's ``pack_int8``.
    """
    spec = _checked(temporal, conv, comp_q, comp_conv, src_slots, dst_slots, unit_row,
                    ragged_is_src=False, check_slots=check_slots, comp_scale=comp_scale)
    check_head_list(spec, "kept_heads", kept_heads, device=temporal.device)
    layer, unit, rows = _kept(unit_row)
    units = _unit_view(spec, temporal)[layer[None, :], src_slots[:, None], unit[None, :]]
    q, s = quantize_int8(units, scale_dtype=comp_scale.dtype, kind=spec.unit_kind)
    comp_q[dst_slots[:, None], rows[None, :]] = q
    comp_scale[dst_slots[:, None], rows[None, :]] = s
    for c, cc in zip(conv, comp_conv):
        cc[:, dst_slots] = c[:, src_slots]


def load_int8(*, comp_q: torch.Tensor, comp_scale: torch.Tensor, comp_conv: Sequence[torch.Tensor],
              src_slots: torch.Tensor, temporal: torch.Tensor, conv: Sequence[torch.Tensor],
              dst_slots: torch.Tensor, unit_row: torch.Tensor, check_slots: bool = True) -> None:
    """PyTorch ``load_int8``: zero the destination slots, write q * s for kept units, copy conv.

    Raises:
        ValueError: as the kernel's ``load_int8``.
    """
    spec = _checked(temporal, conv, comp_q, comp_conv, src_slots, dst_slots, unit_row,
                    ragged_is_src=True, check_slots=check_slots, comp_scale=comp_scale)
    layer, unit, rows = _kept(unit_row)
    temporal[:, dst_slots] = 0
    q = comp_q[src_slots[:, None], rows[None, :]]
    s = comp_scale[src_slots[:, None], rows[None, :]]
    values = dequantize_int8(q, s, kind=spec.unit_kind, out_dtype=temporal.dtype)
    _write_units(spec, temporal, layer[None, :], dst_slots[:, None], unit[None, :], values)
    for c, cc in zip(conv, comp_conv):
        c[:, dst_slots] = cc[:, src_slots]


__all__ = ["pack", "load", "refresh_copy", "pack_int8", "load_int8", "quantize_int8", "dequantize_int8",
           "QMAX", "SCALE_FLOOR"]
