"""The installed SGLang picks its adapter; an untested release is refused at start-up in one line (issue 21)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dasc_compile.schema.units import byte_count, flag_bytes
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
    # Engine(...) with the plan only in DASC_PLAN: refused the same way, before the constructor runs
    seen = []
    with pytest.raises(DascRefusal, match="sglang 0.5.20 is installed"):
        plugin.engine_kwargs_init(lambda self, **kw: seen.append(kw), SimpleNamespace(), model_path="m")
    assert seen == []
    # without a plan the keyword hook passes straight through
    monkeypatch.delenv("DASC_PLAN")
    plugin.engine_kwargs_init(lambda self, **kw: seen.append(kw), SimpleNamespace(), model_path="m")
    assert seen == [{"model_path": "m"}]


def test_every_server_option_dasc_reads_exists_in_this_release():
    """A renamed option would read as its default and silently skip a refusal: every name
    ``serving_rules`` (what ``verify.check_server_args`` applies) and the adapter read must be a field of the
    installed ``ServerArgs``."""
    import inspect
    import re

    from sglang.srt.server_args import ServerArgs

    from dasc_runtime import serving_rules, startup_checks, weight_updates, wr_scratch
    from dasc_runtime.sglang_api import api
    from tests.support.sglang_steps import steps

    rules = inspect.getsource(serving_rules)        # the start-up checks read options through these rules
    read = set(re.findall(r'\bg\("([a-z_]+)"', rules)) | set(re.findall(r'_option\("[a-z_]+", "([a-z_]+)"', rules))
    read |= set(re.findall(r'(?:option|server_option)\((?:sa|server_args)?,?\s*"([a-z_]+)"',
                           inspect.getsource(wr_scratch) + inspect.getsource(weight_updates) + inspect.getsource(api())))
    read |= set(re.findall(r'getattr\(options, "([a-z_]+)"', inspect.getsource(startup_checks)))
    assert {"disable_radix_cache", "enable_hierarchical_cache", "enable_mixed_chunk", "chunked_prefill_size",
            "page_size", "enable_dp_attention", "load_format", "weight_cache_mode"} <= read
    sa = ServerArgs(model_path="dummy")
    missing = sorted(n for n in read - steps().ABSENT_OPTIONS if not hasattr(sa, n))
    assert not missing, f"server options dasc reads that this SGLang does not have: {missing}"


def _launch(args, monkeypatch, capsys, **env):
    """The launcher's ``from_cli_args`` hook on the parsed ``args`` (SGLang's builder must not run when dasc
    refuses): ``(exit status or None, stderr lines, result, DASC_* exported)``; the environment holds only ``env``."""
    import os

    from dasc_runtime import launcher

    monkeypatch.setattr("os.environ", {**{k: v for k, v in os.environ.items() if not k.startswith("DASC_")}, **env})
    built = []
    try:
        result = launcher.from_cli_args(lambda cls, a: built.append(a) or SimpleNamespace(), None, args)
        code = None
    except SystemExit as exc:
        result, code = None, exc.code
    assert (code is None) == bool(built), "SGLang built its ServerArgs before dasc refused"
    exported = {k: v for k, v in os.environ.items() if k.startswith("DASC_")}
    return code, capsys.readouterr().err.splitlines(), result, exported


def _args(plan_dir=None, **flags):
    """The argparse namespace of the ``--dasc-*`` flags (``launcher.FLAGS``) plus SGLang options as given."""
    from argparse import Namespace

    from dasc_runtime.launcher import FLAGS

    args = Namespace(**{"dasc_" + field: kw["default"] for _, field, kw in FLAGS})
    args.dasc_plan = None if plan_dir is None else str(plan_dir)
    for k, v in flags.items():
        setattr(args, k if k in ("model_path", "tp_size", "disable_radix_cache") else "dasc_" + k, v)
    return args


@pytest.mark.parametrize("flags, env, line", [
    (dict(pool_slots=-1), {}, "--dasc-pool-slots: expected an integer >= 1 (the compressed pool needs at least 1 "
                              "usable slot), got -1"),
    (dict(pool_slots=0), {}, "--dasc-pool-slots: expected an integer >= 1 (the compressed pool needs at least 1 "
                             "usable slot), got 0"),
    (dict(pool_slots="abc"), {}, "--dasc-pool-slots: expected an integer, got 'abc'"),
    (dict(refresh_slots=-2), {}, "--dasc-refresh-slots: expected a non-negative integer, got -2"),
    (dict(pool_slots=5, pool_bytes=100), {}, "--dasc-pool-slots and --dasc-pool-bytes are exclusive: size the pool "
                                             "one way"),
    ({}, {"DASC_RECLAIM_WAIT": "bogus"}, "DASC_RECLAIM_WAIT: expected 'stream' or 'host', got 'bogus'"),
    # the variables are read beside a --dasc-plan flag (they were silently ignored), and checked under a flag
    ({}, {"DASC_REFRESH_SLOTS": "abc"}, "DASC_REFRESH_SLOTS: expected an integer, got 'abc'"),
    (dict(refresh_slots=2), {"DASC_REFRESH_SLOTS": "abc"}, "DASC_REFRESH_SLOTS: expected an integer, got 'abc'"),
    ({}, {"DASC_COMPRESSED_ONLY": "2"}, "DASC_COMPRESSED_ONLY: expected 1 / true / yes / on or 0 / false / no / off, "
                                        "got '2'"),
    ({}, {"DASC_POOL_SLOTS": "0"}, "DASC_POOL_SLOTS: expected an integer >= 1 (the compressed pool needs at least 1 "
                                   "usable slot), got 0"),
    (dict(pool_slots=5), {"DASC_POOL_BYTES": "100"}, "--dasc-pool-slots and DASC_POOL_BYTES are exclusive: size the "
                                                     "pool one way"),
    (dict(pool_bytes=1), {}, "--dasc-pool-bytes 1 byte holds no usable slot: a slot takes {bc} and slot 0 is "
                             "reserved; give at least {b2}"),
    ({}, {"DASC_POOL_BYTES": "1"}, "DASC_POOL_BYTES 1 byte holds no usable slot: a slot takes {bc} and slot 0 is "
                                   "reserved; give at least {b2}"),
    # a size is read as `dasc size --budget` reads it (it took integers only): units work, and so do their refusals
    (dict(pool_bytes="1KiB"), {}, "--dasc-pool-bytes 1.00 KiB (1,024 bytes) holds no usable slot: a slot takes {bc} "
                                  "and slot 0 is reserved; give at least {b2}"),
    (dict(pool_bytes="2 parsecs"), {}, "--dasc-pool-bytes: expected a positive size in bytes, such as 2147483648, 1e9 "
                                       "or 2GiB (units B, KB, MB, GB, TB, PB or KiB, MiB, GiB, TiB, PiB), got "
                                       "'2 parsecs'"),
    ({}, {"DASC_POOL_BYTES": "0"}, "DASC_POOL_BYTES: expected a size >= 1 byte and <= 2**50 bytes (1 PiB), got '0'"),
    ({}, {"DASC_POOL_BYTES": "1e-3"}, "DASC_POOL_BYTES: expected a size >= 1 byte and <= 2**50 bytes (1 PiB), got '1e-3'"),
])
def test_a_bad_dasc_setting_in_the_launcher_is_one_line_and_status_2(tmp_path, monkeypatch, capsys, flags, env, line):
    """`python -m sglang.launch_server ... --dasc-pool-slots -1` ended in a 25-line traceback naming the field
    'pool_slots'; `--dasc-pool-slots 0` passed until the pool was built, and every DASC_* variable was skipped once
    --dasc-plan was given. The launcher's hook refuses each in one line, status 2, before SGLang builds its options,
    and exports nothing."""
    plan, plan_dir, _ = compile_tiny(tmp_path)
    b = plan.tp.bottleneck_bytes_per_slot
    code, err, _, exported = _launch(_args(plan_dir, **flags), monkeypatch, capsys, **env)
    assert code == 2 and err == ["dasc: refusing to start: " + line.format(bc=byte_count(b), b2=flag_bytes(2 * b))], err
    assert exported == env


@pytest.mark.parametrize("via", ["--dasc-plan", "DASC_PLAN"])
@pytest.mark.parametrize("case", ["missing", "damaged", "stale-hash", "checkpoint", "hybrid", "other-model"])
def test_the_launcher_refuses_a_plan_it_cannot_serve_before_weights_load(tmp_path, monkeypatch, capsys, case, via):
    """A missing --dasc-plan was found only by the scheduler, after the model had loaded (session 32), and a plan
    given only as DASC_PLAN still was: the launcher reads the plan from either and refuses it in one line naming
    where it came from, status 2, with one prefix (a DascRefusal carries its own)."""
    import json

    from dasc_runtime.installed import INSTALLED

    INSTALLED.plan = INSTALLED.plan_dir = None
    model = None
    if case == "missing":
        plan_dir = tmp_path / "no-such-plan"
        line = f"{via}: {plan_dir}: dasc plan not found (pass the plan directory or its plan.json)"
    elif case == "damaged":
        _, plan_dir, _ = compile_tiny(tmp_path)
        (plan_dir / "plan.json").write_text("{")
        line = f"{via}: {plan_dir}/plan.json: "
    elif case == "stale-hash":                 # hand-edited: valid JSON, content no longer what was hashed
        _, plan_dir, _ = compile_tiny(tmp_path)
        doc = json.loads((plan_dir / "plan.json").read_text())
        doc["policy"]["w_max"] = 32
        (plan_dir / "plan.json").write_text(json.dumps(doc))
        line = f"{via}: {plan_dir}/plan.json: content_hash does not match the plan's content"
    elif case == "checkpoint":
        _, _, plan_dir = compile_tiny(tmp_path)
        line = f"{via}: {plan_dir}: a model checkpoint, not a dasc plan; compile one first"
    elif case == "hybrid":
        _, plan_dir, _ = compile_tiny(tmp_path, tp_size=2, balance="hybrid")
        line = ("the plan uses balance=hybrid (compute-head permutation of the loaded weights), which this runtime "
                "does not apply yet; recompile with --balance storage or off")
    else:                            # a GDN plan, a Kimi-Linear model directory: config.json says so before loading
        _, plan_dir, _ = compile_tiny(tmp_path)
        model = tmp_path / "kimi"
        model.mkdir()
        (model / "config.json").write_text('{"model_type": "kimi_linear"}')
        line = f"model type: plan is for 'qwen3_next', {model}/config.json says 'kimi_linear'"
    flags = {} if model is None else {"model_path": str(model)}
    args = _args(plan_dir if via == "--dasc-plan" else None, **flags)
    env = {} if via == "--dasc-plan" else {"DASC_PLAN": str(plan_dir)}
    code, err, _, _ = _launch(args, monkeypatch, capsys, **env)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("dasc: refusing to start: " + line) and err[0].count("refusing to start") == 1, err


@pytest.mark.parametrize("flags, env, line", [
    (dict(pool_slots=-5), {}, "--dasc-pool-slots needs --dasc-plan (or DASC_PLAN)"),
    (dict(plan="", pool_slots=3), {}, "--dasc-pool-slots needs --dasc-plan (or DASC_PLAN)"),
    (dict(compressed_only=True, refresh_slots=2), {"DASC_POOL_SLOTS": "3"},
     "--dasc-compressed-only and --dasc-refresh-slots and DASC_POOL_SLOTS need --dasc-plan (or DASC_PLAN)"),
    ({}, {"DASC_DEMOTE_WATERMARK": "4"}, "DASC_DEMOTE_WATERMARK needs --dasc-plan (or DASC_PLAN)"),
])
def test_a_dasc_setting_without_a_plan_is_refused_not_ignored(monkeypatch, capsys, flags, env, line):
    """`--dasc-pool-slots -5` without any plan started a plain SGLang server, the flag silently ignored."""
    plan = flags.pop("plan", None)
    args = _args(**flags)
    args.dasc_plan = plan
    code, err, _, exported = _launch(args, monkeypatch, capsys, **env)
    assert code == 2 and err == ["dasc: refusing to start: " + line] and exported == env


def test_a_launch_without_dasc_is_untouched(monkeypatch, capsys):
    """No plan and no dasc setting (a "no" word is none): SGLang's options pass through, nothing recorded."""
    from dasc_runtime.side_channels import settings_of

    for env in ({}, {"DASC_COMPRESSED_ONLY": "0", "DASC_PLAN": ""}):
        code, err, result, exported = _launch(_args(), monkeypatch, capsys, **env)
        assert code is None and err == [] and settings_of(result) is None and exported == env


