"""Matched-memory sizing of the serving arms (runtime/sizing.py, paper App. C.1) and ``dasc size``.

Every byte count and cap is checked against the installed SGLang itself (0.5.17 or 0.5.23; CI runs
both), on CPU: the state shapes from its
own model configs (``KimiLinearConfig`` / ``Qwen3_5Config``), the native pool from
``KVCacheConfigurator._handle_max_mamba_cache`` (what the server subtracts for
``--max-mamba-cache-size``), the running cap from ``KVCacheConfigurator.resolve_max_num_reqs`` /
``_calculate_mamba_ratio`` and the INT8 pool from ``MambaCheckpointPool.estimate_mem_usage_bytes``.

Hand numbers, calibrated Kimi-Linear-48B-A3B at TP=1 (20 KDA layers, 32 heads, d = 128, conv
3 x 12288 bfloat16): b_dense = 43,417,600 B, b_int8 = 12,288,000 B. At M = 64, R = 8 (extra_buffer,
5 slots a request): budget 65 b_dense = 2,822,144,000 B, M' = 40, left 24 b_dense = 1,042,022,400 B,
INT8 C = floor(1,042,022,400 / 12,288,000) - 1 = 83.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dasc_compile.cli import app
from dasc_compile.compiler import compile_plan
from dasc_compile.errors import DascInputError
from dasc_compile.schema.units import byte_count, flag_bytes
from dasc_compile.policy import Policy
from dasc_compile import size_report
from dasc_runtime import sizing
from dasc_compile.schema import load_plan

ROOT = Path(__file__).resolve().parents[2]
KIMI = ROOT / "plans" / "reference" / "kimi-linear-48b-a3b-calibrated"
QWEN35 = ROOT / "plans" / "reference" / "qwen3.5-27b"
B_DENSE, B_INT8 = 43_417_600, 12_288_000


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    """Calibrated Kimi plans at w16 (temporal dtype and INT8) and w64, TP=1."""
    d = tmp_path_factory.mktemp("kimi")
    out = {}
    for name, pol in (("w16", Policy(w_max=16)), ("w16-int8", Policy(w_max=16, int8=True)), ("w64", Policy(w_max=64)),
                      ("w16-tp2", Policy(w_max=16, tp_size=2, balance="storage")),
                      ("w16-int8-tp2", Policy(w_max=16, tp_size=2, balance="storage", int8=True)),
                      ("w16-wr", Policy(w_max=16, load_policy="wr")),
                      ("w16-wr-int8", Policy(w_max=16, load_policy="wr", int8=True)),
                      ("w512-wr", Policy(w_max=512, load_policy="wr"))):
        _, path = compile_plan(KIMI, pol, d / name, with_kernels=False)
        out[name] = path
    return out


def _sglang(strategy: str, overlap: bool, **kw):
    """Publish SGLang ServerArgs (as a scheduler would) and return them."""
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    sa = ServerArgs(model_path="dummy", page_size=1, mamba_radix_cache_strategy=strategy,
                    disable_overlap_schedule=not overlap, **kw)
    set_global_server_args_for_scheduler(sa)
    return sa


def _configurator(sa, ref: Path = KIMI, tp: int = 1):
    """A stand-in ``self`` for SGLang's KVCacheConfigurator methods, with SGLang's own model config."""
    from sglang.srt.configs.kimi_linear import KimiLinearConfig
    from sglang.srt.configs.qwen3_5 import Qwen3_5Config
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    cfg = json.loads((ref / "config.json").read_text())
    with get_parallel().override(tp_size=tp, attn_tp_size=tp, moe_tp_size=tp):   # 0.5.23 checks it is consistent
        hf = KimiLinearConfig(**cfg) if cfg["model_type"] == "kimi_linear" else Qwen3_5Config(**cfg).text_config
        cp = hf.mamba2_cache_params
    # the fields either release's methods read (0.5.17: ``ps``; 0.5.23: ``attn_dp_size``, ``pp_size``,
    # ``fused_entry_bytes``, ``hybrid_kda_config``, ``extra_mamba_cache_bytes_per_req``)
    stub = types.SimpleNamespace(server_args=sa, mambaish_config=types.SimpleNamespace(mamba2_cache_params=cp),
                                 ps=types.SimpleNamespace(pp_size=1, attn_dp_size=1), attn_dp_size=1, pp_size=1,
                                 spec_algorithm=SpeculativeAlgorithm.NONE, hybrid_gdn_config=None,
                                 hybrid_kda_config=None, extra_mamba_cache_bytes_per_req=0,
                                 fused_entry_bytes=lambda kind: None,
                                 model_config=types.SimpleNamespace(context_len=17408, hf_config=hf))
    stub._calculate_mamba_ratio = lambda: KVCacheConfigurator._calculate_mamba_ratio(stub)
    return stub, cp, KVCacheConfigurator


# --- against SGLang's own estimates -------------------------------------------------------------

@pytest.mark.sglang
@pytest.mark.parametrize("strategy,overlap", [("extra_buffer", True), ("extra_buffer", False),
                                              ("extra_buffer_lazy", True), ("no_buffer", True),
                                              ("no_buffer", False)])
def test_slots_per_running_request_is_sglangs_ratio(strategy, overlap):
    stub, _, kvc = _configurator(_sglang(strategy, overlap))
    assert sizing.slots_per_running_request(strategy, overlap_schedule=overlap) == kvc._calculate_mamba_ratio(stub)


@pytest.mark.sglang
@pytest.mark.parametrize("strategy,overlap,r", [("extra_buffer", True, 8), ("extra_buffer", False, 3),
                                                ("no_buffer", False, 5)])   # SGLang refuses no_buffer with overlap
def test_native_slots_run_exactly_r_requests_in_sglang(kimi, strategy, overlap, r):
    """SGLang runs R requests on M' = k R native slots, and one fewer on M' - 1 (its own cap)."""
    plan = load_plan(kimi["w16"])
    arms = sizing.size_arms(plan, max_running_requests=r, dense_slots=8 * r, strategy=strategy,
                            overlap_schedule=overlap)
    for a in arms:
        assert a.flags[:4] == ("--max-running-requests", str(r), "--mamba-radix-cache-strategy", strategy)
        assert ("--disable-overlap-schedule" in a.flags) == (not overlap)
        assert a.flags[a.flags.index("--max-mamba-cache-size") + 1] == str(a.native_slots)
        m = a.native_slots
        assert m == (8 * r if a.kind == "dense" else sizing.slots_per_running_request(strategy, overlap_schedule=overlap) * r)
        for slots, want in ((m, r), (m - 1, r if a.kind == "dense" else r - 1)):
            stub, _, kvc = _configurator(_sglang(strategy, overlap, max_mamba_cache_size=slots,
                                                 max_running_requests=r))
            assert kvc.resolve_max_num_reqs(stub, 10 ** 6) == want, (a.arm, slots)


@pytest.mark.sglang
@pytest.mark.parametrize("ref,tp,name", [(KIMI, 1, "w16"), (KIMI, 2, "w16-tp2")])
def test_state_bytes_are_sglangs(kimi, ref, tp, name):
    """b_dense is what SGLang subtracts per native slot, b_int8 what its INT8 pool estimate adds per slot."""
    from sglang.srt.mem_cache.mamba_checkpoint_pool import MambaCheckpointPool

    plan = load_plan(kimi[name])
    stub, cp, kvc = _configurator(_sglang("extra_buffer", True, max_mamba_cache_size=40), ref, tp)
    rest_gb = kvc._handle_max_mamba_cache(stub, 100.0)
    assert round((100.0 - rest_gb) * 2 ** 30) == 41 * plan.tp.bytes_dense_per_slot == 41 * cp.mamba_cache_per_req
    h, d_v, d_k = cp.shape.temporal
    kw = dict(num_layers=len(cp.layers), num_heads=h, head_v_dim=d_v, head_k_dim=d_k, conv_shapes=list(cp.shape.conv),
              conv_dtype=cp.dtype.conv, temporal_dtype=cp.dtype.temporal)
    est = [MambaCheckpointPool.estimate_mem_usage_bytes(num_slots=n, **kw)["total"] for n in (0, 1, 83)]
    assert est[1] - est[0] == sizing.int8_bytes_per_slot(plan) == (B_INT8 if tp == 1 else B_INT8 // 2)
    # the INT8 arm's whole pool, as SGLang allocates it for --int8-mamba-ckpt-size 83
    arm = sizing.size_arms(plan, max_running_requests=8, dense_slots=64, arms=["int8"])[0]
    if tp == 1:
        assert arm.ckpt_slots == 83
        assert arm.used_bytes == 41 * B_DENSE + est[2] == 41 * B_DENSE + 84 * B_INT8


@pytest.mark.sglang
def test_int8_bytes_for_gdn_are_sglangs(tmp_path):
    from sglang.srt.mem_cache.mamba_checkpoint_pool import MambaCheckpointPool

    _, out = compile_plan(QWEN35, Policy(w_max=128), tmp_path / "q", with_kernels=False)
    plan = load_plan(out)
    _, cp, _ = _configurator(_sglang("extra_buffer", True), QWEN35, 1)
    assert plan.tp.bytes_dense_per_slot == cp.mamba_cache_per_req
    h, d_v, d_k = cp.shape.temporal
    kw = dict(num_layers=len(cp.layers), num_heads=h, head_v_dim=d_v, head_k_dim=d_k, conv_shapes=list(cp.shape.conv),
              conv_dtype=cp.dtype.conv, temporal_dtype=cp.dtype.temporal)
    one, zero = (MambaCheckpointPool.estimate_mem_usage_bytes(num_slots=n, **kw)["total"] for n in (1, 0))
    assert one - zero == sizing.int8_bytes_per_slot(plan) == 48 * (48 * 128 * 128 + 48 * 128 * 4 + 10240 * 3 * 2)


# --- dasc arms ----------------------------------------------------------------------------------

@pytest.mark.parametrize("a,b", [("w16", "w16-int8"), ("w16-tp2", "w16-int8-tp2")])
def test_other_int8_setting_bytes_match_the_compiled_plan(kimi, a, b):
    plain, i8 = load_plan(kimi[a]), load_plan(kimi[b])
    assert sizing.compressed_bytes_per_slot(plain, int8=True) == i8.tp.bottleneck_bytes_per_slot
    assert sizing.compressed_bytes_per_slot(i8, int8=False) == plain.tp.bottleneck_bytes_per_slot
    assert sizing.compressed_bytes_per_slot(plain) == plain.tp.bottleneck_bytes_per_slot
    assert i8.tp.bottleneck_bytes_per_slot < plain.tp.bottleneck_bytes_per_slot


def test_arms_at_matched_memory_hand_numbers(kimi):
    plan = load_plan(kimi["w16"])
    arms = {a.arm: a for a in sizing.size_arms(plan, max_running_requests=8, dense_slots=64,
                                               plan_path="P", pair_plan_path="P8")}
    assert list(arms) == ["dense", "int8", "dasc-nr-w16", "dasc-nr-w16-int8"]
    budget = 65 * B_DENSE
    for a in arms.values():
        assert a.budget_bytes == budget == 2_822_144_000 and a.used_bytes <= budget
        assert a.max_running_requests == 8 and a.bytes_native_slot == B_DENSE
        if a.kind != "dense":   # no room for one more pool slot
            assert a.native_slots == 40 and a.used_bytes + a.bytes_ckpt_slot > budget
            assert a.used_bytes == 41 * B_DENSE + (a.ckpt_slots + 1) * a.bytes_ckpt_slot
    d, i8, w16, w16i8 = arms.values()
    assert (d.native_slots, d.capacity, d.flags[-1]) == (64, 64, "64")
    assert (i8.ckpt_slots, i8.capacity, i8.bytes_ckpt_slot) == (83, 83, B_INT8)
    assert i8.flags[-4:] == ("40", "--enable-int8-mamba-checkpoint", "--int8-mamba-ckpt-size", "83")[-4:]
    b16 = plan.tp.bottleneck_bytes_per_slot
    assert w16.ckpt_slots == 24 * B_DENSE // b16 - 1 and w16.capacity == 40 + w16.ckpt_slots
    assert w16.c_ckpt == pytest.approx(2.64, abs=0.01)          # the paper's Kimi w16 point
    assert w16.flags[-4:] == ("--dasc-plan", "P", "--dasc-pool-slots", str(w16.ckpt_slots))
    assert w16i8.flags[-3] == "P8" and w16i8.int8 and w16i8.capacity > i8.capacity > w16.capacity - 40
    # under load the M' = 40 native slots run the 8 requests: Dense keeps 64 - 40, the pool arms their pools
    assert [a.capacity_under_load for a in arms.values()] == [24, 83, w16.ckpt_slots, w16i8.ckpt_slots]


@pytest.mark.parametrize("native,pool,reserve,want", [
    (56, 0, 40, 16),     # Dense M = 56, R = 8, extra_buffer + overlap (k = 5): 56 - 40
    (40, 55, 40, 55),    # SGLang INT8 at M' = 40 with 55 pool slots: its pool alone
    (40, 41, 40, 41),    # dasc-nr-w16 at M' = 40 with 41 compressed slots: not 81
    (48, 41, 40, 49),    # a dasc arm given 8 native slots beyond k R keeps them too
    (40, 0, 40, 0), (30, 0, 40, 0),
])
def test_capacity_under_load_hand_numbers(native, pool, reserve, want):
    assert sizing.capacity_under_load(native_slots=native, pool_slots=pool, running_reserve=reserve) == want


@pytest.mark.parametrize("kw", [dict(native_slots=-1), dict(pool_slots=True), dict(running_reserve=1.5)])
def test_capacity_under_load_refuses_non_counts(kw):
    args = {"native_slots": 40, "pool_slots": 1, "running_reserve": 40, **kw}
    with pytest.raises(DascInputError, match=f"{next(iter(kw))}: expected a whole number of slots >= 0"):
        sizing.capacity_under_load(**args)


def test_dasc_size_prints_capacity_under_load(kimi):
    """M = 56, R = 8 (the H200 chat runs of 2026-12-01): w16's 81 cached states are 41 under load, fewer than
    INT8's 55; every hit of those runs came from the compressed pool."""
    r = runner.invoke(app, ["size", str(kimi["w16"]), "--dense-slots", "56", "--max-running-requests", "8",
                            "--pair-plan", str(kimi["w16-int8"])])
    assert r.exit_code == 0, r.output
    line = {ln.split(":")[0].strip(): ln for ln in r.output.splitlines() if ": native" in ln}
    assert "capacity     56 (1.00x Dense), under load     16 (1.00x Dense)" in line["dense"]
    assert "capacity     55 (0.98x Dense), under load     55 (3.44x Dense)" in line["int8"]
    assert "capacity     81 (1.45x Dense), under load     41 (2.56x Dense)" in line["dasc-nr-w16"]
    assert "capacity    169 (3.02x Dense), under load    129 (8.06x Dense)" in line["dasc-nr-w16-int8"]
    assert "the M' = k*R native slots are the running requests' reservation" in r.output
    # the budget in the units and precision of the sizing refusals (schema.units.fmt_bytes): 57 x 43,417,600 B
    assert "budget 2,474,803,200 B (2.30 GiB) per rank = Dense's 56 + 1 native slots x 43,417,600 B" in r.output
    assert "2026-12-01-h200-chat-six-arms" in sizing.CAPACITY_LEGEND
    j = runner.invoke(app, ["size", str(kimi["w16"]), "--dense-slots", "56", "--max-running-requests", "8", "--json"])
    got = {a["arm"]: (a["capacity"], a["capacity_under_load"]) for a in json.loads(j.output)}
    assert got == {"dense": (56, 16), "int8": (55, 55), "dasc-nr-w16": (81, 41), "dasc-nr-w16-int8": (169, 129)}
    assert size_report._times(41, 0) == "Dense 0"      # Dense at M = k R keeps nothing under load
    doc = (ROOT / "docs" / "cli.md").read_text().split("### `dasc size --json` keys")[1].split("\n## ")[0]
    keys = {k for a in json.loads(j.output) for k in a}
    assert not sorted(k for k in keys if f"`{k}`" not in doc), "undocumented dasc size --json keys"


