"""Store / load between SGLang's active Mamba state and the compressed pool's tensors (paper §4.1-4.3, App. E.1).

Two implementations of one small interface, chosen by :func:`select_ops`:

* :class:`TorchOps`: plain PyTorch (index_select / index_copy) on CPU or GPU; the path used on
  CPU, with storage balancing (it stages the packed units for the all-to-all of
  :mod:`dasc_runtime.tp_transfer`), and under ``DASC_OPS=torch``;
* :class:`KernelOps`: the plan's generated Triton kernels (``dasc_runtime.kernel_loader``), when
  the plan directory holds a kernel module and the pool is on CUDA.

The pool calls them; they never call back into the pool (the dependency runs one way: pool ->
ops -> rank layout, TP transfer, PyTorch kernels). Every call gets the rank's
:class:`~dasc_runtime.rank_layout.RankLayout`, SGLang's ``MambaPool.mamba_cache`` (``cache``:
``temporal [L, M+1, H/P, d_v, d_k]``, ``conv``: list of ``[L, M+1, *conv_shape]``) and the pool's
:class:`CheckpointTensors`; slot tensors are int64 ``[N]`` on the pool device, ``rows`` are
compressed pool rows 1..C.

:class:`TorchOps` is built from, for a batch of N checkpoints:

* ``pack_units(layout, temporal, active_slots) -> units [N, n_kept, *unit]`` (temporal dtype):
  the kept (global) units of each active slot in ragged order;
* ``unpack_units(layout, temporal, dst_slots, units)``: dasc-nr restore, kept units written
  exactly, local units zero, every layer of each ``dst`` slot rewritten;
* ``quantize`` / ``dequantize``: App. E.1 Eq. 8 through
  :func:`dasc_runtime.torch_kernels.quantize_int8` / ``dequantize_int8`` (one implementation).

``unit`` is ``(d_v, d_k)`` (GDN head) or ``(d_v,)`` (KDA column ``S[h, :, k]``). The pool's layout
holds its index tensors on the pool device (moved once when the pool is built), so a store / load
copies no indices; the ``.to`` below is then a no-op, kept for callers that pass a host layout
(benchmarks, tests).
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple, Optional

import torch

from dasc_compile.schema import DascInputError
from dasc_runtime.rank_layout import RankLayout
from dasc_runtime.torch_kernels import QMAX, SCALE_FLOOR, dequantize_int8, quantize_int8

__all__ = ["CheckpointTensors", "TorchOps", "KernelOps", "select_ops", "flat_units", "unflat_units",
           "QMAX", "SCALE_FLOOR"]

logger = logging.getLogger(__name__)


class CheckpointTensors(NamedTuple):
    """The compressed pool's storage (slot 0 reserved).

    Attributes:
        temporal: ``[C+1, width, *unit]`` in the temporal dtype, or the INT8 payload (int8).
        scale: ``[C+1, width, *scale_shape]`` INT8 scales in the temporal dtype, or None.
        conv: one ``[L, C+1, *conv_shape]`` tensor per SGLang conv tensor, in the conv dtype.
    """

    temporal: torch.Tensor
    scale: Optional[torch.Tensor]
    conv: list


def flat_units(layout: RankLayout, states: torch.Tensor) -> torch.Tensor:
    """``[L, N, H, d_v, d_k]`` -> ``[N, L * units_per_layer, *unit]``, flat unit id ``f`` on dim 1.

    Through ``UnitSpec.units_view`` (a copy when units are KDA columns, strided in memory).
    """
    n = states.shape[1]
    rows = layout.spec.units_view(states.transpose(0, 1))                  # [N, L, H * U, unit_elems]
    return rows.reshape(n, -1, *layout.unit_shape)


def unflat_units(layout: RankLayout, flat: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`flat_units`: ``[N, L * units_per_layer, *unit]`` -> ``[L, N, H, d_v, d_k]``."""
    n, spec = flat.shape[0], layout.spec
    rows = flat.reshape(n, layout.num_layers, layout.units_per_layer, spec.unit_elems)
    return spec.state_from_units(rows).transpose(0, 1)


