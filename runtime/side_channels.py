"""Every value dasc attaches to an object outside its own API, each with the reason SGLang forces it.

SGLang (0.5.17 and 0.5.23 alike) builds the cache component itself, passes fixed ``Params`` dataclasses between its
cache calls and hands the model runner a bare id tensor, so some facts dasc needs have no field to
travel in. Each such fact travels in exactly one named channel below, written and read only through
the helpers of this module: this file is the complete list of dasc's footprints on objects it does
not define, and the place to re-check on an SGLang upgrade.

==================  ==================================  ======================================================
channel             carried on                          why SGLang's API leaves no other way
==================  ==================================  ======================================================
settings            ``ServerArgs._dasc_settings``        ``ServerArgs`` (``server_args.py``) has no extension
                                                        field; an attribute is pickled with it into every
                                                        spawned scheduler process.
tier policy         ``DascCheckpointPool.tier_policy``   SGLang's cache registry (``mem_cache/registry.py``)
                                                        builds the Mamba component from ``CacheInitParams``,
                                                        which has no field for dasc's options; the pool in
                                                        ``req_to_token_pool.mamba_ckpt_pool`` is the one dasc
                                                        object the component can reach.
component           ``DascCheckpointPool.component``     ``SchedulerInvariantChecker._check_mamba_pool_with_int8``
                                                        receives the checkpoint pool only; the per-tier
                                                        counts it must check live in the component.
insert tier         ``InsertParams._dasc_tier``          ``prepare_for_caching_req`` decides the tier;
                                                        ``commit_insert_component_data`` and
                                                        ``cleanup_after_caching_req`` of the same insert see
                                                        only ``InsertParams`` (``base_prefix_cache.py``), whose
                                                        one Mamba field is ``mamba_value``.
insert origin       ``InsertParams._dasc_origin``        the same insert: where the state was cached (chunk,
                                                        prompt end, decode, reply end) is known in
                                                        ``prepare_for_caching_req`` (it sees the request),
                                                        the node gets it in ``commit_insert_component_data``.
copy-on-write hint  ``_dasc_compressed_rows`` on         ``ModelRunner`` passes ``load_to_active`` only the
                    ``ScheduleBatch.mamba_cow_src_      concatenated source ids; telling native from compressed
                    indices``                           ids by value would read device memory (a sync) on the
                                                        forward path.
node tier           ``ComponentData.metadata            SGLang's per-node ``metadata`` dict (its extension
                    ["dasc_tier"]``                     point): the tier of the node's state, on the host.
staged epoch        ``ComponentData.metadata            the same dict: the cache call in which the node became
                    ["dasc_staged_epoch"]``             a staged copy-on-write source (not demoted or evicted
                                                        before the next call; ``finalize_match_result_in_cache``
                                                        runs before the scheduler locks the node).
node origin         ``ComponentData.metadata            the same dict: the origin of the node's state and
                    ["dasc_origin"]``, ``["dasc_reused"]``  whether it was ever a copy-on-write source
                                                        (:mod:`dasc_runtime.account`; SGLang's nodes keep
                                                        no such history).
cached below        ``ComponentData.metadata            the same dict, while the shadowed-first rule is on:
                    ["dasc_below"]``                    how many checkpoints the node's descendants hold
                                                        (:class:`dasc_runtime.tiers.ShadowCounts`; SGLang's
                                                        nodes know their children, not what they cache).
scratch rows        ``HybridReqToTokenPool.size``,      dasc-wr's scratch rows and Mamba slots: SGLang sizes the
                    ``_alloc_size``, ``free_slots``,    pool from its own config, so dasc builds it B larger and
                    ``mamba_allocator.size``            puts SGLang's sizes back; the top B rows / slots exist
                                                        but SGLang's allocators never hand them out.
refresh work        ``_dasc_refresh_work`` on           dasc-wr's scratch passes, planned in ``prepare_for_extend``
                    ``ScheduleBatch.mamba_cow_src_      (scheduler thread), run by the model runner's deferred
                    indices``                           copy-on-write: the same tensor is the only object both
                                                        see (``ForwardBatch.init_new`` passes it on unchanged).
==================  ==================================  ======================================================

This module imports nothing (no torch, no SGLang), so every other runtime module may use it.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = [
    "SERVER_ARGS_ATTR", "TIER_HINT_ATTR", "INSERT_TIER_ATTR", "TIER_KEY", "STAGED_KEY",
    "attach_settings", "settings_of",
    "attach_tier_policy", "tier_policy_of",
    "attach_component", "component_of",
    "set_insert_tier", "insert_tier",
    "attach_tier_hint", "tier_hint", "attach_refresh_work", "refresh_work", "pop_refresh_work",
    "hide_scratch_rows",
    "node_tier", "set_node_tier", "pop_node_tier", "mark_staged", "is_staged",
    "INSERT_ORIGIN_ATTR", "ORIGIN_KEY", "REUSED_KEY", "set_insert_origin", "insert_origin",
    "set_node_origin", "mark_reused", "pop_node_history",
    "BELOW_KEY", "cached_below", "add_cached_below", "set_cached_below",
]

SERVER_ARGS_ATTR = "_dasc_settings"
INSERT_TIER_ATTR = "_dasc_tier"
TIER_HINT_ATTR = "_dasc_compressed_rows"
REFRESH_WORK_ATTR = "_dasc_refresh_work"
TIER_KEY = "dasc_tier"
STAGED_KEY = "dasc_staged_epoch"
INSERT_ORIGIN_ATTR = "_dasc_origin"
ORIGIN_KEY = "dasc_origin"
REUSED_KEY = "dasc_reused"
BELOW_KEY = "dasc_below"


# ---------------------------------------------------------------- ServerArgs -> every scheduler process

def attach_settings(server_args, raw: dict) -> None:
    """Store the raw ``--dasc-*`` values (field -> value, ``None`` entries dropped) on ``server_args``.

    A plain ``setattr`` of an underscore name: both tested releases seal only their configuration fields
    (0.5.17's dataclass after resolution, 0.5.23's ``msgspec.Struct`` during and after it) and let an
    underscore bookkeeping attribute through, and both pickle it into every scheduler process (0.5.23's
    ``ServerArgs.__reduce__`` carries ``__dict__``). ``object.__setattr__`` cannot reach a Struct.
    """
    setattr(server_args, SERVER_ARGS_ATTR, {k: v for k, v in raw.items() if v is not None})


def settings_of(server_args) -> Optional[dict]:
    """The raw values :func:`attach_settings` stored on ``server_args``, or None."""
    return getattr(server_args, SERVER_ARGS_ATTR, None) if server_args is not None else None


# ---------------------------------------------------------------- pool <-> component

def attach_tier_policy(pool, policy) -> None:
    """Give the pool the :class:`~dasc_runtime.tiers.TierPolicy` its component will read at construction."""
    pool.tier_policy = policy


def tier_policy_of(pool) -> Any:
    """The tier policy attached to ``pool``, or None (the component then uses the default policy)."""
    return getattr(pool, "tier_policy", None)


def attach_component(pool, component) -> None:
    """Record on ``pool`` the two-tier component that owns its slots (read by the invariant-check hook)."""
    pool.component = component


def component_of(pool) -> Any:
    """The component :func:`attach_component` recorded on ``pool``, or None (no two-tier cache built)."""
    return getattr(pool, "component", None)


# ---------------------------------------------------------------- one insert: prepare -> commit -> cleanup

def set_insert_tier(insert_params, tier: str) -> None:
    """Record the tier ``prepare_for_caching_req`` chose for this insert's ``mamba_value``."""
    setattr(insert_params, INSERT_TIER_ATTR, tier)


