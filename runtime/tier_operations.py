"""dasc's own operations on the two-tier Mamba cache (paper App. B.2), outside SGLang's calls.

:class:`TierOperations` is the base of :class:`dasc_runtime.mamba_component.DascMambaComponent`
(which holds only SGLang ``MambaComponent`` overrides): the LRU queries the policy needs (oldest
eligible node of a tier), evicting one node outside an eviction walk, starting a background
demotion, the watermark step after every cache call (App. B.2 "Pressure-driven reclamation",
:meth:`TierOperations.maintain`), and dropping the compressed tier after a weight update
(:mod:`dasc_runtime.weight_updates`). It uses the component's state set up by
``DascMambaComponent.__init__``: ``dpool``, ``policy``, ``book``, ``demotions``, ``epoch``,
``_maintaining``, ``shadows``, and SGLang's ``cache``, ``tree_core`` and ``component_type``.

Which checkpoint goes (:meth:`TierOperations._victim`, every eviction dasc chooses: the reclamation
walk, the watermark step, room in a compressed-only pool). App. B.2 fixes one global LRU over both
tiers: the oldest eligible checkpoint goes. dasc's default (:func:`evict_shadowed_first`;
``DASC_EVICT_SHADOWED_FIRST=0`` restores App. B.2's one LRU) puts one priority class in front of that
LRU: first the oldest eligible *shadowed* checkpoint (a descendant node holds a checkpoint, either
tier, and no fork of the tree comes before the nearest one: :meth:`dasc_runtime.tiers.ShadowCounts.shadowed`),
and only when none is left the plain LRU. Why: a hit
takes the deepest cached checkpoint of its path, so a shadowed one pays off only once its
descendant is gone, or for a request that leaves the tree between the two. The H200 chat runs'
checkpoint account (``benchmarks/notes/2026-12-01-h200-six-arms-account.md``, "Why") showed each turn
storing chunk, prompt-end and reply-end checkpoints on one path, reuse of 0/267 chunk, 2-10 %
prompt-end and 56-77 % reply-end checkpoints, and the LRU evicting reply-end checkpoints unused
(dasc-wr w16: 34 of 160, turns that then missed) while it still held their shadowed ancestors.
The rule changes only which eligible checkpoint goes: locked, pending and staged nodes are never
taken, and it reads only the tree, so every TP rank picks the same victim. A shadowed checkpoint
still serves a request that leaves the tree between it and its descendant where no fork exists yet
(a fork that exists, before the descendant, makes it not shadowed); the rule bets, on the account's
figures, that such hits are rare. Cost while on (CPU micro-benchmark,
one thread): ~0.12 us per ancestor for each state stored or evicted (1.4 us at path depth 10, 8 us
at 50), and a victim search of ~0.4 us per cached node it passes (the whole LRU when no eligible
node is shadowed: 26 us over 64 nodes, 0.2 ms over 512) against ~1 us for the plain LRU's first
eligible node; off, one attribute test per call. The fork test adds, for each candidate with a cached
descendant, a walk down to the nearest one (the split nodes between two checkpoints of one path: a few).

Measured (H200, protocol A, chat clients that send the served reply back;
``benchmarks/notes/2026-12-03-h200-s21-shadowfirst-recorded-reply.md``): mean TTFT 0.958x the plain LRU's
(SD 0.030, n = 4 trace seeds, p ~ 0.07; 7 of 7 pairs with dasc-nr and dasc-wr below 1, three of them holding
a server's first timed run), 0 of 504 later turns lost against 18 of 360 (nr) and 29 of 144 (wr). At 16k on an
H100 (``benchmarks/notes/2026-12-07-h100-s53-16k-shadowfirst-seeds.md``): 0.839x the plain LRU's mean TTFT
(SD 0.058, n = 6 seeds, all below 1) and 0.835x SGLang's INT8 pool, 0 of 432 later turns lost against 56.
That met the rule fixed before those seeds, so it is the default; App. B.2 keeps one recency order ("rather
than define a second eviction policy"), which ``DASC_EVICT_SHADOWED_FIRST=0`` restores. Measured since, at 8k with
32 clients on an H100 (``benchmarks/notes/2026-12-08-h100-s59-8k-lru-twin.md``, n = 5): the plain LRU ran 1.401x
the default's mean TTFT and 0.996x SGLang's INT8 pool, losing 421 of 480 later turns against none.
The fork test came with the default: without it a checkpoint inside a prefix many conversations share, the one a new
conversation restores, would be the first to go once any of them cached a later one. ``DASC_EVICT_FORK_TEST=0``
(:func:`evict_fork_test`, a control) runs the rule without the test. With an 11.6k-token system prompt every
conversation shares (16k contexts, one H100, five seeds, each seed's three arms in one call,
``benchmarks/notes/2026-12-07-h100-s58-three-evictions.md``) the default kept that checkpoint through the run (every
first turn sent mid-run found the whole of it); the plain LRU ran 1.088x the default's mean TTFT (SD 0.020), the
control 1.013x (SD 0.019, 95 % interval 0.99-1.04), which lost the shared checkpoint once a seed (the first
conversation to start after every early one moved on found nothing cached and prefilled the whole shared prompt):
the class, not the fork test, carries most of the gain over the LRU.

With clients that rewrite the reply (the benchmark's recorded-reply replay) the reusable checkpoint is the
prompt-end one a reply-end checkpoint shadows, so the count-only rule was expected to cost hits there; measured
(``benchmarks/notes/2026-12-04-h200-s24-recorded-reply.md``, n = 2 seeds, one run order) it gained them
instead: 17 of 144 later turns hit against 4, mean TTFT 0.948x the plain LRU's, as its evictions went to the
shadowed chunk-boundary checkpoints first. With the fork test, such a prompt-end checkpoint stops being
shadowed once a next turn has forked there (not measured).
"""

