"""Start-up checks that the server is wired the way dasc serves it (issue 13 items 7, 9, 11).

SGLang's ``HookRegistry.apply_hooks`` only *logs* a hook that fails to patch (a renamed target, an
import error), and ``load_plugins`` only logs a plugin that raises, so a dasc server could start
with some hooks missing: without ``_create_unified_radix_cache`` patched, SGLang's own
``MambaComponent`` would drive the dasc pool as if it were its INT8 pool, silently. Each check here
raises :class:`~dasc_runtime.verify.DascRefusal` (one line) instead:

* :func:`check_hooks`: every target of ``plugin.hooks()`` is in ``HookRegistry._patched`` and the
  attribute SGLang calls still is a wrapper chain holding dasc's hook (sglang/srt/plugins/
  hook_registry.py, ``_wrap_fn``: each wrapper's closure holds ``hook``, ``__wrapped__`` the next);
* :func:`check_component`: after SGLang built its tree cache (AFTER ``kv_cache_builder.
  build_kv_cache``, :func:`after_build_kv_cache`), the cache's Mamba component is dasc's
  :class:`~dasc_runtime.mamba_component.DascMambaComponent` driving this process's dasc pool, on
  SGLang's Python tree core (0.5.23 also has a Rust one, which it picks only for built-in components);

In the process that launches SGLang (:mod:`dasc_runtime.launcher`: the ``from_cli_args`` / ``Engine`` keyword
hooks), before SGLang builds its ``ServerArgs`` and before any weights load, :func:`check_launch`:

* :func:`check_env_knobs`: the environment-only A/B and diagnostic knobs parse;
* :func:`check_plan_early`: the plan (from ``--dasc-plan`` or ``DASC_PLAN``) reads, and it is for the model's type;
* every rule of :func:`dasc_runtime.serving_rules.serving_refusals` that the options as given and the plan decide
  (all but the served context length's), ``--dasc-dummy-decay-ok`` with a load format other than ``dummy`` or with
  SGLang's ``--weight-cache-mode`` on (``verify.dummy_decay_refusal``; both were refused only once the weights had
  loaded), and a ``--dasc-pool-bytes`` that holds no slot of the plan;
* :func:`check_gpu_visible`: last, once the plan and the options pass, that this machine has a CUDA GPU, so that a
  valid plan launched on a CPU machine stops in one line rather than in SGLang's device detection, after the
  launcher, with a traceback ("No accelerator ... is available").

The refused server options (item 11) and their reasons are the serving rules; the scheduler checks them again
on the options SGLang resolved (:func:`dasc_runtime.verify.check_server_args`).
"""

from __future__ import annotations

import os
import pkgutil
from typing import Iterable

__all__ = ["check_hooks", "hook_problems", "check_component", "after_build_kv_cache", "check_env_knobs",
           "check_plan_early", "check_launch"]


def _resolve(target: str):
    """The function SGLang calls for ``target`` now (classmethod / staticmethod unwrapped), or None."""
    owner_path, attr = target.rsplit(".", 1)
    try:
        owner = pkgutil.resolve_name(owner_path)
    except Exception:
        return None
    raw = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
    return getattr(raw, "__func__", raw)


def _chain_holds(fn, hook) -> bool:
    """True when ``hook`` is one of the hooks in HookRegistry's wrapper chain starting at ``fn``."""
    seen = 0
    while fn is not None and seen < 64:
        code = getattr(fn, "__code__", None)
        cells = getattr(fn, "__closure__", None) or ()
        if code is not None and "hook" in code.co_freevars:
            if cells[code.co_freevars.index("hook")].cell_contents is hook:
                return True
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return False


