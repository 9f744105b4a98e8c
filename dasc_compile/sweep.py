"""``dasc sweep``: compile a model's plans over a grid of w_max x TP x INT8 in memory, size each at a state
budget, optionally measure each with ``dasc eval``, and pick the largest w_max within a quality budget.

Each row is what ``dasc compile MODEL --wmax W --tp P [--int8]`` followed by ``dasc size PLAN --budget B
--max-running-requests R`` would print, computed by the same functions
(:func:`dasc_compile.compiler.plan_from_source`, :func:`dasc_runtime.sizing.size_arms`), with the
checkpoint read once and each layer's horizons computed once (they depend on a_s and eps only, Eq. 2, 3).
Rendering is :mod:`dasc_compile.sweep_report`; the command is :mod:`dasc_compile.sweep_command`.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from dasc_compile.errors import DascInputError
from dasc_compile.policy import POLICY_FLAGS, Policy, resolve_policy

__all__ = ["QUALITY_METRICS", "SweepGrid", "SweepRow", "SweepResult", "Sizing", "parse_int_list", "plan_name",
           "run_sweep", "evaluate", "recommend", "write_plans"]

#: ``--max-kl`` / ``--max-nll-delta``: the eval metric each bounds.
QUALITY_METRICS = {"kl": "--max-kl", "nll_delta": "--max-nll-delta"}
#: At most this many plans in one sweep (a w_max x TP x INT8 grid), so a typo cannot start hours of work.
MAX_POINTS = 512


#: How a whole number is written on the command line: decimal digits, an optional leading minus (``1_6``, ``+16``,
#: ``16.0``, which Python or pydantic read as 16, are not). Also :mod:`dasc_compile.cli_argv`'s rule.
WHOLE_NUMBER = re.compile(r"-?[0-9]+")
#: The most characters a listed value may have: past any w_max or TP degree, and short of int()'s digit limit.
MAX_LISTED_CHARS = 19


def parse_int_list(text: str, flag: str, *, lo: int = 0) -> tuple[int, ...]:
    """``"4,16,64"`` -> ``(4, 16, 64)``, sorted; spaces around a value are allowed (``"16, 64"``).

    Raises:
        DascInputError: naming ``flag`` and the offending value: not comma-separated whole numbers
            (:data:`WHOLE_NUMBER`, at most :data:`MAX_LISTED_CHARS` characters) >= ``lo``, or a value given twice
            (``16,16``: a typo that would otherwise shrink the grid without a word).
    """
    parts = [p.strip() for p in str(text).split(",")]
    shown = text if len(str(text)) <= 80 else f"{str(text)[:40]}... ({len(str(text))} characters)"  # one short line
    if not str(text).strip():
        raise DascInputError(f"{flag} is empty; expected comma-separated whole numbers such as 4,16,64,128,512")
    for p in parts:
        bad = p if len(p) <= 40 else f"{p[:20]}... ({len(p)} characters)"
        if not WHOLE_NUMBER.fullmatch(p):
            raise DascInputError(f"{flag} {shown}: {bad!r} is not a whole number in decimal digits; expected "
                                 f"comma-separated values such as 4,16,64,128,512")
        if len(p) > MAX_LISTED_CHARS:
            raise DascInputError(f"{flag} {shown}: {bad!r} is too large (more than {MAX_LISTED_CHARS} characters)")
    vals = [int(p, 10) for p in parts]
    if any(v < lo for v in vals):
        raise DascInputError(f"{flag} {shown}: expected whole numbers >= {lo}, got {min(vals)}")
    if len(set(vals)) < len(vals):
        seen, twice = set(), set()
        for v in vals:
            (twice if v in seen else seen).add(v)
        raise DascInputError(f"{flag} {shown}: {', '.join(map(str, sorted(twice)))} given more than once; expected "
                             f"each value once")
    return tuple(sorted(vals))


@dataclass(frozen=True, kw_only=True)
class SweepGrid:
    """What to compile: ``base`` (every policy field but the swept ones) at each w_max x TP x INT8 point."""

    w_max: tuple[int, ...]
    tp: tuple[int, ...]
    int8: tuple[bool, ...]
    base: Policy

    def policies(self) -> list[Policy]:
        """One validated policy per point, TP-major then w_max then INT8 (the table order).

        Raises:
            DascInputError: a point's value out of range, named by its flag (``--wmax -1: ...``).
        """
        n = len(self.w_max) * len(self.tp) * len(self.int8)
        if n > MAX_POINTS:
            raise DascInputError(f"--wmax x --tp x --int8: {n} plans; expected at most {MAX_POINTS} in one sweep")
        fields = self.base.model_dump(exclude_unset=True)
        return [resolve_policy(None, flags=POLICY_FLAGS, **{**fields, "w_max": w, "tp_size": p, "int8": i})
                for p in self.tp for w in self.w_max for i in self.int8]


@dataclass(frozen=True, kw_only=True)
class Sizing:
    """``dasc size``'s inputs: a per-rank state budget in bytes, R, SGLang's strategy and scheduler."""

    budget_bytes: int
    max_running_requests: int
    strategy: str = "extra_buffer"
    overlap_schedule: bool = True
    refresh_slots: Optional[int] = None


@dataclass
class SweepRow:
    """One plan of the sweep.

    Attributes:
        plan: the compiled :class:`~dasc_compile.schema.Plan` (no kernels, no hash: see ``finish_plan``);
        name: its plan directory name (``<model>-w{W}[-tp{P}][-int8].dasc``);
        arm: the dasc arm of ``dasc size`` at the sweep's budget (:class:`~dasc_runtime.sizing.ArmSizing`),
            or None without a budget; warnings: what ``dasc compile`` would warn about this plan.
        quality: ``dasc eval``'s arms for this plan's kept units (same for every TP / INT8 of a w_max), or None.
    """

    plan: Any
    name: str
    arm: Any = None
    warnings: list[str] = field(default_factory=list)
    quality: Optional[dict] = None

    @property
    def key(self) -> tuple[int, int, bool]:
        p = self.plan.policy
        return p.tp_size, p.w_max, bool(p.int8)


@dataclass
class SweepResult:
    """The sweep: rows in table order, the Dense / SGLang INT8 arms per TP (with a budget), notes, and
    the eval and recommendation when asked."""

    model: Path
    source: Any
    grid: SweepGrid
    rows: list[SweepRow]
    sizing: Optional[Sizing] = None
    baselines: dict = field(default_factory=dict)       # tp -> (dense ArmSizing, int8 ArmSizing)
    notes: list[str] = field(default_factory=list)      # flags the runtime needs, added to every arm
    eval_doc: Optional[dict] = None
    quality_budget: Optional[dict] = None                # {"metric", "max", "arm"}
    recommended: Optional[int] = None                    # w_max, or None
    wall_s: float = 0.0


def plan_name(model: Path, policy: Policy) -> str:
    """``<model dir name>-w{W}[-tp{P}][-int8].dasc``: where a swept plan is (or would be) written."""
    from dasc_compile.compiler import default_out_dir

    stem = default_out_dir(model).name.removesuffix(".dasc")
    return (f"{stem}-w{policy.w_max}" + (f"-tp{policy.tp_size}" if policy.tp_size > 1 else "")
            + ("-int8" if policy.int8 else "") + ".dasc")


@contextlib.contextmanager
def _one_thread():
    """torch on one intra-op thread: the tensors here are ~KB, and on a busy machine its thread pool costs
    seconds per plan (a 20-plan sweep took 12 s with the default threads, 1.3 s with one)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def run_sweep(model: Path, grid: SweepGrid, *, config: Optional[Path] = None, sizing: Optional[Sizing] = None,
              plan_dir: Optional[Path] = None) -> SweepResult:
    """Compile every point of ``grid`` in memory and size it (see the module docstring).

    Args:
        model: a .safetensors file, a model directory or an index (as ``dasc compile``).
        config: config.json for a lone .safetensors file.
        sizing: ``dasc size``'s inputs, or None for the compile figures only.
        plan_dir: where the plans will be written (``--out``), for the ``--dasc-plan`` flag of each arm;
            None: the current directory (the path the printed ``dasc compile`` command writes).
    Returns:
        :class:`SweepResult` (no eval yet: :func:`evaluate`).
    Raises:
        DascInputError: any input ``dasc compile`` or ``dasc size`` would refuse, one line, before
            anything is written.
    """
    import time

    from dasc_compile.compiler import plan_from_source, read_decay_source
    from dasc_compile.plan_checks import plan_warnings

    t0 = time.perf_counter()
    policies = grid.policies()                     # bad values before any reading
    with _one_thread():
        source = read_decay_source(model, config=config, family=grid.base.family)
        horizons: dict = {}
        rows = [SweepRow(plan=plan_from_source(source, pol, horizons=horizons), name=plan_name(model, pol))
                for pol in policies]
    result = SweepResult(model=Path(model), source=source, grid=grid, rows=rows, sizing=sizing)
    for row in rows:
        row.warnings = plan_warnings(row.plan)
    if sizing is not None:
        _size_rows(result, plan_dir)
    result.wall_s = time.perf_counter() - t0
    return result


