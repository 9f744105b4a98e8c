"""Two-tier state-checkpoint cache on SGLang 0.5.17's UnifiedRadixCache (paper §4.4, App. B.2).

:class:`DascMambaComponent` replaces SGLang's ``MambaComponent`` (``mem_cache/unified_cache/
components/mamba_component.py``) through ``CacheInitParams.component_registry_override``. It keeps
SGLang's tree, lock and LRU machinery and changes only where a cached recurrent state lives:

* dense tier: a native slot of SGLang's ``MambaPool`` (shared with running requests);
* compressed tier: a slot of :class:`~dasc_runtime.pool.DascCheckpointPool` (ragged kept units).

Node fields. The state of a node is ``component_data[MAMBA].value`` (int64 ``[1]``, one id space:
native ids ``0..M``, compressed ids ``M+1+c``); ``metadata["dasc_tier"]`` records the tier on the
host. Both tiers share SGLang's one Mamba LRU list (the global recency order); demotion changes
the value and the tier, never the list position.

Policy (App. B.2):

* insertion is compressed-first; when the compressed pool is full a finished request hands its
  native slot to the tree (no copy), an unfinished one uses SGLang's donate. ``compressed_only``
  turns dense spill off and evicts the oldest unlocked compressed checkpoint instead; when every
  compressed checkpoint is locked by running requests the state is not cached (backpressure, App.
  B.2; counted in ``TierCounters.skipped``) and the request goes on;
* reclamation of native slots (``evict(mamba_num=n)``) walks the LRU from the oldest unlocked
  node: compressed space free -> demote the oldest dense node; both full and the oldest node is
  dense -> evict it; the oldest node is compressed -> evict it and demote the oldest dense node
  into the freed slot. With no dense node left, nothing can free a native slot: the walk stops;
* watermark demotion: after each cache call, when free native slots fall below the watermark,
  the oldest unlocked dense nodes are packed on a side stream (an event records completion) while
  SGLang's lock pins the node; the new tier is committed, and the native slot freed, only once
  the event has completed and no hit holds the node. ``maintain`` (after each cache call) never
  blocks: it commits only demotions whose event ``query()`` reports complete, and with TP > 1 only
  those complete on every rank (one all-reduce MIN of the flags on the attention-TP CPU group,
  :func:`~dasc_runtime.tp_transfer.agree_all`), so every TP rank commits the same demotions in
  the same step. Only the reclamation walk, which needs the native slot now, waits, and only at
  the device level: the current (schedule) stream ``wait_event``s on each candidate
  (``DASC_RECLAIM_WAIT=host``: the host blocks in ``event.synchronize()``; see
  :func:`reclaim_wait_mode`); it commits every candidate, so it is deterministic without a
  collective;
* storage balancing (``layout.storage``): the pack issues an all-to-all on the TP group; on a side
  stream it could interleave with the model's TP collectives on the main stream in a different
  order on different ranks (a cross-rank deadlock), so such pools demote synchronously on the
  current stream (:meth:`DascMambaComponent.demote_now`), never on the side stream.

Invariants kept (checked by ``tests/test_runtime_tiers_random.py`` after every operation):
``native free + dense nodes + request-held == M``; ``compressed free + compressed nodes == C``;
a pending demotion owns exactly one compressed slot; locked nodes are never demoted or evicted;
the LRU order is the order before any demotion.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from sglang.srt.mem_cache.unified_cache.components.mamba_component import MambaComponent
from sglang.srt.mem_cache.unified_cache.components.tree_component import EvictLayer

from dasc_compile.schema import DascInputError
from dasc_runtime.pool import DascCheckpointPool
from dasc_runtime.tp_transfer import agree_all

__all__ = ["DascMambaComponent", "TierCounters", "TierPolicy", "DENSE", "COMPRESSED", "TIER_KEY"]

logger = logging.getLogger(__name__)

DENSE = "dense"
COMPRESSED = "compressed"
TIER_KEY = "dasc_tier"
_PARAMS_TIER = "_dasc_tier"
_STAGED_KEY = "dasc_staged_epoch"


@dataclass(frozen=True, kw_only=True)
class TierPolicy:
    """Two-tier settings. ``watermark``: free native slots below which demotion starts (0 = only on demand)."""

    compressed_only: bool = False
    watermark: int = 0


@dataclass
class TierCounters:
    """Cache-side counters (checkpoints). Restores by tier are counted by the pool (``PoolCounters``)."""

    hits_dense: int = 0             # matches whose state is a dense checkpoint (copy-on-write staged)
    hits_compressed: int = 0        # matches whose state is a compressed checkpoint
    inserts_compressed: int = 0     # states that entered the tree packed (compressed-first)
    inserts_dense: int = 0          # states that entered the tree in a native slot (dense spill)
    demotions_started: int = 0      # async demotions launched (watermark)
    demotions_committed: int = 0    # async demotions committed after their event
    demotions_sync: int = 0         # demotions on the current stream (reclamation; every one with storage balancing)
    evictions_dense: int = 0
    evictions_compressed: int = 0
    skipped: int = 0                # states not cached: compressed-only pool full of locked checkpoints
    reclaim_waits: int = 0          # pending demotions the reclamation walk had to wait for
    reclaim_wait_host_s: float = 0.0  # scheduler-thread time spent in those waits (s; ~0 with stream waits)


class _DoneEvent:
    """Completion record of a demotion pack that ran synchronously (CPU, or no side stream)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class SideStream:
    """Runs demotion packs on a background CUDA stream (App. B.2 "Transactional demotion").

    ``run(fn)`` makes the side stream wait for the current stream (the state being packed was
    written there), runs ``fn`` on the side stream and returns an event recorded after it. On CPU
    ``fn`` runs inline and a completed record is returned.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(device=self.device) if self.device.type == "cuda" else None

    def run(self, fn: Callable[[], None]):
        if self.stream is None:
            fn()
            return _DoneEvent()
        cur = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(cur)
        with torch.cuda.stream(self.stream):
            fn()
            ev = torch.cuda.Event()
            ev.record(self.stream)
        return ev


def reclaim_wait_mode() -> str:
    """``DASC_RECLAIM_WAIT``: how the reclamation walk orders itself after a pending demotion.

    ``stream`` (default): the current CUDA stream waits on the demotion's event (``wait_event``, no
    host block). Safe because every later write to the freed native slot is issued on SGLang's
    schedule stream after this point, or on its forward stream, which waits on the schedule stream
    before each forward (sglang/srt/managers/scheduler.py, 0.5.17; state zeroing and copy-on-write
    of hits are deferred to the forward stream), and a later demotion's side stream first waits on
    the schedule stream (:meth:`SideStream.run`). The argument rests on those waits and on the
    configurations ``verify.check_server_args`` refuses (host offload, PD transfer, speculative
    states, pipeline parallelism); re-check it on an SGLang upgrade. ``host``: the scheduler thread
    blocks in ``event.synchronize()`` (the earlier behaviour; kept to compare the two on a GPU).

    Raises:
        DascInputError: any other value.
    """
    mode = os.environ.get("DASC_RECLAIM_WAIT", "stream").strip().lower() or "stream"
    if mode not in ("stream", "host"):
        raise DascInputError(f"DASC_RECLAIM_WAIT: expected 'stream' or 'host', got {mode!r}")
    return mode


def _order_after(event, mode: str, device) -> None:
    """Make later work see a pending demotion's pack as done (see :func:`reclaim_wait_mode`).

    A CUDA event under ``stream`` makes the current stream of its device wait on it; anything else
    (``host`` mode, or the CPU / test completion records, which have no stream) is synchronized.
    """
    if mode == "stream" and isinstance(event, torch.cuda.Event):
        torch.cuda.current_stream(torch.device(device)).wait_event(event)
        return
    event.synchronize()


@dataclass
class _Demotion:
    node: object                    # UnifiedTreeNode
    target: torch.Tensor            # compressed id it is being packed into
    event: object                   # torch.cuda.Event or _DoneEvent
    lock: object                    # IncLockRefResult of the pin
    epoch: int                      # maintenance epoch it was launched in


class DascMambaComponent(MambaComponent):
    """SGLang's Mamba tree component with the dense + compressed tiers (see module docstring).

    Requires ``req_to_token_pool.mamba_ckpt_pool`` to be a :class:`DascCheckpointPool` (the plugin
    installs it). The pool's ``tier_policy`` attribute (a :class:`TierPolicy`) sets the mode.
    """

    def __init__(self, cache, params) -> None:
        super().__init__(cache, params)
        dpool = getattr(params.req_to_token_pool, "mamba_ckpt_pool", None)
        if not isinstance(dpool, DascCheckpointPool):
            raise RuntimeError("DascMambaComponent needs the dasc pool in HybridReqToTokenPool.mamba_ckpt_pool")
        self.dpool: DascCheckpointPool = dpool
        self.policy: TierPolicy = getattr(dpool, "tier_policy", None) or TierPolicy()
        self.counters = TierCounters()
        self.side = SideStream(dpool.device)
        self.reclaim_wait = reclaim_wait_mode()
        self.tp_cpu_group = None        # attention-TP CPU group for agree_all (TP > 1), resolved on first use
        self.pending: dict[int, _Demotion] = {}
        self._epoch = 0
        self._count = {DENSE: 0, COMPRESSED: 0}
        self._locked = {DENSE: 0, COMPRESSED: 0}
        self._maintaining = False
        dpool.component = self

    # ------------------------------------------------------------------ tier bookkeeping

    @property
    def int8_ckpt_pool(self):
        # Base-class code paths take SGLang's native (dense) branches; the compressed tier is
        # handled explicitly by the overrides below.
        return None

    def tier(self, node) -> Optional[str]:
        """Tier of the node's cached state, or None when it has none."""
        cd = node.component_data[self.component_type]
        if cd.value is None:
            return None
        return cd.metadata.get(TIER_KEY, DENSE)

    def _set_tier(self, node, tier: str) -> None:
        cd = node.component_data[self.component_type]
        old = cd.metadata.get(TIER_KEY)
        if old is not None:
            self._count[old] -= 1
            if cd.lock_ref > 0:
                self._locked[old] -= 1
        cd.metadata[TIER_KEY] = tier
        self._count[tier] += 1
        if cd.lock_ref > 0:
            self._locked[tier] += 1

    def _clear_tier(self, node) -> None:
        cd = node.component_data[self.component_type]
        old = cd.metadata.pop(TIER_KEY, None)
        if old is not None:
            self._count[old] -= 1
            if cd.lock_ref > 0:
                self._locked[old] -= 1

    def tier_counts(self) -> dict[str, int]:
        """Cached checkpoints per tier (pending demotions count as dense until committed)."""
        return dict(self._count)

    def dense_evictable(self) -> int:
        """Dense checkpoints not held by any lock (native slots the tree could give back)."""
        return self._count[DENSE] - self._locked[DENSE]

    def dense_protected(self) -> int:
        return self._locked[DENSE]

    def _free_mamba_value(self, mamba_value: torch.Tensor) -> None:
        if self.dpool.is_own_id_tensor(mamba_value):
            self.dpool.free(mamba_value)
        else:
            self.cache.req_to_token_pool.mamba_allocator.free(mamba_value)

    # ------------------------------------------------------------------ locks (per-tier counts)

    def acquire_component_lock(self, node, result, lock_host: bool = False):
        cd = node.component_data[self.component_type]
        before = cd.lock_ref
        out = super().acquire_component_lock(node, result, lock_host)
        if not lock_host and before == 0 and cd.lock_ref == 1 and cd.value is not None:
            t = cd.metadata.get(TIER_KEY)
            if t is not None:
                self._locked[t] += 1
        return out

    def release_component_lock(self, node, params, lock_host: bool = False) -> None:
        cd = node.component_data[self.component_type]
        before = cd.lock_ref
        super().release_component_lock(node, params, lock_host)
        if not lock_host and before == 1 and cd.lock_ref == 0 and cd.value is not None:
            t = cd.metadata.get(TIER_KEY)
            if t is not None:
                self._locked[t] -= 1

    # ------------------------------------------------------------------ insertion (compressed-first)

    def _alloc_compressed(self) -> Optional[torch.Tensor]:
        """A compressed slot (int64 ``[1]``), or None.

        None means dense spill, or in compressed-only mode that every compressed checkpoint is
        locked by running requests (App. B.2 backpressure: the caller does not cache the state).
        Compressed-only mode evicts the oldest unlocked compressed checkpoints to make room.
        """
        c = self.dpool.alloc(1)
        if c is not None or not self.policy.compressed_only:
            return c
        x = self._oldest(COMPRESSED)
        while x is not None and c is None:
            self.evict_node(x)
            c = self.dpool.alloc(1)
            x = self._oldest(COMPRESSED) if c is None else None
        return c

    def prepare_for_caching_req(self, req, insert_params, token_ids_len: int, is_finished: bool) -> Optional[int]:
        cache = self.cache
        pool = cache.req_to_token_pool
        extra = cache.enable_mamba_extra_buffer
        cache_len = req.mamba_last_track_seqlen if extra else token_ids_len
        if not cache_len:
            # nothing to cache: SGLang's own handling (dense value, dropped by the insert)
            out = super().prepare_for_caching_req(req, insert_params, token_ids_len, is_finished)
            setattr(insert_params, _PARAMS_TIER, DENSE)
            return out
        c = self._alloc_compressed()
        if c is None and self.policy.compressed_only:
            # every compressed checkpoint is locked: do not cache this state (App. B.2 backpressure).
            # Cache length 0 is SGLang's own "nothing to cache" path: no insert, and its cleanup
            # frees the request's slots (finished) or keeps them (unfinished).
            insert_params.mamba_value = None
            setattr(insert_params, _PARAMS_TIER, DENSE)
            self.counters.skipped += 1
            logger.debug("dasc: compressed pool full of locked checkpoints; state of %s not cached",
                         getattr(req, "rid", "?"))
            return 0
        if c is None:                                       # dense spill (App. B.2)
            out = super().prepare_for_caching_req(req, insert_params, token_ids_len, is_finished)
            setattr(insert_params, _PARAMS_TIER, DENSE)
            return out
        mp = pool.mamba_pool
        if is_finished:
            src = (req.mamba_ping_pong_track_buffer[pool.get_mamba_ping_pong_keep_idx(req)].view(-1) if extra
                   else req.mamba_pool_idx.view(-1))
            self.dpool.store_from_active(mp, src, c)
        elif extra:
            new_slot = self._alloc_mamba_slot()
            src_active = pool.donate_mamba_ping_pong_slot(req, new_slot)
            self.dpool.store_from_active(mp, src_active.view(-1), c)
            pool.mamba_allocator.free(src_active)
        else:
            self.dpool.store_from_active(mp, req.mamba_pool_idx.view(-1), c)
        insert_params.mamba_value = c
        setattr(insert_params, _PARAMS_TIER, COMPRESSED)
        return cache_len

    def commit_insert_component_data(self, node, is_new_leaf: bool, params, result, cache_actions) -> None:
        cd = node.component_data[self.component_type]
        had = cd.value is not None
        super().commit_insert_component_data(node, is_new_leaf, params, result, cache_actions)
        if not had and cd.value is not None:
            tier = getattr(params, _PARAMS_TIER, DENSE)
            self._set_tier(node, tier)
            if tier == COMPRESSED:
                self.counters.inserts_compressed += 1
            else:
                self.counters.inserts_dense += 1

    def cleanup_after_caching_req(self, req, is_finished: bool, insert_result=None, insert_params=None) -> None:
        tier = getattr(insert_params, _PARAMS_TIER, DENSE) if insert_params is not None else DENSE
        if tier != COMPRESSED:
            super().cleanup_after_caching_req(req, is_finished, insert_result, insert_params)
        else:
            value = insert_params.mamba_value
            unused = insert_result is None or insert_result.mamba_exist
            if unused and value is not None:
                self.dpool.free(value)
            if is_finished:
                self.cache.req_to_token_pool.free_mamba_cache(req)
            else:
                req.mamba_last_track_seqlen = None
        self.maintain()

    # ------------------------------------------------------------------ hits

    def finalize_match_result_in_cache(self, params, result):
        if params.cow_mamba:
            node = self.tree_core.node_by_id(result.best_match_node)
            t = self.tier(node) if node is not self.tree_core.root_node else None
            if t is not None:
                # staged copy-on-write source: not demoted or evicted by dasc before the next
                # cache call (the scheduler locks it right after the match, or drops the stage)
                node.component_data[self.component_type].metadata[_STAGED_KEY] = self._epoch
                if t == COMPRESSED:
                    self.counters.hits_compressed += 1
                else:
                    self.counters.hits_dense += 1
        return super().finalize_match_result_in_cache(params, result)

    # ------------------------------------------------------------------ eviction of one node's state

    def evict_component(self, node, device_frees, host_frees, target=EvictLayer.DEVICE):
        cd = node.component_data[self.component_type]
        if EvictLayer.DEVICE in target and cd.value is not None:
            assert node.id not in self.pending, f"node {node.id} is being demoted (pinned) and cannot be evicted"
            assert cd.lock_ref == 0, f"node {node.id} is locked (lock_ref={cd.lock_ref}) and cannot be evicted"
            if self.tier(node) == COMPRESSED:
                self.dpool.free(cd.value)
                self.tree_core.component_evictable_size_[self.component_type] -= len(cd.value)
                self._clear_tier(node)
                cd.value = None
                self.counters.evictions_compressed += 1
                _, host = super().evict_component(node, device_frees, host_frees, target)
                return 0, host          # no native slot freed
            self._clear_tier(node)
            self.counters.evictions_dense += 1
        return super().evict_component(node, device_frees, host_frees, target)

    def evict_node(self, node) -> None:
        """Evict one unlocked node's state outside an eviction walk (leaf: the whole leaf, as SGLang does)."""
        tc = self.tree_core
        if node in tc.evictable_device_leaves:
            res = tc.evict_device_leaf(node.id, False)
            self.cache._free_values(res.device_frees, res.host_frees)
            return
        device_frees: dict = defaultdict(list)
        host_frees: dict = defaultdict(list)
        tracker: dict = defaultdict(int)
        tc._evict_component_and_detach_lru(node, self, device_frees, host_frees, target=EvictLayer.DEVICE,
                                           tracker=tracker)
        tc._cascade_evict(node, self, tracker, device_frees, host_frees)
        self.cache._free_values(device_frees, host_frees)

    # ------------------------------------------------------------------ LRU scans

    def eligible(self, node) -> bool:
        """Unlocked, not being demoted, and not a copy-on-write source staged since the last cache call."""
        cd = node.component_data[self.component_type]
        return (cd.lock_ref == 0 and node.id not in self.pending
                and cd.metadata.get(_STAGED_KEY) != self._epoch)

    def _oldest(self, tier: Optional[str], exclude=None):
        """Oldest eligible node of ``tier`` (any tier when None) in the shared Mamba LRU, or None."""
        lru = self.tree_core.lru_lists[self.component_type]
        x = lru.get_lru_no_lock()
        while x is not None:
            if x is not exclude and (tier is None or self.tier(x) == tier) and self.eligible(x):
                return x
            x = lru.get_prev_no_lock(x)
        return None

    # ------------------------------------------------------------------ demotion

    def _swap_to_compressed(self, node, target: torch.Tensor) -> torch.Tensor:
        cd = node.component_data[self.component_type]
        old = cd.value
        cd.value = target
        self._set_tier(node, COMPRESSED)
        return old

    def demote_now(self, node) -> None:
        """Synchronous demotion: pack on the current stream, swap, free the native slot.

        Used by the reclamation walk, and for every demotion of a storage-balanced pool.
        """
        cd = node.component_data[self.component_type]
        assert cd.lock_ref == 0 and self.tier(node) == DENSE and node.id not in self.pending
        c = self.dpool.alloc(1)
        assert c is not None, "demote_now needs a free compressed slot"
        self.dpool.store_from_active(self.cache.req_to_token_pool.mamba_pool, cd.value, c)
        old = self._swap_to_compressed(node, c)
        self.cache.req_to_token_pool.mamba_allocator.free(old)
        self.counters.demotions_sync += 1

    def demote_async(self, node) -> None:
        """Start a background demotion: pin the node, pack on the side stream, record the event.

        With storage balancing (``dpool.layout.storage``) the pack is an NCCL all-to-all on the TP
        group; issued on a side stream it could interleave with the model's TP collectives on the
        main stream differently on each rank (cross-rank deadlock), so the demotion is done
        synchronously on the current stream instead (:meth:`demote_now`, committed at once).
        """
        if self.dpool.layout.storage is not None:
            self.demote_now(node)
            return
        cd = node.component_data[self.component_type]
        assert cd.lock_ref == 0 and self.tier(node) == DENSE and node.id not in self.pending
        c = self.dpool.alloc(1)
        assert c is not None, "demote_async needs a free compressed slot"
        lock = self.cache.inc_lock_ref(node.id)
        value = cd.value
        mp = self.cache.req_to_token_pool.mamba_pool
        event = self.side.run(lambda: self.dpool.store_from_active(mp, value, c))
        self.pending[node.id] = _Demotion(node=node, target=c, event=event, lock=lock, epoch=self._epoch)
        self.counters.demotions_started += 1

    def _commit(self, d: _Demotion) -> None:
        """Swap the node to its packed slot and free the native one (the event has completed)."""
        node = d.node
        del self.pending[node.id]
        old = self._swap_to_compressed(node, d.target)
        self.cache.dec_lock_ref(node.id, d.lock.to_dec_params())
        self.cache.req_to_token_pool.mamba_allocator.free(old)
        self.counters.demotions_committed += 1

    def commit_ready(self, *, include_current_epoch: bool = False, wait: bool = False) -> int:
        """Commit pending demotions whose only holder is the demotion pin; returns how many.

        A demotion launched in the current epoch (cache call) is left for the next one unless
        ``include_current_epoch``; one whose node is a copy-on-write source staged in this epoch
        is skipped (the staged copy reads the native slot). Without ``wait`` (``maintain``) a
        candidate is committed only if its event has completed (``query()``) on every TP rank
        (:func:`~dasc_runtime.tp_transfer.agree_all` when TP > 1), so the scheduler thread never blocks on the GPU; with
        ``wait`` (the reclamation walk, which needs the slot now) every candidate is committed after
        the current stream has been ordered behind its event (:func:`_order_after`).
        """
        ct = self.component_type
        cands = []
        for nid in sorted(self.pending):
            d = self.pending[nid]
            if d.epoch == self._epoch and not include_current_epoch:
                continue
            cd = d.node.component_data[ct]
            if cd.metadata.get(_STAGED_KEY) == self._epoch:
                continue
            if cd.lock_ref == 1:     # only the pin: no hit holds it
                cands.append(d)
        if not wait and cands:
            ready = self._ready_on_all_ranks(cands)
            cands = [d for d, ok in zip(cands, ready) if ok]
        for d in cands:
            if wait:
                t0 = time.perf_counter()
                _order_after(d.event, self.reclaim_wait, self.dpool.device)
                self.counters.reclaim_waits += 1
                self.counters.reclaim_wait_host_s += time.perf_counter() - t0
            self._commit(d)
        return len(cands)

    def _ready_on_all_ranks(self, cands: list[_Demotion]) -> list[bool]:
        """Per candidate: its event has completed here and, with TP > 1, on every attention-TP rank."""
        flags = [bool(d.event.query()) for d in cands]
        if self.dpool.layout.tp_size <= 1:
            return flags
        if self.tp_cpu_group is None:
            from sglang.srt.distributed.parallel_state import get_attn_tp_group

            self.tp_cpu_group = get_attn_tp_group().cpu_group
        return agree_all(flags, self.tp_cpu_group)

    def maintain(self) -> None:
        """Commit completed demotions (never waits on an event), then start watermark demotions.

        Runs after every cache call on the scheduler thread; see :meth:`commit_ready`.
        """
        if self._maintaining:
            return
        self._maintaining = True
        try:
            self.commit_ready()
            self._epoch += 1
            if self.policy.compressed_only or self.policy.watermark <= 0:
                return
            native = self.cache.req_to_token_pool.mamba_allocator
            need = self.policy.watermark - native.available_size() - len(self.pending)
            while need > 0:
                if self.dpool.available_size() > 0:
                    d = self._oldest(DENSE)
                    if d is None:
                        return
                    self.demote_async(d)
                    need -= 1
                    continue
                x = self._oldest(None)
                if x is None or (self.tier(x) == COMPRESSED and self._oldest(DENSE, exclude=x) is None):
                    return
                self.evict_node(x)          # dense: frees a native slot; compressed: frees room to demote
                need = self.policy.watermark - native.available_size() - len(self.pending)
        finally:
            self._maintaining = False

    # ------------------------------------------------------------------ native-slot reclamation walk

    def _evict_device_start(self, request_cnt: int) -> None:
        self._evict_request = request_cnt

    def _evict_device_end(self) -> None:
        self._evict_request = 0

    def _evict_device_next_node(self, tracker, device_frees, host_frees):
        """App. B.2 reclamation: free native slots until ``tracker[MAMBA]`` reaches the request.

        Returns the id of a leaf for the driver to evict (its Full KV goes too), or None when the
        request is met or nothing else can free a native slot.
        """
        ct = self.component_type
        tc = self.tree_core
        while tracker[ct] < self._evict_request:
            if self.pending:
                n = self.commit_ready(include_current_epoch=True, wait=True)
                if n:
                    tracker[ct] += n
                    continue
            if not self.policy.compressed_only and self.dpool.available_size() > 0:
                d = self._oldest(DENSE)
                if d is not None:
                    self.demote_now(d)
                    tracker[ct] += 1
                    continue
            x = self._oldest(None)
            if x is None:
                return None
            if self.tier(x) == COMPRESSED and self._oldest(DENSE, exclude=x) is None:
                return None                 # evicting compressed states cannot free a native slot
            if x in tc.evictable_device_leaves:
                return x.id
            tc._evict_component_and_detach_lru(x, self, device_frees, host_frees, target=EvictLayer.DEVICE,
                                               tracker=tracker)
            tc._cascade_evict(x, self, tracker, device_frees, host_frees)
        return None

    # ------------------------------------------------------------------ reset

    def reset_session_state(self) -> None:
        super().reset_session_state()
        pending = getattr(self, "pending", None)
        if pending:
            for d in pending.values():
                d.event.synchronize()
            pending.clear()
        if hasattr(self, "_count"):
            self._count = {DENSE: 0, COMPRESSED: 0}
            self._locked = {DENSE: 0, COMPRESSED: 0}
