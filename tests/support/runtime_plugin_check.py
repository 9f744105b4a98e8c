"""Run in a fresh process by tests/runtime/test_plugin.py: SGLang's own plugin loading applies the
dasc hooks (they patch SGLang classes process-wide, so they are kept out of the pytest process).

Usage (from the repository root): python -m tests.support.runtime_plugin_check PLAN_DIR KDA_PLAN_DIR
-> prints one JSON object of findings.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from types import SimpleNamespace

warnings.filterwarnings("ignore")

import torch  # noqa: E402

from tests.support import runtime_fixtures as F  # noqa: E402
from tests.support.sglang_steps import steps  # noqa: E402


def main(plan_dir: str, kda_plan_dir: str) -> dict:
    from dasc_runtime.side_channels import settings_of, tier_hint, tier_policy_of

    out: dict = {}
    from importlib.metadata import entry_points

    out["entry_point"] = [e.value for e in entry_points(group="sglang.srt.plugins") if e.name == "dasc"]
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    load_plugins()                                            # what launch_server / Engine / schedulers do
    from tests.support.runtime_fixtures import as_on_a_gpu_machine

    as_on_a_gpu_machine()                                     # its launches run as on a GPU machine
    from dasc_runtime.plugin import hooks

    S = steps()
    out["hooks_applied"] = sorted(t for t, _, _ in hooks() if t in HookRegistry._patched)
    out["hooks_total"] = len(hooks())
    from dasc_runtime.sglang_api import api as _api

    out["weight_methods"] = len(_api().WEIGHT_UPDATE_METHODS)
    out["first_engine_hook"] = _api().FIRST_ENGINE_TARGET is not None

    # 1. the CLI flag (python -m sglang.launch_server ... --dasc-plan PLAN) and the environment
    for k in ("DASC_PLAN", "DASC_POOL_SLOTS", "DASC_POOL_BYTES", "DASC_COMPRESSED_ONLY", "DASC_DEMOTE_WATERMARK",
              "DASC_DUMMY_DECAY_OK"):
        os.environ.pop(k, None)
    from sglang.srt.server_args import ServerArgs, prepare_server_args, set_global_server_args_for_scheduler

    sa = prepare_server_args(["--model-path", "dummy", "--page-size", "1", "--dasc-plan", plan_dir,
                              "--dasc-pool-slots", "5", "--dasc-demote-watermark", "2",
                              "--dasc-dummy-decay-ok", "--load-format", "dummy"])   # the flag needs dummy weights
    out["cli_settings"] = settings_of(sa)
    from dasc_runtime.launcher import CHECKED_VAR

    out["cli_env"] = {k: v for k, v in os.environ.items() if k.startswith("DASC_") and k != CHECKED_VAR}
    out["cli_checked"] = bool(os.environ.get(CHECKED_VAR))
    import pickle

    out["pickled_settings"] = settings_of(pickle.loads(pickle.dumps(sa)))
    # 2. Engine(...) keyword arguments reach every scheduler process (the settings it reads)
    from dataclasses import asdict

    from dasc_runtime.settings import DascSettings, current_settings

    cli_env = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("DASC_")}
    sa_kw = S.engine_server_args(model_path="dummy", page_size=1, dasc_plan=plan_dir, dasc_compressed_only=True)
    seen = asdict(current_settings(sa_kw))
    out["kwarg_settings"] = {k: v for k, v in seen.items() if v != getattr(DascSettings(), k)}
    for k in [k for k in os.environ if k.startswith("DASC_")]:
        os.environ.pop(k)
    plain = ServerArgs(model_path="dummy", page_size=1)
    out["plain_settings"] = settings_of(plain)
    os.environ.update(cli_env)

    # 3. the pool hook: HybridReqToTokenPool gets the dasc pool in mamba_ckpt_pool
    sa._mamba_cache_chunk_size = 64
    set_global_server_args_for_scheduler(sa)
    pool, alloc = F.hybrid_pools(F.gdn_cache_params(), mamba_size=8)
    from dasc_runtime.pool import DascCheckpointPool

    ck = pool.mamba_ckpt_pool
    out["pool_type"] = type(ck).__name__
    out["pool_slots"] = ck.num_slots if isinstance(ck, DascCheckpointPool) else None
    out["pool_watermark"] = tier_policy_of(ck).watermark if isinstance(ck, DascCheckpointPool) else None

    # 4. the cache hook: the built-in factory builds UnifiedRadixCache with the two-tier component
    import pkgutil

    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    from dasc_runtime.sglang_api import api

    factory = pkgutil.resolve_name(api().CACHE_FACTORY_TARGET)
    params = CacheInitParams(req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=1, disable=False)
    cache = S.call_cache_factory(factory, sa, params)
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    comp = cache.components[ComponentType.MAMBA]
    out["component"] = type(comp).__name__

    # 5. a batch of hits: the hint hook marks which sources are compressed (no device read later)
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    cid = ck.alloc(1)
    reqs = [S.cow_request(torch.tensor([3]), torch.tensor(4)), S.cow_request(cid, torch.tensor(5)),
            S.cow_request(None, torch.tensor(6), clear=True)]
    batch = SimpleNamespace()
    ScheduleBatch._collect_deferred_mamba_cow_and_clear(batch, reqs)
    out["cow_src"] = batch.mamba_cow_src_indices.tolist()
    out["cow_hint"] = tier_hint(batch.mamba_cow_src_indices)
    out["clear"] = batch.mamba_clear_indices.tolist()
    ck.free(cid)

    # 6. SGLang's log lines carry the dasc counters; pool stats count dense checkpoints as native
    from sglang.srt.managers.scheduler_components.pool_stats_observer import PoolStats, SchedulerPoolStatsObserver

    ps = PoolStats(full_num_used=0, full_token_usage=0.0, full_available_size=1, full_evictable_size=0,
                   is_hybrid_ssm=True, mamba_num_used=0, mamba_usage=0.0, mamba_available_size=8,
                   mamba_evictable_size=0)
    out["prefill_log_parts"] = ps.get_prefill_usage_msg_parts()
    obs = SimpleNamespace(req_to_token_pool=pool)
    comp.book.count["dense"] = 2                 # two dense checkpoints, one locked (bookkeeping only)
    comp.book.locked["dense"] = 1
    fixed = SchedulerPoolStatsObserver._get_mamba_token_info.__wrapped__  # original
    from dasc_runtime.plugin import after_mamba_token_info

    ps2 = PoolStats(full_num_used=0, full_token_usage=0.0, full_available_size=1, full_evictable_size=0,
                    is_hybrid_ssm=True, mamba_num_used=3, mamba_usage=3 / 8, mamba_available_size=5,
                    mamba_evictable_size=0)
    after_mamba_token_info(ps2, obs)
    out["stats_after"] = [ps2.mamba_evictable_size, ps2.mamba_num_used, ps2.mamba_usage]
    from sglang.srt.managers.scheduler_components.invariant_checker import SchedulerInvariantChecker

    checker = SimpleNamespace(req_to_token_pool=pool,
                              pool_stats_observer=SimpleNamespace(session_held_mamba_slots=lambda: 0))
    ps2.mamba_available_size = 6
    out["invariant_ok"] = SchedulerInvariantChecker._check_mamba_pool_with_int8(checker, ps2, ck)
    ps2.mamba_available_size = 5
    out["invariant_leak"] = SchedulerInvariantChecker._check_mamba_pool_with_int8(checker, ps2, ck)
    comp.book.count["dense"] = 0
    comp.book.locked["dense"] = 0
    del fixed

    # 7. refusals: a plan compiled for another model; an option the plan cannot serve. First in the launching
    # process: Engine(...) with the plan only in DASC_PLAN, not checked yet
    from dasc_runtime.installed import INSTALLED

    os.environ.pop(CHECKED_VAR, None)
    os.environ["DASC_PLAN"] = plan_dir
    try:
        S.engine_server_args(model_path="dummy", page_size=1, enable_hierarchical_cache=True)
        out["hicache_launch"] = "constructed"
    except Exception as exc:                   # DascRefusal, before SGLang builds anything
        out["hicache_launch"] = f"{type(exc).__name__}: {exc}"

    def as_scheduler(plan):
        """The environment a scheduler process inherits: the plan, checked by its launcher (another process)."""
        os.environ["DASC_PLAN"] = plan
        F.as_scheduler_env()

    INSTALLED.reset()
    as_scheduler(kda_plan_dir)
    sa_k = ServerArgs(model_path="dummy", page_size=1)
    sa_k._mamba_cache_chunk_size = 64
    set_global_server_args_for_scheduler(sa_k)
    try:
        F.hybrid_pools(F.gdn_cache_params(), mamba_size=8)
        out["mismatch"] = "started"
    except Exception as exc:                   # DascRefusal
        out["mismatch"] = f"{type(exc).__name__}: {exc}"
    INSTALLED.reset()
    as_scheduler(plan_dir)
    sa_h = ServerArgs(model_path="dummy", page_size=1, enable_hierarchical_cache=True)
    sa_h._mamba_cache_chunk_size = 64
    set_global_server_args_for_scheduler(sa_h)
    try:
        F.hybrid_pools(F.gdn_cache_params(), mamba_size=8)
        out["hicache"] = "started"
    except Exception as exc:
        out["hicache"] = f"{type(exc).__name__}: {exc}"
    # 8. no plan anywhere: every hook passes through (SGLang's own pools and cache)
    os.environ.pop("DASC_PLAN", None)
    os.environ.pop(CHECKED_VAR, None)
    INSTALLED.reset()
    set_global_server_args_for_scheduler(plain)
    p2, _ = F.hybrid_pools(F.gdn_cache_params(), mamba_size=8)
    out["no_plan_pool"] = repr(p2.mamba_ckpt_pool)
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1], sys.argv[2]), default=str))
