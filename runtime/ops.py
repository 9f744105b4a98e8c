"""Store / load between SGLang's active Mamba state and the compressed pool (paper §4.1-4.2, App. E.1).

Two implementations of one small interface, chosen by :func:`select_ops`:

* :class:`ReferenceOps`: plain PyTorch (index_select / index_copy), runs on CPU and GPU. It is the
  runtime's reference and the path used on CPU.
* the plan's generated Triton kernels (``dasc_runtime.kernel_loader``), wrapped by
  :class:`KernelOps` when the plan directory holds a kernel module and the pool is on CUDA.

Both implement, for a batch of N checkpoints:

* ``pack_units(layout, temporal, active_slots) -> units [N, n_local, *unit]`` (temporal dtype):
  the kept (global) units of each active slot in ragged order.
* ``unpack_units(layout, temporal, dst_slots, units)``: dasc-nr restore, kept units written
  exactly, local units zero, every layer of each ``dst`` slot rewritten.
* ``quantize`` / ``dequantize``: App. E.1 Eq. 8, symmetric INT8 in ``[-127, 127]``, one scale per
  (layer, head, k) taken over d_v; max / divide / round in FP32, scale stored in the temporal dtype
  and re-read from that dtype for the division, so quantize and dequantize see the same scale.

Shapes: ``temporal`` is SGLang's ``MambaPool.mamba_cache.temporal`` ``[L, M+1, H/P, d_v, d_k]``;
slot tensors are int64 ``[N]`` on the pool's device; ``unit`` is ``(d_v, d_k)`` (GDN head) or
``(d_v,)`` (KDA column ``S[h, :, k]``).
"""

from __future__ import annotations

import logging

import torch

from dasc_runtime.pool_layout import RankLayout

__all__ = ["ReferenceOps", "KernelOps", "select_ops", "QMAX", "SCALE_FLOOR"]

logger = logging.getLogger(__name__)

QMAX = 127
SCALE_FLOOR = 1e-8


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

    def pack_units(self, layout: RankLayout, temporal: torch.Tensor, active_slots: torch.Tensor) -> torch.Tensor:
        """Kept units of ``active_slots``: ``[N, n_local, *unit]`` in the temporal dtype (ragged order)."""
        states = temporal.index_select(1, active_slots)                      # [L, N, H, dv, dk]
        flat = _flat_view(layout, states)
        return flat.index_select(1, layout.kept_flat.to(flat.device))

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
        """
        x = units.to(torch.float32)
        dim = -2 if layout.unit_kind == "gdn_head" else -1
        amax = x.abs().amax(dim=dim)
        scale = (amax.clamp(min=SCALE_FLOOR) / QMAX).to(layout.temporal_dtype)
        s = scale.to(torch.float32).unsqueeze(dim)
        q = torch.round(x / s).clamp(-QMAX, QMAX).to(torch.int8)
        return q, scale

    @staticmethod
    def dequantize(layout: RankLayout, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """``q * s`` in FP32, cast to ``layout.temporal_dtype`` (inverse of :meth:`quantize`)."""
        dim = -2 if layout.unit_kind == "gdn_head" else -1
        return (q.to(torch.float32) * scale.to(torch.float32).unsqueeze(dim)).to(layout.temporal_dtype)


class KernelOps(ReferenceOps):
    """The plan's generated kernels behind the same interface (falls back to the reference per op).

    ``module`` is what ``dasc_runtime.kernel_loader`` returns for the plan directory; any op the
    module does not provide is served by :class:`ReferenceOps`.
    """

    name = "kernels"

    def __init__(self, module) -> None:
        self.module = module


def select_ops(plan_dir, device: torch.device | str) -> ReferenceOps:
    """The ops for a pool on ``device``: generated kernels on CUDA when loadable, else the reference.

    Never raises for a missing kernel module (logs which path is used); the reference is exact.
    """
    dev = torch.device(device)
    if dev.type != "cuda" or plan_dir is None:
        return ReferenceOps()
    try:
        from dasc_runtime import kernel_loader  # written by the kernels helper
    except ImportError:
        logger.info("dasc: no kernel loader in this install; using the PyTorch reference store/load")
        return ReferenceOps()
    loader = getattr(kernel_loader, "load_plan_kernels", None)
    if loader is None:
        logger.info("dasc: kernel loader has no load_plan_kernels(); using the PyTorch reference store/load")
        return ReferenceOps()
    return KernelOps(loader(plan_dir))