@pytest.mark.parametrize("via", ["--dasc-plan", "DASC_PLAN"])
def test_the_launcher_refuses_options_the_plan_cannot_serve_before_weights_load(tmp_path, monkeypatch, capsys, via):
    """--disable-radix-cache, or a TP-2 plan launched at TP 1, passed the launcher and were refused after the model
    had loaded: the serving rules run in the launcher on the options as given (the scheduler checks them again)."""
    _, plan_dir, _ = compile_tiny(tmp_path, tp_size=2)
    args = _args(plan_dir if via == "--dasc-plan" else None, tp_size=1, disable_radix_cache=True)
    env = {} if via == "--dasc-plan" else {"DASC_PLAN": str(plan_dir)}
    code, err, _, _ = _launch(args, monkeypatch, capsys, **env)
    assert code == 2 and err == [
        "dasc: refusing to start: unsupported option(s): --disable-radix-cache (dasc compresses radix-cached state "
        "checkpoints); --tp-size 1 (attention TP size 1; the plan is compiled for TP 2: launch with --tp-size 2, or "
        "compile the plan with --tp 1)"], err


def test_a_flag_wins_over_its_variable_and_the_variables_fill_the_rest(tmp_path, monkeypatch, capsys):
    """With --dasc-plan given, DASC_POOL_SLOTS / DASC_COMPRESSED_ONLY were silently dropped (current_settings read the
    server args' attribute alone): now a flag wins over its variable, the variables apply where no flag is given,
    and what is recorded and exported for the schedulers is that resolution."""
    from dasc_runtime.settings import current_settings
    from dasc_runtime.side_channels import settings_of

    _, plan_dir, _ = compile_tiny(tmp_path)
    p = str(plan_dir)
    env = {"DASC_POOL_SLOTS": "7", "DASC_COMPRESSED_ONLY": "yes", "DASC_REFRESH_SLOTS": ""}
    code, err, result, exported = _launch(_args(plan_dir), monkeypatch, capsys, **env)
    assert code is None and err == []
    assert settings_of(result) == {"plan": p, "pool_slots": 7, "compressed_only": True, "dummy_decay_ok": False}
    assert exported == {**env, "DASC_PLAN": p, "DASC_COMPRESSED_ONLY": "1"}
    code, err, result, exported = _launch(_args(plan_dir, pool_slots=5), monkeypatch, capsys, **env)
    assert settings_of(result)["pool_slots"] == 5 and exported["DASC_POOL_SLOTS"] == "5"
    # a plan from DASC_PLAN alone, a flag beside it
    code, err, result, exported = _launch(_args(demote_watermark=3), monkeypatch, capsys, DASC_PLAN=p)
    assert code is None and settings_of(result) == {"plan": p, "compressed_only": False, "demote_watermark": 3,
                                                    "dummy_decay_ok": False}
    # a scheduler: the recorded values win per field, the environment fills the rest (and is checked)
    sa = SimpleNamespace(_dasc_settings={"plan": "/p", "pool_slots": 7})
    monkeypatch.setattr("os.environ", {"DASC_POOL_SLOTS": "9", "DASC_DEMOTE_WATERMARK": "2"})
    s = current_settings(sa)
    assert (s.plan, s.pool_slots, s.demote_watermark) == ("/p", 7, 2)
    monkeypatch.setattr("os.environ", {"DASC_REFRESH_SLOTS": "abc"})
    from dasc_compile.schema import DascInputError

    with pytest.raises(DascInputError, match=r"^DASC_REFRESH_SLOTS: expected an integer, got 'abc'$"):
        current_settings(sa)


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


