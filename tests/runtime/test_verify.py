"""Start-up safety: plan loading, settings, decay fingerprint and refusals (runtime/verify.py, fingerprint.py)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest
import torch

from tests.support.runtime_fixtures import (GDN_D, GDN_HEADS, GDN_LINEAR, SGLANG_SKIP_REASON, compile_tiny,
                                            gdn_cache_params, gdn_decay_tensors, kda_cache_params)

needs_sglang = pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")


def test_fingerprint_bytes_match_the_compiler():
    from dasc_compile.checkpoint import decay_fingerprint

    from dasc_runtime.fingerprint import decay_sha256

    t = gdn_decay_tensors()
    assert decay_sha256(t) == decay_fingerprint(t)


class _GdnModel(torch.nn.Module):
    """Parameter names as SGLang's Qwen3-Next holds them (dt_bias in the model dtype, A_log FP32)."""

    def __init__(self, tensors, heads_slice=slice(None)):
        super().__init__()
        layers = torch.nn.ModuleList()
        for i in range(max(GDN_LINEAR) + 2):
            m = torch.nn.Module()
            if i in GDN_LINEAR:
                la = torch.nn.Module()
                d = dict(tensors)
                la.A_log = torch.nn.Parameter(d[f"model.layers.{i}.linear_attn.A_log"][heads_slice].clone())
                la.dt_bias = torch.nn.Parameter(d[f"model.layers.{i}.linear_attn.dt_bias"][heads_slice].clone())
                m.linear_attn = la
            layers.append(m)
        self.model = torch.nn.Module()
        self.model.layers = layers


def test_served_fingerprint_matches_plan_across_tp_and_dtype(tmp_path):
    from dasc_runtime.fingerprint import served_decay_tensors
    from dasc_runtime.verify import DascRefusal, check_fingerprint

    plan, _, _ = compile_tiny(tmp_path)
    names = plan.fingerprint.decay_tensors
    tensors = gdn_decay_tensors()
    # TP = 1, A_log promoted to FP64 and dt_bias to FP32 by a loader: still the same values
    promoted = [(n, t.to(torch.float64) if n.endswith("A_log") else t.to(torch.float32)) for n, t in tensors]
    served = served_decay_tensors(_GdnModel(promoted), names)
    hit = check_fingerprint(plan, served)
    assert hit["dt_bias"] == torch.bfloat16 and hit["A_log"] == torch.float32
    # TP = 2: each rank holds half of the heads; the gather concatenates in rank order
    ranks = [_GdnModel(tensors, slice(0, 2)), _GdnModel(tensors, slice(2, 4))]
    locals_ = [dict(served_decay_tensors(m, names)) for m in ranks]
    order = iter(range(10 ** 6))

    def gather(t):
        i = next(order)
        return [locals_[0][names[i % len(names)]], locals_[1][names[i % len(names)]]]

    served2 = served_decay_tensors(ranks[0], names, gather)
    assert check_fingerprint(plan, served2)["sha256"] == plan.fingerprint.decay_sha256
    # other weights: refused, naming both hashes and the first tensor
    bad = [(n, t + 1 if n.endswith("A_log") else t) for n, t in tensors]
    with pytest.raises(DascRefusal, match=r"decay tensors of the served weights \(sha256 [0-9a-f]{16}\.\.\.\) differ .* "
                                          r"'model\.layers\.0\.linear_attn\.A_log'"):
        check_fingerprint(plan, served_decay_tensors(_GdnModel(bad), names))
    # a lossy dtype (FP32 dt_bias values that BF16 cannot hold) is never cast down
    lossy = [(n, t.to(torch.float32) + 1e-3 if n.endswith("dt_bias") else t) for n, t in tensors]
    with pytest.raises(DascRefusal):
        check_fingerprint(plan, served_decay_tensors(_GdnModel(lossy), names))
    with pytest.raises(Exception, match="has no counterpart in the served model"):
        served_decay_tensors(torch.nn.Linear(2, 2), names)


