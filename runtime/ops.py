"""Store / load between SGLang's active Mamba state and the compressed pool (paper §4.1-4.2, App. E.1).

Two implementations of one small interface, chosen by :func:`select_ops`:

* :class:`ReferenceOps`: plain PyTorch (index_select / index_copy), runs on CPU and GPU. It is the
  runtime's reference and the path used on CPU.
* the plan's generated Triton kernels (``dasc_runtime.kernel_loader``), wrapped by
  :class:`KernelOps` when the plan directory holds a kernel module and the pool is on CUDA.

Both implement ``store(pool, cache, src_slots, rows)`` and ``load(pool, cache, rows, dst_slots)``
(``cache`` is SGLang's ``MambaPool.mamba_cache``, ``rows`` are compressed pool rows 1..C). The
reference builds them from, for a batch of N checkpoints:

* ``pack_units(layout, temporal, active_slots) -> units [N, n_local, *unit]`` (temporal dtype):
  the kept (global) units of each active slot in ragged order.
* ``unpack_units(layout, temporal, dst_slots, units)``: dasc-nr restore, kept units written
  exactly, local units zero, every layer of each ``dst`` slot rewritten.
* ``quantize`` / ``dequantize``: App. E.1 Eq. 8, symmetric INT8 in ``[-127, 127]``, one scale per
  (layer, head, k) taken over d_v; max / divide / round in FP32, scale stored in the temporal dtype
  and re-read from that dtype for the division, so quantize and dequantize see the same scale.
  Both call ``dasc_runtime.reference.quantize_int8`` / ``dequantize_int8`` (one implementation).

Shapes: ``temporal`` is SGLang's ``MambaPool.mamba_cache.temporal`` ``[L, M+1, H/P, d_v, d_k]``;
slot tensors are int64 ``[N]`` on the pool's device; ``unit`` is ``(d_v, d_k)`` (GDN head) or
``(d_v,)`` (KDA column ``S[h, :, k]``). The pool's ``layout`` holds ``kept_flat`` on the pool
device (moved once when the pool is built), so a store / load copies no indices; the ``.to`` in
the reference is then a no-op, kept for callers that pass a host layout (benchmarks, tests).
"""

from __future__ import annotations

import logging
import os

import torch

from dasc_runtime.pool_layout import RankLayout
from dasc_runtime.reference import QMAX, SCALE_FLOOR, dequantize_int8, quantize_int8

__all__ = ["ReferenceOps", "KernelOps", "select_ops", "QMAX", "SCALE_FLOOR"]

logger = logging.getLogger(__name__)


def _flat_view(layout: RankLayout, states: torch.Tensor) -> torch.Tensor:
    """``[L, N, H, d_v, d_k]`` -> ``[N, L * units_per_layer, *unit]`` (a copy when KDA)."""
    L, n = states.shape[0], states.shape[1]
    if layout.unit_kind == "gdn_head":
        return states.transpose(0, 1).reshape(n, L * layout.heads_local, layout.d_v, layout.d_k)
    # KDA: unit (l, j, k) is the column states[l, :, j, :, k]  ->  [N, L, H, d_k, d_v]
    return states.permute(1, 0, 2, 4, 3).reshape(n, L * layout.heads_local * layout.d_k, layout.d_v)


