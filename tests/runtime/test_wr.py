"""dasc-wr in SGLang 0.5.17 on CPU: where the scratch pass is planned and run, that it never writes
cached KV, what it refreshes, its memory and its start-up refusals (paper §4.2, App. B.2, Eq. 7).

The scheduling path runs in a fresh interpreter (tests/support/runtime_wr_check.py) through SGLang's own
``load_plugins()``, ``ScheduleBatch.prepare_for_extend``, ``ForwardBatch.init_new``,
``ModelRunner._maybe_execute_deferred_mamba_cow_and_clear`` and SGLang's torch-native extend
attention for the scratch pass's full-attention layer. SGLang's linear-attention kernels need a GPU:
the recurrent layers of the pass are a stand-in there, so the numerics of a real scratch forward are
not checked on CPU (benchmarks/h200/wr_smoke.sh does that on an H200). The refresh copy itself and
its agreement with ``dasc eval``'s wr arm are checked here with the runtime's own ops.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.support.runtime_fixtures import SGLANG_SKIP_REASON, compile_tiny

ROOT = Path(__file__).resolve().parents[2]      # the repository root: the probe runs as tests.support.<name>

needs_sglang = pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")


@pytest.fixture(scope="module")
def findings(tmp_path_factory):
    if SGLANG_SKIP_REASON:
        pytest.skip(SGLANG_SKIP_REASON)
    tmp = tmp_path_factory.mktemp("wr")
    _, wr_dir, _ = compile_tiny(tmp, load_policy="wr")
    _, nr_dir, _ = compile_tiny(tmp)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASC_")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, "-m", "tests.support.runtime_wr_check", str(wr_dir), str(nr_dir)],
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and line, f"wr check failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(line[-1][len("RESULT "):])


def test_scratch_rows_and_slots_exist_but_sglang_never_allocates_them(findings):
    b, s = findings["budget"], findings["sizes"]
    assert b["seqs"] == 8 and b["w_cap"] == 8
    assert b["rows"] == list(range(9, 17)) and b["slots"] == list(range(11, 19))
    # SGLang's own sizes: 8 rows, 10 schedulable Mamba slots; physically 8+8 rows (+ padding row 0), 10+8 slots
    assert s == dict(size=8, free_rows=8, req_rows=17, mamba_physical=18, mamba_alloc=10, mamba_free=10,
                     native_size=18)
    assert findings["rows_never_free"] and findings["slots_never_free"]
    assert findings["after_clear"] == {"rows": True, "slots": True}       # HybridReqToTokenPool.clear() too


def test_scratch_pass_is_planned_in_prepare_for_extend(findings):
    # SGLang's prepare_for_extend of the hit batch (through the copy-on-write hook) planned one pass:
    # the last W = min(n_p, w_replay_cap) = min(20, 8) tokens of the cached prefix, on scratch row 9 / slot 11
    assert findings["hint"] == [True] and findings["n_p"] == 20
    (p,) = findings["planned"]
    assert p["rows"] == [9] and p["slots"] == [11] and p["windows"] == [8]
    call = findings["scratch_call"]
    assert call["positions"] == list(range(12, 20)) and call["prefix"] == [12] and call["seq_lens"] == [20]
    assert call["input_ids"] == list(range(112, 120))        # the prefix's tokens 12..19
    assert call["slots"] == [11] and call["out_cache_loc"] == p["locs"]


def test_scratch_pass_never_writes_cached_kv(findings):
    # SGLang's extend attention wrote K/V only into the pass's own fresh slots, none of them cached
    # or held by the request, and those slots went back to the allocator after the pass
    assert findings["kv_rows_written"] == findings["planned"][0]["locs"]
    assert findings["kv_written_in_cache"] == []
    assert findings["kv_free_delta"] == 8


def test_scratch_attention_reads_the_cached_prefix(findings):
    # window queries attend to the cached K/V of the 12 tokens before the window and causally to their own
    assert findings["attn_max_err"] < 2e-2


def test_refresh_starts_from_zero_and_copies_only_local_units(findings):
    assert findings["scratch_call"]["start_abs"] == [0.0]      # temporal and conv of the scratch slot
    assert findings["local_equal_window"] and findings["kept_equal_checkpoint"]


def test_a_window_without_kv_room_stays_dasc_nr_and_is_counted(findings):
    assert findings["no_room"] == {"work": False, "hint": [True], "skipped": 1}


def test_batch_log_line_counts_refreshes_and_replayed_tokens(findings):
    assert "dasc refreshed: 1 (8 tok replayed, 1 passes, 1 skipped)" in findings["status"]


def test_startup_refusals_are_one_line(findings):
    want = {
        "refuse_zero": "--dasc-refresh-slots 0: dasc-wr needs at least one scratch slot",
        "refuse_nr_slots": "--dasc-refresh-slots 4 needs a plan with load_policy: wr",
        "refuse_chunk": "w_replay_cap=8 tokens exceeds --chunked-prefill-size 4",
        "refuse_dp": "DP attention (--enable-dp-attention / --attn-dp-size > 1) with a dasc-wr plan",
        "refuse_context": "w_replay_cap=8 tokens exceeds the served context length (8 tokens)",
        "refuse_pool_bytes": "leaves no room for dasc-wr's 8 scratch slots",
    }
    for key, text in want.items():
        msg = findings[key]
        assert msg.startswith("DascRefusal: dasc: refusing to start: ") and text in msg and "\n" not in msg, (key, msg)
    assert findings["pool_bytes_ok"] == "started" and findings["pool_bytes_slots"] == 2   # budget - scratch = 3 slots


# ---------------------------------------------------------------- in-process: the pieces

def test_window_tokens_eq7_and_page_rounding():
    from dasc_runtime.wr_scratch import window_tokens

    assert [window_tokens(n, 64) for n in (0, 1, 40, 64, 65, 1000)] == [0, 1, 40, 64, 64, 64]
    assert window_tokens(100, 0) == 0
    # a window starts on a KV page boundary: W rounds up to whole pages, never past n_p
    assert window_tokens(128, 8, page_size=16) == 16 and window_tokens(12, 8, page_size=16) == 12
    assert window_tokens(256, 64, page_size=16) == 64


def test_refresh_budget_is_capped_by_the_prefill_chunk(tmp_path):
    from dasc_runtime.verify import DascRefusal
    from dasc_runtime.wr_scratch import check_refresh_startup

    plan, _, _ = compile_tiny(tmp_path, load_policy="wr")
    nr, _, _ = compile_tiny(tmp_path)
    assert plan.refresh.w_replay_cap == 8
    assert check_refresh_startup(plan, refresh_slots=None, context_len=512, chunked_prefill_size=None) == 8
    assert check_refresh_startup(plan, refresh_slots=6, context_len=512, chunked_prefill_size=-1) == 6
    assert check_refresh_startup(plan, refresh_slots=None, context_len=512, chunked_prefill_size=20) == 2
    assert check_refresh_startup(nr, refresh_slots=None, context_len=512, chunked_prefill_size=20) == 0
    with pytest.raises(DascRefusal, match="exceeds the served context length"):
        check_refresh_startup(plan, refresh_slots=None, context_len=8, chunked_prefill_size=None)


def _states(kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    from tests.support.runtime_fixtures import cache_params_for

    cp = cache_params_for(kind)
    L = len(cp.layers)
    shape = (L, 6, *cp.shape.temporal)                 # [L, slots, H, dv, dk], slots 1..3 active, 4..5 scratch
    return torch.randn(shape, generator=g), cp


@needs_sglang
@pytest.mark.parametrize("kind", ["gdn", "kda", "mamba2"])
@pytest.mark.parametrize("int8", [False, True])
def test_restore_then_refresh_equals_dasc_eval_wr_arm(tmp_path, kind, int8):
    """The runtime's dasc-wr image of a checkpoint (TorchOps pack / load, then refresh_copy from a
    scratch state) equals ``dasc eval``'s (``zero_local`` + ``copy_local_from`` on the transformers
    key-major layout) for the same plan and the same scratch state: the same units are global."""
    from dasc_compile.eval.arms import copy_local_from, keep_grids, plan_kept_units, zero_local
    from dasc_runtime.ops import CheckpointTensors, TorchOps
    from dasc_runtime.rank_layout import build_rank_layout
    from dasc_runtime.torch_kernels import refresh_copy

    plan, _, _ = compile_tiny(tmp_path, kind, load_policy="wr", int8=int8)
    temporal, cp = _states(kind)
    temporal[:, 4:6] = torch.randn(temporal[:, 4:6].shape, generator=torch.Generator().manual_seed(1))
    L = temporal.shape[0]
    lay = build_rank_layout(plan, 0, 1, L)
    ops = TorchOps()
    ckpt = CheckpointTensors(
        temporal=torch.zeros((3, lay.width, *lay.unit_shape), dtype=torch.int8 if int8 else torch.float32),
        scale=torch.zeros((3, lay.width, *lay.scale_shape)) if int8 else None,
        conv=[torch.zeros((L, 3, *s), dtype=torch.bfloat16) for s in cp.shape.conv])
    conv = [torch.zeros((L, 6, *s), dtype=torch.bfloat16) for s in cp.shape.conv]
    cache = SimpleNamespace(temporal=temporal, conv=conv)
    original = temporal[:, 1:3].clone()
    ops.store(lay, cache, torch.tensor([1, 2]), torch.tensor([1, 2]), ckpt)
    ops.load(lay, cache, torch.tensor([1, 2]), torch.tensor([1, 2]), ckpt)          # dasc-nr restore into 1, 2
    restored = temporal[:, 1:3].clone()
    refresh_copy(scratch=temporal[:, 4:6], temporal=temporal, dst_slots=torch.tensor([1, 2]),
                 unit_row=lay.index.unit_row, local_heads=lay.index.local_heads)
    runtime = temporal[:, 1:3]
    # dasc eval on the transformers layout: recurrent_states [B, H, dk, dv] = SGLang [H, dv, dk] transposed
    def kv_major(t, l):                                                  # [N, H, dk, dv]
        return t[l].transpose(-1, -2).contiguous()

    grids = keep_grids(plan_kept_units(plan), plan.layers[0].num_heads, plan.layers[0].units_per_head)
    layer_ids = list(range(L))

    def mk(src):
        return SimpleNamespace(layers=[SimpleNamespace(recurrent_states=kv_major(src, l)) for l in layer_ids])

    ev = mk(restored if int8 else original)
    if not int8:
        zero_local(ev, layer_ids, grids)
    copy_local_from(ev, mk(temporal[:, 4:6]), layer_ids, grids)
    for l in layer_ids:
        assert torch.equal(ev.layers[l].recurrent_states, kv_major(runtime, l)), f"layer {l} differs from dasc eval"
    # kept units are the restored checkpoint exactly (INT8: its Eq. 8 round trip), local units the scratch
    keep = torch.stack([g.view(-1) for g in grids])                                   # [L, units]

    def unit(t):                     # [H, dv, dk] -> [units, ...]: GDN heads, KDA columns S[h, :, k]
        return t.reshape(t.shape[0], -1) if kind != "kda" else t.permute(0, 2, 1).reshape(-1, t.shape[1])

    for l in layer_ids:
        for n in range(2):
            got, res, scr = unit(runtime[l, n]), unit(restored[l, n]), unit(temporal[l, 4 + n])
            assert torch.equal(got[keep[l]], res[keep[l]]) and torch.equal(got[~keep[l]], scr[~keep[l]])


@needs_sglang
@pytest.mark.parametrize("kind", ["gdn", "kda", "mamba2"])
def test_plan_kernel_refresh_copy_reads_the_scratch_slots_in_place(tmp_path, monkeypatch, kind):
    """The runtime hands the plan's Triton ``refresh_copy`` the scratch slots as a strided view of the
    pool (``temporal[:, M+1 : M+1+n]``); under the interpreter it equals the PyTorch version bit for bit."""
    from dasc_runtime.ops import select_ops
    from dasc_runtime.rank_layout import build_rank_layout
    from dasc_runtime.torch_kernels import refresh_copy
    from dasc_runtime.wr_refresh import refresh_copy_fn

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    plan, plan_dir, _ = compile_tiny(tmp_path, kind, with_kernels=True, load_policy="wr")
    temporal, _ = _states(kind, seed=3)
    lay = build_rank_layout(plan, 0, 1, temporal.shape[0])
    ops = select_ops(plan, plan_dir, lay, "cpu", interpret=True)
    kernel = refresh_copy_fn(SimpleNamespace(ops=ops))
    assert kernel is ops.module.refresh_copy
    want = temporal.clone()
    args = dict(dst_slots=torch.tensor([3, 1]), unit_row=lay.index.unit_row, local_heads=lay.index.local_heads)
    kernel(scratch=temporal[:, 4:6], temporal=temporal, check_slots=False, **args)
    refresh_copy(scratch=want[:, 4:6], temporal=want, **args)
    assert torch.equal(temporal, want)
    assert refresh_copy_fn(SimpleNamespace(ops=select_ops(plan, plan_dir, lay, "cpu"))) is refresh_copy


def test_dasc_size_charges_the_scratch_slots_of_a_wr_plan(tmp_path):
    """``dasc size``: a wr arm keeps M' native slots plus B hidden scratch slots, so at equal memory
    ``(M'+1) b_dense + B b_dense + (C+1) b_c <= (M+1) b_dense`` fixes a smaller C than nr's."""
    from dasc_runtime.sizing import size_arms

    wr, _, _ = compile_tiny(tmp_path, load_policy="wr")
    nr, _, _ = compile_tiny(tmp_path)
    b_d, b_c = wr.tp.bytes_dense_per_slot, wr.tp.bottleneck_bytes_per_slot
    (a_nr,) = size_arms(nr, max_running_requests=4, dense_slots=100, arms=("dasc",))
    (a_wr,) = size_arms(wr, max_running_requests=4, dense_slots=100, arms=("dasc",), refresh_slots=3)
    m_native = a_nr.native_slots
    assert a_nr.arm == "dasc-nr-w16" and a_wr.arm == "dasc-wr-w16" and a_wr.native_slots == m_native
    assert a_nr.ckpt_slots == (100 - m_native) * b_d // b_c - 1
    assert a_wr.ckpt_slots == ((100 - m_native) * b_d - 3 * b_d) // b_c - 1 < a_nr.ckpt_slots
    assert a_wr.used_bytes == (m_native + 1) * b_d + 3 * b_d + (a_wr.ckpt_slots + 1) * b_c <= a_wr.budget_bytes
    assert a_wr.flags[-2:] == ("--dasc-refresh-slots", "3") and "--dasc-refresh-slots" not in a_nr.flags
    (a_def,) = size_arms(wr, max_running_requests=4, dense_slots=100, arms=("dasc",))
    assert a_def.flags[-1] == "8"                      # wr_scratch.DEFAULT_REFRESH_SLOTS


def test_device_check_reports_copy_and_kept_unit_distance(tmp_path):
    """``DASC_WR_CHECK=1``'s per-pass check (used on the H200): kept units untouched, local units copied,
    and the distance of the pass's own kept units from the restored checkpoint."""
    from dasc_runtime.rank_layout import build_rank_layout
    from dasc_runtime.torch_kernels import refresh_copy
    from dasc_runtime.wr_refresh import RefreshPass, check_pass

    plan, _, _ = compile_tiny(tmp_path, load_policy="wr")
    temporal, _ = _states("gdn", seed=5)
    lay = build_rank_layout(plan, 0, 1, temporal.shape[0])
    temporal[:, 4] = temporal[:, 1]
    temporal[:, 4, :, 0] += 0.5                      # head 0 of every layer differs in the scratch
    before = temporal[:, 1:2].clone()
    refresh_copy(scratch=temporal[:, 4:5], temporal=temporal, dst_slots=torch.tensor([1]),
                 unit_row=lay.index.unit_row, local_heads=lay.index.local_heads)
    p = RefreshPass(batch=None, rows=[9], slots=[4], prefix=[torch.zeros(12)], windows=[8], dst=torch.tensor([1]))
    out = check_pass(lay, before, temporal[:, 1:2], temporal[:, 4:5], p)
    head0_kept = any(0 in units for units in lay.rank_units)
    assert out["kept_unchanged"] and out["local_copied"]
    assert out["kept_vs_scratch_max"] == [pytest.approx(0.5 if head0_kept else 0.0)]


def test_device_dump_holds_refreshed_state_and_global_mask(tmp_path):
    """``DASC_WR_DUMP``'s file (read by benchmarks/wr_reference_check.py): the refreshed state, a mask
    that is True exactly on the plan's kept (global) units, and the bit-identity of those units."""
    from dasc_runtime.ops import flat_units
    from dasc_runtime.rank_layout import build_rank_layout
    from dasc_runtime.torch_kernels import refresh_copy
    from dasc_runtime.wr_refresh import RefreshPass, check_pass, dump_pass

    plan, _, _ = compile_tiny(tmp_path, load_policy="wr")
    temporal, _ = _states("gdn", seed=6)
    lay = build_rank_layout(plan, 0, 1, temporal.shape[0])
    before = temporal[:, 1:2].clone()
    refresh_copy(scratch=temporal[:, 4:5], temporal=temporal, dst_slots=torch.tensor([1]),
                 unit_row=lay.index.unit_row, local_heads=lay.index.local_heads)
    p = RefreshPass(batch=None, rows=[9], slots=[4], prefix=[torch.zeros(12)], windows=[8], dst=torch.tensor([1]),
                    rids=["r0"], ids=[list(range(20))])
    out = check_pass(lay, before, temporal[:, 1:2], temporal[:, 4:5], p)
    d = torch.load(dump_pass(str(tmp_path / "dump"), 0, lay, before, temporal[:, 1:2], p, out))
    assert d["n_p"] == [20] and d["windows"] == [8] and d["rids"] == ["r0"] and d["ids"] == [list(range(20))]
    assert torch.equal(d["after"], temporal[:, 1:2]) and d["before_kept_equal"] == [True]
    flat_mask = flat_units(lay, d["kept_mask"].unsqueeze(1).float())[0]      # [L*U, *unit]
    kept = torch.zeros(flat_mask.shape[0], dtype=torch.bool)
    kept[lay.kept_flat] = True
    assert bool((flat_mask.flatten(1) == 1).all(1).eq(kept).all()) and bool((flat_mask[~kept] == 0).all())
    assert 0 < int(kept.sum()) < kept.numel()
    before[:, 0][d["kept_mask"]] += 1.0                                         # a changed global unit is caught
    assert dump_pass(str(tmp_path / "dump"), 1, lay, before, temporal[:, 1:2], p, out) and \
        torch.load(tmp_path / "dump" / "pass-1.pt")["before_kept_equal"] == [False]


@needs_sglang
@pytest.mark.sglang
def test_a_wr_pool_is_sized_and_logged_from_the_native_slots_sglang_allocates(tmp_path, caplog):
    """The pool is installed inside a constructor given M + B native slots (B: dasc-wr's hidden scratch); the default
    compressed pool (2 M, SGLang's INT8 default), the demotion watermark and the start-up log used M + B (session 32)."""
    import logging

    from tests.support import runtime_fixtures as F

    from dasc_runtime.installed import INSTALLED
    from dasc_runtime.pool_install import install_pool
    from dasc_runtime.settings import DascSettings

    F.set_server_args(chunk=4)
    plan, plan_dir, _ = compile_tiny(tmp_path, load_policy="wr")
    INSTALLED.plan = INSTALLED.plan_dir = None
    cp = F.gdn_cache_params()
    m, b = 19, 2                         # (m + b) // 10 = 2 and m // 10 = 1: the watermark tells them apart
    pool, _ = F.hybrid_pools(cp, mamba_size=m, wr_plan=plan, refresh_slots=b)
    assert INSTALLED.refresh is not None and len(INSTALLED.refresh.slots) == b
    with caplog.at_level(logging.INFO, logger="dasc"):
        dpool = install_pool(pool, mamba_size=m + b, cache_params=cp, mamba_layer_ids=list(cp.layers), device="cpu",
                             settings=DascSettings(plan=str(plan_dir)))
    assert dpool.num_slots == 2 * m
    from dasc_runtime.side_channels import tier_policy_of

    assert tier_policy_of(dpool).watermark == m // 10
    line = next(r.getMessage() for r in caplog.records if "compressed pool" in r.getMessage())
    assert f"native slots {m} (+{b} dasc-wr scratch)" in line and f"compressed pool {2 * m} slots" in line, line
