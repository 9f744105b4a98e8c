"""Arms of the matched-memory serving benchmark and their SGLang launch flags (paper §5.3, App. C.1).

The sizing itself (budget ``B = (M + 1) * b_dense``, the ``M' = k * R`` native slots that run
``R = --max-running-requests`` requests under SGLang's ``--mamba-radix-cache-strategy``, the INT8
and dasc pool slots, checkpoint capacity) lives in :mod:`dasc_runtime.sizing`, the same code as
``dasc size``; this module maps benchmark arm names to plans and records what a run needs:

* ``dense`` (``--max-mamba-cache-size M``), ``int8`` (SGLang's ``--enable-int8-mamba-checkpoint
  --int8-mamba-ckpt-size C``);
* ``dasc-nr-wW`` (and ``...-int8``, ``...-storage``): the dasc compressed pool of the plan
  :func:`plan_name` names. A ``-hostwait`` suffix runs the same arm with ``DASC_RECLAIM_WAIT=host``
  in the server's environment (the reclamation walk waits for pending demotions on the host
  instead of ordering the current stream after them), for an A/B of that synchronisation.
  A ``-shadowfirst`` suffix (any dasc arm, nr or wr) runs it with ``DASC_EVICT_SHADOWED_FIRST=1``:
  checkpoints whose descendant on the radix path is cached are evicted before the plain LRU
  (:mod:`dasc_runtime.tier_operations`), for an A/B of that eviction rule against its twin. A dasc arm
  without it runs with ``DASC_EVICT_SHADOWED_FIRST=0``, App. B.2's one LRU, as every dasc arm measured
  before the rule became the runtime's default (session 53) did. A ``-nofork`` suffix (with
  ``-shadowfirst`` only) adds ``DASC_EVICT_FORK_TEST=0``: the same rule without its fork test, the control
  that measures what sparing a shared prefix's checkpoint saves.
* ``dasc-wr-wW`` (and ``...-int8``): dasc-wr (paper §4.2, Eq. 7), a plan compiled with
  ``load_policy: wr`` (plan directory ``wW[-int8]-wr-tp{P}-off``). Its B refresh scratch slots
  (``--dasc-refresh-slots B``, :mod:`dasc_runtime.wr_scratch`) are native slots, charged to the arm
  (``B * b_dense`` fewer bytes for its compressed pool).

Every arm's flags name ``--max-running-requests R`` and ``--mamba-radix-cache-strategy`` explicitly.
Checkpoint capacity (the x axis of the figures): Dense M, INT8 C (SGLang 0.5.17 commits every
cached state into its INT8 pool, ``MambaComponent._commit_int8_checkpoint``), dasc ``M' + C``, with
no request running. ``capacity_under_load`` is what an arm keeps while R requests run: the ``M' = k R``
native slots are theirs, so Dense ``M - k R``, INT8 C, dasc C (the H200 chat runs of 2026-12-01 drew
every dasc hit from the compressed pool).

CPU use (plans are compiled with ``dasc compile``; prints one line per arm, and ``--out`` writes
the arms as JSON for ``run_chat.py``, which reads them back with :func:`benchmarks.arms_json.read_arms`)::

    .venv/bin/python -m benchmarks.serving_arms --plans /tmp/plans --dense-slots 48 --max-running-requests 8
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from dasc_compile.errors import DascInputError
from benchmarks.cli_args import OneLineParser, path_named

__all__ = ["ArmSpec", "ArmLaunch", "DEFAULT_ARMS", "plan_name", "arm_plan_dir", "compile_hint", "check_plans",
           "arm_launch", "main"]

@dataclass(frozen=True)
class ArmSpec:
    """One arm. ``kind``: ``dense`` | ``int8`` (SGLang's INT8 pool) | ``dasc`` (plan with ``w_max``
    and ``int8``); ``balance``: the plan's TP storage mode (``off`` | ``storage``);
    ``reclaim_wait``: the runtime's ``DASC_RECLAIM_WAIT`` (``stream`` | ``host``, dasc arms only);
    ``load_policy``: the plan's ``load_policy``, ``nr`` (zero-fill) or ``wr`` (suffix refresh, dasc
    arms only); ``shadowed_first``: the runtime's ``DASC_EVICT_SHADOWED_FIRST``, 1 or 0 (dasc arms only);
    ``fork_test``: False sets ``DASC_EVICT_FORK_TEST=0`` (with ``shadowed_first`` only).

    Raises:
        DascInputError: a field outside these values, ``w_max`` on a non-dasc arm (or missing on a
            dasc arm), ``host``, ``wr`` or ``shadowed_first`` on a non-dasc arm, ``fork_test`` False without
            ``shadowed_first``.
    """

    name: str
    kind: str
    w_max: Optional[int] = None
    int8: bool = False
    balance: str = "off"
    reclaim_wait: str = "stream"
    load_policy: str = "nr"
    shadowed_first: bool = False
    fork_test: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ("dense", "int8", "dasc"):
            raise DascInputError(f"arm {self.name!r}: kind must be dense, int8 or dasc, got {self.kind!r}")
        if (self.kind == "dasc") != (self.w_max is not None):
            raise DascInputError(f"arm {self.name!r}: w_max is set exactly for dasc arms")
        if self.reclaim_wait not in ("stream", "host") or (self.reclaim_wait == "host" and self.kind != "dasc"):
            raise DascInputError(f"arm {self.name!r}: reclaim_wait must be 'stream', or 'host' on a dasc arm, "
                                 f"got {self.reclaim_wait!r} on a {self.kind} arm")
        if self.load_policy not in ("nr", "wr") or (self.load_policy == "wr" and self.kind != "dasc"):
            raise DascInputError(f"arm {self.name!r}: load_policy must be 'nr', or 'wr' on a dasc arm, "
                                 f"got {self.load_policy!r} on a {self.kind} arm")
        if self.shadowed_first and self.kind != "dasc":
            raise DascInputError(f"arm {self.name!r}: shadowed_first is for dasc arms, not a {self.kind} arm")
        if not self.fork_test and not self.shadowed_first:
            raise DascInputError(f"arm {self.name!r}: the fork test belongs to the shadowed-first rule: -nofork "
                                 f"needs -shadowfirst")


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


def plan_name(w_max: int, int8: bool = False, tp: int = 1, balance: str = "off", load_policy: str = "nr") -> str:
    """Directory name of a compiled plan, e.g. ``w128-int8-tp1-off``; a dasc-wr plan has ``-wr``
    before the TP degree (``w16-wr-tp1-off``), a dasc-nr plan nothing."""
    return f"w{w_max}{'-int8' if int8 else ''}{'-wr' if load_policy == 'wr' else ''}-tp{tp}-{balance}"


def arm_plan_dir(arm: ArmSpec, plans: Path | str, tp: int = 1) -> Path:
    """``plans/<plan_name>`` of a dasc ``arm`` (the folder holding its ``plan.json``)."""
    return Path(plans) / plan_name(arm.w_max, arm.int8, tp, arm.balance, arm.load_policy)


def compile_hint(arm: ArmSpec, tp: int, out: Path | str) -> str:
    """The ``dasc compile`` command line (a string) that writes the plan a dasc ``arm`` needs to
    ``out``: ``--balance storage`` for a storage arm, ``--int8`` for an INT8 arm, ``--load-policy wr`` for a
    dasc-wr arm (the flags README's quick start uses; they set the policy fields of
    :class:`dasc_compile.policy.Policy`).

    Raises:
        DascInputError: ``arm`` is not a dasc arm (Dense and INT8 need no plan of their own).
    """
    if arm.kind != "dasc":
        raise DascInputError(f"arm {arm.name!r}: only dasc arms are compiled from a plan, not {arm.kind!r}")
    extra = (" --balance storage" if arm.balance == "storage" else "") + (" --int8" if arm.int8 else "") + \
        (" --load-policy wr" if arm.load_policy == "wr" else "")
    return f"dasc compile MODEL --wmax {arm.w_max} --tp {tp}{extra} --out {shlex.quote(str(out))}"


def check_plans(arms: Sequence[ArmSpec], plans: Path, tp: int = 1) -> None:
    """Check, before any arm is sized, that every dasc arm's plan ``plans/<plan_name>/plan.json``
    exists.

    Args:
        arms: the arms (Dense and INT8 arms need no plan of their own and are skipped here).
        plans: directory of compiled plans. tp: the TP degree P of the plan names.
    Raises:
        DascInputError: one line naming every missing plan directory (sorted by w_max, INT8,
            balance, load policy), with the compile command of the first.
    """
    gone = [a for _, a in sorted({(a.w_max, a.int8, a.balance, a.load_policy): a for a in arms if a.kind == "dasc"
                                  and not (arm_plan_dir(a, plans, tp) / "plan.json").is_file()}.items())]
    if gone:
        names = ", ".join(arm_plan_dir(a, plans, tp).name for a in gone)
        hint = compile_hint(gone[0], tp, arm_plan_dir(gone[0], plans, tp))
        raise DascInputError(f"{plans}: no plan.json for {names} (compile {'each' if len(gone) > 1 else 'it'}: "
                             f"{hint})")


@dataclass
class ArmLaunch:
    """Launch settings of one arm at the matched budget (bytes per TP rank).

    Attributes:
        flags: extra ``sglang.launch_server`` flags (the plan path is ``{plans}/{plan}``).
        native_slots: ``--max-mamba-cache-size``; ckpt_slots: INT8 or dasc pool slots (usable).
        refresh_slots: dasc-wr's scratch slots B (``--dasc-refresh-slots``; 0 on other arms), inside
            used_bytes.
        env: extra environment variables of the arm's server (``DASC_RECLAIM_WAIT`` for ``-hostwait``,
            ``DASC_EVICT_SHADOWED_FIRST``: 1 for ``-shadowfirst``, else 0, on every dasc arm;
            ``DASC_EVICT_FORK_TEST=0`` for ``-nofork``).
        capacity: checkpoint capacity (slots) with no request running; capacity_under_load: with R
            running (slots), see the module docstring.
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
    capacity_under_load: int
    budget_bytes: int
    used_bytes: int
    bytes_native_slot: int
    bytes_ckpt_slot: int
    c_ckpt: float
    w_max: Optional[int] = None
    int8: bool = False
    balance: str = "off"
    load_policy: str = "nr"
    refresh_slots: int = 0
    kept_fraction: Optional[float] = None
    notes: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


