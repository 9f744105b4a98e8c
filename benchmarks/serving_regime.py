"""Plan a serving run: predict how far mean TTFT falls when turns hit the prefix cache.

A deterministic discrete-event model of the closed-loop trace replay of ``serve_bench.py``:
``C`` client workers take conversations in trace order (or ``serve_bench --seed``'s order) and
send each conversation's T turns one after another, turn k+1 at the instant turn k ends; the
server runs at most ``R`` requests (``--max-running-requests``), admitted FCFS. A request's prompt
has ``prompt_tokens`` tokens of which ``cached_tokens`` hit the prefix cache; it decodes
``d = min(recorded reply, clip)`` tokens. All times in seconds, lengths in tokens.

Service model (``--prefill-model``; all three are cheap, ``interleaved`` is the default):

* ``interleaved`` (default; SGLang 0.5.17 ``managers/scheduler.py`` ``get_next_batch_to_run``,
  ``managers/schedule_policy.py`` ``PrefillAdder``): one GPU alternates between batches. Whenever
  requests wait and fewer than R run, the next forward is a prefill batch ("run prefill first if
  possible"; mixed chunking is off by default): waiting requests join FCFS while slots and the
  ``--chunk-tokens`` budget (``--chunked-prefill-size``, 8192 on an H200) last; the request that
  does not fit is cut to the budget and finishes in later batches, ahead of everyone else. A
  batch of ``n`` uncached tokens takes ``n / prefill_tok_s + prefill_overhead_s`` and pauses all
  decoding. Otherwise the forward is one decode step of ``decode_step_s`` for every running
  request. The prefill batch samples each finished request's first token (its TTFT), so a
  request needs ``d - 1`` decode steps after it; it holds its slot from admission to its last
  token. This is the default because it is what the server does: the slot limit, the single
  prefill stream and the decode pause all come from the scheduler code.
* ``shared``: one FCFS prefill server separate from the slots: a request first takes a slot,
  then waits for the prefill server (``prefill_s`` each), then decodes ``(d - 1) * decode_step_s``
  without being paused by other prefills.
* ``slot``: prefill is part of slot occupancy and slots prefill in parallel: a request holds a
  slot for ``prefill_s + (d - 1) * decode_step_s``. The simplest queue; it ignores prefill
  contention, so it is an optimistic bound for ``interleaved``.

with ``prefill_s = (prompt_tokens - cached_tokens) / prefill_tok_s + prefill_overhead_s``.
TTFT = sent -> first token = wait for a slot + prefill; E2E = TTFT + decode. Attention over the
cached prefix costs nothing (KDA/GDN layers are linear; the few full-attention layers' share is
ignored), the decode step does not depend on the batch size (measured at batch 8: re-measure for
other R), and KV/state memory never blocks admission.

Cache scenarios (``--scenarios``): ``none`` (every request misses), ``all`` (turn k > 0 reuses turn
k-1's whole prompt, floored to the 64-token state checkpoint grid of SGLang's mamba radix cache:
``floor(prev_prompt / 64) * 64``); ``--hit-fraction f`` adds a scenario where each turn k > 0 hits
so with probability f (``random.Random(--hit-seed)``, drawn in trace order); ``--capacity K ...``
adds one ``cap=K`` scenario per K: a finite LRU state-checkpoint cache of K state slots shared with
the running requests decides each hit at admission (``serving_regime_cache.py`` documents the
model, its knobs ``--slots-per-running``, ``--ckpts-per-request``, ``--track-interval``, and its
validation against the H200 arms, ``--validate-capacity``). Several ``--order-seed`` values make
every row the mean over those orders.

Validation against the H200 runs (Kimi-Linear-48B-A3B, dummy weights, SGLang 0.5.17, R = 8,
clip 128, trace ``sharegpt_qwen_n128_d512_s0``; every arm, token hit rates 4-30 %):

  ===========================  ===============  ==============
  run                           mean TTFT (s)    mean E2E (s)
  ===========================  ===============  ==============
  C=24, N=48 (first 48)         2.85 measured    4.15 measured
  C=64, N=64                    8.9 measured     10.1 measured
  ===========================  ===============  ==============

``--validate`` prints the model next to these with the measured rates (prefill 20,000 tokens/s
for one long prompt, decode 11.7 ms/step at batch 8, trace order, cache ``none``; the orders of
``serve_bench --seed`` 0 and 1 move each value by <= 0.13 s):

  ===========  =====================  =====================
  model         C=24 N=48 TTFT / E2E   C=64 N=64 TTFT / E2E
  ===========  =====================  =====================
  interleaved   4.67 / 6.90 s          14.91 / 17.18 s
  shared        3.15 / 4.44 s           9.86 / 11.15 s
  slot          2.77 / 4.07 s           8.85 / 10.15 s
  ===========  =====================  =====================

``slot`` lands within 3 % of both runs; ``interleaved`` over-predicts by 64 % / 68 % (TTFT). The
rates, not the queue, are the likely cause: the measured E2E - TTFT (1.30 s, 1.2 s) is no more
than 111.8 mean decode tokens take at 11.7 ms/step with *no* prefill pause (1.31 s), while
2,856 mean prompt tokens at 20,000 tok/s is 0.14 s of GPU time a request, 78-80 % of the wall
clock at these loads
(``prefill busy / wall`` of the ``slot`` rows), which one GPU cannot overlap with unpaused decode.
So 11.7 ms is a wall-clock step that already includes prefill pauses (SGLang's logged gen
throughput divides by the time between log lines, ``scheduler_components/metrics_reporter.py``),
or batched prefill runs well above 20,000 tok/s, or both. A coarse scan finds ``interleaved``
with pure forward times near 60,000 tok/s and 9.5 ms/step matching both runs (2.69 / 4.05 s,
8.73 / 10.10 s); these are not measured. The arms' spread agrees: from 4 % to 30 % token hits
``slot`` predicts TTFT -3 %, ``interleaved`` at 60,000 / 9.5 ms -6 %, at 20,000 / 11.7 ms -11 %
(measured: barely changed).
Re-measure pure forward times (``python -m sglang.benchmark.one_batch``) before trusting
absolute seconds; the ratios all/none differ less between these calibrations than the seconds.

Columns: ``wait share of TTFT`` = mean(admitted - sent) / mean TTFT (near 1: queue-bound);
``prefill share of slot time`` = sum(first token - admitted) / sum(finish - admitted) (in
``interleaved`` the prefill pauses that stretch other requests' decode count as decode there);
``prefill busy / wall`` = prefill compute seconds / replay wall (above 1 only in ``slot``, where
slots prefill in parallel: a sign that the ``slot`` model asks more of one GPU than it has).

Run (plain python3):
    python3 benchmarks/serving_regime.py --trace benchmarks/traces/sharegpt_qwen_n128_d512_s0.json.gz \\
        --concurrency 24 64 --max-running 8 --clip 16 128 --num-conversations 48 64
    python3 benchmarks/serving_regime.py --concurrency 24 --clip 8 --num-conversations 80 \\
        --order-seed 0 1 2 --capacity 52 62 81 92 114 --validate-capacity
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import math
import random
import sys
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Sequence

_HERE = Path(__file__).resolve().parent
for _p in (str(_HERE.parent), str(_HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)
from build_trace import TraceConversation, load_trace  # noqa: E402
from dasc_compile.errors import DascInputError  # noqa: E402
from serve_bench import percentile  # noqa: E402
from serving_regime_cache import (INT8_POOL_SLOTS, MEASURED_CAPACITY, CacheModel,  # noqa: E402
                                  CheckpointCache)

PREFILL_MODELS = ("interleaved", "shared", "slot")
CHECKPOINT_GRID = 64          # tokens between SGLang mamba state checkpoints (prefix-match grid)
# (label, concurrency, num_conversations, clip, measured mean TTFT s, measured mean E2E s), R = 8
MEASURED = (("C=24 N=48 clip 128", 24, 48, 128, 2.85, 4.15),
            ("C=64 N=64 clip 128", 64, 64, 128, 8.9, 10.1))


@dataclass(frozen=True, kw_only=True)
class ServiceRates:
    """Measured server speeds (seconds, tokens) and the service model (module docstring).

    Attributes:
        prefill_tok_s: prefill throughput in uncached tokens/s.
        decode_step_s: seconds per decode step of the running batch.
        prefill_overhead_s: fixed seconds per prefill (per batch in ``interleaved``).
        chunk_tokens: prefill batch budget in tokens (``--chunked-prefill-size``; interleaved).
        model: one of PREFILL_MODELS.
    """

    prefill_tok_s: float = 20000.0
    decode_step_s: float = 0.0117
    prefill_overhead_s: float = 0.0
    chunk_tokens: int = 8192
    model: str = "interleaved"

    def check(self) -> None:
        """Raises DascInputError naming the first bad field."""
        if not self.prefill_tok_s > 0 or not self.decode_step_s >= 0 or not self.prefill_overhead_s >= 0:
            raise DascInputError("rates: need prefill_tok_s > 0, decode_step_s >= 0, "
                                 f"prefill_overhead_s >= 0, got {self.prefill_tok_s}, "
                                 f"{self.decode_step_s}, {self.prefill_overhead_s}")
        if self.chunk_tokens < 1:
            raise DascInputError(f"rates: chunk_tokens must be >= 1, got {self.chunk_tokens}")
        if self.model not in PREFILL_MODELS:
            raise DascInputError(f"rates: prefill model must be one of {PREFILL_MODELS}, got {self.model!r}")


@dataclass(frozen=True, kw_only=True)
class SimRequest:
    """One turn as the model sees it (tokens): prompt, prefix-cache hit, decode length d >= 1."""

    conv: int
    turn: int
    prompt_tokens: int
    cached_tokens: int
    decode_tokens: int


@dataclass(kw_only=True)
class RequestTiming:
    """Simulated times (s from the start of the replay) of one request.

    sent_s: the client sends it; admitted_s: it takes a slot; first_token_s: its prefill ends
    (first token sampled); finish_s: its last token.
    """

    req: SimRequest
    sent_s: float
    admitted_s: float = math.nan
    first_token_s: float = math.nan
    finish_s: float = math.nan

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.sent_s

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.sent_s

    @property
    def wait_s(self) -> float:
        return self.admitted_s - self.sent_s


@dataclass(frozen=True, kw_only=True)
class SimResult:
    """timings in (conv, turn) order; wall_s: last finish; prefill_busy_s: seconds the prefill
    resource computed (GPU in ``interleaved``, the server in ``shared``, summed over slots in
    ``slot``)."""

    timings: tuple[RequestTiming, ...]
    wall_s: float
    prefill_busy_s: float


def cached_tokens_for(prompt_lens: Sequence[int], hits: Sequence[bool]) -> list[int]:
    """Prefix-cache hit per turn (tokens): turn k > 0 with ``hits[k]`` reuses turn k-1's prompt
    floored to the CHECKPOINT_GRID, ``floor(prompt_lens[k-1] / 64) * 64``, capped at
    ``prompt_lens[k] - 1`` (the server always computes at least one token); otherwise 0."""
    out = [0] * len(prompt_lens)
    for k in range(1, len(prompt_lens)):
        if hits[k]:
            out[k] = min(prompt_lens[k - 1] // CHECKPOINT_GRID * CHECKPOINT_GRID, prompt_lens[k] - 1)
    return out


def build_requests(convs: Sequence[TraceConversation], *, scenario: str, clip: int | None = None,
                   hit_fraction: float = 1.0, hit_seed: int = 0) -> list[list[SimRequest]]:
    """Per conversation, its T requests under a cache ``scenario`` (``none``, ``all``, ``hit``).

    ``hit``: each turn k > 0 hits with probability ``hit_fraction``; the draws run over all of
    ``convs`` in trace order, so the first N conversations draw the same for any N.
    Raises: DascInputError for an unknown scenario, ``clip < 1`` or a fraction outside [0, 1].
    """
    if scenario not in ("none", "all", "hit"):
        raise DascInputError(f"scenario: expected none, all or hit, got {scenario!r}")
    if clip is not None and clip < 1:
        raise DascInputError(f"--clip: expected >= 1 tokens, got {clip}")
    if not 0.0 <= hit_fraction <= 1.0:
        raise DascInputError(f"--hit-fraction: expected a value in [0, 1], got {hit_fraction}")
    rng = random.Random(hit_seed)
    out = []
    for i, c in enumerate(convs):
        lens = [c.prompt_len(k) for k in range(c.turns)]
        draws = [False] + [rng.random() < hit_fraction for _ in range(1, c.turns)]
        hits = {"none": [False] * c.turns, "all": [True] * c.turns, "hit": draws}[scenario]
        cached = cached_tokens_for(lens, hits)
        out.append([SimRequest(conv=i, turn=k, prompt_tokens=lens[k], cached_tokens=cached[k],
                               decode_tokens=min(c.decode_tokens[k], clip or c.decode_tokens[k]))
                    for k in range(c.turns)])
    return out


class _Clients:
    """The closed-loop client of ``serve_bench.run_replay``: C workers, conversations in order."""

    def __init__(self, reqs: Sequence[Sequence[SimRequest]], order: Sequence[int], concurrency: int):
        self.reqs, self.todo, self.c = reqs, deque(order), concurrency
        self.timings: list[RequestTiming] = []

    def _send(self, conv: int, turn: int, t: float) -> RequestTiming:
        tm = RequestTiming(req=self.reqs[conv][turn], sent_s=t)
        self.timings.append(tm)
        return tm

    def start(self) -> list[RequestTiming]:
        return [self._send(self.todo.popleft(), 0, 0.0) for _ in range(min(self.c, len(self.todo)))]

    def after(self, done: RequestTiming) -> RequestTiming | None:
        """The request the finished one's worker sends at ``done.finish_s`` (None: worker stops)."""
        r, t = done.req, done.finish_s
        if r.turn + 1 < len(self.reqs[r.conv]):
            return self._send(r.conv, r.turn + 1, t)
        return self._send(self.todo.popleft(), 0, t) if self.todo else None


