"""Run order of one ``run_chat run`` call (issue 24 item 3): which arm runs which trace seed when, and what
must still fit before a run may start.

* :func:`williams_rows` / :func:`schedule`: each seed runs every arm once, in a row of a Williams design, the
  call opened and closed by the baseline arm on its first seed (the closing run measures the call's drift);
* :func:`runs_to_reserve` / :func:`reserve_s` / :func:`closing_run_due` with :data:`RUN_MARGIN`, and
  :class:`RunEstimates` (each run's expected seconds, ``--expect-s`` parsed by :func:`parse_expect` and checked
  by :func:`expect_map`): a seed starts only when its runs and the closing run fit the time left;
* :func:`run_name`: the file stem of one run's result.

Split from ``benchmarks/run_chat.py``, which executes this order against the resident servers.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from dasc_compile.errors import DascInputError

__all__ = ["RUN_MARGIN", "RunEstimates", "closing_run_due", "expect_map", "parse_expect", "reserve_s", "reserved_runs",
           "run_name", "runs_to_reserve", "schedule", "williams_rows"]


def williams_rows(n: int) -> list[list[int]]:
    """A Williams design for ``n`` arms: orders (lists of arm indices) in which every arm takes every
    position equally often and every ordered pair of arms (a directly before b) occurs equally often:
    ``n`` orders for even ``n``, ``2n`` (each order and its reverse) for odd ``n``. Row ``r`` is the
    first row ``0, 1, n-1, 2, n-2, ...`` plus ``r`` (mod ``n``)."""
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    rows = [[(x + r) % n for x in first] for r in range(n)]
    return rows if n % 2 == 0 else rows + [row[::-1] for row in rows]


def schedule(arms: Sequence[str], seeds: Sequence[int], *, baseline: str = "dense") -> list[tuple[str, int, str]]:
    """Run order of one call: ``(arm, seed, role)`` with role ``arm`` or ``drift``.

    Trace seed ``s`` runs every arm once, in row ``s mod len(rows)`` of :func:`williams_rows` (the
    same order whichever call runs the seed), so across seeds every arm runs first, middle and last
    equally often and follows every other arm equally often: a run's position or its predecessor (a
    warmer GPU, a cache the last arm left) is spread over the arms instead of always favouring one.
    (Plain rotations, used before 2026-12-02, kept each arm's predecessor fixed: INT8 always ran just
    before w16.) The call's first seed is rotated to start with ``baseline``, and a last ``baseline``
    run on that seed (role ``drift``) closes the call, so the baseline's drift over the call is the
    ratio of its two runs of the first seed.

    Raises:
        DascInputError: ``baseline`` not among ``arms``, an arm or seed named twice, or no seed.
    """
    if baseline not in arms:
        raise DascInputError(f"--arms: the baseline {baseline!r} must be one of the arms, got {list(arms)}")
    if len(set(arms)) != len(arms) or len(set(seeds)) != len(seeds) or not seeds:
        raise DascInputError(f"arms and seeds must be distinct and seeds non-empty, got {list(arms)} / {list(seeds)}")
    rows = williams_rows(len(arms))
    out = []
    for i, s in enumerate(seeds):
        order = [arms[j] for j in rows[s % len(rows)]]
        if i == 0:
            k = order.index(baseline)
            order = order[k:] + order[:k]
        out += [(a, s, "arm") for a in order]
    return out + [(baseline, seeds[0], "drift")]


#: A closed-loop run is reserved at its estimate (:class:`RunEstimates`) times this (spare time for a slower one).
RUN_MARGIN = 1.15


def closing_run_due(others_ran: int, left_s: float, need_s: float) -> bool:
    """Whether the call's closing baseline run goes ahead: only after at least one run of another arm in this
    call (``others_ran``: without one the closing run brackets nothing, so its ratio to the opening run is no
    drift of a comparison; session 15 spent 128 s on one after no run, session 25 164 s after a seed stopped
    past its opening Dense run) and when the time left (s) covers ``need_s``, the closing run's estimate in
    seconds with its margin (:meth:`RunEstimates.run_s` of the baseline on the first seed)."""
    return others_ran > 0 and left_s >= need_s


def reserved_runs(order: Sequence[tuple[str, int, str]], idx: int) -> list[tuple[str, int]]:
    """The runs ``(arm, seed)`` that must fit in the time left before run ``idx`` of ``order`` (:func:`schedule`)
    may start: the runs of ``idx``'s seed from ``idx`` on, then the closing baseline run (on the first seed).

    So a seed is started only when all its arms can run: a seed cut after its first arm leaves a run with no
    pair, device time for nothing (session 14's protocol B call ran Dense on seed 3 and then stopped before w16).
    """
    seed = order[idx][1]
    return [(arm, s) for arm, s, role in order[idx:-1] if s == seed and role == "arm"] + [order[-1][:2]]


def runs_to_reserve(order: Sequence[tuple[str, int, str]], idx: int) -> int:
    """How many runs :func:`reserved_runs` holds (>= 2 for any ``idx`` before the closing run)."""
    return len(reserved_runs(order, idx))


def run_name(arm: str, seed: int, replay: str, pad: int, role: str, load: str, call: int, shared: int = 0) -> str:
    """File stem of one run's result: ``ARM__sSEED__REPLAY__pPAD[shSHARED]__LOAD__kCALL[__drift]`` (``shSHARED``
    only with a shared system prompt of ``shared`` tokens, so earlier names stay as they were).

    ``load`` is ``c<clients>`` (closed loop) or ``r<rate>`` (open loop, conversations/s) and ``call``
    the index of the call in the work folder's manifest.json. Both are in the name because a work
    folder outlives a call on a warm machine: before they were, a closed-loop saturation run of seed 4
    wrote over the open-loop Dense run of seed 4 that an earlier call had left there (session 36).
    """
    return (f"{arm}__s{seed}__{replay}__p{pad}" + (f"sh{shared}" if shared else "") + f"__{load}__k{call}"
            + ("__drift" if role == "drift" else ""))


def reserve_s(order: Sequence[tuple[str, int, str]], idx: int, run_s: Callable[[str, int], float]) -> float:
    """Seconds that must be left before run ``idx`` of ``order`` may start: the sum over :func:`reserved_runs`
    (this seed's arms from ``idx`` on, then the closing baseline run of the first seed) of ``run_s(arm, seed)``,
    each run's estimate in seconds (:meth:`RunEstimates.run_s`)."""
    return sum(run_s(arm, s) for arm, s in reserved_runs(order, idx))


def parse_expect(text: str) -> tuple[str, float]:
    """One ``--expect-s ARM=S``: ``(arm, seconds)``.

    Raises:
        ValueError: not ``ARM=S`` with a non-empty ARM and S a finite number of seconds above 0.
    """
    arm, eq, sec = text.partition("=")
    try:
        val = float(sec) if eq and arm.strip() else math.nan
    except ValueError:
        val = math.nan
    if not (val > 0 and math.isfinite(val)):
        raise ValueError(f"expected ARM=S with S a positive number of seconds, got {text!r}")
    return arm.strip(), val


def expect_map(pairs: Sequence[tuple[str, float]], arms: Sequence[str], *, open_loop: bool) -> dict[str, float]:
    """``--expect-s`` as ``{arm: seconds}``.

    Raises:
        DascInputError: an arm given twice or not among ``arms``, or any value in an open-loop call (its runs are
            expected from their seeds' schedules).
    """
    out: dict[str, float] = {}
    for arm, sec in pairs:
        if open_loop:
            raise DascInputError(f"--expect-s {arm}={sec:g}: only for the closed loop (open-loop runs are expected "
                                 f"from their seeds' arrival and think-time schedules); leave it out with --rate")
        if arm not in arms:
            raise DascInputError(f"--expect-s {arm}={sec:g}: not an arm of this call (the arms: {' '.join(arms)})")
        if arm in out:
            raise DascInputError(f"--expect-s {arm}: given twice ({out[arm]:g} and {sec:g} s); give each arm once")
        out[arm] = sec
    return out


class RunEstimates:
    """What each run of one call is expected to take (s) and what must be left before a run starts.

    Closed loop (``span`` empty), margin :data:`RUN_MARGIN` included unless ``margin=False``: a run of an
    ``(arm, seed)`` already measured in this call (the closing baseline run: its opening run on the first
    seed, the same conversations) is expected to take that again; an arm measured on other seeds its longest
    run; an arm not yet run its ``expect`` (``--expect-s``, e.g. from an earlier call at the same pad), else the
    longest run so far (``first_run_s`` before any). Session 42 lost dasc-nr w16 from a 16k seed when the
    closing INT8 run (58 s) and w16 (55 s) were both reserved at Dense's 124 s.

    Open loop: a seed's runs take its schedule span (``span[seed]``,
    :func:`benchmarks.arrivals.open_loop_span_s`: already an over-estimate, no margin; 142-163 s at ρ 0.9)
    or a longer run of that seed.
    """

    def __init__(self, first_run_s: float, expect: dict[str, float] | None = None,
                 span: dict[int, float] | None = None):
        self.first_run_s, self.expect, self.span = first_run_s, dict(expect or {}), dict(span or {})
        self.walls: dict[tuple[str, int], float] = {}      # (arm, seed) -> its run's wall time in this call (s)
        self.kept: dict[int, dict[str, float]] = {}        # seed -> {arm: plain estimate (s) when the seed started}

    def record(self, arm: str, seed: int, wall_s: float) -> None:
        """A run of ``arm`` on ``seed`` took ``wall_s`` seconds (a seed's opening run is kept: the closing
        baseline run repeats it)."""
        self.walls.setdefault((arm, seed), wall_s)

    def run_s(self, arm: str, seed: int, margin: bool = True) -> float:
        """The expected seconds of one run (see the class)."""
        if seed in self.span:
            return max([self.span[seed], *(w for (_, s), w in self.walls.items() if s == seed)])
        est = self.walls.get((arm, seed))                   # the same run measured (the closing run's opening)
        if est is None:
            est = max((w for (a, _), w in self.walls.items() if a == arm), default=None)   # the arm, other seeds
        if est is None:
            est = self.expect.get(arm, max(self.walls.values(), default=self.first_run_s))
        return est * (RUN_MARGIN if margin else 1.0)

    def need_s(self, order: Sequence[tuple[str, int, str]], idx: int) -> float:
        """Seconds that must be left before run ``idx`` of ``order`` may start.

        Where a seed starts (no run of it measured in this call): :func:`reserve_s`, every reserved run (the
        seed's and the closing run) at its estimate with the margin; the seed's runs' plain estimates are kept.
        Once the seed has begun: only its remaining runs, at those kept estimates without the margin. A begun
        seed is finished whenever its own runs fit, and the closing run then goes ahead only if time is left
        (:func:`closing_run_due`): a pair is worth more than the drift figure. Before, one run a little slower
        than its estimate, or the estimates of arms not yet run rising to it, cut the seed after that run and
        left it unpaired (session 42's review: Dense at exactly its --expect-s raised w16's and INT8's
        estimates from 60 to 124 s and cut the seed).
        """
        seed, own = order[idx][1], reserved_runs(order, idx)[:-1]
        if not any(s == seed for (_, s) in self.walls):
            self.kept[seed] = {arm: self.run_s(arm, seed, margin=False) for arm, _ in own}
            return reserve_s(order, idx, self.run_s)
        kept = self.kept.get(seed, {})
        return sum(kept.get(arm, self.run_s(arm, seed, margin=False)) for arm, _ in own)