def test_budget_in_bytes_fixes_m_and_charges_denses_allocation(kimi):
    plan = load_plan(kimi["w16"])
    by_m = sizing.size_arms(plan, max_running_requests=8, dense_slots=64)
    for b in (65 * B_DENSE, 66 * B_DENSE - 1):
        assert sizing.size_arms(plan, max_running_requests=8, budget_bytes=b) == by_m
    assert size_report.parse_bytes("2GiB") == 2 ** 31 and size_report.parse_bytes("1.5 GB") == 1_500_000_000
    assert size_report.parse_bytes("2822144000") == 65 * B_DENSE
    assert size_report.parse_bytes("1e9") == size_report.parse_bytes("1GB") == 10 ** 9
    assert size_report.parse_bytes("8GiB") == 8 * 2 ** 30 and size_report.parse_bytes("2.5e3") == 2500
    assert size_report.parse_bytes(str(2 ** 50)) == 2 ** 50 == size_report.parse_bytes("1PiB")
    assert size_report.parse_bytes("16tib") == 16 * 2 ** 40 and size_report.parse_bytes("2 TB") == 2 * 10 ** 12
    assert size_report.parse_bytes("16gb") == 16 * 10 ** 9 and size_report.parse_bytes("2kB") == 2000


@pytest.mark.parametrize("text,match", [
    ("1.5", "is 1.5 bytes, not a whole number; give whole bytes such as 2"), ("1e-3", "expected a size >= 1 byte"),
    ("1e-999", "expected a size >= 1 byte"),        # it printed 0.000... with a thousand zeros
    ("1125899906842623.5", "is 1125899906842623.5 bytes, not a whole number; give whole bytes such as "
                           "1125899906842624"),
    ("1125899906842624.5", "<= 2\\*\\*50 bytes"),     # no whole number in range to suggest
    ("1.3KiB", "is 1331.2 bytes, not a whole number; give whole bytes such as 1332"), ("0", "expected a size >= 1 byte"),
    (str(2 ** 50 + 1), "<= 2\\*\\*50 bytes"), ("2e15", "<= 2\\*\\*50 bytes"), ("1e999", "<= 2\\*\\*50"),
    ("1e9999", "expected a positive size"), ("8 parsecs", "expected a positive size"), ("-5", "expected a positive"),
    ("2PiB", "<= 2\\*\\*50 bytes"), ("16XB", "units B, KB, MB, GB, TB, PB or KiB, MiB, GiB, TiB, PiB"),
    ("16Gb", "'16Gb' reads as Gbits \\(a lower-case b\\); write 16GB for bytes"),
    ("2 Gib", "reads as Gibits .*write 2GiB for bytes"), ("8Mb", "write 8MB"),
])
def test_budget_text_is_a_whole_bounded_byte_count(text, match):
    with pytest.raises(DascInputError, match=match) as e:
        size_report.parse_bytes(text)
    assert "\n" not in str(e.value) and str(e.value).startswith("--budget")