def _prefill_s(r: SimRequest, rates: ServiceRates) -> float:
    return (r.prompt_tokens - r.cached_tokens) / rates.prefill_tok_s + rates.prefill_overhead_s


def _admit(tm: RequestTiming, t: float, cache: CheckpointCache | None) -> None:
    """``tm`` takes a running slot at ``t``; with a ``cache``, a checkpoint miss zeroes its hit."""
    tm.admitted_s = t
    if cache is not None and not cache.admit(tm.req):
        tm.req = replace(tm.req, cached_tokens=0)


def _run_queue(clients: _Clients, max_running: int, rates: ServiceRates,
               cache: CheckpointCache | None) -> float:
    """``slot`` / ``shared`` models: R slots, FCFS; returns prefill busy seconds."""
    waiting = deque(clients.start())
    free, heap, seq, busy, prefill_free = max_running, [], itertools.count(), 0.0, 0.0
    def admit(t: float) -> None:
        nonlocal free, busy, prefill_free
        while free and waiting:
            tm = waiting.popleft()
            free -= 1
            _admit(tm, t, cache)
            p = _prefill_s(tm.req, rates)
            start = max(t, prefill_free) if rates.model == "shared" else t
            tm.first_token_s = start + p
            if rates.model == "shared":
                prefill_free = tm.first_token_s
            busy += p
            tm.finish_s = tm.first_token_s + (tm.req.decode_tokens - 1) * rates.decode_step_s
            heapq.heappush(heap, (tm.finish_s, next(seq), tm))

    admit(0.0)
    while heap:
        t, _, tm = heapq.heappop(heap)
        free += 1
        if cache is not None:
            cache.finish(tm.req)
        nxt = clients.after(tm)
        if nxt is not None:
            waiting.append(nxt)
        admit(t)
    return busy


