"""One model shape measured for ``benchmarks/kernel_bench.py``: the uneven kept sets, the plan's kernels rendered
for the shape, every op (pack / load, their INT8 forms, SGLang's INT8 store / load when given) timed per batch N,
pack / load checked bit-identical to the per-layer torch-indexing baseline, and one :class:`Row` per op and N.

What the columns mean (bytes moved, copy bandwidth, the baselines) is in ``kernel_bench.py``'s docstring; that
module parses the command line, picks the shapes and timers, and prints and appends the report.
"""

from __future__ import annotations

import types
from dataclasses import dataclass

__all__ = ["Row", "kept_sets", "run_shape"]


@dataclass
class Row:
    shape: str
    op: str
    n: int
    mbytes: float          # bytes read + written per call, MB
    us: float              # kernel time, microseconds
    gbps: float
    copy_gbps: float
    per_layer_us: float | None = None
    sglang_us: float | None = None
    note: str = ""
    sector_mb: float | None = None   # KDA pack: bytes the memory system must move (whole 32-byte sectors), MB
    gpu_us: float | None = None      # the kernel alone: CUDA-graph replay, L2 flushed (None on the CPU)
    host_us: float | None = None     # Python + launch cost of one call on the host

    @property
    def pct_copy(self) -> float:
        return 100.0 * self.gbps / self.copy_gbps if self.copy_gbps else float("nan")

    @property
    def gpu_gbps(self) -> float | None:
        return None if not self.gpu_us else self.mbytes * 1e6 / (self.gpu_us * 1e3)

    @property
    def pct_copy_gpu(self) -> float | None:
        return None if self.gpu_gbps is None or not self.copy_gbps else 100.0 * self.gpu_gbps / self.copy_gbps


def kept_sets(n_units: int, layers: int, lo: float, hi: float, seed: int, torch) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    fracs = [lo + (hi - lo) * i / max(1, layers - 1) for i in range(layers)]
    order = torch.randperm(layers, generator=g).tolist()
    out = []
    for l in range(layers):
        r = max(1, round(fracs[order[l]] * n_units))
        out.append(sorted(torch.randperm(n_units, generator=g)[:r].tolist()))
    return out