def test_larger_w_max_gives_more_capacity(kimi):
    caps = [sizing.size_arms(load_plan(kimi[n]), max_running_requests=8, dense_slots=64, arms=["dasc"])[0].capacity
            for n in ("w16", "w64")]
    assert caps[0] < caps[1]


@pytest.mark.parametrize("kw,match", [
    (dict(max_running_requests=8, dense_slots=39), r"M >= 40"),
    (dict(max_running_requests=8), "exactly one of"),
    (dict(max_running_requests=8, dense_slots=64, budget_bytes=10 ** 10), "exactly one of"),
    (dict(max_running_requests=0, dense_slots=64), "max-running-requests"),
    (dict(max_running_requests=8, dense_slots=40), "no SGLang INT8 checkpoint slot fits"),
    (dict(max_running_requests=8, dense_slots=64, strategy="auto"), "mamba-radix-cache-strategy"),
    (dict(max_running_requests=8, budget_bytes=B_DENSE), "holds no dense slot"),
    (dict(max_running_requests=8, dense_slots=-1), r"--dense-slots: expected an integer >= 1 and <= 2147483648"),
    (dict(max_running_requests=8, dense_slots=2 ** 31 + 1), r"--dense-slots: expected an integer >= 1"),
    (dict(max_running_requests=2 ** 31 + 1, dense_slots=64), r"--max-running-requests: expected an integer >= 1"),
    (dict(max_running_requests=8, dense_slots=64.0), r"--dense-slots: expected an integer"),
    (dict(max_running_requests=8, budget_bytes=2 ** 50 + 1), r"--budget: expected an integer >= 1"),
])
def test_bad_sizes_are_one_line_errors(kimi, kw, match):
    with pytest.raises(DascInputError, match=match) as e:
        sizing.size_arms(load_plan(kimi["w16"]), **kw)
    assert "\n" not in str(e.value)