def insert_tier(insert_params, default: str) -> str:
    """The tier recorded by :func:`set_insert_tier`, else ``default`` (SGLang's own dense value)."""
    if insert_params is None:
        return default
    return getattr(insert_params, INSERT_TIER_ATTR, default)


def set_insert_origin(insert_params, origin: str) -> None:
    """Record where this insert's state was cached (:func:`dasc_runtime.account.classify_origin`)."""
    setattr(insert_params, INSERT_ORIGIN_ATTR, origin)


def insert_origin(insert_params) -> Optional[str]:
    """The origin recorded by :func:`set_insert_origin`, or None."""
    return getattr(insert_params, INSERT_ORIGIN_ATTR, None) if insert_params is not None else None


# ---------------------------------------------------------------- hit batch -> load_to_active

def attach_tier_hint(src_ids, hint: list[bool]) -> None:
    """Mark which rows of the batch's copy-on-write source ids (int64 ``[N]``) are compressed ids."""
    setattr(src_ids, TIER_HINT_ATTR, hint)


def tier_hint(src_ids) -> Optional[list[bool]]:
    """The per-row hint of :func:`attach_tier_hint` (list of bool, True = compressed), or None."""
    return getattr(src_ids, TIER_HINT_ATTR, None)


def hide_scratch_rows(req_pool, size: int, mamba_size: int) -> None:
    """Give a ``HybridReqToTokenPool`` built with extra rows / Mamba slots SGLang's own ``size`` rows and
    ``mamba_size`` schedulable slots back (the rows and slots above stay dasc-wr's; ``clear()`` keeps them out)."""
    req_pool.size = size
    req_pool._alloc_size = size + 1
    req_pool.free_slots = list(range(1, size + 1))
    req_pool.mamba_allocator.size = mamba_size
    req_pool.mamba_allocator.clear()


