"""Arms of the matched-memory serving benchmark and their SGLang launch flags (paper §5.3, App. C.1).

Every arm gets the same state-memory budget per TP rank, the Dense arm's native pool:
``B = (M + 1) * b_dense`` bytes, ``M`` = the Dense arm's ``--max-mamba-cache-size`` (SGLang's
``MambaPool`` reserves one slot, hence ``M + 1``), ``b_dense`` = bytes of one dense state
checkpoint on a rank (temporal ``[L, H/P, d_v, d_k]`` + conv windows; the plan's
``tp.bytes_dense_per_slot``). The other arms keep ``M'`` native slots (running requests need
``ratio * max_running_requests`` of them, SGLang's ``kv_cache_configurator``) and spend the rest on
a checkpoint pool:

* ``int8``: SGLang's own INT8 checkpoint pool (``--enable-int8-mamba-checkpoint
  --int8-mamba-ckpt-size C``), ``b_int8`` bytes a slot as SGLang 0.5.17's
  ``MambaCheckpointPool.estimate_mem_usage_bytes`` counts them (int8 temporal + one scale per
  (layer, head, k) in the temporal dtype + conv windows; slot 0 reserved);
  ``C = floor((B - (M'+1) b_dense) / b_int8) - 1``.
* ``dasc-nr-wW`` (and ``...-int8``): the dasc compressed pool, ``C`` from
  :func:`dasc_runtime.sizing.plan_matched_memory` (bottleneck rank's compressed bytes a slot,
  slot 0 reserved, plus any scratch). A ``-hostwait`` suffix runs the same arm with
  ``DASC_RECLAIM_WAIT=host`` in the server's environment (the reclamation walk waits for pending
  demotions on the host instead of ordering the current stream after them), for an A/B of that
  synchronisation at equal memory.

Checkpoint capacity (the x axis of the figure): the state slots a cached checkpoint can occupy.
Dense: ``M`` (shared with running requests). dasc: ``M' + C`` (dense checkpoints stay in native
slots, shared with running requests, and are demoted into the C compressed ones). INT8: ``C`` only.
With ``--enable-int8-mamba-checkpoint`` SGLang 0.5.17 commits *every* cached state into the INT8
pool (``MambaComponent._commit_int8_checkpoint``, sglang/srt/mem_cache/unified_cache/components/
mamba_component.py), so its ``M'`` native slots serve running requests only.

CPU use (plans are compiled with ``dasc compile``; prints one line per arm, and ``--out`` writes
the arms as JSON for ``run_serving.py``)::

    .venv/bin/python -m benchmarks.serving_arms --plans /tmp/plans --dense-slots 48 --native-slots 40
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from dasc_compile.errors import DascInputError

__all__ = ["ArmSpec", "ArmLaunch", "DEFAULT_ARMS", "plan_name", "arm_plan_dir", "compile_hint", "check_plans",
           "int8_bytes_per_slot", "arm_launch", "main"]

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ArmSpec:
    """One arm. ``kind``: ``dense`` | ``int8`` (SGLang's INT8 pool) | ``dasc`` (dasc-nr, plan with
    ``w_max`` and ``int8``); ``balance``: the plan's TP storage mode (``off`` | ``storage``);
    ``reclaim_wait``: the runtime's ``DASC_RECLAIM_WAIT`` (``stream`` | ``host``, dasc arms only)."""

    name: str
    kind: str
    w_max: Optional[int] = None
    int8: bool = False
    balance: str = "off"
    reclaim_wait: str = "stream"

    def __post_init__(self) -> None:
        if self.kind not in ("dense", "int8", "dasc"):
            raise DascInputError(f"arm {self.name!r}: kind must be dense, int8 or dasc, got {self.kind!r}")
        if (self.kind == "dasc") != (self.w_max is not None):
            raise DascInputError(f"arm {self.name!r}: w_max is set exactly for dasc arms")
        if self.reclaim_wait not in ("stream", "host") or (self.reclaim_wait == "host" and self.kind != "dasc"):
            raise DascInputError(f"arm {self.name!r}: reclaim_wait must be 'stream', or 'host' on a dasc arm, "
                                 f"got {self.reclaim_wait!r} on a {self.kind} arm")


# paper §5.3: Dense, SGLang INT8, dasc-nr at four w_max, dasc-nr + INT8
DEFAULT_ARMS: tuple[ArmSpec, ...] = (
    ArmSpec("dense", "dense"),
    ArmSpec("int8", "int8"),
    ArmSpec("dasc-nr-w512", "dasc", 512),
    ArmSpec("dasc-nr-w128", "dasc", 128),
    ArmSpec("dasc-nr-w64", "dasc", 64),
    ArmSpec("dasc-nr-w16", "dasc", 16),
    ArmSpec("dasc-nr-w128-int8", "dasc", 128, int8=True),
)


