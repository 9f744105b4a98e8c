"""Start-up refusals of issue 13 items 7, 9 and 11 (``dasc_runtime.startup_checks``), and the one
option served instead, ``--mamba-max-states-per-path``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.support.runtime_fixtures import SGLANG_SKIP_REASON, compile_tiny

ROOT = Path(__file__).resolve().parents[2]      # the repository root: the probe runs as tests.support.<name>

pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")]

PREFIX = "dasc: refusing to start: unsupported option(s): "


# ---------------------------------------------------------------- item 11: options

@pytest.mark.parametrize("field,value,line", [
    ("mamba_radix_cache_strategy", "extra_buffer_lazy",
     "--mamba-radix-cache-strategy extra_buffer_lazy (use extra_buffer, what SGLang's auto picks for these models, "
     "or no_buffer with --disable-overlap-schedule)"),
    ("enable_mixed_chunk", True, "--enable-mixed-chunk (drop it)"),
    ("enable_dp_attention", True, "DP attention (--enable-dp-attention / --attn-dp-size > 1: not supported)"),
    ("enable_lmcache", True, "--enable-lmcache / --enable-flexkv / --enable-unified-cache-external-linker (external "
     "stores offload Mamba states by native slot id; a compressed checkpoint has none)"),
    ("enable_unified_cache_external_linker", True, "--enable-lmcache / --enable-flexkv / "
     "--enable-unified-cache-external-linker (external stores offload Mamba states by native slot id; a compressed "
     "checkpoint has none)"),
    ("attn_dp_size", 2, "DP attention (--enable-dp-attention / --attn-dp-size > 1: not supported)"),
    ("enable_memory_saver", True,
     "--enable-memory-saver (the dasc pool lies outside the memory it releases and restores)"),
    ("device", "npu", "--device npu (the dasc pool and its Triton kernels run on CUDA GPUs: leave --device unset or "
     "pass cuda)"),
    ("device", "xpu:1", "--device xpu:1 (the dasc pool and its Triton kernels run on CUDA GPUs: leave --device unset "
     "or pass cuda)"),
])
def test_each_unserved_option_is_refused_with_one_line(field, value, line):
    from dasc_runtime.verify import check_server_args
    from dasc_runtime.verify import DascRefusal

    with pytest.raises(DascRefusal) as info:
        check_server_args(SimpleNamespace(**{field: value}))
    assert str(info.value) == PREFIX + line and "\n" not in str(info.value)


def test_sglang_defaults_and_served_strategies_start():
    from sglang.srt.server_args import ServerArgs

    from dasc_runtime.verify import check_server_args

    check_server_args(ServerArgs(model_path="dummy", page_size=1))
    for strategy in ("extra_buffer", "no_buffer", "auto"):     # no_buffer only without overlap, as SGLang asserts
        check_server_args(SimpleNamespace(mamba_radix_cache_strategy=strategy, mamba_max_states_per_path=2,
                                          disable_overlap_schedule=strategy == "no_buffer"))


def test_several_unserved_options_are_named_in_one_line():
    from dasc_runtime.verify import check_server_args
    from dasc_runtime.verify import DascRefusal

    with pytest.raises(DascRefusal, match=r"--enable-mixed-chunk \(drop it\); --enable-memory-saver"):
        check_server_args(SimpleNamespace(enable_mixed_chunk=True, enable_memory_saver=True))


# ---------------------------------------------------------------- item 9: storage balancing x overlap

def test_storage_plan_at_tp2_needs_overlap_scheduling_off(tmp_path):
    from dasc_runtime.verify import check_server_args
    from dasc_runtime.verify import DascRefusal

    storage2, _, _ = compile_tiny(tmp_path, tp_size=2, balance="storage")
    off2, _, _ = compile_tiny(tmp_path, tp_size=2, balance="off")
    storage1, _, _ = compile_tiny(tmp_path, balance="storage")
    overlap = SimpleNamespace(disable_overlap_schedule=False)
    no_overlap = SimpleNamespace(disable_overlap_schedule=True)
    with pytest.raises(DascRefusal, match="storage-balanced plan at TP 2 with overlap scheduling .*"
                                          "add --disable-overlap-schedule, or recompile with --balance off"):
        check_server_args(overlap, storage2)
    check_server_args(no_overlap, storage2)
    check_server_args(overlap, off2)          # no all-to-all
    check_server_args(overlap, storage1)      # TP 1: a storage map that moves nothing


# ---------------------------------------------------------------- item 7: hooks and the component

@pytest.fixture
def probe_module(monkeypatch):
    """A throw-away module and class as hook targets, and a clean HookRegistry (restored after)."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    mod = types.ModuleType("dasc_hook_probe")

    def f(x):
        return x + 1

    class K:
        @classmethod
        def c(cls, x):
            return x * 2

    mod.f, mod.K = f, K
    monkeypatch.setitem(sys.modules, "dasc_hook_probe", mod)
    monkeypatch.setattr(HookRegistry, "_hooks", type(HookRegistry._hooks)(list))
    monkeypatch.setattr(HookRegistry, "_patched", set())
    return mod


