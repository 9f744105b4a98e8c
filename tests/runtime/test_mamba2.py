"""The runtime serves a Mamba2 plan (issue 23) with SGLang 0.5.17's own classes on CPU: the plan fits SGLang's
Mamba2 state (temporal [H/P, head_dim, d_state], conv with the B/C groups as SGLang shards them), the
compressed pool stores and restores whole heads (dasc-nr; keep-all = Dense bit for bit), both tiers run
under the simulated scheduler, and start-up refuses weights whose served decay (A = -exp(A_log)) is not
the plan's."""

from __future__ import annotations

import math

import pytest
import torch

from tests.support.runtime_fixtures import (M2_HEADS, M2_KEPT_W16, SGLANG_SKIP_REASON, compile_tiny, fill_random,
                                            hybrid_pools, mamba2_cache_params, mamba2_decay_tensors, set_server_args)

pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")]


@pytest.mark.parametrize("tp,groups", [(1, 2), (2, 2), (1, 1), (2, 1)], ids=["tp1", "tp2", "tp1-g1", "tp2-g1-replicated"])
def test_plan_fits_sglangs_mamba2_state(tmp_path, tp, groups):
    from dasc_runtime.verify import check_state

    plan, _, _ = compile_tiny(tmp_path, "mamba2", n_groups=groups, tp_size=tp)
    assert plan.model.unit_kind == "mamba2_head" and plan.model.conv_groups == groups
    cp = mamba2_cache_params(tp, groups)
    assert cp.shape.temporal == (M2_HEADS // tp, 8, 16)
    for rank in range(tp):
        check_state(plan, layer_ids=cp.layers, temporal_shape=cp.shape.temporal, conv_shapes=cp.shape.conv,
                    temporal_dtype=cp.dtype.temporal, conv_dtype=cp.dtype.conv, tp_rank=rank, tp_size=tp)
    # SGLang's conv width per rank: 4*8 + 2*G*16 split over P, a lone group copied to each rank
    want = (32 + 2 * groups * 16) // tp if groups % tp == 0 else 32 // tp + 2 * 16
    assert cp.shape.conv == [(want, 3)]


def test_plan_of_another_model_or_tp_is_refused(tmp_path):
    from dasc_runtime.verify import DascRefusal, check_model_type, check_state

    plan, _, _ = compile_tiny(tmp_path, "mamba2")
    gdn, _, _ = compile_tiny(tmp_path, "gdn")
    with pytest.raises(DascRefusal, match="plan is for 'qwen3_next', the server loaded 'nemotron_h'"):
        check_model_type(gdn, "nemotron_h")
    cp = mamba2_cache_params(1, 1)                                  # the server has 1 group, the plan 2
    with pytest.raises(DascRefusal, match="conv state bytes per rank"):
        check_state(plan, layer_ids=cp.layers, temporal_shape=cp.shape.temporal, conv_shapes=cp.shape.conv,
                    temporal_dtype=cp.dtype.temporal, conv_dtype=cp.dtype.conv, tp_rank=0, tp_size=1)


def _pool(tmp_path, **policy):
    from dasc_runtime.pool import DascCheckpointPool
    from dasc_runtime.rank_layout import build_rank_layout

    set_server_args()
    plan, _, _ = compile_tiny(tmp_path, "mamba2", **policy)
    cp = mamba2_cache_params()
    pool, _ = hybrid_pools(cp, mamba_size=8)
    fill_random(pool.mamba_pool, seed=5)
    layout = build_rank_layout(plan, 0, 1, num_layers=3)
    return plan, pool.mamba_pool, DascCheckpointPool(layout=layout, num_slots=4, conv_shapes=cp.shape.conv,
                                                     native_size=pool.mamba_pool.size, device="cpu")


def test_compressed_restore_keeps_global_heads_and_zeros_local_ones(tmp_path):
    plan, mp, dp = _pool(tmp_path)
    assert [lp.kept_units for lp in plan.layers] == M2_KEPT_W16 and dp.layout.offsets == (0, 2, 4, 7)
    assert tuple(dp.temporal.shape) == (5, 7, 8, 16)                # [C+1, sum r_l, head_dim, d_state]
    before = mp.mamba_cache.temporal[:, 3].clone()                 # [L, H, head_dim, d_state]
    conv = [c[:, 3].clone() for c in mp.mamba_cache.conv]
    ids = dp.alloc(1)
    dp.store_from_active(mp, torch.tensor([3]), ids)
    rows = dp.slots_of(ids)
    packed = [before[l, h] for l, kept in enumerate(M2_KEPT_W16) for h in kept]
    assert torch.equal(dp.temporal[rows[0]], torch.stack(packed))   # ragged rows = kept heads, layer by layer
    dp.load_to_active(mp, ids, torch.tensor([6]))
    got = mp.mamba_cache.temporal[:, 6]
    for l, kept in enumerate(M2_KEPT_W16):
        for h in range(M2_HEADS):
            assert torch.equal(got[l, h], before[l, h] if h in kept else torch.zeros_like(before[l, h]))
    assert all(torch.equal(c[:, 6], b) for c, b in zip(mp.mamba_cache.conv, conv))


def test_keep_all_plan_restores_dense_bit_for_bit(tmp_path):
    _, mp, dp = _pool(tmp_path, w_max=0)
    assert dp.layout.keeps_everything
    before = mp.mamba_cache.temporal[:, 2].clone()
    ids = dp.alloc(1)
    dp.store_from_active(mp, torch.tensor([2]), ids)
    dp.load_to_active(mp, ids, torch.tensor([5]))
    assert mp.mamba_cache.temporal[:, 5].view(torch.int32).equal(before.view(torch.int32))


@pytest.mark.parametrize("wr", [False, True], ids=["nr", "wr"])
def test_two_tiers_under_the_simulated_scheduler(tmp_path, monkeypatch, wr):
    """Compressed-first insertion, dense spill, demotion and eviction over a seeded random run of SGLang's
    radix cache; every restore is checked against the exact state (dense hit) or its dasc-nr / dasc-wr
    image (compressed hit) by the simulation (tests/support/runtime_sim.py)."""
    import sglang.srt.model_executor.forward_batch_info as fbi

    from dasc_runtime.installed import INSTALLED
    from tests.support.runtime_sim import Sim, run_ops

    monkeypatch.setattr(fbi, "enable_num_token_non_padded", lambda: False)   # no MoE-EP state in this process
    torch.set_num_threads(1)
    try:
        sim = Sim(tmp_path, kind="mamba2", mamba_size=10, compressed_slots=4, watermark=2, kv_size=200, wr=wr,
                  seed=23, check_content_every=10)
        run_ops(sim, 1500, f"reproduce: pytest 'tests/runtime/test_mamba2.py::test_two_tiers_under_the_simulated_"
                           f"scheduler[{'wr' if wr else 'nr'}]'")
    finally:
        INSTALLED.reset()
    s, c = sim.stats, sim.comp.counters
    assert s["restore_compressed"] > 0 and s["restore_dense"] > 0, s
    assert c.inserts_compressed > 0 and c.inserts_dense > 0 and c.demotions_committed > 0 and c.evictions_compressed > 0
    if wr:
        assert s["wr_refreshed"] > 0 and s["wr_refreshed"] + s["wr_skipped"] == s["restore_compressed"]


def test_served_decay_is_compared_by_value(tmp_path):
    """SGLang serves A = -exp(A_log) FP32 (computed on the device) and dt_bias in the model dtype: a plan from
    these weights matches within its tolerance; other decays are refused in one line naming a tensor."""
    from dasc_runtime.fingerprint import fingerprint_names, served_decay_tensors
    from dasc_runtime.verify import DascRefusal, check_fingerprint

    plan, _, _ = compile_tiny(tmp_path, "mamba2")
    names = fingerprint_names(plan.fingerprint)
    assert names[:2] == ["model.layers.0.mixer.A", "model.layers.0.mixer.dt_bias"]

    def served_model(tensors, bump=0.0):
        m = torch.nn.Module()
        m.layers = torch.nn.ModuleList()
        for i in range(3):
            mix = torch.nn.Module()
            a_log, dt = tensors[2 * i][1], tensors[2 * i + 1][1]
            mix.A = torch.nn.Parameter(-torch.exp(a_log.float()) * (1 + bump))       # SGLang's A_weight_loader
            mix.dt_bias = torch.nn.Parameter(dt.to(torch.bfloat16))                  # model dtype (lossy from FP32)
            layer = torch.nn.Module()
            layer.mixer = mix
            m.layers.append(layer)
        root = torch.nn.Module()
        root.model = m
        return root

    tensors = mamba2_decay_tensors()
    hit = check_fingerprint(plan, served_decay_tensors(served_model(tensors), names))
    assert hit["A"] == torch.float32 and hit["dt_bias"] == torch.bfloat16 and hit["max_rel"] < 2 ** -8
    with pytest.raises(DascRefusal, match=r"differ from the ones the plan was compiled from.*'model\.layers\.0\.mixer\.A'"):
        check_fingerprint(plan, served_decay_tensors(served_model(tensors, bump=1e-4), names))
    other = [(n, t + 0.5 if n.endswith("A_log") else t) for n, t in tensors]
    with pytest.raises(DascRefusal, match="recompile the plan from the served checkpoint"):
        check_fingerprint(plan, served_decay_tensors(served_model(other), names))
    # a GDN-style served model (A_log, no A) has no counterpart for the plan's names
    with pytest.raises(Exception, match="has no counterpart in the served model"):
        served_decay_tensors(torch.nn.Linear(2, 2), names)
    assert math.isclose(plan.fingerprint.served.values[0][0], -0.5, rel_tol=1e-6)
