"""Matched-memory arms of the serving benchmark (benchmarks/serving_arms.py over dasc_runtime.sizing,
paper §5.3, App. C.1). More sizing tests against SGLang's own estimates: tests/runtime/test_sizing.py.

Plans are compiled by the real compiler from the bundled reference checkpoints (config + decay
tensors only, no kernels). The INT8 slot bytes are checked against SGLang 0.5.17 itself: the state
shapes come from SGLang's own model configs (``KimiLinearConfig`` / ``Qwen3_5Config``
``.mamba2_cache_params`` with the attention-TP size forced), the bytes from
``MambaCheckpointPool.estimate_mem_usage_bytes`` called with the same arguments
``maybe_init_int8_mamba_checkpoint_pool`` passes it.

Hand numbers, Kimi-Linear-48B-A3B at TP=1 (20 KDA layers, 32 heads, d_k = d_v = 128, kernel 4,
conv channels 3 * 32 * 128 = 12288, temporal float32, conv bfloat16):
  b_dense = 20 * (32*128*128*4 + 3*12288*2)         = 43,417,600 bytes
  b_int8  = 20*32*128*128 + 20*32*128*4 + 1,474,560 = 12,288,000 bytes
  M = 48, M' = 40: budget = 49 * b_dense = 2,127,462,400; INT8 C = floor(8 b_dense / b_int8) - 1 = 27.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from benchmarks import serving_arms as sa
from dasc_compile.compiler import compile_plan
from dasc_compile.errors import DascInputError
from dasc_compile.policy import Policy
from dasc_compile.schema import load_plan
from dasc_runtime.sizing import int8_bytes_per_slot, plan_matched_memory

ROOT = Path(__file__).resolve().parents[2]

KIMI = ROOT / "plans" / "reference" / "kimi-linear-48b-a3b"
QWEN35 = ROOT / "plans" / "reference" / "qwen3.5-27b"
M, M_NATIVE, R = 48, 40, 8          # M' = 5 R native slots (extra_buffer with overlap)
COMMON = ["--max-running-requests", "8", "--mamba-radix-cache-strategy", "extra_buffer"]
KIMI_B_DENSE = 20 * (32 * 128 * 128 * 4 + 3 * 12288 * 2)
KIMI_B_INT8 = 20 * 32 * 128 * 128 + 20 * 32 * 128 * 4 + 1_474_560
# the DEFAULT_ARMS dasc plans, (w_max, int8)
DASC_PLANS = [(512, False), (128, False), (64, False), (16, False), (128, True)]


@pytest.fixture(scope="module")
def kimi_plans(tmp_path_factory) -> Path:
    """Kimi TP=1 plans for every DEFAULT_ARMS dasc arm, in :func:`sa.plan_name` directories."""
    d = tmp_path_factory.mktemp("kimi_plans")
    for w, i8 in DASC_PLANS:
        compile_plan(KIMI, Policy(w_max=w, int8=i8), d / sa.plan_name(w, i8), with_kernels=False)
    return d


def _arm(name: str) -> sa.ArmSpec:
    return next(a for a in sa.DEFAULT_ARMS if a.name == name)


# --- 1. INT8 slot bytes against SGLang's own estimate ------------------------------------------

def _sglang_cache_params(ref: Path, tp: int):
    """SGLang's per-rank cache params for the reference config (shapes, dtypes, layer ids)."""
    from sglang.srt.configs.kimi_linear import KimiLinearConfig
    from sglang.srt.configs.qwen3_5 import Qwen3_5Config
    from sglang.srt.runtime_context import get_parallel

    from tests.support.runtime_fixtures import set_server_args

    set_server_args()                       # a published context, as in a scheduler (0.5.23 reads it here)
    cfg = json.loads((ref / "config.json").read_text())
    with get_parallel().override(tp_size=tp, attn_tp_size=tp, moe_tp_size=tp):   # 0.5.23 checks it is consistent
        if cfg["model_type"] == "kimi_linear":
            return KimiLinearConfig(**cfg).mamba2_cache_params
        return Qwen3_5Config(**cfg).text_config.mamba2_cache_params


def _sglang_int8_slot_bytes(cp) -> int:
    """One usable slot of SGLang's INT8 checkpoint pool: estimate(C=1) - estimate(C=0)."""
    from sglang.srt.mem_cache.mamba_checkpoint_pool import MambaCheckpointPool

    h, d_v, d_k = cp.shape.temporal
    kw = dict(num_layers=len(cp.layers), num_heads=h, head_v_dim=d_v, head_k_dim=d_k,
              conv_shapes=list(cp.shape.conv), conv_dtype=cp.dtype.conv, temporal_dtype=cp.dtype.temporal)
    one = MambaCheckpointPool.estimate_mem_usage_bytes(num_slots=1, **kw)
    zero = MambaCheckpointPool.estimate_mem_usage_bytes(num_slots=0, **kw)
    # slot 0 is reserved: an empty pool still holds one row
    assert zero["total"] == one["total"] - zero["total"] > 0
    return one["total"] - zero["total"]


