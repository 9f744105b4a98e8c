"""The compressed pool against SGLang 0.5.17's own MambaPool on CPU (paper §4.1-4.2, App. C.1, E.1)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.support.runtime_fixtures import (GDN_D, GDN_HEADS, GDN_KEPT_W16, KDA_D, KDA_HEADS, SGLANG_SKIP_REASON,
                                            cache_params_for, compile_tiny, fill_random, gdn_cache_params, hybrid_pools,
                                            kda_cache_params, set_server_args)

pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")]


def _make(tmp_path, kind="gdn", num_slots=6, mamba_size=8, **policy):
    from dasc_runtime.pool import DascCheckpointPool
    from dasc_runtime.rank_layout import build_rank_layout

    set_server_args()
    plan, _, _ = compile_tiny(tmp_path, kind, **policy)
    cp = gdn_cache_params() if kind == "gdn" else kda_cache_params()
    pool, alloc = hybrid_pools(cp, mamba_size=mamba_size)
    fill_random(pool.mamba_pool, seed=3)
    layout = build_rank_layout(plan, 0, 1, num_layers=len(cp.layers))
    dp = DascCheckpointPool(layout=layout, num_slots=num_slots, conv_shapes=cp.shape.conv,
                            native_size=pool.mamba_pool.size, device="cpu")
    return plan, pool, dp


def test_alloc_free_accounting(tmp_path):
    _, pool, dp = _make(tmp_path, num_slots=4)
    assert dp.available_size() == 4 and dp.id_offset == 9       # native ids 0..8, compressed ids 10..13
    got = [dp.alloc(1) for _ in range(4)]
    assert [int(g) for g in got] == [10, 11, 12, 13]
    assert dp.alloc(1) is None and dp.available_size() == 0
    assert all(dp.is_own_id_tensor(g) for g in got)
    assert dp.slots_of(got[2]) == [3]
    dp.free(got[1])
    assert dp.available_size() == 1 and not dp.is_allocated(2)
    with pytest.raises(AssertionError, match="double free of dasc compressed slot 2"):
        dp.free(got[1])
    with pytest.raises(AssertionError, match="not a dasc compressed slot id"):
        dp.free(torch.tensor([3]))                               # a native id
    again = dp.alloc(1)
    assert int(again) == 11                                      # the freed slot is reused
    dp.free(torch.tensor([13]))                                  # a copy (not a view): read from the tensor
    assert dp.available_size() == 1
    dp.clear()
    assert dp.available_size() == 4 and dp.used_size() == 0


def test_store_and_restore_hand_the_kernels_16_byte_aligned_slot_ids(tmp_path):
    """A slot view at an 8-byte offset (SGLang slices its index tensors) reached the pack kernel as an
    unaligned pointer, and Triton compiled a second pack_kernel variant inside a timed run (session 18)."""
    _, pool, dp = _make(tmp_path)
    mp = pool.mamba_pool
    seen = []
    store, load = dp.ops.store, dp.ops.load
    dp.ops.store = lambda layout, cache, src, rows, ckpt: (seen.append(("store", src)), store(layout, cache, src, rows, ckpt))
    dp.ops.load = lambda layout, cache, rows, dst, ckpt: (seen.append(("load", dst)), load(layout, cache, rows, dst, ckpt))
    base = torch.tensor([0, 2, 5, 7], dtype=torch.int64)
    assert base[1:].data_ptr() % 16 == 8                         # the view the pool is given
    ids = torch.cat([dp.alloc(1), dp.alloc(1)])
    dp.store_from_active(mp, base[1:3], ids)
    dp.load_compressed(mp, ids, base[1:3])
    assert [(k, t.tolist(), t.dtype, t.data_ptr() % 16) for k, t in seen] == [
        ("store", [2, 5], torch.int64, 0), ("load", [2, 5], torch.int64, 0)]


def _dense_reference(mamba_pool, slot, kept_per_layer):
    """Expected dasc-nr restore of native ``slot``: kept heads exact, others zero; conv exact."""
    t = mamba_pool.mamba_cache.temporal[:, slot].clone()                      # [L, H, dv, dk]
    for l, kept in enumerate(kept_per_layer):
        for h in range(t.shape[1]):
            if h not in kept:
                t[l, h] = 0
    return t, [c[:, slot].clone() for c in mamba_pool.mamba_cache.conv]


def test_store_then_load_gdn_kept_exact_local_zero(tmp_path):
    _, pool, dp = _make(tmp_path)
    mp = pool.mamba_pool
    src = torch.tensor([2, 5])
    ids = torch.cat([dp.alloc(1), dp.alloc(1)])
    dp.store_from_active(mp, src, ids)
    assert dp.layout.n_kept == 7 and dp.layout.offsets == (0, 2, 4, 7)
    # the ragged rows hold exactly the kept heads, layer by layer (App. B Scheme 2)
    rows = dp.slots_of(ids)
    for i, s in enumerate(src.tolist()):
        packed = dp.temporal[rows[i]]
        flat = [mp.mamba_cache.temporal[l, s, h] for l, kept in enumerate(GDN_KEPT_W16) for h in kept]
        assert torch.equal(packed, torch.stack(flat))
    expect = [_dense_reference(mp, s, GDN_KEPT_W16) for s in src.tolist()]
    dst = torch.tensor([7, 1])
    dp.load_to_active(mp, ids, dst)
    for (t, conv), d in zip(expect, dst.tolist()):
        assert torch.equal(mp.mamba_cache.temporal[:, d], t)
        for c, ref in zip(mp.mamba_cache.conv, conv):
            assert torch.equal(c[:, d], ref)
    # two ids concatenated and no tier hint: split on the device (a hint miss), restored all the same
    c = dp.counters
    assert (c.stores, c.batches, c.hint_misses, c.loads_unsplit, c.loads_compressed) == (2, 1, 1, 2, 0)


def test_keep_everything_reproduces_dense_bit_for_bit(tmp_path):
    # w_max = 0 keeps every unit with a positive horizon: the compressed slot is the dense state
    _, pool, dp = _make(tmp_path, w_max=0)
    mp = pool.mamba_pool
    assert dp.layout.keeps_everything and dp.layout.n_kept == 3 * GDN_HEADS
    before_t = mp.mamba_cache.temporal[:, 4].clone()
    before_c = [c[:, 4].clone() for c in mp.mamba_cache.conv]
    ids = dp.alloc(1)
    dp.store_from_active(mp, torch.tensor([4]), ids)
    dp.load_to_active(mp, ids, torch.tensor([6]))
    assert torch.equal(mp.mamba_cache.temporal[:, 6], before_t)
    assert all(torch.equal(c[:, 6], b) for c, b in zip(mp.mamba_cache.conv, before_c))
    assert mp.mamba_cache.temporal[:, 6].view(torch.int32).equal(before_t.view(torch.int32))


def test_mixed_batch_dense_copy_and_compressed_restore(tmp_path):
    from dasc_runtime.side_channels import attach_tier_hint, tier_hint

    _, pool, dp = _make(tmp_path)
    mp = pool.mamba_pool
    ids = dp.alloc(1)
    dp.store_from_active(mp, torch.tensor([3]), ids)
    exp_c, _ = _dense_reference(mp, 3, GDN_KEPT_W16)
    exp_d = mp.mamba_cache.temporal[:, 2].clone()
    src = torch.cat([torch.tensor([2]), ids])                   # native id 2 (dense hit), compressed id
    for hinted in (True, False):
        mp.mamba_cache.temporal[:, 5:7] = 7.0
        s = src.clone()
        if hinted:
            attach_tier_hint(s, [False, True])
            assert tier_hint(s) == [False, True]
        misses = dp.counters.hint_misses
        dp.load_to_active(mp, s, torch.tensor([5, 6]))
        assert torch.equal(mp.mamba_cache.temporal[:, 5], exp_d)   # exact dense copy
        assert torch.equal(mp.mamba_cache.temporal[:, 6], exp_c)   # dasc-nr
        assert dp.counters.hint_misses == misses + (0 if hinted else 1)
    assert dp.counters.mixed_batches == 1 and (dp.counters.loads_dense, dp.counters.loads_compressed) == (1, 1)


def test_kda_columns_kept_exact_local_zero(tmp_path):
    plan, pool, dp = _make(tmp_path, kind="kda")
    mp = pool.mamba_pool
    assert dp.layout.unit_kind == "kda_column" and dp.temporal.shape[-1] == KDA_D
    ids = dp.alloc(1)
    src = mp.mamba_cache.temporal[:, 1].clone()                  # [L, H, dv, dk]
    dp.store_from_active(mp, torch.tensor([1]), ids)
    dp.load_to_active(mp, ids, torch.tensor([2]))
    got = mp.mamba_cache.temporal[:, 2]
    for l, lp in enumerate(plan.layers):
        kept = set(lp.kept_units)
        for h in range(KDA_HEADS):
            for k in range(KDA_D):
                col_got, col_src = got[l, h, :, k], src[l, h, :, k]    # unit u = h * d_k + k is S[h, :, k]
                if h * KDA_D + k in kept:
                    assert torch.equal(col_got, col_src)
                else:
                    assert torch.count_nonzero(col_got) == 0
    assert dp.bytes_per_slot() == plan.totals.bytes_compressed_checkpoint


def test_int8_composition_matches_eq8(tmp_path):
    plan, pool, dp = _make(tmp_path, int8=True)
    mp = pool.mamba_pool
    assert dp.temporal.dtype == torch.int8 and dp.scale.shape[1:] == (7, GDN_D)
    assert dp.bytes_per_slot() == plan.totals.bytes_compressed_checkpoint
    # a hand-checked column: values (-2.54, 0, 1.27, ...) -> amax 2.54, scale 0.02, q = (-127, 0, 64 (63.5 rounds to even: 64))
    mp.mamba_cache.temporal[0, 1, 0] = 0.0
    mp.mamba_cache.temporal[0, 1, 0, 0, 0] = -2.54
    mp.mamba_cache.temporal[0, 1, 0, 2, 0] = 1.27
    ids = dp.alloc(1)
    dp.store_from_active(mp, torch.tensor([1]), ids)
    row = dp.slots_of(ids)[0]
    s = float(dp.scale[row, 0, 0])
    assert s == pytest.approx(2.54 / 127, rel=1e-6)
    assert dp.temporal[row, 0, 0, 0].item() == -127 and dp.temporal[row, 0, 1, 0].item() == 0
    assert dp.temporal[row, 0, 2, 0].item() == round(1.27 / torch.tensor(s, dtype=torch.float32).item())
    src = mp.mamba_cache.temporal[:, 1].clone()
    dp.load_to_active(mp, ids, torch.tensor([4]))
    got = mp.mamba_cache.temporal[:, 4]
    for l, kept in enumerate(GDN_KEPT_W16):
        for h in range(GDN_HEADS):
            if h in kept:   # |error| <= s / 2 per (l, h, k): Eq. 8 rounding
                amax = src[l, h].abs().amax(dim=0)                # [dk]
                bound = (amax.clamp(min=1e-8) / 127) / 2 + 1e-7
                assert bool(((got[l, h] - src[l, h]).abs() <= bound).all())
            else:
                assert torch.count_nonzero(got[l, h]) == 0


def test_budget_sizing_and_matched_memory(tmp_path):
    from dasc_compile.errors import DascInputError
    from dasc_runtime.pool import slots_for_budget
    from dasc_runtime.sizing import matched_memory

    plan, pool, dp = _make(tmp_path)
    b = dp.bytes_per_slot()
    assert b == 7 * GDN_D * GDN_D * 4 + 3 * 128 * 3 * 2 == 9472
    assert slots_for_budget(10 * b, b) == 9 and slots_for_budget(10 * b + b - 1, b) == 9
    with pytest.raises(DascInputError, match="holds no usable slot"):
        slots_for_budget(2 * b - 1, b)
    b_dense = 3 * GDN_HEADS * GDN_D * GDN_D * 4 + 3 * 128 * 3 * 2     # 14592
    mm = matched_memory(dense_slots=100, native_slots=40, bytes_dense_slot=b_dense, bytes_compressed_slot=b,
                        scratch_bytes=4 * b)
    # (40+1)*14592 + (C+1)*9472 + 4*9472 <= 101*14592  ->  C = floor(875520/9472) - 5 = 92 - 5 = 87
    assert mm.compressed_slots == math.floor((101 - 41) * b_dense / b) - 4 - 1 == 87
    assert mm.used_bytes <= mm.budget_bytes < mm.used_bytes + b
    assert mm.flags() == "--max-mamba-cache-size 40 --dasc-pool-slots 87"
    with pytest.raises(DascInputError, match="no compressed slot fits"):
        matched_memory(dense_slots=10, native_slots=10, bytes_dense_slot=b_dense, bytes_compressed_slot=b)


@pytest.mark.parametrize("kind,int8", [("gdn", False), ("gdn", True), ("kda", False), ("kda", True),
                                       ("mamba2", False), ("mamba2", True)],
                         ids=["gdn", "gdn-int8", "kda", "kda-int8", "mamba2", "mamba2-int8"])
def test_kernels_reference_and_helper_reference_agree(tmp_path, monkeypatch, kind, int8):
    """The plan's generated kernels (Triton interpreter on CPU), the pool's PyTorch path and
    dasc_runtime.torch_kernels give bit-identical pools and restored states; the kernels read the
    layout's own index, which equals a StateIndex built from the plan."""
    from dasc_runtime import torch_kernels
    from dasc_runtime.ops import KernelOps, TorchOps, select_ops
    from dasc_runtime.pool import DascCheckpointPool
    from dasc_runtime.rank_layout import build_rank_layout, build_state_index

    set_server_args()
    plan, pdir, _ = compile_tiny(tmp_path, kind, with_kernels=True, int8=int8)
    cp = cache_params_for(kind)
    layout = build_rank_layout(plan, 0, 1, 3)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kops = select_ops(plan, pdir, layout, "cpu", interpret=True)
    assert isinstance(kops, KernelOps)
    pools, states = [], []
    for ops in (TorchOps(), kops):
        pool, _ = hybrid_pools(cp, mamba_size=6)
        fill_random(pool.mamba_pool, seed=11)
        dp = DascCheckpointPool(layout=layout, num_slots=3, conv_shapes=cp.shape.conv, native_size=6, device="cpu",
                                ops=ops)
        ids = torch.cat([dp.alloc(1), dp.alloc(1)])
        dp.store_from_active(pool.mamba_pool, torch.tensor([5, 2]), ids)
        dp.load_to_active(pool.mamba_pool, ids.flip(0), torch.tensor([1, 3]))
        pools.append(dp)
        states.append(pool.mamba_pool.mamba_cache)
    a, b = pools
    assert torch.equal(a.temporal, b.temporal) and all(torch.equal(x, y) for x, y in zip(a.conv, b.conv))
    if int8:
        assert torch.equal(a.scale, b.scale)
    assert torch.equal(states[0].temporal, states[1].temporal)
    assert all(torch.equal(x, y) for x, y in zip(states[0].conv, states[1].conv))
    # the PyTorch kernels (dasc_runtime.torch_kernels) on the same inputs
    pool, _ = hybrid_pools(cp, mamba_size=6)
    fill_random(pool.mamba_pool, seed=11)
    mc = pool.mamba_pool.mamba_cache
    ix = build_state_index(plan)
    assert all(torch.equal(getattr(ix, f), getattr(layout.index, f)) for f in ("unit_row", "kept_heads", "offsets"))
    comp = torch.zeros_like(a.temporal)
    conv = [torch.zeros_like(c) for c in a.conv]
    rows, src = torch.tensor([1, 2]), torch.tensor([5, 2])
    if int8:
        scale = torch.zeros_like(a.scale)
        torch_kernels.pack_int8(temporal=mc.temporal, conv=list(mc.conv), src_slots=src, comp_q=comp, comp_scale=scale,
                             comp_conv=conv, dst_slots=rows, unit_row=ix.unit_row, kept_heads=ix.kept_heads)
        assert torch.equal(scale, a.scale)
    else:
        torch_kernels.pack(temporal=mc.temporal, conv=list(mc.conv), src_slots=src, comp_temporal=comp, comp_conv=conv,
                        dst_slots=rows, unit_row=ix.unit_row, kept_heads=ix.kept_heads)
    assert torch.equal(comp, a.temporal) and all(torch.equal(x, y) for x, y in zip(conv, a.conv))