def run_shape(name, spec, args, bench, device, torch, mods, sglang_cls, timers):
    from dasc_compile.kernels import make_constants, render_kernel_module
    from dasc_runtime.rank_layout import state_index_from_kept
    from dasc_runtime.kernel_loader import load_kernel_module

    from dasc_compile.schema.units import lookup_unit_kind

    L, kind, H, dv, dk, conv_shape = spec
    whole = lookup_unit_kind(kind).whole_head            # a unit is a head [dv, dk] (GDN, Mamba2), else a column
    gpu_time, host_time = timers
    c = make_constants(num_layers=L, unit_kind=kind, heads=H, dv=dv, dk=dk, conv_shapes=[conv_shape],
                       int8=not args.no_int8, tile=16 if args.smoke else 4096)
    file_name, src = render_kernel_module(c)
    (mods / file_name).write_text(src)
    mod = load_kernel_module(mods, file_name, interpret=args.smoke)
    uph = 1 if whole else dk
    n_units = H * uph
    kept = kept_sets(n_units, L, args.keep_min, args.keep_max, args.seed, torch)
    idx = state_index_from_kept(kept, heads=H, unit_kind=kind, dk=dk, device=device)
    full = state_index_from_kept([list(range(n_units))] * L, heads=H, unit_kind=kind, dk=dk, device=device)
    R = idx.num_rows
    unit = (dv, dk) if whole else (dv,)
    unit_elems = dv * dk if whole else dv
    n_max = max(args.n)
    S = 2 * n_max + 1
    f32, bf16 = torch.float32, torch.bfloat16
    temporal = torch.randn(L, S + 1, H, dv, dk, device=device, dtype=f32)
    conv = [torch.randn(L, S + 1, *conv_shape, device=device).to(bf16)]
    comp = torch.zeros(n_max + 1, R, *unit, device=device, dtype=f32)
    comp_conv = [torch.zeros(L, n_max + 1, *conv_shape, device=device, dtype=bf16)]
    conv_bytes = L * conv_shape[0] * conv_shape[1] * 2
    kept_bytes = R * unit_elems * 4
    # A KDA unit is a strided column S[h, :, k] of the dense pool: DRAM moves whole 32-byte sectors,
    # so a pack reads every sector of a dense row that holds a kept column (with 1/3..2/3 of the
    # columns kept, nearly all of them). sector_bytes: read side of one slot at sector granularity.
    if kind == "kda_column":
        per_sector = 32 // temporal.element_size()
        keep = (idx.unit_row >= 0).reshape(L, H, dk // per_sector, per_sector) if dk % per_sector == 0 else None
        sector_bytes = None if keep is None else int(keep.any(dim=-1).sum().item()) * dv * 32
    else:
        sector_bytes = None
    dense_bytes = L * H * dv * dk * 4
    offsets = idx.offsets.tolist()
    kept_t = [torch.tensor(k, dtype=torch.int64, device=device) for k in kept]
    rows = []

    def bits(t):
        return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32}[t.element_size()])

    def verify(op, fn, base, slots_written) -> str:
        """Kernel and per-layer baseline must write bit-identical outputs (checked after timing)."""
        outs = [(comp, 0), *[(c, 1) for c in comp_conv]] if op == "pack" else [(temporal, 1), *[(c, 1) for c in conv]]
        results = []
        for run in (fn, base):
            for t, axis in outs:
                t.select(axis, 0).fill_(0)      # keep slot 0 as the reserved padding slot
                t.index_fill_(axis, slots_written, float("nan") if t.dtype.is_floating_point else -1)
            run()
            results.append([t.clone() for t, _ in outs])
        if not all(torch.equal(bits(a), bits(b)) for a, b in zip(*results)):
            raise SystemExit(f"kernel_bench: {name} {op} differs from the per-layer baseline")
        return "verified"

    for n in args.n:
        src = torch.arange(1, n + 1, device=device, dtype=torch.int64)                 # active slots 1..n
        back = torch.arange(n + 1, 2 * n + 1, device=device, dtype=torch.int64)        # active slots n+1..2n
        dst = torch.arange(1, n + 1, device=device, dtype=torch.int64)                 # ragged slots 1..n
        payload = n * (kept_bytes + conv_bytes)
        buf_a = torch.empty(payload, dtype=torch.uint8, device=device)
        buf_b = torch.empty_like(buf_a)
        t_copy = bench(lambda: buf_b.copy_(buf_a))
        copy_gbps = 2 * payload / t_copy / 1e3

        def pack():
            mod.pack(temporal=temporal, conv=conv, src_slots=src, comp_temporal=comp, comp_conv=comp_conv,
                     dst_slots=dst, unit_row=idx.unit_row, kept_heads=idx.kept_heads, check_slots=False)

        def load():
            mod.load(comp_temporal=comp, comp_conv=comp_conv, src_slots=dst, temporal=temporal, conv=conv,
                     dst_slots=back, unit_row=idx.unit_row, check_slots=False)

        def pack_per_layer():
            for l in range(L):
                o0, o1 = offsets[l], offsets[l + 1]
                if o0 == o1:
                    continue
                u = kept_t[l]
                if whole:
                    vals = temporal[l][src[:, None], u[None, :]]                            # [n, r, dv, dk]
                else:
                    vals = temporal[l][src[:, None], u[None, :] // dk, :, u[None, :] % dk]  # [n, r, dv]
                comp[dst, o0:o1] = vals
            for cv, cc in zip(conv, comp_conv):
                cc[:, dst] = cv[:, src]

        def load_per_layer():
            for l in range(L):
                o0, o1 = offsets[l], offsets[l + 1]
                temporal[l, back] = 0
                if o0 == o1:
                    continue
                u = kept_t[l]
                vals = comp[dst, o0:o1]
                if whole:
                    temporal[l][back[:, None], u[None, :]] = vals
                else:
                    temporal[l][back[:, None], u[None, :] // dk, :, u[None, :] % dk] = vals
            for cv, cc in zip(conv, comp_conv):
                cv[:, back] = cc[:, dst]

        for op, fn, base, moved in (
            ("pack", pack, pack_per_layer, 2 * payload),
            ("load", load, load_per_layer, payload + n * (dense_bytes + conv_bytes)),
        ):
            t = bench(fn)
            tb = bench(base)
            sector_mb = None
            if op == "pack" and sector_bytes is not None:      # sector reads + kept writes + conv in and out
                sector_mb = n * (sector_bytes + kept_bytes + 2 * conv_bytes) / 1e6
            rows.append(Row(name, op, n, moved / 1e6, t, moved / t / 1e3, copy_gbps, per_layer_us=tb,
                            note=verify(op, fn, base, dst if op == "pack" else back), sector_mb=sector_mb,
                            gpu_us=gpu_time(fn), host_us=host_time(fn)))
        del buf_a, buf_b

        if args.no_int8:
            continue
        comp_q = torch.zeros(n + 1, R, *unit, device=device, dtype=torch.int8)
        comp_s = torch.zeros((n + 1, R) + ((dk,) if whole else ()), device=device, dtype=f32)
        comp_cq = [torch.zeros(L, n + 1, *conv_shape, device=device, dtype=bf16)]
        full_q = torch.zeros(n + 1, full.num_rows, *unit, device=device, dtype=torch.int8)
        full_s = torch.zeros((n + 1, full.num_rows) + ((dk,) if whole else ()), device=device, dtype=f32)
        scale_per_unit = dk if whole else 1

        def pack_int8(q=comp_q, s=comp_s, index=idx):
            mod.pack_int8(temporal=temporal, conv=conv, src_slots=src, comp_q=q, comp_scale=s, comp_conv=comp_cq,
                          dst_slots=dst, unit_row=index.unit_row, kept_heads=index.kept_heads, check_slots=False)

        def load_int8(q=comp_q, s=comp_s, index=idx):
            mod.load_int8(comp_q=q, comp_scale=s, comp_conv=comp_cq, src_slots=dst, temporal=temporal, conv=conv,
                          dst_slots=back, unit_row=index.unit_row, check_slots=False)

        sg_pack = sg_load = None
        if sglang_cls is not None:
            pool = sglang_cls(num_layers=L, num_slots=n, num_heads=H, head_v_dim=dv, head_k_dim=dk,
                              conv_shapes=[conv_shape], conv_dtype=bf16, device=device, temporal_dtype=f32)
            active = types.SimpleNamespace(mamba_cache=types.SimpleNamespace(temporal=temporal, conv=conv))
            sg_pack = bench(lambda: pool.store_from_active(active, src, dst))
            sg_load = bench(lambda: pool.load_to_active(active, dst, back))
            del pool

        for op, fn, sg, rows_used in (
            ("pack_int8", pack_int8, sg_pack, R),
            ("load_int8", load_int8, sg_load, R),
            ("pack_int8 (all kept)", lambda: pack_int8(full_q, full_s, full), sg_pack, full.num_rows),
            ("load_int8 (all kept)", lambda: load_int8(full_q, full_s, full), sg_load, full.num_rows),
        ):
            ragged = rows_used * (unit_elems + scale_per_unit * 4) + conv_bytes      # int8 payload + scales + conv
            if op.startswith("pack"):   # reads the kept FP32 units and conv, writes the INT8 checkpoint
                moved = n * (rows_used * unit_elems * 4 + conv_bytes + ragged)
            else:                       # reads the INT8 checkpoint, writes the whole dense slot and conv
                moved = n * (ragged + dense_bytes + conv_bytes)
            t = bench(fn)
            rows.append(Row(name, op, n, moved / 1e6, t, moved / t / 1e3, copy_gbps, sglang_us=sg,
                            gpu_us=gpu_time(fn), host_us=host_time(fn)))
    return rows