class TorchOps:
    """Plain-PyTorch store/load (see module docstring for shapes).

    Args:
        tp_group: process group of the storage-balancing all-to-all (``layout.storage``; default:
            the world group); unused without storage balancing.
    """

    name = "torch"

    def __init__(self, *, tp_group=None) -> None:
        self.tp_group = tp_group

    def store(self, layout: RankLayout, cache, src_slots: torch.Tensor, rows: torch.Tensor,
              ckpt: CheckpointTensors) -> None:
        """Pack ``cache`` slots ``src_slots`` into ``ckpt`` rows ``rows`` (all layers, conv whole)."""
        units = self.pack_units(layout, cache.temporal, src_slots)            # [N, n_kept, *unit]
        if layout.int8:
            q, s = self.quantize(layout, units)
            self._write_rows(layout, ckpt.temporal, rows, q)
            self._write_rows(layout, ckpt.scale, rows, s)
        else:
            self._write_rows(layout, ckpt.temporal, rows, units.to(ckpt.temporal.dtype))
        for c, pc in zip(cache.conv, ckpt.conv):
            pc.index_copy_(1, rows, c.index_select(1, src_slots).to(pc.dtype))

    def load(self, layout: RankLayout, cache, rows: torch.Tensor, dst_slots: torch.Tensor,
             ckpt: CheckpointTensors) -> None:
        """dasc-nr restore of ``ckpt`` rows ``rows`` into ``cache`` slots ``dst_slots`` (all layers)."""
        if layout.int8:
            units = self.dequantize(layout, self._read_rows(layout, ckpt.temporal, rows),
                                    self._read_rows(layout, ckpt.scale, rows))
        else:
            units = self._read_rows(layout, ckpt.temporal, rows)
        self.unpack_units(layout, cache.temporal, dst_slots, units)
        for c, pc in zip(cache.conv, ckpt.conv):
            c.index_copy_(1, dst_slots, pc.index_select(1, rows).to(c.dtype))

    def _write_rows(self, layout: RankLayout, store: torch.Tensor, rows: torch.Tensor, packed: torch.Tensor) -> None:
        """Write packed units ``[N, n_kept, ...]`` into ``store`` rows (through storage balancing if planned)."""
        smap = layout.storage
        if smap is None:
            store.index_copy_(0, rows, packed)
            return
        from dasc_runtime.tp_transfer import store_all_to_all

        n = packed.shape[0]
        out = torch.zeros((layout.width, n, *packed.shape[2:]), dtype=packed.dtype, device=packed.device)
        store_all_to_all(packed.transpose(0, 1).contiguous(), smap, layout.tp_rank, group=self.tp_group, out=out)
        store.index_copy_(0, rows, out.transpose(0, 1).contiguous())

    def _read_rows(self, layout: RankLayout, store: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Packed units ``[N, n_kept, ...]`` of ``store`` rows (inverse of :meth:`_write_rows`)."""
        got = store.index_select(0, rows)
        smap = layout.storage
        if smap is None:
            return got
        from dasc_runtime.tp_transfer import load_all_to_all

        out = load_all_to_all(got.transpose(0, 1).contiguous(), smap, layout.tp_rank, group=self.tp_group)
        return out.transpose(0, 1)

    def pack_units(self, layout: RankLayout, temporal: torch.Tensor, active_slots: torch.Tensor) -> torch.Tensor:
        """Kept units of ``active_slots``: ``[N, n_kept, *unit]`` in the temporal dtype (ragged order)."""
        states = temporal.index_select(1, active_slots)                      # [L, N, H, dv, dk]
        flat = flat_units(layout, states)
        return flat.index_select(1, layout.kept_flat.to(flat.device))     # no-op for the pool's layout

    def unpack_units(self, layout: RankLayout, temporal: torch.Tensor, dst_slots: torch.Tensor,
                     units: torch.Tensor) -> None:
        """dasc-nr restore into ``dst_slots``: kept units from ``units [N, n_kept, *unit]``, local units 0."""
        n = dst_slots.numel()
        full = torch.zeros((n, layout.num_layers * layout.units_per_layer, *layout.unit_shape),
                           dtype=temporal.dtype, device=temporal.device)
        full.index_copy_(1, layout.kept_flat.to(full.device), units.to(temporal.dtype))
        temporal.index_copy_(1, dst_slots, unflat_units(layout, full).contiguous())

    @staticmethod
    def quantize(layout: RankLayout, units: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 8 on ``units [N, n, *unit]``: returns ``(q int8 [N, n, *unit], scale [N, n, *scale_shape])``.

        GDN head units ``[d_v, d_k]`` reduce over d_v -> one scale per k (``[N, n, d_k]``); a KDA
        column ``[d_v]`` gets one scale (``[N, n]``). Scales are stored in ``layout.temporal_dtype``.
        Delegates to :func:`dasc_runtime.torch_kernels.quantize_int8` (true IEEE division by 127 on
        every device).
        """
        return quantize_int8(units, scale_dtype=layout.temporal_dtype, kind=layout.unit_kind)

    @staticmethod
    def dequantize(layout: RankLayout, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """``q * s`` in FP32, cast to ``layout.temporal_dtype`` (inverse of :meth:`quantize`)."""
        return dequantize_int8(q, scale, kind=layout.unit_kind, out_dtype=layout.temporal_dtype)


class KernelOps(TorchOps):
    """The plan's generated Triton kernels (``templates/state_kernels.py.jinja``) behind the same interface.

    One launch moves all layers (and the conv state) of a batch of slots; the kernels read the
    layout's :attr:`~dasc_runtime.rank_layout.RankLayout.index` (``unit_row``, ``kept_heads``).
    Storage balancing (``layout.storage``) needs the units staged for the all-to-all, so such
    layouts take the :class:`TorchOps` path.

    Args:
        module: the plan's kernel module (``dasc_runtime.kernel_loader.load_plan_kernels``).
        tp_group: as :class:`TorchOps`.
    """

    name = "kernels"

    def __init__(self, module, *, tp_group=None) -> None:
        super().__init__(tp_group=tp_group)
        self.module = module

    def store(self, layout: RankLayout, cache, src_slots: torch.Tensor, rows: torch.Tensor,
              ckpt: CheckpointTensors) -> None:
        """``pack`` / ``pack_int8`` of the plan's kernels: one launch for every layer and the conv state."""
        if layout.storage is not None:
            return super().store(layout, cache, src_slots, rows, ckpt)
        m, ix = self.module, layout.index
        if layout.int8:
            m.pack_int8(temporal=cache.temporal, conv=list(cache.conv), src_slots=src_slots, comp_q=ckpt.temporal,
                        comp_scale=ckpt.scale, comp_conv=ckpt.conv, dst_slots=rows, unit_row=ix.unit_row,
                        kept_heads=ix.kept_heads, check_slots=False)
        else:
            m.pack(temporal=cache.temporal, conv=list(cache.conv), src_slots=src_slots, comp_temporal=ckpt.temporal,
                   comp_conv=ckpt.conv, dst_slots=rows, unit_row=ix.unit_row, kept_heads=ix.kept_heads,
                   check_slots=False)

    def load(self, layout: RankLayout, cache, rows: torch.Tensor, dst_slots: torch.Tensor,
             ckpt: CheckpointTensors) -> None:
        """``load`` / ``load_int8`` of the plan's kernels (dasc-nr: local units zero), one launch."""
        if layout.storage is not None:
            return super().load(layout, cache, rows, dst_slots, ckpt)
        m, ix = self.module, layout.index
        if layout.int8:
            m.load_int8(comp_q=ckpt.temporal, comp_scale=ckpt.scale, comp_conv=ckpt.conv, src_slots=rows,
                        temporal=cache.temporal, conv=list(cache.conv), dst_slots=dst_slots, unit_row=ix.unit_row,
                        check_slots=False)
        else:
            m.load(comp_temporal=ckpt.temporal, comp_conv=ckpt.conv, src_slots=rows, temporal=cache.temporal,
                   conv=list(cache.conv), dst_slots=dst_slots, unit_row=ix.unit_row, check_slots=False)


def ops_mode() -> str:
    """``DASC_OPS``: ``auto`` (default: kernels where they apply, else PyTorch) or ``torch`` (always PyTorch).

    Raises:
        DascInputError: any other value.
    """
    mode = os.environ.get("DASC_OPS", "").strip().lower() or "auto"
    if mode not in ("auto", "torch"):
        raise DascInputError(f"DASC_OPS: expected 'auto' or 'torch', got {mode!r}")
    return mode


def select_ops(plan, plan_dir, layout: RankLayout, device: torch.device | str, *, interpret: bool = False,
               tp_group=None) -> TorchOps:
    """The ops for a pool on ``device``.

    The plan's generated kernels when the pool is on CUDA (or ``interpret`` asks for Triton's CPU
    interpreter), the plan directory holds its kernel module and storage balancing is off; the
    PyTorch path otherwise (always exact), or when ``DASC_OPS=torch`` is set.

    Args:
        tp_group: the attention-TP device group for storage balancing (see :class:`TorchOps`).
    Raises:
        DascInputError: the plan names a kernel module that does not load (stale or foreign file),
            or ``DASC_OPS`` has an unknown value.
    """
    dev = torch.device(device)
    if ops_mode() == "torch":
        logger.info("dasc: DASC_OPS=torch: using the PyTorch store/load")
        return TorchOps(tp_group=tp_group)
    if plan is None or plan_dir is None or plan.kernels is None or (dev.type != "cuda" and not interpret):
        return TorchOps(tp_group=tp_group)
    if layout.storage is not None:
        logger.info("dasc: storage balancing stages units for the all-to-all; using the PyTorch store/load")
        return TorchOps(tp_group=tp_group)
    from dasc_runtime.kernel_loader import load_plan_kernels

    return KernelOps(load_plan_kernels(plan_dir, plan.kernels, interpret=interpret), tp_group=tp_group)
