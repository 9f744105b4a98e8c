"""The two tiers of a cached state checkpoint, their policy, counters and per-node bookkeeping (App. B.2).

Paper App. B.2 "Allocation and ownership": a cached recurrent state lives in one of two tiers,

* ``dense``: a native slot of SGLang's ``MambaPool`` (shared with running requests);
* ``compressed``: a slot of :class:`~dasc_runtime.pool.DascCheckpointPool` (ragged kept units).

A node's state is ``component_data[MAMBA].value`` (int64 ``[1]``, one id space: native ids
``0..M``, compressed ids ``M+1+c``); its tier is recorded on the host in the node's metadata
(:func:`dasc_runtime.side_channels.node_tier`), so no decision reads a device tensor.
:class:`TierBook` keeps that record and the per-tier counts of cached and locked checkpoints the
scheduler's statistics and invariant checks need. The cache behaviour that uses these lives in
:mod:`dasc_runtime.mamba_component` (SGLang overrides) and :mod:`dasc_runtime.demotion`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from dasc_runtime.side_channels import (add_cached_below, cached_below, node_tier, pop_node_tier, set_cached_below,
                                       set_node_tier)

__all__ = ["DENSE", "COMPRESSED", "TierPolicy", "TierCounters", "TierBook", "ShadowCounts"]

DENSE = "dense"
COMPRESSED = "compressed"


@dataclass(frozen=True, kw_only=True)
class TierPolicy:
    """Two-tier settings.

    Attributes:
        compressed_only: cache states only in the compressed pool (no dense spill; the paper's
            accuracy runs, §5.1).
        watermark: free native slots below which watermark demotion starts (0 = only on demand).
        compressed_tier: False once the served weights no longer match the plan (a weight update,
            :mod:`dasc_runtime.weight_updates`): nothing is packed or demoted any more, states
            stay dense (compressed-only: are not cached).
    """

    compressed_only: bool = False
    watermark: int = 0
    compressed_tier: bool = True


@dataclass
class TierCounters:
    """Cache-side counters (checkpoints). Restores by tier are counted by the pool (``PoolCounters``)."""

    hits_dense: int = 0             # admitted requests restoring a dense checkpoint (copy-on-write)
    hits_compressed: int = 0        # admitted requests restoring a compressed checkpoint
    inserts_compressed: int = 0     # states that entered the tree packed (compressed-first)
    inserts_dense: int = 0          # states that entered the tree in a native slot (dense spill)
    demotions_started: int = 0      # async demotions launched (watermark)
    demotions_committed: int = 0    # async demotions committed after their event
    demotions_sync: int = 0         # demotions on the current stream (reclamation; every one with storage balancing)
    evictions_dense: int = 0
    evictions_compressed: int = 0
    evictions_shadowed: int = 0     # of those, checkpoints evicted while shadowed (counted only with
                                    # DASC_EVICT_SHADOWED_FIRST on: how often that rule chose the victim)
    skipped: int = 0                # states not cached: compressed-only pool full of locked checkpoints
    reclaim_waits: int = 0          # pending demotions the reclamation walk had to wait for
    reclaim_wait_host_s: float = 0.0  # scheduler-thread time spent in those waits (s; ~0 with stream waits)

    def count_admitted_hits(self, compressed: list[bool]) -> None:
        """Count the hits of one admitted batch: one bool per copy-on-write source, True = compressed.

        Called when SGLang collects the batch's copy-on-write (``plugin.around_collect_cow``, in
        ``ScheduleBatch.prepare_for_extend``: admitted requests only), not at match time: a request
        the scheduler matches again and again before admitting it is one hit.
        """
        n_c = sum(1 for c in compressed if c)
        self.hits_compressed += n_c
        self.hits_dense += len(compressed) - n_c


class TierBook:
    """Tier of each cached node state and the per-tier counts (host only; no device reads).

    Invariants (checked by ``tests/support/runtime_sim.py`` after every operation):
    ``count[t]`` = nodes whose state is in tier t; ``locked[t]`` = those with ``lock_ref > 0``.
    A pending demotion counts as dense until it commits. Every method takes the node's
    ``ComponentData`` (``node.component_data[MAMBA]``).
    """

    def __init__(self) -> None:
        self.count = {DENSE: 0, COMPRESSED: 0}
        self.locked = {DENSE: 0, COMPRESSED: 0}

    def tier(self, cd) -> Optional[str]:
        """Tier of the node's cached state, or None when it has none."""
        if cd.value is None:
            return None
        return node_tier(cd, DENSE)

    def set(self, cd, tier: str) -> None:
        """Record (or change) the node's tier, moving it between the counts."""
        self.clear(cd)
        set_node_tier(cd, tier)
        self.count[tier] += 1
        if cd.lock_ref > 0:
            self.locked[tier] += 1

    def clear(self, cd) -> None:
        """Forget the node's tier (its state is being evicted)."""
        old = pop_node_tier(cd)
        if old is not None:
            self.count[old] -= 1
            if cd.lock_ref > 0:
                self.locked[old] -= 1

    def on_lock(self, cd) -> None:
        """The node's ``lock_ref`` went 0 -> 1."""
        t = node_tier(cd) if cd.value is not None else None
        if t is not None:
            self.locked[t] += 1

    def on_unlock(self, cd) -> None:
        """The node's ``lock_ref`` went 1 -> 0."""
        t = node_tier(cd) if cd.value is not None else None
        if t is not None:
            self.locked[t] -= 1

    def counts(self) -> dict[str, int]:
        """Cached checkpoints per tier, a copy."""
        return dict(self.count)

    def dense_evictable(self) -> int:
        """Dense checkpoints not held by any lock (native slots the tree could give back)."""
        return self.count[DENSE] - self.locked[DENSE]

    def dense_protected(self) -> int:
        """Dense checkpoints held by a lock (a running request or a demotion pin)."""
        return self.locked[DENSE]

    def reset(self) -> None:
        """Zero every count (the tree was flushed)."""
        self.__init__()


