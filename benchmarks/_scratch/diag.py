"""Scratch diagnostics (not part of the project): do_bench vs CUDA-graph (GPU-only) vs host time."""
import json
import sys
import time
from pathlib import Path

import torch
import triton
import triton.testing

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
import dasc_compile.kernels as K  # noqa: E402
from dasc_runtime.indexing import state_index_from_kept  # noqa: E402
from dasc_runtime.kernel_loader import load_kernel_module  # noqa: E402
from kernel_bench import SHAPES, kept_sets  # noqa: E402

OUT = Path(sys.argv[1])
MODE = sys.argv[2] if len(sys.argv) > 2 else "main"
OLD = REPO / "benchmarks/_scratch/old_templates"
NEW_DIR = K._template_dir
MODS = Path("/tmp/diag_mods")
MODS.mkdir(exist_ok=True)
cache = torch.empty(int(256e6 // 4), dtype=torch.int32, device="cuda")
results = []


def build(variant, shape, tile=4096, warps=8):
    L, kind, H, dv, dk, cs = SHAPES[shape]
    K._template_dir = (lambda: OLD) if variant == "old" else NEW_DIR
    c = K.make_constants(num_layers=L, unit_kind=kind, heads=H, dv=dv, dk=dk, conv_shapes=[cs], int8=True,
                         tile=tile, num_warps=warps)
    name, src = K.render_kernel_module(c)
    (MODS / name).write_text(src)
    K._template_dir = NEW_DIR
    return load_kernel_module(MODS, name)


def graph_time(fn, reps=30):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    ts = []
    for _ in range(reps):
        cache.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        ts.append((s, e))
    torch.cuda.synchronize()
    v = sorted(s.elapsed_time(e) * 1e3 for s, e in ts)
    del g
    return v[len(v) // 2]


def host_time(fn, reps=100):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    h = (time.perf_counter() - t) / reps * 1e6
    torch.cuda.synchronize()
    return h


def setup(shape, n):
    L, kind, H, dv, dk, cs = SHAPES[shape]
    uph = 1 if kind == "gdn_head" else dk
    kept = kept_sets(H * uph, L, 1 / 3, 2 / 3, 0, torch)
    idx = state_index_from_kept(kept, heads=H, unit_kind=kind, dk=dk, device="cuda")
    R = idx.num_rows
    unit = (dv, dk) if kind == "gdn_head" else (dv,)
    S = 2 * n + 1
    T = dict(
        temporal=torch.randn(L, S + 1, H, dv, dk, device="cuda"),
        conv=[torch.randn(L, S + 1, *cs, device="cuda").bfloat16()],
        comp=torch.zeros(n + 1, R, *unit, device="cuda"),
        comp_conv=[torch.zeros(L, n + 1, *cs, device="cuda", dtype=torch.bfloat16)],
        comp_q=torch.zeros(n + 1, R, *unit, device="cuda", dtype=torch.int8),
        comp_s=torch.zeros((n + 1, R) + ((dk,) if kind == "gdn_head" else ()), device="cuda"),
        src=torch.arange(1, n + 1, device="cuda"), back=torch.arange(n + 1, 2 * n + 1, device="cuda"),
        dst=torch.arange(1, n + 1, device="cuda"), idx=idx)
    conv_b = L * cs[0] * cs[1] * 2
    unit_e = dv * dk if kind == "gdn_head" else dv
    T["payload"] = n * (R * unit_e * 4 + conv_b)
    T["dense"] = n * (L * H * dv * dk * 4 + conv_b)
    return T


def ops(mod, T):
    idx = T["idx"]
    return {
        "pack": lambda: mod.pack(temporal=T["temporal"], conv=T["conv"], src_slots=T["src"], comp_temporal=T["comp"],
                                 comp_conv=T["comp_conv"], dst_slots=T["dst"], unit_row=idx.unit_row,
                                 kept_heads=idx.kept_heads, check_slots=False),
        "load": lambda: mod.load(comp_temporal=T["comp"], comp_conv=T["comp_conv"], src_slots=T["dst"],
                                 temporal=T["temporal"], conv=T["conv"], dst_slots=T["back"], unit_row=idx.unit_row,
                                 check_slots=False),
        "pack_int8": lambda: mod.pack_int8(temporal=T["temporal"], conv=T["conv"], src_slots=T["src"], comp_q=T["comp_q"],
                                           comp_scale=T["comp_s"], comp_conv=T["comp_conv"], dst_slots=T["dst"],
                                           unit_row=idx.unit_row, kept_heads=idx.kept_heads, check_slots=False),
        "load_int8": lambda: mod.load_int8(comp_q=T["comp_q"], comp_scale=T["comp_s"], comp_conv=T["comp_conv"],
                                           src_slots=T["dst"], temporal=T["temporal"], conv=T["conv"],
                                           dst_slots=T["back"], unit_row=idx.unit_row, check_slots=False),
    }


def emit(**kw):
    results.append(kw)
    print(json.dumps(kw), flush=True)
    OUT.write_text(json.dumps(results, indent=0))


def main_mode():
    for shape in ("kimi-linear-tp1", "kimi-linear-tp8", "qwen3next-tp8"):
        mods = {v: build(v, shape) for v in ("old", "new")}
        for n in (1, 8, 64):
            T = setup(shape, n)
            a, b = T["payload"], torch.empty(T["payload"], dtype=torch.uint8, device="cuda")
            buf = torch.empty_like(b)
            cp = lambda: buf.copy_(b)  # noqa: E731
            emit(shape=shape, n=n, op="copy", variant="-", db=triton.testing.do_bench(cp, warmup=10, rep=40,
                 return_mode="median") * 1e3, graph=graph_time(cp), host=host_time(cp), payload=a, dense=T["dense"])
            del b, buf
            outs = {}
            for v, mod in mods.items():
                for op, fn in ops(mod, T).items():
                    db = triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3
                    emit(shape=shape, n=n, op=op, variant=v, db=db, graph=graph_time(fn), host=host_time(fn))
                    tgt = {"pack": "comp", "pack_int8": "comp_q", "load": "temporal", "load_int8": "temporal"}[op]
                    if op in ("pack", "pack_int8"):
                        outs[(v, op)] = (T[tgt].clone(), T["comp_s"].clone() if op == "pack_int8" else None)
            for op in ("pack", "pack_int8"):
                same = torch.equal(outs[("old", op)][0], outs[("new", op)][0])
                if op == "pack_int8":
                    same = same and torch.equal(outs[("old", op)][1], outs[("new", op)][1])
                emit(shape=shape, n=n, op=op, check="old==new", same=bool(same))
            del T
            torch.cuda.empty_cache()


def sweep_mode():
    for shape in ("kimi-linear-tp1", "kimi-linear-tp8"):
        for tile, warps in ((2048, 4), (8192, 8)):
            mod = build("new", shape, tile, warps)
            for n in (1, 8, 64):
                T = setup(shape, n)
                for op, fn in ops(mod, T).items():
                    emit(shape=shape, n=n, op=op, tile=tile, warps=warps, graph=graph_time(fn, 15))
                del T
                torch.cuda.empty_cache()


if __name__ == "__main__":
    {"main": main_mode, "sweep": sweep_mode}[MODE]()
