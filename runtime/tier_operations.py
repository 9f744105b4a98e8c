"""dasc's own operations on the two-tier Mamba cache (paper App. B.2), outside SGLang's calls.

:class:`TierOperations` is the base of :class:`dasc_runtime.mamba_component.DascMambaComponent`
(which holds only SGLang ``MambaComponent`` overrides): the LRU queries the policy needs (oldest
eligible node of a tier), evicting one node outside an eviction walk, starting a background
demotion, the watermark step after every cache call (App. B.2 "Pressure-driven reclamation",
:meth:`TierOperations.maintain`), and dropping the compressed tier after a weight update
(:mod:`dasc_runtime.weight_updates`). It uses the component's state set up by
``DascMambaComponent.__init__``: ``dpool``, ``policy``, ``book``, ``demotions``, ``epoch``,
``_maintaining``, and SGLang's ``cache``, ``tree_core`` and ``component_type``.
"""

from __future__ import annotations

from typing import Optional

from dasc_runtime.sglang_api import api
from dasc_runtime.side_channels import is_staged
from dasc_runtime.tiers import COMPRESSED, DENSE, TierPolicy

__all__ = ["TierOperations"]


class TierOperations:
    """dasc's cache operations over the shared Mamba LRU (base of ``DascMambaComponent``; see module docstring).

    Holds no state of its own; every method works on the component's ``book`` (per-tier counts, host
    only), ``dpool`` (compressed slots), ``demotions`` and SGLang's tree.
    """

    def evict_node(self, node) -> None:
        """Evict one unlocked node's state outside an eviction walk (leaf: the whole leaf, as SGLang does;
        the release's adapter applies the frees, :func:`dasc_runtime.sglang_0523.evict_outside_walk`)."""
        api().evict_outside_walk(self.cache, node, self)

    def drop_compressed(self) -> tuple[int, int]:
        """Cancel pending demotions and evict every compressed checkpoint no request holds (the
        weights changed: :mod:`dasc_runtime.weight_updates`). Returns ``(evicted, still held)``."""
        self.demotions.cancel_all()
        n = 0
        x = self._oldest(COMPRESSED)
        while x is not None:
            self.evict_node(x)
            n += 1
            x = self._oldest(COMPRESSED)
        return n, self.book.counts()[COMPRESSED]

    def disable_compressed_tier(self) -> None:
        """From now on nothing enters the compressed tier (``TierPolicy.compressed_tier = False``)."""
        self.policy = TierPolicy(compressed_only=self.policy.compressed_only, watermark=self.policy.watermark,
                                 compressed_tier=False)

    def eligible(self, node) -> bool:
        """Unlocked, not being demoted, and not a copy-on-write source staged in this cache call."""
        cd = node.component_data[self.component_type]
        return cd.lock_ref == 0 and node.id not in self.pending and not is_staged(cd, self.epoch)

    def _oldest(self, tier: Optional[str], exclude=None):
        """Oldest eligible node of ``tier`` (any tier when None) in the shared Mamba LRU, or None."""
        lru = self.tree_core.lru_lists[self.component_type]
        x = lru.get_lru_no_lock()
        while x is not None:
            if x is not exclude and (tier is None or self.tier(x) == tier) and self.eligible(x):
                return x
            x = lru.get_prev_no_lock(x)
        return None

    def demote_async(self, node) -> None:
        """Start a background demotion of ``node`` in this cache call (see :mod:`dasc_runtime.demotion`);
        nothing once the compressed tier is off (``TierPolicy.compressed_tier``)."""
        if self.policy.compressed_tier:
            self.demotions.demote_async(node, self.epoch)

    def maintain(self) -> None:
        """Commit completed demotions (never waits on an event), then start watermark demotions.

        Runs after every cache call on the scheduler thread and closes the call (``epoch += 1``).
        App. B.2 "Pressure-driven reclamation" below the watermark: compressed space free ->
        demote the oldest eligible dense node; else evict the oldest eligible node (dense: frees a
        native slot; compressed: frees room to demote, only while a dense node remains).
        """
        if self._maintaining:
            return
        self._maintaining = True
        try:
            self.demotions.commit_ready(self.epoch)
            self.epoch += 1
            if self.policy.compressed_only or self.policy.watermark <= 0 or not self.policy.compressed_tier:
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
                self.evict_node(x)
                need = self.policy.watermark - native.available_size() - len(self.pending)
        finally:
            self._maintaining = False
