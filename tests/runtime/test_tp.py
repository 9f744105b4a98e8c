"""Storage balancing through the pool (paper §4.3, Fig. 9 (b)): two gloo ranks on CPU.

Each rank packs its kept units, the pool moves the excess with one variable-split all-to-all
(``dasc_runtime.tp_transfer``) into slots of ``slot_width`` rows, and a load moves them back: the
restored state must equal the rank's own dasc-nr image (an exact reindexing, App. B.1).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.support.runtime_fixtures import GDN_D, compile_tiny
from tests.support.ports import free_port


def _rank(rank: int, port: int, plan_dir: str, q) -> None:
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=2)
        from dasc_runtime.ops import flat_units, unflat_units
        from dasc_compile.schema import load_plan
        from dasc_runtime.pool import DascCheckpointPool
        from dasc_runtime.rank_layout import build_rank_layout

        plan = load_plan(plan_dir)
        layout = build_rank_layout(plan, rank, 2, 3)
        g = torch.Generator().manual_seed(100 + rank)
        temporal = torch.randn((3, 5, 2, GDN_D, GDN_D), generator=g)
        conv = [torch.randn((3, 5, 64, 3), generator=g).to(torch.bfloat16)]
        active = SimpleNamespace(mamba_cache=SimpleNamespace(temporal=temporal, conv=conv))
        pool = DascCheckpointPool(layout=layout, num_slots=3, conv_shapes=[(64, 3)], native_size=4, device="cpu")
        ids = torch.cat([pool.alloc(1), pool.alloc(1)])           # same ids on both ranks (same tree decisions)
        expect = []
        for s in (1, 3):
            flat = flat_units(layout, temporal[:, s:s + 1]).clone()
            flat[:, layout.local_flat] = 0
            expect.append(unflat_units(layout, flat)[:, 0])
        pool.store_from_active(active, torch.tensor([1, 3]), ids)
        stored_rows = int((pool.temporal[1].abs().sum(dim=(1, 2)) > 0).sum())
        from dasc_runtime.side_channels import attach_tier_hint

        attach_tier_hint(ids, [True, True])                        # as the plugin does for a batch of hits
        pool.load_to_active(active, ids, torch.tensor([2, 4]))
        ok = all(torch.equal(temporal[:, d], e) for d, e in zip((2, 4), expect))
        ok_conv = torch.equal(conv[0][:, 2], conv[0][:, 1]) and torch.equal(conv[0][:, 4], conv[0][:, 3])
        q.put((rank, ok, ok_conv, layout.n_kept, layout.width, stored_rows))
        dist.destroy_process_group()
    except Exception as exc:  # pragma: no cover - reported to the parent
        q.put((rank, repr(exc)))


def test_storage_balanced_store_load_is_exact(tmp_path):
    plan, pdir, _ = compile_tiny(tmp_path, tp_size=2, balance="storage")
    smap = plan.tp.storage
    # rank-local kept units: rank 0 {0,1},{0},{0,1} -> 5; rank 1 {},{1},{0} -> 2; targets 4 / 3
    assert smap.n_packed == [5, 2] and smap.targets == [4, 3] and smap.m_remote == 1 and smap.slot_width == 4
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, str(pdir), q)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = sorted(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert all(len(g) == 6 for g in got), got
    # (rank, restored == dasc-nr image, conv exact, n_kept, slot width, rows holding data in the slot)
    assert got == [(0, True, True, 5, 4, 4), (1, True, True, 2, 4, 3)]