def arm_launch(arm: ArmSpec, *, plans: Path, dense_slots: int, max_running_requests: int,
               strategy: str = "extra_buffer", tp: int = 1, scratch_slots: int = 0,
               refresh_slots: Optional[int] = None) -> ArmLaunch:
    """Matched-memory flags of ``arm`` from :func:`dasc_runtime.sizing.size_arms` (module docstring).

    Args:
        plans: directory holding the compiled plans (:func:`plan_name` sub-directories); every arm
            reads ``b_dense`` from a plan (Dense and INT8 from any plan of that TP degree).
        dense_slots: M; max_running_requests: R (every arm); strategy: SGLang's
            ``--mamba-radix-cache-strategy``; tp: TP degree P.
        scratch_slots: staging charged to dasc, in compressed slots (0 with generated kernels).
        refresh_slots: a dasc-wr arm's B (None: the runtime's default,
            ``dasc_runtime.wr_scratch.DEFAULT_REFRESH_SLOTS``), charged as B native slots.
    Raises:
        DascInputError: no plan for the arm, a plan whose int8 or load_policy is not the arm's,
            M < k R, or no checkpoint slot fits the budget.
    """
    from dasc_compile.schema import load_plan
    from dasc_runtime.sizing import size_arms

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
    if arm.kind == "dasc" and bool(plan.policy.int8) != arm.int8:
        raise DascInputError(f"{plan_dir}: plan has int8={plan.policy.int8}, arm {arm.name!r} needs int8={arm.int8}")
    if arm.kind == "dasc" and plan.policy.load_policy != arm.load_policy:
        raise DascInputError(f"{plan_dir}: plan has load_policy={plan.policy.load_policy}, arm {arm.name!r} needs "
                             f"load_policy={arm.load_policy} ({compile_hint(arm, tp, plan_dir)})")
    which = {"dense": "dense", "int8": "int8"}.get(arm.kind, "dasc-int8" if arm.int8 else "dasc")
    # B is a dasc-wr arm's alone: the runtime refuses --dasc-refresh-slots with a plan that is not wr
    wr_arm = arm.kind == "dasc" and arm.load_policy == "wr"
    sz = size_arms(plan, max_running_requests=max_running_requests, dense_slots=dense_slots, strategy=strategy,
                   arms=[which], plan_path=f"{{plans}}/{name}", scratch_slots=scratch_slots,
                   refresh_slots=refresh_slots if wr_arm else None)[0]
    common = dict(arm=arm.name, kind=arm.kind, flags=list(sz.flags), native_slots=sz.native_slots,
                  ckpt_slots=sz.ckpt_slots, capacity=sz.capacity, capacity_under_load=sz.capacity_under_load,
                  budget_bytes=sz.budget_bytes, used_bytes=sz.used_bytes, bytes_native_slot=sz.bytes_native_slot,
                  bytes_ckpt_slot=sz.bytes_ckpt_slot, c_ckpt=sz.c_ckpt, int8=sz.int8)
    if arm.kind != "dasc":
        return ArmLaunch(plan=None, **common)
    kept = sum(p.n_kept for p in plan.tp.payload_contiguous)
    total_units = len(plan.model.recurrent_layer_ids) * plan.model.num_value_heads * plan.tp.units_per_head
    flags = list(sz.flags)
    n_wr = int(flags[flags.index("--dasc-refresh-slots") + 1]) if "--dasc-refresh-slots" in flags else 0
    env = {"DASC_RECLAIM_WAIT": "host"} if arm.reclaim_wait == "host" else {}
    # set both ways: the runtime's default changed (off, then on), and an arm's name keeps what it measured
    env["DASC_EVICT_SHADOWED_FIRST"] = "1" if arm.shadowed_first else "0"
    if not arm.fork_test:
        env["DASC_EVICT_FORK_TEST"] = "0"
    return ArmLaunch(plan=name, w_max=arm.w_max, balance=arm.balance, kept_fraction=kept / total_units,
                     load_policy=arm.load_policy, refresh_slots=n_wr, env=env, **common)