def test_hook_problems_finds_unpatched_failed_and_replaced_targets(probe_module):
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from dasc_runtime.startup_checks import check_hooks, hook_problems
    from dasc_runtime.verify import DascRefusal

    def after_f(result, x):
        return result * 10

    def around_c(original, cls, x):
        return original(cls, x) + 100

    def after_missing(result):
        return result

    hooks = [("dasc_hook_probe.f", after_f, "AFTER"), ("dasc_hook_probe.K.c", around_c, "AROUND"),
             ("dasc_hook_probe.missing", after_missing, "AFTER")]
    assert len(hook_problems(hooks)) == 3                    # registered nowhere yet
    for target, fn, kind in hooks:
        HookRegistry.register(target, fn, getattr(HookType, kind))
    HookRegistry.apply_hooks()                               # the missing target only logs an error
    assert probe_module.f(1) == 20 and probe_module.K.c(1) == 102
    assert hook_problems(hooks) == ["dasc_hook_probe.missing (not patched: SGLang's HookRegistry logged the error)"]
    check_hooks(hooks[:2])
    original = probe_module.f.__wrapped__
    probe_module.f = original                                # something rebinds the target behind our back
    assert hook_problems(hooks[:2]) == ["dasc_hook_probe.f (patched, then replaced: dasc's hook is no longer called)"]
    with pytest.raises(DascRefusal, match=r"^dasc: refusing to start: 1 of dasc's 2 SGLang hooks not in place: "
                                          r"dasc_hook_probe\.f \(patched, then replaced"):
        check_hooks(hooks[:2])


def test_every_hook_target_exists_in_this_sglang():
    from dasc_runtime.plugin import hooks
    from dasc_runtime.sglang_api import api
    from dasc_runtime.startup_checks import _resolve
    from dasc_runtime.weight_updates import update_targets

    missing = [t for t, _, _ in hooks() if _resolve(t) is None]
    assert not missing, missing
    targets = [t for t, _, _ in hooks()]
    first_engine = api().FIRST_ENGINE_TARGET is not None           # 0.5.23: the first Engine's launch
    assert len(targets) == len(set(targets)) == 14 + len(api().WEIGHT_UPDATE_METHODS) + first_engine
    assert api().CACHE_FACTORY_TARGET in targets and api().ENGINE_KWARGS_TARGET in targets
    assert "sglang.srt.mem_cache.kv_cache_builder.build_kv_cache" in targets
    assert set(update_targets(api())) <= set(targets) and len(update_targets(api())) >= 4


def test_a_valid_launch_on_a_machine_without_a_gpu_stops_in_one_line_after_every_other_refusal(tmp_path,
                                                                                              monkeypatch):
    """A valid plan launched on a CPU machine got past the launcher and stopped in SGLang's device detection with a
    traceback ("No accelerator ... is available"). The launch now refuses it in one line, naming the variable that
    can hide the cards; on a GPU machine the same launch passes; an option refusal still comes first, so flags can
    be checked anywhere."""
    from dasc_compile.schema import DascInputError
    from dasc_runtime import launcher, startup_checks
    from tests.support.runtime_fixtures import as_on_a_gpu_machine

    _, plan_dir, _ = compile_tiny(tmp_path)
    monkeypatch.setattr("os.environ", {k: v for k, v in os.environ.items()
                                       if not k.startswith("DASC_") and k != "CUDA_VISIBLE_DEVICES"})
    opts = SimpleNamespace(model_path="m")

    def launch(**extra):
        return launcher.settle({"plan": str(plan_dir)}, launcher._KWARG_NAMES, SimpleNamespace(**vars(opts), **extra))

    as_on_a_gpu_machine(False)
    line = ("dasc: refusing to start: no CUDA GPU is visible to this process: the dasc pool and its Triton kernels run on CUDA GPUs; on a "
            "machine without one, check the plan and its server flags with `dasc size PLAN --max-running-requests R "
            "--budget BYTES`")
    with pytest.raises(DascInputError) as info:
        launch()
    assert str(info.value) == line
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    with pytest.raises(DascInputError) as info:
        launch()
    assert str(info.value) == line.replace("process:", "process (CUDA_VISIBLE_DEVICES=''):")
    with pytest.raises(DascInputError, match=r"^dasc: refusing to start: unsupported option\(s\): --enable-mixed-chunk"):
        launch(enable_mixed_chunk=True)
    assert "DASC_PLAN" not in os.environ                              # a refused launch exports nothing
    as_on_a_gpu_machine(True)
    assert launch().plan == str(plan_dir) and os.environ["DASC_PLAN"] == str(plan_dir)  # a GPU machine serves it


