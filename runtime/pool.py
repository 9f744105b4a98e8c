"""The compressed state-checkpoint pool, installed in SGLang's ``mamba_ckpt_pool`` slot (paper §4.1, §4.4).

:class:`DascCheckpointPool` speaks the interface SGLang 0.5.17's radix caches already drive for
its INT8 pool (``mem_cache/mamba_checkpoint_pool.py``): ``alloc / free / available_size / clear /
store_from_active / load_to_active`` plus ``num_slots`` and ``mem_usage_bytes``.

Storage per slot (slot 0 reserved, as SGLang's allocators reserve it):

* temporal: ``[C+1, width, *unit]`` in the temporal dtype, or the INT8 payload ``[C+1, width,
  *unit]`` int8 plus scales ``[C+1, width, *scale_shape]`` in the temporal dtype (App. E.1);
* conv: one ``[L, C+1, *conv_shape]`` tensor per SGLang conv tensor, in the conv dtype, whole
  (conv state is not compressed; layer-major like SGLang's pool and the generated kernels).

The pool owns the slots and their tensors (:class:`~dasc_runtime.ops.CheckpointTensors`) and hands
them to its ops (:mod:`dasc_runtime.ops`) for every store and load; the ops never call back.

Slot ids. The pool shares one id space with SGLang's native Mamba slots ``0..M``: compressed slot
``c`` (1..C) is id ``M + 1 + c``. A compressed id handed out by :meth:`alloc` is a one-element
view of a fixed id tensor, so the pool recognises its own ids from tensor metadata
(``storage_offset``) without reading device memory; any other tensor is read once (a device sync).
``load_to_active`` accepts a mixed batch of native ids (exact dense copy) and compressed ids
(dasc-nr restore), which is how the two tiers reach the model runner's deferred copy-on-write.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from dasc_compile.schema.units import byte_count, flag_bytes, smallest_budget
from dasc_compile.schema import DascInputError, usable_slots
from dasc_runtime.ops import CheckpointTensors, TorchOps
from dasc_runtime.rank_layout import RankLayout
from dasc_runtime.restore_check import RestoreCheck
from dasc_runtime.settings import env_setting
from dasc_runtime.side_channels import tier_hint

__all__ = ["DascCheckpointPool", "PoolCounters", "slots_for_budget", "bytes_per_slot", "host_index"]

logger = logging.getLogger(__name__)

# DASC_LOG_RESTORES=1: one INFO line per restored batch (evidence for smoke runs; off by default)
_LOG_RESTORES = env_setting("DASC_LOG_RESTORES")


def bytes_per_slot(layout: RankLayout, conv_shapes: Sequence[Sequence[int]]) -> int:
    """Physical bytes of one compressed slot on this rank: temporal (+ INT8 scales) + conv.

    ``width * UnitSpec.unit_bytes`` (payload, plus the scales in the temporal dtype when INT8) +
    ``L * sum(prod(conv_shape)) * itemsize(conv)``, with SGLang's served ``conv_shapes``.
    """
    spec = layout.spec
    conv = layout.num_layers * sum(math.prod(s) for s in conv_shapes) * spec.itemsize(spec.conv_dtype)
    return layout.width * spec.unit_bytes + conv


def slots_for_budget(budget_bytes: int, slot_bytes: int, what: str = "dasc pool budget") -> int:
    """Usable slots of a pool of ``budget_bytes`` (App. C.1): ``floor(B / bytes_per_slot) - 1`` (slot 0 reserved).

    Args:
        what: how the budget is named in a refusal (``--dasc-pool-bytes``, ``DASC_POOL_BYTES``).
    Raises:
        DascInputError: the budget does not hold one usable slot (names the smallest that does).
    """
    if slot_bytes <= 0:
        raise DascInputError(f"bytes per compressed slot must be positive, got {slot_bytes}")
    n = usable_slots(budget_bytes, slot_bytes)
    if n < 1:
        raise DascInputError(
            f"{what} {byte_count(budget_bytes)} holds no usable slot: a slot takes {byte_count(slot_bytes)} and slot "
            f"0 is reserved; give at least {flag_bytes(smallest_budget(slot_bytes))}")
    return int(n)


@dataclass
class PoolCounters:
    """Transfer counters of the pool (checkpoints, not bytes; batches are ``load_to_active`` calls)."""

    stores: int = 0             # active slot -> compressed slot (pack)
    loads_compressed: int = 0   # compressed slot -> active slot (dasc-nr restore)
    loads_dense: int = 0        # native slot -> active slot (exact copy) through load_to_active
    loads_unsplit: int = 0      # restores of hint-miss batches (tier not known on the host, see load_to_active)
    batches: int = 0            # restore batches (load_to_active calls with at least one source)
    mixed_batches: int = 0      # batches holding dense and compressed sources
    hint_misses: int = 0        # batches without a host tier hint (split on the device, never read back)


def host_index(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """int64 ``[len(values)]`` index tensor on ``device`` without blocking the host.

    On CUDA the values are staged in pinned host memory and copied with ``non_blocking=True`` (an
    async copy on the current stream; PyTorch's pinned allocator keeps the buffer until the copy
    has run). ``torch.tensor(list, device=cuda)`` would be a synchronous copy from pageable memory.
    """
    if device.type != "cuda":
        return torch.tensor(list(values), dtype=torch.int64, device=device)
    return torch.tensor(list(values), dtype=torch.int64, pin_memory=True).to(device, non_blocking=True)


def _slot_ids(slots: torch.Tensor) -> torch.Tensor:
    """int64 ``[N]`` copy of native slot ids ``slots`` (any shape) in a fresh allocation.

    SGLang can hand the pool a view into a larger index tensor whose first element is not 16-byte
    aligned. Triton specialises pointer arguments on 16-byte alignment, so such a view makes the plan's
    pack / load kernels compile a second variant on the serving path (session 18: ``pack_kernel`` with an
    unaligned ``src_slots`` compiled inside a timed run, a stall for every request in flight). The copy
    costs N int64 on the same device, no host sync.
    """
    return slots.reshape(-1).to(torch.int64, copy=True)


class DascCheckpointPool:
    """Ragged compressed checkpoints of one TP rank (see module docstring).

    Args:
        layout: this rank's :class:`RankLayout`; the pool keeps it with its index tensors on
            ``device``, moved once here when they are elsewhere (``self.layout``).
        num_slots: usable compressed slots C (storage holds C + 1 rows).
        conv_shapes: SGLang's per-rank conv state shapes (``cache_params.shape.conv``).
        native_size: M, SGLang's ``MambaPool.size``; compressed ids start at ``M + 1``.
        device: where the pool lives (SGLang's mamba pool device).
        ops: store/load implementation (:class:`~dasc_runtime.ops.TorchOps` on the world group
            by default; :func:`~dasc_runtime.ops.select_ops` picks one with the TP group).
    Raises:
        DascInputError: ``num_slots < 1``.
    """

    def __init__(self, *, layout: RankLayout, num_slots: int, conv_shapes: Sequence[Sequence[int]], native_size: int,
                 device: str | torch.device, ops: Optional[TorchOps] = None) -> None:
        if num_slots < 1:
            raise DascInputError(f"dasc pool needs at least one usable slot, got {num_slots}")
        self.num_slots = int(num_slots)
        self.native_size = int(native_size)
        self.id_offset = self.native_size + 1
        self.device = torch.device(device)
        # index tensors on the pool device once, not on every store / load (ops.py)
        self.layout = layout.to(self.device)
        self.ops = ops if ops is not None else TorchOps()
        self.conv_shapes = [tuple(int(x) for x in s) for s in conv_shapes]
        rows = self.num_slots + 1
        if layout.int8:
            self.temporal = torch.zeros((rows, layout.width, *layout.unit_shape), dtype=torch.int8, device=self.device)
            self.scale = torch.zeros((rows, layout.width, *layout.scale_shape), dtype=layout.temporal_dtype,
                                     device=self.device)
        else:
            self.temporal = torch.zeros((rows, layout.width, *layout.unit_shape), dtype=layout.temporal_dtype,
                                        device=self.device)
            self.scale = None
        self.conv = [torch.zeros((layout.num_layers, rows, *s), dtype=layout.conv_dtype, device=self.device)
                     for s in self.conv_shapes]
        self.tensors = CheckpointTensors(temporal=self.temporal, scale=self.scale, conv=self.conv)
        # _ids[c] is the id of compressed slot c; alloc hands out one-element views of it
        self._ids = torch.arange(self.id_offset, self.id_offset + rows, dtype=torch.int64, device=self.device)
        self._ids_ptr = self._ids.untyped_storage().data_ptr()
        self.counters = PoolCounters()
        self.restore_check = RestoreCheck.from_env()        # None unless DASC_RESTORE_CHECK is set
        self.clear()

    # ---- allocator (host-side free list; slot 0 reserved) ----

    def clear(self) -> None:
        """Release every slot (SGLang calls this on a cache flush). Contents are left as they are."""
        self._free: list[int] = list(range(self.num_slots, 0, -1))   # pop() yields 1, 2, 3, ...
        self._in_use = bytearray(self.num_slots + 1)
        if getattr(self, "restore_check", None) is not None:     # (None while __init__ runs)
            self.restore_check.on_free(range(self.num_slots + 1))

    def available_size(self) -> int:
        """Free compressed slots."""
        return len(self._free)

    def used_size(self) -> int:
        """Compressed slots currently allocated."""
        return self.num_slots - len(self._free)

    def alloc(self, need_size: int = 1) -> Optional[torch.Tensor]:
        """``need_size`` compressed slot ids (int64 ``[need_size]`` on the pool device), or None if full."""
        if need_size > len(self._free):
            return None
        slots = [self._free.pop() for _ in range(need_size)]
        for c in slots:
            self._in_use[c] = 1
        if need_size == 1:
            c = slots[0]
            return self._ids[c:c + 1]
        return torch.cat([self._ids[c:c + 1] for c in slots])

    def is_own_id_tensor(self, ids: torch.Tensor) -> bool:
        """True when ``ids`` is a view handed out by :meth:`alloc` (decided from metadata, no device read)."""
        return (ids.device == self._ids.device and ids.dtype == torch.int64 and ids.dim() == 1
                and ids.untyped_storage().data_ptr() == self._ids_ptr and (ids.numel() <= 1 or ids.stride(0) == 1))

    def slots_of(self, ids: torch.Tensor) -> list[int]:
        """Compressed slot numbers (1..C) of the ids in ``ids``.

        Raises:
            AssertionError: an id that is not a compressed id of this pool (names the id).
        """
        if self.is_own_id_tensor(ids):
            start = ids.storage_offset()
            slots = list(range(start, start + ids.numel()))
        else:
            slots = [int(v) - self.id_offset for v in ids.reshape(-1).tolist()]
        for c in slots:
            assert 1 <= c <= self.num_slots, f"id {c + self.id_offset} is not a dasc compressed slot id " \
                                             f"(compressed ids are {self.id_offset + 1}..{self.id_offset + self.num_slots})"
        return slots

    def free(self, ids: torch.Tensor) -> None:
        """Return compressed slots to the pool.

        Raises:
            AssertionError: double free (names the slot) or a non-compressed id.
        """
        if ids.numel() == 0:
            return
        slots = self.slots_of(ids)
        for c in slots:
            assert self._in_use[c], f"double free of dasc compressed slot {c} (id {c + self.id_offset})"
            self._in_use[c] = 0
            self._free.append(c)
        if self.restore_check is not None:
            self.restore_check.on_free(slots)

    def is_allocated(self, slot: int) -> bool:
        """True when compressed slot ``slot`` (1..C) is handed out."""
        return bool(self._in_use[slot])

    # ---- transfers (SGLang's mamba_ckpt_pool interface) ----

    def _rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Pool rows of compressed ids, on the device, without a host read."""
        return (ids.reshape(-1).to(self.device) - self.id_offset).to(torch.int64)

    def store_from_active(self, active_mamba_pool, active_slots: torch.Tensor, ckpt_slots: torch.Tensor) -> None:
        """Pack active slots into compressed slots (SGLang's cache-store / donate hook, §4.1).

        Args:
            active_mamba_pool: SGLang's ``MambaPool`` (``mamba_cache.temporal [L, M+1, H/P, d_v, d_k]``,
                ``mamba_cache.conv``: list of ``[L, M+1, *conv_shape]``).
            active_slots: int64 ``[N]`` native slot ids to read.
            ckpt_slots: int64 ``[N]`` compressed ids from :meth:`alloc` to write.
        """
        src = _slot_ids(active_slots)
        rows = self._rows(ckpt_slots)
        self.ops.store(self.layout, active_mamba_pool.mamba_cache, src, rows, self.tensors)
        self.counters.stores += src.numel()
        if self.restore_check is not None:
            self.restore_check.on_store(active_mamba_pool.mamba_cache, src, rows)

    def load_compressed(self, active_mamba_pool, ckpt_slots: torch.Tensor, active_slots: torch.Tensor) -> None:
        """dasc-nr restore (§4.2): kept units exact, local units zero, conv copied, for every layer."""
        dst = _slot_ids(active_slots)
        rows = self._rows(ckpt_slots)
        self.ops.load(self.layout, active_mamba_pool.mamba_cache, rows, dst, self.tensors)
        self.counters.loads_compressed += dst.numel()
        if self.restore_check is not None:
            self.restore_check.on_load(self.layout, active_mamba_pool.mamba_cache, rows, dst)

    def load_to_active(self, active_mamba_pool, ckpt_slots: torch.Tensor, active_slots: torch.Tensor) -> None:
        """Restore a batch of hits into active slots (SGLang's deferred copy-on-write, on the forward stream).

        ``ckpt_slots`` may mix native ids (``<= M``: exact ``MambaPool.copy_from``, a dense hit) and
        compressed ids (dasc-nr). The split comes from the host hint the plugin attaches
        (:func:`dasc_runtime.side_channels.tier_hint`: list of bool), or from the ids' tensor
        metadata when they are one view of this pool's ids (all compressed). Nothing here reads the
        device: a mixed batch's row lists go to the device from pinned memory (:func:`host_index`);
        a batch with neither (a hint miss, counted) is split on the device, see :meth:`_load_unsplit`.

        Args:
            active_mamba_pool: SGLang's ``MambaPool``.
            ckpt_slots: int64 ``[N]`` source ids.
            active_slots: int64 ``[N]`` destination native slots.
        """
        src = ckpt_slots.reshape(-1)
        dst = active_slots.reshape(-1)
        if src.numel() == 0:
            return
        self.counters.batches += 1
        hint = tier_hint(ckpt_slots)
        if hint is None or len(hint) != src.numel():
            if not self.is_own_id_tensor(src):
                self.counters.hint_misses += 1
                self._load_unsplit(active_mamba_pool, src, dst)
                return
            hint = [True] * src.numel()
        n_c = sum(1 for h in hint if h)
        if _LOG_RESTORES:
            # zero-filled under either policy: a dasc-wr plan refreshes the local units afterwards
            logger.info("dasc: restoring %d compressed (local units zero-filled) + %d dense checkpoint(s) into "
                        "active slots (totals before: compressed %d, dense %d)", n_c, len(hint) - n_c,
                        self.counters.loads_compressed, self.counters.loads_dense)
        if n_c == len(hint):
            self.load_compressed(active_mamba_pool, src, dst)
            return
        if n_c == 0:
            active_mamba_pool.copy_from(src, dst)
            self.counters.loads_dense += src.numel()
            return
        self.counters.mixed_batches += 1
        ic = host_index([i for i, h in enumerate(hint) if h], src.device)
        idn = host_index([i for i, h in enumerate(hint) if not h], src.device)
        active_mamba_pool.copy_from(src.index_select(0, idn), dst.index_select(0, idn))
        self.counters.loads_dense += len(hint) - n_c
        self.load_compressed(active_mamba_pool, src.index_select(0, ic), dst.index_select(0, ic))

    def _load_unsplit(self, active_mamba_pool, src: torch.Tensor, dst: torch.Tensor) -> None:
        """A batch whose tiers the host does not know, restored without reading the device.

        Both transfers run over every row: the dense copy with compressed rows' sources replaced by
        native slot 0 (their destinations are rewritten whole by the load that follows, on the same
        stream), then the dasc-nr load with dense rows pointed at compressed row 0 and native slot 0
        (SGLang's padding slot, which no request owns). Twice the work of a hinted batch; the plugin
        always attaches the hint, so this is the fallback, counted in ``hint_misses``.
        """
        comp = src > self.native_size                                       # bool [N], on the device
        zero = torch.zeros_like(src)
        active_mamba_pool.copy_from(torch.where(comp, zero, src), dst)
        rows = torch.where(comp, src - self.id_offset, zero).to(torch.int64)
        self.ops.load(self.layout, active_mamba_pool.mamba_cache, rows, torch.where(comp, dst, zero).to(torch.int64),
                      self.tensors)
        self.counters.loads_unsplit += src.numel()
        if self.restore_check is not None and self.restore_check.saved:
            self.restore_check.on_load(self.layout, active_mamba_pool.mamba_cache, rows[comp], dst[comp])

    # ---- accounting ----

    def bytes_per_slot(self) -> int:
        """Physical bytes of one slot on this rank (see :func:`bytes_per_slot`)."""
        return bytes_per_slot(self.layout, self.conv_shapes)

    def mem_usage_bytes(self) -> int:
        """Bytes held by the pool's tensors (all C + 1 rows)."""
        tensors = [self.temporal, *self.conv] + ([self.scale] if self.scale is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)
