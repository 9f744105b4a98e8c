"""The offered load of the one-GPU open-loop run, from the calibrated service time (issue 14).

``benchmarks/run_open_loop.py`` (module docstring, step 3) says what the numbers mean; this module
holds its load flags, their checks and the arithmetic (:func:`plan_load`): rate, think time,
conversations live at t = 0, warm-up, and the measured window that fits the arms in the time left.
Times in seconds, rates in conversations per second.
"""

from __future__ import annotations

import argparse
import math

__all__ = ["DEFAULT_LIVE_PER_RUNNING", "add_load_args", "check_load_args", "plan_load"]

#: conversations waiting between turns per running request when neither flag is given
DEFAULT_LIVE_PER_RUNNING = 8.0


def add_load_args(ap: argparse.ArgumentParser) -> None:
    """The load and window flags of ``run_open_loop.py``."""
    ap.add_argument("--rho", type=float, default=0.7, help="offered running requests / R")
    ap.add_argument("--live-per-running", type=float, default=None,
                    help=f"conversations waiting between turns per running request (default "
                         f"{DEFAULT_LIVE_PER_RUNNING:g})")
    ap.add_argument("--live-waiting", type=float, default=None,
                    help="conversations waiting between turns, directly: live_per_running = N / (rho * R)")
    ap.add_argument("--think-dist", default="exp", help="exp or uniform think times")
    ap.add_argument("--think-spread", type=float, default=0.5)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--min-window-s", type=float, default=8.0)
    ap.add_argument("--max-window-s", type=float, default=20.0)
    ap.add_argument("--arm-overhead-s", type=float, default=4.0, help="flush, process start, result writing")


def check_load_args(a: argparse.Namespace) -> str | None:
    """One line naming a bad load flag, or None. Fills ``a.live_per_running`` with the default
    when neither it nor ``--live-waiting`` is given (giving both is an error: one would be ignored)."""
    if len(a.seeds) < a.windows or a.windows < 1:
        return f"--seeds: expected at least --windows {a.windows} seeds"
    if a.live_waiting is not None and a.live_per_running is not None:
        return ("--live-waiting and --live-per-running: give one (--live-waiting N sets live_per_running = "
                "N / (rho * R))")
    for flag, v in (("--rho", a.rho), ("--live-waiting", a.live_waiting), ("--live-per-running", a.live_per_running)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            return f"{flag}: expected a positive number, got {v}"
    if a.live_waiting is None and a.live_per_running is None:
        a.live_per_running = DEFAULT_LIVE_PER_RUNNING
    return None


def plan_load(a: argparse.Namespace, service_s: float, turns: int, n_convs: int, n_arms: int, left_s: float) -> dict:
    """The schedule parameters from the calibrated service time S (``run_open_loop.py``, step 3).

    ``rate = rho R / (T S)``, ``Z = live_per_running * T S / (T - 1)``, ``initial_live =
    live_per_running * rho R``; ``a.live_waiting`` (or None) sets ``live_per_running =
    live_waiting / (rho R)``, else ``a.live_per_running`` is used. Per arm: a warm-up of ``1.5 Z +
    2 S`` (uniform think times: ``Z (1 + spread) + 2 S``), ``S`` and ``--arm-overhead-s``, then
    ``--windows`` windows of the longest length <= ``--max-window-s`` that fits ``left_s`` and that
    the trace's conversations cover, dropping the last arms while it is < ``--min-window-s``.

    Args:
        service_s: S; turns: T (>= 2); n_convs: conversations in the trace; n_arms: arms to fit;
        left_s: time left to divide among them.
    Returns:
        rate, think_s, initial_live, warmup_s, window_s (0.1 s steps; 0 when not even one arm fits),
        arms (how many fit), service_s, live_per_running, live_waiting (``live_per_running * rho R``),
        per_arm_s (warm-up + S + overhead + windows) and left_s; ``arms * per_arm_s <= left_s``
        whenever window_s > 0.
    """
    running = a.rho * a.max_running_requests
    lpr = a.live_waiting / running if a.live_waiting is not None else a.live_per_running
    rate = running / (turns * service_s)
    think = lpr * turns * service_s / (turns - 1)
    initial = int(round(lpr * running))
    warm = think * (1.5 if a.think_dist == "exp" else 1 + a.think_spread) + 2 * service_s
    per_arm_fixed = warm + service_s + a.arm_overhead_s
    for n in range(n_arms, 0, -1):
        window = (left_s / n - per_arm_fixed) / a.windows
        # the trace holds each conversation once: initial + rate * (warm-up + windows) <= 95 % of it
        window = min(window, a.max_window_s, ((n_convs * 0.95 - initial) / rate - warm) / a.windows)
        if window >= a.min_window_s or n == 1:
            break
    window = max(0.0, math.floor(window * 10) / 10)
    return {"rate": rate, "think_s": think, "initial_live": initial, "warmup_s": warm, "window_s": window, "arms": n,
            "service_s": service_s, "live_per_running": lpr, "live_waiting": lpr * running,
            "per_arm_s": per_arm_fixed + a.windows * window, "left_s": left_s}