# --- the CLI ------------------------------------------------------------------------------------

runner = CliRunner()


def test_dasc_size_prints_every_arm_and_json(kimi):
    r = runner.invoke(app, ["size", str(kimi["w16"]), "--dense-slots", "64", "--max-running-requests", "8",
                            "--pair-plan", str(kimi["w16-int8"])])
    assert r.exit_code == 0, r.output
    assert "calibrated to published statistics" in r.output
    for arm in ("dense", "int8", "dasc-nr-w16", "dasc-nr-w16-int8"):
        assert any(ln.strip().startswith(f"{arm}: native") for ln in r.output.splitlines()), arm
    assert f"--dasc-plan {kimi['w16-int8']} --dasc-pool-slots" in r.output
    assert "--int8-mamba-ckpt-size 83" in r.output and "{plan}" not in r.output
    # one legend says what capacity counts per arm: int8 its pool alone (83 here), dasc native + pool,
    # and what each keeps under load
    assert r.output.count(sizing.CAPACITY_LEGEND) == 1
    assert "int8 its INT8 pool alone (SGLang commits every cached state there)" in sizing.CAPACITY_LEGEND
    assert "dasc arms native + compressed pool" in sizing.CAPACITY_LEGEND
    arms = {a.arm: a for a in sizing.size_arms(load_plan(kimi["w16"]), max_running_requests=8, dense_slots=64)}
    assert arms["int8"].capacity == arms["int8"].ckpt_slots == 83
    assert arms["dasc-nr-w16"].capacity == arms["dasc-nr-w16"].native_slots + arms["dasc-nr-w16"].ckpt_slots
    j = runner.invoke(app, ["size", str(kimi["w16"]), "--budget", str(65 * B_DENSE), "--max-running-requests", "8",
                            "--json"])
    assert j.exit_code == 0
    got = json.loads(j.output)
    assert [a["arm"] for a in got] == ["dense", "int8", "dasc-nr-w16", "dasc-nr-w16-int8"]
    assert got[3]["plan"] is None and "{plan}" in got[3]["flags"]


def test_dasc_size_charges_the_refresh_slots_it_is_given(kimi):
    """``--refresh-slots B`` (issue 15 item 2): B dense slots of scratch come out of the compressed pool."""
    def wr_arm(*extra):
        r = runner.invoke(app, ["size", str(kimi["w16-wr"]), "--dense-slots", "56", "--max-running-requests", "8",
                                "--json", *extra])
        assert r.exit_code == 0, r.output
        return next(a for a in json.loads(r.output) if a["arm"] == "dasc-wr-w16")

    two, default = wr_arm("--refresh-slots", "2"), wr_arm()
    b_c = two["bytes_ckpt_slot"]
    assert two["flags"][-2:] == ["--dasc-refresh-slots", "2"] and default["flags"][-1] == "8"
    assert two["ckpt_slots"] == ((56 - 40) * B_DENSE - 2 * B_DENSE) // b_c - 1 == 35    # the 2026-12-01 arms.json
    assert default["ckpt_slots"] == ((56 - 40) * B_DENSE - 8 * B_DENSE) // b_c - 1 == 20
    assert two["used_bytes"] <= two["budget_bytes"] == 57 * B_DENSE
    # B scratch slots hold no cached state: under load the arm keeps its pool alone
    assert (two["capacity"], two["capacity_under_load"]) == (75, 35)
    for bad, match in (("0", "--refresh-slots: expected an integer >= 1"), ("99999999999", "<= 2147483648")):
        r = runner.invoke(app, ["size", str(kimi["w16-wr"]), "--dense-slots", "56", "--max-running-requests", "8",
                                "--refresh-slots", bad])
        assert r.exit_code == 2 and match in r.output, r.output


