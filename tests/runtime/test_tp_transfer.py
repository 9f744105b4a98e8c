"""Storage-balancing data movement (paper App. B.1, Fig. 9 (b) runtime store / load).

The single-process mapping (:func:`store_all_ranks` / :func:`load_all_ranks`) against hand-built
maps, and the ``torch.distributed`` path (:func:`store_all_to_all` / :func:`load_all_to_all`) on
the gloo backend with P = 2 and P = 4 CPU processes: store must equal the single-process mapping bit for bit,
load(store(x)) must return x exactly, and a map with M_remote = 0 must not call the collective.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dasc_compile.schema import CoupledTensor
from dasc_compile.tp import balance_storage
from dasc_runtime.demotion import agree_all
from dasc_runtime.tp_transfer import (
    load_all_ranks,
    load_all_to_all,
    permute_coupled_tensor,
    store_all_ranks,
    store_all_to_all,
)
from tests.support.ports import free_port

# per P: several rank-count vectors, including balanced (no transfer), empty ranks and one heavy rank
CASES = {
    2: [[5, 1], [3, 3], [0, 7], [4, 5], [0, 0]],
    4: [[5, 1, 3, 3], [2, 7, 0, 4], [3, 3, 4, 3], [9, 0, 0, 0], [1, 2, 3, 4]],
}


def _packed(n: list[int], dtype: torch.dtype, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.int8:
        return [torch.randint(-127, 128, (k, 2, 3), generator=g, dtype=torch.int8) for k in n]
    return [torch.randn(k, 2, 3, generator=g).to(dtype) for k in n]


def test_all_ranks_hand_case():
    # n=[2,7,0,4] -> t=[3,4,3,3]; rank 1 units 4,5,6 -> (0,2),(2,0),(2,1); rank 3 unit 3 -> (2,2)
    s = balance_storage([2, 7, 0, 4])
    packed = [torch.arange(k, dtype=torch.float32) + 10 * r for r, k in enumerate([2, 7, 0, 4])]
    storage = store_all_ranks(packed, s)
    assert storage[0].tolist() == [0, 1, 14, 0]          # slot width 4, last row is padding
    assert storage[1].tolist() == [10, 11, 12, 13]
    assert storage[2].tolist() == [15, 16, 33, 0]
    assert storage[3].tolist() == [30, 31, 32, 0]
    back = load_all_ranks(storage, s)
    assert [b.tolist() for b in back] == [p.tolist() for p in packed]


def test_all_ranks_rejects_short_inputs():
    s = balance_storage([2, 1])
    with pytest.raises(ValueError, match="packed\\[0\\]"):
        store_all_ranks([torch.zeros(1, 3), torch.zeros(1, 3)], s)
    with pytest.raises(ValueError, match="2 rank tensors"):
        store_all_ranks([torch.zeros(2, 3)], s)


def test_permute_coupled_tensor_segments():
    # axis 0 of size 10: segment [0,4) of 2 blocks of 2, segment [4,10) of 2 blocks of 3
    ct = CoupledTensor(name="w", axis=0, axis_size=10, segments=[[0, 4], [4, 6]])
    t = torch.arange(10).repeat(2, 1).T                    # [10, 2]
    out = permute_coupled_tensor(t, ct, [1, 0])
    assert out[:, 0].tolist() == [2, 3, 0, 1, 7, 8, 9, 4, 5, 6]
    with pytest.raises(ValueError, match="expected size 10 on axis 0"):
        permute_coupled_tensor(torch.zeros(9), ct, [1, 0])


def _run_cases(rank: int, world: int, group, calls: dict) -> None:
    for i, n in enumerate(CASES[world]):
        s = balance_storage(n)
        for dtype in (torch.float32, torch.int8):
            packed = _packed(n, dtype, seed=100 * i + (dtype == torch.int8))
            expect = store_all_ranks(packed, s)
            before = calls["n"]
            stored = store_all_to_all(packed[rank].contiguous(), s, rank, group=group)
            assert stored.shape == (s.slot_width, 2, 3) and stored.dtype == dtype
            assert torch.equal(stored, expect[rank]), (n, rank)
            back = load_all_to_all(stored, s, rank, group=group)
            assert torch.equal(back, packed[rank]), (n, rank)
            assert calls["n"] - before == (0 if s.m_remote == 0 else 2), (n, s.m_remote)
            # into a preallocated pool row: rows beyond slot_width are left untouched
            pool = torch.full((s.slot_width + 2, 2, 3), 7).to(dtype)
            store_all_to_all(packed[rank].contiguous(), s, rank, group=group, out=pool)
            assert torch.equal(pool[:s.targets[rank]], expect[rank][:s.targets[rank]])
            assert bool((pool[s.slot_width:] == 7).all())
            active = torch.zeros(s.n_packed[rank] + 1, 2, 3).to(dtype)
            load_all_to_all(pool, s, rank, group=group, out=active)
            assert torch.equal(active[:s.n_packed[rank]], packed[rank])


def _worker(rank: int, world: int, port: int) -> None:
    """One of 4 gloo processes: P = 4 on the world group, then P = 2 on the pairs {0,1} and {2,3}."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    real = dist.all_to_all_single
    try:
        calls = {"n": 0}

        def counting(*args, **kwargs):
            calls["n"] += 1
            return real(*args, **kwargs)

        dist.all_to_all_single = counting
        _run_cases(rank, world, None, calls)
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        _run_cases(rank % 2, 2, pairs[rank // 2], calls)
        # agree_all (the demotion engine's commit agreement): flag j is False only on rank j -> AND over 4 ranks
        assert agree_all([j != rank for j in range(5)]) == [False, False, False, False, True]
        # on a pair only that pair's flags count: the even rank of each pair says False for slot 0
        assert agree_all([rank % 2 == 1, True, rank < 2], group=pairs[rank // 2]) == [False, True, rank < 2]
        assert agree_all([], group=pairs[rank // 2]) == []
        dist.barrier()
    finally:
        dist.all_to_all_single = real
        dist.destroy_process_group()


def test_all_to_all_gloo_matches_all_ranks():
    mp.spawn(_worker, args=(4, free_port()), nprocs=4, join=True)