def test_check_component_refuses_sglangs_own_component_and_a_missing_pool(tmp_path):
    from tests.support.runtime_sim import Sim

    from dasc_runtime.startup_checks import check_component
    from dasc_runtime.verify import DascRefusal

    sim = Sim(tmp_path, streams=False)
    check_component(sim.cache, sim.dpool)
    with pytest.raises(DascRefusal, match="drives another pool"):
        check_component(sim.cache, object())
    with pytest.raises(DascRefusal, match="no dasc pool"):
        check_component(sim.cache, None)
    with pytest.raises(DascRefusal, match="drives the Mamba state with NoneType, not dasc's two-tier component"):
        check_component(SimpleNamespace(components={}), sim.dpool)


def test_real_plugin_loading_refuses_a_hook_that_failed_or_was_replaced(tmp_path):
    """SGLang's own load_plugins() in a fresh process (tests/support/startup_probe.py)."""
    _, plan_dir, _ = compile_tiny(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASC_")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-m", "tests.support.startup_probe", str(plan_dir)], capture_output=True,
                          text=True, env=env, timeout=600, cwd=ROOT)
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and line, f"probe failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    out = json.loads(line[-1][len("RESULT "):])
    from dasc_runtime.plugin import hooks as dasc_hooks
    from dasc_runtime.sglang_api import api

    target = api().CACHE_FACTORY_TARGET
    hooks = f"DascRefusal: dasc: refusing to start: 1 of dasc's {len(dasc_hooks())} SGLang hooks not in place: " + target
    assert out["registry_patched"] is False
    assert out["failed_patch"].startswith(hooks + " (not patched: SGLang's HookRegistry logged the error)")
    assert out["patched"] == "started"
    # rebound to SGLang's original: its own MambaComponent would drive the dasc pool as an INT8 pool
    assert out["plain_component"] == "MambaComponent"
    assert out["replaced"].startswith(hooks + " (patched, then replaced")
    assert out["replaced_pool"].startswith(hooks + " (patched, then replaced")
    assert out["plain_component_check"].startswith(
        "DascRefusal: dasc: refusing to start: SGLang's UnifiedRadixCache drives the Mamba state with "
        "MambaComponent, not dasc's two-tier component")
    assert out["mixed_chunk"] == "DascRefusal: " + PREFIX + "--enable-mixed-chunk (drop it)"


# ---------------------------------------------------------------- item 11: --mamba-max-states-per-path is served

def test_path_cap_evicts_interior_states_of_both_tiers(tmp_path):
    """SGLang's path cap (``_evict_excess_path_states``) drives dasc's evict_component: a compressed
    interior state frees its compressed slot, a dense one its native slot; the invariants hold."""
    from tests.support.runtime_sim import Sim

    torch.set_num_threads(1)
    sim = Sim(tmp_path, streams=False, compressed_slots=1, mamba_size=8, watermark=0, max_states_per_path=2)

    def run(seq):
        sim.rng.choice = lambda xs, _s=seq: _s
        sim.admit(k=1)
        sim.rng.randrange = lambda k: k - 1
        sim.finish()
        sim.check(0, content=True)

    a = [11, 12, 13]
    b = sim.request_tokens(a) + [14, 15]
    c = sim.request_tokens(b) + [16]
    d = sim.request_tokens(c) + [17, 18]
    run(a)                                          # compressed (the only compressed slot)
    run(b)                                          # dense
    assert sim.comp.book.counts() == {"dense": 1, "compressed": 1}
    run(c)                                          # 3 states on the path: the shallowest (a, compressed) goes
    assert sim.comp.counters.evictions_compressed == 1 and sim.dpool.available_size() == 1
    run(d)                                          # d takes the freed compressed slot; b (dense) goes
    assert sim.comp.counters.evictions_dense == 1
    held = [(len(sim.prefix_tokens(n)), sim.comp.tier(n)) for n in sim.nodes()
            if n.component_data[sim.MAMBA].value is not None]
    assert sorted(held) == [(len(sim.request_tokens(c)), "dense"), (len(sim.request_tokens(d)), "compressed")]
