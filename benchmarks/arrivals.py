"""The open loop's schedule (issue 24, protocol B): when conversations start, how long each thinks between turns,
and how long a run of one trace seed is expected to take, all from the seed alone (common random numbers: every
arm replaying a seed sees the same arrivals and pauses). :mod:`benchmarks.chat_replay` runs it; ``run_chat``
reserves time with :func:`open_loop_spans`. Standard library only (the client runs on the GPU machine isolated
from its site packages).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Sequence

from benchmarks.chat_trace import seed_conversations
from benchmarks.trace_file import load_trace


def arrival_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Start times (s from the run's start) of ``n`` sessions arriving as a Poisson process of ``rate`` per s.

    The first session starts at 0. The draw depends on ``seed`` alone, so every arm replaying a trace
    seed sees the same arrivals (common random numbers: the arms' paired difference carries no
    arrival noise). Before session 14 the arrivals and think times shared one generator that the
    sessions' threads drew from in the order they happened to finish, so two arms of one seed got
    different arrivals (seed 1's last start at 60 s under w16, 69 s under Dense).
    """
    rng = random.Random(f"arrivals:{seed}")
    out, t = [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def think_times(seed: int, conv: int, mean_s: float, turns: int = 64) -> list[float]:
    """Think times (s) of conversation ``conv`` after each of its turns, exponential of mean ``mean_s``.

    One generator per (trace seed, conversation), so a session's pauses do not depend on when the
    other sessions' turns end, and are the same in every arm. ``mean_s`` 0 gives zeros.
    """
    if mean_s <= 0:
        return [0.0] * turns
    rng = random.Random(f"think:{seed}:{conv}")
    return [rng.expovariate(1.0 / mean_s) for _ in range(turns)]


#: Seconds per turn that :func:`open_loop_span_s` adds for the server's work: an over-estimate of the runs measured
#: so far (mean request E2E 1.0-1.4 s on the H200 at ρ 0.7-0.9, pad 6,000, clip 256), so that the span it gives
#: was 4-10 % above each run's wall time (11 runs of sessions 18, 20 and 27).
OPEN_LOOP_TURN_S = 3.0


def open_loop_span_s(turns: Sequence[int], convs: Sequence[int], rate: float, seed: int, think_s: float,
                     turn_s: float = OPEN_LOOP_TURN_S) -> float:
    """Expected wall time (s) of an open-loop run (:func:`run_open`) of one trace seed, from its schedule alone.

    Session ``i`` (conversation ``convs[i]``, ``turns[i]`` turns) starts at :func:`arrival_offsets`'s ``i``-th
    time and pauses for its :func:`think_times` between turns; with ``turn_s`` seconds per turn for the server,
    it ends at ``start + its think times + turns x turn_s``, and the run ends with its last session. Arrivals and
    think times depend on the seed alone, so the span is known before the run; only ``turn_s`` is a guess, and
    at light load (protocol B) requests barely queue, so the guess holds.

    Raises:
        ValueError: ``turns`` and ``convs`` of different lengths, or none.
    """
    if len(turns) != len(convs) or not convs:
        raise ValueError(f"one turn count per conversation expected, got {len(turns)} for {len(convs)}")
    starts = arrival_offsets(len(convs), rate, seed)
    return max(t0 + sum(think_times(seed, c, think_s, max(n - 1, 0))) + n * turn_s
               for t0, n, c in zip(starts, turns, convs))


def open_loop_spans(trace: Path, seeds: Sequence[int], per_seed: int, pool_seed: int, rate: float,
                    think_s: float) -> dict[int, float]:
    """``{seed: expected wall time (s)}`` of an open-loop run of each trace seed (:func:`open_loop_span_s` over
    the seed's conversations, :func:`benchmarks.chat_trace.seed_conversations`).

    Raises:
        DascInputError: an unreadable trace, or a seed the trace cannot hold (the message names it).
    """
    _, convs = load_trace(trace)
    out = {}
    for seed in seeds:
        idx = seed_conversations(len(convs), per_seed, seed, pool_seed=pool_seed)
        out[seed] = open_loop_span_s([convs[i].turns for i in idx], idx, rate, seed, think_s)
    return out
