"""What a compiled plan's user should know before serving it: the refusal the runtime would make for a reason fixed at
compile time (:func:`check_servable`, raised by ``dasc compile``) and the one-line warnings ``dasc compile``,
``inspect``, ``size`` and ``sweep`` print on stderr (:func:`plan_warnings`). Kept apart from
:mod:`dasc_compile.compiler`, which only wires the compile stages.
"""

from __future__ import annotations

from typing import Optional

from dasc_compile.errors import DascInputError
from dasc_compile.schema import Plan, usable_slots
from dasc_compile.schema.units import byte_count, flag_bytes, smallest_budget

__all__ = ["check_servable", "plan_warnings"]


def check_servable(plan: Plan) -> None:
    """Refuse a plan the runtime would refuse at start-up for a reason fixed at compile time.

    Raises:
        DascInputError: ``pool_budget_bytes`` holds no usable slot of the bottleneck rank
            (``floor(B / bytes_per_slot) - 1 < 1``, App. C.1; SGLang reserves slot 0).
    """
    budget = plan.policy.pool_budget_bytes
    per_slot = plan.tp.bottleneck_bytes_per_slot
    if budget is not None and per_slot > 0 and usable_slots(budget, per_slot) < 1:
        raise DascInputError(
            f"policy field 'pool_budget_bytes' (--pool-budget or the --policy file): {byte_count(budget)} holds no "
            f"usable compressed slot: one slot takes {byte_count(per_slot)} on the bottleneck rank and slot 0 is "
            f"reserved; expected at least {flag_bytes(smallest_budget(per_slot))}")


def plan_warnings(plan: Plan, *, refresh_slots: Optional[int] = None) -> list[str]:
    """Things about a valid plan that its user should know, one line each (printed on stderr by the CLI).
    ``refresh_slots``: the B a ``dasc size --refresh-slots`` run sizes for (None: the default), for the
    ``pool_budget_bytes`` line of a dasc-wr plan.

    Nothing kept (every hit restores a zero temporal state); w_max 0 (everything kept); everything kept at a
    positive w_max (no compression); a balance mode at TP size 1 (it changes
    nothing); plan features this dasc's runtime refuses to serve (hybrid balancing: ``dasc_runtime.verify.
    check_plan_supported``; ``tests/cli/test_user_messages.py`` keeps the two in step).
    """
    out = []
    t, pol = plan.totals, plan.policy
    if t.n_kept == 0 and t.n_units > 0:
        longest = max(lp.horizon_quantiles.max for lp in plan.layers)
        out.append(f"nothing is kept: no unit has a retention horizon above w_max = {pol.w_max} tokens (longest "
                   f"{longest:.4g}); a compressed checkpoint holds only the conv state and every hit restores a zero "
                   f"temporal state")
    how = "INT8 storage alone" if pol.int8 else "no compression"      # what keeping every unit still saves
    if pol.w_max == 0 and t.n_units > 0 and t.n_kept == t.n_units:
        out.append(f"w_max 0 keeps every unit ({how}): every unit with a positive retention horizon is global (kept "
                   f"{t.n_kept:,}/{t.n_units:,}, C_ckpt {t.c_ckpt:.2f}x); give --wmax W > 0 to omit short-horizon units")
    elif pol.w_max == 0 and 0 < t.n_kept and pol.random_seed is None:   # (a Random plan omits random units)
        out.append(f"w_max 0 still omits {t.n_units - t.n_kept:,} of {t.n_units:,} units: their retention horizon is 0 "
                   f"tokens (a static decay so fast it forgets within one token, e.g. from --a-s or --eps; kept "
                   f"{t.n_kept:,}/{t.n_units:,}, C_ckpt {t.c_ckpt:.2f}x)")
    elif pol.w_max > 0 and t.n_units > 0 and t.n_kept == t.n_units:
        shortest = min(lp.horizon_quantiles.min for lp in plan.layers)
        out.append(f"every unit is kept ({how}): no retention "
                   f"horizon is at or below w_max = {pol.w_max} tokens (shortest {shortest:.4g} tokens; --eps and --a-s "
                   f"set how long horizons are), C_ckpt {t.c_ckpt:.2f}x")
    if pol.balance != "off" and pol.tp_size == 1:
        out.append(f"balance '{pol.balance}' changes nothing at TP size 1 (one rank holds every unit); pass --tp P "
                   f"to balance across P ranks")
    if plan.tp.balance == "hybrid":
        out.append("balance 'hybrid': this dasc's SGLang runtime does not permute the loaded weights yet and refuses "
                   "this plan (it serves balance 'off' and 'storage')")
    out += _wr_budget_warning(plan, refresh_slots)
    return out


def _wr_budget_warning(plan: Plan, refresh_slots: Optional[int] = None) -> list[str]:
    """A dasc-wr plan with ``pool_budget_bytes``: the runtime charges its refresh scratch slots, B native slots of
    ``b_dense`` bytes, to that budget before it sizes the pool (``dasc_runtime.wr_scratch.budget_after_scratch``), so
    the usable slots the plan records (budget alone) overstate what a server builds, and a budget under B b_dense is
    refused at start-up. B is the one ``dasc size`` flags (``--dasc-refresh-slots``: the default 8, capped so B
    windows fit the prefill chunk it prints or assumes; ``serving_rules.served_refresh_slots``)."""
    from dasc_compile.console import counted
    from dasc_runtime.serving_rules import SMALLEST_AUTO_CHUNK, refresh_active, served_refresh_slots
    from dasc_runtime.sizing_bytes import pool_arm_bytes

    budget, per_slot = plan.policy.pool_budget_bytes, plan.tp.bottleneck_bytes_per_slot
    if budget is None or per_slot <= 0 or not refresh_active(plan):
        return []
    # the chunk dasc size prints or assumes: SGLang's smallest automatic one, or the window where that is too short
    b = served_refresh_slots(plan, refresh_slots, max(SMALLEST_AUTO_CHUNK, int(plan.refresh.w_replay_cap)))
    _, _, scratch = pool_arm_bytes(plan, "dasc", b_dense=plan.tp.bytes_dense_per_slot, scratch_slots=0,
                                   refresh_slots=b)
    left = usable_slots(max(budget - scratch, 0), per_slot)
    return [f"pool_budget_bytes {budget:,} of a dasc-wr plan: the server first charges its refresh scratch slots to it, "
            f"{counted(b, 'slot')} ({scratch:,} bytes) with the --dasc-refresh-slots {b} dasc size prints, leaving "
            f"{counted(max(left, 0), 'usable compressed slot')}, not the {usable_slots(budget, per_slot):,} recorded"
            + ("; it would refuse to start: raise the budget or lower --dasc-refresh-slots" if left < 1 else "")]