class ShadowCounts:
    """Per tree node, how many checkpoints (either tier) its descendants hold; for the shadowed-first
    eviction rule (:func:`dasc_runtime.tier_operations.evict_shadowed_first`), kept only while it is on.

    A node whose count is > 0 is *shadowed* unless a fork comes before its nearest cached descendant (the
    fork test; without it, ``fork_test`` False, the ``DASC_EVICT_FORK_TEST=0`` control, any count > 0 shadows)
    (:meth:`shadowed`): a hit takes the deepest cached checkpoint of its path, so the node's own
    checkpoint serves only requests that leave the tree between it and that descendant. The count
    lives in the node's metadata (:func:`~dasc_runtime.side_channels.cached_below`) and changes when
    a state enters or leaves a node (one walk up the node's ancestors, root excluded) and when SGLang
    splits a node (the new node above it takes the child's count plus the child's own state).
    Demotion changes a tier, not the count. Host only; per insert or eviction O(depth of the node)
    while on, nothing while off.
    """

    def __init__(self, component_type, on: bool, fork_test: bool = True) -> None:
        self.ct = component_type
        self.on = on
        self.fork_test = fork_test      # False only for the A/B control DASC_EVICT_FORK_TEST=0 (count alone)

    def _add(self, node, delta: int) -> None:
        p = node.parent
        while p is not None and p.parent is not None:
            add_cached_below(p.component_data[self.ct], delta)
            p = p.parent

    def stored(self, node) -> None:
        """``node`` gained a state."""
        if self.on:
            self._add(node, 1)

    def dropped(self, node) -> None:
        """``node`` lost its state (eviction; still attached to its parent)."""
        if self.on:
            self._add(node, -1)

    def split(self, new_parent, child) -> None:
        """SGLang put ``new_parent`` (no state) between ``child`` and its old parent."""
        if self.on:
            cd = child.component_data[self.ct]
            set_cached_below(new_parent.component_data[self.ct], cached_below(cd) + (cd.value is not None))

    def shadowed(self, node) -> bool:
        """True when a descendant of ``node`` holds a checkpoint and the nearest one lies on a single chain
        below it: the walk down from ``node`` meets a cached node before any fork (a node of two or more
        children). A node at or above such a fork is the deepest checkpoint of every request that left the
        tree at the fork (conversations that share a system prompt, then diverge), so it is not shadowed.
        False whenever the rule is off. O(nodes between ``node`` and that checkpoint) when the count is > 0.
        Without the fork test (``fork_test`` False: ``DASC_EVICT_FORK_TEST=0``, an A/B control only) any
        node with a cached descendant is shadowed, a node above a fork included.
        """
        if not (self.on and cached_below(node.component_data[self.ct]) > 0):
            return False
        if not self.fork_test:
            return True
        x = node
        while len(x.children) == 1:
            (x,) = x.children.values()
            if x.component_data[self.ct].value is not None:
                return True
        return False        # a fork first (a count > 0 means the node has children)
