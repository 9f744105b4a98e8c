"""Transactional demotion of dense checkpoints into the compressed pool (paper App. B.2).

Paper App. B.2 "Transactional demotion": a node passes through dense -> demoting -> compressed.
:class:`DemotionEngine` owns that passage for one :class:`~dasc_runtime.mamba_component.DascMambaComponent`:

* launch (:meth:`DemotionEngine.demote_async`): pin the node (SGLang's ``inc_lock_ref``), pack its
  dense slot into a compressed slot on a side CUDA stream that first waits on the current stream
  (:class:`SideStream`), record an event. The dense slot stays valid and owned meanwhile;
* commit (:meth:`DemotionEngine.commit_ready`): value -> compressed id, tier -> compressed, unpin,
  free the native slot; only once the event has completed **and** no hit holds the node;
* never blocking in ``maintain``: only demotions whose ``event.query()`` is true commit, and with
  TP > 1 only those complete on every rank (:func:`agree_all`: one all-reduce MIN on the
  attention-TP CPU group), so every rank commits the same demotions in the same cache call (App.
  B.2: "victim selection and slot mappings must agree across TP ranks");
* the reclamation walk, which needs the slot now, commits every candidate after ordering the
  current stream behind its event (:func:`order_after`, mode :func:`reclaim_wait_mode`); that is
  deterministic on every rank without a collective;
* storage balancing (``layout.storage``): the pack is an NCCL all-to-all on the TP group; on a
  side stream it could interleave with the model's TP collectives on the main stream in a different
  order on different ranks (a cross-rank deadlock), so such pools demote synchronously on the
  current stream (:meth:`DemotionEngine.demote_now`, committed at once).

Invariant: a pending demotion owns exactly one compressed slot and pins its node (``lock_ref >= 1``),
whose tier stays dense until commit; the LRU position never changes (demotion is not an access).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist

from dasc_compile.schema import DascInputError
from dasc_runtime.side_channels import is_staged
from dasc_runtime.tiers import COMPRESSED, DENSE, TierBook, TierCounters

__all__ = ["DemotionEngine", "Demotion", "CudaStreams", "SideStream", "agree_all", "order_after", "reclaim_wait_mode"]


class _DoneEvent:
    """Completion record of a demotion pack that ran synchronously (CPU, or no side stream)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class CudaStreams:
    """The stream calls demotion makes, on one device: CUDA's own (``torch.cuda``), or none on a CPU.

    The one place demotion touches streams, so a test can hand :class:`SideStream`,
    :func:`order_after` and :class:`DemotionEngine` a simulated device with the same five calls
    (``tests/support/runtime_streams.py``: packs that complete later, in random order). Streams and events
    are ``torch.cuda.Stream`` / ``torch.cuda.Event`` (``wait_stream``, ``wait_event``, ``record``,
    ``query``, ``synchronize``).
    """

    def __init__(self, device) -> None:
        self.device = torch.device(device)
        self.enabled = self.device.type == "cuda"

    def new_stream(self):
        """A new side stream, or None on a CPU (packs then run inline)."""
        return torch.cuda.Stream(device=self.device) if self.enabled else None

    def current_stream(self):
        """The stream the scheduler thread issues work on now (SGLang's schedule stream)."""
        return torch.cuda.current_stream(self.device)

    def stream(self, s):
        """Context manager: issue work on ``s``."""
        return torch.cuda.stream(s)

    def new_event(self):
        """A new event (record it on a stream)."""
        return torch.cuda.Event()

    def is_event(self, event) -> bool:
        """True for an event of this device's streams (the CPU completion record is not)."""
        return self.enabled and isinstance(event, torch.cuda.Event)


class SideStream:
    """Runs demotion packs on a background stream (App. B.2 "Transactional demotion").

    ``run(fn)`` makes the side stream wait for the current stream (the state being packed was
    written there), runs ``fn`` on the side stream and returns an event recorded after it. Without a
    side stream (CPU) ``fn`` runs inline and a completed record is returned.

    Args:
        streams: :class:`CudaStreams` of the pool's device (or a simulated device, in tests).
    """

    def __init__(self, streams: CudaStreams) -> None:
        self.streams = streams
        self.stream = streams.new_stream()

    def run(self, fn: Callable[[], None]):
        """Run ``fn`` (a pack) after the current stream's work; returns its completion event."""
        if self.stream is None:
            fn()
            return _DoneEvent()
        self.stream.wait_stream(self.streams.current_stream())
        with self.streams.stream(self.stream):
            fn()
            ev = self.streams.new_event()
            ev.record(self.stream)
        return ev


