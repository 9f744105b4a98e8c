"""Per-rank bottleneck payload and C_ckpt under TP for balance off / storage / hybrid (paper App. B.1, Fig. 9).

Compiles each (model, w_max, mode) with `dasc_compile.compiler.compile_plan` (no kernels) and prints a
Markdown table; `--out BENCHMARKS.md` appends it with the command line. The decay values of the
reference checkpoints are an initialisation draw, not trained weights: the figures describe that
draw, not the released models.

    python -m benchmarks.tp_capacity --model DIR [--model DIR ...] --tp 8 --wmax 16 64 128 512 [--out BENCHMARKS.md]
"""

from __future__ import annotations

import platform
import sys
import tempfile
from pathlib import Path

from dasc_compile.compiler import compile_plan
from dasc_compile.errors import DascInputError
from dasc_compile.policy import Policy
from benchmarks.cli_args import OneLineParser, path_named


def mib(b: int) -> str:
    return f"{b / 2**20:.2f}"


def main(argv=None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True, help="checkpoint (dir, file or index)")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--wmax", type=int, nargs="+", default=[16, 64, 128, 512])
    ap.add_argument("--out", type=path_named("an output path"), help="append the Markdown section to this file")
    args = ap.parse_args(argv)

    rows = ["| model | w_max | mode | bottleneck rank | bottleneck MiB/slot | dense MiB/slot/rank | C_ckpt TP=1 | C_ckpt TP | M_remote units |",
            "|---|---|---|---|---|---|---|---|---|"]
    violations = []
    provenances: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.model:
            for w in args.wmax:
                caps = {}
                for mode in ("off", "storage", "hybrid"):
                    try:
                        plan, _ = compile_plan(model, Policy(w_max=w, tp_size=args.tp, balance=mode),
                                               Path(tmp) / "p", with_kernels=False)
                    except DascInputError as exc:   # hybrid needs the model's head-coupled tensors (not Mamba2's)
                        if mode != "hybrid":
                            raise
                        rows.append(f"| {Path(model).name} | {w} | hybrid | - | - | - | - | - | - |")
                        print(rows[-1], f"({exc})", flush=True)
                        continue
                    tp = plan.tp
                    provenances.setdefault(plan.model.model_type, plan.model.provenance)
                    caps[mode] = tp.c_ckpt_tp
                    rows.append(f"| {plan.model.model_type} | {w} | {mode} | {tp.bottleneck_rank} | "
                                f"{mib(tp.bottleneck_bytes_per_slot)} | {mib(tp.bytes_dense_per_slot)} | "
                                f"{plan.totals.c_ckpt:.3f} | {tp.c_ckpt_tp:.3f} | {tp.m_remote} |")
                    print(rows[-1], flush=True)
                if caps["storage"] < caps["off"] - 1e-12 or caps.get("hybrid", caps["off"]) < caps["off"] - 1e-12:
                    violations.append((model, w, caps))
    provenance = "; ".join(f"{k}: {v}" for k, v in provenances.items())
    section = "\n".join([
        f"## TP placement: bottleneck payload and C_ckpt at TP={args.tp}",
        "",
        f"Command: `python {' '.join(['-m', 'benchmarks.tp_capacity'] + sys.argv[1:])}` "
        f"(CPU, {platform.machine()}; pure accounting, no device).",
        f"Decay values: {provenance}.",
        "",
        *rows,
        "",
        "Storage balancing never lowered capacity below `off`." if not violations
        else f"VIOLATION: balancing lowered capacity: {violations}",
        "",
    ])
    print(section)
    if args.out:
        with open(args.out, "a") as f:
            f.write(section + "\n")
    return 1 if violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