def plan_name(w_max: int, int8: bool = False, tp: int = 1, balance: str = "off") -> str:
    """Directory name of a compiled plan, e.g. ``w128-int8-tp1-off``."""
    return f"w{w_max}{'-int8' if int8 else ''}-tp{tp}-{balance}"


def arm_plan_dir(arm: ArmSpec, plans: Path | str, tp: int = 1) -> Path:
    """``plans/<plan_name>`` of a dasc ``arm`` (the folder holding its ``plan.json``)."""
    return Path(plans) / plan_name(arm.w_max, arm.int8, tp, arm.balance)


def compile_hint(arm: ArmSpec, tp: int, out: Path | str) -> str:
    """The ``dasc compile`` command line (a string) that writes the plan a dasc ``arm`` needs to
    ``out``: ``--balance storage`` for a storage arm, ``--policy INT8.yaml`` for an INT8 arm, with
    a note after the command saying what that policy file holds.

    Raises:
        DascInputError: ``arm`` is not a dasc arm (Dense and INT8 need no plan of their own).
    """
    if arm.kind != "dasc":
        raise DascInputError(f"arm {arm.name!r}: only dasc arms are compiled from a plan, not {arm.kind!r}")
    extra = (" --balance storage" if arm.balance == "storage" else "") + (" --policy INT8.yaml" if arm.int8 else "")
    note = "; INT8.yaml holds 'int8: true'" if arm.int8 else ""
    return f"dasc compile MODEL --wmax {arm.w_max} --tp {tp}{extra} --out {out}{note}"


def check_plans(arms: Sequence[ArmSpec], plans: Path, tp: int = 1) -> None:
    """Check, before any arm is sized, that every dasc arm's plan ``plans/<plan_name>/plan.json``
    exists.

    Args:
        arms: the arms (Dense and INT8 arms need no plan of their own and are skipped here).
        plans: directory of compiled plans. tp: the TP degree P of the plan names.
    Raises:
        DascInputError: one line naming every missing plan directory (sorted by w_max, INT8,
            balance), with the compile command of the first.
    """
    gone = [a for _, a in sorted({(a.w_max, a.int8, a.balance): a for a in arms if a.kind == "dasc"
                                  and not (arm_plan_dir(a, plans, tp) / "plan.json").is_file()}.items())]
    if gone:
        names = ", ".join(arm_plan_dir(a, plans, tp).name for a in gone)
        hint = compile_hint(gone[0], tp, arm_plan_dir(gone[0], plans, tp))
        raise DascInputError(f"{plans}: no plan.json for {names} (compile {'each' if len(gone) > 1 else 'it'}: "
                             f"{hint})")


def int8_bytes_per_slot(plan) -> int:
    """Bytes of one slot of SGLang's INT8 checkpoint pool on one rank, for the plan's model.

    Mirrors ``MambaCheckpointPool.estimate_mem_usage_bytes`` (sglang/srt/mem_cache/
    mamba_checkpoint_pool.py, 0.5.17) for one slot: ``L * (H/P) * d_v * d_k`` int8 bytes,
    ``L * (H/P) * d_k`` scales in the temporal dtype, and the conv windows in their dtype
    (``tp.payload_*[r].bytes_conv``, the same bytes the plan charges a dasc slot).

    Args:
        plan: a loaded :class:`dasc_compile.schema.Plan`.
    Returns:
        bytes (int).
    Raises:
        DascInputError: a temporal dtype outside float32 / bfloat16 / float16.
    """
    m, pol, tp = plan.model, plan.policy, plan.tp
    dt = _DTYPE_BYTES.get(pol.temporal_dtype)
    if dt is None:
        raise DascInputError(f"plan policy.temporal_dtype: expected one of {sorted(_DTYPE_BYTES)}, "
                             f"got {pol.temporal_dtype!r}")
    n_layers = len(m.recurrent_layer_ids)
    h = tp.heads_per_rank
    qdata = n_layers * h * m.head_v_dim * m.head_k_dim
    scale = n_layers * h * m.head_k_dim * dt
    conv = tp.payload_contiguous[0].bytes_conv
    return qdata + scale + conv


