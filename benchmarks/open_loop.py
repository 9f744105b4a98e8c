"""Open-loop multi-turn serving client: Poisson conversation arrivals, think time between turns.

The closed loop of ``serve_bench.py`` keeps C conversations in flight, so TTFT there is mostly the
wait for a running slot. Here (issue 14, "the regime") load is offered the way chat users offer
it: conversations *start* as a Poisson process of rate ``rate`` (conversations/s), and each next
turn of a conversation is sent when the previous reply has arrived (the stream's ``[DONE]``) plus
a think time of mean ``think_s``: exponential (``think_dist="exp"``, the default: a memoryless
user), or uniform on ``think_s * [1 - spread, 1 + spread]``. With a think time much
longer than a turn's service time, live conversations far outnumber running requests, and a
conversation's state checkpoint must survive its think time in the cache to be hit.

Schedule (:func:`build_schedule`, pure and seeded, so every arm gets the same one):

* **Warm-up**, ``[0, warmup_s)``, not measured: ``initial_live`` conversations already live at
  t = 0 (a stationary start: each begins at a random later turn, its first request due after a
  think time drawn as above, within the warm-up; its earlier turns are never sent, so that
  request misses), plus
  Poisson arrivals drawn with ``warmup_seed``.
* **Measured windows** ``i = 0..n-1``, ``[warmup_s + i * window_s, warmup_s + (i+1) * window_s)``:
  Poisson arrivals drawn with ``seeds[i]``; think times of a conversation come from the seed of the
  window it arrived in. A request belongs to the window in which it is *sent*; the windows are the
  seeds of the statistics. They are consecutive slices of one continuous run: each starts from the
  cache the previous one left (not independent repetitions; the notes say so).
* Conversations are taken from the trace in one seeded order (``warmup_seed``), never twice; a
  request due at or after the end of the last window is not sent.

Requests, TTFT / E2E / cached tokens are recorded as in ``serve_bench.py`` (same
``send_generate``); the result adds per-window statistics and the offered load (time-averaged
requests in flight and conversations waiting between turns).

Example (server started with --skip-tokenizer-init --load-format dummy --max-running-requests 8)::

    python3 -m benchmarks.open_loop --trace benchmarks/traces/sharegpt_qwen_n256_d1024_earliest_s0.json.gz \\
        --url http://127.0.0.1:30000 --arm dense --checkpoint-capacity 56 --rate 1.4 --think-s 15 \\
        --warmup-s 25 --window-s 15 --seeds 0 1 2 3 4 --decode-clip 128 --vocab-size 163840 --out out/dense
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence
from urllib.parse import urlsplit

from benchmarks import serve_bench as sb
from benchmarks.build_trace import TurnRequest, load_trace, turn_requests
from dasc_compile.errors import DascInputError

RESULT_FORMAT = "dasc-open-loop-result"
RESULT_VERSION = 1
MIN_DECODE_CLIP = 128


@dataclass(frozen=True)
class OpenLoopParams:
    """The offered load (seconds, conversations/s). See the module docstring."""

    rate: float
    think_s: float
    warmup_s: float
    window_s: float
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    think_spread: float = 0.5
    initial_live: int = 0
    warmup_seed: int = 100
    think_dist: str = "exp"

    def check(self) -> "OpenLoopParams":
        """Raises DascInputError naming the first bad field."""
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise DascInputError(f"--rate: expected conversations per second > 0, got {self.rate}")
        if not self.think_s >= 0:
            raise DascInputError(f"--think-s: expected seconds >= 0, got {self.think_s}")
        if not 0 <= self.think_spread < 1:
            raise DascInputError(f"--think-spread: expected 0 <= spread < 1, got {self.think_spread}")
        if self.think_dist not in ("exp", "uniform"):
            raise DascInputError(f"--think-dist: expected exp or uniform, got {self.think_dist!r}")
        if not (self.warmup_s >= 0 and self.window_s > 0):
            raise DascInputError(f"--warmup-s >= 0 and --window-s > 0 expected, got {self.warmup_s}, {self.window_s}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise DascInputError(f"--seeds: expected distinct seeds, got {list(self.seeds)}")
        if self.initial_live < 0:
            raise DascInputError(f"--initial-live: expected >= 0, got {self.initial_live}")
        return self

    def draw_think(self, rng: random.Random) -> float:
        """One think time (s): exponential of mean ``think_s``, or uniform within the spread."""
        if self.think_dist == "exp":
            return rng.expovariate(1.0 / self.think_s) if self.think_s > 0 else 0.0
        return rng.uniform(self.think_s * (1 - self.think_spread), self.think_s * (1 + self.think_spread))

    @property
    def end_s(self) -> float:
        """End of the last measured window (s); nothing is sent at or after it."""
        return self.warmup_s + len(self.seeds) * self.window_s

    def window_of(self, t: float) -> int:
        """Measured window of a request sent at ``t`` s: -1 in the warm-up, else 0..n-1 (n at or past the end)."""
        if t < self.warmup_s:
            return -1
        return min(int((t - self.warmup_s) // self.window_s), len(self.seeds))


@dataclass(frozen=True)
class ConvPlan:
    """One conversation of the schedule: trace index, due time of its first request (s from the
    start), first turn sent (0, or later for a conversation live at t = 0), the think time before
    each later turn (s, index k = before turn k+1), and the segment whose seed drew it (-1 warm-up)."""

    conv: int
    start_s: float
    first_turn: int
    think_s: tuple[float, ...]
    segment: int


def poisson_arrivals(rate: float, t0: float, t1: float, rng: random.Random) -> list[float]:
    """Arrival times of a Poisson process of ``rate``/s on ``[t0, t1)``: exponential gaps of mean 1/rate."""
    out, t = [], t0
    while True:
        t += rng.expovariate(rate)
        if t >= t1:
            return out
        out.append(t)


def build_schedule(num_convs: int, turns: int, p: OpenLoopParams) -> list[ConvPlan]:
    """The seeded schedule (module docstring), sorted by first due time.

    Args:
        num_convs: conversations in the trace; turns: T, turns per conversation.
    Raises:
        DascInputError: the schedule needs more conversations than the trace holds, or T < 2.
    """
    p.check()
    if turns < 2:
        raise DascInputError(f"trace: expected conversations of >= 2 turns, got {turns}")
    draws: list[tuple[float, int, int, random.Random]] = []        # (start, first turn, segment, rng)
    rng0 = random.Random(p.warmup_seed)
    for _ in range(p.initial_live):
        t = p.draw_think(rng0)
        while p.warmup_s and t >= p.warmup_s:       # first request inside the warm-up
            t = p.draw_think(rng0)
        draws.append((t if p.warmup_s else 0.0, rng0.randrange(1, turns), -1, rng0))
    draws += [(t, 0, -1, rng0) for t in poisson_arrivals(p.rate, 0.0, p.warmup_s, rng0)]
    for i, seed in enumerate(p.seeds):
        rng = random.Random(seed)
        t0 = p.warmup_s + i * p.window_s
        draws += [(t, 0, i, rng) for t in poisson_arrivals(p.rate, t0, t0 + p.window_s, rng)]
    if len(draws) > num_convs:
        raise DascInputError(f"the schedule needs {len(draws)} conversations, the trace holds {num_convs} "
                             f"(lower --rate or the run length, or use a larger trace)")
    order = list(range(num_convs))
    random.Random(p.warmup_seed).shuffle(order)
    plans = [ConvPlan(conv=order[j], start_s=start, first_turn=first, segment=seg,
                      think_s=tuple(p.draw_think(rng) for _ in range(turns - 1)))
             for j, (start, first, seg, rng) in enumerate(draws)]
    return sorted(plans, key=lambda c: (c.start_s, c.conv))


@dataclass(kw_only=True)
class OpenLoopRecord(sb.RequestRecord):
    """A :class:`~benchmarks.serve_bench.RequestRecord` plus its schedule: ``due_s`` (when it was
    due, s), ``think_s`` (the think time before it, 0 for a conversation's first request),
    ``window`` (-1 warm-up, 0..n-1 measured) and ``segment`` (the conversation's segment)."""

    due_s: float = 0.0
    think_s: float = 0.0
    window: int = -1
    segment: int = -1


def run_open_loop(url: str, requests_by_conv: Sequence[Sequence[TurnRequest]], schedule: Sequence[ConvPlan],
                  p: OpenLoopParams, *, source_ids: Sequence[str] | None = None, timeout_s: float = 600.0,
                  progress: bool = False) -> tuple[list[OpenLoopRecord], int, float]:
    """Run the schedule against ``url``: one thread per request; the next turn of a conversation is
    queued, due at its reply's arrival plus its think time, only once that reply has arrived.

    Returns:
        (records sorted by send time, requests not sent because they fell due at or after
        ``p.end_s``, wall seconds).
    """
    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    cv = threading.Condition()
    heap: list[tuple[float, int, ConvPlan, int, float]] = []   # (due, tie, plan, turn, think before)
    tie = itertools.count()
    for c in schedule:
        heapq.heappush(heap, (c.start_s, next(tie), c, c.first_turn, 0.0))
    records: list[OpenLoopRecord] = []
    state = {"in_flight": 0, "dropped": 0}
    t0 = time.perf_counter()

    def send(c: ConvPlan, turn: int, due: float, think: float) -> None:
        sent = time.perf_counter() - t0
        rec = sb.send_generate(host, port, requests_by_conv[c.conv][turn], timeout_s=timeout_s)
        done = time.perf_counter() - t0
        out = OpenLoopRecord(**asdict(rec), due_s=due, think_s=think, window=p.window_of(sent), segment=c.segment)
        out.start_s, out.source_id = sent, (source_ids[c.conv] if source_ids else "")
        with cv:
            records.append(out)
            state["in_flight"] -= 1
            if turn + 1 < len(requests_by_conv[c.conv]):
                gap = c.think_s[turn]
                heapq.heappush(heap, (done + gap, next(tie), c, turn + 1, gap))
            cv.notify_all()
            if progress and len(records) % 50 == 0:
                print(f"  {len(records)} requests, {done:.1f}s", file=sys.stderr, flush=True)

    with cv:
        while heap or state["in_flight"]:
            if not heap:
                cv.wait()
                continue
            due = heap[0][0]
            if due >= p.end_s:
                heapq.heappop(heap)
                state["dropped"] += 1
                continue
            wait = due - (time.perf_counter() - t0)
            if wait > 0:
                cv.wait(timeout=wait)
                continue
            _, _, c, turn, think = heapq.heappop(heap)
            state["in_flight"] += 1
            threading.Thread(target=send, args=(c, turn, due, think), daemon=True).start()
    wall = time.perf_counter() - t0
    records.sort(key=lambda r: (r.start_s, r.conv, r.turn))
    return records, state["dropped"], wall


def turn_order_violations(records: Sequence[OpenLoopRecord], *, tol_s: float = 0.0) -> list[str]:
    """Requests sent before their conversation's previous reply arrived plus its think time (less
    ``tol_s``), or out of turn order: what :func:`run_open_loop` must never produce. Empty when fine."""
    by_conv: dict[int, list[OpenLoopRecord]] = {}
    for r in records:
        by_conv.setdefault(r.conv, []).append(r)
    bad = []
    for conv, rs in by_conv.items():
        rs.sort(key=lambda r: r.start_s)
        for a, b in zip(rs, rs[1:]):
            if b.turn != a.turn + 1:
                bad.append(f"conv {conv}: turn {b.turn} sent after turn {a.turn}")
            elif b.start_s + tol_s < a.start_s + a.e2e_s + b.think_s:
                bad.append(f"conv {conv}: turn {b.turn} sent at {b.start_s:.3f}s, before turn {a.turn}'s reply "
                           f"({a.start_s + a.e2e_s:.3f}s) + think {b.think_s:.3f}s")
    return bad


def load_profile(records: Sequence[OpenLoopRecord], t0: float, t1: float, turns: int | None = None) -> dict:
    """Time averages over ``[t0, t1)``: requests in flight (sent, reply not finished) and
    conversations waiting between turns (reply arrived, next turn not yet sent; with ``turns``, a
    conversation whose last recorded turn is not its final one waits until ``t1``)."""
    span = t1 - t0
    if span <= 0:
        return {"mean_in_flight": math.nan, "mean_waiting_conversations": math.nan}

    def overlap(a: float, b: float) -> float:
        return max(0.0, min(b, t1) - max(a, t0))

    flight = sum(overlap(r.start_s, r.start_s + (r.e2e_s if r.success else 0.0)) for r in records)
    by_conv: dict[int, list[OpenLoopRecord]] = {}
    for r in records:
        by_conv.setdefault(r.conv, []).append(r)
    waiting = 0.0
    for rs in by_conv.values():
        rs.sort(key=lambda r: r.start_s)
        waiting += sum(overlap(a.start_s + a.e2e_s, b.start_s) for a, b in zip(rs, rs[1:]) if a.success)
        last = rs[-1]
        if turns is not None and last.turn < turns - 1 and last.success:
            waiting += overlap(last.start_s + last.e2e_s, t1)
    return {"mean_in_flight": flight / span, "mean_waiting_conversations": waiting / span}


def summarize_open_loop(records: Sequence[OpenLoopRecord], p: OpenLoopParams, *, arm: str,
                        checkpoint_capacity: int | None, wall_s: float, dropped: int,
                        turns: int | None = None) -> dict:
    """Statistics over the measured windows (``serve_bench.summarize``'s keys), one block per window
    (``windows[i]``, with its seed), and the offered load over the measured span."""
    measured = [r for r in records if 0 <= r.window < len(p.seeds)]
    out = sb.summarize(measured, arm=arm, checkpoint_capacity=checkpoint_capacity, wall_s=wall_s)
    out["windows"] = []
    for i, seed in enumerate(p.seeds):
        w = sb.summarize([r for r in measured if r.window == i], arm=arm, checkpoint_capacity=checkpoint_capacity,
                         wall_s=p.window_s)
        w.pop("per_turn")
        out["windows"].append({"window": i, "seed": seed, **w})
    out["load"] = load_profile(records, p.warmup_s, p.end_s, turns)
    out["warmup_requests"] = sum(1 for r in records if r.window < 0)
    out["not_sent"] = dropped
    out["max_lateness_s"] = max((r.start_s - r.due_s for r in records), default=0.0)
    return out


def main(argv: Iterable[str] | None = None) -> int:
    """CLI (module docstring): exit 0, 1 when a request failed, 2 on bad input (one ``error:`` line)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--arm", required=True)
    ap.add_argument("--checkpoint-capacity", type=int, default=None, help="the arm's checkpoint slots (recorded)")
    ap.add_argument("--rate", type=float, required=True, help="conversation arrivals per second (Poisson)")
    ap.add_argument("--think-s", type=float, required=True, help="mean think time between a reply and the next turn")
    ap.add_argument("--think-dist", default="exp", help="exp (default) or uniform")
    ap.add_argument("--think-spread", type=float, default=0.5, help="uniform: think ~ U[(1-s) Z, (1+s) Z]")
    ap.add_argument("--warmup-s", type=float, required=True)
    ap.add_argument("--window-s", type=float, required=True, help="length of each measured window (one per seed)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--initial-live", type=int, default=0, help="conversations live at t=0 (stationary start)")
    ap.add_argument("--warmup-seed", type=int, default=100)
    ap.add_argument("--decode-clip", type=int, default=MIN_DECODE_CLIP, help=f">= {MIN_DECODE_CLIP} tokens")
    ap.add_argument("--vocab-size", type=int, default=None)
    ap.add_argument("--max-running-requests", type=int, default=None, help="recorded")
    ap.add_argument("--no-flush", action="store_true")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--out", required=True, help="output prefix: writes PREFIX.json")
    a = ap.parse_args(argv)
    try:
        if a.decode_clip < MIN_DECODE_CLIP:
            raise DascInputError(f"--decode-clip: replies are clipped at >= {MIN_DECODE_CLIP} tokens, got {a.decode_clip}")
        p = OpenLoopParams(rate=a.rate, think_s=a.think_s, warmup_s=a.warmup_s, window_s=a.window_s,
                           seeds=tuple(a.seeds), think_spread=a.think_spread, initial_live=a.initial_live,
                           warmup_seed=a.warmup_seed, think_dist=a.think_dist).check()
        header, convs = load_trace(a.trace)
        schedule = build_schedule(len(convs), min(c.turns for c in convs), p)
    except DascInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    reqs = [turn_requests(i, c, vocab_size=a.vocab_size, decode_clip=a.decode_clip) for i, c in enumerate(convs)]
    info = sb.server_info(a.url)
    if not a.no_flush:
        try:
            sb._http(a.url, "POST", "/flush_cache")
        except OSError as e:
            print(f"warning: /flush_cache failed: {e}", file=sys.stderr)
    records, dropped, wall = run_open_loop(a.url, reqs, schedule, p, source_ids=[c.source_id for c in convs],
                                           timeout_s=a.timeout, progress=True)
    summary = summarize_open_loop(records, p, arm=a.arm, checkpoint_capacity=a.checkpoint_capacity, wall_s=wall,
                                  dropped=dropped, turns=min(c.turns for c in convs))
    summary["turn_order_violations"] = turn_order_violations(records, tol_s=0.0)[:5]
    config = {"trace": str(a.trace), "trace_params": header.get("params"), "url": a.url, "decode_clip": a.decode_clip,
              "vocab_size": a.vocab_size, "max_running_requests": a.max_running_requests, "params": asdict(p),
              "flushed": not a.no_flush, "server_info": info, "schedule_conversations": len(schedule)}
    result = {"format": RESULT_FORMAT, "version": RESULT_VERSION, "config": config, "summary": summary,
              "requests": [asdict(r) for r in records]}
    out = Path(a.out)
    sb.write_json(out.with_name(out.name + ".json"), result)
    s = summary
    print(f"{a.arm}: {s['requests']} measured requests ({s['warmup_requests']} warm-up, {dropped} not sent), "
          f"mean TTFT {s['ttft_mean_s']:.3f} s, P95 {s['ttft_p95_s']:.3f} s, mean E2E {s['e2e_mean_s']:.3f} s, "
          f"hit rate {s['cache_hit_token_rate']:.3f}, in flight {s['load']['mean_in_flight']:.1f}, "
          f"waiting conversations {s['load']['mean_waiting_conversations']:.1f}")
    failed = [r.error for r in records if not r.success]
    if failed:
        print(f"{len(failed)} requests failed; first: {failed[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
