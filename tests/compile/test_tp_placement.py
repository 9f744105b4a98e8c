"""TP placement (paper App. B.1, Fig. 9): compute-head permutation, storage balancing, accounting.

Hand-computed cases, property tests over random cost tables (hypothesis), and exactness of the
head permutation on real layer code: transformers' Qwen3-Next / Qwen3.5 GatedDeltaNet (plain-PyTorch
fallback) and a naive Kimi Delta Attention layer written from SGLang's Kimi-Linear shapes.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dasc_compile.arch import arch_from_config
from dasc_compile.errors import DascInputError
from dasc_compile.policy import Policy
from dasc_compile.tp import (
    assign_bundles,
    balance_storage,
    build_tp_plan,
    bundle_costs,
    coupled_tensors,
    head_costs,
    phi,
)
from dasc_runtime.tp_transfer import load_all_ranks, permute_coupled_tensor, store_all_ranks

PROPS = settings(max_examples=40, deadline=None)


def qwen3_next_cfg(hv=8, hk=4, dk=4, dv=3, layers=4, **extra):
    return {"model_type": "qwen3_next", "num_hidden_layers": layers, "full_attention_interval": 4,
            "linear_num_value_heads": hv, "linear_num_key_heads": hk, "linear_key_head_dim": dk,
            "linear_value_head_dim": dv, "linear_conv_kernel_dim": 4, **extra}


def qwen3_5_cfg(hv=8, hk=4, dk=4, dv=3, layers=4):
    return {"model_type": "qwen3_5", "text_config": {
        "num_hidden_layers": layers, "full_attention_interval": 4, "linear_num_value_heads": hv,
        "linear_num_key_heads": hk, "linear_key_head_dim": dk, "linear_value_head_dim": dv,
        "linear_conv_kernel_dim": 4}}


def kimi_cfg(h=4, d=2, kda_layers=(1, 2, 4)):
    return {"model_type": "kimi_linear", "num_hidden_layers": 4, "linear_attn_config": {
        "num_heads": h, "head_dim": d, "short_conv_kernel_size": 4, "kda_layers": list(kda_layers)}}


# --------------------------------------------------------------------------------------------------
# independent naive references of Fig. 9 (written as literally as possible, pure Python)


def naive_greedy(costs, p):
    nb = len(costs[0])
    quota = nb // p
    loads = [0] * p
    owner = []
    for row in costs:
        used = [0] * p
        own = [None] * nb
        for b in sorted(range(nb), key=lambda b: (-row[b], b)):
            keys = [(loads[r] + row[b], loads[r], used[r], r) for r in range(p) if used[r] < quota]
            r = min(keys)[3]
            own[b] = r
            used[r] += 1
            loads[r] += row[b]
        owner.append(own)
    return owner, loads


def loads_of(costs, owner, p):
    loads = [0] * p
    for row, own in zip(costs, owner):
        for b, r in enumerate(own):
            loads[r] += row[b]
    return loads


def naive_local_search(costs, owner, p):
    owner = [list(o) for o in owner]
    while True:
        cur = phi(loads_of(costs, owner, p))
        best = None
        for layer, own in enumerate(owner):
            for b1 in range(len(own)):
                for b2 in range(b1 + 1, len(own)):
                    if own[b1] == own[b2]:
                        continue
                    own[b1], own[b2] = own[b2], own[b1]
                    val = phi(loads_of(costs, owner, p))
                    own[b1], own[b2] = own[b2], own[b1]
                    if val < cur and (best is None or val < best[0]):
                        best = (val, layer, b1, b2)
        if best is None:
            return owner
        _, layer, b1, b2 = best
        owner[layer][b1], owner[layer][b2] = owner[layer][b2], owner[layer][b1]


# --------------------------------------------------------------------------------------------------
# (a) compute-head permutation: hand cases


def test_greedy_hand_case_already_optimal():
    # costs [4,3,2,1], P=2, K=2: b0->r0 (tie on (4,0,0,r): r0); b1->r1; b2: (6,4,1,0) vs (5,3,1,1) -> r1;
    # b3 -> r0 (r1 full). Loads [5, 5]: no swap can improve.
    a = assign_bundles([[4, 3, 2, 1]], 2)
    assert a.greedy_owner == [[0, 1, 1, 0]]
    assert a.owner == [[0, 1, 1, 0]] and a.loads == [5, 5] and a.swaps == []


def test_local_search_hand_case_fixes_greedy():
    # costs [3,3,2,2,2,0], P=2, K=3. Greedy: b0->r0, b1->r1, b2->r0 (tie (5,3,1,r)), b3->r1,
    # b4->r0 (tie (7,5,2,r)), b5->r1: loads [7,5], Phi=(7,74). The only strictly improving swap is
    # (b0, b3): loads [6,6], Phi=(6,72). Ties (b2/b4 with b5: Phi (7,74)) are not strict.
    a = assign_bundles([[3, 3, 2, 2, 2, 0]], 2)
    assert a.greedy_owner == [[0, 1, 0, 1, 0, 1]] and a.greedy_loads == [7, 5]
    assert a.swaps == [(0, 0, 3)]
    assert a.owner == [[1, 1, 0, 0, 0, 1]] and a.loads == [6, 6]


def test_greedy_cumulative_over_layers():
    # layer 0 [5,1]: b0->r0, b1->r1 -> [5,1]; layer 1 [4,0]: b0: (9,5,0,0) vs (5,1,0,1) -> r1 -> [5,5];
    # b1 -> r0. Loads [5,5].
    a = assign_bundles([[5, 1], [4, 0]], 2)
    assert a.owner == [[0, 1], [1, 0]] and a.loads == [5, 5]


def test_best_swap_prefers_lower_sum_of_squares_then_first():
    # P=4, K=1, one layer of 4 bundles plus a prior layer fixing loads, checked against the naive search.
    costs = [[9, 0, 0, 0], [0, 3, 5, 8], [1, 7, 2, 2]]
    a = assign_bundles(costs, 4)
    g_owner, _ = naive_greedy(costs, 4)
    assert a.greedy_owner == g_owner
    assert a.owner == naive_local_search(costs, g_owner, 4)


# --------------------------------------------------------------------------------------------------
# (a) property tests


@st.composite
def cost_tables(draw):
    p = draw(st.sampled_from([2, 4, 8]))
    k = draw(st.integers(1, 3 if p < 8 else 2))
    n_layers = draw(st.integers(1, 4))
    hi = draw(st.sampled_from([1, 2, 16]))          # GDN indicators, GDN bundles of 2, KDA channel counts
    rows = draw(st.lists(st.lists(st.integers(0, hi), min_size=p * k, max_size=p * k),
                         min_size=n_layers, max_size=n_layers))
    return rows, p


@PROPS
@given(cost_tables())
def test_assignment_properties(case):
    costs, p = case
    a = assign_bundles(costs, p)
    nb = len(costs[0])
    # quotas preserved: exactly K bundles per rank per layer
    for own in a.owner:
        assert sorted(own) == sorted(list(range(p)) * (nb // p))
    assert a.loads == loads_of(costs, a.owner, p)
    assert sum(a.loads) == sum(map(sum, costs))
    # local optimality: no single within-layer swap of bundles on different ranks improves Phi
    cur = phi(a.loads)
    for layer, own in enumerate(a.owner):
        for b1, b2 in itertools.combinations(range(nb), 2):
            if own[b1] != own[b2]:
                d = costs[layer][b2] - costs[layer][b1]
                new = list(a.loads)
                new[own[b1]] += d
                new[own[b2]] -= d
                assert not phi(new) < cur, (layer, b1, b2)
    # never worse than greedy, and exactly the paper's procedure (tie-breaks included)
    assert phi(a.loads) <= phi(a.greedy_loads)
    g_owner, g_loads = naive_greedy(costs, p)
    assert a.greedy_owner == g_owner and a.greedy_loads == g_loads
    assert a.owner == naive_local_search(costs, g_owner, p)
    # determinism
    assert assign_bundles(costs, p) == a


def test_assign_rejects_bad_quota():
    with pytest.raises(ValueError, match="divisible"):
        assign_bundles([[1, 2, 3]], 2)


# --------------------------------------------------------------------------------------------------
# (b) storage balancing: hand cases


def test_storage_hand_case_even():
    # n=[5,1,3,3], N=12, q=3, m=0 -> t=[3,3,3,3]; rank 0's units 3,4 go to rank 1 positions 1,2.
    s = balance_storage([5, 1, 3, 3])
    assert s.targets == [3, 3, 3, 3] and s.keep == [3, 1, 3, 3] and s.slot_width == 3
    assert s.runs[0] == [[0, 3, 0, 0], [3, 2, 1, 1]]
    assert s.dest_map(0) == ([0, 0, 0, 1, 1], [0, 1, 2, 1, 2])
    assert s.send_splits == [[0, 2, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert s.recv_splits(1) == [2, 0, 0, 0]
    assert s.m_remote == 2 and not s.skip_all_to_all


def test_storage_hand_case_remainder():
    # n=[2,7,0,4], N=13, q=3, m=1; order by (-n, r): r1, r3, r0, r2 -> t=[3,4,3,3].
    # excess: (1,4),(1,5),(1,6),(3,3); deficit: (0,2),(2,0),(2,1),(2,2).
    s = balance_storage([2, 7, 0, 4])
    assert s.targets == [3, 4, 3, 3] and s.keep == [2, 4, 0, 3] and s.slot_width == 4
    assert s.dest_map(1) == ([1, 1, 1, 1, 0, 2, 2], [0, 1, 2, 3, 2, 0, 1])
    assert s.dest_map(3) == ([3, 3, 3, 2], [0, 1, 2, 2])
    assert s.send_splits[1] == [1, 0, 2, 0] and s.send_splits[3] == [0, 0, 1, 0]
    assert s.recv_splits(2) == [0, 2, 0, 1]
    assert s.m_remote == 4


def test_storage_ties_go_to_lower_rank_and_balanced_skips():
    # n=[3,3,3,3]+1 at r2: N=13, m=1, (-n, r) puts r2 first -> no transfer
    s = balance_storage([3, 3, 4, 3])
    assert s.targets == [3, 3, 4, 3] and s.m_remote == 0 and s.skip_all_to_all
    s = balance_storage([0, 0, 0])
    assert s.targets == [0, 0, 0] and s.slot_width == 0 and s.runs == [[], [], []]
    # equal counts tie by rank: n=[2,2,0], N=4, q=1, m=1 -> r0 gets 2, r1 gets 1, its unit 1 -> r2
    s = balance_storage([2, 2, 0])
    assert s.targets == [2, 1, 1] and s.dest_map(1) == ([1, 2], [0, 0])


@PROPS
@given(st.sampled_from([2, 4, 8]).flatmap(
    lambda p: st.lists(st.integers(0, 40), min_size=p, max_size=p)))
def test_storage_properties(n):
    p = len(n)
    s = balance_storage(n)
    total = sum(n)
    q, m = divmod(total, p)
    # targets met: {q, q+1}, sum N, the q+1 go to the first m ranks by (-n_r, r)
    assert sum(s.targets) == total and s.slot_width == math.ceil(total / p)
    first = sorted(range(p), key=lambda r: (-n[r], r))[:m]
    assert s.targets == [q + 1 if r in first else q for r in range(p)]
    # the map is a bijection from packed units onto storage positions [0, t_s)
    seen = set()
    moved = 0
    for r in range(p):
        ranks, pos = s.dest_map(r)
        assert len(ranks) == n[r]
        for j, (d, x) in enumerate(zip(ranks, pos)):
            assert 0 <= x < s.targets[d]
            seen.add((d, x))
            if j < min(n[r], s.targets[r]):
                assert (d, x) == (r, j)               # keep-first
            moved += d != r
        for d in range(p):
            assert s.send_splits[r][d] == sum(1 for x in ranks if x == d and d != r)
    assert len(seen) == total
    # transfer equals the minimum: over every target vector in {q, q+1}^P summing to N
    best = min(sum(max(0, a - t) for a, t in zip(n, tt))
               for tt in itertools.product([q, q + 1], repeat=p) if sum(tt) == total)
    assert s.m_remote == moved == best == sum(max(0, a - t) for a, t in zip(n, s.targets))
    assert balance_storage(n) == s


@PROPS
@given(st.sampled_from([2, 4, 8]).flatmap(
    lambda p: st.lists(st.integers(0, 12), min_size=p, max_size=p)), st.integers(0, 2**31 - 1))
def test_store_then_load_is_identity(n, seed):
    s = balance_storage(n)
    g = torch.Generator().manual_seed(seed)
    packed = [torch.randn(k, 3, 2, generator=g) for k in n]
    storage = store_all_ranks(packed, s)
    assert all(t.shape == (s.slot_width, 3, 2) for t in storage)
    back = load_all_ranks(storage, s)
    assert all(torch.equal(a, b) for a, b in zip(packed, back))
    # every stored row is one packed row, at the place the map says
    for r in range(len(n)):
        for j, (d, x) in enumerate(zip(*s.dest_map(r))):
            assert torch.equal(storage[d][x], packed[r][j])


# --------------------------------------------------------------------------------------------------
# build_tp_plan: accounting, modes, errors


def _gdn_plan(balance, kept, p=2, budget=None, **cfg):
    spec = arch_from_config(qwen3_next_cfg(**cfg))
    pol = Policy(tp_size=p, balance=balance, pool_budget_bytes=budget)
    return spec, build_tp_plan(spec, kept, pol, bytes_per_unit=48, conv_bytes_per_layer_rank=84,
                               dense_temporal_bytes_per_layer_rank=192)


# 3 GDN layers (model layers 0,1,2), H_v = 8, H_k = 4 (B = 2), P = 2: contiguous rank 0 = heads 0..3
KEPT = [[0, 1, 2, 3, 5], [0, 1, 2], [3, 7]]


def test_off_accounting_by_hand():
    _, tp = _gdn_plan("off", KEPT, budget=10_000)
    # rank 0 keeps 4 + 3 + 1 = 8 units, rank 1 keeps 1 + 0 + 1 = 2
    assert [x.n_kept for x in tp.payload_contiguous] == [8, 2]
    assert tp.kept_per_rank_layer == [[4, 3, 1], [1, 0, 1]]
    assert [x.bytes_per_slot for x in tp.payload_storage] == [8 * 48 + 3 * 84, 2 * 48 + 3 * 84]
    assert tp.bottleneck_rank == 0 and tp.bottleneck_bytes_per_slot == 636
    assert tp.bytes_dense_per_slot == 3 * (192 + 84)
    assert tp.c_ckpt_tp == pytest.approx(828 / 636)
    assert tp.usable_slots == 10_000 // 636 - 1 == 14
    assert tp.m_remote == 0 and tp.storage is None and tp.permutation is None
    assert tp.payload_compute == tp.payload_contiguous == tp.payload_storage


def test_storage_accounting_by_hand():
    _, tp = _gdn_plan("storage", KEPT, budget=10_000)
    # N = 10 -> t = [5, 5], 3 units move from rank 0 to rank 1; every rank reserves 5 per slot
    assert tp.storage.targets == [5, 5] and tp.m_remote == 3 and tp.storage.slot_width == 5
    assert [x.n_kept for x in tp.payload_storage] == [5, 5]
    assert tp.bottleneck_bytes_per_slot == 5 * 48 + 252 == 492
    assert tp.c_ckpt_tp == pytest.approx(828 / 492)
    assert tp.usable_slots == 10_000 // 492 - 1 == 19
    assert tp.payload_compute == tp.payload_contiguous


def test_hybrid_by_hand():
    spec, tp = _gdn_plan("hybrid", KEPT)
    # bundle costs per layer (B=2): [2,2,1,0], [2,1,0,0], [0,1,0,1]; K = 2 per rank.
    # layer 0: b0->r0 (tie), b1->r1, b2->r0 (tie (3,2,1,r)), b3->r1 => loads [3,2]
    # layer 1: b0: (5,3,0,0) vs (4,2,0,1) -> r1 [3,4]; b1: (4,3,0,0) -> r0 [4,4]; b2 -> r0 (tie); b3 -> r1
    # layer 2: b1 -> r0 (tie) [5,4]; b3: (5,4,0,1) -> r1 [5,5]; b0 -> r0 (tie); b2 -> r1. Phi = (5,50): no swaps.
    owners = [p.bundle_owner for p in tp.permutation]
    assert owners == [[0, 1, 0, 1], [1, 0, 0, 1], [0, 0, 1, 1]]
    assert tp.permutation[0].bundle_order == [0, 2, 1, 3]
    assert tp.permutation[0].head_order == [0, 1, 4, 5, 2, 3, 6, 7]
    assert tp.permutation[1].head_order == [2, 3, 4, 5, 0, 1, 6, 7]
    assert tp.kept_per_rank_layer == [[3, 1, 1], [2, 2, 1]]
    assert [x.n_kept for x in tp.payload_compute] == [5, 5]
    assert tp.m_remote == 0 and tp.storage.skip_all_to_all
    assert [x.n_kept for x in tp.payload_contiguous] == [8, 2]
    # rank-local units: layer 0 rank 0 computes original heads [0,1,4,5] (kept 0,1,5 -> local 0,1,3);
    # layer 1 rank 0 heads [2,3,4,5] (kept 2 -> 0); layer 2 identity order, rank 0 heads 0..3 (kept 3)
    assert tp.rank_kept_units(KEPT, 0) == [[0, 1, 3], [0], [3]]
    assert tp.rank_local_units(KEPT, 1) == [[0, 1], [0, 1], [3]]
    names = [c.name for c in tp.permutation[1].coupled_tensors]
    assert "model.layers.1.linear_attn.in_proj_qkvz.weight" in names
    assert build_tp_plan(spec, KEPT, Policy(tp_size=2, balance="hybrid"), bytes_per_unit=48,
                         conv_bytes_per_layer_rank=84, dense_temporal_bytes_per_layer_rank=192) == tp


def test_kda_rank_local_units_and_storage_counts():
    spec = arch_from_config(kimi_cfg(h=4, d=2, kda_layers=(1,)))
    kept = [[0, 1, 2, 5, 7]]   # heads 0 (k 0,1), 1 (k 0), 2 (k 1), 3 (k 1): costs [2,1,1,1]
    tp = build_tp_plan(spec, kept, Policy(tp_size=2, balance="hybrid"), bytes_per_unit=8,
                       conv_bytes_per_layer_rank=0, dense_temporal_bytes_per_layer_rank=32)
    # greedy: b0->r0 [2,0]; b1->r1 [2,1]; b2->r1 (2,1,1,1) [2,2]; b3->r0 => [3,2]
    assert tp.permutation[0].bundle_owner == [0, 1, 1, 0] and tp.permutation[0].head_order == [0, 3, 1, 2]
    assert tp.rank_local_units(kept, 0) == [[0, 1, 3]]     # local head 0 = h0 (k0,k1), local 1 = h3 (k1)
    assert tp.rank_local_units(kept, 1) == [[0, 3]]        # local 0 = h1 (k0), local 1 = h2 (k1)
    assert tp.storage.targets == [3, 2] and tp.m_remote == 0
    assert [c.name for c in tp.permutation[0].coupled_tensors][:3] == [
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight"]


@PROPS
@given(st.sampled_from([2, 4, 8]), st.sampled_from(["off", "storage", "hybrid"]), st.integers(0, 2**31 - 1))
def test_plan_invariants_random(p, mode, seed):
    spec = arch_from_config(kimi_cfg(h=8, d=4, kda_layers=(1, 2, 3)))
    rng = np.random.default_rng(seed)
    kept = [sorted(rng.choice(32, size=int(rng.integers(0, 33)), replace=False).tolist()) for _ in range(3)]
    pol = Policy(tp_size=p, balance=mode, pool_budget_bytes=1 << 20)
    tp = build_tp_plan(spec, kept, pol, bytes_per_unit=16, conv_bytes_per_layer_rank=10,
                       dense_temporal_bytes_per_layer_rank=16 * 32 // p)
    total = sum(map(len, kept))
    assert sum(x.n_kept for x in tp.payload_contiguous) == sum(x.n_kept for x in tp.payload_compute) == total
    assert sum(x.n_kept for x in tp.payload_storage) == total
    assert tp.bottleneck_bytes_per_slot == max(x.bytes_per_slot for x in tp.payload_storage)
    if mode != "off":
        assert tp.bottleneck_bytes_per_slot == math.ceil(total / p) * 16 + 30
        assert tp.bottleneck_bytes_per_slot <= max(x.bytes_per_slot for x in tp.payload_contiguous)
    for r in range(p):
        local = tp.rank_local_units(kept, r)
        assert [len(x) for x in local] == tp.kept_per_rank_layer[r]
        assert all(0 <= u < (8 // p) * 4 for x in local for u in x)
    if mode == "hybrid":
        costs = bundle_costs(head_costs(kept, 8, 4), 1)
        ref = assign_bundles(costs, p)
        assert [lp.bundle_owner for lp in tp.permutation] == ref.owner
        assert [x.n_kept for x in tp.payload_compute] == ref.loads
    assert build_tp_plan(spec, kept, pol, bytes_per_unit=16, conv_bytes_per_layer_rank=10,
                         dense_temporal_bytes_per_layer_rank=16 * 32 // p) == tp


def test_tp_size_must_divide_heads():
    spec = arch_from_config(qwen3_next_cfg(hv=32, hk=16))
    with pytest.raises(DascInputError, match=r"tp_size 3 \(--tp, or the policy field 'tp_size'\) .*'linear_num_value_heads' = 32"):
        build_tp_plan(spec, [[]] * 3, Policy(tp_size=3), bytes_per_unit=1, conv_bytes_per_layer_rank=1,
                      dense_temporal_bytes_per_layer_rank=1)
    with pytest.raises(DascInputError, match=r"tp_size 32 \(--tp.*'linear_num_key_heads' = 16"):
        build_tp_plan(spec, [[]] * 3, Policy(tp_size=32, balance="storage"), bytes_per_unit=1,
                      conv_bytes_per_layer_rank=1, dense_temporal_bytes_per_layer_rank=1)
    kspec = arch_from_config(kimi_cfg(h=4))
    with pytest.raises(DascInputError, match=r"'linear_attn_config.num_heads' = 4"):
        build_tp_plan(kspec, [[]] * 3, Policy(tp_size=8), bytes_per_unit=1, conv_bytes_per_layer_rank=1,
                      dense_temporal_bytes_per_layer_rank=1)


def test_hybrid_refuses_quantized_weights():
    spec = arch_from_config(qwen3_next_cfg())
    with pytest.raises(DascInputError, match=r"quantization_config.*fp8.*balance='storage'"):
        build_tp_plan(spec, KEPT, Policy(tp_size=2, balance="hybrid"), bytes_per_unit=1,
                      conv_bytes_per_layer_rank=1, dense_temporal_bytes_per_layer_rank=1,
                      quantization_config={"quant_method": "fp8"})
    tp = build_tp_plan(spec, KEPT, Policy(tp_size=2, balance="storage"), bytes_per_unit=1,
                       conv_bytes_per_layer_rank=1, dense_temporal_bytes_per_layer_rank=1,
                       quantization_config={"quant_method": "fp8"})
    assert tp.m_remote == 3


# --------------------------------------------------------------------------------------------------
# coupled tensors: the permutation is exact on real layer code


def _shard(t: torch.Tensor, ct, r: int, p: int) -> torch.Tensor:
    """SGLang's contiguous TP shard of a coupled tensor: rank r's 1/P of every segment."""
    idx = torch.cat([torch.arange(s + r * (n // p), s + (r + 1) * (n // p)) for s, n in ct.segments])
    return t.index_select(ct.axis, idx)


def _permute_state(sd: dict, cts, order, prefix: str) -> dict:
    out = dict(sd)
    for ct in cts:
        key = ct.name[len(prefix):]
        out[key] = permute_coupled_tensor(sd[key], ct, order)
    return out


@pytest.mark.parametrize("model", ["qwen3_next", "qwen3_5"])
def test_gdn_permutation_exact_on_transformers_layer(model):
    pytest.importorskip("transformers")
    hv, hk, dk, dv, hidden, p = 8, 4, 4, 3, 16, 2
    if model == "qwen3_next":
        from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig as Cfg
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet as Layer
        cfg_dict = qwen3_next_cfg(hv, hk, dk, dv)
    else:
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig as Cfg
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet as Layer
        cfg_dict = qwen3_5_cfg(hv, hk, dk, dv)
    spec = arch_from_config(cfg_dict)
    torch.manual_seed(0)

    def make(nv, nk):
        layer = Layer(Cfg(hidden_size=hidden, linear_num_value_heads=nv, linear_num_key_heads=nk,
                          linear_key_head_dim=dk, linear_value_head_dim=dv, linear_conv_kernel_dim=4,
                          num_hidden_layers=1), 0).double().eval()
        return layer

    full = make(hv, hk)
    with torch.no_grad():
        for prm in full.parameters():
            prm.copy_(torch.randn_like(prm) * 0.5)
    sd = full.state_dict()
    assert sd["norm.weight"].shape == (dv,)            # the gated norm is shared by heads: not coupled
    cts = coupled_tensors(spec, 0)
    prefix = spec.a_log_names[0][: -len("A_log")]
    coupled_keys = {c.name[len(prefix):] for c in cts}
    assert coupled_keys == set(sd) - {"norm.weight"}
    for c in cts:
        assert sd[c.name[len(prefix):]].shape[c.axis] == c.axis_size
    order = [2, 0, 3, 1]                               # bundles = key heads
    psd = _permute_state(sd, cts, order, prefix)
    x = torch.randn(2, 9, hidden, dtype=torch.float64)
    with torch.no_grad():
        y = full(x)
        permuted = make(hv, hk)
        permuted.load_state_dict(psd)
        torch.testing.assert_close(permuted(x), y, rtol=1e-5, atol=1e-6)
        # A_log of new head i is old head head_order[i]
        head_order = [b * 2 + j for b in order for j in range(2)]
        assert torch.equal(psd["A_log"], sd["A_log"][head_order])
        # TP: rank r's contiguous shard computes bundles order[r*K:(r+1)*K]; shard outputs sum to y
        total = torch.zeros_like(y)
        for r in range(p):
            part = make(hv // p, hk // p)
            ssd = dict(psd)
            for c in cts:
                k = c.name[len(prefix):]
                ssd[k] = _shard(psd[k], c, r, p)
            part.load_state_dict(ssd)
            assert torch.equal(ssd["A_log"], sd["A_log"][head_order[r * hv // p:(r + 1) * hv // p]])
            total += part(x)
        # the torch fallback of the chunked delta rule computes in float32 internally
        torch.testing.assert_close(total, y, rtol=1e-5, atol=1e-6)
        # a loader that forgets one coupled tensor breaks the layer (the test can fail)
        bad = dict(psd)
        bad["out_proj.weight"] = sd["out_proj.weight"]
        permuted.load_state_dict(bad)
        assert not torch.allclose(permuted(x), y, atol=1e-3)


def _kda_naive(w: dict, x: torch.Tensor, h: int, d: int, prefix: str) -> torch.Tensor:
    """Naive Kimi Delta Attention layer on checkpoint tensors (shapes of SGLang models/kimi_linear.py).

    x ``[T, hidden]`` float64 -> ``[T, hidden]``. Head-separable between the projections.
    """
    g = lambda n: w[prefix + n]  # noqa: E731
    t_len = x.shape[0]

    def conv(z, wc):                                  # causal depthwise conv, wc [C, 1, K]
        k = wc.shape[-1]
        zp = torch.cat([torch.zeros(k - 1, z.shape[1], dtype=z.dtype), z])
        return torch.stack([(zp[i:i + k].T * wc[:, 0, :]).sum(-1) for i in range(t_len)])

    q, k, v = (torch.nn.functional.silu(conv(x @ g(f"{n}_proj.weight").T, g(f"{n}_conv1d.weight")))
               for n in ("q", "k", "v"))
    q = torch.nn.functional.normalize(q.view(t_len, h, d), dim=-1)
    k = torch.nn.functional.normalize(k.view(t_len, h, d), dim=-1)
    v = v.view(t_len, h, d)
    f = (x @ g("f_a_proj.weight").T @ g("f_b_proj.weight").T).view(t_len, h, d)
    gate = -torch.exp(g("A_log").view(h, 1)) * torch.nn.functional.softplus(f + g("dt_bias").view(h, d))
    beta = torch.sigmoid(x @ g("b_proj.weight").T)
    s = torch.zeros(h, d, d, dtype=x.dtype)           # [H, d_k, d_v]
    outs = []
    for i in range(t_len):
        s = s * torch.exp(gate[i])[:, :, None]
        pred = torch.einsum("hk,hkv->hv", k[i], s)
        s = s + beta[i][:, None, None] * k[i][:, :, None] * (v[i] - pred)[:, None, :]
        outs.append(torch.einsum("hk,hkv->hv", q[i], s))
    o = torch.stack(outs)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * g("o_norm.weight")
    o = o * torch.sigmoid((x @ g("g_a_proj.weight").T @ g("g_b_proj.weight").T).view(t_len, h, d))
    return o.reshape(t_len, h * d) @ g("o_proj.weight").T


def test_kda_permutation_exact_on_naive_layer():
    h, d, hidden, p = 4, 3, 10, 2
    spec = arch_from_config(kimi_cfg(h=h, d=d, kda_layers=(1,)))
    prefix = spec.a_log_names[0][: -len("A_log")]
    gen = torch.Generator().manual_seed(1)
    shapes = {"q_proj.weight": (h * d, hidden), "k_proj.weight": (h * d, hidden), "v_proj.weight": (h * d, hidden),
              "q_conv1d.weight": (h * d, 1, 4), "k_conv1d.weight": (h * d, 1, 4), "v_conv1d.weight": (h * d, 1, 4),
              "f_a_proj.weight": (d, hidden), "f_b_proj.weight": (h * d, d), "g_a_proj.weight": (d, hidden),
              "g_b_proj.weight": (h * d, d), "b_proj.weight": (h, hidden), "A_log": (1, 1, h, 1),
              "dt_bias": (h * d,), "o_norm.weight": (d,), "o_proj.weight": (hidden, h * d)}
    w = {prefix + n: torch.randn(s, generator=gen, dtype=torch.float64) * 0.5 for n, s in shapes.items()}
    assert tuple(spec.a_log_shape) == shapes["A_log"] and tuple(spec.dt_bias_shape) == shapes["dt_bias"]
    cts = coupled_tensors(spec, 0)
    assert {c.name for c in cts} == {prefix + n for n in shapes} - {
        prefix + "f_a_proj.weight", prefix + "g_a_proj.weight", prefix + "o_norm.weight"}
    x = torch.randn(6, hidden, generator=gen, dtype=torch.float64)
    y = _kda_naive(w, x, h, d, prefix)
    order = [3, 1, 0, 2]
    pw = dict(w)
    for c in cts:
        assert w[c.name].shape[c.axis] == c.axis_size
        pw[c.name] = permute_coupled_tensor(w[c.name], c, order)
    torch.testing.assert_close(_kda_naive(pw, x, h, d, prefix), y, rtol=1e-9, atol=1e-9)
    assert torch.equal(pw[prefix + "dt_bias"].view(h, d), w[prefix + "dt_bias"].view(h, d)[order])
    total = torch.zeros_like(y)
    for r in range(p):
        sw = dict(pw)
        for c in cts:
            sw[c.name] = _shard(pw[c.name], c, r, p)
        total += _kda_naive(sw, x, h // p, d, prefix)
    torch.testing.assert_close(total, y, rtol=1e-9, atol=1e-9)


def test_hybrid_unknown_model_type_is_refused():
    spec = arch_from_config(qwen3_next_cfg())
    from dataclasses import replace
    other = replace(spec, model_type="nemotron_h")
    with pytest.raises(DascInputError, match="nemotron_h.*balance='storage'"):
        build_tp_plan(other, KEPT, Policy(tp_size=2, balance="hybrid"), bytes_per_unit=1,
                      conv_bytes_per_layer_rank=1, dense_temporal_bytes_per_layer_rank=1)
