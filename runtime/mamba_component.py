"""SGLang's Mamba tree component with dasc's two tiers (paper §4.4, App. B.2).

:class:`DascMambaComponent` replaces SGLang's ``MambaComponent`` (0.5.17:
``mem_cache/unified_cache/components/mamba_component.py``, 0.5.23: ``.../components/mamba.py``; every
call whose signature differs goes through the installed release's adapter,
:func:`dasc_runtime.sglang_api.api`) through
``CacheInitParams.component_registry_override`` (``plugin.around_create_unified_radix_cache``). It
keeps SGLang's tree, lock and LRU machinery and overrides only the calls where the tier of a cached
state matters; each override's docstring says what SGLang calls it for, what dasc changes and which
step of App. B.2 it is. The App. B.2 policy reads top to bottom: compressed-first insertion with
dense spill (:meth:`prepare_for_caching_req`), reclamation of native slots over the one LRU
(:meth:`_evict_device_next_node`), watermark demotion after every cache call (:meth:`maintain`).
Tier bookkeeping is :mod:`dasc_runtime.tiers`; the demoting state is :mod:`dasc_runtime.demotion`;
dasc's own operations (watermark step, LRU queries, one-node eviction, dropping the compressed tier)
are the base class :class:`dasc_runtime.tier_operations.TierOperations`.

Invariants (checked by ``tests/runtime/test_tiers_random.py`` after every operation):
``native free + dense nodes + request-held == M``; ``compressed free + compressed nodes + pending
demotions == C``; locked nodes are never demoted or evicted; demotion keeps the LRU order.
"""

from __future__ import annotations

import json
import logging
from typing import Optional

import torch

# the package exports both classes in 0.5.17 and 0.5.23 (their modules were renamed in 0.5.23)
from sglang.srt.mem_cache.unified_cache.components import EvictLayer, MambaComponent

from dasc_runtime.account import ACCOUNT_TAG, CheckpointAccount, classify_origin
from dasc_runtime.demotion import DemotionEngine
from dasc_runtime.pool import DascCheckpointPool
from dasc_runtime.sglang_api import api
from dasc_runtime.side_channels import (attach_component, insert_origin, insert_tier, mark_reused, mark_staged,
                                       pop_node_history, set_insert_origin, set_insert_tier, set_node_origin,
                                       tier_policy_of)
from dasc_runtime.tier_operations import TierOperations, evict_fork_test, evict_shadowed_first
from dasc_runtime.tiers import COMPRESSED, DENSE, ShadowCounts, TierBook, TierCounters, TierPolicy

__all__ = ["DascMambaComponent"]

logger = logging.getLogger(__name__)

SGLANG = api()      # the installed release's adapter (refuses an untested SGLang here, at import)


