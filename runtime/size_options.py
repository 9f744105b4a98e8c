"""The SGLang options the sizing tools (``dasc size``, ``dasc sweep --budget``, ``python -m dasc_runtime.sizing``)
print for a plan, settled by the server's own rules (:func:`dasc_runtime.serving_rules.serving_refusals`): the fixes
a rule names applied with a note each, anything else refused, so the flags printed start the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

from dasc_compile.schema import DascInputError
from dasc_runtime.serving_rules import (DEFAULT_REFRESH_SLOTS, SMALLEST_AUTO_CHUNK, refresh_active,
                                        served_refresh_slots, serving_refusals)

__all__ = ["SettledOptions", "settle_size_options"]


@dataclass(frozen=True, kw_only=True)
class SettledOptions:
    """The SGLang options ``dasc size`` sizes and prints, after the rules' fixes.

    Attributes:
        overlap_schedule: False when ``--disable-overlap-schedule`` is (or had to be) given.
        extra_flags: flags (with values) added to every arm beyond the strategy and overlap flags,
            because the dasc runtime needs them (``--chunked-prefill-size W``).
        notes: one line per added flag, saying why (printed as ``warning:`` lines).
        refresh_slots: B the server runs with the printed flags (:func:`~dasc_runtime.serving_rules.served_refresh_slots` under the
            chunk size printed or assumed), 0 for a plan that runs no refresh; every arm's flags name it.
    """

    overlap_schedule: bool
    refresh_slots: int = 0
    extra_flags: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def settle_size_options(plan, *, strategy: str, overlap_schedule: bool,
                        refresh_slots: Optional[int] = None) -> SettledOptions:
    """The options ``dasc size`` prints for ``plan``, checked by :func:`~dasc_runtime.serving_rules.serving_refusals` as the server checks
    them: fixes applied (with a note each), anything else refused. A plan compiled for TP > 1 also gets
    ``--tp-size P`` first: the runtime refuses any other attention TP size (``rank_layout.build_rank_layout``).

    The chunk size ``dasc size`` does not print is taken as :data:`~dasc_runtime.serving_rules.SMALLEST_AUTO_CHUNK`, so a dasc-wr
    window longer than that gets ``--chunked-prefill-size W`` (the server refuses it on a GPU where
    SGLang picks a smaller chunk). The served context length is not known before launch
    (``refresh_window_over_context`` is checked at start-up only). A dasc-wr plan's B is capped under
    that chunk as the server caps it (:func:`~dasc_runtime.serving_rules.served_refresh_slots`), with a note when the cap bites.

    Args:
        plan: the loaded plan; strategy: ``--mamba-radix-cache-strategy``; overlap_schedule: whether
            SGLang's overlap scheduler runs (``--disable-overlap-schedule`` absent); refresh_slots: B.
    Returns:
        :class:`SettledOptions`.
    Raises:
        DascInputError: one line naming ``--refresh-slots`` (the sizing tools' flag) when B is given for a plan
            that runs no refresh; else ``the dasc runtime would refuse to start: ...``, for what no flag fixes.
    """
    if refresh_slots is not None and not refresh_active(plan):      # the server's rule, under the tools' flag
        p = plan.policy
        raise DascInputError(
            f"--refresh-slots {refresh_slots}: this plan runs no dasc-wr refresh (load_policy: {p.load_policy}, "
            f"w_replay_cap {plan.refresh.w_replay_cap}), so it has no scratch slots to size; leave --refresh-slots "
            f"out, or size a plan compiled with --load-policy wr that omits units")
    opts = dict(mamba_radix_cache_strategy=strategy, disable_overlap_schedule=not overlap_schedule,
                chunked_prefill_size=SMALLEST_AUTO_CHUNK)      # the ServerArgs fields dasc size prints
    extra, notes = [], []
    for r in serving_refusals(SimpleNamespace(**opts), plan, refresh_slots=refresh_slots):
        if not r.fix:
            continue
        for flag, attr, value in r.fix:
            opts[attr] = value
            if attr != "disable_overlap_schedule":
                extra += [flag] if value is True else [flag, str(value)]
        added = " ".join(f if v is True else f"{f} {v}" for f, _, v in r.fix)
        notes.append(f"added {added} to every arm: the dasc runtime refuses {r.text}")
    left = serving_refusals(SimpleNamespace(**opts), plan, refresh_slots=refresh_slots)
    if left:
        raise DascInputError("the dasc runtime would refuse to start: " + "; ".join(r.text for r in left))
    pol = plan.policy              # the state dtypes the server must run with (verify.check_plan_supported)
    if pol.temporal_dtype != "float32":
        extra += ["--mamba-ssm-dtype", pol.temporal_dtype]
        notes.append(f"added --mamba-ssm-dtype {pol.temporal_dtype} to every arm: the plan stores the temporal state "
                     f"as {pol.temporal_dtype}, and the dasc runtime refuses a server whose SSM state dtype differs")
    if pol.conv_dtype != "bfloat16":
        notes.append(f"start every server with SGLANG_MAMBA_CONV_DTYPE={pol.conv_dtype} in its environment: the plan "
                     f"stores the conv state as {pol.conv_dtype}, SGLang's default is bfloat16 and it has no flag for it")
    b = served_refresh_slots(plan, refresh_slots, opts["chunked_prefill_size"])
    asked = DEFAULT_REFRESH_SLOTS if refresh_slots is None else refresh_slots
    if 0 < b < asked:
        chunk = opts["chunked_prefill_size"]
        where = ("--chunked-prefill-size" if chunk != SMALLEST_AUTO_CHUNK else "the smallest prefill chunk SGLang "
                 "picks by itself,")
        s = "" if b == 1 else "s"
        notes.append(f"dasc-wr (w_max {plan.policy.w_max}) is charged and flagged {b} scratch slot{s}, not {asked}: "
                     f"one scratch pass holds at most one prefill chunk, {b} window{s} of "
                     f"{plan.refresh.w_replay_cap} tokens in {where} {chunk} tokens (the server caps "
                     f"--dasc-refresh-slots the same way)")
    tp = int(plan.tp.tp_size)
    return SettledOptions(overlap_schedule=not opts["disable_overlap_schedule"], refresh_slots=b,
                          extra_flags=(("--tp-size", str(tp)) if tp > 1 else ()) + tuple(extra), notes=tuple(notes))
