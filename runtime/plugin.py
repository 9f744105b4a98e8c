"""SGLang plugin entry point: ``dasc = "dasc_runtime.plugin:register"`` (group ``sglang.srt.plugins``).

``register()`` runs in every SGLang process through ``load_plugins()`` (launcher, ``Engine``, each
scheduler). It only registers hooks (``HookRegistry``); each hook passes straight through when no
plan is configured, so installing dasc changes nothing until ``--dasc-plan`` / ``DASC_PLAN`` is
given. The hook table and the flow of the flag are in ``runtime/DESIGN-runtime.md``; the pool the
``_init_mamba_pool`` hook installs is built by :mod:`dasc_runtime.pool_install`. Two hook targets
differ between SGLang releases (the cache factory and where ``Engine`` keyword arguments arrive); the
installed release's adapter (:func:`dasc_runtime.sglang_api.api`) names them, :func:`hooks` builds the
table. The flag hooks (the launching process) are :mod:`dasc_runtime.launcher`'s. The hooks that can
refuse inside a scheduler process at start-up carry ``@refuse_in_scheduler`` (:mod:`dasc_runtime.scheduler_refusal`): there a ``DascRefusal`` is one log line and the server ends,
instead of SGLang's scheduler traceback.
"""

from __future__ import annotations

import inspect
import logging

from dasc_runtime.launcher import (add_cli_args, engine_kwargs_init, first_engine_launch,  # the flags; no torch, no
                                   from_cli_args, take_running_engine_kwargs)                 # sglang
from dasc_runtime.pool_install import install_pool, load_plan_once, published_server_args   # no torch either
from dasc_runtime.scheduler_refusal import refuse_in_scheduler   # no torch, no sglang
from dasc_runtime.weight_updates import update_targets       # hook target names (the module imports no torch)

__all__ = ["register", "add_cli_args", "hooks"]

logger = logging.getLogger("dasc")


# ---------------------------------------------------------------- hooks

def _settings():
    from dasc_runtime.settings import current_settings

    return current_settings()