def _run_interleaved(clients: _Clients, max_running: int, rates: ServiceRates,
                     cache: CheckpointCache | None) -> float:
    """``interleaved`` model (SGLang's scheduler loop); returns GPU seconds spent in prefill."""
    waiting = deque(clients.start())
    running: list[list] = []           # [timing, decode steps left], admission order
    chunked: list | None = None        # [timing, prefill tokens left] of the request cut by the budget
    t, busy = 0.0, 0.0

    def finished(tms: list[RequestTiming]) -> None:
        for tm in tms:
            if cache is not None:
                cache.finish(tm.req)
            nxt = clients.after(tm)
            if nxt is not None:
                waiting.append(nxt)

    while waiting or running or chunked:
        if chunked is not None or (waiting and len(running) < max_running):
            budget, tokens, batch = rates.chunk_tokens, 0, []
            if chunked is not None:
                take = min(chunked[1], budget)
                chunked[1] -= take
                budget, tokens = budget - take, take
                batch.append(chunked)
                chunked = None if chunked[1] == 0 else chunked
            while (chunked is None and waiting and budget > 0
                   and len(running) + len(batch) < max_running):
                tm = waiting.popleft()
                _admit(tm, t, cache)
                need = tm.req.prompt_tokens - tm.req.cached_tokens
                take = min(need, budget)
                budget, tokens = budget - take, tokens + take
                item = [tm, need - take]
                batch.append(item)
                if item[1]:
                    chunked = item
            dt = tokens / rates.prefill_tok_s + rates.prefill_overhead_s
            t, busy = t + dt, busy + dt
            done = []
            for tm, left in batch:
                if left:
                    continue
                tm.first_token_s = t
                if tm.req.decode_tokens > 1:
                    running.append([tm, tm.req.decode_tokens - 1])
                else:
                    tm.finish_s = t
                    done.append(tm)
            finished(done)
        elif running:
            k = min(steps for _, steps in running)      # no arrival before the next finish
            t += k * rates.decode_step_s
            done = []
            for item in running:
                item[1] -= k
                if item[1] == 0:
                    item[0].finish_s = t
                    done.append(item[0])
            running = [item for item in running if item[1]]
            finished(done)
    return busy