@pytest.mark.parametrize("extra,b,note", [
    ([], 4, True),                          # the default 8 windows of 512 tokens do not fit a 2,048-token chunk
    (["--refresh-slots", "16"], 4, True),
    (["--refresh-slots", "3"], 3, False),   # under the cap: as given, no note
])
def test_dasc_size_charges_refresh_slots_as_the_server_caps_them(kimi, extra, b, note):
    """A w_max 512 dasc-wr plan replays 512-token windows; SGLang's smallest automatic prefill chunk (2,048 tokens,
    which ``dasc size`` assumes when it prints no chunk) holds 4, and the server caps B there
    (``wr_scratch.check_refresh_startup``). ``dasc size`` charges and flags that B, so a server started with its flags
    builds the pool it printed on any GPU (it charged 8 and flagged 8 while the server ran 4: a larger pool than
    Dense's memory)."""
    from dasc_runtime.wr_scratch import check_refresh_startup

    plan = load_plan(kimi["w512-wr"])
    assert plan.refresh.w_replay_cap == 512
    r = runner.invoke(app, ["size", str(kimi["w512-wr"]), "--dense-slots", "56", "--max-running-requests", "8",
                            "--json", *extra])
    assert r.exit_code == 0, r.output
    arm = next(a for a in json.loads(r.stdout) if a["arm"] == "dasc-wr-w512")
    assert arm["flags"][-2:] == ["--dasc-refresh-slots", str(b)]
    assert arm["ckpt_slots"] == ((56 - 40) * B_DENSE - b * B_DENSE) // arm["bytes_ckpt_slot"] - 1
    assert ("is charged and flagged 4 scratch slots" in r.stderr) == note, r.stderr
    given = None if not extra else int(extra[1])
    # the server, with the flags dasc size printed, on the smallest and on a larger automatic chunk: the same B
    for chunk in (2048, 8192):
        assert check_refresh_startup(plan, refresh_slots=b, context_len=65536, chunked_prefill_size=chunk) == b
    # and with no flag at all it would have run the cap on a 2,048-token chunk, 8 on an 8,192-token one
    assert check_refresh_startup(plan, refresh_slots=given, context_len=65536, chunked_prefill_size=2048) == b
    # python -m dasc_runtime.sizing charges the same B
    mm = sizing.plan_matched_memory(plan, dense_slots=56, native_slots=40, refresh_slots=given)
    assert (mm.refresh_slots, mm.compressed_slots) == (b, arm["ckpt_slots"])


@pytest.mark.parametrize("main,pair,differs", [
    # a wr plan paired with an nr INT8 plan: the runtime refuses --dasc-refresh-slots for the nr one
    ("w16-wr", "w16-int8", "its load_policy nr ({main}: wr) differs; compile the same model with --wmax 16 "
                           "--load-policy wr --int8"),
    # the reverse: an nr arm serving a wr plan, its refresh scratch slots not charged
    ("w16", "w16-wr-int8", "its load_policy wr ({main}: nr) differs; compile the same model with --wmax 16 --int8"),
    # a TP plan: named as TP size / balance, before any byte comparison
    ("w16-tp2", "w16-int8", "its tp_size 1 ({main}: 2), balance off ({main}: storage) differ; compile the same "
                            "model with --wmax 16 --tp 2 --balance storage --int8"),
])
def test_pair_plan_must_match_load_policy_and_tp_layout(kimi, main, pair, differs):
    r = runner.invoke(app, ["size", str(kimi[main]), "--dense-slots", "64", "--max-running-requests", "8",
                            "--pair-plan", str(kimi[pair])])
    assert r.exit_code == 2
    assert r.output.strip() == f"error: --pair-plan {kimi[pair]}: " + differs.format(main=kimi[main])


@pytest.mark.parametrize("main,pair,flags", [
    ("w16", "w16-int8", "--wmax 16 --int8"),
    ("w16-int8", "w16", "--wmax 16 --no-int8"),
    ("w16-wr", "w16-wr-int8", "--wmax 16 --load-policy wr --int8"),
    ("w16-tp2", "w16-int8-tp2", "--wmax 16 --tp 2 --balance storage --int8"),
])
def test_pair_plan_hint_names_every_compile_flag_and_following_it_works(kimi, main, pair, flags):
    args = ["size", str(kimi[main]), "--dense-slots", "64", "--max-running-requests", "8"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1] == (f"{{plan}}: compile the same model with {flags} and pass it as --pair-plan "
                                         f"to check it")
    assert size_report.pair_compile_flags(load_plan(kimi[main])) == flags
    ok = runner.invoke(app, args + ["--pair-plan", str(kimi[pair]), "--json"])
    assert ok.exit_code == 0, ok.output
    paired = [a for a in json.loads(ok.stdout) if a["kind"] == "dasc" and a["plan"] == str(kimi[pair])]
    assert len(paired) == 1 and ("--dasc-refresh-slots" in paired[0]["flags"]) == (main == "w16-wr")


@pytest.mark.parametrize("name,extra,pool,tail", [
    ("w16-wr", [], 20, " --dasc-refresh-slots 8"),
    ("w16-wr", ["--refresh-slots", "2"], 35, " --dasc-refresh-slots 2"),
    ("w16-wr-int8", [], 64, " --dasc-refresh-slots 8"),
    ("w16", [], 41, ""),
])
def test_sizing_module_main_agrees_with_dasc_size(kimi, capsys, name, extra, pool, tail):
    """``python -m dasc_runtime.sizing`` charges dasc-wr's refresh scratch slots as ``dasc size`` does: at M = 56,
    M' = 40 (R = 8) the same pool and flags (it printed the nr pool, 41, for a wr plan)."""
    assert sizing.main(["--plan", str(kimi[name]), "--dense-slots", "56", "--native-slots", "40", *extra]) == 0
    out = capsys.readouterr().out
    assert (f"dasc arm:  --max-mamba-cache-size 40 --dasc-pool-slots {pool}{tail} --dasc-plan {kimi[name]}   "
            f"(capacity {40 + pool} ") in out                 # the flags start dasc: without --dasc-plan it is off
    r = runner.invoke(app, ["size", str(kimi[name]), "--dense-slots", "56", "--max-running-requests", "8", "--json",
                            *extra])
    arm = next(a for a in json.loads(r.stdout) if a["kind"] == "dasc" and a["plan"] == str(kimi[name]))
    assert arm["ckpt_slots"] == pool and " ".join(arm["flags"]).endswith(f"--dasc-pool-slots {pool}{tail}")
    assert f"used={arm['used_bytes']} B" in out


