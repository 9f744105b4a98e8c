"""Matched-memory launch settings for a plan (paper App. C.1): ``python -m dasc_runtime.sizing``.

Dense arm: ``--max-mamba-cache-size M``. dasc arm: ``--max-mamba-cache-size M'`` and
``--dasc-pool-slots C`` with ``(M'+1) b_dense + (C+1) b_compressed + scratch <= (M+1) b_dense`` per
TP rank, b_dense = the plan's dense bytes per slot on one rank (temporal + conv), b_compressed =
the bottleneck rank's compressed bytes per slot (every rank allocates the same C).

Example::

    python -m dasc_runtime.sizing --plan kimi.dasc --dense-slots 512 --native-slots 256 --scratch-slots 8
"""

from __future__ import annotations

import argparse
import sys

from dasc_compile.schema import DascInputError
from dasc_runtime.plan_io import load_plan
from dasc_runtime.pool import MatchedMemory, matched_memory

__all__ = ["plan_matched_memory", "main"]


def plan_matched_memory(plan, *, dense_slots: int, native_slots: int, scratch_slots: int = 0) -> MatchedMemory:
    """:func:`~dasc_runtime.pool.matched_memory` with the plan's per-rank byte figures.

    ``scratch_slots``: staging charged to dasc in compressed-slot units (the PyTorch store/load path
    stages up to one batch of hits; the generated kernels stage nothing).
    """
    b_dense = plan.tp.bytes_dense_per_slot
    b_comp = plan.tp.bottleneck_bytes_per_slot
    return matched_memory(dense_slots=dense_slots, native_slots=native_slots, bytes_dense_slot=b_dense,
                          bytes_compressed_slot=b_comp, scratch_bytes=scratch_slots * b_comp)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dasc_runtime.sizing", description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, help="plan directory or plan.json")
    ap.add_argument("--dense-slots", type=int, required=True, help="M: the Dense arm's --max-mamba-cache-size")
    ap.add_argument("--native-slots", type=int, required=True, help="M': native slots kept for the dasc arm")
    ap.add_argument("--scratch-slots", type=int, default=0, help="staging charged to dasc, in compressed slots")
    a = ap.parse_args(argv)
    try:
        plan = load_plan(a.plan)
        mm = plan_matched_memory(plan, dense_slots=a.dense_slots, native_slots=a.native_slots,
                                 scratch_slots=a.scratch_slots)
    except DascInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"per TP rank: b_dense={mm.bytes_dense_slot} B, b_compressed={mm.bytes_compressed_slot} B, "
          f"budget={mm.budget_bytes} B, used={mm.used_bytes} B")
    print(f"Dense arm: --max-mamba-cache-size {mm.dense_slots}")
    print(f"dasc arm:  {mm.flags()}   (capacity {mm.native_slots + mm.compressed_slots} checkpoints vs "
          f"{mm.dense_slots})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
