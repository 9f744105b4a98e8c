"""Where each state checkpoint was stored, whether it was ever reused, and how it left (issue 24 item 5).

A chat turn can leave several checkpoints on its radix path: one per chunk of a chunked prefill, one
at the end of the prompt, one at the end of the reply. Only some of them are ever a copy-on-write
source again; the rest hold cache slots until the LRU evicts them. The account counts, per
**origin**, between two cache flushes:

=========  ================================================================================
origin     the state was cached ...
=========  ================================================================================
chunk      after a prefill chunk that did not yet reach the end of the prompt
prompt     at the end of the prompt's prefill (the request goes on decoding)
decode     while decoding, before the request finished (releases that checkpoint mid-decode)
reply      when the request finished (the end of the reply)
=========  ================================================================================

and for each origin: ``stored`` (states that entered the tree), ``reused`` (states that became a
copy-on-write source at least once: SGLang's match staged them, ``finalize_match_result_in_cache``),
``evicted_unused`` / ``evicted_reused`` (states the cache dropped, never / at least once reused).
States still cached at the flush are ``stored - evicted_*``. With the tier counters' changes over
the same stretch (hits by tier, inserts, demotions, evictions), :meth:`CheckpointAccount.close`
gives one JSON object that SGLang's log carries as ``dasc account: {...}`` at every ``/flush_cache``;
``benchmarks/run_chat.py`` flushes after each run and keeps that line, ``benchmarks/serving_report.py``
reads it back with :func:`parse_account_line`.

This module imports nothing from torch or SGLang. The origin and the reused mark of a node live in
its ``ComponentData.metadata`` (:mod:`dasc_runtime.side_channels`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Optional

__all__ = ["ACCOUNT_TAG", "KINDS", "ORIGINS", "CheckpointAccount", "classify_origin", "parse_account_line"]

ORIGINS = ("chunk", "prompt", "decode", "reply")
ACCOUNT_TAG = "dasc account: "
KINDS = ("stored", "reused", "evicted_unused", "evicted_reused")


def _zero() -> dict:
    return {k: dict.fromkeys(ORIGINS, 0) for k in KINDS}


def classify_origin(*, is_finished: bool, fill_len: int, prompt_len: int) -> str:
    """The origin of a state cached by ``cache_*_req`` / ``checkpoint`` (see the module table).

    Args:
        is_finished: SGLang's ``is_finished`` of ``prepare_for_caching_req``.
        fill_len: tokens the request had filled at the call (``token_ids_len``), tokens.
        prompt_len: tokens of the request's prompt (``len(req.origin_input_ids)``), tokens.
    Returns:
        ``"reply"`` when finished; ``"chunk"`` when the fill stops short of the prompt's end;
        ``"prompt"`` when it reaches the prompt's end (one token past it allowed: a release may have
        appended the first output token); ``"decode"`` beyond that.
    """
    if is_finished:
        return "reply"
    if fill_len < prompt_len:
        return "chunk"
    if fill_len <= prompt_len + 1:
        return "prompt"
    return "decode"


@dataclasses.dataclass
class CheckpointAccount:
    """Per-origin counts of stored, reused and evicted checkpoints since the last flush (one TP rank).

    ``counts[kind][origin]``: int, for kind in ``stored``, ``reused``, ``evicted_unused``,
    ``evicted_reused`` and origin in :data:`ORIGINS`. Host-side only; every method is O(1).
    """

    counts: dict = dataclasses.field(default_factory=_zero)
    _base: Optional[dict] = None          # the tier counters at the last close (their changes are reported)

    def stored(self, origin: str) -> None:
        """A state of ``origin`` entered the tree (commit of a new state on a node)."""
        self.counts["stored"][origin] += 1

    def reused(self, origin: str) -> None:
        """A state of ``origin`` became a copy-on-write source for the first time."""
        self.counts["reused"][origin] += 1

    def evicted(self, origin: str, was_reused: bool) -> None:
        """A state of ``origin`` left the tree (eviction; a flush is not an eviction)."""
        self.counts["evicted_reused" if was_reused else "evicted_unused"][origin] += 1

    def close(self, tier_counters) -> dict:
        """The account since the last close and a fresh start: ``{"origins": counts, "tiers": changes}``.

        Args:
            tier_counters: the component's :class:`~dasc_runtime.tiers.TierCounters` (cumulative);
                ``tiers`` holds each field's change since the previous close.
        """
        now = dataclasses.asdict(tier_counters)
        base = self._base or {}
        tiers = {k: (round(v - base.get(k, 0), 6) if isinstance(v, float) else v - base.get(k, 0))
                 for k, v in now.items()}
        out = {"origins": {k: dict(v) for k, v in self.counts.items()}, "tiers": tiers}
        self.counts = _zero()
        self._base = now
        return out

    @staticmethod
    def is_empty(account: dict) -> bool:
        """True when nothing was stored, reused, evicted or counted over the stretch."""
        return (not any(v for d in account["origins"].values() for v in d.values())
                and not any(account["tiers"].values()))


def parse_account_line(line: str) -> Optional[dict]:
    """The account object of a ``dasc account: {...}`` log line (anything before the tag is ignored),
    or None when the line holds no account or its JSON is cut."""
    i = line.find(ACCOUNT_TAG)
    if i < 0:
        return None
    try:
        obj = json.loads(line[i + len(ACCOUNT_TAG):].strip())
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and "origins" in obj else None