@pytest.mark.sglang
@pytest.mark.parametrize("ref,tp,env,hand", [
    (KIMI, 1, {}, KIMI_B_INT8),
    # GDN: 48 layers, 48 value heads, d = 128, conv (10240, 3) bfloat16
    (QWEN35, 1, {}, 48 * (48 * 128 * 128 + 48 * 128 * 4 + 10240 * 3 * 2)),
    (KIMI, 2, {}, 20 * (16 * 128 * 128 + 16 * 128 * 4 + 3 * 6144 * 2)),
    # state dtypes set the SGLang way (environment) and the dasc way (policy): 2-byte scales, 4-byte conv
    (KIMI, 1, {"SGLANG_MAMBA_SSM_DTYPE": "bfloat16", "SGLANG_MAMBA_CONV_DTYPE": "float32"},
     20 * 32 * 128 * 128 + 20 * 32 * 128 * 2 + 20 * 3 * 12288 * 4),
], ids=["kimi-tp1", "qwen3.5-tp1", "kimi-tp2", "kimi-bf16-temporal-fp32-conv"])
def test_int8_bytes_per_slot_matches_sglang(tmp_path, monkeypatch, ref, tp, env, hand):
    import torch

    for k in ("SGLANG_MAMBA_SSM_DTYPE", "SGLANG_MAMBA_CONV_DTYPE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cp = _sglang_cache_params(ref, tp)
    names = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    policy = Policy(w_max=128, tp_size=tp, temporal_dtype=names[cp.dtype.temporal], conv_dtype=names[cp.dtype.conv])
    _, out = compile_plan(ref, policy, tmp_path / "plan", with_kernels=False)
    plan = load_plan(out)
    # the plan describes the same recurrent state SGLang allocates
    assert list(plan.model.recurrent_layer_ids) == list(cp.layers)
    assert plan.tp.heads_per_rank == cp.shape.temporal[0]
    assert plan.tp.bytes_dense_per_slot == cp.mamba_cache_per_req
    got = int8_bytes_per_slot(plan)
    assert got == _sglang_int8_slot_bytes(cp) == hand


@pytest.mark.sglang
def test_kimi_sglang_state_layout_and_hand_numbers():
    cp = _sglang_cache_params(KIMI, 1)
    # SGLang 0.5.17 keeps Kimi's three q/k/v conv windows in ONE tensor, window axis first
    assert list(cp.shape.conv) == [(3, 3 * 32 * 128)]
    assert tuple(cp.shape.temporal) == (32, 128, 128)
    assert cp.mamba_cache_per_req == KIMI_B_DENSE == 43_417_600
    assert KIMI_B_INT8 == 12_288_000


def test_int8_bytes_per_slot_rejects_unknown_temporal_dtype(kimi_plans):
    plan = load_plan(kimi_plans / sa.plan_name(128))
    bad = plan.model_copy(update={"policy": plan.policy.model_copy(update={"temporal_dtype": "float8"})})
    with pytest.raises(DascInputError, match="float8"):
        int8_bytes_per_slot(bad)


# --- 2. arm_launch at M = 48, M' = 40 ----------------------------------------------------------

@pytest.mark.parametrize("arm", sa.DEFAULT_ARMS, ids=lambda a: a.name)
def test_arm_launch_matched_budget(kimi_plans, arm):
    r = sa.arm_launch(arm, plans=kimi_plans, dense_slots=M, max_running_requests=R)
    budget = (M + 1) * KIMI_B_DENSE
    assert r.budget_bytes == budget == 2_127_462_400
    assert r.bytes_native_slot == KIMI_B_DENSE
    assert r.used_bytes <= budget
    assert r.arm == arm.name and r.kind == arm.kind
    if arm.kind == "dense":
        assert r.flags == COMMON + ["--max-mamba-cache-size", "48"]
        assert (r.native_slots, r.ckpt_slots, r.capacity, r.used_bytes, r.c_ckpt) == (48, 0, 48, budget, 1.0)
        assert r.capacity_under_load == 48 - M_NATIVE == 8      # 8 requests hold the other 40 native slots
        return
    # the other arms: M' native slots, slot 0 of each pool reserved, no room for one more ckpt slot
    assert r.native_slots == M_NATIVE
    assert r.used_bytes == (M_NATIVE + 1) * KIMI_B_DENSE + (r.ckpt_slots + 1) * r.bytes_ckpt_slot
    assert r.used_bytes + r.bytes_ckpt_slot > budget
    assert r.ckpt_slots == (budget - (M_NATIVE + 1) * KIMI_B_DENSE) // r.bytes_ckpt_slot - 1 >= 1
    # INT8: SGLang caches every checkpoint in the INT8 pool, the native slots only run requests
    assert r.capacity == (r.ckpt_slots if arm.kind == "int8" else M_NATIVE + r.ckpt_slots)
    # under load the M' native slots run the R requests: every pool arm keeps its pool alone
    assert r.capacity_under_load == r.ckpt_slots
    assert r.c_ckpt == pytest.approx(KIMI_B_DENSE / r.bytes_ckpt_slot, rel=1e-12)
    if arm.kind == "int8":
        assert r.flags == COMMON + ["--max-mamba-cache-size", "40", "--enable-int8-mamba-checkpoint",
                           "--int8-mamba-ckpt-size", "27"]
        assert (r.ckpt_slots, r.capacity, r.bytes_ckpt_slot) == (27, 27, 12_288_000)
        assert r.used_bytes == 41 * 43_417_600 + 28 * 12_288_000 == 2_124_185_600
        assert r.plan is None and r.int8 and r.kept_fraction is None
        return
    name = sa.plan_name(arm.w_max, arm.int8)
    plan = load_plan(kimi_plans / name)
    mm = plan_matched_memory(plan, dense_slots=M, native_slots=M_NATIVE)
    assert r.plan == name and (r.w_max, r.int8, r.balance) == (arm.w_max, arm.int8, "off")
    assert r.flags == COMMON + ["--max-mamba-cache-size", "40", "--dasc-plan", f"{{plans}}/{name}",
                       "--dasc-pool-slots", str(mm.compressed_slots)]
    assert r.ckpt_slots == mm.compressed_slots and r.used_bytes == mm.used_bytes
    assert r.bytes_ckpt_slot == plan.tp.bottleneck_bytes_per_slot
    assert r.c_ckpt == pytest.approx(plan.tp.c_ckpt_tp, rel=1e-12)
    kept = plan.tp.payload_contiguous[0].n_kept
    assert r.kept_fraction == pytest.approx(kept / (20 * 32 * 128), rel=1e-12)
    assert 0 < r.kept_fraction < 1


def test_dasc_capacity_orders_with_w_max_and_int8(kimi_plans):
    cap = {a.name: sa.arm_launch(a, plans=kimi_plans, dense_slots=M, max_running_requests=R).capacity
           for a in sa.DEFAULT_ARMS}
    # a larger w_max keeps fewer units (fewer bytes a slot, more slots); INT8 storage shrinks slots further
    assert cap["dasc-nr-w512"] >= cap["dasc-nr-w128"] >= cap["dasc-nr-w64"] >= cap["dasc-nr-w16"]
    assert cap["dasc-nr-w128-int8"] > cap["dasc-nr-w128"]
    assert cap["dasc-nr-w512"] > cap["dense"]


def test_scratch_slots_are_charged_to_dasc(kimi_plans):
    arm = _arm("dasc-nr-w128")
    r0 = sa.arm_launch(arm, plans=kimi_plans, dense_slots=M, max_running_requests=R)
    r2 = sa.arm_launch(arm, plans=kimi_plans, dense_slots=M, max_running_requests=R, scratch_slots=2)
    b = r0.bytes_ckpt_slot
    assert r2.ckpt_slots == r0.ckpt_slots - 2
    assert r2.used_bytes == (M_NATIVE + 1) * KIMI_B_DENSE + (r2.ckpt_slots + 1 + 2) * b <= r2.budget_bytes
    assert r2.flags[-1] == str(r0.ckpt_slots - 2)


# --- 3. bad input ------------------------------------------------------------------------------

def _one_line_error(fn, match: str) -> str:
    with pytest.raises(DascInputError, match=match) as e:
        fn()
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("name", ["dense", "int8", "dasc-nr-w128"])
@pytest.mark.parametrize("r", [10, 0, -3])
def test_running_requests_out_of_range(kimi_plans, name, r):
    # M = 48 runs at most floor(48 / 5) = 9 requests
    _one_line_error(lambda: sa.arm_launch(_arm(name), plans=kimi_plans, dense_slots=M, max_running_requests=r),
                    "needs M >= 50" if r == 10 else "--max-running-requests: expected an integer >= 1")


def test_missing_dasc_plan_dir(kimi_plans):
    msg = _one_line_error(
        lambda: sa.arm_launch(sa.ArmSpec("dasc-nr-w32", "dasc", 32), plans=kimi_plans, dense_slots=M,
                              max_running_requests=R), "no plan.json")
    assert "w32-tp1-off" in msg
    _one_line_error(lambda: sa.arm_launch(sa.parse_arms(["dasc-nr-w128-storage"])[0], plans=kimi_plans,
                                          dense_slots=M, max_running_requests=R), "w128-tp1-storage: no plan.json")


@pytest.mark.parametrize("name", ["dense", "int8"])
def test_no_plan_of_the_tp_degree(kimi_plans, tmp_path, name):
    _one_line_error(lambda: sa.arm_launch(_arm(name), plans=kimi_plans, dense_slots=M, max_running_requests=R, tp=2),
                    "no compiled plan for TP=2")
    _one_line_error(lambda: sa.arm_launch(_arm(name), plans=tmp_path / "nowhere", dense_slots=M,
                                          max_running_requests=R), "no compiled plan for TP=1")


@pytest.mark.parametrize("name", ["dense", "int8"])
def test_mixed_models_in_plans_dir_refused(kimi_plans, tmp_path, name):
    """Dense / INT8 read b_dense from the plans directory: plans of two models there are an error."""
    d = tmp_path / "mixed"
    shutil.copytree(kimi_plans / sa.plan_name(128), d / sa.plan_name(128))
    compile_plan(QWEN35, Policy(w_max=64), d / sa.plan_name(64), with_kernels=False)
    _one_line_error(lambda: sa.arm_launch(_arm(name), plans=d, dense_slots=M, max_running_requests=R),
                    "TP=1 plans disagree on the model or dense slot bytes")


def test_no_checkpoint_slot_fits(kimi_plans):
    # M = M' = 40 (R = 8) leaves no bytes for a checkpoint pool
    _one_line_error(lambda: sa.arm_launch(_arm("int8"), plans=kimi_plans, dense_slots=40, max_running_requests=R),
                    "no SGLang INT8 checkpoint slot fits: Dense's M=40")
    _one_line_error(lambda: sa.arm_launch(_arm("dasc-nr-w128"), plans=kimi_plans, dense_slots=40,
                                          max_running_requests=R), "no dasc-nr checkpoint slot fits")
    # boundary, w16 (b_compressed between b_dense / 2 and b_dense): M = 42 leaves 2 b_dense beside
    # M' = 40, room for slot 0 + exactly one usable slot; one slot of scratch or M = 41 leaves none usable
    w16 = _arm("dasc-nr-w16")
    r = sa.arm_launch(w16, plans=kimi_plans, dense_slots=42, max_running_requests=R)
    assert KIMI_B_DENSE / 2 < r.bytes_ckpt_slot < KIMI_B_DENSE
    assert r.ckpt_slots == 1 and r.capacity == 41
    _one_line_error(lambda: sa.arm_launch(w16, plans=kimi_plans, dense_slots=42, max_running_requests=R,
                                          scratch_slots=1), "no dasc-nr checkpoint slot fits")
    _one_line_error(lambda: sa.arm_launch(w16, plans=kimi_plans, dense_slots=41, max_running_requests=R),
                    "no dasc-nr checkpoint slot fits: Dense's M=41")


def test_int8_arm_needs_an_int8_plan(kimi_plans, tmp_path):
    d = tmp_path / "p"
    shutil.copytree(kimi_plans / sa.plan_name(128), d / sa.plan_name(128, True))
    _one_line_error(lambda: sa.arm_launch(_arm("dasc-nr-w128-int8"), plans=d, dense_slots=M, max_running_requests=R),
                    "plan has int8=False")


def test_parse_arms():
    assert sa.parse_arms([a.name for a in sa.DEFAULT_ARMS]) == list(sa.DEFAULT_ARMS)
    (a,) = sa.parse_arms(["dasc-nr-w256-int8-storage"])
    assert (a.name, a.kind, a.w_max, a.int8, a.balance) == ("dasc-nr-w256-int8-storage", "dasc", 256, True, "storage")
    (b,) = sa.parse_arms(["dasc-nr-w32-storage"])
    assert (b.w_max, b.int8, b.balance, b.reclaim_wait) == (32, False, "storage", "stream")
    (c,) = sa.parse_arms(["dasc-nr-w512-hostwait"])
    assert (c.w_max, c.int8, c.balance, c.reclaim_wait) == (512, False, "off", "host")


def test_hostwait_arm_same_memory_as_its_stream_twin_and_sets_the_env(kimi_plans):
    """-hostwait changes only the server's DASC_RECLAIM_WAIT; flags, slots and bytes are the twin's."""
    stream, host = (sa.arm_launch(a, plans=kimi_plans, dense_slots=48, max_running_requests=8)
                    for a in sa.parse_arms(["dasc-nr-w128", "dasc-nr-w128-hostwait"]))
    assert stream.env == {"DASC_EVICT_SHADOWED_FIRST": "0"}
    assert host.env == {"DASC_RECLAIM_WAIT": "host", "DASC_EVICT_SHADOWED_FIRST": "0"}
    assert (host.flags, host.capacity, host.used_bytes) == (stream.flags, stream.capacity, stream.used_bytes)


def test_shadowfirst_arm_same_memory_as_its_twin_and_sets_the_env(kimi_plans):
    """-shadowfirst changes only the server's DASC_EVICT_SHADOWED_FIRST (nr and wr arms, with -hostwait too);
    flags, slots and bytes are the twin's."""
    for twin, name, env in (("dasc-nr-w128", "dasc-nr-w128-shadowfirst", {"DASC_EVICT_SHADOWED_FIRST": "1"}),
                            ("dasc-nr-w128", "dasc-nr-w128-hostwait-shadowfirst",
                             {"DASC_RECLAIM_WAIT": "host", "DASC_EVICT_SHADOWED_FIRST": "1"})):
        plain, shadow = (sa.arm_launch(a, plans=kimi_plans, dense_slots=48, max_running_requests=8)
                         for a in sa.parse_arms([twin, name]))
        # the plain twin says 0: the runtime's default is the rule (since session 53), the arm's name the LRU
        assert plain.env == {"DASC_EVICT_SHADOWED_FIRST": "0"} and shadow.env == env
        assert (shadow.flags, shadow.capacity, shadow.used_bytes) == (plain.flags, plain.capacity, plain.used_bytes)
    (wr,) = sa.parse_arms(["dasc-wr-w16-int8-shadowfirst"])
    assert (wr.load_policy, wr.w_max, wr.int8, wr.shadowed_first, wr.reclaim_wait) == ("wr", 16, True, True, "stream")
    assert not any(a.shadowed_first for a in sa.parse_arms([a.name for a in sa.DEFAULT_ARMS]))


def test_nofork_arm_adds_only_the_fork_test_control(kimi_plans):
    """-nofork (beside -shadowfirst) adds DASC_EVICT_FORK_TEST=0 to the shadowed-first twin's environment and
    changes nothing else; no other arm sets that variable."""
    rule, control = (sa.arm_launch(a, plans=kimi_plans, dense_slots=48, max_running_requests=8)
                     for a in sa.parse_arms(["dasc-nr-w128-shadowfirst", "dasc-nr-w128-shadowfirst-nofork"]))
    assert rule.env == {"DASC_EVICT_SHADOWED_FIRST": "1"}
    assert control.env == {"DASC_EVICT_SHADOWED_FIRST": "1", "DASC_EVICT_FORK_TEST": "0"}
    assert (control.flags, control.capacity, control.used_bytes) == (rule.flags, rule.capacity, rule.used_bytes)
    (wr,) = sa.parse_arms(["dasc-wr-w16-shadowfirst-nofork"])
    assert (wr.load_policy, wr.shadowed_first, wr.fork_test) == ("wr", True, False)
    assert all(a.fork_test for a in sa.parse_arms([a.name for a in sa.DEFAULT_ARMS] + ["dasc-nr-w16-shadowfirst"]))


@pytest.mark.parametrize("name, fix", [("dasc-nr-w64-nofork", "dasc-nr-w64-shadowfirst-nofork"),
                                       ("dasc-wr-w16-int8-nofork", "dasc-wr-w16-int8-shadowfirst-nofork"),
                                       ("dasc-nr-w64-hostwait-int8-nofork", "dasc-nr-w64-int8-hostwait-shadowfirst-nofork"),
                                       ("dasc-nr-w64-nofork-storage", "dasc-nr-w64-storage-shadowfirst-nofork")])
def test_nofork_without_shadowfirst_is_named(name, fix):
    """The name suggested is one parse_arms takes (suffixes in their order)."""
    msg = _one_line_error(lambda: sa.parse_arms([name]), r"-nofork \(the fork test's control\) needs -shadowfirst")
    assert msg.endswith(f"e.g. {fix}"), msg
    assert [a.name for a in sa.parse_arms([fix])] == [fix]


def test_an_arm_named_twice_is_refused():
    _one_line_error(lambda: sa.parse_arms(["int8", "dense", "dasc-nr-w16", "dense", "int8"]),
                    "arm 'dense' is named twice")                     # the first repeated, in the order given
    assert [a.name for a in sa.parse_arms(["dasc-nr-w0"])] == ["dasc-nr-w0"]


@pytest.mark.parametrize("name, fix", [("dasc-nr-w128-nofork-shadowfirst", "dasc-nr-w128-shadowfirst-nofork"),
                                       ("dasc-nr-w16-shadowfirst-int8", "dasc-nr-w16-int8-shadowfirst"),
                                       ("dasc-nr-w64-hostwait-storage-int8", "dasc-nr-w64-int8-storage-hostwait"),
                                       ("dasc-wr-w16-shadowfirst-int8", "dasc-wr-w16-int8-shadowfirst")])
def test_suffixes_out_of_order_are_refused_with_the_one_name(name, fix):
    """Suffixes were accepted in any order, so two names could mean one arm (two rows of one arm in a table)."""
    msg = _one_line_error(lambda: sa.parse_arms(["dense", name]), "the suffixes go in the order -int8 -storage "
                          "-hostwait -shadowfirst -nofork")
    assert repr(name) in msg and msg.endswith(f"(one arm, one name): {fix}"), msg
    assert [a.name for a in sa.parse_arms([fix])] == [fix]


@pytest.mark.parametrize("name", ["dasc-nr-wx", "dasc-nr-w64-int8-int8", "dasc-nr-w", "dasc-nr-w64-bf16", "dasc-nr-w016",
                                  "dasc-wr-w00",
                                  "dasc-xr-w64", "dasc-nr-w\u00b2", "Dense", "int4",
                                  "dasc-nr-w64-hostwait-hostwait", "int8-hostwait", "dasc-wr-w64-storage",
                                  "dasc-wr-w64-hostwait", "dasc-wr-w64-int8-int8", "dasc-wr-wx", "dasc-wr",
                                  "dense-shadowfirst", "int8-shadowfirst", "dasc-nr-w64-shadowfirst-shadowfirst",
                                  "dasc-wr-w64-shadowfirst-storage", "dense-nofork",
                                  "dasc-nr-w64-shadowfirst-nofork-nofork"])
def test_parse_arms_rejects(name):
    msg = _one_line_error(lambda: sa.parse_arms(["dense", name]), "expected one of")
    assert repr(name) in msg


@pytest.mark.parametrize("kw,match", [
    (dict(name="x", kind="fp8"), "kind must be dense, int8 or dasc"),
    (dict(name="x", kind="dasc"), "w_max is set exactly for dasc arms"),
    (dict(name="x", kind="int8", w_max=64), "w_max is set exactly for dasc arms"),
    (dict(name="x", kind="dense", reclaim_wait="host"), "'host' on a dasc arm, got 'host' on a dense arm"),
    (dict(name="x", kind="dasc", w_max=64, reclaim_wait="spin"), "got 'spin'"),
    (dict(name="x", kind="dense", load_policy="wr"), "'wr' on a dasc arm, got 'wr' on a dense arm"),
    (dict(name="x", kind="dasc", w_max=64, fork_test=False), "-nofork needs -shadowfirst"),
    (dict(name="x", kind="dasc", w_max=64, load_policy="xr"), "got 'xr' on a dasc arm"),
    (dict(name="x", kind="int8", shadowed_first=True), "shadowed_first is for dasc arms, not a int8 arm"),
])
def test_arm_spec_rejects(kw, match):
    _one_line_error(lambda: sa.ArmSpec(**kw), match)


# --- 4. CLI ------------------------------------------------------------------------------------

def test_main_writes_arms_json(kimi_plans, tmp_path, capsys):
    out = tmp_path / "arms.json"
    rc = sa.main(["--plans", str(kimi_plans), "--dense-slots", "48", "--max-running-requests", "8", "--out", str(out)])
    assert rc == 0
    arms = json.loads(out.read_text())
    assert [x["arm"] for x in arms] == [a.name for a in sa.DEFAULT_ARMS]
    int8 = arms[1]
    assert int8["flags"] == COMMON + ["--max-mamba-cache-size", "40", "--enable-int8-mamba-checkpoint",
                             "--int8-mamba-ckpt-size", "27"]
    assert (int8["capacity"], int8["capacity_under_load"], int8["ckpt_slots"], int8["native_slots"]) == \
        (27, 27, 27, 40)
    assert (arms[0]["capacity"], arms[0]["capacity_under_load"]) == (48, 8)
    assert (int8["budget_bytes"], int8["used_bytes"], int8["bytes_ckpt_slot"]) == (2_127_462_400, 2_124_185_600,
                                                                                   12_288_000)
    w128 = arms[3]
    assert w128 == json.loads(json.dumps(asdict(sa.arm_launch(_arm("dasc-nr-w128"), plans=kimi_plans,
                                                              dense_slots=48, max_running_requests=8))))
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == len(sa.DEFAULT_ARMS)
    assert "--int8-mamba-ckpt-size 27" in printed[1] and "capacity   27 /   27 under load" in printed[1]
    assert "capacity   48 /    8 under load" in printed[0]
    assert f"--dasc-plan {kimi_plans}/w128-tp1-off " in printed[3] and "{plans}" not in printed[3]
    assert [p.name for p in tmp_path.iterdir()] == ["arms.json"]          # no temporary file left


def test_compile_hints_name_the_policy_and_balance():
    (a, b) = sa.parse_arms(["dasc-nr-w64-int8-storage", "dasc-nr-w16"])
    assert sa.compile_hint(a, 2, "/p/w64-int8-tp2-storage") == (
        "dasc compile MODEL --wmax 64 --tp 2 --balance storage --int8 --out /p/w64-int8-tp2-storage")
    assert sa.compile_hint(b, 1, "/p/x") == "dasc compile MODEL --wmax 16 --tp 1 --out /p/x"
    assert sa.compile_hint(b, 1, "/my plans/x") == "dasc compile MODEL --wmax 16 --tp 1 --out '/my plans/x'"
    _one_line_error(lambda: sa.compile_hint(sa.DEFAULT_ARMS[1], 1, "/p/x"), "only dasc arms are compiled")


def test_check_plans_names_every_missing_plan_sorted_by_w_max(tmp_path):
    specs = sa.parse_arms(["dense", "dasc-nr-w512", "dasc-nr-w64", "dasc-nr-w128-int8", "dasc-nr-w64-shadowfirst"])  # two arms, one plan
    msg = _one_line_error(lambda: sa.check_plans(specs, tmp_path), "no plan.json for ")
    assert "w64-tp1-off, w128-int8-tp1-off, w512-tp1-off (compile each: dasc compile MODEL --wmax 64 " in msg
    for name in ("w64-tp1-off", "w128-int8-tp1-off"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "plan.json").write_text("{}")
    msg = _one_line_error(lambda: sa.check_plans(specs, tmp_path), re.escape("no plan.json for w512-tp1-off (compile it:"))
    assert msg.endswith("--wmax 512 --tp 1 --out " + str(tmp_path / "w512-tp1-off") + ")")
    (tmp_path / "w512-tp1-off").mkdir()
    (tmp_path / "w512-tp1-off" / "plan.json").write_text("{}")
    sa.check_plans(specs, tmp_path)                      # all present: no error


@pytest.mark.parametrize("args,match", [
    (["--max-running-requests", "10"], "needs M >= 50"),
    (["--max-running-requests", "8", "--strategy", "auto"], "mamba-radix-cache-strategy"),
    (["--max-running-requests", "8", "--arms", "dense", "dasc-nr-wx"], "'dasc-nr-wx'"),
    (["--max-running-requests", "8", "--tp", "4"], "no plan.json for w16-tp4-off, w64-tp4-off, w128-tp4-off, w128-int8-tp4-off, w512-tp4-off"),
    (["--max-running-requests", "8", "--arms", "dense", "--tp", "4"], "no compiled plan for TP=4"),
    (["--max-running-requests", "8", "--tp", "0"], "--tp: expected a TP degree >= 1, got 0"),
    (["--max-running-requests", "8", "--arms", "dasc-nr-w8", "dasc-nr-w9-int8-storage"],
     "no plan.json for w8-tp1-off, w9-int8-tp1-storage (compile each: dasc compile MODEL --wmax 8 --tp 1 --out"),
    (["--max-running-requests", "8", "--out", "{tmp}"], "expected a file path for the arms JSON, got a directory"),
    (["--max-running-requests", "8", "--out", "."], "--out .: expected a file path"),
    (["--max-running-requests", "8", "--arms", "dasc-nr-w8"], "no plan.json for w8-tp1-off (compile it: dasc compile"),
    (["--max-running-requests", "8", "--out", "{tmp}/no/such/dir/arms.json"], "--out"),
])
def test_main_bad_input(kimi_plans, tmp_path, capsys, args, match):
    args = [x.replace("{tmp}", str(tmp_path)) for x in args]
    rc = sa.main(["--plans", str(kimi_plans), "--dense-slots", "48", *args])
    assert rc == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and match in err and err.count("\n") == 1


# --- 5. dasc-wr arms: plan names, compile hints, refresh scratch charged (calibrated Kimi, M = 56) ----
#
# Hand numbers at the open-loop run's point (M = 56, R = 8, M' = 40), w16 on the calibrated Kimi
# reference: b_c = 16,441,856 B; budget 57 b_dense = 2,474,803,200; beside 41 b_dense the pool has
# 16 b_dense; B = 8 scratch slots take 8 b_dense = 347,340,800, leaving floor(347,340,800 / b_c) - 1
# = 20 usable slots (dasc-nr: floor(694,681,600 / b_c) - 1 = 41); with B = 2: floor(607,846,400 / b_c) - 1 = 35.

KIMI_CAL = ROOT / "plans" / "reference" / "kimi-linear-48b-a3b-calibrated"
W16_BC = 16_441_856


@pytest.fixture(scope="module")
def wr_plans(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("kimi_cal_plans")
    for i8, lp in ((False, "nr"), (False, "wr"), (True, "wr")):
        compile_plan(KIMI_CAL, Policy(w_max=16, int8=i8, load_policy=lp), d / sa.plan_name(16, i8, load_policy=lp),
                     with_kernels=False)
    return d


def test_plan_names_of_wr_arms_and_nr_names_unchanged():
    assert sa.plan_name(128, True) == "w128-int8-tp1-off" and sa.plan_name(16, tp=2, balance="storage") == \
        "w16-tp2-storage"
    assert sa.plan_name(16, load_policy="wr") == "w16-wr-tp1-off"
    assert sa.plan_name(64, True, 2, "storage", "wr") == "w64-int8-wr-tp2-storage"
    a, b, c = sa.parse_arms(["dasc-wr-w16", "dasc-wr-w16-int8", "dasc-nr-w16"])
    assert (a.kind, a.w_max, a.int8, a.load_policy, a.balance, a.reclaim_wait) == ("dasc", 16, False, "wr", "off",
                                                                                  "stream")
    assert (b.int8, b.load_policy) == (True, "wr") and c.load_policy == "nr"
    assert [sa.arm_plan_dir(x, "/p").name for x in (a, b, c)] == ["w16-wr-tp1-off", "w16-int8-wr-tp1-off",
                                                                  "w16-tp1-off"]


def test_wr_compile_hints_are_command_lines_that_compile_a_wr_plan(tmp_path):
    """The hint is a dasc compile command line whose flags dasc compile has (it named a policy file to write by
    hand, while README compiles with --int8); run on the Kimi-Linear reference checkpoint, it writes the wr / INT8
    plan."""
    import shlex

    from dasc_compile.schema import load_plan
    from tests.support.cli_runner import cli

    a, b = sa.parse_arms(["dasc-wr-w16", "dasc-wr-w64-int8"])
    assert sa.compile_hint(a, 1, "/p/w16-wr-tp1-off") == \
        "dasc compile MODEL --wmax 16 --tp 1 --load-policy wr --out /p/w16-wr-tp1-off"
    out = tmp_path / "w64-int8-wr-tp1-off"
    hint = sa.compile_hint(b, 1, out)
    assert hint == f"dasc compile MODEL --wmax 64 --tp 1 --int8 --load-policy wr --out {out}"
    argv = shlex.split(hint)[1:]
    res = cli(*argv[:1], KIMI, *argv[2:])                     # compile MODEL -> compile <the Kimi reference>
    assert res.exit_code == 0, res.output
    pol = load_plan(out).policy
    assert (pol.load_policy, pol.int8, pol.w_max) == ("wr", True, 64)


def test_wr_arm_charges_its_refresh_slots(wr_plans):
    budget = 57 * KIMI_B_DENSE
    nr, wr, wr8 = (sa.arm_launch(x, plans=wr_plans, dense_slots=56, max_running_requests=R)
                   for x in sa.parse_arms(["dasc-nr-w16", "dasc-wr-w16", "dasc-wr-w16-int8"]))
    assert nr.bytes_ckpt_slot == wr.bytes_ckpt_slot == W16_BC and budget == wr.budget_bytes == 2_474_803_200
    assert (nr.ckpt_slots, nr.refresh_slots, nr.load_policy) == (41, 0, "nr")
    assert "--dasc-refresh-slots" not in nr.flags
    assert (nr.capacity, nr.capacity_under_load, wr.capacity_under_load) == (81, 41, 20)   # B scratch holds none
    assert (wr.ckpt_slots, wr.capacity, wr.refresh_slots, wr.load_policy, wr.plan) == (20, 60, 8, "wr",
                                                                                      "w16-wr-tp1-off")
    assert wr.flags == COMMON + ["--max-mamba-cache-size", "40", "--dasc-plan", "{plans}/w16-wr-tp1-off",
                                 "--dasc-pool-slots", "20", "--dasc-refresh-slots", "8"]
    assert wr.used_bytes == 41 * KIMI_B_DENSE + 21 * W16_BC + 8 * KIMI_B_DENSE == 2_472_741_376 <= budget
    assert wr.used_bytes + W16_BC > budget                  # no room for one more compressed slot
    assert wr8.plan == "w16-int8-wr-tp1-off" and wr8.int8 and wr8.refresh_slots == 8
    assert wr8.flags[-4:] == ["--dasc-pool-slots", str(wr8.ckpt_slots), "--dasc-refresh-slots", "8"]
    assert wr8.used_bytes == 49 * KIMI_B_DENSE + (wr8.ckpt_slots + 1) * wr8.bytes_ckpt_slot <= budget
    two = sa.arm_launch(sa.parse_arms(["dasc-wr-w16"])[0], plans=wr_plans, dense_slots=56, max_running_requests=R,
                        refresh_slots=2)
    assert (two.ckpt_slots, two.refresh_slots, two.flags[-1]) == (35, 2, "2")
    # one --refresh-slots for a whole arm list (prepare_serving.sh): it sizes the wr arm and leaves the others
    # alone (it was passed to every arm, and the runtime's rules refuse B with an nr plan: exit 2)
    nr2, dense2 = (sa.arm_launch(x, plans=wr_plans, dense_slots=56, max_running_requests=R, refresh_slots=2)
                   for x in sa.parse_arms(["dasc-nr-w16", "dense"]))
    assert (nr2.ckpt_slots, nr2.refresh_slots) == (41, 0) and "--dasc-refresh-slots" not in nr2.flags + dense2.flags


def test_wr_arm_needs_a_wr_plan(wr_plans, tmp_path):
    d = tmp_path / "p"
    shutil.copytree(wr_plans / "w16-tp1-off", d / "w16-wr-tp1-off")      # a dasc-nr plan under the wr name
    msg = _one_line_error(lambda: sa.arm_launch(sa.parse_arms(["dasc-wr-w16"])[0], plans=d, dense_slots=56,
                                                max_running_requests=R), "plan has load_policy=nr")
    assert "needs load_policy=wr" in msg and "--load-policy wr" in msg
    shutil.copytree(wr_plans / "w16-wr-tp1-off", d / "w16-tp1-off")      # and the reverse
    _one_line_error(lambda: sa.arm_launch(sa.parse_arms(["dasc-nr-w16"])[0], plans=d, dense_slots=56,
                                          max_running_requests=R), "plan has load_policy=wr, arm 'dasc-nr-w16'")


def test_check_plans_names_a_missing_wr_plan(wr_plans, tmp_path):
    sa.check_plans(sa.parse_arms(["dasc-nr-w16", "dasc-wr-w16", "dasc-wr-w16-int8"]), wr_plans)
    msg = _one_line_error(lambda: sa.check_plans(sa.parse_arms(["dasc-nr-w16", "dasc-wr-w16"]), tmp_path),
                          "no plan.json for w16-tp1-off, w16-wr-tp1-off ")


def test_main_writes_wr_arms_and_refuses_zero_refresh_slots(wr_plans, tmp_path, capsys):
    out = tmp_path / "arms.json"
    rc = sa.main(["--plans", str(wr_plans), "--dense-slots", "56", "--max-running-requests", "8",
                  "--arms", "dense", "dasc-wr-w16", "--refresh-slots", "2", "--out", str(out)])
    assert rc == 0
    dense, wr = json.loads(out.read_text())
    assert dense["refresh_slots"] == 0 and dense["load_policy"] == "nr"
    assert (wr["arm"], wr["load_policy"], wr["refresh_slots"], wr["ckpt_slots"]) == ("dasc-wr-w16", "wr", 2, 35)
    assert "--dasc-refresh-slots 2" in capsys.readouterr().out.splitlines()[1]
    rc = sa.main(["--plans", str(wr_plans), "--dense-slots", "56", "--max-running-requests", "8",
                  "--arms", "dasc-wr-w16", "--refresh-slots", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and err == "error: --refresh-slots: expected at least one scratch slot, got 0\n"
