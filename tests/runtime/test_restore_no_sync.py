"""The restore path never blocks the scheduler (issue 13 item 10).

Store, mixed-tier restore (with the plugin's host hint, and a hint miss), watermark demotion on the
side stream, its commit, the reclamation walk's stream-ordered commit and a synchronous demotion,
all through dasc's real pool, ops and two-tier component on SGLang 0.5.17's pools and radix cache.
On a GPU every one of those calls runs under ``torch.cuda.set_sync_debug_mode("error")``: any
host-device synchronization (``.tolist()``, ``.item()``, ``torch.tensor(list, device=cuda)``, a
blocking copy) raises. The CPU variant runs the same scenario (no synchronization to detect there)
so the scenario itself is tested on every machine; the results are checked after each step.
"""

from __future__ import annotations

import contextlib
from array import array

import pytest
import torch

from tests.support import runtime_fixtures as F
from tests.support.runtime_fixtures import GDN_KEPT_W16, SGLANG_SKIP_REASON

pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")]

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA (torch.cuda.set_sync_debug_mode)")])]


@contextlib.contextmanager
def no_sync(device: str):
    """Any host-device synchronization inside raises (CUDA); nothing to detect on a CPU."""
    if device != "cuda":
        yield
        return
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _build(tmp_path, device):
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from dasc_runtime.mamba_component import DascMambaComponent
    from dasc_runtime.ops import select_ops
    from dasc_runtime.pool import DascCheckpointPool
    from dasc_runtime.rank_layout import build_rank_layout
    from dasc_runtime.side_channels import attach_tier_policy
    from dasc_runtime.tiers import TierPolicy

    F.set_server_args()
    plan, plan_dir, _ = F.compile_tiny(tmp_path, with_kernels=(device == "cuda"))
    cp = F.gdn_cache_params()
    pool = HybridReqToTokenPool(size=8, mamba_size=10, mamba_spec_state_size=8, max_context_len=512, device=device,
                                enable_memory_saver=False, cache_params=cp, mamba_layer_ids=list(cp.layers),
                                enable_mamba_extra_buffer=False)
    kv = HybridLinearKVPool(size=512, dtype=torch.bfloat16, page_size=1, head_num=1, head_dim=16,
                            full_attention_layer_ids=[3], device=device, enable_memory_saver=False,
                            mamba_pool=pool.mamba_pool)
    alloc = TokenToKVPoolAllocator(size=512, dtype=torch.bfloat16, device=device, kvcache=kv, need_sort=False)
    layout = build_rank_layout(plan, 0, 1, len(cp.layers), device=device)
    ops = select_ops(plan, str(plan_dir), layout, device)
    dp = DascCheckpointPool(layout=layout, num_slots=4, conv_shapes=cp.shape.conv, native_size=10, device=device,
                            ops=ops)
    attach_tier_policy(dp, TierPolicy(watermark=0))
    pool.mamba_ckpt_pool = dp
    cache = UnifiedRadixCache(CacheInitParams(
        req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=1, disable=False,
        tree_components=(ComponentType.FULL, ComponentType.MAMBA),
        component_registry_override={ComponentType.MAMBA: DascMambaComponent}))
    F.fill_random(pool.mamba_pool, seed=3)
    return pool, alloc, dp, cache, cache.components[ComponentType.MAMBA], ops


def _nr_image(mp, slot):
    t = mp.mamba_cache.temporal[:, slot].clone()
    for layer, kept in enumerate(GDN_KEPT_W16):
        for h in range(t.shape[1]):
            if h not in kept:
                t[layer, h] = 0
    return t


def _insert_dense(cache, pool, alloc, tokens):
    """A dense checkpoint of ``tokens`` in the tree (a native slot SGLang's allocator handed out)."""
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    slot = pool.mamba_allocator.alloc(1)
    cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=alloc.alloc(len(tokens)), mamba_value=slot))
    node = cache.components[list(cache.components)[-1]].tree_core.root_node
    for t in tokens[:1]:
        node = next(c for c in node.children.values() if list(c.key.token_ids)[:1] == [t])
    return node, int(slot)