def test_dummy_decay_ok_only_with_dummy_weights(tmp_path, caplog):
    """--dasc-dummy-decay-ok: a mismatch is a warning for --load-format dummy, still a refusal otherwise."""
    from dasc_runtime.fingerprint import decay_sha256, served_decay_tensors
    from dasc_runtime.verify import DascRefusal, check_fingerprint

    plan, _, _ = compile_tiny(tmp_path)
    names = plan.fingerprint.decay_tensors
    # SGLang's dummy loader: every head gets the same small values
    dummy = [(n, torch.full_like(t, 1e-3)) for n, t in gdn_decay_tensors()]
    served = served_decay_tensors(_GdnModel(dummy), names)
    with pytest.raises(DascRefusal, match="differ from the ones the plan was compiled from"):
        check_fingerprint(plan, served, load_format="dummy")
    with caplog.at_level("WARNING", logger="dasc"):
        hit = check_fingerprint(plan, served, dummy_decay_ok=True, load_format="dummy")
    assert hit == {"sha256": decay_sha256(served), "stand_in": True}
    assert hit["sha256"] != plan.fingerprint.decay_sha256
    assert "accepted (--dasc-dummy-decay-ok" in caplog.text
    for fmt in ("auto", "safetensors", "", "LoadFormat.DUMMY", "dummy-ish"):
        with pytest.raises(DascRefusal, match="--dasc-dummy-decay-ok needs --load-format dummy"):
            check_fingerprint(plan, served, dummy_decay_ok=True, load_format=fmt)
    # SGLang's LoadFormat enum (ModelRunner.load_config.load_format) and its case-insensitive parse
    from sglang.srt.configs.load_config import LoadFormat

    for fmt in (LoadFormat.DUMMY, "DUMMY", " Dummy "):
        assert check_fingerprint(plan, served, dummy_decay_ok=True, load_format=fmt)["stand_in"] is True
    for fmt in (LoadFormat.AUTO, LoadFormat.SAFETENSORS):
        with pytest.raises(DascRefusal, match=f"got '{fmt.value}'"):
            check_fingerprint(plan, served, dummy_decay_ok=True, load_format=fmt)
    # SGLang's IPC weight cache on (any mode but exactly "off", as SGLang compares it; or the loader's ipc_cache
    # format, which no --load-format accepts): the weights may be a daemon's real ones; without the flag the cache is
    # not dasc's concern
    for fmt in ("dummy", LoadFormat.IPC_CACHE):
        for mode, shown in (("client", "client"), ("daemon", "daemon"), ("OFF", "OFF"), ("", "''"), (" off", "' off'")):
            with pytest.raises(DascRefusal) as err:
                check_fingerprint(plan, served, dummy_decay_ok=True, load_format=fmt, weight_cache_mode=mode)
            assert str(err.value) == (f"dasc: refusing to start: --dasc-dummy-decay-ok needs SGLang's dummy loader, and "
                                      f"--weight-cache-mode {shown} loads the weights through SGLang's IPC weight "
                                      f"cache, which may hold real ones: drop --weight-cache-mode or "
                                      f"--dasc-dummy-decay-ok")
    with pytest.raises(DascRefusal, match=r"and SGLang's weight cache \(load format ipc_cache\) loads the weights"):
        check_fingerprint(plan, served, dummy_decay_ok=True, load_format=LoadFormat.IPC_CACHE)
    for mode in ("off", None):
        assert check_fingerprint(plan, served, dummy_decay_ok=True, load_format="dummy",
                                 weight_cache_mode=mode)["stand_in"] is True
    # both wrong: both named, the load format first (dropping the cache alone would meet the next refusal)
    with pytest.raises(DascRefusal) as err:
        check_fingerprint(plan, served, dummy_decay_ok=True, load_format="auto", weight_cache_mode="client")
    assert str(err.value).count("--dasc-dummy-decay-ok needs") == 2
    assert str(err.value).index("got 'auto'") < str(err.value).index("--weight-cache-mode client")
    with pytest.raises(DascRefusal, match="differ from the ones the plan was compiled from"):
        check_fingerprint(plan, served, load_format=LoadFormat.IPC_CACHE, weight_cache_mode="client")
    # matching weights stay a plain match under the flag
    exact = served_decay_tensors(_GdnModel(gdn_decay_tensors()), names)
    assert check_fingerprint(plan, exact, dummy_decay_ok=True, load_format="dummy")["sha256"] == \
        plan.fingerprint.decay_sha256


