"""Cost of ``dasc compile`` on full-size checkpoints, against loading every tensor with safetensors.

For each model (default: Qwen3-Next-80B-A3B and Kimi-Linear-48B-A3B) this script

1. writes the full-size reference checkpoint (:func:`dasc_compile.refckpt.write_full_size`:
   every real tensor, sharded with an index, non-decay tensors are sparse holes) under ``--root``
   unless it is already there;
2. runs ``compile_plan(model, Policy(w_max), out_dir)`` (what ``dasc compile`` runs) ``--repeats``
   times, each in a fresh Python process whose checkpoint pages were first dropped from the page
   cache (``posix_fadvise(DONTNEED)`` on each file), and records wall time of the call, import
   time, bytes of tensor data read (the decay tensors the reader returned), bytes of headers /
   index / config read, ``/proc/self/io`` deltas (``rchar``: bytes through read(); ``read_bytes``:
   bytes fetched from the block device) and peak RSS (``getrusage``);
3. runs the baseline, ``safetensors.torch.load_file`` on every tensor of the first
   ``--baseline-shards`` shards, touching every 4 KiB page of each tensor (safetensors may return
   lazily mapped storage) (the whole checkpoint does not fit in this machine's memory), in a
   fresh process, and extrapolates its time and bytes linearly to the whole checkpoint.

Holes read as zeros without disk I/O, so the baseline's time is a lower bound for a real
checkpoint on disk (which also pays for the device bandwidth). Prints a Markdown section for
BENCHMARKS.md and, with ``--json``, writes the raw numbers.

Usage::

    .venv/bin/python -m benchmarks.compile_bench --root /tmp/dasc-bench --repeats 3 --json /tmp/dasc-bench/compile.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from benchmarks.cli_args import OneLineParser

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODELS = ("qwen3-next-80b-a3b", "kimi-linear-48b-a3b")


# ----------------------------------------------------------------------------- helpers (child side)


def _io() -> dict[str, int]:
    try:
        with open("/proc/self/io") as fh:
            return {k: int(v) for k, v in (line.split(": ") for line in fh.read().splitlines())}
    except OSError:  # not Linux
        return {}


def _drop_cache(root: Path) -> None:
    """Evict the checkpoint's pages from the page cache, file by file (no system-wide effect)."""
    for p in root.iterdir():
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _peak_rss_bytes() -> int:
    """Peak resident set of this process, bytes: ``VmHWM`` (reset at exec, unlike ``ru_maxrss``, which
    Linux carries over from the parent across fork + exec)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # KiB on Linux


def child_compile(model_dir: Path, out_dir: Path, w_max: int) -> dict:
    _drop_cache(model_dir)
    io0 = _io()
    t0 = time.perf_counter()
    from dasc_compile import compiler
    from dasc_compile.checkpoint import decay_bytes, open_checkpoint, read_safetensors_header
    from dasc_compile.policy import Policy
    t_import = time.perf_counter() - t0
    rss_after_import = _peak_rss_bytes()

    seen: dict[str, float] = {}
    real_open, real_read = compiler.open_checkpoint, compiler.read_decay_tensors

    def timed_open(*a, **k):        # instrumentation only: time of the checkpoint reader's two calls
        t = time.perf_counter()
        out = real_open(*a, **k)
        seen["open_s"] = time.perf_counter() - t
        return out

    def counting_read(src, spec):   # ... and what the compiler read
        t = time.perf_counter()
        out = real_read(src, spec)
        seen["read_s"] = time.perf_counter() - t
        seen["tensor_bytes"] = decay_bytes(out)
        seen["n_tensors"] = len(out)
        seen["files"] = len({src.tensor_files[n] for n, _ in out})
        return out

    compiler.open_checkpoint, compiler.read_decay_tensors = timed_open, counting_read
    io1 = _io()
    t1 = time.perf_counter()
    plan, _ = compiler.compile_plan(model_dir, Policy(w_max=w_max), out_dir)
    wall = time.perf_counter() - t1
    io2 = _io()
    peak = _peak_rss_bytes()

    # metadata bytes the reader had to read (not timed): headers of the shards it opened, index, config
    src = open_checkpoint(model_dir)
    decay_files = {src.tensor_files[n] for n in plan.fingerprint.decay_tensors}
    header_bytes = sum(8 + read_safetensors_header(f).header_bytes for f in decay_files)
    meta_bytes = header_bytes + src.config_path.stat().st_size
    if src.index_path is not None:
        meta_bytes += src.index_path.stat().st_size
    return {
        "wall_s": wall, "import_s": t_import, "reader_s": seen["open_s"] + seen["read_s"], "tensor_bytes": seen["tensor_bytes"], "n_tensors": seen["n_tensors"],
        "files_opened": seen["files"], "metadata_bytes": meta_bytes,
        "rchar": io2.get("rchar", 0) - io1.get("rchar", 0),
        "disk_read_bytes": io2.get("read_bytes", 0) - io1.get("read_bytes", 0),
        "peak_rss": peak, "rss_after_import": rss_after_import,
        "n_units": plan.totals.n_units, "n_kept": plan.totals.n_kept, "provenance": plan.model.provenance,
        "io_import": io1.get("rchar", 0) - io0.get("rchar", 0),
    }


def child_load(model_dir: Path, shards: int) -> dict:
    _drop_cache(model_dir)
    t0 = time.perf_counter()
    import torch
    from safetensors.torch import load_file
    t_import = time.perf_counter() - t0
    rss_after_import = _peak_rss_bytes()
    files = sorted(model_dir.glob("model-*.safetensors"))[:shards]
    io1 = _io()
    t1 = time.perf_counter()
    nbytes = n = 0
    for f in files:
        tensors = load_file(str(f))
        for t in tensors.values():
            # safetensors may hand out lazily mapped storage: touch one byte per 4 KiB page so every
            # byte is really loaded (what a framework's weight load does)
            b = t.reshape(-1).view(torch.uint8)
            int(b[::4096].sum())
            nbytes += b.numel()
        n += len(tensors)
        del tensors
    wall = time.perf_counter() - t1
    io2 = _io()
    return {"wall_s": wall, "import_s": t_import, "tensor_bytes": nbytes, "n_tensors": n, "files": len(files),
            "rchar": io2.get("rchar", 0) - io1.get("rchar", 0),
            "disk_read_bytes": io2.get("read_bytes", 0) - io1.get("read_bytes", 0),
            "peak_rss": _peak_rss_bytes(), "rss_after_import": rss_after_import}


# ----------------------------------------------------------------------------- driver


def _run_child(*args: str) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.compile_bench", "--child", *args]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if res.returncode != 0:
        raise SystemExit(f"child failed ({' '.join(cmd)}):\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _checkpoint_stats(root: Path) -> dict:
    idx = json.loads((root / "model.safetensors.index.json").read_text())
    files = sorted(root.glob("model-*.safetensors"))
    return {"total_size": idx["metadata"]["total_size"], "n_tensors": len(idx["weight_map"]), "shards": len(files),
            "apparent": sum(f.stat().st_size for f in files),
            "allocated": sum(f.stat().st_blocks * 512 for f in root.iterdir() if f.is_file())}


def ensure_checkpoint(name: str, root: Path) -> Path:
    out = root / name
    if not (out / "model.safetensors.index.json").exists():
        from dasc_compile.refckpt import write_full_size

        print(f"writing full-size reference checkpoint {out} (sparse) ...", file=sys.stderr)
        write_full_size(name, out, seed=0)
    return out


def _mib(b: float) -> str:
    return f"{b / 2**20:.2f} MiB" if b < 2**30 else f"{b / 2**30:.1f} GiB"


def _kib(b: float) -> str:
    return f"{b / 1024:.1f} KiB"


def markdown(results: dict, argv: list[str]) -> str:
    lines = [
        "## Compile cost (`dasc compile` vs loading every tensor)",
        "",
        f"Command: `.venv/bin/python -m benchmarks.compile_bench {' '.join(argv)}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}, "
        f"{results['torch']}, safetensors {results['safetensors']}.  ",
        "Checkpoints: full-size reference checkpoints (`python -m dasc_compile.refckpt --full-size`): every "
        "real tensor name, shape and dtype, sharded as published; decay values are an initialisation draw, not "
        "trained; all other tensors are sparse holes. Each run is a fresh process with the checkpoint's pages "
        "dropped from the page cache first. Wall time is the `compile_plan` call (plan + kernels written), "
        "median of the runs; import time is listed apart.",
        "",
        "| model | checkpoint (tensors / shards) | compile wall (median, min-max) | of which checkpoint reader | "
        "tensor data read | headers + index + config read | disk reads | peak RSS (after imports) | units kept |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results["models"].items():
        c, runs = r["checkpoint"], r["compile"]
        walls = [x["wall_s"] for x in runs]
        x = runs[0]
        lines.append(
            f"| {name} | {c['total_size'] / 1e9:.1f} GB ({c['n_tensors']} / {c['shards']}; "
            f"{_mib(c['allocated'])} on disk) | {statistics.median(walls):.3f} s ({min(walls):.3f}-{max(walls):.3f}); "
            f"import {statistics.median([y['import_s'] for y in runs]):.2f} s | "
            f"{statistics.median([y['reader_s'] for y in runs]):.3f} s | {_kib(x['tensor_bytes'])} "
            f"({x['n_tensors']} tensors, {x['files_opened']} shards) | {_mib(x['metadata_bytes'])} | "
            f"{_mib(max(y['disk_read_bytes'] for y in runs))} | {_mib(max(y['peak_rss'] for y in runs))} "
            f"({_mib(x['rss_after_import'])}) | {x['n_kept']}/{x['n_units']} |")
    lines += ["", "Baseline: `safetensors.torch.load_file` on every tensor of the first shard(s), one byte of every "
              "4 KiB page touched (so lazily mapped storage is really loaded), extrapolated "
              "linearly to the whole checkpoint (holes read as zeros from memory, so this is a lower bound for a "
              "checkpoint on disk).", "",
              "| model | loaded (measured) | wall (measured) | peak RSS (measured) | whole checkpoint (extrapolated) "
              "| dasc compile vs whole load |", "|---|---|---|---|---|---|"]
    for name, r in results["models"].items():
        b, c = r["baseline"], r["checkpoint"]
        scale = c["total_size"] / b["tensor_bytes"]
        full = b["wall_s"] * scale
        med = statistics.median([x["wall_s"] for x in r["compile"]])
        lines.append(f"| {name} | {_mib(b['tensor_bytes'])} ({b['n_tensors']} tensors, {b['files']} shard) | "
                     f"{b['wall_s']:.2f} s | {_mib(b['peak_rss'])} | {full:.0f} s, {c['total_size'] / 1e9:.1f} GB "
                     f"| {full / med:.0f}x less time, {c['total_size'] / r['compile'][0]['tensor_bytes']:.0f}x "
                     f"fewer tensor bytes |")
    ok = all(statistics.median([x["wall_s"] for x in r["compile"]]) < 1.0 and r["compile"][0]["tensor_bytes"] < 2**20
             for r in results["models"].values())
    ok_reader = all(statistics.median([x["reader_s"] for x in r["compile"]]) < 1.0 for r in results["models"].values())
    lines += ["", f"Target (under 1 s and under 1 MiB of tensor data per compile): {'met' if ok else 'NOT met'} "
              f"(checkpoint reader alone under 1 s: {'yes' if ok_reader else 'no'})."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    ap.add_argument("--root", type=Path, default=Path("/tmp/dasc-bench"), help="where the sparse checkpoints go")
    ap.add_argument("--wmax", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline-shards", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None, help="write the raw numbers here")
    args = ap.parse_args(argv)
    if args.child is not None:
        kind, *rest = args.child
        out = (child_compile(Path(rest[0]), Path(rest[1]), int(rest[2])) if kind == "compile"
               else child_load(Path(rest[0]), int(rest[1])))
        print(json.dumps(out))
        return 0

    from importlib.metadata import version   # the driver imports no torch: children start lean

    results: dict = {"torch": f"torch {version('torch')}", "safetensors": version("safetensors"), "models": {}}
    args.root.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        ck = ensure_checkpoint(name, args.root)
        runs = []
        for i in range(args.repeats):
            out = args.root / "plans" / f"{name}-{i}"
            shutil.rmtree(out, ignore_errors=True)
            runs.append(_run_child("compile", str(ck), str(out), str(args.wmax)))
            shutil.rmtree(out, ignore_errors=True)
        base = _run_child("load", str(ck), str(args.baseline_shards))
        results["models"][name] = {"checkpoint": _checkpoint_stats(ck), "compile": runs, "baseline": base}
        print(f"{name}: compile {[round(r['wall_s'], 3) for r in runs]} s, baseline {base['wall_s']:.2f} s "
              f"for {_mib(base['tensor_bytes'])}", file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    print(markdown(results, sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