@pytest.mark.parametrize("device", DEVICES)
def test_store_restore_and_demotion_never_synchronize(tmp_path, device):
    from dasc_runtime.side_channels import attach_tier_hint

    pool, alloc, dp, cache, comp, ops = _build(tmp_path, device)
    mp = pool.mamba_pool
    dev = torch.device(device)
    t = lambda xs: torch.tensor(xs, dtype=torch.int64, device=dev)   # noqa: E731  (index tensors made outside)
    assert ops.name == ("kernels" if device == "cuda" else "torch")
    # warm-up outside the guarded region: the first kernel launch compiles and loads the kernels
    warm = dp.alloc(1)
    dp.store_from_active(mp, t([9]), warm)
    dp.load_to_active(mp, warm, t([10]))
    mp.copy_from(t([4]), t([10]))                   # SGLang's fused copy builds its descriptors once
    dp.free(warm)

    # 1. store (compressed-first insertion's pack)
    c1 = dp.alloc(1)
    src_active, want_c = t([2]), _nr_image(mp, 2)
    with no_sync(device):
        dp.store_from_active(mp, src_active, c1)
    # 2. a batch mixing a dense and a compressed hit, with the plugin's hint, then without (a hint miss)
    want_d = mp.mamba_cache.temporal[:, 3].clone()
    for hinted, dst in ((True, t([5, 6])), (False, t([7, 8]))):
        batch_src = torch.cat([t([3]), c1])
        if hinted:
            attach_tier_hint(batch_src, [False, True])
        with no_sync(device):
            dp.load_to_active(mp, batch_src, dst)
        d, c = dst.tolist()
        assert torch.equal(mp.mamba_cache.temporal[:, d], want_d), "dense hit restored wrong"
        assert torch.equal(mp.mamba_cache.temporal[:, c], want_c), "compressed hit restored wrong"
    assert (dp.counters.mixed_batches, dp.counters.hint_misses) == (1, 1)

    # 3. a watermark demotion on the side stream, committed by maintain once its event completed
    a, slot_a = _insert_dense(cache, pool, alloc, [101, 102, 103])
    want_a = _nr_image(mp, slot_a)
    with no_sync(device):
        comp.demote_async(a)
    assert a.id in comp.pending
    if device == "cuda":
        torch.cuda.synchronize()                    # the pack has completed (outside the guard)
    with no_sync(device):
        comp.maintain()                             # closes the launch epoch
        comp.maintain()                             # commits on event.query(), frees the native slot
    assert comp.tier(a) == "compressed" and not comp.pending
    # 4. the reclamation walk's commit: the current stream waits on the pack's event, the host does not
    b, slot_b = _insert_dense(cache, pool, alloc, [201, 202])
    want_b = _nr_image(mp, slot_b)
    with no_sync(device):
        comp.demote_async(b)
        n = comp.demotions.commit_ready(comp.epoch, include_current_epoch=True, wait=True)
    assert n == 1 and comp.tier(b) == "compressed" and comp.counters.reclaim_waits == 1
    # 5. a synchronous demotion (every demotion of a storage-balanced pool)
    e, slot_e = _insert_dense(cache, pool, alloc, [301, 302, 303, 304])
    want_e = _nr_image(mp, slot_e)
    with no_sync(device):
        comp.demotions.demote_now(e)
    assert comp.tier(e) == "compressed"
    # every demoted checkpoint restores to its dasc-nr image (the packs really ran before the commits)
    for node, want, dst in ((a, want_a, 1), (b, want_b, 4), (e, want_e, 9)):
        value, dst_t = node.component_data[comp.component_type].value, t([dst])
        with no_sync(device):
            dp.load_to_active(mp, value, dst_t)
        assert torch.equal(mp.mamba_cache.temporal[:, dst], want), f"demoted node {node.id} restored wrong"