def attach_refresh_work(src_ids, work) -> None:
    """Hand the hit batch's dasc-wr work (:class:`~dasc_runtime.wr_refresh.RefreshWork`) to the model runner."""
    setattr(src_ids, REFRESH_WORK_ATTR, work)


def refresh_work(src_ids) -> Any:
    """The work :func:`attach_refresh_work` put on ``src_ids``, or None."""
    return getattr(src_ids, REFRESH_WORK_ATTR, None)


def pop_refresh_work(src_ids) -> Any:
    """Take the work off ``src_ids`` (it runs once), or None."""
    work = getattr(src_ids, REFRESH_WORK_ATTR, None)
    if work is not None:
        delattr(src_ids, REFRESH_WORK_ATTR)
    return work


# ---------------------------------------------------------------- node metadata (ComponentData.metadata)

def node_tier(component_data, default: Optional[str] = None) -> Optional[str]:
    """Tier recorded for the node's Mamba state (``dense`` | ``compressed``), else ``default``."""
    return component_data.metadata.get(TIER_KEY, default)


def set_node_tier(component_data, tier: str) -> None:
    """Record the tier of the node's Mamba state."""
    component_data.metadata[TIER_KEY] = tier


def pop_node_tier(component_data) -> Optional[str]:
    """Remove and return the node's recorded tier (None when it had none)."""
    return component_data.metadata.pop(TIER_KEY, None)


def mark_staged(component_data, epoch: int) -> None:
    """The node became a staged copy-on-write source during cache call ``epoch``."""
    component_data.metadata[STAGED_KEY] = epoch


def is_staged(component_data, epoch: int) -> bool:
    """True when the node was staged as a copy-on-write source during cache call ``epoch``."""
    return component_data.metadata.get(STAGED_KEY) == epoch


def set_node_origin(component_data, origin: str) -> None:
    """Record the origin of the node's new state (it has not been reused yet)."""
    component_data.metadata[ORIGIN_KEY] = origin
    component_data.metadata.pop(REUSED_KEY, None)


def mark_reused(component_data) -> Optional[str]:
    """Mark the node's state reused; returns its origin the first time, None after (or when unknown)."""
    md = component_data.metadata
    if md.get(REUSED_KEY) or ORIGIN_KEY not in md:
        return None
    md[REUSED_KEY] = True
    return md[ORIGIN_KEY]


def pop_node_history(component_data) -> tuple[Optional[str], bool]:
    """Remove and return ``(origin, reused)`` of the node's state (``(None, False)`` when unrecorded)."""
    md = component_data.metadata
    return md.pop(ORIGIN_KEY, None), bool(md.pop(REUSED_KEY, False))


def cached_below(component_data) -> int:
    """Checkpoints the node's descendants hold (0 when never recorded)."""
    return component_data.metadata.get(BELOW_KEY, 0)


def add_cached_below(component_data, delta: int) -> None:
    """A descendant of the node gained (+1) or lost (-1) its checkpoint."""
    md = component_data.metadata
    md[BELOW_KEY] = md.get(BELOW_KEY, 0) + delta


def set_cached_below(component_data, n: int) -> None:
    """Record that the node's descendants hold ``n`` checkpoints (a node SGLang's split just created)."""
    component_data.metadata[BELOW_KEY] = n