def _unflat(layout: RankLayout, flat: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_flat_view`: ``[N, L * upl, *unit]`` -> ``[L, N, H, d_v, d_k]``."""
    n, L, h = flat.shape[0], layout.num_layers, layout.heads_local
    if layout.unit_kind == "gdn_head":
        return flat.reshape(n, L, h, layout.d_v, layout.d_k).transpose(0, 1)
    return flat.reshape(n, L, h, layout.d_k, layout.d_v).permute(1, 0, 2, 4, 3)


class ReferenceOps:
    """Plain-PyTorch store/load (the runtime's reference; see module docstring for shapes)."""

    name = "reference"

    def store(self, pool, cache, src_slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Pack ``cache`` (SGLang ``MambaPool.State``) slots ``src_slots`` into ``pool`` rows ``rows``."""
        layout = pool.layout
        units = self.pack_units(layout, cache.temporal, src_slots)            # [N, n_local, *unit]
        if layout.int8:
            q, s = self.quantize(layout, units)
            pool.write_units(pool.temporal, rows, q)
            pool.write_units(pool.scale, rows, s)
        else:
            pool.write_units(pool.temporal, rows, units.to(pool.temporal.dtype))
        for c, pc in zip(cache.conv, pool.conv):
            pc.index_copy_(1, rows, c.index_select(1, src_slots).to(pc.dtype))

    def load(self, pool, cache, rows: torch.Tensor, dst_slots: torch.Tensor) -> None:
        """dasc-nr restore of ``pool`` rows ``rows`` into ``cache`` slots ``dst_slots`` (all layers)."""
        layout = pool.layout
        if layout.int8:
            units = self.dequantize(layout, pool.read_units(pool.temporal, rows), pool.read_units(pool.scale, rows))
        else:
            units = pool.read_units(pool.temporal, rows)
        self.unpack_units(layout, cache.temporal, dst_slots, units)
        for c, pc in zip(cache.conv, pool.conv):
            c.index_copy_(1, dst_slots, pc.index_select(1, rows).to(c.dtype))

    def pack_units(self, layout: RankLayout, temporal: torch.Tensor, active_slots: torch.Tensor) -> torch.Tensor:
        """Kept units of ``active_slots``: ``[N, n_local, *unit]`` in the temporal dtype (ragged order)."""
        states = temporal.index_select(1, active_slots)                      # [L, N, H, dv, dk]
        flat = _flat_view(layout, states)
        return flat.index_select(1, layout.kept_flat.to(flat.device))     # no-op for the pool's layout

    def unpack_units(self, layout: RankLayout, temporal: torch.Tensor, dst_slots: torch.Tensor,
                     units: torch.Tensor) -> None:
        """dasc-nr restore into ``dst_slots``: kept units from ``units [N, n_local, *unit]``, local units 0."""
        n = dst_slots.numel()
        full = torch.zeros((n, layout.num_layers * layout.units_per_layer, *layout.unit_shape),
                           dtype=temporal.dtype, device=temporal.device)
        full.index_copy_(1, layout.kept_flat.to(full.device), units.to(temporal.dtype))
        temporal.index_copy_(1, dst_slots, _unflat(layout, full).contiguous())

    @staticmethod
    def quantize(layout: RankLayout, units: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 8 on ``units [N, n, *unit]``: returns ``(q int8 [N, n, *unit], scale [N, n, *scale_shape])``.

        GDN head units ``[d_v, d_k]`` reduce over d_v -> one scale per k (``[N, n, d_k]``); a KDA
        column ``[d_v]`` gets one scale (``[N, n]``). Scales are stored in ``layout.temporal_dtype``.
        Delegates to :func:`dasc_runtime.reference.quantize_int8` (the one Eq. 8 implementation,
        true IEEE division by 127 on every device).
        """
        return quantize_int8(units, scale_dtype=layout.temporal_dtype, kind=layout.unit_kind)

    @staticmethod
    def dequantize(layout: RankLayout, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """``q * s`` in FP32, cast to ``layout.temporal_dtype`` (inverse of :meth:`quantize`).

        Delegates to :func:`dasc_runtime.reference.dequantize_int8`.
        """
        return dequantize_int8(q, scale, kind=layout.unit_kind, out_dtype=layout.temporal_dtype)


class KernelOps(ReferenceOps):
    """The plan's generated Triton kernels (``templates/state_kernels.py.jinja``) behind the same interface.

    One launch moves all layers (and the conv state) of a batch of slots. Storage balancing
    (``layout.storage``) needs the units staged for the all-to-all, so those pools use the reference.

    Args:
        module: the plan's kernel module (``dasc_runtime.kernel_loader.load_plan_kernels``).
        index: this rank's ``dasc_runtime.indexing.StateIndex`` on the pool device.
    """

    name = "kernels"

    def __init__(self, module, index) -> None:
        self.module = module
        self.index = index

    def store(self, pool, cache, src_slots: torch.Tensor, rows: torch.Tensor) -> None:
        if pool.layout.storage is not None:
            return super().store(pool, cache, src_slots, rows)
        m, ix = self.module, self.index
        if pool.layout.int8:
            m.pack_int8(temporal=cache.temporal, conv=list(cache.conv), src_slots=src_slots, comp_q=pool.temporal,
                        comp_scale=pool.scale, comp_conv=pool.conv, dst_slots=rows, unit_row=ix.unit_row,
                        kept_heads=ix.kept_heads, check_slots=False)
        else:
            m.pack(temporal=cache.temporal, conv=list(cache.conv), src_slots=src_slots, comp_temporal=pool.temporal,
                   comp_conv=pool.conv, dst_slots=rows, unit_row=ix.unit_row, kept_heads=ix.kept_heads,
                   check_slots=False)

    def load(self, pool, cache, rows: torch.Tensor, dst_slots: torch.Tensor) -> None:
        if pool.layout.storage is not None:
            return super().load(pool, cache, rows, dst_slots)
        m, ix = self.module, self.index
        if pool.layout.int8:
            m.load_int8(comp_q=pool.temporal, comp_scale=pool.scale, comp_conv=pool.conv, src_slots=rows,
                        temporal=cache.temporal, conv=list(cache.conv), dst_slots=dst_slots, unit_row=ix.unit_row,
                        check_slots=False)
        else:
            m.load(comp_temporal=pool.temporal, comp_conv=pool.conv, src_slots=rows, temporal=cache.temporal,
                   conv=list(cache.conv), dst_slots=dst_slots, unit_row=ix.unit_row, check_slots=False)


def select_ops(plan, plan_dir, layout: RankLayout, device: torch.device | str, *, interpret: bool = False) -> ReferenceOps:
    """The ops for a pool on ``device``.

    The plan's generated kernels when the pool is on CUDA (or ``interpret`` asks for Triton's CPU
    interpreter), the plan directory holds its kernel module and storage balancing is off; the
    PyTorch reference otherwise (always exact), or when ``DASC_OPS=reference`` is set.

    Raises:
        DascInputError: the plan names a kernel module that does not load (stale or foreign file).
    """
    dev = torch.device(device)
    if os.environ.get("DASC_OPS", "") == "reference":
        logger.info("dasc: DASC_OPS=reference: using the PyTorch store/load")
        return ReferenceOps()
    if plan is None or plan_dir is None or plan.kernels is None or (dev.type != "cuda" and not interpret):
        return ReferenceOps()
    if layout.storage is not None:
        logger.info("dasc: storage balancing stages units for the all-to-all; using the PyTorch store/load")
        return ReferenceOps()
    from dasc_runtime.indexing import build_state_index
    from dasc_runtime.kernel_loader import load_plan_kernels

    module = load_plan_kernels(plan_dir, plan.kernels, interpret=interpret)
    return KernelOps(module, build_state_index(plan, tp_rank=layout.tp_rank, device=dev))