@pytest.mark.parametrize("kwargs, env, line", [
    (dict(dasc_pool_slots=3), {}, "dasc_pool_slots needs dasc_plan (or DASC_PLAN)"),
    (dict(dasc_plan=None, dasc_compressed_only=True), {}, "dasc_compressed_only needs dasc_plan (or DASC_PLAN)"),
    (dict(dasc_pool_slots=0), {"DASC_PLAN": "{p}"}, "dasc_pool_slots: expected an integer >= 1 (the compressed pool "
                                                    "needs at least 1 usable slot), got 0"),
    (dict(dasc_plan="{p}", disable_radix_cache=True), {},
     "dasc: refusing to start: unsupported option(s): --disable-radix-cache (dasc compresses radix-cached state "
     "checkpoints)"),
    (dict(dasc_plan="{p}"), {"DASC_POOL_BYTES": "1"}, "DASC_POOL_BYTES 1 byte holds no usable slot"),
])
def test_engine_keywords_are_settled_as_the_launcher_settles_flags(tmp_path, monkeypatch, kwargs, env, line):
    """Engine(dasc_*=...) keywords: the same precedence over DASC_*, the same refusals, before the constructor runs."""
    import os

    from dasc_compile.schema import DascInputError
    from dasc_runtime import plugin

    _, plan_dir, _ = compile_tiny(tmp_path)
    fill = {k: (v.format(p=plan_dir) if isinstance(v, str) else v) for k, v in kwargs.items()}
    monkeypatch.setattr("os.environ", {**{k: v for k, v in os.environ.items() if not k.startswith("DASC_")},
                                       **{k: v.format(p=plan_dir) for k, v in env.items()}})
    started = []
    with pytest.raises(DascInputError) as info:
        plugin.engine_kwargs_init(lambda self, **kw: started.append(kw), object(), model_path="m", **fill)
    assert started == [] and str(info.value).startswith(line) and "\n" not in str(info.value), str(info.value)


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