#: The order of a dasc arm's name suffixes (:func:`parse_arms`).
SUFFIX_ORDER = ("int8", "storage", "hostwait", "shadowfirst", "nofork")


def _arm_name(head: list[str], suffixes: list[str]) -> str:
    """``dasc-nr-wW`` (``head``'s words) and ``suffixes`` in :data:`SUFFIX_ORDER`, joined by ``-``."""
    return "-".join(head + sorted(suffixes, key=SUFFIX_ORDER.index))


def parse_arms(names: Sequence[str]) -> list[ArmSpec]:
    """Arms by name: a DEFAULT_ARMS name, ``dasc-nr-wW[-int8][-storage][-hostwait][-shadowfirst[-nofork]]`` for
    any W (ASCII digits; each suffix at most once, in that order, so that one arm has one name in every table), or
    ``dasc-wr-wW[-int8][-shadowfirst[-nofork]]`` (``-nofork`` only beside ``-shadowfirst``).

    A plain dasc arm (no ``-shadowfirst``) runs App. B.2's single LRU (``DASC_EVICT_SHADOWED_FIRST=0``), although
    the runtime's default is the shadowed-first rule: arm names keep what earlier rows measured.

    Raises:
        DascInputError: a name of neither form (one line naming it); ``-nofork`` without ``-shadowfirst``, or the
            suffixes in another order (naming the name that works); a name given twice.
    """
    known = {a.name: a for a in DEFAULT_ARMS}
    seen: set = set()
    for n in names:
        if n in seen:
            raise DascInputError(f"arm {n!r} is named twice: each arm runs once (one server)")
        seen.add(n)
    out = []
    for n in names:
        if n in known:
            out.append(known[n])
            continue
        parts = n.split("-")
        if len(parts) >= 3 and parts[0] == "dasc" and parts[1] in ("nr", "wr") and parts[2].startswith("w") \
                and parts[2][1:].isascii() and parts[2][1:].isdigit() \
                and parts[2][1:] == str(int(parts[2][1:])):          # w016 is not a second name of w16
            rest = parts[3:]
            allowed = set(SUFFIX_ORDER) - ({"storage", "hostwait"} if parts[1] == "wr" else set())
            if set(rest) <= allowed and len(set(rest)) == len(rest):
                head, one = parts[:3], _arm_name(parts[:3], rest)
                if "nofork" in rest and "shadowfirst" not in rest:
                    fix = _arm_name(head, rest + ["shadowfirst"])
                    raise DascInputError(f"arm {n!r}: -nofork (the fork test's control) needs -shadowfirst: the fork "
                                         f"test belongs to the shadowed-first rule, e.g. {fix}")
                if n != one:
                    raise DascInputError(f"arm {n!r}: the suffixes go in the order "
                                         f"{' '.join('-' + x for x in SUFFIX_ORDER)} (one arm, one name): {one}")
                out.append(ArmSpec(n, "dasc", int(parts[2][1:]), int8="int8" in rest,
                                   balance="storage" if "storage" in rest else "off",
                                   reclaim_wait="host" if "hostwait" in rest else "stream", load_policy=parts[1],
                                   shadowed_first="shadowfirst" in rest, fork_test="nofork" not in rest))
                continue
        raise DascInputError(f"arm {n!r}: expected one of {sorted(known)}, "
                             f"dasc-nr-wW[-int8][-storage][-hostwait][-shadowfirst[-nofork]] or "
                             f"dasc-wr-wW[-int8][-shadowfirst[-nofork]] (-nofork only with -shadowfirst)")
    return out


