"""dasc's names for SGLang 0.5.17's internals (the adapter :mod:`dasc_runtime.sglang_api` picks for 0.5.17).

Every name here has a twin of the same name in :mod:`dasc_runtime.sglang_0523`; the docstrings say
what each adapts and which SGLang file it follows (paths under ``python/sglang/srt/``). SGLang is
imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

from typing import Any, Optional

VERSION = "0.5.17"

#: ``mem_cache/registry.py``: builds the ``UnifiedRadixCache`` of a hybrid model, ``(ctx, server_args, params)``.
CACHE_FACTORY_TARGET = "sglang.srt.mem_cache.registry._create_unified_radix_cache"
#: Where ``Engine(..., dasc_plan=...)`` keyword arguments arrive: ``ServerArgs.__init__`` (a dataclass;
#: ``entrypoints/engine.py`` builds ``ServerArgs(**kwargs)``).
ENGINE_KWARGS_TARGET = "sglang.srt.server_args.ServerArgs.__init__"


# ---------------------------------------------------------------- start-up

def cache_factory_params(ctx, args: tuple, kwargs: dict):
    """The ``CacheInitParams`` of a call to :data:`CACHE_FACTORY_TARGET` (its third argument)."""
    return args[1] if len(args) > 1 else kwargs["params"]


def server_args_of(owner):
    """The ``ServerArgs`` an :data:`ENGINE_KWARGS_TARGET` call built: the object itself."""
    return owner


def server_option(sa, name: str, default: Any = None) -> Any:
    """Value of server option ``name`` (``server_args.py`` field) on ``sa``: the attribute, which
    0.5.17 resolves in place (``ServerArgs.__post_init__``)."""
    return getattr(sa, name, default)


def extra_buffer_on() -> bool:
    """True when SGLang tracks Mamba states in ping-pong extra buffers (``extra_buffer`` /
    ``extra_buffer_lazy``): ``ServerArgs.enable_mamba_extra_buffer()`` of the published server args."""
    from sglang.srt.runtime_context import get_server_args

    return bool(get_server_args().enable_mamba_extra_buffer())


# ---------------------------------------------------------------- the Mamba tree component

def mamba_component_base():
    """SGLang's Mamba tree component class (``mem_cache/unified_cache/components/mamba_component.py``)."""
    from sglang.srt.mem_cache.unified_cache.components.mamba_component import MambaComponent

    return MambaComponent


def evict_layer():
    """SGLang's ``EvictLayer`` enum (``mem_cache/unified_cache/components/tree_component.py``)."""
    from sglang.srt.mem_cache.unified_cache.components.tree_component import EvictLayer

    return EvictLayer


def mamba_state(req):
    """The object holding a request's Mamba fields (``mamba_pool_idx``, ``mamba_cow_src_index``,
    ``mamba_needs_clear``, ``mamba_last_track_seqlen``, ``mamba_ping_pong_track_buffer``): the ``Req`` itself
    (``managers/schedule_batch.py``)."""
    return req


def evict_component_args(args: tuple, kwargs: dict) -> tuple[Any, Optional[list]]:
    """``(target, cache_actions)`` of ``MambaComponent.evict_component(node, device_frees, host_frees,
    target=EvictLayer.DEVICE)``'s arguments after ``host_frees``; 0.5.17 has no cache actions (None)."""
    target = args[0] if args else kwargs.get("target", evict_layer().DEVICE)
    return target, None


def walk_actions(args: tuple, kwargs: dict) -> Optional[list]:
    """Cache actions of ``_evict_device_next_node(tracker, device_frees, host_frees)``: none in 0.5.17."""
    return None


def evict_in_walk(tree_core, node, component, tracker: dict, device_frees: dict, host_frees: dict,
                  actions: Optional[list]) -> None:
    """Drop an internal node's Mamba state and cascade (``UnifiedTreeCore._evict_component_and_detach_lru``
    then ``_cascade_evict``, ``mem_cache/unified_cache/unified_tree_core.py``); frees are collected."""
    layer = evict_layer()
    tree_core._evict_component_and_detach_lru(node, component, device_frees, host_frees, target=layer.DEVICE,
                                              tracker=tracker)
    tree_core._cascade_evict(node, component, tracker, device_frees, host_frees)


def evict_outside_walk(cache, node, component) -> None:
    """Evict one unlocked node's state outside SGLang's eviction walk, frees applied: a device leaf
    goes whole (``evict_device_leaf``, as SGLang's walk does), an internal node loses its Mamba state."""
    from collections import defaultdict

    tc = component.tree_core
    if node in tc.evictable_device_leaves:
        res = tc.evict_device_leaf(node.id, False)
        cache._free_values(res.device_frees, res.host_frees)
        return
    device_frees: dict = defaultdict(list)
    host_frees: dict = defaultdict(list)
    evict_in_walk(tc, node, component, defaultdict(int), device_frees, host_frees, None)
    cache._free_values(device_frees, host_frees)


def finished_checkpoint(component, req, token_ids_len: int, insert_params) -> Optional[tuple[int, Any]]:
    """The tracked state a finished request hands to the tree under ``extra_buffer``: ``(cache_len,
    native slot int64 [1])``, or None for nothing to cache. 0.5.17 (``MambaComponent.prepare_for_caching_req``):
    the most recent ping-pong state, at ``mamba_last_track_seqlen`` (0 when nothing was tracked)."""
    pool = component.cache.req_to_token_pool
    keep = pool.get_mamba_ping_pong_keep_idx(req)
    return (req.mamba_last_track_seqlen or 0), req.mamba_ping_pong_track_buffer[keep].view(-1)


def alloc_native_slot(component, req):
    """One native Mamba slot (int64 ``[1]``), evicting when none is free (``MambaComponent._alloc_mamba_slot()``)."""
    return component._alloc_mamba_slot()


def forget_tracking(req) -> None:
    """After an unfinished request's tracked state went to the tree: no tracked state left to cache
    (``MambaComponent.cleanup_after_caching_req``)."""
    req.mamba_last_track_seqlen = None