def reclaim_wait_mode() -> str:
    """``DASC_RECLAIM_WAIT``: how the reclamation walk orders itself after a pending demotion.

    ``stream`` (default): the current CUDA stream waits on the demotion's event (``wait_event``, no
    host block). Safe because every later write to the freed native slot is issued on SGLang's
    schedule stream after this point, or on its forward stream, which waits on the schedule stream
    before each forward (sglang/srt/managers/scheduler.py, 0.5.17 and 0.5.23, read not run on a GPU for
    0.5.23; state zeroing and copy-on-write
    of hits are deferred to the forward stream), and a later demotion's side stream first waits on
    the schedule stream (:meth:`SideStream.run`). The argument rests on those waits and on the
    configurations ``verify.check_server_args`` refuses (host offload, PD transfer, speculative
    states, pipeline parallelism); re-check it on an SGLang upgrade. ``host``: the scheduler thread
    blocks in ``event.synchronize()`` (the earlier behaviour; kept to compare the two on a GPU).

    Raises:
        DascInputError: any other value.
    """
    raw = os.environ.get("DASC_RECLAIM_WAIT", "stream")
    mode = raw.strip().lower() or "stream"
    if mode not in ("stream", "host"):           # the value as set, as the yes / no variables' refusals echo it
        raise DascInputError(f"DASC_RECLAIM_WAIT: expected 'stream' or 'host', got {raw!r}")
    return mode


def order_after(event, mode: str, streams: CudaStreams) -> None:
    """Make later work see a pending demotion's pack as done (see :func:`reclaim_wait_mode`).

    An event of ``streams`` under ``stream`` makes the current stream wait on it; anything else
    (``host`` mode, or the CPU completion record, which has no stream) is synchronized.
    """
    if mode == "stream" and streams.is_event(event):
        streams.current_stream().wait_event(event)
        return
    event.synchronize()


def agree_all(flags: list[bool], group: Optional[dist.ProcessGroup] = None) -> list[bool]:
    """Element-wise AND of ``flags`` over every rank of ``group`` (a CPU / gloo process group).

    Every rank of ``group`` must call it with a list of the same length (the candidate demotions in
    node-id order, identical on every rank). One ``all_reduce(MIN)`` of an int32 ``[len(flags)]``
    CPU tensor (none for an empty list): it waits for the other ranks' scheduler threads, never for
    the GPU.

    Args:
        flags: this rank's flags.
        group: process group (default: the world group).
    Returns:
        list of bool, True where every rank passed True.
    """
    if not flags:                   # same length on every rank: all return here together
        return []
    t = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return [bool(x) for x in t.tolist()]


@dataclass
class Demotion:
    """One pending (launched, not committed) demotion."""

    node: object                    # UnifiedTreeNode
    target: torch.Tensor            # compressed id it is being packed into (int64 [1])
    event: object                   # torch.cuda.Event or a completion record with query() / synchronize()
    lock: object                    # IncLockRefResult of the pin
    epoch: int                      # cache call (maintenance epoch) it was launched in


