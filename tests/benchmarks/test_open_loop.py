"""Open-loop client (benchmarks/open_loop.py): Poisson arrivals, think time after each reply, windows.

The arrival process is checked statistically on a long seeded draw (gap mean and CV, a
Kolmogorov-Smirnov distance to the exponential law, Poisson counts, no lag correlation). Turn
ordering is checked at the stand-in server of tests/benchmarks/test_serve_bench.py (its own clock): a turn
arrives only after the previous turn's stream ended plus the think time. The same check run on a
deliberately broken client (one that does not wait for the reply) must find violations.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time

import pytest

from benchmarks import build_trace as bt
from benchmarks import open_loop as ol
from benchmarks import serve_bench as sb
from dasc_compile.errors import DascInputError
from tests.benchmarks.test_serve_bench import FakeSGLang


def toy_convs(n: int, turns: int = 3) -> list[bt.TraceConversation]:
    """n conversations whose first token (2000 + c) differs, so no prefix is shared across them."""
    segs = []
    for c in range(n):
        s = [(2000 + c,) + (1,) * 8]
        for t in range(2 * turns - 1):
            s.append((2 + t,) * (3 + t))
        segs.append(tuple(s))
    return [bt.TraceConversation(source_id=f"c{c}", segments=segs[c], decode_tokens=(4,) * turns) for c in range(n)]


# ---------------------------------------------------------------- the arrival process


def test_poisson_arrivals_have_exponential_gaps_and_poisson_counts():
    rate, horizon = 3.0, 3000.0
    ts = ol.poisson_arrivals(rate, 0.0, horizon, random.Random(11))
    n = len(ts)
    assert abs(n - rate * horizon) < 4 * math.sqrt(rate * horizon)
    gaps = [b - a for a, b in zip([0.0] + ts, ts)]
    mean = sum(gaps) / n
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / (n - 1))
    assert mean == pytest.approx(1 / rate, rel=0.03)
    assert sd / mean == pytest.approx(1.0, abs=0.04)              # exponential: CV = 1
    xs = sorted(gaps)
    ks = max(max((i + 1) / n - (1 - math.exp(-rate * x)), (1 - math.exp(-rate * x)) - i / n)
             for i, x in enumerate(xs))
    assert ks < 1.63 / math.sqrt(n)                               # KS, 1 % level
    counts = [0] * int(horizon)
    for t in ts:
        counts[int(t)] += 1
    m = sum(counts) / len(counts)
    var = sum((c - m) ** 2 for c in counts) / (len(counts) - 1)
    assert var / m == pytest.approx(1.0, abs=0.1)                 # Poisson: variance = mean
    lag = sum((a - mean) * (b - mean) for a, b in zip(gaps, gaps[1:])) / ((n - 1) * sd * sd)
    assert abs(lag) < 0.05
    assert all(0.0 < t < horizon for t in ts) and ts == sorted(ts)
    # a regular (deterministic) stream at the same rate fails the same distance test
    regular = [1 / rate] * n
    assert max(abs((i + 1) / n - (1 - math.exp(-rate * x))) for i, x in enumerate(regular)) > 0.3


P = ol.OpenLoopParams(rate=4.0, think_s=2.0, warmup_s=5.0, window_s=10.0, seeds=(0, 1, 2, 3, 4),
                      think_spread=0.5, initial_live=12, warmup_seed=7, think_dist="uniform")


def test_schedule_is_seeded_per_window_and_never_reuses_a_conversation():
    s = ol.build_schedule(400, 4, P)
    assert s == ol.build_schedule(400, 4, P)
    assert len({c.conv for c in s}) == len(s)
    init = [c for c in s if c.first_turn > 0]
    assert len(init) == 12 and all(1 <= c.first_turn <= 3 and 0 <= c.start_s < 3.0 and c.segment == -1 for c in init)
    for c in s:
        assert len(c.think_s) == 3 and all(1.0 <= z <= 3.0 for z in c.think_s)
        if c.first_turn == 0:
            assert c.segment == P.window_of(c.start_s)               # drawn by the seed of its window
    thinks = [z for c in s for z in c.think_s]
    assert sum(thinks) / len(thinks) == pytest.approx(2.0, abs=0.15)
    # changing one window's seed changes that window's arrivals only
    other = ol.build_schedule(400, 4, ol.OpenLoopParams(**{**P.__dict__, "seeds": (0, 1, 9, 3, 4)}))

    def starts(sched, seg):
        return [c.start_s for c in sched if c.segment == seg and c.first_turn == 0]

    for seg in (-1, 0, 1, 3, 4):
        assert starts(s, seg) == starts(other, seg)
    assert starts(s, 2) != starts(other, 2)
    assert all(P.warmup_s + 2 * P.window_s <= t < P.warmup_s + 3 * P.window_s for t in starts(other, 2))
    # exponential think times (the default): mean Z, CV 1; initial conversations start inside the warm-up
    e = ol.build_schedule(400, 4, ol.OpenLoopParams(**{**P.__dict__, "think_dist": "exp", "initial_live": 40}))
    ez = [z for c in e for z in c.think_s]
    m = sum(ez) / len(ez)
    assert m == pytest.approx(2.0, rel=0.1) and math.sqrt(sum((z - m) ** 2 for z in ez) / len(ez)) / m == pytest.approx(1, abs=0.12)
    assert all(0 <= c.start_s < P.warmup_s for c in e if c.first_turn > 0)
    with pytest.raises(DascInputError, match="think-dist"):
        ol.OpenLoopParams(**{**P.__dict__, "think_dist": "pareto"}).check()
    with pytest.raises(DascInputError, match="trace holds 50"):
        ol.build_schedule(50, 4, P)
    with pytest.raises(DascInputError, match="--seeds"):
        ol.OpenLoopParams(**{**P.__dict__, "seeds": (1, 1)}).check()


# ---------------------------------------------------------------- against the stand-in server


RUN = ol.OpenLoopParams(rate=12.0, think_s=0.25, warmup_s=0.4, window_s=0.5, seeds=(0, 1, 2), think_spread=0.5,
                        initial_live=3, warmup_seed=5)


def _server_side_violations(fake: FakeSGLang, reqs, schedule) -> tuple[list[str], int]:
    """From the server's own log: turn k+1 must arrive after turn k's stream ended plus its think time."""
    by_ids = {e["ids"]: e for e in fake.log}
    bad, pairs = [], 0
    for c in schedule:
        turns = reqs[c.conv]
        for k in range(c.first_turn, len(turns) - 1):
            a, b = by_ids.get(turns[k].input_ids), by_ids.get(turns[k + 1].input_ids)
            if a is None or b is None:
                continue
            pairs += 1
            if b["t_in"] < a["t_out"] + c.think_s[k]:
                bad.append(f"conv {c.conv} turn {k + 1}: in {b['t_in']:.4f} < out {a['t_out']:.4f} + {c.think_s[k]:.3f}")
    return bad, pairs


def test_open_loop_run_follows_the_schedule_and_waits_for_replies():
    fake = FakeSGLang(ttft_delay=0.02, token_delay=0.01)
    try:
        convs = toy_convs(80)
        reqs = [bt.turn_requests(i, c) for i, c in enumerate(convs)]
        schedule = ol.build_schedule(len(convs), 3, RUN)
        records, dropped, wall = ol.run_open_loop(fake.url, reqs, schedule, RUN)
    finally:
        fake.close()
    assert records and all(r.success for r in records)
    bad, pairs = _server_side_violations(fake, reqs, schedule)
    assert pairs > 10 and bad == []
    assert ol.turn_order_violations(records) == []
    # each conversation's first request leaves when the Poisson schedule says (within client lag)
    first = {(r.conv, r.turn): r for r in records}
    for c in schedule:
        r = first.get((c.conv, c.first_turn))
        assert r is not None and r.due_s == c.start_s and 0 <= r.start_s - c.start_s < 0.25
    # nothing is sent at or after the end; what fell due later was counted, not sent
    assert max(r.start_s for r in records) < RUN.end_s + 0.25 and dropped > 0
    assert all(r.window == RUN.window_of(r.start_s) for r in records)
    assert {r.window for r in records} >= {-1, 0, 1, 2}
    assert all(r.start_s >= r.due_s for r in records)
    s = ol.summarize_open_loop(records, RUN, arm="x", checkpoint_capacity=4, wall_s=wall, dropped=dropped)
    assert [w["seed"] for w in s["windows"]] == [0, 1, 2]
    assert sum(w["requests"] for w in s["windows"]) == s["requests"] == sum(1 for r in records if 0 <= r.window < 3)
    assert s["warmup_requests"] == sum(1 for r in records if r.window == -1)
    assert s["load"]["mean_in_flight"] > 0 and s["load"]["mean_waiting_conversations"] > 0


def test_ordering_check_catches_a_client_that_does_not_wait(monkeypatch):
    """Negative control: a client that returns before the reply arrives breaks the ordering, and the
    server-side check above reports it."""
    real = sb.send_generate

    def fire_and_forget(host, port, req, *, timeout_s, path="/generate"):
        threading.Thread(target=real, args=(host, port, req), kwargs={"timeout_s": timeout_s}, daemon=True).start()
        return sb.RequestRecord(conv=req.conv, turn=req.turn, source_id="", prompt_tokens=len(req.input_ids),
                                max_new_tokens=req.max_new_tokens, ttft_s=0.0, e2e_s=0.0, success=True)

    monkeypatch.setattr(sb, "send_generate", fire_and_forget)
    fake = FakeSGLang(ttft_delay=0.05, token_delay=0.02)
    try:
        convs = toy_convs(40)
        reqs = [bt.turn_requests(i, c) for i, c in enumerate(convs)]
        p = ol.OpenLoopParams(**{**RUN.__dict__, "think_s": 0.02, "initial_live": 0})
        schedule = ol.build_schedule(len(convs), 3, p)
        ol.run_open_loop(fake.url, reqs, schedule, p)
        time.sleep(0.5)                       # let the abandoned streams end
    finally:
        fake.close()
    bad, pairs = _server_side_violations(fake, reqs, schedule)
    assert pairs > 5 and len(bad) > 0


def test_turn_order_violations_and_load_profile_by_hand():
    def rec(conv, turn, start, e2e, think=0.0):
        return ol.OpenLoopRecord(conv=conv, turn=turn, source_id="", prompt_tokens=1, max_new_tokens=1,
                                 start_s=start, e2e_s=e2e, success=True, think_s=think)

    ok = [rec(0, 0, 0.0, 1.0), rec(0, 1, 3.0, 1.0, think=2.0)]
    assert ol.turn_order_violations(ok) == []
    assert ol.load_profile(ok, 0.0, 4.0) == {"mean_in_flight": 0.5, "mean_waiting_conversations": 0.5}
    # with 3 turns the conversation still waits for its last turn after 4.0 s: until the end, 6.0 s
    assert ol.load_profile(ok, 0.0, 6.0, turns=3) == {"mean_in_flight": 2 / 6, "mean_waiting_conversations": 4 / 6}
    early = [rec(0, 0, 0.0, 1.0), rec(0, 1, 2.5, 1.0, think=2.0)]
    assert len(ol.turn_order_violations(early)) == 1
    skipped = [rec(0, 0, 0.0, 1.0), rec(0, 2, 5.0, 1.0)]
    assert "turn 2 sent after turn 0" in ol.turn_order_violations(skipped)[0]


def test_cli_end_to_end_and_bad_input(tmp_path, capsys):
    convs = toy_convs(80)
    params = bt.TraceParams(num_conversations=80, turns=3, min_initial_tokens=1, max_initial_tokens=99,
                            max_context_tokens=999, max_decode_tokens=4)
    bt.write_trace(tmp_path / "t.json.gz", bt.trace_to_json(convs, params, source={"file": "toy"},
                                                            tokenizer={"name": "toy"}))
    fake = FakeSGLang(ttft_delay=0.01, token_delay=0.005)
    try:
        args = ["--trace", str(tmp_path / "t.json.gz"), "--url", fake.url, "--arm", "dense", "--rate", "12",
                "--think-s", "0.25", "--warmup-s", "0.4", "--window-s", "0.5", "--seeds", "0", "1", "2",
                "--initial-live", "3", "--out", str(tmp_path / "dense")]
        assert ol.main(args) == 0
    finally:
        fake.close()
    res = json.loads((tmp_path / "dense.json").read_text())
    assert res["format"] == ol.RESULT_FORMAT and res["config"]["decode_clip"] == 128
    assert res["summary"]["turn_order_violations"] == [] and len(res["summary"]["windows"]) == 3
    assert fake.flushes == 1
    capsys.readouterr()
    assert ol.main(args[:-2] + ["--decode-clip", "64", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --decode-clip")
    assert ol.main(args[:-2] + ["--rate", "400", "--out", str(tmp_path / "x")]) == 2
    assert "trace holds 80" in capsys.readouterr().err