def test_served_weights_read_the_weight_cache_from_the_server(tmp_path):
    """After the weights load, the runner's own format (SGLang switches dummy to ipc_cache when its weight cache is
    on) and the server's --weight-cache-mode decide: the cache's refusal names the flag, not 'ipc_cache'."""
    from types import SimpleNamespace

    from sglang.srt.configs.load_config import LoadFormat

    from dasc_runtime.verify import DascRefusal
    from dasc_runtime.weight_updates import check_served_weights

    plan, _, _ = compile_tiny(tmp_path)
    model = _GdnModel([(n, torch.full_like(t, 1e-3)) for n, t in gdn_decay_tensors()])
    ok = SimpleNamespace(dummy_decay_ok=True)

    def runner(fmt, mode, loader_mode=None):
        load_config = SimpleNamespace(load_format=fmt, **({} if loader_mode is None else
                                                          {"weight_cache_mode": loader_mode}))
        return SimpleNamespace(model=model, load_config=load_config,
                               server_args=SimpleNamespace(load_format="dummy", weight_cache_mode=mode))

    # the server's option when the loader's config does not say; the loader's own mode first when it does
    with pytest.raises(DascRefusal, match="--weight-cache-mode client loads the weights through SGLang's IPC"):
        check_served_weights(runner(LoadFormat.IPC_CACHE, "client"), plan, ok)
    with pytest.raises(DascRefusal, match="--weight-cache-mode daemon loads the weights through SGLang's IPC"):
        check_served_weights(runner(LoadFormat.IPC_CACHE, "client", loader_mode="daemon"), plan, ok)
    hit = check_served_weights(runner(LoadFormat.DUMMY, "off"), plan, ok)
    assert hit["stand_in"] is True and hit["tensors"] == len(plan.fingerprint.decay_tensors)


def test_plan_loader_checks_version_and_hash(tmp_path):
    from dasc_compile.errors import DascInputError
    from dasc_compile.schema import load_plan

    plan, pdir, _ = compile_tiny(tmp_path)
    assert load_plan(pdir) == plan == load_plan(pdir / "plan.json")
    raw = json.loads((pdir / "plan.json").read_text())
    raw["policy"]["w_max"] = 17
    (pdir / "plan.json").write_text(json.dumps(raw))
    with pytest.raises(DascInputError, match="content_hash does not match"):
        load_plan(pdir)
    raw["schema_version"] = 999
    (pdir / "plan.json").write_text(json.dumps(raw))
    with pytest.raises(DascInputError, match="schema_version 999 is not"):
        load_plan(pdir)
    with pytest.raises(DascInputError, match="dasc plan not found"):
        load_plan(tmp_path / "nope")


def test_one_plan_reader_for_compiler_and_runtime(tmp_path):
    from dasc_compile import schema
    from dasc_compile.errors import DascInputError

    from dasc_compile.schema import load_plan

    plan, pdir, _ = compile_tiny(tmp_path)
    assert load_plan(pdir) == schema.load_plan(pdir / "plan.json") == plan
    raw = json.loads((pdir / "plan.json").read_text())
    raw["content_hash"] = ""                               # an empty hash is checked too, not skipped
    (pdir / "plan.json").write_text(json.dumps(raw))
    for load in (load_plan, schema.load_plan):
        with pytest.raises(DascInputError, match="content_hash does not match"):
            load(pdir)
    (pdir / "plan.json").write_text("[1, 2]")
    with pytest.raises(DascInputError, match="must be a JSON object"):
        load_plan(pdir)
    (pdir / "plan.json").write_text(json.dumps({"schema_version": 1}))
    with pytest.raises(DascInputError, match="not a dasc plan"):
        load_plan(pdir)


