"""Start-up checks that the server is wired the way dasc serves it (issue 13 items 7, 9, 11).

SGLang's ``HookRegistry.apply_hooks`` only *logs* a hook that fails to patch (a renamed target, an
import error), and ``load_plugins`` only logs a plugin that raises, so a dasc server could start
with some hooks missing: without ``_create_unified_radix_cache`` patched, SGLang's own
``MambaComponent`` would drive the dasc pool as if it were its INT8 pool, silently. Each check here
raises :class:`~dasc_runtime.verify.DascRefusal` (one line) instead:

* :func:`check_hooks`: every target of ``plugin.HOOKS`` is in ``HookRegistry._patched`` and the
  attribute SGLang calls still is a wrapper chain holding dasc's hook (sglang/srt/plugins/
  hook_registry.py, ``_wrap_fn``: each wrapper's closure holds ``hook``, ``__wrapped__`` the next);
* :func:`check_component`: after SGLang built its tree cache (AFTER ``kv_cache_builder.
  build_kv_cache``, :func:`after_build_kv_cache`), the cache's Mamba component is dasc's
  :class:`~dasc_runtime.mamba_component.DascMambaComponent` driving this process's dasc pool;
* :func:`check_serving_options`: server options neither served nor tested with dasc, each refused
  with the flag that turns it off (list below), and storage-balanced plans under overlap scheduling.

Refused options (item 11) and why:

==================================  ===============================================================
``--mamba-radix-cache-strategy      its second ping-pong slot is allocated and freed on demand by
extra_buffer_lazy``                 SGLang's batch result processor (``mamba_lazy_*``), a path
                                    dasc's insertion (which donates / packs that slot) is not tested
                                    on; ``extra_buffer`` (SGLang's default) and ``no_buffer`` are
``--enable-mixed-chunk``            a MIXED batch joins decode requests to the hit batch whose
                                    copy-on-write and dasc-wr refresh dasc plans; not tested
``--enable-dp-attention``           each DP rank schedules its own requests while the tier agreement
                                    and the decay fingerprint gather run on the attention-TP group;
                                    not tested
``--enable-memory-saver``           it releases and restores SGLang's tagged allocations; the dasc
                                    pool is allocated outside them, so a release would keep it and a
                                    resume would not restore what it held
==================================  ===============================================================

``--mamba-max-states-per-path`` is served: SGLang's path cap evicts interior states through the
component's ``evict_component``, which frees either tier (tested in ``tests/runtime/``).

Storage balancing under overlap scheduling (item 9): a storage-balanced pack is an all-to-all on
the attention-TP group issued on the scheduler's current stream. With SGLang's overlap scheduler
that is the schedule stream, while the previous batch's forward, and its TP collectives, may still
run on the forward stream: the two streams' collectives could interleave differently on different
ranks (a cross-rank deadlock). Without overlap scheduling the scheduler thread issues cache work and
forwards on one stream in one order, the same on every rank. So a storage-balanced plan at TP > 1
is refused unless ``--disable-overlap-schedule`` is given.
"""

from __future__ import annotations

import pkgutil
from typing import Iterable

__all__ = ["check_hooks", "hook_problems", "check_component", "check_serving_options", "after_build_kv_cache"]


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
    """Targets of ``hooks`` (``plugin.HOOKS``: ``(target, hook, kind)``) not patched with their hook."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    out = []
    for target, hook, _ in hooks:
        if target not in HookRegistry._patched:
            out.append(f"{target} (not patched: SGLang's HookRegistry logged the error)")
        elif not _chain_holds(_resolve(target), hook):
            out.append(f"{target} (patched, then replaced: dasc's hook is no longer called)")
    return out


def check_hooks(hooks: Iterable) -> None:
    """Refuse to start unless every hook of ``hooks`` (``plugin.HOOKS``) is in place (module docstring).

    Raises:
        DascRefusal: names every target that is not patched with its dasc hook.
    """
    from dasc_runtime.verify import DascRefusal

    hooks = list(hooks)
    bad = hook_problems(hooks)
    if bad:
        raise DascRefusal(f"{len(bad)} of dasc's {len(hooks)} SGLang hooks not in place: " + "; ".join(bad)
                          + " (another plugin patching the same targets, or not sglang 0.5.17?)")


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


def check_serving_options(sa, plan=None) -> None:
    """Refuse the server options of the module docstring's table, and a storage-balanced plan at TP > 1
    under overlap scheduling.

    Args:
        sa: SGLang's ``ServerArgs`` (attributes read with defaults, so a partial namespace works).
        plan: the loaded plan, or None (then only the plan-independent options are checked).
    Raises:
        DascRefusal: one line naming every such option and the flag that turns it off.
    """
    from dasc_runtime.verify import DascRefusal

    g = lambda name, default=None: getattr(sa, name, default)  # noqa: E731
    bad = []
    if g("mamba_radix_cache_strategy") == "extra_buffer_lazy":
        bad.append("--mamba-radix-cache-strategy extra_buffer_lazy (use extra_buffer, SGLang's default, or "
                   "no_buffer)")
    if g("enable_mixed_chunk"):
        bad.append("--enable-mixed-chunk (drop it)")
    if g("enable_dp_attention"):
        bad.append("--enable-dp-attention (not supported)")
    if g("enable_memory_saver"):
        bad.append("--enable-memory-saver (the dasc pool lies outside the memory it releases and restores)")
    if plan is not None and plan.tp.balance == "storage" and plan.tp.tp_size > 1 \
            and not g("disable_overlap_schedule", False):
        bad.append(f"a storage-balanced plan at TP {plan.tp.tp_size} with overlap scheduling (its all-to-all "
                   f"on the schedule stream could interleave with the forward's TP collectives differently "
                   f"on each rank; add --disable-overlap-schedule, or recompile with --balance off)")
    if bad:
        raise DascRefusal("unsupported option(s): " + "; ".join(bad))


def after_build_kv_cache(result, hooks: Iterable):
    """AFTER ``kv_cache_builder.build_kv_cache`` (``plugin.after_build_kv_cache``): every hook of
    ``hooks`` in place and the tree's Mamba component dasc's. Returns ``result``."""
    from dasc_runtime.installed import INSTALLED

    check_hooks(hooks)
    check_component(result.tree_cache, INSTALLED.pool)
    return result