def simulate(reqs: Sequence[Sequence[SimRequest]], *, concurrency: int, max_running: int,
             rates: ServiceRates, order: Sequence[int] | None = None,
             cache: CheckpointCache | None = None) -> SimResult:
    """Replay ``reqs`` (per conversation, turns in order) through the service model of ``rates``.

    Args:
        order: the order in which workers take conversations (default: trace order).
        cache: a fresh finite checkpoint cache (``serving_regime_cache.py``) built for
            ``max_running``; each request's ``cached_tokens`` is then what it reuses on a hit
            (build ``reqs`` with scenario ``all``) and a miss at admission replaces it with 0 in
            the returned timing's ``req``. None: ``cached_tokens`` are taken as given.
    Raises: DascInputError for ``concurrency`` or ``max_running`` < 1 or bad rates.
    """
    rates.check()
    if concurrency < 1 or max_running < 1:
        raise DascInputError(f"simulate: concurrency and max_running must be >= 1, "
                             f"got {concurrency} and {max_running}")
    clients = _Clients(reqs, list(range(len(reqs))) if order is None else order, concurrency)
    run = _run_interleaved if rates.model == "interleaved" else _run_queue
    busy = run(clients, max_running, rates, cache)
    tms = sorted(clients.timings, key=lambda tm: (tm.req.conv, tm.req.turn))
    return SimResult(timings=tuple(tms), wall_s=max((tm.finish_s for tm in tms), default=0.0),
                     prefill_busy_s=busy)


