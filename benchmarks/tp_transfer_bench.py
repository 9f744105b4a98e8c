#!/usr/bin/env python
"""Storage balancing on real ranks: exactness and cost of the all-to-all store / load (paper App. B.1, Fig. 9 (b)).

For each reference checkpoint and ``w_max`` the plan is compiled with ``balance="storage"`` at TP
degree P (``dasc_compile.compiler.compile_plan``, with its Triton kernels). P processes (one per
GPU, NCCL; or gloo on CPU) then do, per rank r and for N state checkpoints, what the runtime does
on a store (``dasc_runtime.ops.TorchOps.store``, its staged all-to-all ``_write_rows``) and on a
load (``TorchOps.load`` -> ``_read_rows``), with the plan's generated ``pack`` kernel in place of the PyTorch pack:

* pack: the plan's kernel copies the kept units of N active slots of the dense pool
  ``temporal [L, S+1, H/P, d_v, d_k]`` (and the conv state ``[L, S+1, *conv]``) into the ragged
  slots ``comp [N+1, n_r, *unit]`` (``unit`` = ``[d_v, d_k]`` GDN head, ``[d_v]`` KDA column);
* stage: the copy of ``comp[1:N+1]`` to the unit-major ``[n_r, N, *unit]`` the all-to-all splits
  (``TorchOps._write_rows`` does it; ``_read_rows`` does the same size of copy back);
* store: ``dasc_runtime.tp_transfer.store_all_to_all`` into the storage slots
  ``[slot_width, N, *unit]`` (local copy of the kept prefix + one variable-split all-to-all);
* load: ``load_all_to_all`` back to ``[n_r, N, *unit]``.

Times are medians over ``--repeats`` after ``--warmup`` calls, a barrier before each repeat, CUDA
events on GPU (wall clock on CPU), in microseconds; pack is shown per rank, the rest for the slowest
rank (ratios use the slowest rank's pack). The payload is the bytes that cross ranks,
``M_remote * unit_bytes * N``.

Exactness (checked after timing, with every output buffer pre-filled with NaN), on every rank:
(1) the kernel's packed units equal ``TorchOps.pack_units`` bit for bit; (2) load after store
equals the rank-local packed units bit for bit; (3) for the first and last slot, the storage rows
equal ``dasc_runtime.tp_transfer.store_all_ranks`` (the single-process mapping) computed from every
rank's regenerated slot. The script exits 1 if any check fails on any rank.

GPU (2 H200s; the tree on PYTHONPATH):
    python -m benchmarks.tp_transfer_bench --tp 2 --out BENCHMARKS.md --json rows.json
Where the GPU machine lacks the compiler's imports (safetensors, jinja2), compile here and carry DIR:
    python -m benchmarks.tp_transfer_bench --compile-only DIR      (then: --plans DIR on the GPU machine)
CPU check of the script (gloo, Triton interpreter, tiny configs derived from the bundled ones):
    python -m benchmarks.tp_transfer_bench --device cpu --tp 2 --n 1 3 --warmup 1 --repeats 2
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import tempfile
import time
from pathlib import Path
from benchmarks.cli_args import OneLineParser, path_named
from benchmarks.tp_transfer_rank import COLLECTIVE_TIMEOUT_S, FORCED_ENV, _worker, run_case  # noqa: F401 (re-exported)

# the machines forbid NVLink multicast: every process (spawned ones inherit this) keeps it off
os.environ.update(FORCED_ENV)

DEFAULT_MODELS = ["kimi-linear-48b-a3b", "qwen3-next-80b-a3b"]
TINY_DIM = 8          # d_k = d_v of the CPU configs
# value heads and recurrent layers of the CPU configs, sized so that the seed-0 decay draw makes
# storage balancing move units at P = 2 (M_remote > 0) for both families
TINY_SHAPES = {"kimi_linear": (2, 6), "qwen3_next": (16, 6)}


def parse_args(argv=None):
    ap = OneLineParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--tp", type=int, default=2, help="TP degree P = number of processes")
    ap.add_argument("--model", action="append", default=None,
                    help=f"bundled reference name or checkpoint directory (default {DEFAULT_MODELS})")
    ap.add_argument("--wmax", type=int, nargs="+", default=[16, 128])
    ap.add_argument("--n", type=int, nargs="+", default=[1, 8, 64], help="state checkpoints per call")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0, help="state values (and the decay draw of --device cpu configs)")
    ap.add_argument("--out", type=path_named("an output path"), default=None, help="append a Markdown section to this file")
    ap.add_argument("--compile-only", type=Path, default=None, metavar="DIR",
                    help="only compile the plans into DIR (with DIR/cases.json) and exit")
    ap.add_argument("--plans", type=Path, default=None, metavar="DIR",
                    help="use plans written by --compile-only DIR (no compiler imports: safetensors, jinja2)")
    ap.add_argument("--json", type=Path, default=None, help="write the merged rows (times, checks, maps) as JSON")
    ap.add_argument("--inject-fault", action="store_true",
                    help="flip one bit of the loaded units on the last rank (shows that the check fails)")
    args = ap.parse_args(argv)
    if args.tp < 1 or min(args.n) < 1 or args.repeats < 1 or args.warmup < 0:
        ap.error("--tp, --n and --repeats must be >= 1, --warmup >= 0")
    args.model = args.model or list(DEFAULT_MODELS)
    return args


# ----------------------------------------------------------------------------- plans (parent process)


def reference_dir(name: str) -> Path:
    """A bundled reference checkpoint (``plans/reference/<name>``) or a path given as is."""
    if Path(name).is_dir():
        return Path(name)
    try:
        import dasc_plans
        root = Path(dasc_plans.__file__).parent / "reference"
    except ImportError:
        root = Path(__file__).resolve().parents[1] / "plans" / "reference"
    path = root / name
    if not path.is_dir():
        raise SystemExit(f"tp_transfer_bench: no checkpoint directory {name!r} (nor {path})")
    return path


def tiny_config(cfg: dict, *, heads: int, layers: int) -> dict:
    """The same architecture with ``heads`` value heads of dim 8 and ``layers`` recurrent layers (CPU mode)."""
    c = json.loads(json.dumps(cfg))
    if c.get("model_type") == "kimi_linear":
        c["num_hidden_layers"] = layers + 1
        c["linear_attn_config"].update(kda_layers=list(range(1, layers + 1)), full_attn_layers=[layers + 1],
                                       num_heads=heads, head_dim=TINY_DIM)
    elif c.get("model_type") == "qwen3_next":
        interval = int(c.get("full_attention_interval", 4))
        c.update(num_hidden_layers=-(-layers // (interval - 1)) * interval, linear_num_value_heads=heads,
                 linear_num_key_heads=heads // 2, linear_key_head_dim=TINY_DIM, linear_value_head_dim=TINY_DIM)
    else:
        raise SystemExit(f"tp_transfer_bench: no tiny CPU config for model_type {c.get('model_type')!r}")
    return c


def compile_cases(args, work: Path) -> list[dict]:
    """Compile every (model, w_max) with balance=storage; returns [{name, w_max, plan_dir}]."""
    from dasc_compile.compiler import compile_plan
    from dasc_compile.policy import Policy

    cases = []
    for i, name in enumerate(args.model):
        src = reference_dir(name)
        if args.device == "cpu":
            from dasc_compile.refckpt import write_decay_only
            cfg = json.loads((src / "config.json").read_text())
            heads, layers = TINY_SHAPES.get(cfg.get("model_type"), (2 * args.tp, 3))
            heads = -(-heads // args.tp) * args.tp
            src = write_decay_only(tiny_config(cfg, heads=heads, layers=layers), work / f"model{i}", seed=args.seed)
        for w in args.wmax:
            _, plan_dir = compile_plan(src, Policy(w_max=w, tp_size=args.tp, balance="storage"),
                                       work / f"plan{i}-w{w}")
            cases.append({"name": Path(name).name, "w_max": w, "plan_dir": str(plan_dir)})
    return cases


# ----------------------------------------------------------------------------- report (parent process)


def merge(gathered: list[dict]) -> list[dict]:
    """One row per (model, w_max, N): times of the slowest rank, checks of every rank."""
    out = []
    for i, row in enumerate(gathered[0]["rows"]):
        ranks = [g["rows"][i] for g in gathered]
        m = dict(row)
        m["us"] = {k: max(r["us"][k] for r in ranks) for k in row["us"]}
        m["pack_us_per_rank"] = [r["us"]["pack"] for r in ranks]
        m["failed"] = [f"r{g['rank']}:{k}" for g, r in zip(gathered, ranks)
                       for k in ("pack_ok", "store_ok", "roundtrip_ok") if not r[k]]
        out.append(m)
    return out


def table(rows: list[dict]) -> list[str]:
    """Markdown table lines of the merged rows (times in microseconds, payload in bytes)."""
    lines = ["| model | w_max | N | n_r per rank | M_remote units | payload bytes | pack us per rank | stage us | store a2a us | "
             "load a2a us | store / pack | load / pack | exact |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        us = r["us"]
        ok = "yes" if not r["failed"] else "NO (" + ", ".join(r["failed"]) + ")"
        lines.append(f"| {r['name']} | {r['w_max']} | {r['n']} | {'/'.join(map(str, r['n_local']))} | {r['m_remote']} | "
                     f"{r['payload_bytes']} | {'/'.join(f'{t:.1f}' for t in r['pack_us_per_rank'])} | {us['stage']:.1f} | {us['store']:.1f} | "
                     f"{us['load']:.1f} | {us['store'] / us['pack']:.2f} | {us['load'] / us['pack']:.2f} | {ok} |")
    return lines


def section(args, gathered: list[dict], rows: list[dict], lines: list[str]) -> str:
    """The Markdown section for ``--out``: command, devices, versions, P, provenance, what is timed, the table."""
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    devices = ", ".join(f"rank {g['rank']}: {g['device']}" for g in gathered)
    provenance = sorted({r["provenance"] for r in rows})
    shapes = sorted({(r["name"], r["layers"], r["heads_local"], tuple(r["unit"]), r["unit_bytes"]) for r in rows})
    cmd = "python -m benchmarks.tp_transfer_bench " + shlex.join(sys.argv[1:])
    backend = "nccl" if args.device == "cuda" else "gloo, Triton interpreter, tiny configs (timings meaningless)"
    return "\n".join([
        f"## Storage balancing across ranks: all-to-all store / load vs pack (TP={args.tp}, {args.device})",
        "",
        f"Command: `{cmd}`.",
        f"Devices: {devices}; torch {torch.__version__}, triton {triton_version}; P = {args.tp}, backend {backend}; "
        f"NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1.",
        "Per-rank shapes: " + "; ".join(f"{n} L={L}, H/P={h}, unit {list(u)} ({b} B)" for n, L, h, u, b in shapes) + ".",
        "The decay values of the reference checkpoints are an initialisation draw, not trained weights "
        f"({'; '.join(provenance)}): kept sets, n_r and M_remote describe that draw; speeds and exactness do not "
        "depend on the values.",
        f"Times: median of {args.repeats} repeats after {args.warmup} warm-up calls, barrier before each repeat, "
        f"{'CUDA events' if args.device == 'cuda' else 'wall clock'} (host launch included), microseconds; pack per "
        "rank, the other columns and the ratios for the slowest rank. pack = the plan's "
        "Triton pack of N slots (kept units + conv state); stage = slot-major -> unit-major copy of the packed "
        "units (the runtime does it on store and its mirror on load); store / load = `store_all_to_all` / "
        "`load_all_to_all` (local copy of the kept prefix + one variable-split all-to-all, skipped when "
        "M_remote = 0). payload = M_remote x unit bytes x N. exact = on every rank the kernel pack equals the "
        "PyTorch pack, load after store equals the packed units, and the first / last slot's storage equals "
        "`store_all_ranks` (the single-process mapping), all bit for bit.",
        "",
        *lines,
        "",
    ])


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for the process group's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import torch.multiprocessing as mp

    t0 = time.perf_counter()
    if args.compile_only is not None:
        cases = compile_cases(args, args.compile_only)
        for c in cases:
            c["plan_dir"] = Path(c["plan_dir"]).name
        (args.compile_only / "cases.json").write_text(json.dumps(cases, indent=1))
        print(f"tp_transfer_bench: {len(cases)} plans in {args.compile_only}")
        return 0
    if args.device == "cuda" and torch.cuda.device_count() < args.tp:
        raise SystemExit(f"tp_transfer_bench: --tp {args.tp} needs {args.tp} GPUs, found {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory(prefix="dasc-tp-bench-") as tmp:
        work = Path(tmp)
        if args.plans is not None:
            cases = json.loads((args.plans / "cases.json").read_text())
            for c in cases:
                c["plan_dir"] = str(args.plans / c["plan_dir"])
        else:
            cases = compile_cases(args, work)
        result = work / "result.json"
        worker_args = (args, cases, free_port(), str(result))
        if args.tp == 1:
            _worker(0, *worker_args)           # one rank: no process to spawn
        else:
            mp.spawn(_worker, args=worker_args, nprocs=args.tp, join=True)
        gathered = json.loads(result.read_text())
    rows = merge(gathered)
    lines = table(rows)
    print("\n".join(lines))
    failed = [r for r in rows if r["failed"]]
    print(f"tp_transfer_bench: {len(rows)} rows, {len(failed)} with a failed exactness check, "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.out is not None:
        with open(args.out, "a") as f:
            f.write("\n" + section(args, gathered, rows, lines))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