def _size_rows(result: SweepResult, plan_dir: Optional[Path]) -> None:
    """Each row's dasc arm, and per TP the Dense and SGLang INT8 arms, at the sweep's budget (``dasc size``)."""
    from dasc_runtime.size_options import settle_size_options
    from dasc_runtime.sizing import size_arms

    s = result.sizing
    policy = result.rows[0].plan.policy if result.rows else None
    if s.refresh_slots is not None and policy is not None and policy.load_policy != "wr":   # one policy for all rows
        raise DascInputError(f"--refresh-slots {s.refresh_slots}: the swept plans run no dasc-wr refresh (load policy "
                             f"{policy.load_policy}); give --load-policy wr to sweep dasc-wr, or leave --refresh-slots "
                             f"out")
    for row in result.rows:
        p = row.plan.policy
        try:
            settled = settle_size_options(row.plan, strategy=s.strategy, overlap_schedule=s.overlap_schedule,
                                          refresh_slots=s.refresh_slots)
            path = str(plan_dir / row.name) if plan_dir is not None else row.name
            arms = size_arms(row.plan, max_running_requests=s.max_running_requests, budget_bytes=s.budget_bytes,
                             strategy=s.strategy, overlap_schedule=s.overlap_schedule, plan_path=path,
                             arms=("dense", "int8", "dasc-int8" if p.int8 else "dasc"),
                             refresh_slots=s.refresh_slots)
        except DascInputError as e:     # which point of the grid: the message alone names no w_max
            point = f"w_max {p.w_max}" + (f", TP {p.tp_size}" if p.tp_size > 1 else "") + (", INT8" if p.int8 else "")
            raise DascInputError(f"{point} ({row.name}): {e}") from None
        result.notes += [n for n in settled.notes if n not in result.notes]
        result.baselines.setdefault(p.tp_size, (arms[0], arms[1]))
        row.arm = arms[2]