def hook_problems(hooks: Iterable) -> list[str]:
    """Targets of ``hooks`` (``plugin.hooks()``: ``(target, hook, kind)``) not patched with their hook."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    out = []
    for target, hook, _ in hooks:
        if target not in HookRegistry._patched:
            out.append(f"{target} (not patched: SGLang's HookRegistry logged the error)")
        elif not _chain_holds(_resolve(target), hook):
            out.append(f"{target} (patched, then replaced: dasc's hook is no longer called)")
    return out


def check_hooks(hooks: Iterable) -> None:
    """Refuse to start unless every hook of ``hooks`` (``plugin.hooks()``) is in place (module docstring).

    Raises:
        DascRefusal: names every target that is not patched with its dasc hook.
    """
    from dasc_runtime.verify import DascRefusal

    hooks = list(hooks)
    bad = hook_problems(hooks)
    if bad:
        raise DascRefusal(f"{len(bad)} of dasc's {len(hooks)} SGLang hooks not in place: " + "; ".join(bad)
                          + " (another plugin patching the same targets?)")


def check_component(tree_cache, dpool) -> None:
    """Refuse unless ``tree_cache`` drives the Mamba state with dasc's two-tier component on ``dpool``.

    Args:
        tree_cache: the cache SGLang built (``KVCacheBuildResult.tree_cache``).
        dpool: this process's :class:`~dasc_runtime.pool.DascCheckpointPool` (``INSTALLED.pool``), or None.
    Raises:
        DascRefusal: no dasc pool, no Mamba component, a component other than
            :class:`~dasc_runtime.mamba_component.DascMambaComponent`, or one driving another pool.
    """
    from dasc_runtime.verify import DascRefusal

    kind = type(tree_cache).__name__
    if dpool is None:
        raise DascRefusal(f"SGLang built a {kind} but no dasc pool: the model's recurrent state pool "
                          f"(HybridReqToTokenPool) was not created, so the plan has nothing to serve")
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    from dasc_runtime.mamba_component import DascMambaComponent

    comp = (getattr(tree_cache, "components", None) or {}).get(ComponentType.MAMBA)
    if not isinstance(comp, DascMambaComponent):
        raise DascRefusal(f"SGLang's {kind} drives the Mamba state with {type(comp).__name__}, not dasc's "
                          f"two-tier component: it would use the dasc pool as its INT8 checkpoint pool "
                          f"(unset SGLANG_EXPERIMENTAL_CPP_RADIX_TREE / --radix-cache-backend, or check the hooks)")
    if comp.dpool is not dpool:
        raise DascRefusal(f"the two-tier component of SGLang's {kind} drives another pool than this process's "
                          f"dasc pool")
    from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore

    if not isinstance(comp.tree_core, UnifiedTreeCore):
        # SGLang 0.5.23 can run the tree in Rust; dasc's overrides and its walk need the Python tree core
        raise DascRefusal(f"SGLang's {kind} runs the tree core {type(comp.tree_core).__name__}; dasc's two-tier "
                          f"component needs SGLang's Python UnifiedTreeCore (unset "
                          f"SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND)")


def after_build_kv_cache(result, hooks: Iterable):
    """AFTER ``kv_cache_builder.build_kv_cache`` (``plugin.after_build_kv_cache``): every hook of
    ``hooks`` in place and the tree's Mamba component dasc's. Returns ``result``."""
    from dasc_runtime.installed import INSTALLED

    check_hooks(hooks)
    check_component(result.tree_cache, INSTALLED.pool)
    return result


def check_env_knobs() -> None:
    """The environment-only A/B knobs (``runtime/settings.py``), read where they act inside the
    scheduler: parsed here, at start-up, so a typo is refused before the model loads.

    Raises:
        DascInputError: a value ``DASC_RECLAIM_WAIT``, ``DASC_EVICT_SHADOWED_FIRST``, ``DASC_EVICT_FORK_TEST`` or a
            diagnostic variable (``settings.DIAGNOSTIC_ENV``) does not take; the fork test off with its rule off.
    """
    from dasc_runtime.demotion import reclaim_wait_mode
    from dasc_runtime.settings import DIAGNOSTIC_ENV, env_setting
    from dasc_runtime.tier_operations import evict_fork_test, evict_shadowed_first

    reclaim_wait_mode()
    evict_shadowed_first()
    evict_fork_test()
    for name in DIAGNOSTIC_ENV:
        env_setting(name, strict=True)


def check_plan_early(settings, model_path=None):
    """Read the plan of ``settings`` (``DascSettings``) in the process that launches SGLang, before any weights load:
    a missing or damaged plan used to be found by the scheduler only after the model had loaded (minutes for a 48B
    checkpoint). With ``model_path`` a local directory holding ``config.json``, its ``model_type`` (the field
    ``dasc compile`` read) must be the plan's. The scheduler reads and checks the plan again
    (``plugin.after_load_model``), with the served model and state beside it.

    Returns:
        the plan (``dasc_compile.schema.Plan``), read afresh (a user may recompile it and retry).
    Raises:
        DascInputError: the plan does not read (``dasc_compile.schema.load_plan``: names ``plan.json`` or the kernel
            module and what is wrong).
        DascRefusal: a plan for another model type.
    """
    from dasc_compile.schema import load_plan
    from dasc_runtime.verify import check_model_type

    plan = load_plan(settings.plan)
    model_type = _config_model_type(model_path)
    if model_type is not None:
        check_model_type(plan, model_type, served=f"{model_path}/config.json says")
    return plan


def check_launch(settings, options, source=None):
    """Everything about a launch that the settings, the server options as given and the plan decide, checked in
    the launching process before SGLang resolves its options and before weights load (module docstring). The
    scheduler checks the same again once SGLang resolved them (``verify.check_server_args``,
    ``verify.check_plan_supported``, ``wr_scratch.check_refresh_startup``, ``pool_install.install_pool``).

    Args:
        settings: the resolved ``DascSettings`` (active). options: SGLang's options as given, by their ``ServerArgs``
            names (the argparse namespace, or the ``Engine`` keyword arguments); missing ones read as unset.
        source: field -> the flag or variable each setting came from (``settings.resolve_settings``).
    Returns:
        the plan.
    Raises:
        DascRefusal: an untested SGLang release; a plan for another model type; one line listing every serving rule
            that applies (``unsupported option(s): ...`` first, then plan and dasc-wr refusals).
        DascInputError: a knob or the plan does not read; a ``--dasc-pool-bytes`` budget that holds no usable slot of
            the plan's bottleneck rank once dasc-wr's scratch slots are charged (:func:`_check_pool_bytes`; exactly
            at start-up, once SGLang's prefill chunk is known).
    """
    from dasc_compile.schema import DascInputError
    from dasc_runtime.serving_rules import serving_refusals
    from dasc_runtime.sglang_api import check_version, installed_version
    from dasc_runtime.verify import DascRefusal, dummy_decay_refusal

    check_version(installed_version())
    check_env_knobs()
    try:
        plan = check_plan_early(settings, getattr(options, "model_path", None))
    except DascRefusal:
        raise
    except DascInputError as exc:                     # the plan does not read: name where it came from
        raise DascInputError(f"{(source or {}).get('plan', '--dasc-plan')}: {exc}") from None
    bad = serving_refusals(options, plan, refresh_slots=settings.refresh_slots)      # no context length yet
    opts = [r.text for r in bad if r.scope == "option"]
    dummy = dummy_decay_refusal(settings.dummy_decay_ok, getattr(options, "load_format", None),
                                (source or {}).get("dummy_decay_ok", "--dasc-dummy-decay-ok"),
                                getattr(options, "weight_cache_mode", None))
    parts = (["unsupported option(s): " + "; ".join(opts)] if opts else []) + \
        [r.text for r in bad if r.scope != "option"] + ([dummy] if dummy else [])
    if parts:
        raise DascRefusal("; ".join(parts))
    if settings.pool_bytes is not None:
        _check_pool_bytes(settings, options, plan, (source or {}).get("pool_bytes", "--dasc-pool-bytes"))
    check_gpu_visible()
    return plan


def cuda_visible() -> bool:
    """Whether torch sees a GPU through ``torch.cuda`` in this process (``torch.cuda.is_available()``): False on a CPU
    machine, with a CPU-only torch build, or when ``CUDA_VISIBLE_DEVICES`` hides every card; True on a ROCm build
    with an AMD card too (its devices appear as ``torch.cuda``; dasc's kernels are not tested there)."""
    import torch

    return bool(torch.cuda.is_available())


def check_gpu_visible() -> None:
    """The launch needs a CUDA GPU: the compressed pool is allocated on it and its pack / load kernels are Triton
    kernels built for it (``--device`` other than cuda is a serving rule, ``serving_rules``' ``device``). Run last in
    :func:`check_launch`, so that on a CPU machine every refusal the plan and the options earn comes first.

    Raises:
        DascRefusal: no CUDA GPU is visible to this process; the line names ``CUDA_VISIBLE_DEVICES`` when it is set
            and says how to check the plan and its flags without a GPU (``dasc size``).
    """
    from dasc_runtime.verify import DascRefusal

    if cuda_visible():
        return
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={hidden!r})" if hidden is not None else ""
    raise DascRefusal(f"no CUDA GPU is visible to this process{where}: the dasc pool and its Triton kernels run on "
                      f"CUDA GPUs; on a machine without one, check the plan and its server flags with "
                      f"`dasc size PLAN --max-running-requests R --budget BYTES`")


def _check_pool_bytes(settings, options, plan, what: str) -> None:
    """A ``--dasc-pool-bytes`` budget must hold dasc-wr's scratch slots and then one usable compressed slot of the plan's
    bottleneck rank (``wr_scratch.budget_after_scratch`` at start-up, then ``pool.slots_for_budget``). Before SGLang
    resolves its prefill chunk the scratch is charged at its least: the B that ``--chunked-prefill-size`` as given
    caps ``--dasc-refresh-slots`` to (-1 or 0, chunking off: no cap, B as given or the default), or, when the chunk
    is left to SGLang, the B its smallest automatic chunk leaves (``serving_rules.SMALLEST_AUTO_CHUNK``, the chunk
    ``dasc size`` assumes; a larger one can only leave more).

    Raises:
        DascInputError: naming ``what`` (the flag or variable), the scratch charged and the smallest budget that fits.
    """
    from dasc_compile.schema import DascInputError
    from dasc_compile.schema.units import byte_count, flag_bytes, smallest_budget
    from dasc_runtime.pool import slots_for_budget
    from dasc_runtime.serving_rules import SMALLEST_AUTO_CHUNK, served_refresh_slots
    from dasc_runtime.wr_scratch import scratch_state_bytes

    chunk = getattr(options, "chunked_prefill_size", None)
    given = isinstance(chunk, int) and not isinstance(chunk, bool)     # -1 / 0: chunking off, B is not capped
    b = served_refresh_slots(plan, settings.refresh_slots, chunk if given else SMALLEST_AUTO_CHUNK)
    scratch = scratch_state_bytes(plan, b) if b else 0
    slot = int(plan.tp.bottleneck_bytes_per_slot)
    if scratch and settings.pool_bytes - scratch < smallest_budget(slot):
        basis = "" if given else f" at SGLang's smallest automatic prefill chunk, {SMALLEST_AUTO_CHUNK} tokens, as dasc size assumes"
        raise DascInputError(
            f"{what} {byte_count(settings.pool_bytes)} leaves no usable compressed slot after dasc-wr's {b} scratch "
            f"slot{'s' if b > 1 else ''} ({byte_count(scratch)}{basis}; a compressed slot takes {byte_count(slot)} "
            f"and slot 0 is reserved): give at least {flag_bytes(scratch + smallest_budget(slot))}, or size the pool "
            f"with dasc size, which charges the scratch")
    slots_for_budget(settings.pool_bytes - scratch, slot, what=what)


def _config_model_type(model_path) -> str | None:
    """``model_type`` of ``model_path/config.json`` when ``model_path`` is a local model directory, else None (a hub
    id, or a file that does not read: the scheduler's own check decides then)."""
    import json
    from pathlib import Path

    if not model_path:
        return None
    path = Path(str(model_path)) / "config.json"
    try:
        value = json.loads(path.read_text()).get("model_type") if path.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None