from __future__ import annotations

import os
from typing import Optional

from dasc_runtime.sglang_api import api
from dasc_runtime.side_channels import is_staged
from dasc_runtime.tiers import COMPRESSED, DENSE, TierPolicy

__all__ = ["TierOperations", "evict_shadowed_first", "evict_fork_test"]


def evict_shadowed_first() -> bool:
    """``DASC_EVICT_SHADOWED_FIRST``: evict shadowed checkpoints before the plain LRU (see the module
    docstring). ``1`` / ``true`` / ``yes`` / ``on`` / unset or empty (the default since session 53) or
    ``0`` / ``false`` / ``no`` / ``off`` (App. B.2's one LRU); read once, when the component is built.

    Raises:
        DascInputError: any other value.
    """
    return _on_unless_off("DASC_EVICT_SHADOWED_FIRST")


def _on_unless_off(name: str) -> bool:
    """An eviction variable that is on unless set to an off value (unset or empty: on); other values refused
    (``settings.parse_bool``)."""
    from dasc_runtime.settings import parse_bool

    raw = os.environ.get(name)
    return True if raw is None or not raw.strip() else parse_bool(name, raw)


def evict_fork_test() -> bool:
    """``DASC_EVICT_FORK_TEST``: whether the shadowed-first rule spares a checkpoint above a fork of the tree
    (the default: unset, empty, ``1`` / ``true`` / ``yes`` / ``on``). ``0`` / ``false`` / ``no`` / ``off`` is an
    A/B control only: every checkpoint with a cached descendant counts as shadowed, so the one a shared system
    prompt's new conversations restore goes first once any of them cached a later one (what the fork test is
    there to prevent; a serving run with it off measures what the test saves). Read once, when the component is
    built.

    Raises:
        DascInputError: any other value; ``0`` while ``DASC_EVICT_SHADOWED_FIRST`` is off (the test belongs to
            that rule, so it would change nothing).
    """
    from dasc_compile.schema import DascInputError

    on = _on_unless_off("DASC_EVICT_FORK_TEST")
    if not on and not evict_shadowed_first():
        raise DascInputError(f"DASC_EVICT_FORK_TEST={os.environ['DASC_EVICT_FORK_TEST'].strip()}: the fork test "
                             f"belongs to the shadowed-first rule, which "
                             f"DASC_EVICT_SHADOWED_FIRST={os.environ['DASC_EVICT_SHADOWED_FIRST'].strip()} turns off; "
                             f"unset one of them")
    return on


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

    def _oldest(self, tier: Optional[str], exclude=None, where=None):
        """Oldest eligible node of ``tier`` (any tier when None) in the shared Mamba LRU, or None;
        with ``where``, the oldest for which ``where(node)`` also holds."""
        lru = self.tree_core.lru_lists[self.component_type]
        x = lru.get_lru_no_lock()
        while x is not None:
            if (x is not exclude and (where is None or where(x)) and (tier is None or self.tier(x) == tier)
                    and self.eligible(x)):
                return x
            x = lru.get_prev_no_lock(x)
        return None

    def _victim(self, tier: Optional[str]):
        """The eligible node of ``tier`` (any when None) to evict next, or None: the oldest shadowed one
        while the rule is on (unless ``DASC_EVICT_SHADOWED_FIRST=0``), else (and when none is shadowed)
        the oldest one."""
        if self.shadows.on:
            x = self._oldest(tier, where=self.shadows.shadowed)
            if x is not None:
                return x
        return self._oldest(tier)

    def demote_async(self, node) -> None:
        """Start a background demotion of ``node`` in this cache call (see :mod:`dasc_runtime.demotion`);
        nothing once the compressed tier is off (``TierPolicy.compressed_tier``)."""
        if self.policy.compressed_tier:
            self.demotions.demote_async(node, self.epoch)

    def maintain(self) -> None:
        """Commit completed demotions (never waits on an event), then start watermark demotions.

        Runs after every cache call on the scheduler thread and closes the call (``epoch += 1``).
        App. B.2 "Pressure-driven reclamation" below the watermark: compressed space free ->
        demote the oldest eligible dense node; else evict the oldest eligible node (:meth:`_victim`;
        dense: frees a native slot; compressed: frees room to demote, only while a dense node remains).
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
                x = self._victim(None)
                if x is None or (self.tier(x) == COMPRESSED and self._oldest(DENSE, exclude=x) is None):
                    return
                self.evict_node(x)
                need = self.policy.watermark - native.available_size() - len(self.pending)
        finally:
            self._maintaining = False