class DascMambaComponent(TierOperations, MambaComponent):
    """SGLang's Mamba tree component with the dense + compressed tiers (see module docstring).

    Requires ``req_to_token_pool.mamba_ckpt_pool`` to be a :class:`DascCheckpointPool` (the plugin
    installs it); the pool's tier policy (:func:`~dasc_runtime.side_channels.tier_policy_of`)
    sets the mode.

    Attributes:
        dpool: the compressed tier. policy: :class:`TierPolicy`. counters: :class:`TierCounters`.
        account: :class:`~dasc_runtime.account.CheckpointAccount` (origin of each checkpoint, reuse,
        evictions; logged and restarted at every flush).
        book: :class:`TierBook`. demotions: :class:`~dasc_runtime.demotion.DemotionEngine`.
        shadows: :class:`ShadowCounts` (on unless ``DASC_EVICT_SHADOWED_FIRST=0``; its fork test on unless
        ``DASC_EVICT_FORK_TEST=0``; see :mod:`dasc_runtime.tier_operations`).
        epoch: cache calls completed (one :meth:`maintain` each).
    Raises:
        RuntimeError: the request pool holds no dasc pool.
    """

    def __init__(self, cache, params) -> None:
        """SGLang's cache registry builds the component with the cache; dasc adds its tier state."""
        super().__init__(cache, params)
        dpool = getattr(params.req_to_token_pool, "mamba_ckpt_pool", None)
        if not isinstance(dpool, DascCheckpointPool):
            raise RuntimeError("DascMambaComponent needs the dasc pool in HybridReqToTokenPool.mamba_ckpt_pool")
        self.dpool: DascCheckpointPool = dpool
        self.policy: TierPolicy = tier_policy_of(dpool) or TierPolicy()
        self.counters = TierCounters()
        self.account = CheckpointAccount()
        self.book = TierBook()
        self.shadows = ShadowCounts(self.component_type, on=evict_shadowed_first(), fork_test=evict_fork_test())
        # dasc's default departs from App. B.2's one LRU: say in the server log which order evicts
        logger.info("dasc: eviction: %s", (
            "the LRU order alone, App. B.2 (DASC_EVICT_SHADOWED_FIRST=0)" if not self.shadows.on else
            "checkpoints with a cached descendant and no fork before it go before the LRU order "
            "(DASC_EVICT_SHADOWED_FIRST=0: the LRU alone)" if self.shadows.fork_test else
            "checkpoints with a cached descendant go before the LRU order, forks not tested (the A/B control "
            "DASC_EVICT_FORK_TEST=0)"))
        self.demotions = DemotionEngine(cache=cache, dpool=dpool, book=self.book, counters=self.counters,
                                        component_type=self.component_type)
        self.epoch = 0
        self._maintaining = False
        attach_component(dpool, self)

    # ------------------------------------------------------------------ views (counts: self.book)

    def tier(self, node) -> Optional[str]:
        """Tier of the node's cached state (``dense`` | ``compressed``), or None when it has none."""
        return self.book.tier(node.component_data[self.component_type])

    @property
    def pending(self) -> dict:
        """Pending demotions, node id -> :class:`~dasc_runtime.demotion.Demotion`."""
        return self.demotions.pending

    # ------------------------------------------------------------------ SGLang overrides: ownership

    @property
    def int8_ckpt_pool(self):
        """SGLang's base methods branch on this to use the INT8 checkpoint pool for every cached state.

        dasc: None, so the base code paths dasc reuses take SGLang's native (dense) branches; the
        compressed tier is handled explicitly by the overrides below (App. B.2 "Allocation and
        ownership": dense cached states stay in native slots).
        """
        return None

    def _free_mamba_value(self, mamba_value: torch.Tensor) -> None:
        """SGLang frees a node's or an unused insert's value here (``FreeComponentDeviceSlot``, cleanup).

        dasc: a compressed id goes back to the compressed pool, a native id to SGLang's allocator
        (told apart from tensor metadata, no device read). App. B.2 "Allocation and ownership".
        """
        if self.dpool.is_own_id_tensor(mamba_value):
            self.dpool.free(mamba_value)
        else:
            self.cache.req_to_token_pool.mamba_allocator.free(mamba_value)

    def acquire_component_lock(self, node, result, lock_host: bool = False):
        """SGLang locks a node's state for a running request (``inc_lock_ref``), or dasc pins it for a demotion.

        dasc: also counts locked checkpoints per tier (``dense_protected`` for the pool statistics
        and the invariant check). App. B.2 "Allocation and ownership": the lock count of a node.
        """
        cd = node.component_data[self.component_type]
        before = cd.lock_ref
        out = super().acquire_component_lock(node, result, lock_host)
        if not lock_host and before == 0 and cd.lock_ref == 1:
            self.book.on_lock(cd)
        return out

    def release_component_lock(self, node, params, lock_host: bool = False) -> None:
        """SGLang unlocks a node (``dec_lock_ref``); dasc updates the per-tier locked counts."""
        cd = node.component_data[self.component_type]
        before = cd.lock_ref
        super().release_component_lock(node, params, lock_host)
        if not lock_host and before == 1 and cd.lock_ref == 0:
            self.book.on_unlock(cd)

    # ------------------------------------------------------------------ SGLang overrides: insertion

    def _alloc_compressed(self) -> Optional[torch.Tensor]:
        """A compressed slot (int64 ``[1]``), or None.

        None means dense spill, or in compressed-only mode that every compressed checkpoint is
        locked by running requests (App. B.2 backpressure: the caller does not cache the state).
        Compressed-only mode evicts the oldest unlocked compressed checkpoints to make room
        (:meth:`_victim`: shadowed ones first unless ``DASC_EVICT_SHADOWED_FIRST=0``).
        """
        if not self.policy.compressed_tier:
            return None
        c = self.dpool.alloc(1)
        if c is not None or not self.policy.compressed_only:
            return c
        x = self._victim(COMPRESSED)
        while x is not None and c is None:
            self.evict_node(x)
            c = self.dpool.alloc(1)
            x = self._victim(COMPRESSED) if c is None else None
        return c

    def prepare_for_caching_req(self, req, insert_params, token_ids_len: int, is_finished: bool) -> Optional[int]:
        """SGLang asks for the value to insert for a finished request or a chunk (``cache_*_req``).

        Returns the cached length and sets ``insert_params.mamba_value``. dasc: compressed-first,
        the request's state is packed into a compressed slot; dense spill (SGLang's own donate) when
        the compressed pool is full; in compressed-only mode with every compressed checkpoint
        locked, cache length 0 (SGLang's "nothing to cache" path). The chosen tier travels to the
        two later calls of this insert (:func:`~dasc_runtime.side_channels.set_insert_tier`). App.
        B.2 "Insertion and reuse".
        """
        set_insert_origin(insert_params, classify_origin(is_finished=is_finished, fill_len=token_ids_len,
                                                         prompt_len=len(req.origin_input_ids)))
        cache = self.cache
        pool = cache.req_to_token_pool
        st = SGLANG.mamba_state(req)
        extra = cache.enable_mamba_extra_buffer
        tracked = None
        if is_finished and extra:
            picked = SGLANG.finished_checkpoint(self, req, token_ids_len, insert_params)
            cache_len, tracked = picked if picked is not None else (0, None)
        else:
            cache_len = st.mamba_last_track_seqlen if extra else token_ids_len
        if not cache_len:
            # nothing to cache: SGLang's own handling (dense value, dropped by the insert)
            out = super().prepare_for_caching_req(req, insert_params, token_ids_len, is_finished)
            set_insert_tier(insert_params, DENSE)
            return out
        c = self._alloc_compressed()
        if c is None and self.policy.compressed_only:
            # every compressed checkpoint is locked: do not cache this state (App. B.2 backpressure).
            # Cache length 0 is SGLang's own "nothing to cache" path: no insert, and its cleanup
            # frees the request's slots (finished) or keeps them (unfinished).
            insert_params.mamba_value = None
            set_insert_tier(insert_params, DENSE)
            self.counters.skipped += 1
            logger.debug("dasc: compressed pool full of locked checkpoints; state of %s not cached",
                         getattr(req, "rid", "?"))
            return 0
        if c is None:                                       # dense spill (App. B.2)
            out = super().prepare_for_caching_req(req, insert_params, token_ids_len, is_finished)
            set_insert_tier(insert_params, DENSE)
            return out
        mp = pool.mamba_pool
        if is_finished:
            self.dpool.store_from_active(mp, tracked if extra else st.mamba_pool_idx.view(-1), c)
        elif extra:
            new_slot = SGLANG.alloc_native_slot(self, req)
            src_active = pool.donate_mamba_ping_pong_slot(req, new_slot)
            self.dpool.store_from_active(mp, src_active.view(-1), c)
            pool.mamba_allocator.free(src_active)
        else:
            self.dpool.store_from_active(mp, st.mamba_pool_idx.view(-1), c)
        insert_params.mamba_value = c
        set_insert_tier(insert_params, COMPRESSED)
        return cache_len

    def commit_insert_component_data(self, node, is_new_leaf: bool, params, result, cache_actions) -> None:
        """SGLang stores the prepared value on the tree node (or finds the node already holds one).

        dasc: records the tier chosen in :meth:`prepare_for_caching_req` on the node and counts the
        insert by tier; SGLang's LRU insertion is unchanged (one recency order over both tiers).
        App. B.2 "Insertion and reuse".
        """
        cd = node.component_data[self.component_type]
        had = cd.value is not None
        super().commit_insert_component_data(node, is_new_leaf, params, result, cache_actions)
        if not had and cd.value is not None:
            tier = insert_tier(params, DENSE)
            self.book.set(cd, tier)
            self.shadows.stored(node)
            origin = insert_origin(params)
            if origin is not None:
                set_node_origin(cd, origin)
                self.account.stored(origin)
            if tier == COMPRESSED:
                self.counters.inserts_compressed += 1
            else:
                self.counters.inserts_dense += 1

    def cleanup_after_caching_req(self, req, is_finished: bool, insert_result=None, insert_params=None) -> None:
        """SGLang releases what the insert did not keep and the request's own slots.

        dasc: for a compressed insert, frees the compressed slot when the tree already held a state
        there and frees (finished) or keeps (unfinished) the request's native slots; dense inserts
        are SGLang's own cleanup. Then :meth:`maintain` (commit finished demotions, watermark).
        App. B.2 "Insertion and reuse" / "Pressure-driven reclamation".
        """
        if insert_tier(insert_params, DENSE) != COMPRESSED:
            super().cleanup_after_caching_req(req, is_finished, insert_result, insert_params)
        else:
            value = insert_params.mamba_value
            unused = insert_result is None or insert_result.mamba_exist
            if unused and value is not None:
                self.dpool.free(value)
            if is_finished:
                self.cache.req_to_token_pool.free_mamba_cache(req)
            else:
                SGLANG.forget_tracking(req)
        self.maintain()

    def redistribute_on_node_split(self, new_parent, child) -> None:
        """SGLang splits ``child``: ``new_parent`` takes the first part of its key, the state stays on
        ``child``. dasc: the new node's count of cached descendants (:class:`ShadowCounts`)."""
        super().redistribute_on_node_split(new_parent=new_parent, child=child)
        self.shadows.split(new_parent, child)

    # ------------------------------------------------------------------ SGLang overrides: hits

    def finalize_match_result_in_cache(self, params, result):
        """SGLang stages the copy-on-write of a matched state into the request's slot (a hit).

        dasc: marks the source node staged for this cache call (not demoted or evicted before the
        next one: the scheduler locks it right after the match, or drops the stage). The staged
        source id may be native (dense hit: exact copy) or compressed (dasc-nr restore);
        ``DascCheckpointPool.load_to_active`` tells them apart. Hits are counted when the request is
        admitted (:meth:`TierCounters.count_admitted_hits`), not here: a request that is matched
        but not admitted is matched again later. App. B.2 "Insertion and reuse" (cache reuse).
        """
        if params.cow_mamba:
            node = self.tree_core.node_by_id(result.best_match_node)
            if node is not self.tree_core.root_node and self.tier(node) is not None:
                cd = node.component_data[self.component_type]
                mark_staged(cd, self.epoch)
                first = mark_reused(cd)
                if first is not None:
                    self.account.reused(first)
        return super().finalize_match_result_in_cache(params, result)

    # ------------------------------------------------------------------ SGLang overrides: eviction

    def evict_component(self, node, device_frees, host_frees, *args, **kwargs):
        """SGLang drops one node's state (eviction walk, cascade, excess path states).

        Returns ``(native slots freed, host slots freed)``. dasc: a compressed state frees its
        compressed slot directly and reports 0 native slots freed ("evicting a compressed node
        alone cannot free a native slot"); a dense one is SGLang's own eviction. Both clear the
        node's tier. App. B.2 "Pressure-driven reclamation". The arguments after ``host_frees``
        differ between releases (0.5.23 adds ``cache_actions``); they pass through unchanged.
        """
        target, _ = SGLANG.evict_component_args(args, kwargs)
        cd = node.component_data[self.component_type]
        if EvictLayer.DEVICE in target and cd.value is not None:
            assert node.id not in self.pending, f"node {node.id} is being demoted (pinned) and cannot be evicted"
            assert cd.lock_ref == 0, f"node {node.id} is locked (lock_ref={cd.lock_ref}) and cannot be evicted"
            origin, reused = pop_node_history(cd)
            if origin is not None:
                self.account.evicted(origin, reused)
            if self.shadows.shadowed(node):         # the shadowed-first rule's own victims (on only)
                self.counters.evictions_shadowed += 1
            self.shadows.dropped(node)
            if self.tier(node) == COMPRESSED:
                self.dpool.free(cd.value)
                self.tree_core.component_evictable_size_[self.component_type] -= len(cd.value)
                self.book.clear(cd)
                cd.value = None
                self.counters.evictions_compressed += 1
                _, host = super().evict_component(node, device_frees, host_frees, *args, **kwargs)
                return 0, host          # no native slot freed
            self.book.clear(cd)
            self.counters.evictions_dense += 1
        return super().evict_component(node, device_frees, host_frees, *args, **kwargs)

    def _evict_device_start(self, request_cnt: int) -> None:
        """SGLang starts a walk to free ``request_cnt`` native slots; dasc keeps only the count (its
        walk, :meth:`_evict_device_next_node`, uses no SGLang cursor). App. B.2 reclamation."""
        self._evict_request = request_cnt

    def _evict_device_end(self) -> None:
        """SGLang ends the walk; dasc forgets the request."""
        self._evict_request = 0

    def _evict_device_next_node(self, tracker, device_frees, host_frees, *args, **kwargs):
        """SGLang asks for the next step of the walk until ``tracker[MAMBA]`` native slots are freed.

        Returns the id of a leaf for SGLang's driver to evict (its Full KV goes too), or None when
        the request is met or nothing else can free a native slot. dasc, App. B.2 "Pressure-driven
        reclamation": first commit pending demotions (waiting for their packs, see
        :meth:`DemotionEngine.commit_ready`); then compressed space free -> demote the oldest
        eligible dense node now; else evict the oldest eligible node (a compressed one only while a
        dense node remains to be demoted into its slot; :meth:`_victim`: shadowed ones first unless
        ``DASC_EVICT_SHADOWED_FIRST=0``). The walk loops until the request is met,
        so both releases' drivers fit: 0.5.17 stops at the first None, 0.5.23 calls again after a
        step that made progress (the next call then returns None with none). 0.5.23's
        ``cache_actions`` collect the cascade's actions, applied by SGLang after the call.
        """
        actions = SGLANG.walk_actions(args, kwargs)
        ct = self.component_type
        tc = self.tree_core
        while tracker[ct] < self._evict_request:
            if self.pending:
                n = self.demotions.commit_ready(self.epoch, include_current_epoch=True, wait=True)
                if n:
                    tracker[ct] += n
                    continue
            if not self.policy.compressed_only and self.policy.compressed_tier and self.dpool.available_size() > 0:
                d = self._oldest(DENSE)
                if d is not None:
                    self.demotions.demote_now(d)
                    tracker[ct] += 1
                    continue
            x = self._victim(None)
            if x is None:
                return None
            if self.tier(x) == COMPRESSED and self._oldest(DENSE, exclude=x) is None:
                return None                 # evicting compressed states cannot free a native slot
            if x in tc.evictable_device_leaves:
                return x.id
            SGLANG.evict_in_walk(tc, x, self, tracker, device_frees, host_frees, actions)
        return None

    def reset_session_state(self) -> None:
        """SGLang resets per-session state when the cache is built or flushed (``reset()``).

        dasc: also waits for launched packs and drops pending demotions and the per-tier counts
        (the tree and both pools are being emptied), and logs the checkpoint account of the stretch
        since the last flush as one ``dasc account: {json}`` line (:mod:`dasc_runtime.account`),
        unless nothing happened. Called once from SGLang's base constructor, before dasc's own state
        exists.
        """
        super().reset_session_state()
        if hasattr(self, "demotions"):
            self.demotions.drop_all()
            self.book.reset()
        if hasattr(self, "account"):
            acct = self.account.close(self.counters)
            if not CheckpointAccount.is_empty(acct):
                logger.info("%s%s", ACCOUNT_TAG, json.dumps(acct, separators=(",", ":"), sort_keys=True))
