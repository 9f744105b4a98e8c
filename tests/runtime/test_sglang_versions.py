"""The installed SGLang picks its adapter; an untested release is refused at start-up in one line (issue 21)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support.runtime_fixtures import SGLANG_SKIP_REASON, compile_tiny

pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")]


def test_the_installed_release_is_tested_and_picks_its_adapter():
    import sglang

    from dasc_runtime.sglang_api import TESTED, adapter_for, api, installed_version

    assert installed_version() == sglang.__version__ in TESTED
    assert api() is adapter_for(sglang.__version__) and api().VERSION == sglang.__version__
    assert TESTED == ("0.5.17", "0.5.23")


@pytest.mark.parametrize("version", ["0.5.16", "0.5.20", "0.5.23.post1", "0.6.0", "unknown"])
def test_an_untested_release_is_refused_in_one_line(version):
    from dasc_runtime.sglang_api import adapter_for, check_version
    from dasc_runtime.verify import DascRefusal

    assert adapter_for(version) is None
    with pytest.raises(DascRefusal) as info:
        check_version(version)
    msg = str(info.value)
    assert msg == (f"dasc: refusing to start: sglang {version} is installed; the dasc runtime is tested with sglang "
                   f"0.5.17 and 0.5.23 (supported range 0.5.17-0.5.23; the releases between are not tested): "
                   f"install sglang==0.5.23 or sglang==0.5.17")
    assert "\n" not in msg


def test_an_untested_release_gets_only_the_flag_hooks_and_refuses_at_model_load(tmp_path, monkeypatch):
    """``register()`` on an untested SGLang: the ``--dasc-*`` flags stay (no argparse error), no cache hook is
    applied, and the first process that loads a model with a plan refuses, naming the tested range."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from dasc_runtime import plugin, sglang_api
    from dasc_runtime.verify import DascRefusal

    registered = []
    monkeypatch.setattr(HookRegistry, "register", classmethod(lambda cls, t, fn, kind: registered.append((t, fn))))
    monkeypatch.setattr(sglang_api, "installed_version", lambda: "0.5.20")
    plugin.register()
    assert sorted(fn.__name__ for _, fn in registered) == ["add_cli_args", "after_load_model", "engine_kwargs_init",
                                                           "from_cli_args"]
    assert ("sglang.srt.entrypoints.engine.Engine.__init__", plugin.engine_kwargs_init) in registered
    _, plan_dir, _ = compile_tiny(tmp_path)
    monkeypatch.setenv("DASC_PLAN", str(plan_dir))
    with pytest.raises(DascRefusal, match=r"^dasc: refusing to start: sglang 0\.5\.20 is installed; .*0\.5\.17 and "
                                          r"0\.5\.23"):
        plugin.after_load_model(None, SimpleNamespace(is_draft_worker=False))
    # Engine(dasc_plan=...) on an untested release: refused before SGLang sees the keyword
    monkeypatch.setattr(sglang_api, "_API", [None])
    with pytest.raises(DascRefusal, match="sglang 0.5.20 is installed"):
        plugin.engine_kwargs_init(lambda self, **kw: None, SimpleNamespace(), dasc_plan=str(plan_dir))
    # without a plan the keyword hook passes straight through
    seen = []
    plugin.engine_kwargs_init(lambda self, **kw: seen.append(kw), SimpleNamespace(), model_path="m")
    assert seen == [{"model_path": "m"}]


def test_every_server_option_dasc_reads_exists_in_this_release():
    """A renamed option would read as its default and silently skip a refusal: every name
    ``serving_rules`` (what ``verify.check_server_args`` applies) and the adapter read must be a field of the
    installed ``ServerArgs``."""
    import inspect
    import re

    from sglang.srt.server_args import ServerArgs

    from dasc_runtime import serving_rules, wr_scratch
    from dasc_runtime.sglang_api import api
    from tests.support.sglang_steps import steps

    rules = inspect.getsource(serving_rules)        # the start-up checks read options through these rules
    read = set(re.findall(r'\bg\("([a-z_]+)"', rules)) | set(re.findall(r'_option\("[a-z_]+", "([a-z_]+)"', rules))
    read |= set(re.findall(r'(?:option|server_option)\((?:sa|server_args)?,?\s*"([a-z_]+)"',
                           inspect.getsource(wr_scratch) + inspect.getsource(api())))
    assert {"disable_radix_cache", "enable_hierarchical_cache", "enable_mixed_chunk", "chunked_prefill_size",
            "page_size", "enable_dp_attention"} <= read
    sa = ServerArgs(model_path="dummy")
    missing = sorted(n for n in read - steps().ABSENT_OPTIONS if not hasattr(sa, n))
    assert not missing, f"server options dasc reads that this SGLang does not have: {missing}"


@pytest.mark.parametrize("flags, env, needle", [
    (dict(pool_slots=-1), {}, "--dasc-pool-slots: expected a non-negative integer, got -1"),
    (dict(refresh_slots=-2), {}, "--dasc-refresh-slots: expected a non-negative integer, got -2"),
    (dict(pool_slots=5, pool_bytes=100), {}, "--dasc-pool-slots and --dasc-pool-bytes are exclusive"),
    ({}, {"DASC_RECLAIM_WAIT": "bogus"}, "DASC_RECLAIM_WAIT"),
])
def test_a_bad_dasc_flag_in_the_launcher_is_one_line_and_status_2(tmp_path, monkeypatch, capsys, flags, env, needle):
    """`python -m sglang.launch_server ... --dasc-pool-slots -1` ended in a 25-line traceback naming the field
    'pool_slots': the launcher's from_cli_args hook runs where no scheduler frame makes a refusal one line."""
    from argparse import Namespace

    from dasc_runtime import plugin

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    _, plan_dir, _ = compile_tiny(tmp_path)
    args = Namespace(**{"dasc_" + field: None for _, field, _ in plugin._FLAGS})
    args.dasc_plan = str(plan_dir)
    for k, v in flags.items():
        setattr(args, "dasc_" + k, v)
    with pytest.raises(SystemExit) as info:
        plugin.from_cli_args(SimpleNamespace(), None, args)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and err[0].startswith("dasc: refusing to start: ")
    assert needle in err[0], err


