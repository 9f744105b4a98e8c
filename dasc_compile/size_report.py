"""``dasc size PLAN``: the text / JSON report of every serving arm's slots, capacity (with no request running
and under load, :mod:`dasc_runtime.sizing`) and SGLang flags at equal state memory (paper App. C.1). Its ``--budget`` is read by
:func:`dasc_runtime.sizing_fit.parse_bytes`, the parser the server's ``--dasc-pool-bytes`` shares.

The sizing itself is :mod:`dasc_runtime.sizing` (one place), and what the server would refuse is
:func:`dasc_runtime.size_options.settle_size_options` (the function the server's own start-up checks
call); this module only reads the command's inputs and prints what they computed, with the plan's
warnings (:func:`dasc_compile.plan_checks.plan_warnings`) and the flags the rules added.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Optional

from dasc_compile.console import counted
from dasc_compile.schema import DascInputError, load_plan
from dasc_compile.schema.units import fmt_bytes
from dasc_runtime.sizing import (CAPACITY_LEGEND, _check_count, GIB, compressed_bytes_per_slot, size_arms,
                                 slots_per_running_request)
from dasc_runtime.sizing_fit import parse_bytes

__all__ = ["PAIR_FIELDS", "pair_compile_flags", "parse_bytes", "size_command"]


def _times(n: int, dense: int) -> str:
    """``"2.56x Dense"``; Dense keeping no cached state under load has no ratio."""
    return f"{n / dense:.2f}x Dense" if dense else "Dense 0"


def size_command(plan_path: str, *, max_running_requests: Optional[int], dense_slots: Optional[int] = None,
                 budget: Optional[str] = None, strategy: str = "extra_buffer", overlap_schedule: bool = True,
                 pair_plan: Optional[str] = None, as_json: bool = False, refresh_slots: Optional[int] = None,
                 out=None) -> list[str]:
    """``dasc size PLAN``: print every arm's slots, capacity and SGLang flags (module docstring).

    Args:
        plan_path: the plan directory or plan.json; pair_plan: the same selection compiled with the
            other INT8 setting (same model, w_max and kept units), named in that arm's flags.
        max_running_requests, dense_slots, budget (a size string), strategy, overlap_schedule: see
            :func:`size_arms`. as_json: print one JSON document (a list of arms) instead of text.
        refresh_slots: a dasc-wr plan's scratch slots B (``--dasc-refresh-slots``; None: the runtime's
            default), each charged as one dense slot (``B * b_dense`` bytes).
    Returns:
        the warning lines (without ``warning:``) for stderr: flags added because the runtime needs
        them, and what the plan itself warrants (nothing kept, ...).
    Raises:
        DascInputError: a bad plan, a pair plan that differs, sizes that do not fit, or a configuration
            the dasc runtime refuses (B given for a plan that runs no refresh, B < 1,
            ``extra_buffer_lazy``, ``balance: hybrid``, ...), one line.
    """
    from dasc_compile.plan_checks import plan_warnings
    from dasc_compile.provenance import short_line
    from dasc_runtime.size_options import settle_size_options

    out = out or sys.stdout
    budget_bytes = None if budget is None else parse_bytes(budget)      # a bad value is named before what is missing
    if max_running_requests is None:
        raise DascInputError("--max-running-requests R is required: every arm is sized to run R requests")
    plan = load_plan(plan_path)
    slots_per_running_request(strategy)      # an unknown strategy first, then what the runtime serves
    if refresh_slots is not None:     # this command's flag is named, before what the plan or the server takes
        _check_count("--refresh-slots", refresh_slots)
    settled = settle_size_options(plan, strategy=strategy, overlap_schedule=overlap_schedule,
                                  refresh_slots=refresh_slots)
    if pair_plan is not None:
        try:
            other = load_plan(pair_plan)
        except DascInputError as exc:             # name the flag: the path alone reads like the main plan's
            raise DascInputError(f"--pair-plan {exc}") from None
        _check_pair_plan(plan, plan_path, other, pair_plan)
    arms = size_arms(plan, max_running_requests=max_running_requests, dense_slots=dense_slots,
                     budget_bytes=budget_bytes, strategy=strategy,
                     overlap_schedule=overlap_schedule, plan_path=str(plan_path), pair_plan_path=pair_plan,
                     refresh_slots=refresh_slots)
    warnings = list(settled.notes) + plan_warnings(plan, refresh_slots=refresh_slots)
    if as_json:
        out.write(json.dumps([asdict(a) for a in arms], indent=1) + "\n")
        return warnings
    k = slots_per_running_request(strategy, overlap_schedule=settled.overlap_schedule)
    b = arms[0].budget_bytes
    out.write(f"plan {plan_path}: {plan.model.model_type}, w_max {plan.policy.w_max}, TP {plan.tp.tp_size} "
              f"(bytes per TP rank); {short_line(plan.model.provenance)}\n")
    given = (f"budget {budget_bytes:,} B ({fmt_bytes(budget_bytes)}) per rank given; Dense's "
             f"{arms[0].native_slots:,} + 1 native slots x {arms[0].bytes_native_slot:,} B use {b:,} B"
             if budget_bytes is not None else
             f"budget {b:,} B ({fmt_bytes(b)}) per rank = Dense's {arms[0].native_slots:,} + 1 native slots x "
             f"{arms[0].bytes_native_slot:,} B")
    out.write(f"{given}; every arm runs {counted(max_running_requests, 'request')} "
              f"({strategy}{'' if settled.overlap_schedule else ' without the overlap scheduler'}: {k} native slots "
              f"a request, so M' = {k * max_running_requests:,})\n")
    w = max(len(a.arm) for a in arms)
    m = b // arms[0].bytes_native_slot - 1
    m_loaded = max(0, m - k * max_running_requests)     # Dense's cached states while R requests run
    pools = [f"{a.ckpt_slots:,} x {a.bytes_ckpt_slot:,} B" if a.ckpt_slots else "-" for a in arms]
    wp = max(22, *(len(p) for p in pools))                  # columns as wide as the widest row's count
    wc = max(6, *(len(f"{n:,}") for a in arms for n in (a.native_slots, a.capacity, a.capacity_under_load)))
    for a, pool in zip(arms, pools):
        out.write(f"{a.arm:>{w}}: native {a.native_slots:>{wc},}, pool {pool:>{wp}}, capacity {a.capacity:>{wc},} "
                  f"({a.capacity / m:.2f}x Dense), under load {a.capacity_under_load:>{wc},} "
                  f"({_times(a.capacity_under_load, m_loaded)}), C_ckpt {a.c_ckpt:.2f}, "
                  f"used {a.used_bytes / GIB:.3f} GiB\n")
        out.write(f"{'':>{w}}  {' '.join(a.flags)}\n")
    out.write(CAPACITY_LEGEND + "\n")
    if any(a.kind == "dasc" and a.plan is None for a in arms):
        out.write(f"{{plan}}: compile the same model with {pair_compile_flags(plan)} and pass it as --pair-plan "
                  f"to check it\n")
    return warnings


#: What a ``--pair-plan`` must share with the plan besides its model and kept units: the other INT8 arm is served
#: with the same flags (``--dasc-refresh-slots`` for dasc-wr, one TP layout), so its load policy and TP layout match.
PAIR_FIELDS = ("w_max", "load_policy", "tp_size", "balance")


def pair_compile_flags(plan) -> str:
    """The ``dasc compile`` flags that make the pair plan of ``plan`` (the one place they are derived): each
    :data:`PAIR_FIELDS` value that is not the compile default, by its flag (``--wmax 16 --load-policy wr --tp 8
    --balance storage``), then the other INT8 setting."""
    from dasc_compile.policy import POLICY_FLAGS, Policy

    flags = [f"{POLICY_FLAGS[f]} {getattr(plan.policy, f)}" for f in PAIR_FIELDS
             if f == "w_max" or getattr(plan.policy, f) != Policy.model_fields[f].default]
    return " ".join(flags + ["--no-int8" if plan.policy.int8 else "--int8"])


def _check_pair_plan(plan, plan_path: str, other, pair_path: str) -> None:
    """Refuse a ``--pair-plan`` that is not ``plan`` compiled with the other INT8 setting: another model, the same
    INT8 setting, another w_max / load policy / TP layout (each named, before any byte figure), other kept units,
    or other bytes per compressed slot.

    Raises:
        DascInputError: one line naming ``--pair-plan``, the file, what differs and the compile flags that match.
    """
    fix = f"compile the same model with {pair_compile_flags(plan)}"
    if other.fingerprint != plan.fingerprint or bool(other.policy.int8) == bool(plan.policy.int8):
        raise DascInputError(f"--pair-plan {pair_path}: expected the same model, w_max and kept units as "
                             f"{plan_path} with int8={not plan.policy.int8} ({fix})")
    differ = [f"{f} {getattr(other.policy, f)} ({plan_path}: {getattr(plan.policy, f)})" for f in PAIR_FIELDS
              if getattr(other.policy, f) != getattr(plan.policy, f)]
    if differ:
        raise DascInputError(f"--pair-plan {pair_path}: its {', '.join(differ)} differ{'s' if len(differ) == 1 else ''}; "
                             f"{fix}")
    if [lp.kept_units for lp in other.layers] != [lp.kept_units for lp in plan.layers]:
        raise DascInputError(f"--pair-plan {pair_path}: its kept units differ from {plan_path}'s ({fix}, and the "
                             f"same --policy file, --a-s, --eps, --family and --random-seed)")
    if compressed_bytes_per_slot(plan, int8=other.policy.int8) != other.tp.bottleneck_bytes_per_slot:
        raise DascInputError(f"--pair-plan {pair_path}: its bytes per compressed slot differ from the same units "
                             f"of {plan_path} at int8={other.policy.int8}")