def summarize(res: SimResult) -> dict:
    """Means/P95s (s), wait share of TTFT, prefill share of slot time (admission -> first token
    over admission -> finish, summed), prefill busy share of wall, token hit rate."""
    tms = res.timings
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    ttft, e2e = [tm.ttft_s for tm in tms], [tm.e2e_s for tm in tms]
    slot = sum(tm.finish_s - tm.admitted_s for tm in tms)
    return {"requests": len(tms), "ttft_mean_s": mean(ttft), "ttft_p95_s": percentile(ttft, 95),
            "e2e_mean_s": mean(e2e), "e2e_p95_s": percentile(e2e, 95),
            "wait_share": mean([tm.wait_s for tm in tms]) / mean(ttft),
            "prefill_slot_share": sum(tm.first_token_s - tm.admitted_s for tm in tms) / slot,
            "prefill_busy_share": res.prefill_busy_s / res.wall_s, "wall_s": res.wall_s,
            "hit_rate": (sum(tm.req.cached_tokens for tm in tms)
                         / sum(tm.req.prompt_tokens for tm in tms))}


TABLE_HEAD = ("| C | R | clip | N | cache | hit tok rate | mean TTFT (s) | P95 TTFT (s) | mean E2E (s) "
              "| P95 E2E (s) | TTFT vs none | wait share of TTFT | prefill share of slot time "
              "| prefill busy / wall | wall (s) |\n"
              "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def table_row(setting: tuple, scenario: str, s: dict, none: dict) -> str:
    """One Markdown row of TABLE_HEAD; ``none`` is the same setting's ``none`` summary."""
    c, r, clip, n = setting
    return (f"| {c} | {r} | {clip or '-'} | {n} | {scenario} | {s['hit_rate']:.3f} "
            f"| {s['ttft_mean_s']:.3f} | {s['ttft_p95_s']:.3f} | {s['e2e_mean_s']:.3f} "
            f"| {s['e2e_p95_s']:.3f} | {s['ttft_mean_s'] / none['ttft_mean_s']:.3f} "
            f"| {s['wait_share']:.2f} | {s['prefill_slot_share']:.2f} "
            f"| {s['prefill_busy_share']:.2f} | {s['wall_s']:.1f} |")


def run_setting(convs: Sequence[TraceConversation], *, concurrency: int, max_running: int,
                clip: int | None, rates: ServiceRates, scenarios: Sequence[str],
                hit_fraction: float | None = None, hit_seed: int = 0,
                order_seed: int | None = None, capacities: Sequence[int] = (),
                cache_model: CacheModel = CacheModel()) -> dict[str, dict]:
    """:func:`summarize` per scenario (``none`` always first) for one grid point; ``convs`` are
    the N conversations replayed; ``order_seed`` permutes them as ``serve_bench --seed`` does.

    Each K of ``capacities`` adds scenario ``cap=K``: a :class:`CheckpointCache` of K state slots
    (knobs from ``cache_model``) decides every hit; its summary also has ``ckpt_lookups``,
    ``ckpt_hits`` and ``evictions`` (counts).
    Raises: DascInputError from :func:`build_requests`, :func:`simulate` or the cache (a K below
    ``slots_per_running * max_running`` names ``--capacity``).
    """
    order = list(range(len(convs)))
    if order_seed is not None:
        random.Random(order_seed).shuffle(order)
    names = ["none"] + [s for s in scenarios if s != "none"]
    if hit_fraction is not None:
        names.append(f"hit={hit_fraction:g}")
    caches = {f"cap={k}": cache_model.cache(k, max_running) for k in capacities}
    out = {}
    for name in names + list(caches):
        scenario = "hit" if name.startswith("hit=") else "all" if name in caches else name
        reqs = build_requests(convs, scenario=scenario, clip=clip,
                              hit_fraction=hit_fraction if hit_fraction is not None else 1.0,
                              hit_seed=hit_seed)
        cache = caches.get(name)
        out[name] = summarize(simulate(reqs, concurrency=concurrency, max_running=max_running,
                                       rates=rates, order=order, cache=cache))
        if cache is not None:
            out[name].update(ckpt_lookups=cache.stats.lookups, ckpt_hits=cache.stats.hits,
                             evictions=cache.stats.evictions)
    return out


def validation_report(convs: Sequence[TraceConversation], rates: ServiceRates,
                      order_seed: int | None = None) -> str:
    """Markdown: MEASURED runs (R = 8) next to every prefill model's ``none`` prediction."""
    lines = ["| run | model | mean TTFT (s) model / measured | mean E2E (s) model / measured "
             "| E2E - TTFT (s) model / measured |", "|---|---|---:|---:|---:|"]
    for label, c, n, clip, m_ttft, m_e2e in MEASURED:
        for model in PREFILL_MODELS:
            r = ServiceRates(prefill_tok_s=rates.prefill_tok_s, decode_step_s=rates.decode_step_s,
                             prefill_overhead_s=rates.prefill_overhead_s,
                             chunk_tokens=rates.chunk_tokens, model=model)
            s = run_setting(convs[:n], concurrency=c, max_running=8, clip=clip, rates=r,
                            scenarios=("none",), order_seed=order_seed)["none"]
            lines.append(f"| {label} | {model} | {s['ttft_mean_s']:.2f} / {m_ttft:.2f} "
                         f"| {s['e2e_mean_s']:.2f} / {m_e2e:.2f} "
                         f"| {s['e2e_mean_s'] - s['ttft_mean_s']:.2f} / {m_e2e - m_ttft:.2f} |")
    return "\n".join(lines) + "\n"


def run_setting_seeds(convs: Sequence[TraceConversation], *, order_seeds: Sequence[int | None],
                      **kw) -> dict[str, dict]:
    """:func:`run_setting` (``kw``: its keyword args) once per order of ``order_seeds``; every
    numeric summary field is the mean over the orders (the measured runs average seeds too).
    Raises: DascInputError as :func:`run_setting`, or for an empty ``order_seeds``."""
    if not order_seeds:
        raise DascInputError("--order-seed: expected at least one seed")
    got = [run_setting(convs, order_seed=o, **kw) for o in order_seeds]
    return {name: {f: sum(g[name][f] for g in got) / len(got) for f in got[0][name]}
            for name in got[0]}


def capacity_validation_report(convs: Sequence[TraceConversation], rates: ServiceRates, *,
                               other_model: str = "slot", cache_model: CacheModel = CacheModel(),
                               seeds: Sequence[int] = (0, 1, 2)) -> str:
    """Markdown: MEASURED_CAPACITY (R = 8) next to the ``cap=K`` predictions of ``rates.model`` and
    ``other_model`` (same rates), each the mean over the order seeds ``seeds`` (the measured runs'
    ``serve_bench --seed`` 0, 1, 2), and one extra row per INT8 arm with its checkpoints confined to
    the INT8 pool (``K_eff = s * R + INT8_POOL_SLOTS[regime]``, ``serving_regime_cache.py``); then the mean
    absolute error of the hit rates over the runs, with the INT8 arms as one pool and as K_eff.
    A run whose K is below ``s * R`` reads ``K < sR`` and is left out of the error.
    Raises: DascInputError for a bad ``other_model`` or cache knobs."""
    models = [rates] + [replace(rates, model=other_model)] * (other_model != rates.model)
    for r in models:
        r.check()
    names = [r.model for r in models]
    lines = [f"cache model {cache_model.label()}; hit rates and TTFT means over order seeds "
             f"{list(seeds)}\n",
             "| regime | arm | K | hits measured | " + " | ".join(f"hits {m}" for m in names)
             + " | bound (all) | TTFT measured (s) | " + " | ".join(f"TTFT {m} (s)" for m in names)
             + " |", "|---|---|---:|---:|" + "---:|" * (2 * len(names) + 2)]
    err = {m: [0.0, 0.0] for m in names}      # summed |error|: [INT8 arm as K, as K_eff]
    n_runs, need = 0, cache_model.slots_per_running * 8
    for regime, arm, k, c, n, clip, m_hit, m_ttft in MEASURED_CAPACITY:
        label = f"| {regime} (C={c}, N={n}) "
        if k < need:
            lines.append(f"{label}| {arm} | {k} | {m_hit:.3f} |" + " K < sR |" * len(names)
                         + f" | {m_ttft:.2f} |" + " |" * len(names))
            continue
        n_runs += 1
        rows = [(arm, k, 0)] if arm != "int8" else [
            (arm, k, 1), ("int8 as K_eff (INT8 pool only)", need + INT8_POOL_SLOTS[regime], 2)]
        for name, kk, which in rows:          # which: 0 both errors, 1 the first, 2 the second
            hit, ttft = [], []
            for r in models:
                g = run_setting_seeds(convs[:n], order_seeds=seeds, concurrency=c, max_running=8,
                                      clip=clip, rates=r, scenarios=("all",), capacities=(kk,),
                                      cache_model=cache_model)
                hit.append(g[f"cap={kk}"]["hit_rate"])
                ttft.append(g[f"cap={kk}"]["ttft_mean_s"])
                for e in (0, 1):
                    if which in (0, e + 1):
                        err[r.model][e] += abs(hit[-1] - m_hit)
            lines.append(f"{label}| {name} | {kk} | {m_hit:.3f} | "
                         + " | ".join(f"{h:.3f}" for h in hit) + f" | {g['all']['hit_rate']:.3f} "
                         f"| {m_ttft:.2f} | " + " | ".join(f"{t:.2f}" for t in ttft) + " |")
    lines.append("")
    for m in names:
        lines.append(f"mean |hits predicted - measured| ({m}, {n_runs} runs): {err[m][0] / n_runs:.3f} "
                     f"with every arm one pool, {err[m][1] / n_runs:.3f} with the INT8 arm as K_eff")
    return "\n".join(lines) + "\n"


def main(argv: Iterable[str] | None = None) -> int:
    """CLI: Markdown table for the grid (and ``--validate``, ``--validate-capacity``); exit 0, or 2
    on bad input (e.g. a ``--capacity`` below ``--slots-per-running`` x ``--max-running``)."""
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="Columns: C = conversations in flight (client concurrency), R = max running requests, "
               "N = conversations replayed; 'wait share of TTFT' = part of TTFT spent waiting for a "
               "running slot. Figures are model predictions, not measurements (module docstring).")
    ap.add_argument("--trace", default=str(_HERE / "traces" / "sharegpt_qwen_n128_d512_s0.json.gz"),
                    help="serving trace (benchmarks/build_trace.py format)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[24], help="C: conversations in flight")
    ap.add_argument("--max-running", type=int, nargs="+", default=[8],
                    help="R: the server's --max-running-requests")
    ap.add_argument("--clip", type=int, nargs="+", default=[128], help="decode clip (tokens); 0 = none")
    ap.add_argument("--num-conversations", type=int, nargs="+", default=[0], help="first N; 0 = all")
    ap.add_argument("--scenarios", nargs="+", default=["none", "all"], choices=("none", "all"),
                    help="none: every turn misses; all: every turn > 0 reuses the previous prompt")
    ap.add_argument("--hit-fraction", type=float, default=None,
                    help="also a scenario where each turn > 0 hits with this probability")
    ap.add_argument("--hit-seed", type=int, default=0, help="seed of the --hit-fraction draws")
    ap.add_argument("--order-seed", type=int, nargs="+", default=None,
                    help="serve_bench --seed order(s); several: rows are means over them")
    ap.add_argument("--prefill-model", choices=PREFILL_MODELS, default="interleaved",
                    help="how prefill shares the GPU with decode (module docstring)")
    ap.add_argument("--prefill-tok-s", type=float, default=20000.0, help="prefill rate, tokens/s")
    ap.add_argument("--prefill-overhead-s", type=float, default=0.0, help="fixed seconds per prefill")
    ap.add_argument("--decode-step-s", type=float, default=0.0117, help="seconds per decode step")
    ap.add_argument("--chunk-tokens", type=int, default=8192, help="prefill chunk (--chunked-prefill-size)")
    ap.add_argument("--validate", action="store_true", help="also compare with MEASURED runs")
    ap.add_argument("--capacity", type=int, nargs="+", default=[],
                    help="state slots K of a finite checkpoint cache; one cap=K row each")
    ap.add_argument("--slots-per-running", type=int, default=3,
                    help="state slots a running request holds")
    ap.add_argument("--ckpts-per-request", type=int, default=2,
                    help="checkpoints a finished request inserts (prompt-end first)")
    ap.add_argument("--track-interval", type=int, default=0,
                    help="tokens; > 0: a 2nd checkpoint only if decode reaches a multiple (SGLang: 256)")
    ap.add_argument("--validate-capacity", action="store_true",
                    help="also compare cap=K hit rates with MEASURED_CAPACITY runs")
    ap.add_argument("--other-model", choices=PREFILL_MODELS, default="slot",
                    help="second prefill model shown by --validate-capacity")
    a = ap.parse_args(argv)
    try:
        rates = ServiceRates(prefill_tok_s=a.prefill_tok_s, decode_step_s=a.decode_step_s,
                             prefill_overhead_s=a.prefill_overhead_s, chunk_tokens=a.chunk_tokens,
                             model=a.prefill_model)
        rates.check()
        if a.hit_fraction is not None and not 0.0 <= a.hit_fraction <= 1.0:
            raise DascInputError(f"--hit-fraction: expected a value in [0, 1], got {a.hit_fraction}")
        _, convs = load_trace(a.trace)
        for n in a.num_conversations:
            if not 0 <= n <= len(convs):
                raise DascInputError(f"--num-conversations: expected 0..{len(convs)}, got {n}")
        if min(a.concurrency) < 1 or min(a.max_running) < 1:
            raise DascInputError(f"--concurrency / --max-running: expected >= 1, got "
                                 f"{a.concurrency} / {a.max_running}")
        if any(c < 0 for c in a.clip):
            raise DascInputError(f"--clip: expected >= 0 tokens (0 = no clip), got {a.clip}")
        cache_model = CacheModel(slots_per_running=a.slots_per_running,
                                 ckpts_per_request=a.ckpts_per_request,
                                 track_interval=a.track_interval)
        for r in a.max_running:          # every K and knob checked before any replay
            for k in a.capacity:
                cache_model.cache(k, r)
        if a.validate_capacity:
            cache_model.cache(cache_model.slots_per_running * 8, 8)
        print(f"prefill model `{rates.model}`, prefill {rates.prefill_tok_s:g} tok/s + "
              f"{rates.prefill_overhead_s:g} s, decode {rates.decode_step_s * 1e3:g} ms/step, "
              f"chunk {rates.chunk_tokens} tokens, order seed(s) {a.order_seed or 'none (trace order)'}"
              + (f", cache model {cache_model.label()}" if a.capacity else "") + f"\n\n{TABLE_HEAD}")
        for c, r, clip, n in itertools.product(a.concurrency, a.max_running, a.clip,
                                               a.num_conversations):
            sub = convs[:n] if n else convs
            got = run_setting_seeds(sub, order_seeds=a.order_seed or [None], concurrency=c,
                                    max_running=r, clip=clip or None, rates=rates,
                                    scenarios=a.scenarios, hit_fraction=a.hit_fraction,
                                    hit_seed=a.hit_seed, capacities=a.capacity,
                                    cache_model=cache_model)
            for name, s in got.items():
                print(table_row((c, r, clip, len(sub)), name, s, got["none"]))
        if a.validate:
            print("\nValidation (R = 8, cache `none`):\n\n" + validation_report(
                convs, rates, a.order_seed[0] if a.order_seed else None))
        if a.validate_capacity:
            print("\nCapacity validation (R = 8; regimes A, B at clip 128, C at clip 8):\n\n"
                  + capacity_validation_report(convs, rates, other_model=a.other_model,
                                               cache_model=cache_model))
    except DascInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