@pytest.mark.parametrize("case", ["missing", "damaged", "hybrid", "other-model"])
def test_the_launcher_refuses_a_plan_it_cannot_serve_before_weights_load(tmp_path, capsys, case):
    """A missing --dasc-plan was found only by the scheduler, after the model had loaded (session 32): the launcher
    now reads the plan and refuses it in one line, status 2, with one prefix (a DascRefusal carries its own)."""
    from argparse import Namespace

    from dasc_runtime import plugin
    from dasc_runtime.installed import INSTALLED

    INSTALLED.plan = INSTALLED.plan_dir = None
    if case == "missing":
        plan_dir, needle = tmp_path / "no-such-plan", "no-such-plan"
    elif case == "damaged":
        _, plan_dir, _ = compile_tiny(tmp_path)
        (plan_dir / "plan.json").write_text("{")
        needle = "plan.json"
    elif case == "hybrid":
        _, plan_dir, _ = compile_tiny(tmp_path, tp_size=2, balance="hybrid")
        needle = "balance=hybrid"
    else:                            # a GDN plan, a Kimi-Linear model directory: config.json says so before loading
        _, plan_dir, _ = compile_tiny(tmp_path)
        model = tmp_path / "kimi"
        model.mkdir()
        (model / "config.json").write_text('{"model_type": "kimi_linear"}')
        needle = f"model type: plan is for 'qwen3_next', {model}/config.json says 'kimi_linear'"
    args = Namespace(**{"dasc_" + field: None for _, field, _ in plugin._FLAGS})
    args.dasc_plan = str(plan_dir)
    served = SimpleNamespace(model_path=str(tmp_path / "kimi")) if case == "other-model" else SimpleNamespace()
    with pytest.raises(SystemExit) as info:
        plugin.from_cli_args(served, None, args)
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("dasc: refusing to start: ") and err[0].count("refusing to start") == 1, err
    assert needle in err[0], err


@pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")
def test_an_engine_with_a_plan_it_cannot_serve_is_refused_before_it_starts_and_exports_nothing(tmp_path, monkeypatch):
    """Engine(dasc_plan=...) checks the plan as the launcher does, before the constructor (which may start the
    schedulers) runs, and a refused plan is not left in DASC_PLAN for the next Engine of the process."""
    from dasc_compile.schema import DascInputError
    from dasc_runtime import plugin

    monkeypatch.setattr("os.environ", {k: v for k, v in __import__("os").environ.items() if not k.startswith("DASC_")})
    started = []
    with pytest.raises(DascInputError, match="no-such-plan"):
        plugin.engine_kwargs_init(lambda self, **kw: started.append(kw), object(), model_path="m",
                                  dasc_plan=str(tmp_path / "no-such-plan"))
    import os

    assert started == [] and "DASC_PLAN" not in os.environ


def test_mamba_usage_counts_the_slots_sglang_allocates_not_dasc_wr_scratch(monkeypatch):
    """Under dasc-wr the Mamba pool holds M + B slots and its allocator M (hide_scratch_rows): the usage SGLang
    reports is over M. 3 used of M = 8 (B = 2 hidden): 3 and 3/8, not 5 and 5/10."""
    from dasc_runtime import plugin
    from dasc_runtime.installed import INSTALLED

    book = SimpleNamespace(dense_evictable=lambda: 1)
    monkeypatch.setattr(INSTALLED, "component", SimpleNamespace(book=book))
    pool = SimpleNamespace(mamba_pool=SimpleNamespace(size=10), mamba_allocator=SimpleNamespace(size=8))
    stats = SimpleNamespace(mamba_available_size=4, mamba_evictable_size=0, mamba_num_used=0, mamba_usage=0.0)
    out = plugin.after_mamba_token_info(stats, SimpleNamespace(req_to_token_pool=pool))
    assert (out.mamba_evictable_size, out.mamba_num_used, out.mamba_usage) == (1, 3, 3 / 8)


def test_sglang_s_parser_refuses_a_plan_it_cannot_serve_while_it_reads_the_flags(tmp_path, capsys):
    """SGLang 0.5.17 runs its own ServerArgs checks before the from_cli_args hook, so on a machine where those fail a
    missing plan was never named (a fresh user, session 33): --dasc-plan is checked by argparse itself, first."""
    import argparse

    from dasc_runtime.plugin import add_cli_args

    parser = argparse.ArgumentParser(prog="launch_server")
    add_cli_args(None, parser)
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--dasc-plan", str(tmp_path / "no-such-plan")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert info.value.code == 2 and err.startswith("launch_server: error: argument --dasc-plan: "), err
    assert "no-such-plan" in err and "refusing to start" not in err
    _, plan_dir, _ = compile_tiny(tmp_path)
    assert parser.parse_args(["--dasc-plan", str(plan_dir)]).dasc_plan == str(plan_dir)
