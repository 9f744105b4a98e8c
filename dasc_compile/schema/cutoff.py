"""The cutoff ``policy.w_max`` as a plan records it per layer, and the plan reader's checks of it (§4.1, Eq. 3, Eq. 7).

A unit is global (kept) iff its retention horizon H_s > w_max (§4.1; a horizon equal to w_max is local). Each
:class:`~dasc_compile.schema.plan.LayerPlan` records its horizons' quantiles and histogram, its kept count, the
bounds ``horizon_local_max`` (largest H_s among the omitted units) and ``horizon_global_min`` (smallest among the
kept ones; ``None`` for an empty set, ``inf`` for a unit that never decays), and its refresh window (Eq. 7).
:func:`check_layer_cutoff` checks that they agree with each other and with ``policy.w_max``, so a plan whose w_max
was edited after compiling is refused even with its hash redone (``dasc eval`` additionally recomputes the selection
from the decay tensors). The Eq. 7 windows live here, beside their check; ``dasc_compile.horizons`` and the
compiler import them from this module (the runtime imports only this package, not the compiler).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from dasc_compile.errors import DascInputError
from dasc_compile.schema.plan import LayerPlan, Plan

__all__ = ["check_layer_cutoff", "check_w_max", "kept_bounds", "layer_refresh_window", "next_pow2", "unit_refresh_window"]


def next_pow2(x: float) -> int:
    """2^ceil(log2 x) for x > 0; 0 (and negatives) map to 4, as in Eq. 7's definition."""
    if not x > 0:
        return 4
    if math.isinf(x):
        return 1 << 62
    return 1 << max(0, math.ceil(math.log2(x)))


def unit_refresh_window(h: float, w_max: int) -> int:
    """W_u = clamp(next_pow2(H_s(u)), 4, W_max) (Eq. 7), tokens. Requires w_max >= 4 for the clamp
    to be non-empty; for w_max < 4 the result is w_max (the upper bound wins)."""
    return min(max(next_pow2(h), 4), w_max)


def layer_refresh_window(horizon_local_max: Optional[float], w_max: int) -> int:
    """A layer's ``refresh_window``: max W_u over its omitted units (Eq. 7), 0 when it omits none
    (``horizon_local_max`` None). W_u is monotone in H_s, so the max is the window of the longest local horizon."""
    return 0 if horizon_local_max is None else unit_refresh_window(horizon_local_max, w_max)


def kept_bounds(edges: list[float], counts: list[int], w_max: int) -> tuple[int, int]:
    """The fewest and most units with ``H_s > w_max`` (global units, §4.1) a layer's horizon histogram allows.

    Bin i holds horizons in ``[edges[i], edges[i+1])``, the last ``[edges[-1], inf]``: a bin whose left
    edge exceeds ``w_max`` holds only global units, a bin whose right edge is at most ``w_max`` only local
    ones, and the one bin with ``edges[i] <= w_max < right`` may hold both (a horizon equal to w_max is local),
    so the bounds differ by that bin's count: at w_max 16 the units in [16, 32) are not placed.
    """
    lo = hi = 0
    for i, c in enumerate(counts):
        right = edges[i + 1] if i + 1 < len(edges) else math.inf
        lo += c if edges[i] > w_max else 0
        hi += c if right > w_max else 0
    return lo, hi


def _bin_of(edges: list[float], h: float) -> Optional[int]:
    """Index of the histogram bin holding horizon ``h`` (the bins of :func:`kept_bounds`), or None."""
    for i, left in enumerate(edges):
        right = edges[i + 1] if i + 1 < len(edges) else math.inf
        if left <= h < right or (right == math.inf and h == math.inf):
            return i
    return None


def _refuse(source, field: str, got, want: str, why: str) -> None:
    raise DascInputError(f"{source}: plan field '{field}' = {got!r}, expected {want} ({why}); the plan was edited "
                         f"or corrupted; recompile it")