@refuse_in_scheduler
def after_init_mamba_pool(result, req_pool, *args, **kwargs):
    """AFTER ``HybridReqToTokenPool._init_mamba_pool``: refuse unsupported options, install the pool."""
    settings = _settings()
    if not settings.active:
        return result
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

    from dasc_runtime.startup_checks import check_hooks
    from dasc_runtime.verify import DascRefusal, check_server_args

    check_hooks(hooks())
    bound = inspect.signature(HybridReqToTokenPool._init_mamba_pool).bind(req_pool, *args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    sa = published_server_args()
    if sa is not None:
        check_server_args(sa, load_plan_once(settings))
    if a.get("mamba_envelope_layout"):
        raise DascRefusal("page-major (envelope) Mamba state layout is not supported")
    if a.get("enable_linear_replayssm") or a.get("enable_linear_replayssm_spec"):
        raise DascRefusal("ReplaySSM ring buffers are not supported")
    if a.get("speculative_num_draft_tokens") is not None:
        raise DascRefusal("speculative decoding states are not supported")
    if a.get("short_conv_layer_ids") or a.get("ngram_context_len"):
        # SGLang 0.5.23's per-slot side states (Qwen4-Exp PLE short conv / n-gram pools) ride along
        # with each native slot; dasc's pack and load do not carry them (SGLang's INT8 pool refuses too)
        raise DascRefusal("per-slot PLE side states (short-conv / n-gram pools) are not stored by the dasc pool")
    install_pool(req_pool, mamba_size=a["mamba_size"], cache_params=a["cache_params"],
                 mamba_layer_ids=a["mamba_layer_ids"], device=a["device"], settings=settings)
    return result


@refuse_in_scheduler
def after_load_model(result, runner, *args, **kwargs):
    """AFTER ``ModelRunner.load_model``: model type and decay-tensor fingerprint of the loaded weights."""
    settings = _settings()
    if not settings.active or getattr(runner, "is_draft_worker", False):
        return result
    from dasc_runtime.installed import INSTALLED
    from dasc_runtime.sglang_api import check_version, installed_version
    from dasc_runtime.startup_checks import check_hooks
    from dasc_runtime.verify import check_model_type, check_plan_supported, check_server_args
    from dasc_runtime.weight_updates import check_served_weights

    check_version(installed_version())
    check_hooks(hooks())
    sa = getattr(runner, "server_args", None) or published_server_args()
    plan = load_plan_once(settings)
    check_server_args(sa, plan)
    check_plan_supported(plan)
    hf = runner.model_config.hf_config
    check_model_type(plan, getattr(hf, "model_type", "?"), getattr(hf, "architectures", None) or ())
    hit = check_served_weights(runner, plan, settings)
    # the format that actually picked the loader (SGLang can switch dummy to ipc_cache), else the flag
    fmt = getattr(getattr(runner, "load_config", None), "load_format", None) or getattr(sa, "load_format", "")
    INSTALLED.verified_model = True
    INSTALLED.fingerprint_match = hit
    if hit.get("stand_in"):
        logger.info("dasc: serving plan %s on dummy weights (%s, %d decay tensors; masks from the plan's own "
                    "checkpoint)", plan.model.model_type, fmt, hit["tensors"])
    else:
        logger.info("dasc: plan matches the served model (%s, %d decay tensors, sha256 %s..., dtypes A_log=%s "
                    "dt_bias=%s)", plan.model.model_type, hit["tensors"], hit["sha256"][:16], hit.get("A_log"),
                    hit.get("dt_bias"))
    return result


@refuse_in_scheduler
def around_create_unified_radix_cache(original, ctx, *args, **kwargs):
    """AROUND SGLang's unified radix cache factory (the adapter's ``CACHE_FACTORY_TARGET``): the two-tier
    Mamba component, put in the ``CacheInitParams`` the factory builds its cache from."""
    settings = _settings()
    if not settings.active or not ctx.is_hybrid_ssm:
        return original(ctx, *args, **kwargs)
    from dasc_runtime.installed import INSTALLED
    from dasc_runtime.mamba_component import DascMambaComponent
    from dasc_runtime.pool import DascCheckpointPool
    from dasc_runtime.sglang_api import api
    from dasc_runtime.verify import DascRefusal
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    params = api().cache_factory_params(ctx, args, kwargs)
    if not isinstance(getattr(params.req_to_token_pool, "mamba_ckpt_pool", None), DascCheckpointPool):
        raise DascRefusal("the request pool has no dasc pool (unified memory pool or an unsupported model?)")
    params.component_registry_override = {**(params.component_registry_override or {}),
                                          ComponentType.MAMBA: DascMambaComponent}
    cache = original(ctx, *args, **kwargs)
    INSTALLED.component = cache.components[ComponentType.MAMBA]
    logger.info("dasc: two-tier state checkpoint cache installed (%s)", type(cache).__name__)
    return cache


def around_collect_cow(original, batch, reqs):
    """AROUND ``ScheduleBatch._collect_deferred_mamba_cow_and_clear``: host-side tier of each hit source,
    the hits of the admitted batch by tier, and under dasc-wr the refresh passes of the compressed hits
    (:func:`dasc_runtime.wr_refresh.plan_refresh`)."""
    from dasc_runtime.installed import INSTALLED
    from dasc_runtime.sglang_api import api
    from dasc_runtime.side_channels import attach_tier_hint
    from dasc_runtime.wr_refresh import plan_refresh

    pool = INSTALLED.pool
    if pool is None:
        return original(batch, reqs)
    state = api().mamba_state
    cow = [r for r in reqs if state(r).mamba_cow_src_index is not None]
    hint = [pool.is_own_id_tensor(state(r).mamba_cow_src_index) for r in cow]
    out = original(batch, reqs)
    if INSTALLED.component is not None:
        INSTALLED.component.counters.count_admitted_hits(hint)      # admission, not match (issue 13 item 12)
    src = batch.mamba_cow_src_indices
    if src is not None and len(hint) == src.numel():
        attach_tier_hint(src, hint)
        if INSTALLED.refresh is not None and any(hint):
            plan_refresh(batch, cow, hint)
    return out


def after_mamba_token_info(result, observer, *args, **kwargs):
    """AFTER ``SchedulerPoolStatsObserver._get_mamba_token_info``: dense checkpoints occupy native slots."""
    from dasc_runtime.installed import INSTALLED

    comp = INSTALLED.component
    if comp is None or result is None:
        return result
    pool = observer.req_to_token_pool
    # M, the slots SGLang allocates: under dasc-wr the Mamba pool holds B hidden scratch slots above them
    # (wr_scratch.build_pool_with_scratch; side_channels.hide_scratch_rows gives the allocator M back)
    size = getattr(getattr(pool, "mamba_allocator", None), "size", None) or pool.mamba_pool.size
    result.mamba_evictable_size = comp.book.dense_evictable()
    result.mamba_num_used = size - (result.mamba_available_size + result.mamba_evictable_size)
    result.mamba_usage = result.mamba_num_used / size
    return result


def around_check_int8(original, checker, ps, ckpt_pool):
    """AROUND ``SchedulerInvariantChecker._check_mamba_pool_with_int8``: the three-way dasc invariant.

    native: available + dense evictable + dense protected + session-held + dasc-wr scratch slots == M;
    compressed: available + compressed checkpoints + pending demotion targets == C.
    """
    from dasc_runtime.installed import INSTALLED
    from dasc_runtime.pool import DascCheckpointPool
    from dasc_runtime.side_channels import component_of

    comp = component_of(ckpt_pool) if isinstance(ckpt_pool, DascCheckpointPool) else None
    if comp is None:
        return original(checker, ps, ckpt_pool)
    m = checker.req_to_token_pool.mamba_pool.size
    session = checker.pool_stats_observer.session_held_mamba_slots()
    book = comp.book
    scratch = INSTALLED.refresh.seqs if INSTALLED.refresh is not None else 0
    native = ps.mamba_available_size + book.dense_evictable() + book.dense_protected() + session + scratch
    comp_total = ckpt_pool.available_size() + book.counts()["compressed"] + len(comp.pending)
    leak = native != m or comp_total != ckpt_pool.num_slots
    msg = (f"[dasc-native] total={m}, available={ps.mamba_available_size}, dense_evictable={book.dense_evictable()}, "
           f"dense_protected={book.dense_protected()}, session_held={session}, wr_scratch={scratch}\n"
           f"[dasc-compressed] total={ckpt_pool.num_slots}, available={ckpt_pool.available_size()}, "
           f"cached={book.counts()['compressed']}, demoting={len(comp.pending)}")
    return leak, msg


def after_usage_parts(result, stats, *args, **kwargs):
    """AFTER ``PoolStats.get_{prefill,decode}_usage_msg_parts``: dasc counters in SGLang's log lines."""
    from dasc_runtime.installed import INSTALLED, status_line

    if INSTALLED.pool is None or not isinstance(result, list):
        return result
    return result + [status_line()]


@refuse_in_scheduler
def around_req_pool_init(original, pool, *args, **kwargs):
    """AROUND ``HybridReqToTokenPool.__init__``: dasc-wr's hidden scratch rows and slots (``wr_scratch``)."""
    from dasc_runtime.wr_scratch import around_req_pool_init as hook

    settings = _settings()
    plan = load_plan_once(settings) if settings.active else None
    return hook(original, pool, args, kwargs, plan=plan, settings=settings, server_args=published_server_args())


def around_deferred_cow(original, runner, forward_batch):
    """AROUND ``ModelRunner._maybe_execute_deferred_mamba_cow_and_clear``: SGLang's restore, then dasc-wr's passes."""
    from dasc_runtime.wr_refresh import around_deferred_cow as hook

    return hook(original, runner, forward_batch)


@refuse_in_scheduler
def after_build_kv_cache(result, *args, **kwargs):
    """AFTER ``kv_cache_builder.build_kv_cache``: every hook in place, the tree's Mamba component dasc's
    (:func:`dasc_runtime.startup_checks.after_build_kv_cache`)."""
    if not _settings().active:
        return result
    from dasc_runtime.startup_checks import after_build_kv_cache as hook

    return hook(result, hooks())


def around_weight_update(original, manager, recv_req, *args, **kwargs):
    """AROUND ``SchedulerWeightUpdaterManager.update_weights_from_*``: the update, then the compressed tier
    flushed and the decay fingerprint re-verified (:func:`dasc_runtime.weight_updates.around_weight_update`)."""
    if not _settings().active:
        return original(manager, recv_req, *args, **kwargs)
    from dasc_runtime.weight_updates import around_weight_update as hook

    return hook(original, manager, recv_req, *args, **kwargs)


_CACHE_FACTORY = "cache factory"          # placeholders filled from the installed release's adapter
_ENGINE_KWARGS = "engine kwargs"
#: ``Engine(**kwargs)`` exists in every release; on an untested one its hook refuses a dasc plan in one line
_ENGINE_ANY_RELEASE = "sglang.srt.entrypoints.engine.Engine.__init__"

_HOOK_TABLE = (
    ("sglang.srt.server_args.ServerArgs.add_cli_args", add_cli_args, "AFTER"),
    ("sglang.srt.server_args.ServerArgs.from_cli_args", from_cli_args, "AROUND"),
    (_ENGINE_KWARGS, engine_kwargs_init, "AROUND"),
    ("sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool._init_mamba_pool", after_init_mamba_pool, "AFTER"),
    ("sglang.srt.model_executor.model_runner.ModelRunner.load_model", after_load_model, "AFTER"),
    (_CACHE_FACTORY, around_create_unified_radix_cache, "AROUND"),
    ("sglang.srt.managers.schedule_batch.ScheduleBatch._collect_deferred_mamba_cow_and_clear", around_collect_cow,
     "AROUND"),
    ("sglang.srt.managers.scheduler_components.pool_stats_observer.SchedulerPoolStatsObserver._get_mamba_token_info",
     after_mamba_token_info, "AFTER"),
    ("sglang.srt.managers.scheduler_components.invariant_checker.SchedulerInvariantChecker._check_mamba_pool_with_int8",
     around_check_int8, "AROUND"),
    ("sglang.srt.managers.scheduler_components.pool_stats_observer.PoolStats.get_prefill_usage_msg_parts",
     after_usage_parts, "AFTER"),
    ("sglang.srt.managers.scheduler_components.pool_stats_observer.PoolStats.get_decode_usage_msg_parts",
     after_usage_parts, "AFTER"),
    ("sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool.__init__", around_req_pool_init, "AROUND"),
    ("sglang.srt.model_executor.model_runner.ModelRunner._maybe_execute_deferred_mamba_cow_and_clear",
     around_deferred_cow, "AROUND"),
    ("sglang.srt.mem_cache.kv_cache_builder.build_kv_cache", after_build_kv_cache, "AFTER"),
)


def hooks(adapter=None) -> tuple:
    """The ``(target, hook, kind)`` of dasc for an SGLang release (default: the installed one): 18 for
    0.5.17, 20 for 0.5.23 (its ``end_weight_update``, and ``FIRST_ENGINE_TARGET``: the first ``Engine(...)``).

    Args:
        adapter: a release's adapter module (:mod:`dasc_runtime.sglang_0517` / ``sglang_0523``); it
            names the targets that differ (``CACHE_FACTORY_TARGET``, ``ENGINE_KWARGS_TARGET``,
            ``WEIGHT_UPDATE_METHODS``).
    Raises:
        DascRefusal: ``adapter`` is None and the installed SGLang is not a tested release.
    """
    if adapter is None:
        from dasc_runtime.sglang_api import api

        adapter = api()
    names = {_CACHE_FACTORY: adapter.CACHE_FACTORY_TARGET, _ENGINE_KWARGS: adapter.ENGINE_KWARGS_TARGET}
    first = ((adapter.FIRST_ENGINE_TARGET, first_engine_launch, "AROUND"),) if adapter.FIRST_ENGINE_TARGET else ()
    return tuple((names.get(target, target), fn, kind) for target, fn, kind in _HOOK_TABLE) + first + tuple(
        (target, around_weight_update, "AROUND") for target in update_targets(adapter))


def register() -> None:
    """Entry point of the ``sglang.srt.plugins`` group: register the dasc hooks (cheap, no CUDA)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from dasc_runtime.sglang_api import adapter_for, installed_version, tested_range

    version = installed_version()
    adapter = adapter_for(version)
    if adapter is not None:
        table = hooks(adapter)
    else:
        # keep the flags (so a plan is refused with a clear message, not an argparse error) and
        # refuse at start-up (ModelRunner.load_model); no cache hook is applied to an untested SGLang
        logger.warning("dasc: sglang %s is installed, the dasc runtime is tested with sglang %s only", version,
                       tested_range())
        table = tuple(h for h in _HOOK_TABLE if h[1] in (add_cli_args, from_cli_args, after_load_model)) + (
            (_ENGINE_ANY_RELEASE, engine_kwargs_init, "AROUND"),)
    for target, fn, kind in table:
        HookRegistry.register(target, fn, getattr(HookType, kind))
    if adapter is not None:
        take_running_engine_kwargs(adapter)          # 0.5.23: the first Engine(...) is loading the plugins