@dataclass
class ArmLaunch:
    """Launch settings of one arm at the matched budget (bytes per TP rank).

    Attributes:
        flags: extra ``sglang.launch_server`` flags (the plan path is ``{plans}/{plan}``).
        native_slots: ``--max-mamba-cache-size``; ckpt_slots: INT8 or dasc pool slots (usable).
        env: extra environment variables of the arm's server (``DASC_RECLAIM_WAIT`` for ``-hostwait``).
        capacity: checkpoint capacity (slots), see the module docstring.
        budget_bytes / used_bytes: per-rank state memory; used <= budget.
        bytes_native_slot / bytes_ckpt_slot: bytes of one slot of each pool.
        c_ckpt: the plan's compression ratio ``b_dense / b_compressed`` (1 for Dense, b_dense/b_int8
            for the INT8 arm).
    """

    arm: str
    kind: str
    plan: Optional[str]
    flags: list[str]
    native_slots: int
    ckpt_slots: int
    capacity: int
    budget_bytes: int
    used_bytes: int
    bytes_native_slot: int
    bytes_ckpt_slot: int
    c_ckpt: float
    w_max: Optional[int] = None
    int8: bool = False
    balance: str = "off"
    kept_fraction: Optional[float] = None
    notes: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def arm_launch(arm: ArmSpec, *, plans: Path, dense_slots: int, native_slots: int, tp: int = 1,
               scratch_slots: int = 0) -> ArmLaunch:
    """Matched-memory flags of ``arm`` (see module docstring).

    Args:
        plans: directory holding the compiled plans (:func:`plan_name` sub-directories); every arm
            reads ``b_dense`` from a plan (Dense and INT8 from any plan of that TP degree).
        dense_slots: M; native_slots: M' (<= M) for the INT8 and dasc arms; tp: TP degree P.
        scratch_slots: staging charged to dasc, in compressed slots (0 with generated kernels).
    Raises:
        DascInputError: no plan for the arm, M' > M, or no checkpoint slot fits the budget.
    """
    from dasc_runtime.plan_io import load_plan
    from dasc_runtime.sizing import plan_matched_memory

    if not 1 <= native_slots <= dense_slots:
        raise DascInputError(f"native slots M'={native_slots} must be in [1, M={dense_slots}]")
    if arm.kind == "dasc":
        name = arm_plan_dir(arm, plans, tp).name
    else:
        cands = sorted(p.name for p in Path(plans).glob(f"w*-tp{tp}-*") if (p / "plan.json").is_file())
        if not cands:
            what = "does not exist" if not Path(plans).is_dir() else f"holds no w*-tp{tp}-*/plan.json"
            raise DascInputError(f"{plans}: no compiled plan for TP={tp} to read the dense slot bytes from "
                                 f"({what}; e.g. dasc compile MODEL --wmax 128 --tp {tp} "
                                 f"--out {plans}/{plan_name(128, tp=tp)})")
        name = cands[0]
        # every plan of this TP degree must describe the same model and dense slot, else the
        # Dense / INT8 budget would silently follow whichever plan sorts first
        seen = {}
        for c in cands:
            other = load_plan(Path(plans) / c)
            seen.setdefault((other.fingerprint.config_sha256, other.tp.bytes_dense_per_slot), c)
        if len(seen) > 1:
            raise DascInputError(f"{plans}: TP={tp} plans disagree on the model or dense slot bytes "
                                 f"({', '.join(seen.values())}); keep one model's plans per directory")
    plan_dir = Path(plans) / name
    if not (plan_dir / "plan.json").is_file():
        raise DascInputError(f"{plan_dir}: no plan.json (compile it with {compile_hint(arm, tp, plan_dir)})")
    plan = load_plan(plan_dir)
    b_dense = plan.tp.bytes_dense_per_slot
    budget = (dense_slots + 1) * b_dense
    if arm.kind == "dense":
        return ArmLaunch(arm=arm.name, kind="dense", plan=None,
                         flags=["--max-mamba-cache-size", str(dense_slots)], native_slots=dense_slots,
                         ckpt_slots=0, capacity=dense_slots, budget_bytes=budget, used_bytes=budget,
                         bytes_native_slot=b_dense, bytes_ckpt_slot=0, c_ckpt=1.0)
    if arm.kind == "int8":
        b8 = int8_bytes_per_slot(plan)
        c = (budget - (native_slots + 1) * b_dense) // b8 - 1
        if c < 1:
            raise DascInputError(f"int8 arm: no INT8 slot fits M={dense_slots}, M'={native_slots}")
        used = (native_slots + 1) * b_dense + (c + 1) * b8
        return ArmLaunch(arm=arm.name, kind="int8", plan=None,
                         flags=["--max-mamba-cache-size", str(native_slots), "--enable-int8-mamba-checkpoint",
                                "--int8-mamba-ckpt-size", str(c)],
                         native_slots=native_slots, ckpt_slots=int(c), capacity=int(c),
                         budget_bytes=budget, used_bytes=used, bytes_native_slot=b_dense, bytes_ckpt_slot=b8,
                         c_ckpt=b_dense / b8, int8=True)
    mm = plan_matched_memory(plan, dense_slots=dense_slots, native_slots=native_slots,
                             scratch_slots=scratch_slots)
    kept = sum(p.n_kept for p in plan.tp.payload_contiguous)
    total_units = len(plan.model.recurrent_layer_ids) * plan.model.num_value_heads * plan.tp.units_per_head
    return ArmLaunch(arm=arm.name, kind="dasc", plan=name,
                     flags=["--max-mamba-cache-size", str(mm.native_slots), "--dasc-plan", f"{{plans}}/{name}",
                            "--dasc-pool-slots", str(mm.compressed_slots)],
                     native_slots=mm.native_slots, ckpt_slots=mm.compressed_slots,
                     capacity=mm.native_slots + mm.compressed_slots, budget_bytes=mm.budget_bytes,
                     used_bytes=mm.used_bytes, bytes_native_slot=b_dense,
                     bytes_ckpt_slot=mm.bytes_compressed_slot, c_ckpt=b_dense / mm.bytes_compressed_slot,
                     w_max=arm.w_max, int8=arm.int8, balance=arm.balance, kept_fraction=kept / total_units,
                     env={"DASC_RECLAIM_WAIT": "host"} if arm.reclaim_wait == "host" else {})