class DemotionEngine:
    """Launches, tracks and commits demotions for one two-tier component (see module docstring).

    Args:
        cache: SGLang's ``UnifiedRadixCache`` (locks; ``req_to_token_pool.mamba_pool`` and
            ``mamba_allocator``: the native tier).
        dpool: the compressed tier (:class:`~dasc_runtime.pool.DascCheckpointPool`).
        book: the component's :class:`~dasc_runtime.tiers.TierBook`. counters: its counters.
        component_type: ``ComponentType.MAMBA``.
    Attributes:
        pending: node id -> :class:`Demotion`. streams: the device's :class:`CudaStreams`.
        side: the :class:`SideStream` on them (tests replace both with a simulated device).
        reclaim_wait: :func:`reclaim_wait_mode` at construction.
    """

    def __init__(self, *, cache, dpool, book: TierBook, counters: TierCounters, component_type) -> None:
        self.cache = cache
        self.dpool = dpool
        self.book = book
        self.counters = counters
        self.ct = component_type
        self.streams = CudaStreams(dpool.device)
        self.side = SideStream(self.streams)
        self.reclaim_wait = reclaim_wait_mode()
        self.tp_cpu_group = None        # attention-TP CPU group for agree_all (TP > 1), resolved on first use
        self.pending: dict[int, Demotion] = {}

    def _swap_to_compressed(self, node, target: torch.Tensor) -> torch.Tensor:
        """Point the node at its compressed slot; returns the native id it held."""
        cd = node.component_data[self.ct]
        old = cd.value
        cd.value = target
        self.book.set(cd, COMPRESSED)
        return old

    def _check_demotable(self, node, what: str) -> torch.Tensor:
        cd = node.component_data[self.ct]
        assert cd.lock_ref == 0 and self.book.tier(cd) == DENSE and node.id not in self.pending, \
            f"{what}: node {node.id} must be an unlocked dense node that is not being demoted"
        c = self.dpool.alloc(1)
        assert c is not None, f"{what} needs a free compressed slot"
        return c

    def demote_now(self, node) -> None:
        """Synchronous demotion: pack on the current stream, swap, free the native slot.

        Used by the reclamation walk, and for every demotion of a storage-balanced pool.

        Raises:
            AssertionError: the node is locked, not dense or already pending, or no compressed slot
                is free (callers check first; the message names the node).
        """
        c = self._check_demotable(node, "demote_now")
        pool = self.cache.req_to_token_pool
        self.dpool.store_from_active(pool.mamba_pool, node.component_data[self.ct].value, c)
        pool.mamba_allocator.free(self._swap_to_compressed(node, c))
        self.counters.demotions_sync += 1

    def demote_async(self, node, epoch: int) -> None:
        """Start a background demotion in cache call ``epoch``: pin the node, pack on the side stream.

        With storage balancing the demotion is done synchronously instead (:meth:`demote_now`; see
        the module docstring for the deadlock it avoids).

        Raises:
            AssertionError: as :meth:`demote_now`.
        """
        if self.dpool.layout.storage is not None:
            self.demote_now(node)
            return
        c = self._check_demotable(node, "demote_async")
        lock = self.cache.inc_lock_ref(node.id)
        value = node.component_data[self.ct].value
        mp = self.cache.req_to_token_pool.mamba_pool
        event = self.side.run(lambda: self.dpool.store_from_active(mp, value, c))
        self.pending[node.id] = Demotion(node=node, target=c, event=event, lock=lock, epoch=epoch)
        self.counters.demotions_started += 1

    def _commit(self, d: Demotion) -> None:
        """Swap the node to its packed slot, unpin it and free the native one (the event has completed)."""
        node = d.node
        del self.pending[node.id]
        old = self._swap_to_compressed(node, d.target)
        self.cache.dec_lock_ref(node.id, d.lock.to_dec_params())
        self.cache.req_to_token_pool.mamba_allocator.free(old)
        self.counters.demotions_committed += 1

    def commit_ready(self, epoch: int, *, include_current_epoch: bool = False, wait: bool = False) -> int:
        """Commit pending demotions whose only holder is the demotion pin; returns how many.

        A demotion launched in the current cache call ``epoch`` is left for the next one unless
        ``include_current_epoch``; one whose node is a copy-on-write source staged in this epoch
        is skipped (the staged copy reads the native slot). Without ``wait`` (``maintain``) a
        candidate is committed only if its event has completed (``query()``) on every TP rank
        (:func:`agree_all` when TP > 1), so the scheduler thread never blocks on the GPU; with
        ``wait`` (the reclamation walk, which needs the slot now) every candidate is committed
        after the current stream has been ordered behind its event (:func:`order_after`).
        """
        cands = []
        for nid in sorted(self.pending):
            d = self.pending[nid]
            if d.epoch == epoch and not include_current_epoch:
                continue
            cd = d.node.component_data[self.ct]
            if is_staged(cd, epoch):
                continue
            if cd.lock_ref == 1:     # only the pin: no hit holds it
                cands.append(d)
        if not wait and cands:
            ready = self._ready_on_all_ranks(cands)
            cands = [d for d, ok in zip(cands, ready) if ok]
        for d in cands:
            if wait:
                t0 = time.perf_counter()
                order_after(d.event, self.reclaim_wait, self.streams)
                self.counters.reclaim_waits += 1
                self.counters.reclaim_wait_host_s += time.perf_counter() - t0
            self._commit(d)
        return len(cands)

    def _ready_on_all_ranks(self, cands: list[Demotion]) -> list[bool]:
        """Per candidate: its event has completed here and, with TP > 1, on every attention-TP rank."""
        flags = [bool(d.event.query()) for d in cands]
        if self.dpool.layout.tp_size <= 1:
            return flags
        if self.tp_cpu_group is None:
            from sglang.srt.distributed.parallel_state import get_attn_tp_group

            self.tp_cpu_group = get_attn_tp_group().cpu_group
        return agree_all(flags, self.tp_cpu_group)

    def drop_all(self) -> None:
        """Wait for every launched pack and forget the pending demotions (the tree was flushed)."""
        for d in self.pending.values():
            d.event.synchronize()
        self.pending.clear()

    def cancel_all(self) -> int:
        """Undo every pending demotion: wait for its pack, free its compressed slot, unpin the node
        (it stays dense, in the tree). For a weight update, whose old-weight packs are not to be
        committed. Returns how many were cancelled."""
        n = len(self.pending)
        for nid in sorted(self.pending):
            d = self.pending.pop(nid)
            d.event.synchronize()
            self.dpool.free(d.target)
            self.cache.dec_lock_ref(d.node.id, d.lock.to_dec_params())
        return n