def test_sizing_helper_uses_the_plans_per_rank_bytes(tmp_path, capsys):
    from dasc_runtime.sizing import main, plan_matched_memory

    plan, pdir, _ = compile_tiny(tmp_path)
    b_dense, b_comp = 3 * GDN_HEADS * GDN_D * GDN_D * 4 + 3 * 128 * 3 * 2, 9472
    assert (plan.tp.bytes_dense_per_slot, plan.tp.bottleneck_bytes_per_slot) == (b_dense, b_comp)
    mm = plan_matched_memory(plan, dense_slots=64, native_slots=16, scratch_slots=2)
    # (16+1)*14592 + (C+1)*9472 + 2*9472 <= 65*14592  ->  C = floor(48*14592 / 9472) - 3 = 73 - 3 = 70
    assert mm.compressed_slots == 70
    assert main(["--plan", str(pdir), "--dense-slots", "64", "--native-slots", "16", "--scratch-slots", "2"]) == 0
    assert f"dasc arm:  --max-mamba-cache-size 16 --dasc-pool-slots 70 --dasc-plan {pdir}" in capsys.readouterr().out
    assert main(["--plan", str(tmp_path / "missing"), "--dense-slots", "4", "--native-slots", "2"]) == 2


def test_pool_moves_layout_indices_to_its_device_once(tmp_path):
    from dasc_runtime.pool import DascCheckpointPool
    from dasc_runtime.rank_layout import build_rank_layout

    plan, _, _ = compile_tiny(tmp_path)
    cp = gdn_cache_params()
    layout = build_rank_layout(plan, 0, 1, num_layers=len(cp.layers))
    assert layout.kept_flat.device.type == "cpu"
    # "meta" stands in for a CUDA pool on this CPU machine: the pool's own layout holds the index
    # tensors on the pool device, so store / load never copy them again
    dp = DascCheckpointPool(layout=layout, num_slots=2, conv_shapes=cp.shape.conv, native_size=4, device="meta")
    assert dp.layout.kept_flat.device.type == "meta" and dp.layout.local_flat.device.type == "meta"
    assert dp.layout.index.unit_row.device.type == "meta"          # the kernels' index moved with it
    assert dp.layout.kept_flat.shape == layout.kept_flat.shape and dp.layout.n_kept == layout.n_kept
    assert layout.kept_flat.device.type == "cpu"                  # the caller's layout is left as it was
    cpu = DascCheckpointPool(layout=layout, num_slots=2, conv_shapes=cp.shape.conv, native_size=4, device="cpu")
    assert torch.equal(cpu.layout.kept_flat, layout.kept_flat) and torch.equal(cpu.layout.local_flat, layout.local_flat)