def test_settings_sources_and_env_roundtrip(monkeypatch):
    from dasc_compile.errors import DascInputError

    from dasc_runtime.settings import DascSettings, current_settings, resolve_settings

    for k in ("DASC_PLAN", "DASC_POOL_SLOTS", "DASC_POOL_BYTES", "DASC_COMPRESSED_ONLY", "DASC_DEMOTE_WATERMARK"):
        monkeypatch.delenv(k, raising=False)
    s = resolve_settings({"plan": "/p", "pool_bytes": "4096", "compressed_only": True}, env={}, need_plan=False)[0]
    env = s.to_env()
    assert env == {"DASC_PLAN": "/p", "DASC_POOL_BYTES": "4096", "DASC_COMPRESSED_ONLY": "1"}
    assert resolve_settings({}, env=env, need_plan=False)[0] == s
    # a size with a unit (as `dasc size --budget` takes it) is bytes from there on: scheduler processes read the
    # exported integer, and a flag, a keyword and a variable mean the same
    import numpy as np

    for given, var in (({"pool_bytes": "2GiB"}, {}), ({"pool_bytes": 2 ** 31}, {}), ({"pool_bytes": 2.147483648e9}, {}),
                       ({"pool_bytes": np.int64(2 ** 31)}, {}), ({"pool_bytes": np.float32(2 ** 31)}, {}),
                       ({}, {"DASC_POOL_BYTES": "2 GiB"}),
                       ({}, {"DASC_POOL_BYTES": "2.147483648e9"})):
        got = resolve_settings({"plan": "/p", **given}, env=var, need_plan=False)[0]
        assert got.pool_bytes == 2 ** 31 and got.to_env()["DASC_POOL_BYTES"] == str(2 ** 31), (given, var)
    with pytest.raises(DascInputError, match="exclusive"):
        DascSettings(plan="/p", pool_slots=3, pool_bytes=10)
    with pytest.raises(DascInputError, match="expected an integer"):
        resolve_settings({}, env={"DASC_PLAN": "/p", "DASC_POOL_SLOTS": "many"}, need_plan=False)

    class SA:
        _dasc_settings = {"plan": "/from-args", "pool_slots": 7}

    monkeypatch.setenv("DASC_PLAN", "/from-env")
    assert current_settings(SA()).plan == "/from-args" and current_settings(SA()).pool_slots == 7
    assert current_settings(object()).plan == "/from-env"


def test_yes_no_settings_refuse_what_they_do_not_take(monkeypatch):
    """DASC_COMPRESSED_ONLY=2 was silently "no"; every yes / no setting now names itself and its words."""
    from dasc_compile.errors import DascInputError

    from dasc_runtime.settings import parse_bool, resolve_settings

    assert [parse_bool("x", v) for v in (True, " On ", "yes", "1", None, "", "off", "No", False)] == \
        [True, True, True, True, False, False, False, False, False]
    with pytest.raises(DascInputError, match=r"^DASC_COMPRESSED_ONLY: expected 1 / true / yes / on "
                                             r"or 0 / false / no / off, got '2'$"):
        resolve_settings({}, env={"DASC_PLAN": "/p", "DASC_COMPRESSED_ONLY": "2"}, need_plan=False)
    with pytest.raises(DascInputError, match="dummy_decay_ok: .* got 'maybe'"):
        resolve_settings({"plan": "/p", "dummy_decay_ok": "maybe"}, env={}, need_plan=False)


@pytest.mark.parametrize("var, bad, needle", [
    ("DASC_EVICT_SHADOWED_FIRST", "2", "DASC_EVICT_SHADOWED_FIRST: expected 1 / true / yes / on or 0 / false / no / off, got '2'"),
    ("DASC_RECLAIM_WAIT", "sometimes", "DASC_RECLAIM_WAIT: expected 'stream' or 'host', got 'sometimes'"),
    ("DASC_EVICT_FORK_TEST", "2", "DASC_EVICT_FORK_TEST: expected 1 / true / yes / on or 0 / false / no / off, got '2'"),
])
def test_env_only_knobs_are_refused_at_start_up_not_when_the_scheduler_builds_the_cache(tmp_path, monkeypatch, var, bad,
                                                                                       needle):
    """The launcher's flag step (before any model loads) parses the env-only A/B knobs; nothing is exported when
    one is bad."""
    from dasc_compile.errors import DascInputError

    from dasc_runtime import launcher

    for v in ("DASC_EVICT_SHADOWED_FIRST", "DASC_RECLAIM_WAIT", "DASC_EVICT_FORK_TEST"):
        monkeypatch.delenv(v, raising=False)
    _, plan_dir, _ = compile_tiny(tmp_path)
    monkeypatch.setattr("os.environ", {k: v for k, v in os.environ.items() if not k.startswith("DASC_")})
    monkeypatch.setitem(os.environ, var, bad)
    with pytest.raises(DascInputError) as err:
        launcher.settle({"plan": str(plan_dir)}, {}, SimpleNamespace())
    assert str(err.value) == needle and "DASC_PLAN" not in os.environ
    monkeypatch.setitem(os.environ, var, {"DASC_EVICT_SHADOWED_FIRST": "on", "DASC_RECLAIM_WAIT": "host",
                                          "DASC_EVICT_FORK_TEST": "off"}[var])
    assert launcher.settle({"plan": str(plan_dir)}, {}, SimpleNamespace()).plan == str(plan_dir)
    assert os.environ["DASC_PLAN"] == str(plan_dir)