def evaluate(result: SweepResult, **eval_kwargs) -> None:
    """``dasc eval`` of each swept w_max (its kept units: one plan per w_max, since TP and INT8 storage do not
    change which units are kept and ``dasc eval`` does not model INT8), stored on every row of that w_max.

    Args:
        eval_kwargs: :func:`dasc_compile.eval.run.run_eval`'s prompt and protocol options.
    Raises:
        DascInputError: a model ``dasc eval`` cannot run (no weights, an unsupported model type), bad prompts.
        EvalInterrupted: SIGINT / SIGTERM during the prompts (:class:`dasc_compile.eval.run.EvalInterrupted`).
    """
    from dasc_compile.eval.run import run_eval

    first = {}
    for row in result.rows:
        first.setdefault(row.plan.policy.w_max, row)
    _refuse_whole_prefix_replay([first[w].plan for w in sorted(first)], eval_kwargs["prefix_len"])
    labels = [(f"w{w}", first[w].plan) for w in sorted(first)]
    doc = run_eval(result.model, labels, **eval_kwargs)
    by_w = {w: p["arms"] for w, p in zip(sorted(first), doc["plans"])}
    for row in result.rows:
        row.quality = by_w[row.plan.policy.w_max]
    result.eval_doc = doc


def _refuse_whole_prefix_replay(plans: list, prefix_len: int) -> None:
    """Refuse, before the model runs, a dasc-wr sweep whose replay window (Eq. 7, ``min(n_p, W_replay)``) covers the
    whole cached prefix at some w_max: the replay then rebuilds the state exactly, its KL is 0 by construction, and
    ``--max-kl`` would recommend the largest such w_max on no evidence.

    Raises:
        DascInputError: naming ``--prefix-len``, the w_max values affected and their windows.
    """
    from dasc_compile.eval.arms import replays_whole_prefix

    whole = [(p.policy.w_max, p.refresh.w_replay_cap) for p in plans
             if p.policy.load_policy == "wr" and p.refresh.any_local
             and replays_whole_prefix(p.refresh.w_replay_cap, prefix_len)]
    if whole:
        listed = ", ".join(f"w_max {w} (W_replay {cap})" for w, cap in whole)
        raise DascInputError(f"--prefix-len {prefix_len}: dasc-wr replays the whole cached prefix at {listed}, which "
                             f"restores the state exactly and measures nothing; give --prefix-len above "
                             f"{max(cap for _, cap in whole)} tokens, or sweep smaller w_max")


def recommend(result: SweepResult, metric: str, limit: float) -> Optional[int]:
    """The largest swept w_max whose dasc arm, and every smaller swept w_max's, stays within ``limit``.

    The arm is the plans' load policy (``nr``: zero-filled local units, ``wr``: refreshed). Requiring
    every smaller w_max to pass too keeps one lucky measurement from choosing a w_max past a failing
    one (quality need not be monotone in w_max on a few prompts).

    Args:
        metric: ``kl`` (mean KL(dense || arm) per token, nats) or ``nll_delta`` (mean NLL increase, nats).
        limit: the quality budget in the same unit.
    Returns:
        the w_max, or None when the smallest swept w_max already exceeds the budget.
    """
    arm = result.grid.base.load_policy
    result.quality_budget = {"metric": metric, "max": limit, "arm": arm}
    chosen = None
    for w in sorted({r.plan.policy.w_max for r in result.rows}):
        q = next(r.quality for r in result.rows if r.plan.policy.w_max == w)
        value = q[arm][metric]
        if value is None or value > limit:
            break
        chosen = w
    result.recommended = chosen
    return chosen


def write_plans(result: SweepResult, out: Path) -> None:
    """Write every swept plan, as ``dasc compile`` writes it (kernels rendered, content hash), into the new
    or empty directory ``out`` (all of them or none: :func:`dasc_compile.atomic.write_new_dir`)."""
    from dasc_compile.atomic import write_new_dir
    from dasc_compile.compiler import write_plan

    def write(tmp: Path) -> None:
        for row in result.rows:
            write_plan(row.plan, tmp / row.name)

    write_new_dir(out, write)
