"""What budget fits: the refusals of :mod:`dasc_runtime.sizing` when a Dense arm's M (from ``--budget`` or
``--dense-slots``) leaves some pool arm no usable slot, and the hint every such refusal ends with (the
smallest size that fits every arm, or the largest ``--max-running-requests`` any allowed size runs).
Split from ``sizing.py``, which sizes the arms; the rule of what fits is App. C.1's, as there. Also the one
parser of a size in bytes (:func:`parse_bytes`: ``dasc size --budget``, ``dasc compile --pool-budget``, the server's
``--dasc-pool-bytes`` / ``DASC_POOL_BYTES``).
"""

from __future__ import annotations

import re
from typing import Optional

from dasc_compile.schema.units import byte_count, flag_bytes
from dasc_compile.schema import DascInputError, usable_slots

__all__ = ["GIB", "MAX_BUDGET_BYTES", "MAX_SLOTS", "check_pools_fit", "parse_bytes", "smallest_fit"]

GIB = 2 ** 30
#: Largest --dense-slots / --max-running-requests (SGLang sizes its pools with int32 indices).
MAX_SLOTS = 2 ** 31
#: Largest --budget per TP rank, bytes (1 PiB: far above any accelerator's memory).
MAX_BUDGET_BYTES = 2 ** 50

_UNITS = {"": 1, "b": 1, **{p + "b": 10 ** (3 * i) for i, p in enumerate("kmgtp", 1)},
          **{p + "ib": 2 ** (10 * i) for i, p in enumerate("kmgtp", 1)}}


def parse_bytes(text: str, flag: str = "--budget") -> int:
    """``"2147483648"``, ``"1e9"``, ``"2GiB"``, ``"1.5 GB"`` -> bytes (int; KB/MB/GB/TB/PB are powers of 10,
    KiB/MiB/GiB/TiB/PiB of 2; case-insensitive, ``16gb`` is 16 GB, except that a lower-case ``b`` after an upper-case
    prefix, the bit units ``Gb`` / ``Gib``, is refused). The value must be a whole number of bytes (``1.5 GB`` is,
    ``1e-3`` is not).
    ``flag`` names the option in the error (``--budget``, ``--pool-budget``, ``--dasc-pool-bytes``).

    Raises:
        DascInputError: not a positive whole number of bytes, or above 2**50 (one line).
    """
    from decimal import Decimal

    mt = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]{1,3})?)\s*([A-Za-z]*)\s*", str(text))
    unit = mt.group(2).lower() if mt else None
    if mt is None or unit not in _UNITS:
        raise DascInputError(f"{flag}: expected a positive size in bytes, such as 2147483648, 1e9 or 2GiB (units B, "
                             f"KB, MB, GB, TB, PB or KiB, MiB, GiB, TiB, PiB), got {text!r}")
    typed = mt.group(2)
    if len(typed) > 1 and typed.endswith("b") and typed[0].isupper():
        raise DascInputError(f"{flag}: {text!r} reads as {typed[:-1]}bits (a lower-case b); write "
                             f"{mt.group(1)}{typed[:-1]}B for bytes")
    value = Decimal(mt.group(1)) * _UNITS[unit]   # exact: at most 3 exponent digits, no float rounding
    whole = value.to_integral_value(rounding="ROUND_CEILING")
    if value < 1 or whole > MAX_BUDGET_BYTES:     # first: a whole number suggested below must itself be in range
        raise DascInputError(f"{flag}: expected a size >= 1 byte and <= 2**50 bytes (1 PiB), got {text!r}")
    if value != whole:
        raise DascInputError(f"{flag}: {text!r} is {value.normalize():f} bytes, not a whole number; give whole bytes "
                             f"such as {int(whole)}")
    return int(value)


def smallest_fit(m: Optional[int], m_native: int, k: int, r: int, b_dense: int, pools, *, by_budget: bool,
                  given: Optional[int] = None) -> str:
    """The hint of every sizing refusal: the smallest ``--budget`` (or ``--dense-slots``) with which *every* arm runs R
    requests and keeps one usable pool slot, ``M >= M' + max over pools of ceil((2 b + scratch) / b_dense)`` (slot 0
    of a pool is reserved), so following it cannot fail on the next arm. Where that exceeds the tool's own bound
    (2**50 bytes, 2**31 slots) it says to lower ``--max-running-requests`` instead, with the largest R that fits
    Dense's M (``m``, from the ``given`` budget; None: no slot) and the largest any allowed budget fits."""
    extra = max([0] + [-(-(2 * pb + sc) // b_dense) for _, pb, sc in pools])
    m_min = m_native + extra
    if by_budget and (m_min + 1) * b_dense <= MAX_BUDGET_BYTES:
        need = (m_min + 1) * b_dense
        return f"a --budget of at least {flag_bytes(need)} fits every arm"
    if not by_budget and m_min <= MAX_SLOTS:
        return f"--dense-slots {m_min} or more fits every arm"
    m_cap = MAX_BUDGET_BYTES // b_dense - 1 if by_budget else MAX_SLOTS
    bound = "--budget up to 2**50 bytes" if by_budget else "--dense-slots up to 2**31"
    here = ""
    if m is not None and (m - extra) // k >= 1:
        flag = f"--budget {given}" if by_budget else f"--dense-slots {m}"
        here = f" ({(m - extra) // k} with {flag})"
    return (f"no {bound} runs --max-running-requests {r} in every arm: lower --max-running-requests to at most "
            f"{max(0, (m_cap - extra) // k)}{here}")


def check_pools_fit(m: int, m_native: int, k: int, r: int, b_dense: int, pools, *, by_budget: bool,
                     given: Optional[int] = None) -> None:
    """Refuse an M that leaves some pool arm without one usable slot (App. C.1), naming the first such arm and the
    smallest M (or ``--budget``) that fits *every* arm (:func:`smallest_fit`).

    Raises:
        DascInputError: one line, naming ``--budget`` when ``by_budget``, else ``--dense-slots``.
    """
    pools = list(pools)
    short = [(what, b, sc) for what, b, sc in pools if usable_slots(max((m - m_native) * b_dense - sc, 0), b) < 1]
    if not short:
        return
    what, b, scratch = short[0]
    room = (m - m_native) * b_dense
    if room >= scratch:
        left = f"leave {byte_count(room - scratch)} beside the M'={m_native} native slots" + (
            f" and {byte_count(scratch)} of scratch" if scratch else "")
    else:                                                       # never a negative byte count
        left = (f"leave {byte_count(room)} beside the M'={m_native} native slots, {byte_count(scratch - room)} short "
                f"of the {byte_count(scratch)} of scratch alone")
    hint = smallest_fit(m, m_native, k, r, b_dense, pools, by_budget=by_budget, given=given)
    if not hint.startswith("no "):      # a size that fits; else the hint already says to lower R
        # --refresh-slots only where the failing arm charges scratch and B could go lower (B > 1)
        hint += f", or lower --max-running-requests{' or --refresh-slots' if scratch > b_dense else ''}"
    raise DascInputError(f"no {what} checkpoint slot fits: Dense's M={m} slots {left}, one {what} slot needs "
                         f"{byte_count(b)}, plus one reserved slot; {hint}")