def parse_arms(names: Sequence[str]) -> list[ArmSpec]:
    """Arms by name: a DEFAULT_ARMS name, or ``dasc-nr-wW[-int8][-storage][-hostwait]`` for any W
    (ASCII digits; suffixes in any order, each at most once).

    Raises:
        DascInputError: a name of neither form (one line naming it).
    """
    known = {a.name: a for a in DEFAULT_ARMS}
    out = []
    for n in names:
        if n in known:
            out.append(known[n])
            continue
        parts = n.split("-")
        if len(parts) >= 3 and parts[:2] == ["dasc", "nr"] and parts[2].startswith("w") and parts[2][1:].isascii() \
                and parts[2][1:].isdigit():
            rest = parts[3:]
            if set(rest) <= {"int8", "storage", "hostwait"} and len(set(rest)) == len(rest):
                out.append(ArmSpec(n, "dasc", int(parts[2][1:]), int8="int8" in rest,
                                   balance="storage" if "storage" in rest else "off",
                                   reclaim_wait="host" if "hostwait" in rest else "stream"))
                continue
        raise DascInputError(f"arm {n!r}: expected one of {sorted(known)} or "
                             f"dasc-nr-wW[-int8][-storage][-hostwait]")
    return out


def main(argv=None) -> int:
    """CLI (module docstring). Returns 0, or 2 with ``error: ...`` on stderr for bad input (arms, slots,
    plans, an unwritable ``--out``)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=Path, required=True, help="directory of compiled plans (plan_name dirs)")
    ap.add_argument("--dense-slots", type=int, required=True, help="M: the Dense arm's --max-mamba-cache-size")
    ap.add_argument("--native-slots", type=int, required=True, help="M': native slots of the other arms")
    ap.add_argument("--tp", type=int, default=1, help="TP degree P the plans were compiled for (>= 1)")
    ap.add_argument("--arms", nargs="+", default=[a.name for a in DEFAULT_ARMS],
                    help="arm names: dense, int8, or dasc-nr-wW[-int8][-storage][-hostwait] "
                         f"(default: {' '.join(a.name for a in DEFAULT_ARMS)})")
    ap.add_argument("--out", type=Path, default=None, help="write the arms as JSON here")
    a = ap.parse_args(argv)
    try:
        if a.tp < 1:
            raise DascInputError(f"--tp: expected a TP degree >= 1, got {a.tp}")
        specs = parse_arms(a.arms)
        check_plans(specs, a.plans, a.tp)
        if a.out is not None and (a.out.name in ("", ".", "..") or a.out.is_dir()):
            raise DascInputError(f"--out {a.out}: expected a file path for the arms JSON, got a directory")
        arms = [asdict(arm_launch(s, plans=a.plans, dense_slots=a.dense_slots, native_slots=a.native_slots,
                                  tp=a.tp)) for s in specs]
    except DascInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(arms, indent=1)
    if a.out:
        tmp = a.out.with_name(f".{a.out.name}.tmp{os.getpid()}")
        try:
            tmp.write_text(text)
            os.replace(tmp, a.out)
        except OSError as e:
            if tmp.parent.is_dir():
                tmp.unlink(missing_ok=True)
            print(f"error: --out {a.out}: cannot write the arms JSON ({e.strerror or e})", file=sys.stderr)
            return 2
    width = max(len(x["arm"]) for x in arms)
    for x in arms:
        flags = " ".join(f.replace("{plans}", str(a.plans)) for f in x["flags"])
        print(f"{x['arm']:>{width}}: capacity {x['capacity']:4d} (native {x['native_slots']}, "
              f"ckpt {x['ckpt_slots']}), C_ckpt {x['c_ckpt']:.3f}, used {x['used_bytes'] / 2**20:.1f} / "
              f"{x['budget_bytes'] / 2**20:.1f} MiB  {flags}"
              f"{''.join(f' ({k}={v})' for k, v in x['env'].items())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
