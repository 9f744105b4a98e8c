"""How long ``dasc sweep`` takes on a full-size checkpoint (issue 22: a w_max x TP sweep should answer in
under 2 s, the compiler reading ~300 KiB of it).

For each model (default Qwen3-Next-80B-A3B and Kimi-Linear-48B-A3B) this script

1. writes the full-size reference checkpoint (:func:`dasc_compile.refckpt.write_full_size`: every real
   tensor, sharded with an index, non-decay tensors sparse holes) under ``--root`` unless it is there;
2. runs the sweep the issue names, ``--wmax 4,16,64,128,512 --tp 1,2,4,8 --balance storage --budget 8GiB
   --max-running-requests 8`` (20 plans, each sized as ``dasc size``), ``--repeats`` times in one process
   (:func:`dasc_compile.sweep.run_sweep`, after one warm-up call that imports and reads the shards'
   headers into the page cache), and records the wall time of each call and the bytes it read
   (``/proc/self/io`` ``rchar``);
3. runs the same sweep once as a user does, ``python cli.py sweep ... --json`` in a fresh process, and
   records its wall time (interpreter start and imports included) and the in-process time it reports
   (``wall_s``).

It prints the figures (a Markdown table for BENCHMARKS.md) and, with ``--json``, writes them. The
machine's load matters: the CPU time of the calls is printed beside their wall time.

Usage::

    .venv/bin/python -m benchmarks.sweep_bench --root /tmp/dasc-bench --repeats 5
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from benchmarks.cli_args import OneLineParser

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODELS = ("qwen3-next-80b-a3b", "kimi-linear-48b-a3b")
W_MAX, TP = (4, 16, 64, 128, 512), (1, 2, 4, 8)
BUDGET, R = "8GiB", 8


def _rchar() -> int:
    try:
        with open("/proc/self/io") as fh:
            return next(int(ln.split(": ")[1]) for ln in fh if ln.startswith("rchar"))
    except (OSError, StopIteration):
        return 0


def ensure_checkpoint(root: Path, name: str) -> Path:
    """The full-size reference checkpoint of ``name`` under ``root`` (written once)."""
    from dasc_compile.refckpt import write_full_size

    ck = root / name
    if not (ck / "model.safetensors.index.json").is_file():
        write_full_size(name, ck)
    return ck


def time_in_process(ck: Path, repeats: int) -> dict:
    """Wall and CPU seconds and bytes read of ``repeats`` sweeps after one warm-up."""
    from dasc_compile import sweep as sw
    from dasc_compile.policy import Policy
    from dasc_compile.size_report import parse_bytes

    grid = sw.SweepGrid(w_max=W_MAX, tp=TP, int8=(False,), base=Policy(balance="storage"))
    sizing = sw.Sizing(budget_bytes=parse_bytes(BUDGET), max_running_requests=R)
    sw.run_sweep(ck, grid, sizing=sizing)                       # warm-up: imports, page cache
    wall, cpu, read = [], [], []
    for _ in range(repeats):
        r0, c0, t0 = _rchar(), time.process_time(), time.perf_counter()
        result = sw.run_sweep(ck, grid, sizing=sizing)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        read.append(_rchar() - r0)
    return {"plans": len(result.rows), "wall_s": wall, "cpu_s": cpu, "bytes_read": read,
            "median_wall_s": statistics.median(wall)}


def time_cli(ck: Path) -> dict:
    """One ``python cli.py sweep`` process, as a user runs it."""
    cmd = [sys.executable, str(REPO / "cli.py"), "sweep", str(ck), "--wmax", ",".join(map(str, W_MAX)),
           "--tp", ",".join(map(str, TP)), "--balance", "storage", "--budget", BUDGET,
           "--max-running-requests", str(R), "--json"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} failed: {p.stderr.strip()}")
    return {"process_wall_s": wall, "in_process_wall_s": json.loads(p.stdout)["wall_s"]}


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path("/tmp/dasc-bench"), help="where the full-size checkpoints live")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated reference names")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    a = ap.parse_args(argv)
    out = {"host": os.uname().nodename, "cpus": os.cpu_count(), "load_1min": os.getloadavg()[0],
           "grid": {"w_max": W_MAX, "tp": TP, "balance": "storage", "budget": BUDGET, "R": R}, "models": {}}
    for name in a.models.split(","):
        ck = ensure_checkpoint(a.root, name)
        size = sum(p.stat().st_size for p in ck.iterdir())
        rec = {"apparent_bytes": size, **time_in_process(ck, a.repeats), **time_cli(ck)}
        out["models"][name] = rec
    print(f"dasc sweep: {len(W_MAX)} w_max x {len(TP)} TP (storage), sized at {BUDGET}, R = {R}; "
          f"{out['cpus']} CPUs, 1-min load {out['load_1min']:.1f}")
    print("| model | checkpoint | plans | sweep wall s (median of n; min-max) | CPU s (median) | bytes read "
          "| `dasc sweep` process wall s (in-process) |")
    print("|---|---|---|---|---|---|---|")
    for name, r in out["models"].items():
        print(f"| {name} | {r['apparent_bytes'] / 1e9:.0f} GB | {r['plans']} | {r['median_wall_s']:.2f} "
              f"(n = {len(r['wall_s'])}; {min(r['wall_s']):.2f}-{max(r['wall_s']):.2f}) | "
              f"{statistics.median(r['cpu_s']):.2f} | {statistics.median(r['bytes_read']) / 1024:.0f} KiB | "
              f"{r['process_wall_s']:.2f} ({r['in_process_wall_s']:.2f}) |")
    if a.json is not None:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