def test_sglang_s_own_launcher_refuses_bad_dasc_input_in_exactly_one_line(tmp_path):
    """`python -m sglang.launch_server --dasc-plan X` with a plan dasc cannot serve printed SGLang's whole argparse
    usage (430-490 lines) above `sglang serve: error: argument --dasc-plan: ...`. Through SGLang's own plugin loading and
    parser (``tests/support/launcher_probe.py``, a fresh process), every bad dasc input is now the whole of stderr:
    one line, status 2, before SGLang builds its options (its own checks may fail on other grounds first)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    plan, plan_dir, ckpt = compile_tiny(tmp_path)
    _, plan2, _ = compile_tiny(tmp_path, tp_size=2)
    p = str(plan_dir)
    refused = [
        (["--dasc-plan", str(tmp_path / "nope")], {},
         f"--dasc-plan: {tmp_path / 'nope'}: dasc plan not found (pass the plan directory or its plan.json)"),
        (["--dasc-plan", str(ckpt)], {}, f"--dasc-plan: {ckpt}: a model checkpoint, not a dasc plan; compile one "
                                         f"first: dasc compile {ckpt} --wmax W --out PLAN"),
        ([], {"DASC_PLAN": str(ckpt)}, f"DASC_PLAN: {ckpt}: a model checkpoint, not a dasc plan; compile one first: "
                                       f"dasc compile {ckpt} --wmax W --out PLAN"),
        (["--dasc-pool-slots", "-5"], {}, "--dasc-pool-slots needs --dasc-plan (or DASC_PLAN)"),
        (["--dasc-plan", "", "--dasc-pool-slots", "3"], {}, "--dasc-pool-slots needs --dasc-plan (or DASC_PLAN)"),
        (["--dasc-plan", p, "--dasc-pool-slots", "0"], {},
         "--dasc-pool-slots: expected an integer >= 1 (the compressed pool needs at least 1 usable slot), got 0"),
        (["--dasc-plan", p, "--dasc-pool-slots", "many"], {}, "--dasc-pool-slots: expected an integer, got 'many'"),
        (["--dasc-plan", p], {"DASC_REFRESH_SLOTS": "abc"}, "DASC_REFRESH_SLOTS: expected an integer, got 'abc'"),
        (["--dasc-plan", p, "--dasc-refresh-slots", "8"], {},
         "--dasc-refresh-slots 8 needs a plan with load_policy: wr that omits units (this plan is load_policy: nr, "
         "w_replay_cap 8)"),
        (["--dasc-plan", p, "--mamba-radix-cache-strategy", "extra_buffer_lazy", "--enable-int8-mamba-checkpoint"], {},
         "unsupported option(s): --enable-int8-mamba-checkpoint (compile the plan with int8: true instead); "
         "--mamba-radix-cache-strategy extra_buffer_lazy (use extra_buffer, what SGLang's auto picks for these "
         "models, or no_buffer with --disable-overlap-schedule)"),
        (["--tp-size", "4"], {"DASC_PLAN": str(plan2)},
         "unsupported option(s): --tp-size 4 (attention TP size 4; the plan is compiled for TP 2: launch with "
         "--tp-size 2, or compile the plan with --tp 4)"),
        (["--dasc-plan", p, "--dasc-pool-bytes", "1"], {},
         f"--dasc-pool-bytes 1 byte holds no usable slot: a slot takes {byte_count(plan.tp.bottleneck_bytes_per_slot)} "
         f"and slot 0 is reserved; give at least {flag_bytes(2 * plan.tp.bottleneck_bytes_per_slot)}"),
        (["--dasc-plan", p, "--device", "cpu"], {},
         "unsupported option(s): --device cpu (the dasc pool and its Triton kernels run on CUDA GPUs: leave --device "
         "unset or pass cuda)"),
        (["--dasc-plan", p, "--dasc-dummy-decay-ok"], {},    # refused before the weights load, not after
         "--dasc-dummy-decay-ok needs --load-format dummy (got 'auto'): real weights must match the plan's decay "
         "fingerprint"),
        (["--dasc-plan", p, "--load-format", "safetensors"], {"DASC_DUMMY_DECAY_OK": "1"},
         "DASC_DUMMY_DECAY_OK needs --load-format dummy (got 'safetensors'): real weights must match the plan's "
         "decay fingerprint"),
        # SGLang's IPC weight cache loads through its ipc_cache format: the weights may be a daemon's real ones
        (["--dasc-plan", p, "--dasc-dummy-decay-ok", "--load-format", "dummy", "--weight-cache-mode", "client"], {},
         "--dasc-dummy-decay-ok needs SGLang's dummy loader, and --weight-cache-mode client loads the weights through "
         "SGLang's IPC weight cache, which may hold real ones: drop --weight-cache-mode or --dasc-dummy-decay-ok"),
        # a valid launch where torch sees no GPU (the probe runs with CUDA_VISIBLE_DEVICES='': no stand-in)
        (["--dasc-plan", p], {"DASC_POOL_SLOTS": "7"},
         "no CUDA GPU is visible to this process (CUDA_VISIBLE_DEVICES=''): the dasc pool and its Triton kernels run "
         "on CUDA GPUs; on a machine without one, check the plan and its server flags with `dasc size PLAN "
         "--max-running-requests R --budget BYTES`"),
    ]
    served = [(["--dasc-plan", p], {"DASC_POOL_SLOTS": "7"}), ([], {}),
              (["--dasc-plan", p, "--dasc-dummy-decay-ok", "--load-format", "dummy"], {}),
              (["--dasc-plan", p, "--load-format", "dummy", "--weight-cache-mode", "off"], {"DASC_DUMMY_DECAY_OK": "1"})]
    # every case but the one above runs as on a GPU machine: their refusals come first, and a valid launch passes
    cases = [{"argv": a, "env": e, **({"gpu": True} if i != len(refused) - 1 else {})}
             for i, (a, e, _) in enumerate(refused)] + [{"argv": a, "env": e, "gpu": True} for a, e in served]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASC_")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")      # no card, on a GPU machine too
    proc = subprocess.run([sys.executable, "-m", "tests.support.launcher_probe", str(tmp_path / "cases.json")],
                          capture_output=True, text=True, env=env, timeout=600, cwd=Path(__file__).resolve().parents[2])
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    got = json.loads(line[-1][len("RESULT "):])
    for (argv, e, want), r in zip(refused, got):
        assert (r["code"], r["stderr"]) == (2, f"dasc: refusing to start: {want}\n"), (argv, e, r)
    ok, plain, dummy, dummy_env = got[len(refused):]
    assert dummy["code"] == dummy_env["code"] == 0
    assert dummy["settings"]["dummy_decay_ok"] is dummy_env["settings"]["dummy_decay_ok"] is True
    assert ok["code"] == 0 and ok["settings"] == {"plan": p, "pool_slots": 7, "compressed_only": False,
                                                  "dummy_decay_ok": False}
    assert plain["code"] == 0 and plain["settings"] is None       # a server without dasc: untouched


@pytest.mark.parametrize("chunk", [None, 4096, -1])          # None: SGLang picks it; -1: chunking off, B not capped
def test_pool_bytes_that_leave_no_slot_after_wr_scratch_are_refused_at_launch(tmp_path, monkeypatch, chunk):
    """A dasc-wr budget that holds a compressed slot but not the scratch slots too was refused only at start-up, after
    the weights had loaded. At launch the scratch is charged at its least: the B the given --chunked-prefill-size
    leaves (served_refresh_slots), or, when SGLang picks the chunk, the B its smallest automatic chunk leaves, as dasc
    size assumes (it charged one slot, and the budget it then suggested was refused at start-up: fresh-user trial,
    session 37)."""
    import os

    from dasc_compile.schema import DascInputError
    from dasc_runtime import plugin
    from dasc_runtime.serving_rules import SMALLEST_AUTO_CHUNK, served_refresh_slots

    plan, plan_dir, _ = compile_tiny(tmp_path, load_policy="wr")
    b = served_refresh_slots(plan, None, SMALLEST_AUTO_CHUNK if chunk is None else chunk)
    assert b > 1                                       # the tiny plan's windows: the old one-slot charge was less
    dense, slot = int(plan.tp.bytes_dense_per_slot), int(plan.tp.bottleneck_bytes_per_slot)
    scratch = b * dense
    monkeypatch.setattr("os.environ", {k: v for k, v in os.environ.items() if not k.startswith("DASC_")})
    opts = {} if chunk is None else {"chunked_prefill_size": chunk}
    started = []
    short = scratch + 2 * slot - 1                     # one byte short of the scratch plus one usable slot
    with pytest.raises(DascInputError) as info:
        plugin.engine_kwargs_init(lambda self, **kw: started.append(kw), object(), model_path="m",
                                  dasc_plan=str(plan_dir), dasc_pool_bytes=short, **opts)
    msg = str(info.value)
    assert msg.startswith(f"dasc_pool_bytes {byte_count(short)} leaves no usable compressed slot after dasc-wr's "
                          f"{b} scratch slot") and f"({byte_count(scratch)}" in msg
    assert ("smallest automatic prefill chunk, 2048 tokens" in msg) == (chunk is None)
    assert f"give at least {scratch + 2 * slot} bytes" in msg and started == []
    # the smallest budget that fits passes the launch check (the constructor runs)
    monkeypatch.setattr("os.environ", {k: v for k, v in os.environ.items() if not k.startswith("DASC_")})
    from dasc_runtime import launcher

    settings = launcher.settle({"plan": str(plan_dir), "pool_bytes": scratch + 2 * slot}, launcher._KWARG_NAMES,
                               __import__("types").SimpleNamespace(model_path="m", **opts))
    assert settings is not None and settings.pool_bytes == scratch + 2 * slot


def test_the_launching_process_checks_each_launch_and_its_children_do_not(tmp_path, monkeypatch):
    """With the plan in DASC_PLAN, a second Engine(...) of the launching process reached its constructor unchecked
    once a first had passed, its options never seen (review, session 37): the mark settle leaves names the process
    that checked, and only its children (schedulers) skip the check. In a child, a DASC_* value changed after the
    check is checked again; a ServerArgs(...) built inside a checked launch is that launch's (checked once)."""
    import os
    from types import SimpleNamespace

    from dasc_runtime import launcher, plugin
    from dasc_runtime.refusal import DascRefusal

    _, plan_dir, _ = compile_tiny(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASC_", "_DASC_"))}
    env["DASC_PLAN"] = str(plan_dir)
    monkeypatch.setattr("os.environ", env)
    checks = []
    real = launcher.settle
    monkeypatch.setattr(launcher, "settle", lambda *a, **k: (checks.append(1), real(*a, **k))[1])
    built = []

    def build(self, **kw):
        built.append(kw)

    plugin.engine_kwargs_init(build, SimpleNamespace(), model_path="m")                  # the first launch: checked, passes
    assert len(checks) == 1 and env[launcher.CHECKED_VAR].startswith(f"{os.getpid()}:")
    with pytest.raises(DascRefusal, match="unsupported option.*--enable-hierarchical-cache"):
        plugin.engine_kwargs_init(build, SimpleNamespace(), model_path="m", enable_hierarchical_cache=True)
    assert len(checks) == 2 and len(built) == 1                                   # refused before its constructor

    def nested(self, **kw):                      # a constructor that builds another ServerArgs (0.5.17's from_cli_args)
        plugin.engine_kwargs_init(build, SimpleNamespace(), **kw)

    plugin.engine_kwargs_init(nested, SimpleNamespace(), model_path="m")
    assert len(checks) == 3 and len(built) == 2
    # 0.5.23's Engine(server_args=sa): the options are sa's, not the (absent) keywords
    with pytest.raises(DascRefusal, match="unsupported option.*--enable-hierarchical-cache"):
        plugin.engine_kwargs_init(build, SimpleNamespace(),
                                  server_args=SimpleNamespace(model_path="m", enable_hierarchical_cache=True))
    plugin.engine_kwargs_init(build, SimpleNamespace(), server_args=SimpleNamespace(model_path="m"))
    assert len(checks) == 5 and len(built) == 3

    env[launcher.CHECKED_VAR] = launcher.checked_mark(env, os.getpid() + 1)     # a scheduler: its launcher checked
    plugin.engine_kwargs_init(build, SimpleNamespace(), model_path="m", enable_hierarchical_cache=True)
    assert len(checks) == 5 and len(built) == 4                                   # not checked again here
    env["DASC_POOL_SLOTS"] = "0"                                                  # but a value changed since is
    with pytest.raises(Exception, match="DASC_POOL_SLOTS: expected an integer >= 1"):
        plugin.engine_kwargs_init(build, SimpleNamespace(), model_path="m")
    assert len(checks) == 6 and len(built) == 4


def test_a_first_engine_that_failed_early_leaves_nothing_for_the_next(tmp_path, monkeypatch):
    """The dasc_* keywords taken from the first Engine(...) of a process waited for its _launch_subprocesses; when
    that constructor failed before it (a mistyped keyword), the next Engine's launch settled them instead of its own
    (review, session 37: a stale plan A served where B was asked). Any hooked constructor ends the first Engine's
    turn."""
    import os
    from types import SimpleNamespace

    from dasc_runtime import launcher

    _, plan_a, _ = compile_tiny(tmp_path / "a")
    monkeypatch.setattr("os.environ", {k: v for k, v in os.environ.items() if not k.startswith(("DASC_", "_DASC_"))})
    import threading

    monkeypatch.setitem(launcher._FIRST_ENGINE, threading.get_ident(), {"plan": str(plan_a)})   # left behind
    launched = []
    launcher.engine_kwargs_init(lambda self, **kw: None, object(), model_path="m")   # the next Engine(...), no dasc
    sa = SimpleNamespace(model_path="m")
    launcher.first_engine_launch(lambda cls, server_args: launched.append(server_args), object, sa)
    assert launched == [sa] and "DASC_PLAN" not in os.environ and not hasattr(sa, "_dasc_settings")
    assert launcher._FIRST_ENGINE == {}


_FIRST_ENGINE = """
import json, sys
import sglang
try:
    sglang.Engine(model_path="x", **json.loads(sys.argv[1]))
    print("RESULT constructed")
except Exception as exc:
    print("RESULT " + type(exc).__name__ + ": " + str(exc))
"""


_TWO_ENGINES = """
import json, os, sys
import sglang
from sglang.srt.entrypoints.engine import Engine

seen = []


@classmethod
def launch(cls, server_args, *args, **kwargs):       # stands in for the subprocesses: what they would inherit
    seen.append({"env": os.environ.get("DASC_PLAN"), "attached": getattr(server_args, "_dasc_settings", None)})
    raise RuntimeError("stop before the subprocesses")


Engine._launch_subprocesses = launch                   # dasc's hook wraps this when the first Engine loads the plugins
import dasc_runtime.startup_checks as checks
checks.cuda_visible = lambda: True                     # the CPU stands in for a GPU machine (the launch's last check)
for kw in json.loads(sys.argv[1]):
    try:
        Engine(model_path="x", **kw)
        seen.append("constructed")
    except Exception as exc:
        if str(exc) != "stop before the subprocesses":
            seen.append(type(exc).__name__)
print("RESULT " + json.dumps(seen))
"""


def test_the_first_engine_is_settled_and_published_and_a_failed_one_leaves_nothing(tmp_path):
    """The first Engine(dasc_plan=A) of a fresh interpreter reaches its subprocess launch with DASC_PLAN exported and
    the settings attached to its ServerArgs (what every scheduler inherits). A first Engine that fails before its
    launch (an unknown keyword) leaves nothing: the next Engine(dasc_plan=B) serves B (it served the stale A)."""
    import json
    import os
    import subprocess
    import sys

    try:
        import sglang.srt.entrypoints.engine  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"sglang.Engine does not import in this environment ({exc})")
    _, plan_a, _ = compile_tiny(tmp_path / "a")
    _, plan_b, _ = compile_tiny(tmp_path / "b", w_max=8)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DASC_", "_DASC_"))}

    def run(calls):
        p = subprocess.run([sys.executable, "-c", _TWO_ENGINES, json.dumps(calls)], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
        got = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        assert got, p.stderr[-1500:]
        return json.loads(got[0].removeprefix("RESULT "))

    assert run([{"dasc_plan": str(plan_a), "dasc_pool_slots": 3}]) == \
        [{"env": str(plan_a), "attached": {"plan": str(plan_a), "pool_slots": 3, "compressed_only": False,
                                           "dummy_decay_ok": False}}]
    assert run([{"dasc_plan": str(plan_a), "not_a_server_arg": 1}, {"dasc_plan": str(plan_b)}]) == \
        ["TypeError", {"env": str(plan_b), "attached": {"plan": str(plan_b), "compressed_only": False,
                                                       "dummy_decay_ok": False}}]


@pytest.mark.parametrize("kwargs, env, line", [
    ({"dasc_plan": "/no-such-plan"}, {}, "DascInputError: dasc_plan: /no-such-plan: dasc plan not found"),
    ({}, {"DASC_PLAN": "/no-such-plan"}, "DascInputError: DASC_PLAN: /no-such-plan: dasc plan not found"),
    ({"dasc_plan": "{p}", "enable_hierarchical_cache": True}, {},
     "DascRefusal: dasc: refusing to start: unsupported option(s): --enable-hierarchical-cache"),
])
def test_the_first_engine_of_a_process_is_settled_like_any_other(tmp_path, kwargs, env, line):
    """SGLang 0.5.23's Engine.__init__ loads the plugins itself, so the first Engine(...) of a process ran the
    constructor from before dasc's hook: Engine(dasc_plan=...) ended in SGLang's 'Unexpected keyword argument' and a
    plan only in DASC_PLAN was not checked before the schedulers started (fresh-user trial, session 36). A fresh
    interpreter, plugins not loaded: each is refused as a later Engine is, before any subprocess starts."""
    import json
    import os
    import subprocess
    import sys

    try:
        import sglang.srt.entrypoints.engine  # noqa: F401
    except ImportError as exc:                 # the lowest pin's SGLang has only its cache classes here
        pytest.skip(f"sglang.Engine does not import in this environment ({exc})")
    _, plan_dir, _ = compile_tiny(tmp_path)
    fill = {k: (v.format(p=plan_dir) if isinstance(v, str) else v) for k, v in kwargs.items()}
    full = {**{k: v for k, v in os.environ.items() if not k.startswith(("DASC_", "_DASC_"))}, **env}
    p = subprocess.run([sys.executable, "-c", _FIRST_ENGINE, json.dumps(fill)], env=full, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    got = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert got and got[0].removeprefix("RESULT ").startswith(line), (got, p.stderr[-1500:])