@needs_sglang
def test_state_checks_name_what_differs(tmp_path):
    from dasc_runtime.verify import DascRefusal, check_state

    plan, _, _ = compile_tiny(tmp_path)
    cp = gdn_cache_params()
    kw = dict(layer_ids=GDN_LINEAR, temporal_shape=cp.shape.temporal, conv_shapes=cp.shape.conv,
              temporal_dtype=torch.float32, conv_dtype=torch.bfloat16, tp_rank=0, tp_size=1)
    check_state(plan, **kw)
    cases = [
        (dict(tp_size=2, tp_rank=1), "TP size: plan compiled for tp_size=1, server runs attention TP size 2"),
        (dict(layer_ids=[0, 1, 3]), r"recurrent layer ids: plan \[0, 1, 2\], server \[0, 1, 3\]"),
        (dict(temporal_shape=(GDN_HEADS // 2, GDN_D, GDN_D)), r"temporal state per rank .* plan \(4, 16, 16\)"),
        (dict(temporal_dtype=torch.bfloat16), "temporal state dtype: plan float32, server torch.bfloat16"),
        (dict(conv_dtype=torch.float32), "conv state dtype: plan bfloat16"),
        (dict(conv_shapes=[(96, 3)]), "conv state bytes per rank: plan 2304, server 1728"),
    ]
    for change, msg in cases:
        with pytest.raises(DascRefusal, match=msg):
            check_state(plan, **{**kw, **change})
    kplan, _, _ = compile_tiny(tmp_path, "kda")
    kcp = kda_cache_params()
    with pytest.raises(DascRefusal, match="temporal state per rank"):
        check_state(kplan, **{**kw, "temporal_shape": (4, 16, 16)})
    check_state(kplan, layer_ids=[0, 1, 2], temporal_shape=kcp.shape.temporal, conv_shapes=kcp.shape.conv,
                temporal_dtype=torch.float32, conv_dtype=torch.bfloat16, tp_rank=0, tp_size=1)


def test_plan_for_other_tp_size_or_hybrid_balance_is_refused(tmp_path):
    from dasc_compile.errors import DascInputError

    from dasc_runtime.rank_layout import build_rank_layout

    plan, _, _ = compile_tiny(tmp_path, tp_size=2)
    with pytest.raises(DascInputError, match="compiled for tp_size=2, the server runs attention TP size 1"):
        build_rank_layout(plan, 0, 1)
    lay = [build_rank_layout(plan, r, 2) for r in (0, 1)]
    # contiguous sharding: rank 0 holds heads 0-1, rank 1 heads 2-3 (kept: {0,1} {0,3} {0,1,2})
    assert [l.rank_units for l in lay] == [((0, 1), (0,), (0, 1)), ((), (1,), (0,))]
    hplan, _, _ = compile_tiny(tmp_path, tp_size=2, balance="hybrid")
    with pytest.raises(DascInputError, match="balance=hybrid"):
        build_rank_layout(hplan, 0, 2)


def test_server_option_refusals():
    from types import SimpleNamespace

    from dasc_runtime.verify import DascRefusal, check_server_args

    check_server_args(SimpleNamespace(pp_size=1))
    for field, value, msg in [("enable_hierarchical_cache", True, "--enable-hierarchical-cache"),
                              ("enable_unified_memory", True, "--enable-unified-memory"),
                              ("enable_page_major_kv_layout", True, "page-major"),
                              ("enable_int8_mamba_checkpoint", True, "compile the plan with int8"),
                              ("disable_radix_cache", True, "--disable-radix-cache"),
                              ("speculative_algorithm", "EAGLE", "speculative"),
                              ("pp_size", 2, "--pp-size 2"),
                              ("disaggregation_mode", "prefill", "PD disaggregation")]:
        with pytest.raises(DascRefusal, match=msg):
            check_server_args(SimpleNamespace(**{field: value}))


def test_unserved_plan_features_are_refused(tmp_path):
    from dasc_runtime.verify import DascRefusal, check_plan_supported

    check_plan_supported(compile_tiny(tmp_path)[0])
    check_plan_supported(compile_tiny(tmp_path, load_policy="wr")[0])     # dasc-wr is served (wr_scratch checks it)
    check_plan_supported(compile_tiny(tmp_path, load_policy="wr", w_max=0)[0])   # nothing omitted: nr == wr
    with pytest.raises(DascRefusal, match="balance=hybrid"):
        check_plan_supported(compile_tiny(tmp_path, tp_size=2, balance="hybrid")[0])
