"""One TP rank of ``benchmarks/tp_transfer_bench.py``: the process each rank runs (join the group: NCCL on its GPU,
gloo on CPU), and per plan and N the timed pack / stage / store / load and the three bit-exact checks of that rank.

The slot values are a hash of the element index (any rank can rebuild any other rank's slot for the cross-rank
check), times are medians in microseconds, and rank 0 writes every rank's rows as JSON for the parent.
``tp_transfer_bench.py`` compiles the plans, spawns the ranks and merges and reports their rows; what is timed and
checked is in its docstring.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import statistics
import time
from pathlib import Path

__all__ = ["FORCED_ENV", "COLLECTIVE_TIMEOUT_S", "run_case"]

# the machines forbid NVLink multicast: tp_transfer_bench sets these at import (spawned ranks inherit them) and
# every rank sets them again in _worker
FORCED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
COLLECTIVE_TIMEOUT_S = 120


def _bits(t):
    import torch
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _same_bits(a, b) -> bool:
    import torch
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _slot_values(shape, *, seed: int, rank: int, slot: int, salt: int, device, dtype):
    """Values of one active slot of one rank, uniform in [-2, 2), from an integer hash of the element index.

    The same on any device (no RNG kernel whose output could depend on the GPU), so every rank can
    rebuild any other rank's slot for the cross-rank check.
    """
    import torch
    mask = 0xFFFFFFFF
    key = (((seed * 1_000_003 + rank) * 10_007 + slot) * 2 + salt) * 0x9E3779B1 & mask
    h = (torch.arange(math.prod(shape), dtype=torch.int64, device=device) * 0x2545F491 + key) & mask
    for mult, shift in ((0x7FEB352D, 15), (0x446F8A2B, 13), (0x5BD1E995, 16)):   # constants < 2**31: no overflow
        h = ((h ^ (h >> shift)) * mult) & mask
    h = h ^ (h >> 16)
    return (h.to(torch.float64) * (4.0 / 2**32) - 2.0).to(torch.float32).reshape(shape).to(dtype)


class _Timer:
    """Median-of-repeats timer shared by the four ops of one rank."""

    def __init__(self, device, warmup: int, repeats: int):
        import torch
        self.torch, self.device, self.warmup, self.repeats = torch, device, warmup, repeats

    def __call__(self, fn) -> float:
        """Median time of ``fn`` in microseconds (barrier before each repeat)."""
        import torch.distributed as dist
        torch, cuda = self.torch, self.device.type == "cuda"
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.repeats):
            dist.barrier()
            if cuda:
                torch.cuda.synchronize(self.device)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)


def run_case(case: dict, rank: int, args, device, timer) -> list[dict]:
    """All N of one plan on this rank: timings and the three exactness checks."""
    import torch
    from dasc_compile.schema import load_plan
    from dasc_runtime.kernel_loader import load_plan_kernels
    from dasc_runtime.ops import TorchOps
    from dasc_runtime.rank_layout import build_rank_layout as rank_layout
    from dasc_runtime.rank_layout import build_state_index
    from dasc_runtime.tp_transfer import load_all_to_all, store_all_ranks, store_all_to_all

    P = args.tp
    plan = load_plan(case["plan_dir"])
    layouts = [rank_layout(plan, r, P) for r in range(P)]
    lay, smap = layouts[rank], layouts[rank].storage
    index = build_state_index(plan, tp_rank=rank, device=device)
    module = load_plan_kernels(case["plan_dir"], plan.kernels, interpret=device.type == "cpu")
    assert index.num_rows == lay.n_kept == smap.n_local[rank], (index.num_rows, lay.n_kept, smap.n_local[rank])
    c = module.CONSTANTS
    conv_shape = (c["CONV0_ROWS"], c["CONV0_COLS"])
    L, H, unit, R = lay.num_layers, lay.heads_per_rank, lay.unit_shape, lay.n_kept
    tdt, cdt = lay.temporal_dtype, lay.conv_dtype
    unit_bytes = torch.empty(unit, dtype=tdt).numel() * torch.empty((), dtype=tdt).element_size()
    n_max = max(args.n)
    # dense active pool (slot 0 reserved) with reproducible per-slot values; ragged pool for the pack
    temporal = torch.zeros((L, n_max + 1, H, lay.d_v, lay.d_k), dtype=tdt, device=device)
    conv = torch.zeros((L, n_max + 1, *conv_shape), dtype=cdt, device=device)
    for s in range(1, n_max + 1):
        temporal[:, s] = _slot_values((L, H, lay.d_v, lay.d_k), seed=args.seed, rank=rank, slot=s, salt=0,
                                      device=device, dtype=tdt)
        conv[:, s] = _slot_values((L, *conv_shape), seed=args.seed, rank=rank, slot=s, salt=1, device=device, dtype=cdt)
    comp = torch.zeros((n_max + 1, R, *unit), dtype=tdt, device=device)
    comp_conv = torch.zeros((L, n_max + 1, *conv_shape), dtype=cdt, device=device)
    ref = TorchOps()
    rows = []
    for n in args.n:
        slots = torch.arange(1, n + 1, dtype=torch.int64, device=device)
        packed = comp[1:n + 1]                                                     # [N, n_r, *unit] view
        staged = torch.empty((R, n, *unit), dtype=tdt, device=device)
        storage = torch.zeros((smap.slot_width, n, *unit), dtype=tdt, device=device)
        loaded = torch.empty((R, n, *unit), dtype=tdt, device=device)

        def pack():
            module.pack(temporal=temporal, conv=[conv], src_slots=slots, comp_temporal=comp, comp_conv=[comp_conv],
                        dst_slots=slots, unit_row=index.unit_row, kept_heads=index.kept_heads, check_slots=False)

        def stage():
            staged.copy_(packed.transpose(0, 1))

        def store():
            store_all_to_all(staged, smap, rank, out=storage)

        def load():
            load_all_to_all(storage, smap, rank, out=loaded)

        us = {"pack": timer(pack), "stage": timer(stage), "store": timer(store), "load": timer(load)}

        # ---- exactness: one more pass with every output pre-filled with NaN ----
        for t in (comp, staged, storage, loaded):
            t.fill_(float("nan"))
        comp_conv.fill_(float("nan"))
        pack()
        stage()
        store()
        load()
        if args.inject_fault and rank == P - 1 and loaded.numel():
            _bits(loaded).view(-1)[-1] ^= 1
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        pack_ok = True
        for lo in range(0, n, 8):                                                 # chunks keep memory modest
            chunk = slots[lo:lo + 8]
            pack_ok &= _same_bits(packed[lo:lo + 8], ref.pack_units(lay, temporal, chunk))
            pack_ok &= _same_bits(comp_conv[:, 1 + lo:1 + lo + chunk.numel()], conv.index_select(1, chunk))
        roundtrip_ok = _same_bits(loaded.transpose(0, 1), packed)
        store_ok, t_r = True, smap.targets[rank]
        for j in sorted({0, n - 1}):                                             # cross-rank reference
            per_rank = []
            for r in range(P):
                dense = _slot_values((L, 1, H, lay.d_v, lay.d_k), seed=args.seed, rank=r, slot=j + 1, salt=0,
                                     device=device, dtype=tdt)
                per_rank.append(ref.pack_units(layouts[r], dense, torch.zeros(1, dtype=torch.int64, device=device))[0])
            expect = store_all_ranks(per_rank, smap)[rank]
            store_ok &= _same_bits(storage[:t_r, j], expect[:t_r])
        rows.append({"name": case["name"], "w_max": case["w_max"], "n": n, "model_type": plan.model.model_type,
                     "unit_kind": plan.model.unit_kind, "layers": L, "heads_local": H, "unit": list(unit),
                     "unit_bytes": unit_bytes, "n_local": list(smap.n_local), "targets": list(smap.targets),
                     "slot_width": smap.slot_width, "m_remote": smap.m_remote,
                     "payload_bytes": smap.m_remote * unit_bytes * n, "us": us, "pack_ok": bool(pack_ok),
                     "roundtrip_ok": bool(roundtrip_ok), "store_ok": bool(store_ok),
                     "provenance": plan.model.provenance})
    return rows


def _worker(rank: int, args, cases: list[dict], port: int, result_path: str) -> None:
    """One TP rank: join the group (NCCL on GPU ``rank``, gloo on CPU), run every case, rank 0 writes the rows."""
    saved = {k: os.environ.get(k) for k in (*FORCED_ENV, "TRITON_INTERPRET")}
    os.environ.update(FORCED_ENV)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import torch.distributed as dist

    if args.device == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        # a collective that hangs is aborted after the timeout (NCCL watchdog) instead of holding the GPUs
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.tp,
                                device_id=device, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        name = torch.cuda.get_device_name(device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.tp)
        name = "cpu"
    try:
        timer = _Timer(device, args.warmup, args.repeats)
        rows = []
        for case in cases:
            rows += run_case(case, rank, args, device, timer)
            if device.type == "cuda":
                torch.cuda.empty_cache()              # the case's pools are gone: give their memory back
        gathered = [None] * args.tp
        dist.all_gather_object(gathered, {"rank": rank, "device": name, "rows": rows})
        if rank == 0:
            Path(result_path).write_text(json.dumps(gathered))
        dist.barrier()
    finally:
        dist.destroy_process_group()
        # P = 1 runs in the calling process: leave its environment as it was
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
