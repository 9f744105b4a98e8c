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
#: None: 0.5.17's ``Engine`` builds ``ServerArgs(**kwargs)`` after its plugins are loaded, so the hook on
#: :data:`ENGINE_KWARGS_TARGET` sees the first ``Engine(...)`` of a process too (0.5.23 needs a second target).
FIRST_ENGINE_TARGET = None

#: ``SchedulerWeightUpdaterManager`` methods that replace the served weights (``managers/scheduler_components/
#: weight_updater.py``).
WEIGHT_UPDATE_METHODS = ("update_weights_from_disk", "update_weights_from_distributed", "update_weights_from_tensor",
                         "update_weights_from_ipc")


# ---------------------------------------------------------------- start-up

def cache_factory_params(ctx, args: tuple, kwargs: dict):
    """The ``CacheInitParams`` of a call to :data:`CACHE_FACTORY_TARGET` (its third argument)."""
    return args[1] if len(args) > 1 else kwargs["params"]


def running_engine_kwargs() -> Optional[dict]:
    """None: no ``Engine`` call is in progress when 0.5.17 registers dasc that its hooks would miss
    (:data:`FIRST_ENGINE_TARGET`)."""
    return None


def server_args_of(owner):
    """The ``ServerArgs`` an :data:`ENGINE_KWARGS_TARGET` call built: the object itself."""
    return owner


def server_option(sa, name: str, default: Any = None) -> Any:
    """Value of server option ``name`` (``server_args.py`` field) on ``sa``: the attribute, which
    0.5.17 resolves in place (``ServerArgs.__post_init__``)."""
    return getattr(sa, name, default)


def dp_attention_on(sa) -> bool:
    """True when attention runs data parallel: ``--enable-dp-attention`` (``server_args.py``)."""
    return bool(server_option(sa, "enable_dp_attention", False))


def extra_buffer_on() -> bool:
    """True when SGLang tracks Mamba states in ping-pong extra buffers (``extra_buffer`` /
    ``extra_buffer_lazy``): ``ServerArgs.enable_mamba_extra_buffer()`` of the published server args."""
    from sglang.srt.runtime_context import get_server_args

    return bool(get_server_args().enable_mamba_extra_buffer())


def weights_replaced(out) -> bool:
    """Whether a weight-update reply means the served weights changed: 0.5.17 flushes (and asserts the
    flush) only after the target's update succeeded, so ``out.success``."""
    return bool(getattr(out, "success", False))


# ---------------------------------------------------------------- the Mamba tree component

def mamba_state(req):
    """The object holding a request's Mamba fields (``mamba_pool_idx``, ``mamba_cow_src_index``,
    ``mamba_needs_clear``, ``mamba_last_track_seqlen``, ``mamba_ping_pong_track_buffer``): the ``Req`` itself
    (``managers/schedule_batch.py``)."""
    return req


def evict_component_args(args: tuple, kwargs: dict) -> tuple[Any, Optional[list]]:
    """``(target, cache_actions)`` of ``MambaComponent.evict_component(node, device_frees, host_frees,
    target=EvictLayer.DEVICE)``'s arguments after ``host_frees``; 0.5.17 has no cache actions (None)."""
    target = args[0] if args else kwargs.get("target", _evict_layer().DEVICE)
    return target, None


def walk_actions(args: tuple, kwargs: dict) -> Optional[list]:
    """Cache actions of ``_evict_device_next_node(tracker, device_frees, host_frees)``: none in 0.5.17."""
    return None


def evict_in_walk(tree_core, node, component, tracker: dict, device_frees: dict, host_frees: dict,
                  actions: Optional[list]) -> None:
    """Drop an internal node's Mamba state and cascade (``UnifiedTreeCore._evict_component_and_detach_lru``
    then ``_cascade_evict``, ``mem_cache/unified_cache/unified_tree_core.py``); frees are collected."""
    layer = _evict_layer()
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


def _evict_layer():
    """SGLang's ``EvictLayer`` enum, imported through the ``unified_cache.components`` package (its home
    module was renamed in 0.5.23, the package export was not)."""
    from sglang.srt.mem_cache.unified_cache.components import EvictLayer

    return EvictLayer


# ---------------------------------------------------------------- dasc-wr's scratch pass

def prefix_locations(req, req_to_token_pool):
    """KV locations of a hit's cached prefix, int64 ``[n_p]``, in ``prepare_for_extend`` after SGLang's
    allocation: ``Req.prefix_indices`` (set by the match, ``managers/schedule_batch.py``)."""
    return req.prefix_indices


def stand_in_request(rid: str, ids, prefix_len: int, end: int, row: int):
    """A stand-in ``Req`` replaying tokens ``ids[prefix_len:end]`` on scratch row ``row`` (its cached
    prefix is read through the row; ``Req.set_extend_range``, ``Req.req_pool_idx``)."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    r = Req(rid=rid, origin_input_text="", origin_input_ids=ids,
            sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
    r.full_untruncated_fill_ids = ids
    r.set_extend_range(prefix_len, end)
    r.req_pool_idx = row
    return r


def stand_in_inputs(batch, input_ids, track_slots=None) -> None:
    """The stand-in batch's token ids (int64 ``[tokens]`` on the device, ``ScheduleBatch.input_ids``) and,
    under the extra buffer, tracking masked off on ``track_slots`` (int64 ``[n]``)."""
    import torch

    batch.input_ids = input_ids
    if track_slots is not None:
        n = track_slots.numel()
        batch.mamba_track_indices = track_slots
        batch.mamba_track_mask = torch.zeros(n, dtype=torch.bool, device=track_slots.device)
        batch.mamba_track_seqlens = torch.full((n,), -1, dtype=torch.int64, device=track_slots.device)