def main(argv=None) -> int:
    """CLI (module docstring). Returns 0, or 2 with ``error: ...`` on stderr for bad input (arms, slots,
    plans, an unwritable ``--out``)."""
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=Path, required=True, help="directory of compiled plans (plan_name dirs)")
    ap.add_argument("--dense-slots", type=int, required=True, help="M: the Dense arm's --max-mamba-cache-size")
    ap.add_argument("--max-running-requests", type=int, required=True,
                    help="R: every arm runs R requests; the non-Dense arms keep k * R native slots")
    ap.add_argument("--strategy", default="extra_buffer",
                    help="SGLang's --mamba-radix-cache-strategy (extra_buffer | no_buffer; extra_buffer_lazy only "
                         "for Dense and INT8 arms: dasc refuses it)")
    ap.add_argument("--tp", type=int, default=1, help="TP degree P the plans were compiled for (>= 1)")
    ap.add_argument("--arms", nargs="+", default=[a.name for a in DEFAULT_ARMS],
                    help="arm names: dense, int8, dasc-nr-wW[-int8][-storage][-hostwait][-shadowfirst[-nofork]] or "
                         "dasc-wr-wW[-int8][-shadowfirst[-nofork]], suffixes in that order; a dasc arm without "
                         "-shadowfirst runs App. B.2's single LRU (DASC_EVICT_SHADOWED_FIRST=0), not the runtime's "
                         "default shadowed-first rule "
                         f"(default: {' '.join(a.name for a in DEFAULT_ARMS)})")
    ap.add_argument("--refresh-slots", type=int, default=None,
                    help="dasc-wr arms: scratch slots B (--dasc-refresh-slots, charged to the arm; default: the "
                         "runtime's)")
    ap.add_argument("--out", type=path_named("an output path"), default=None, help="write the arms as JSON here")
    a = ap.parse_args(argv)
    try:
        if a.tp < 1:
            raise DascInputError(f"--tp: expected a TP degree >= 1, got {a.tp}")
        if a.refresh_slots is not None and a.refresh_slots < 1:
            raise DascInputError(f"--refresh-slots: expected at least one scratch slot, got {a.refresh_slots}")
        specs = parse_arms(a.arms)
        check_plans(specs, a.plans, a.tp)
        if a.out is not None and (a.out.name in ("", ".", "..") or a.out.is_dir()):
            raise DascInputError(f"--out {a.out}: expected a file path for the arms JSON, got a directory")
        arms = [asdict(arm_launch(s, plans=a.plans, dense_slots=a.dense_slots,
                                  max_running_requests=a.max_running_requests, strategy=a.strategy, tp=a.tp,
                                  refresh_slots=a.refresh_slots))
                for s in specs]
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
        print(f"{x['arm']:>{width}}: capacity {x['capacity']:4d} / {x['capacity_under_load']:4d} under load "
              f"(native {x['native_slots']}, "
              f"ckpt {x['ckpt_slots']}), C_ckpt {x['c_ckpt']:.3f}, used {x['used_bytes'] / 2**20:.1f} / "
              f"{x['budget_bytes'] / 2**20:.1f} MiB  {flags}"
              f"{''.join(f' ({k}={v})' for k, v in x['env'].items())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
