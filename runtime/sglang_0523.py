"""dasc's names for SGLang 0.5.23's internals (the adapter :mod:`dasc_runtime.sglang_api` picks for 0.5.23).

Every name here has a twin of the same name in :mod:`dasc_runtime.sglang_0517`; the docstrings say
what changed from 0.5.17 and which SGLang file the 0.5.23 side follows (paths under
``python/sglang/srt/``). SGLang is imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

from typing import Any, Optional

VERSION = "0.5.23"

#: ``mem_cache/registry.py``: 0.5.17's ``_create_unified_radix_cache(ctx, server_args, params)`` became
#: ``create_unified_radix_cache(ctx, *, cache_class=None)``, the params now on ``ctx.params``.
CACHE_FACTORY_TARGET = "sglang.srt.mem_cache.registry.create_unified_radix_cache"
#: ``ServerArgs`` is a ``msgspec.Struct`` in 0.5.23: its constructor is not a Python ``__init__`` a hook
#: can wrap (HookRegistry patches the attribute, Struct construction never calls it). ``Engine(**kwargs)``
#: (``entrypoints/engine.py``) is where ``Engine(..., dasc_plan=...)`` keyword arguments arrive.
ENGINE_KWARGS_TARGET = "sglang.srt.entrypoints.engine.Engine.__init__"
#: ``Engine.__init__`` calls ``load_plugins()`` itself, first thing, so the first ``Engine(...)`` of a process runs the
#: constructor as it was before dasc's hook on it: dasc registers while that call is in progress. Its ``dasc_*``
#: keywords are taken out of the call's keyword dict then (:func:`running_engine_kwargs`), and settled where the
#: constructor next calls a hooked function, this classmethod, before any subprocess starts
#: (``launcher.first_engine_launch``).
FIRST_ENGINE_TARGET = "sglang.srt.entrypoints.engine.Engine._launch_subprocesses"

#: ``SchedulerWeightUpdaterManager`` methods that replace the served weights: 0.5.17's four, plus
#: ``end_weight_update``, which finalizes a session whose weights arrived without one of them (P2P / RDMA,
#: ``managers/scheduler_components/weight_updater.py``).
WEIGHT_UPDATE_METHODS = ("update_weights_from_disk", "update_weights_from_distributed", "update_weights_from_tensor",
                         "update_weights_from_ipc", "end_weight_update")
#: The reply 0.5.23's ``SchedulerWeightUpdaterManager.flush_cache_after_weight_update`` gives when the weights
#: were replaced and the flush was refused (requests still running); the update then reports failure.
_FLUSH_REFUSED = "Weights were updated, but the cache was not flushed"


# ---------------------------------------------------------------- start-up

def cache_factory_params(ctx, args: tuple, kwargs: dict):
    """The ``CacheInitParams`` of a call to :data:`CACHE_FACTORY_TARGET`: ``ctx.params``."""
    return ctx.params


def running_engine_kwargs() -> Optional[dict]:
    """The keyword dict of the ``Engine.__init__(**kwargs)`` call in progress in this thread (the call whose
    ``load_plugins()`` is registering dasc; :data:`FIRST_ENGINE_TARGET`), or None when no such call is running."""
    import sys

    engine = sys.modules.get("sglang.srt.entrypoints.engine")
    if engine is None:              # a scheduler or detokenizer process: no Engine runs here (and none is imported)
        return None
    init = engine.Engine.__dict__["__init__"]
    code = getattr(init, "__wrapped__", init).__code__
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            kwargs = frame.f_locals.get("kwargs")
            return kwargs if isinstance(kwargs, dict) else None
        frame = frame.f_back
    return None


def server_args_of(owner):
    """The ``ServerArgs`` an :data:`ENGINE_KWARGS_TARGET` call built: ``Engine.server_args`` (None when
    the constructor failed before building it)."""
    return getattr(owner, "server_args", None)


def server_option(sa, name: str, default: Any = None) -> Any:
    """Value of server option ``name`` in effect: ``get_server_args()`` holds the operator's raw input in
    0.5.23 and resolution writes its decisions beside it, read by ``arg_groups/overrides.py``'s
    ``resolution_result`` (last declaration, then raw input, then the field's fallback)."""
    from sglang.srt.arg_groups.overrides import resolution_result

    return resolution_result(sa, name, default)


def dp_attention_on(sa) -> bool:
    """True when attention runs data parallel: 0.5.23 sizes it as ``--attn-dp-size N > 1``
    (``arg_groups/fields/parallel.py``); ``--enable-dp-attention`` is a deprecated spelling that
    resolution turns into ``attn_dp_size`` and leaves false, so both are read."""
    return int(server_option(sa, "attn_dp_size", 1) or 1) > 1 or bool(server_option(sa, "enable_dp_attention", False))


def extra_buffer_on() -> bool:
    """True when SGLang tracks Mamba states in ping-pong extra buffers: ``get_exec().mamba.enable_mamba_extra_buffer``
    (``runtime_context.py``; 0.5.17's ``ServerArgs.enable_mamba_extra_buffer()`` is gone)."""
    from sglang.srt.runtime_context import get_exec

    return bool(get_exec().mamba.enable_mamba_extra_buffer)


def weights_replaced(out) -> bool:
    """Whether a weight-update reply means the served weights changed: a success, or 0.5.23's failure
    whose message says the weights were updated but the cache flush was refused (:data:`_FLUSH_REFUSED`)."""
    return bool(getattr(out, "success", False)) or str(getattr(out, "message", "")).startswith(_FLUSH_REFUSED)


# ---------------------------------------------------------------- the Mamba tree component

def mamba_state(req):
    """The object holding a request's Mamba fields: 0.5.23 moved them off ``Req`` into ``req.kv``
    (``ReqKvInfo``, ``managers/schedule_batch.py``), same names."""
    return req.kv


def evict_component_args(args: tuple, kwargs: dict) -> tuple[Any, Optional[list]]:
    """``(target, cache_actions)`` of ``evict_component(node, device_frees, host_frees, cache_actions,
    target=EvictLayer.DEVICE)`` after ``host_frees`` (``cache_actions`` is new in 0.5.23)."""
    actions = args[0] if args else kwargs["cache_actions"]
    target = args[1] if len(args) > 1 else kwargs.get("target", _evict_layer().DEVICE)
    return target, actions


def walk_actions(args: tuple, kwargs: dict) -> Optional[list]:
    """``cache_actions`` of ``_evict_device_next_node(tracker, device_frees, host_frees, cache_actions)``
    (new in 0.5.23; SGLang applies them after each step)."""
    return args[0] if args else kwargs["cache_actions"]


def evict_in_walk(tree_core, node, component, tracker: dict, device_frees: dict, host_frees: dict,
                  actions: Optional[list]) -> None:
    """Drop an internal node's Mamba state and cascade (``UnifiedTreeCore._evict_component_and_detach_lru``
    then ``_cascade_evict``, both now taking ``cache_actions``); frees and actions are collected."""
    layer = _evict_layer()
    tree_core._evict_component_and_detach_lru(node, component, device_frees, host_frees, actions,
                                              target=layer.DEVICE, tracker=tracker)
    tree_core._cascade_evict(node, component, tracker, device_frees, host_frees, actions)


def evict_outside_walk(cache, node, component) -> None:
    """Evict one unlocked node's state outside SGLang's eviction walk, frees and cache actions applied
    (``UnifiedRadixCache._apply_eviction_result``; ``evict_device_leaf`` returns an
    ``EvictDeviceLeafResult`` in 0.5.23)."""
    from collections import defaultdict

    from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import BaseEvictionResult

    tc = component.tree_core
    if node in tc.evictable_device_leaves:
        cache._apply_eviction_result(tc.evict_device_leaf(node.id, False))
        return
    res = BaseEvictionResult()
    evict_in_walk(tc, node, component, defaultdict(int), res.device_frees, res.host_frees, res.cache_actions)
    cache._apply_eviction_result(res)


def finished_checkpoint(component, req, token_ids_len: int, insert_params) -> Optional[tuple[int, Any]]:
    """The tracked state a finished request hands to the tree under ``extra_buffer``: ``(cache_len,
    native slot int64 [1])``, or None for nothing to cache. 0.5.23 picks it with
    ``MambaComponent._select_finished_checkpoint`` (when the latest state ran past the key it takes
    the other ping-pong slot if its length fits, else nothing) and records the pick in
    ``InsertParams.mamba_keep_idx`` so cleanup keeps that slot; both are used here as SGLang uses them."""
    picked = component._select_finished_checkpoint(req, token_ids_len)
    if picked is None:
        return None
    cache_len, keep = picked
    insert_params.mamba_keep_idx = keep
    return cache_len, req.kv.mamba_ping_pong_track_buffer[keep].view(-1)


def alloc_native_slot(component, req):
    """One native Mamba slot (int64 ``[1]``), evicting when none is free: ``_alloc_mamba_slot(req)``
    (0.5.23 takes the request, for ``extra_buffer_lazy``'s lock hand-off)."""
    return component._alloc_mamba_slot(req)


def forget_tracking(req) -> None:
    """After an unfinished request's tracked state went to the tree: no tracked state left to cache
    (0.5.23 also forgets the other slot's length, ``mamba_prev_track_seqlen``)."""
    req.kv.mamba_last_track_seqlen = None
    req.kv.mamba_prev_track_seqlen = None


def _evict_layer():
    """SGLang's ``EvictLayer`` enum, imported through the ``unified_cache.components`` package (its home
    module was renamed in 0.5.23, the package export was not)."""
    from sglang.srt.mem_cache.unified_cache.components import EvictLayer

    return EvictLayer


# ---------------------------------------------------------------- dasc-wr's scratch pass

def prefix_locations(req, req_to_token_pool):
    """KV locations of a hit's cached prefix, int64 ``[n_p]``, in ``prepare_for_extend`` after SGLang's
    allocation: 0.5.23 keeps no ``Req.prefix_indices``; ``alloc_for_extend`` (``mem_cache/allocation.py``)
    has written them to the request's row, ``req_to_token[req.kv.req_pool_idx, :req.prefix_len]``."""
    import torch

    return req_to_token_pool.req_to_token[req.kv.req_pool_idx, : req.prefix_len].to(torch.int64)


def stand_in_request(rid: str, ids, prefix_len: int, end: int, row: int):
    """A stand-in ``Req`` replaying tokens ``ids[prefix_len:end]`` on scratch row ``row``: 0.5.23 has no
    ``set_extend_range``; the range is ``Req.prefix_len`` / ``Req.extend_end``, the row ``req.kv.req_pool_idx``."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    r = Req(rid=rid, origin_input_text="", origin_input_ids=ids,
            sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
    r.full_untruncated_fill_ids = ids
    r.prefix_len = prefix_len
    r.extend_end = end
    r.kv.req_pool_idx = row
    return r


def stand_in_inputs(batch, input_ids, track_slots=None) -> None:
    """The stand-in batch's token ids and tracking: 0.5.23's ``prepare_for_extend`` stages prefill ids on
    the host (``prefill_input_ids_cpu``, moved by ``overlap_utils.resolve_forward_inputs``); the pass
    hands ``ForwardBatch.init_new`` device ids directly. Its extra-buffer tracking also reads the host
    lists ``mamba_prefill_track_mask_cpu`` / ``mamba_track_seqlens_cpu`` (all off here)."""
    import torch

    batch.input_ids = input_ids
    batch.prefill_input_ids_cpu = None
    if track_slots is not None:
        n = track_slots.numel()
        batch.mamba_track_indices = track_slots
        batch.mamba_track_mask = torch.zeros(n, dtype=torch.bool, device=track_slots.device)
        batch.mamba_track_seqlens = torch.full((n,), -1, dtype=torch.int64, device=track_slots.device)
        batch.mamba_prefill_track_mask_cpu = [False] * n
        batch.mamba_track_seqlens_cpu = [-1] * n