def test_sizing_module_main_refuses_refresh_slots_for_an_nr_plan(kimi, capsys):
    assert sizing.main(["--plan", str(kimi["w16"]), "--dense-slots", "56", "--native-slots", "40",
                        "--refresh-slots", "2"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err == (
        "error: --refresh-slots 2: this plan runs no dasc-wr refresh (load_policy: nr, w_replay_cap 16), so it has no "
        "scratch slots to size; leave --refresh-slots out, or size a plan compiled with --load-policy wr that omits "
        "units\n")


def test_budget_hint_is_the_smallest_for_every_arm_at_once(kimi):
    """--budget 1 used to say 86835200 bytes (one dense slot), that one 260505600 (M' slots), that one 303923200
    (one INT8 pool slot): every refusal now names the last, the smallest with which every arm fits."""
    def err(*args):
        r = runner.invoke(app, ["size", str(kimi["w16"]), "--max-running-requests", "1", *args])
        assert r.exit_code == 2
        return r.output.strip()

    fits = "a --budget of at least 303923200 bytes (290 MiB) fits every arm"
    assert err("--budget", "1") == ("error: --budget 1 byte holds no dense slot: a slot takes 41.41 MiB (43,417,600 "
                                    f"bytes) on one TP rank, and one padding slot is reserved; {fits}")
    assert err("--budget", "86835200") == (
        "error: --budget 82.81 MiB (86,835,200 bytes) holds Dense M=1 native slots of 41.41 MiB (43,417,600 bytes) on "
        "one TP rank (and one padding slot); SGLang runs at most floor(M / 5) requests with extra_buffer, so --max-running-requests 1 needs M >= 5 for Dense alone; "
        f"{fits}")
    assert err("--budget", "303923199") == (
        "error: no SGLang INT8 checkpoint slot fits: Dense's M=5 slots leave 0 bytes beside the M'=5 native slots, "
        f"one SGLang INT8 slot needs 11.72 MiB (12,288,000 bytes), plus one reserved slot; {fits}, or lower --max-running-requests")
    assert err("--dense-slots", "3").endswith("needs M >= 5 for Dense alone; --dense-slots 6 or more fits every arm")
    for name, need in (("w16", 303923200), ("w16-wr", 651264000)):    # dasc-wr: 8 refresh scratch slots more
        plan = load_plan(kimi[name])
        assert sizing.size_arms(plan, max_running_requests=1, budget_bytes=need)
        with pytest.raises(DascInputError, match=f"a --budget of at least {need} bytes"):
            sizing.size_arms(plan, max_running_requests=1, budget_bytes=need - 1)


def test_running_requests_no_budget_can_hold_says_lower_them(kimi):
    """R = 2**31 needs more than the 2**50-byte bound on --budget: the hint names the largest R instead."""
    def err(*args):
        r = runner.invoke(app, ["size", str(kimi["w16"]), "--max-running-requests", "2147483648", *args])
        assert r.exit_code == 2
        return r.output.strip()

    assert err("--budget", "1GiB").endswith(
        "needs M >= 10737418240 for Dense alone; no --budget up to 2**50 bytes runs --max-running-requests 2147483648 in every arm: "
        "lower --max-running-requests to at most 5186375 (4 with --budget 1073741824)")
    assert err("--budget", "1").endswith("and one padding slot is reserved; no --budget up to 2**50 bytes runs "
                                         "--max-running-requests 2147483648 in every arm: lower --max-running-requests "
                                         "to at most 5186375")
    assert err("--dense-slots", "64").endswith("lower --max-running-requests to at most 429496729 (12 with "
                                               "--dense-slots 64)")
    plan = load_plan(kimi["w16"])
    assert sizing.size_arms(plan, max_running_requests=5186375, budget_bytes=sizing.MAX_BUDGET_BYTES)
    assert sizing.size_arms(plan, max_running_requests=4, budget_bytes=2 ** 30)
    with pytest.raises(DascInputError, match="lower --max-running-requests to at most 5186375 "):
        sizing.size_arms(plan, max_running_requests=5186376, budget_bytes=sizing.MAX_BUDGET_BYTES)


@pytest.mark.parametrize("args,match", [
    (["--dense-slots", "64", "--max-running-requests", "8", "--refresh-slots", "2"],
     "--refresh-slots 2: this plan runs no dasc-wr refresh (load_policy: nr, w_replay_cap 16)"),
    (["--dense-slots", "64"], "max-running-requests R is required"),
    (["--dense-slots", "20", "--max-running-requests", "8"], "needs M >= 40"),
    (["--budget", "lots", "--max-running-requests", "8"], "--budget: expected a positive size"),
    (["--budget", "lots"], "--budget: expected a positive size"),     # the bad value before the missing R
    (["--dense-slots", "64", "--max-running-requests", "8", "--mamba-radix-cache-strategy", "nope"], "expected one of"),
    (["--dense-slots", "64", "--max-running-requests", "8", "--pair-plan", "W64"], "--pair-plan"),
    (["--dense-slots", "64", "--max-running-requests", "8", "--pair-plan", "no-such-plan"],
     "error: --pair-plan no-such-plan: dasc plan not found"),
    (["--dense-slots", "x", "--max-running-requests", "8"], "dense-slots"),
    (["--dense-slots", "-1", "--max-running-requests", "8"], "--dense-slots: expected an integer >= 1"),
    (["--dense-slots", "99999999999999999999", "--max-running-requests", "8"], "<= 2147483648"),
    (["--budget", "1e60", "--max-running-requests", "8"], "<= 2**50 bytes"),
    (["--budget", "0.5", "--max-running-requests", "8"], "expected a size >= 1 byte"),
])
def test_dasc_size_bad_input_is_one_error_line_exit_2(kimi, args, match):
    args = [str(kimi["w64"]) if a == "W64" else a for a in args]
    r = subprocess.run([sys.executable, "-c", "from dasc_compile.cli import main; main()", "size", str(kimi["w16"]),
                        *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and match in lines[0], r.stderr
    assert r.stdout == ""


def test_dasc_size_missing_plan_exit_2(tmp_path):
    r = runner.invoke(app, ["size", str(tmp_path / "nope"), "--dense-slots", "64", "--max-running-requests", "8"])
    assert r.exit_code == 2 and "error:" in r.output


def test_tp_plans_get_the_tp_size_flag_and_the_overlap_flag_the_rules_add(kimi, capsys):
    """A fresh user's `dasc size` on a TP-8 plan printed no --tp-size (the runtime refuses any other TP size),
    and `python -m dasc_runtime.sizing` warned that it added --disable-overlap-schedule to a storage-balanced TP
    plan but printed neither line with it."""
    r = runner.invoke(app, ["size", str(kimi["w16-tp2"]), "--dense-slots", "56", "--max-running-requests", "8",
                            "--json"])
    assert r.exit_code == 0, r.output
    for arm in json.loads(r.stdout):
        flags = arm["flags"]
        assert flags[flags.index("--tp-size") + 1] == "2" and flags.count("--tp-size") == 1, flags
        assert "--disable-overlap-schedule" in flags
    tp1 = runner.invoke(app, ["size", str(kimi["w16"]), "--dense-slots", "56", "--max-running-requests", "8", "--json"])
    assert all("--tp-size" not in a["flags"] for a in json.loads(tp1.stdout))
    assert sizing.main(["--plan", str(kimi["w16-tp2"]), "--dense-slots", "56", "--native-slots", "40"]) == 0
    cap = capsys.readouterr()
    assert "added --disable-overlap-schedule" in cap.err
    lines = [ln for ln in cap.out.splitlines() if ln.startswith(("Dense arm:", "dasc arm:"))]
    assert len(lines) == 2 and all("--disable-overlap-schedule" in ln and "--tp-size 2" in ln for ln in lines)


def test_the_tp_refusal_names_flags_that_exist(kimi):
    """It said "recompile with --tp-size N", an option dasc compile does not have (its flag is --tp)."""
    from dasc_compile.errors import DascInputError
    from dasc_compile.schema import load_plan
    from dasc_runtime.rank_layout import build_rank_layout

    with pytest.raises(DascInputError) as exc:
        build_rank_layout(load_plan(kimi["w16-tp2"]), tp_size=4, tp_rank=0)
    assert "launch with --tp-size 2, or compile a plan for this server with dasc compile --tp 4" in str(exc.value)


@pytest.mark.parametrize("w_max,budget,b,refuses", [
    (16, 400 * 2**20, 8, False),     # 16-token windows: the default 8 fit a 2,048-token chunk
    (512, 300 * 2**20, 4, False),    # 2,048 // 512: it said 8 (347,340,800 bytes) and "would refuse to start"
    (16, 300 * 2**20, 8, True),      # 8 x 43,417,600 B = 347,340,800 B > 300 MiB
])
def test_compile_pool_budget_warning_charges_the_slots_dasc_size_flags(tmp_path, w_max, budget, b, refuses):
    """``dasc compile --load-policy wr --pool-budget``: the warning charges the B scratch slots ``dasc size`` flags
    for the plan (capped by the prefill chunk), so its usable slots and its refusal agree with what a server started
    from ``dasc size``'s flags builds."""
    from dasc_compile.plan_checks import plan_warnings
    from dasc_compile.schema import usable_slots

    plan, _ = compile_plan(KIMI, Policy(w_max=w_max, load_policy="wr", pool_budget_bytes=budget), tmp_path / "p",
                           with_kernels=False)
    (line,) = [w for w in plan_warnings(plan) if w.startswith("pool_budget_bytes")]
    left = usable_slots(max(budget - b * B_DENSE, 0), plan.tp.bottleneck_bytes_per_slot)
    assert (f"{b} slots ({b * B_DENSE:,} bytes) with the --dasc-refresh-slots {b} dasc size prints, leaving "
            f"{max(left, 0)} usable compressed slots") in line
    assert ("would refuse to start" in line) == refuses == (left < 1)
    r = runner.invoke(app, ["size", str(tmp_path / "p"), "--dense-slots", "56", "--max-running-requests", "8",
                            "--json"])
    assert r.exit_code == 0, r.output
    assert next(a for a in json.loads(r.stdout) if a["kind"] == "dasc")["flags"][-1] == str(b)


def test_sizing_module_main_names_each_bad_count(kimi, capsys):
    """``python -m dasc_runtime.sizing``: a negative --scratch-slots inflated the pool (scratch -1,359,257,600 B);
    --dense-slots 0 was blamed on --native-slots."""
    for args, flag in ((["--dense-slots", "100", "--native-slots", "40", "--scratch-slots", "-1000"], "--scratch-slots"),
                       (["--dense-slots", "0", "--native-slots", "40"], "--dense-slots"),
                       (["--dense-slots", "56", "--native-slots", "0"], "--native-slots")):
        assert sizing.main(["--plan", str(kimi["w16"]), *args]) == 2
        cap = capsys.readouterr()
        assert cap.out == "" and cap.err.startswith(f"error: {flag}: expected an integer >= ") and \
            cap.err.count("\n") == 1, cap.err


def test_sizing_module_main_refuses_fewer_native_slots_than_one_request_needs(kimi, capsys):
    """``--native-slots 1`` printed ``--max-mamba-cache-size 1``, a cache SGLang refuses ("too small to serve any
    requests"): extra_buffer with the overlap scheduler reserves k = 5 native slots per running request."""
    for args, flag, n in ((["--dense-slots", "394", "--native-slots", "1"], "--native-slots", 1),
                          (["--dense-slots", "4", "--native-slots", "5"], "--dense-slots", 4)):
        assert sizing.main(["--plan", str(kimi["w16"]), *args]) == 2
        cap = capsys.readouterr()
        assert cap.out == "" and cap.err == (
            f"error: {flag} {n}: SGLang reserves k = 5 native slots per running request (extra_buffer), so fewer "
            f"than 5 serves no request; give at least 5 (k R for R running)\n")
    assert sizing.main(["--plan", str(kimi["w16"]), "--dense-slots", "56", "--native-slots", "5"]) == 0
    assert "--max-mamba-cache-size 5 " in capsys.readouterr().out



def test_smallest_budget_is_the_least_that_holds_the_slots():
    """usable_slots' inverse, which every "holds no usable slot" refusal suggests: (n + 1) b holds n usable slots
    (slot 0 reserved), one byte less holds n - 1."""
    from dasc_compile.schema.units import smallest_budget, usable_slots

    assert smallest_budget(384) == 768 and smallest_budget(43417600, usable=40) == 41 * 43417600
    for b in (1, 7, 384, 43417600):
        for n in (1, 2, 55):
            assert usable_slots(smallest_budget(b, n), b) == n and usable_slots(smallest_budget(b, n) - 1, b) == n - 1
    with pytest.raises(ValueError):
        smallest_budget(0)


def test_byte_counts_in_sizing_messages_read_in_units_and_whole():
    """A refusal's byte counts: binary units first (as plan_views.fmt_bytes writes them), then the whole count with
    thousands separated; under 1 KiB the count alone, singular at 1."""
    assert byte_count(43417600) == "41.41 MiB (43,417,600 bytes)"      # 43417600 / 2**20 = 41.406...
    assert byte_count(1610612736) == "1.50 GiB (1,610,612,736 bytes)"
    assert byte_count(1024) == "1.00 KiB (1,024 bytes)"
    assert byte_count(160 * 2**20) == "160 MiB (167,772,160 bytes)"
    assert (byte_count(1), byte_count(0), byte_count(1023)) == ("1 byte", "0 bytes", "1023 bytes")
    # a unit's 1000-1023 stay in it, whole; what rounds to 1024 moves up (it printed "1e+03 MiB", "1.02e+03 KiB")
    assert byte_count(1000 * 2**20) == "1000 MiB (1,048,576,000 bytes)"
    assert byte_count(1048575) == "1.00 MiB (1,048,575 bytes)"
    assert byte_count(1047552) == "1023 KiB (1,047,552 bytes)"
    # a value to pass back as a flag: whole first, so it pastes
    assert (flag_bytes(1823539200), flag_bytes(768)) == ("1823539200 bytes (1.70 GiB)", "768 bytes")

def test_no_slot_fits_never_names_negative_bytes(kimi):
    """B = 20 scratch slots against the 16 dense slots beside M' = 40: the error said "leave -173670400 bytes"."""
    r = runner.invoke(app, ["size", str(kimi["w16-wr"]), "--dense-slots", "56", "--max-running-requests", "8",
                            "--refresh-slots", "20"])
    assert r.exit_code == 2 and len(r.output.splitlines()) == 1, r.output
    assert (f"no dasc-wr checkpoint slot fits: Dense's M=56 slots leave {byte_count(16 * B_DENSE)} beside the M'=40 "
            f"native slots, {byte_count(4 * B_DENSE)} short of the {byte_count(20 * B_DENSE)} of scratch alone, one "
            "dasc-wr slot needs") \
        in r.output, r.output
    assert not re.search(r"-[0-9]", r.output)


@pytest.mark.parametrize("args,flag", [
    (["--dense-slots", "abc", "--native-slots", "40"], "--dense-slots"),
    (["--dense-slots", "56", "--native-slots", "40", "--refresh-slots", "1.5"], "--refresh-slots"),
    (["--dense-slots", "56"], "--native-slots"),
])
def test_sizing_module_main_bad_value_is_one_line(kimi, capsys, args, flag):
    """argparse printed its usage block above the error; the package's tools print the one ``error:`` line."""
    with pytest.raises(SystemExit) as info:
        sizing.main(["--plan", str(kimi["w16"]), *args])
    cap = capsys.readouterr()
    assert info.value.code == 2 and cap.out == "" and cap.err.startswith("error: ") and flag in cap.err
    assert cap.err.count("\n") == 1, cap.err


def test_dasc_size_pool_budget_warning_follows_its_refresh_slots(tmp_path):
    """The compile-time warning charged the default B even when ``dasc size --refresh-slots 1`` sized for one: it
    said "8 slots ... would refuse to start" beside flags that start (300 MiB holds 1 scratch slot and 15 slots)."""
    from dasc_compile.schema import usable_slots

    budget = 300 * 2**20
    plan, _ = compile_plan(KIMI, Policy(w_max=16, load_policy="wr", pool_budget_bytes=budget), tmp_path / "p",
                           with_kernels=False)
    r = runner.invoke(app, ["size", str(tmp_path / "p"), "--dense-slots", "56", "--max-running-requests", "8",
                            "--refresh-slots", "1"])
    assert r.exit_code == 0, r.output
    left = usable_slots(budget - B_DENSE, plan.tp.bottleneck_bytes_per_slot)
    assert left == 15
    assert (f"1 slot ({B_DENSE:,} bytes) with the --dasc-refresh-slots 1 dasc size prints, leaving 15 usable compressed "
            f"slots") in r.stderr and "would refuse" not in r.stderr, r.stderr


def test_no_fit_errors_name_the_flags_to_change(kimi, capsys):
    """``python -m dasc_runtime.sizing``'s "no compressed slot fits" named no flag; ``dasc size`` suggested lowering
    --refresh-slots for an arm that charges no scratch (the INT8 pool)."""
    assert sizing.main(["--plan", str(kimi["w16-wr"]), "--dense-slots", "56", "--native-slots", "8",
                        "--refresh-slots", "50"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no compressed slot fits: ") and err.count("\n") == 1
    assert err.rstrip().endswith("raise --dense-slots or lower --native-slots (or the scratch: --refresh-slots, "
                                 "--scratch-slots)")
    # Dense's M = 40 leaves nothing beside M' = 40: the INT8 arm (no scratch) is the first that fails
    r = runner.invoke(app, ["size", str(kimi["w16-wr"]), "--dense-slots", "40", "--max-running-requests", "8"])
    assert r.exit_code == 2 and "no SGLang INT8 checkpoint slot fits" in r.output, r.output
    assert "or --refresh-slots" not in r.output


def test_dasc_size_writes_every_count_with_thousands_separators(kimi):
    """M = 2000: the slot counts read like the pool's and the budget's ("native 2,000 ... pool 5,174 x"), not
    "capacity 5214" beside "pool 5,174" (a fresh-user trial found the two styles side by side)."""
    r = runner.invoke(app, ["size", str(kimi["w16"]), "--dense-slots", "2000", "--max-running-requests", "8"])
    assert r.exit_code == 0, r.output
    assert "Dense's 2,000 + 1 native slots" in r.output
    line = {ln.split(":")[0].strip(): ln for ln in r.output.splitlines() if ": native" in ln}
    assert "native  2,000," in line["dense"]
    assert "capacity  2,000 (1.00x Dense), under load  1,960 (1.00x Dense)" in line["dense"]
    assert "capacity  6,924 (3.46x Dense), under load  6,924 (3.53x Dense)" in line["int8"]
    assert "--int8-mamba-ckpt-size 6924" in r.output           # flags stay as SGLang reads them