def check_layer_cutoff(plan: Plan, source: str | Path, f: str, lp: LayerPlan) -> None:
    """Layer ``lp`` (field path ``f``, e.g. ``layers[0]``) agrees with ``policy.w_max`` and with itself.

    In order: ``n_kept`` is a count the horizon histogram allows above w_max (:func:`kept_bounds`; a Random plan
    keeps the same count, §5.2); ``horizon_quantiles`` is ordered; ``horizon_local_max`` is None iff no unit is
    omitted and ``horizon_global_min`` None iff none is kept; each bound lies within the quantiles' min and max
    (equal to max, resp. min, when the other set is empty) and in a histogram bin that holds units;
    ``refresh_window`` is :func:`layer_refresh_window` (Eq. 7). ``policy.w_max`` against every layer's bounds at
    once: :func:`check_w_max`.

    Raises:
        DascInputError: ``<source>: plan field '<path>' = <got>, expected <want> (<why>); ...``.
    """
    w_max, edges, counts = plan.policy.w_max, plan.horizon_bin_edges, lp.horizon_histogram
    lo, hi = kept_bounds(edges, counts, w_max)
    if not lo <= lp.n_kept <= hi:
        _refuse(source, f"{f}.n_kept", lp.n_kept, str(lo) if lo == hi else f"{lo} to {hi}",
                f"the units of its horizon_histogram above policy.w_max = {w_max}, §4.1")
    q = lp.horizon_quantiles
    if not q.min <= q.p10 <= q.p50 <= q.p90 <= q.max:
        raise DascInputError(f"{source}: plan field '{f}.horizon_quantiles' must be ordered min <= p10 <= p50 "
                             f"<= p90 <= max (and not NaN)")
    local, glob = lp.horizon_local_max, lp.horizon_global_min
    bounds = (("horizon_local_max", local, lp.n_kept == lp.n_units, "omitted", q.max),
              ("horizon_global_min", glob, lp.n_kept == 0, "kept", q.min))
    for name, v, empty, what, _ in bounds:
        if (v is None) != empty:
            _refuse(source, f"{f}.{name}", v, "null" if empty else "a horizon in tokens",
                    f"the {'largest' if what == 'omitted' else 'smallest'} horizon of its {what} units, null when "
                    f"there are none: n_kept {lp.n_kept} of n_units {lp.n_units}")
    sole = local is None or glob is None            # one set holds every unit: its bound is an extreme
    for name, v, _, what, other in bounds:
        field = f"{f}.{name}"
        if v is None:
            continue
        if not (v == other if sole else q.min <= v <= q.max):
            _refuse(source, field, v, repr(other) if sole else f"a value in [{q.min!r}, {q.max!r}]",
                    f"horizon_quantiles.{'max' if what == 'omitted' else 'min'}: every unit is {what}" if sole
                    else "between its horizon_quantiles min and max")
        i = _bin_of(edges, v)
        if i is None or counts[i] == 0:
            _refuse(source, field, v, "a horizon in a bin of its horizon_histogram that holds units",
                    "it falls in no bin" if i is None
                    else f"it falls in the bin from {edges[i]!r} tokens, which holds none")
    want = layer_refresh_window(local, w_max)
    if lp.refresh_window != want:
        _refuse(source, f"{f}.refresh_window", lp.refresh_window, repr(want),
                "clamp(next_pow2(horizon_local_max), 4, w_max), 0 when no unit is omitted, Eq. 7")


def check_w_max(plan: Plan, source: str | Path) -> None:
    """``policy.w_max`` of a horizon selection lies between every layer's bounds (§4.1): at least the longest
    omitted horizon of any layer (a horizon equal to w_max is local) and below the shortest kept one. An edit of w_max
    inside one histogram bin breaks this as soon as it crosses a unit's horizon; an edit that crosses none and
    leaves every refresh window (Eq. 7) as recorded selects the same plan and is accepted. A Random plan (§5.2)
    draws its units at random, so its bounds do not order around w_max and only its kept count
    (:func:`check_layer_cutoff`) is checked.

    Raises:
        DascInputError: ``<source>: plan field 'policy.w_max' = W, expected an integer from A to B (...)``: the
            cutoffs that select the recorded units and give the recorded refresh windows, and the layers that bound
            them.
    """
    if plan.policy.random_seed is not None:
        return
    w = plan.policy.w_max
    local = [(lp.horizon_local_max, i) for i, lp in enumerate(plan.layers) if lp.horizon_local_max is not None]
    glob = [(lp.horizon_global_min, i) for i, lp in enumerate(plan.layers) if lp.horizon_global_min is not None]
    lo, lo_i = max(local) if local else (None, None)
    hi, hi_i = min(glob) if glob else (None, None)
    if (lo is None or lo <= w) and (hi is None or w < hi):
        return
    first = 0 if lo is None else (None if math.isinf(lo) else math.ceil(lo))      # w >= lo
    last = math.inf if hi is None or math.isinf(hi) else math.ceil(hi) - 1         # w < hi
    # Eq. 7 as recorded: a window below its unclamped value was clamped to w_max itself; one at it needs w_max >= it
    unclamped = [(lp.refresh_window, unit_refresh_window(lp.horizon_local_max, 1 << 62)) for lp in plan.layers
                 if lp.horizon_local_max is not None and not math.isinf(lp.horizon_local_max)]
    exact = {r for r, e in unclamped if r < e}
    if first is not None:
        first = max([first] + [e for r, e in unclamped if r == e])
        if exact:
            x = exact.pop()
            first, last = (x, x) if not exact and first <= x <= last else (None, None)
    if first is None or first > last:
        want = "no integer: its layers' bounds and refresh windows exclude every cutoff"
    else:
        want = (f"{first}" if first == last else f"an integer from {first} to {last}" if last != math.inf
                else f"an integer of at least {first}")
    bounds = ", ".join(x for x in (lo is not None and f"layers[{lo_i}].horizon_local_max {lo!r} <= w_max",
                                   hi is not None and f"w_max < layers[{hi_i}].horizon_global_min {hi!r}") if x)
    _refuse(source, "policy.w_max", w, want, f"the cutoffs that select its kept units, {bounds}, a horizon equal to "
            f"w_max being local, §4.1, and give its refresh windows, Eq. 7")
