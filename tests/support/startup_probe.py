"""Run in a fresh process by tests/runtime/test_startup_checks.py: SGLang's own plugin loading, with one
dasc hook that fails to patch, then patched, then replaced behind dasc's back.

Usage (from the repository root): python -m tests.support.startup_probe PLAN_DIR  -> prints ``RESULT {json}``.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from types import SimpleNamespace

warnings.filterwarnings("ignore")

from tests.support import runtime_fixtures as F  # noqa: E402
from tests.support.sglang_steps import steps  # noqa: E402


def _try(fn) -> str:
    try:
        fn()
        return "started"
    except Exception as exc:                    # DascRefusal, one line
        return f"{type(exc).__name__}: {exc}"


def main(plan_dir: str) -> dict:
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    from dasc_runtime.sglang_api import api

    REGISTRY = api().CACHE_FACTORY_TARGET            # the installed release's unified radix cache factory
    factory_name = REGISTRY.rsplit(".", 1)[1]
    S = steps()
    out: dict = {}
    # 1. the registry hook fails to patch: SGLang's HookRegistry logs it and goes on
    real_apply = HookRegistry._apply_target.__func__

    def failing_apply(cls, target, hooks):
        if target == REGISTRY:
            raise ImportError("simulated: the target moved in this SGLang build")
        return real_apply(cls, target, hooks)
    HookRegistry._apply_target = classmethod(failing_apply)
    load_plugins()
    HookRegistry._apply_target = classmethod(real_apply)
    out["registry_patched"] = REGISTRY in HookRegistry._patched
    os.environ["DASC_PLAN"] = plan_dir
    F.as_scheduler_env()                       # this process plays a scheduler: its launcher checked the plan
    sa = ServerArgs(model_path="dummy", page_size=1)
    sa._mamba_cache_chunk_size = 64
    set_global_server_args_for_scheduler(sa)
    out["failed_patch"] = _try(lambda: F.hybrid_pools(F.gdn_cache_params(), mamba_size=8))

    # 2. patched (as apply_hooks would have): the server starts, the tree's component is dasc's
    from dasc_runtime.installed import INSTALLED

    HookRegistry._apply_target(REGISTRY, HookRegistry._hooks[REGISTRY])
    HookRegistry._patched.add(REGISTRY)
    INSTALLED.reset()
    pool, alloc = F.hybrid_pools(F.gdn_cache_params(), mamba_size=8)
    from sglang.srt.mem_cache import registry
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    from dasc_runtime.plugin import after_build_kv_cache

    params = CacheInitParams(req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=1, disable=False)
    cache = S.call_cache_factory(getattr(registry, factory_name), sa, params)
    out["patched"] = _try(lambda: after_build_kv_cache(SimpleNamespace(tree_cache=cache)))

    # 3. something else rebinds the factory to SGLang's original: its own MambaComponent on the dasc pool
    original = getattr(registry, factory_name).__wrapped__
    setattr(registry, factory_name, original)
    params2 = CacheInitParams(req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=1, disable=False)
    plain = S.call_cache_factory(original, sa, params2)
    out["plain_component"] = type(plain.components[list(plain.components)[-1]]).__name__
    out["replaced"] = _try(lambda: after_build_kv_cache(SimpleNamespace(tree_cache=plain)))
    from dasc_runtime.startup_checks import check_component

    out["plain_component_check"] = _try(lambda: check_component(plain, INSTALLED.pool))
    INSTALLED.reset()
    out["replaced_pool"] = _try(lambda: F.hybrid_pools(F.gdn_cache_params(), mamba_size=8))

    # 4. patched again; the real start-up path refuses an option it does not serve, with one line
    HookRegistry._apply_target(REGISTRY, HookRegistry._hooks[REGISTRY])
    INSTALLED.reset()
    F.set_server_args(chunk=64, enable_mixed_chunk=True)
    out["mixed_chunk"] = _try(lambda: F.hybrid_pools(F.gdn_cache_params(), mamba_size=8))
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1]), default=str))
