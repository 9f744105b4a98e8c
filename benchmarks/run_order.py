"""Run order of one ``run_chat run`` call (issue 24 item 3): which arm runs which trace seed when, and what
must still fit before a run may start.

* :func:`williams_rows` / :func:`schedule`: each seed runs every arm once, in a row of a Williams design, the
  call opened and closed by the baseline arm on its first seed (the closing run measures the call's drift);
* :func:`runs_to_reserve` / :func:`reserve_s` / :func:`closing_run_due` with :data:`RUN_MARGIN`: a seed starts
  only when its runs and the closing run fit the time left;
* :func:`run_name`: the file stem of one run's result.

Split from ``benchmarks/run_chat.py``, which executes this order against the resident servers.
"""

from __future__ import annotations

from typing import Callable, Sequence

from dasc_compile.errors import DascInputError

__all__ = ["RUN_MARGIN", "closing_run_due", "reserve_s", "run_name", "runs_to_reserve", "schedule", "williams_rows"]


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


#: A run is assumed to take the longest run of the call so far times this (spare time for a slower one).
RUN_MARGIN = 1.15


def closing_run_due(others_ran: int, left_s: float, need_s: float) -> bool:
    """Whether the call's closing baseline run goes ahead: only after at least one run of another arm in this
    call (``others_ran``: without one the closing run brackets nothing, so its ratio to the opening run is no
    drift of a comparison; session 15 spent 128 s on one after no run, session 25 164 s after a seed stopped
    past its opening Dense run) and when the time left (s) covers ``need_s``, the closing run's estimate in
    seconds with its margin (:func:`reserve_s`'s ``run_s`` of the first seed)."""
    return others_ran > 0 and left_s >= need_s


def runs_to_reserve(order: Sequence[tuple[str, int, str]], idx: int) -> int:
    """Runs that must fit in the time left before run ``idx`` of ``order`` (:func:`schedule`) may start.

    They are the runs of ``idx``'s seed from ``idx`` on and the closing baseline run, so a seed is
    started only when all its arms can run: a seed cut after its first arm leaves a run with no pair,
    device time for nothing (session 14's protocol B call ran Dense on seed 3 and then stopped before
    w16). Returns a count of runs (>= 2 for any ``idx`` before the closing run).
    """
    seed = order[idx][1]
    rest = sum(1 for _, s, role in order[idx:-1] if s == seed and role == "arm")
    return rest + 1


def run_name(arm: str, seed: int, replay: str, pad: int, role: str, load: str, call: int) -> str:
    """File stem of one run's result: ``ARM__sSEED__REPLAY__pPAD__LOAD__kCALL[__drift]``.

    ``load`` is ``c<clients>`` (closed loop) or ``r<rate>`` (open loop, conversations/s) and ``call``
    the index of the call in the work folder's manifest.json. Both are in the name because a work
    folder outlives a call on a warm machine: before they were, a closed-loop saturation run of seed 4
    wrote over the open-loop Dense run of seed 4 that an earlier call had left there (session 36).
    """
    return f"{arm}__s{seed}__{replay}__p{pad}__{load}__k{call}" + ("__drift" if role == "drift" else "")


def reserve_s(order: Sequence[tuple[str, int, str]], idx: int, run_s: Callable[[str, int], float]) -> float:
    """Seconds that must be left before run ``idx`` of ``order`` may start: the sum over
    :func:`runs_to_reserve`'s runs (this seed's arms from ``idx`` on, then the closing baseline run of the first
    seed) of ``run_s(arm, seed)``, each run's estimate in seconds, margin included.

    A closed-loop run's estimate is what its arm took in this call (its longest run times :data:`RUN_MARGIN`),
    or the longest run so far for an arm not yet run: session 42 lost dasc-nr w16 from a 16k seed when the
    closing INT8 run (58 s) was reserved at Dense's 124 s. An open-loop run's follows its seed's arrival and
    think-time schedule (:func:`benchmarks.chat_replay.open_loop_span_s`), which differs from seed to seed
    (142-163 s at ρ 0.9).
    """
    seed = order[idx][1]
    runs = [(arm, s) for arm, s, role in order[idx:-1] if s == seed and role == "arm"] + [order[-1][:2]]
    return sum(run_s(arm, s) for arm, s in runs)
