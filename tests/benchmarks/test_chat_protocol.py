"""The serving protocols of issue 24: trace seeds, chat-like replay, the run order, server processes,
the report.

The client runs against ``tests/support/fake_sglang_server.py`` (a CPU stand-in that caches each
prompt and each finished prompt + reply, and sends SGLang's request metrics)."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from benchmarks import chat_replay as cr
from benchmarks import serving_report as sr
from benchmarks import serving_runs as srun
from benchmarks import sglang_server as ss
from benchmarks.trace_file import TraceConversation
from benchmarks.chat_trace import chat_turns, context_pad, reusable_tokens, seed_conversations
from benchmarks.run_order import closing_run_due, reserve_s, run_name, runs_to_reserve, schedule
from dasc_compile.errors import DascInputError
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "benchmarks/traces/sharegpt_qwen_n8_d64_s0.json.gz"
IM_END, NL = 151645, 198


# ---------------------------------------------------------------- trace seeds

def test_seeds_are_disjoint_blocks_of_one_permutation():
    seeds = [seed_conversations(256, 24, s) for s in range(10)]
    flat = [i for s in seeds for i in s]
    assert len(flat) == len(set(flat)) == 240                  # no conversation in two seeds
    assert all(len(s) == 24 for s in seeds)
    assert seed_conversations(256, 24, 3) == seeds[3]           # deterministic
    assert seed_conversations(256, 24, 3, pool_seed=1) != seeds[3]
    with pytest.raises(DascInputError, match=r"holds 10 disjoint seeds of 24 \(0\.\.9\)"):
        seed_conversations(256, 24, 10)


def test_context_pad_is_per_conversation_and_sized():
    a = context_pad("abc", 100, seed=0, im_start=1, im_end=2, newline=3)
    b = context_pad("abd", 100, seed=0, im_start=1, im_end=2, newline=3)
    assert len(a) == 100 and a[0] == 1 and a[-2:] == (2, 3)
    assert a[1:4] != b[1:4]                                      # no shared prefix through the pad
    assert a == context_pad("abc", 100, seed=0, im_start=1, im_end=2, newline=3)
    assert context_pad("abc", 0, seed=0, im_start=1, im_end=2, newline=3) == ()
    with pytest.raises(DascInputError, match="--pad-tokens"):
        context_pad("abc", 3, seed=0, im_start=1, im_end=2, newline=3)


# ---------------------------------------------------------------- chat turns

CONV = TraceConversation(source_id="c", segments=((1, 2, 3), (50, 51, IM_END, NL), (4, 5), (60, IM_END, NL)),
                         decode_tokens=(3, 2))


def test_served_reply_carries_the_generated_ids_and_the_closing_tokens():
    t = chat_turns(0, CONV, replay="served-reply", decode_clip=None, pad=(9, 9))
    assert t.prompt() == [9, 9, 1, 2, 3]
    t.advance([70, 71, 72])
    assert t.prompt() == [9, 9, 1, 2, 3, 70, 71, 72, IM_END, NL, 4, 5]
    assert t.decode == [3, 2]


def test_recorded_reply_carries_the_recorded_segment():
    t = chat_turns(0, CONV, replay="recorded-reply", decode_clip=2)
    t.advance([70, 71])
    assert t.prompt() == [1, 2, 3, 50, 51, IM_END, NL, 4, 5]
    assert t.decode == [2, 2]                                   # clipped


def test_turn_lengths_are_what_the_client_sends():
    """Hand-counted on CONV (user 3 + 2 tokens, recorded replies of 4 and 3, decode 3 and 2) with a pad of 4:
    served-reply turn 1 = pad 4 + user 3 + served 3 + closing 2 + user 2 = 14 (the test above's prompt, whose pad is
    2); recorded-reply = 4 + 3 + 4 + 2 = 13; and the same as ChatTurns builds on every turn of a real trace."""
    from benchmarks.chat_trace import turn_lengths
    from benchmarks.trace_file import load_trace

    assert turn_lengths(CONV, replay="served-reply", decode_clip=None, pad_tokens=4) == [(7, 3), (14, 2)]
    assert turn_lengths(CONV, replay="recorded-reply", decode_clip=2, pad_tokens=4) == [(7, 2), (13, 2)]
    for conv in load_trace(TRACE)[1]:
        for replay in ("served-reply", "recorded-reply"):
            t = chat_turns(0, conv, replay=replay, decode_clip=16, pad=tuple(range(100, 107)))
            sent = []
            while not t.done:
                sent.append((len(t.prompt()), t.decode[t.turn]))
                t.advance([7] * t.decode[t.turn])         # ignore_eos: a served reply is its decode length
            assert turn_lengths(conv, replay=replay, decode_clip=16, pad_tokens=7) == sent


def test_a_turn_over_the_servers_context_is_refused_before_any_run(capsys):
    """Session 46: trace x2 seed 2 at pad 11600 sent two turns (conversations 151 and 198, turn 3) over the
    servers' 24,576 tokens, and SGLang refused them in every arm. ``run --check --context-length`` now refuses the
    seed, naming every refused seed at once. SGLang 0.5.17 also cuts a reply without an error unless prompt + reply
    + 2 fit the context, so the longest turn (24,813 + 256) needs 25,071 tokens: at 25,070 it is still refused."""
    import benchmarks.run_chat as rc

    x2 = REPO / "benchmarks/traces/sharegpt_qwen_n256_d1024_min4k_x2.json.gz"
    argv = ["run", "--check", "--work", str(REPO / "absent"), "--trace", str(x2), "--arms", "dense",
            "--conversations-per-seed", "32", "--clients", "32", "--pad-tokens", "11600"]
    assert rc.main([*argv, "--seeds", "1", "2", "--context-length", "24576"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --context-length 24576: trace seed 2 would lose turns SGLang refuses or cuts in every arm (seed 2: 2 "
        "turns, the longest conversation 151 turn 3 with 24,813 prompt + 256 reply tokens; turns counted from 0; "
        "SGLang needs prompt + reply + 2 and prompt + 7 tokens); serve --context-length 25071 or more, or --pad-tokens "
        "11105 or less, or use other seeds")
    assert rc.main([*argv, "--seeds", "2", "--context-length", "25070"]) == 2
    assert "(seed 2: 1 turn, the longest conversation 151 turn 3" in capsys.readouterr().err
    assert rc.main([*argv, "--seeds", "1", "2", "--context-length", "25071"]) == 0
    assert rc.main([*argv, "--seeds", "1", "3", "--context-length", "24576"]) == 0
    assert rc.main([*argv, "--seeds", "2"]) == 0                  # no --context-length: nothing to check against
    capsys.readouterr()
    # every refused seed in one line; a pad hint only where a pad would serve them
    assert rc.main([*argv, "--seeds", "0", "1", "3", "--context-length", "20000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --context-length 20000: trace seeds 0, 1, 3 would lose turns") and "; seed 1: " in err
    argv0 = [*argv[:-1], "0"]
    assert rc.main([*argv0, "--seeds", "1", "--context-length", "4000"]) == 2
    err = capsys.readouterr().err
    assert "serve --context-length 10942 or more, or use other seeds" in err and "--pad-tokens" not in err.split(";")[-1]


def test_the_pad_hint_is_a_pad_the_client_accepts():
    """A pad that fits the context only below 4 tokens is offered as 0 (1-3 leave no room for the body); a pad of
    1-3 is refused by the check as by the client."""
    from benchmarks.chat_trace import check_seeds

    conv = TraceConversation(source_id="c", segments=((1,) * 10, (2,) * 4, (3,) * 5, (4,) * 3), decode_tokens=(3, 2))
    # turn 1: prompt = pad + 10 + 3 + 2 + 5 = pad + 20, reply 2: needs pad + 27 (prompt margin 7; the reply's
    # pad + 20 + 2 + 2 is less); turn 0 needs pad + 17
    kw = dict(per_seed=1, pool_seed=0, replay="served-reply", decode_clip=None)
    check_seeds([conv], [0], pad_tokens=5, context_length=32, **kw)
    with pytest.raises(DascInputError, match=r"--context-length 35 or more, or --pad-tokens 0, or use"):
        check_seeds([conv], [0], pad_tokens=8, context_length=29, **kw)
    with pytest.raises(DascInputError, match=r"--context-length 34 or more, or --pad-tokens 5 or less, or use"):
        check_seeds([conv], [0], pad_tokens=7, context_length=32, **kw)
    with pytest.raises(DascInputError, match=r"--context-length 27 or more, or use other seeds"):
        check_seeds([conv], [0], pad_tokens=0, context_length=20, **kw)
    with pytest.raises(DascInputError, match=r"--pad-tokens: expected 0 or >= 4 tokens, got 2"):
        check_seeds([conv], [0], pad_tokens=2, context_length=None, **kw)

def test_reuse_bound_is_the_aligned_common_prefix():
    prev = list(range(200))
    assert reusable_tokens(list(range(150)) + [7], prev) == 128   # 150 common, floor to 64
    assert reusable_tokens(list(range(64)), prev) == 0            # the last token is always computed
    assert reusable_tokens([5] + list(range(100)), prev) == 0
    assert reusable_tokens(list(range(130)), prev, align=1) == 129


# ---------------------------------------------------------------- run order

@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7])
def test_williams_rows_balance_positions_and_predecessors(n):
    from collections import Counter

    from benchmarks.run_order import williams_rows

    rows = williams_rows(n)
    assert len(rows) == (n if n % 2 == 0 else 2 * n) and all(sorted(r) == list(range(n)) for r in rows)
    per_pos = [Counter(r[p] for r in rows) for p in range(n)]
    assert all(set(c.values()) == {len(rows) // n} for c in per_pos)          # each arm in each slot equally
    pairs = Counter((r[i], r[i + 1]) for r in rows for i in range(n - 1))
    assert len(pairs) == n * (n - 1) and len(set(pairs.values())) == 1      # each a-before-b equally often


def test_schedule_follows_the_seed_with_dense_first_and_last():
    from collections import Counter

    arms = ["dense", "int8", "w16", "w64", "w16-int8", "wr"]
    order = schedule(arms, [3, 4, 5])
    assert order[0] == ("dense", 3, "arm") and order[-1] == ("dense", 3, "drift")
    body = order[:-1]
    for s in (3, 4, 5):                                          # every arm once per seed
        assert sorted(a for a, seed, _ in body if seed == s) == sorted(arms)
    # a seed's order does not depend on the call it runs in (only the call's first seed starts with Dense)
    later = [a for a, s, _ in schedule(arms, [9, 4]) if s == 4]
    assert later == [a for a, s, _ in body if s == 4]
    # over seeds 1-6 (one per call, as the six-arm calls run them) no arm always follows the same one:
    # the plain rotation this replaces put INT8 directly before w16 on every seed
    preds = Counter()
    for s in range(1, 7):
        seq = [a for a, _, r in schedule(arms, [s]) if r == "arm"]
        preds.update(zip(seq, seq[1:]))
    assert preds[("int8", "w16")] <= 2 and max(preds.values()) <= 3
    with pytest.raises(DascInputError, match="baseline"):
        schedule(["int8", "w16"], [0])
    assert run_name("dense", 3, "served-reply", 6000, "drift", "r0.2264", 1) \
        == "dense__s3__served-reply__p6000__r0.2264__k1__drift"
    # the same arm and seed under another load or in another call of one work folder is another file
    names = {run_name("dense", 4, "served-reply", 6000, "arm", load, call)
             for load in ("c24", "r0.2264") for call in (0, 1)}
    assert len(names) == 4


def test_a_seed_starts_only_when_all_its_arms_and_the_closing_run_fit():
    order = schedule(["dense", "w16", "w64"], [1, 2])
    assert len(order) == 7 and order[-1][2] == "drift"
    # seed 1's first run reserves its three arms and the closing Dense; its last arm, itself and the closing run
    assert [runs_to_reserve(order, i) for i in range(6)] == [4, 3, 2, 4, 3, 2]
    # the count follows the seed, not the arm: a two-arm call of one seed (session 14's protocol B) reserves 3
    assert runs_to_reserve(schedule(["dense", "w16"], [3]), 0) == 3


# ---------------------------------------------------------------- server processes

def _state(pid: int) -> str:
    """Process state letter from /proc (``""`` when the process is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def test_the_closing_run_needs_another_arms_run_and_the_time():
    assert closing_run_due(1, 200.0, 172.5)
    assert not closing_run_due(0, 10_000.0, 172.5)  # no other arm ran: it would bracket nothing
    assert not closing_run_due(3, 170.0, 172.5)  # 172.5 s needed


def test_the_time_reserved_follows_each_seeds_estimate():
    order = schedule(["dense", "w16"], [1, 2])      # dense s1, w16 s1, (s2 in its row's order), dense s1 closing
    est = lambda arm, seed: {1: 163.0, 2: 142.0}[seed]  # noqa: E731
    # before the first run: seed 1's two runs and the closing run of seed 1
    assert reserve_s(order, 0, est) == 3 * 163.0
    # seed 2's first run: its two runs at 142 s and the closing run at seed 1's 163 s
    i2 = next(i for i, (_, s, _) in enumerate(order) if s == 2)
    assert reserve_s(order, i2, est) == 2 * 142.0 + 163.0
    assert reserve_s(order, i2 + 1, est) == 142.0 + 163.0
    # one estimate for every seed gives runs_to_reserve's count times it (the closed loop)
    assert [reserve_s(order, i, lambda a, s: 10.0) for i in range(4)] == [10.0 * runs_to_reserve(order, i) for i in range(4)]


def test_the_time_reserved_follows_each_arms_estimate():
    # session 42's 16k call: INT8 opened (58 s), Dense took 124 s; before w16 the reservation is w16 at the
    # longest run (not yet run) and the closing INT8 run at INT8's own time, not at Dense's
    order = schedule(["dense", "int8", "dasc-nr-w16"], [3], baseline="int8")
    assert [a for a, _, _ in order] == ["int8", "dense", "dasc-nr-w16", "int8"]
    walls = {"int8": 58.0, "dense": 124.0}
    est = lambda arm, seed: walls.get(arm, max(walls.values()))  # noqa: E731
    assert reserve_s(order, 2, est) == 124.0 + 58.0
    assert reserve_s(order, 1, est) == 124.0 + 124.0 + 58.0


class _Clock:
    """run_chat's ``time`` with a hand-moved ``monotonic`` (other attributes are the real module's)."""

    def __init__(self):
        self.t = 0.0

    def monotonic(self) -> float:
        return self.t

    def __getattr__(self, name):
        return getattr(time, name)


def _call(tmp_path, monkeypatch, run_s, *flags: str) -> dict:
    """One ``run_chat run`` call of Dense and dasc-nr w16 on the n8 trace, against servers that are not there:
    each replay takes ``run_s`` (s, ``{arm: s}`` or ``f(arm, seed) -> s``) of a hand-moved clock. Returns the
    call's manifest."""
    from types import SimpleNamespace

    import benchmarks.run_chat as rc

    clock = _Clock()

    def client(cmd, **_kw):        # the replay client: each run takes run_s of the call's clock
        arm, seed = cmd[cmd.index("--arm") + 1], int(cmd[cmd.index("--seed") + 1])
        clock.t += run_s(arm, seed) if callable(run_s) else run_s[arm] if isinstance(run_s, dict) else run_s
        return subprocess.CompletedProcess(cmd, 0, "ok", "")

    monkeypatch.setattr(rc, "time", clock)
    monkeypatch.setattr(rc, "subprocess", SimpleNamespace(run=client, TimeoutExpired=subprocess.TimeoutExpired))
    for name in ("alive", "healthy", "flush"):
        monkeypatch.setattr(rc, name, lambda *_a: True)
    monkeypatch.setattr(rc, "server_account", lambda *_a, **_k: None)
    work = tmp_path / "work"
    work.mkdir()
    (work / "servers.json").write_text(json.dumps({a: {"pid": 1, "port": 1, "up_s": 1.0, "gpu": f"card of {a}"}
                                                   for a in ("dense", "dasc-nr-w16")}))
    trace = REPO / "benchmarks/traces/sharegpt_qwen_n8_d64_s0.json.gz"
    code = rc.main(["run", "--work", str(work), "--trace", str(trace), "--arms", "dense", "dasc-nr-w16",
                    "--seeds", "1", "--conversations-per-seed", "2", *flags])    # 8 conversations: seeds 0-3
    man = json.loads((work / "manifest.json").read_text())
    assert code == (0 if man["runs"] else rc.NOTHING_RAN)     # a call that began no run says so (chat_bench: DOWN)
    return man


@pytest.mark.parametrize("run_s, expect", [
    # session 25's call: Dense's opening run overran (there 163 s of 432; here 330 s, so that w16 at its 120 s
    # estimate no longer fits), and the closing Dense run must not be run either: with nothing between it
    # brackets nothing
    (330.0, [("dense", "arm")]),
    (50.0, [("dense", "arm"), ("dasc-nr-w16", "arm"), ("dense", "drift")]),
])
def test_run_closes_with_the_baseline_only_after_another_arm_ran(tmp_path, monkeypatch, capsys, run_s, expect):
    runs = _call(tmp_path, monkeypatch, run_s, "--first-run-s", "120", "--deadline-s", "432")["runs"]
    assert [(r["arm"], r["role"]) for r in runs] == expect
    assert all(r["gpu"] == f"card of {r['arm']}" for r in runs)      # each run records its server's card
    if len(expect) == 1:
        assert "closing dense run skipped: no other arm ran" in capsys.readouterr().out


@pytest.mark.parametrize("flags, expect", [
    # a seed starts only when its runs and the closing run fit with the margin: with every run expected at
    # --first-run-s 124 (Dense's length at 16k) that is 3 x 124 x 1.15 = 428 s of 400; given w16's own estimate
    # (55 s, as session 42's EXPECT_S) it is 348 s, and all three runs fit
    (("--first-run-s", "124"), []),
    (("--first-run-s", "124", "--expect-s", "dasc-nr-w16=55"),
     [("dense", "arm"), ("dasc-nr-w16", "arm"), ("dense", "drift")]),
    # the closing run is reserved at its own arm's time: w16 opens and closes (55 s), Dense's 124 s between
    # leaves 81 s, enough for 55 x 1.15 but not for 124 x 1.15
    (("--first-run-s", "60", "--baseline", "dasc-nr-w16", "--deadline-s", "260"),
     [("dasc-nr-w16", "arm"), ("dense", "arm"), ("dasc-nr-w16", "drift")]),
])
def test_each_arm_is_reserved_at_its_own_time(tmp_path, monkeypatch, flags, expect):
    runs = _call(tmp_path, monkeypatch, {"dense": 124.0, "dasc-nr-w16": 55.0}, "--deadline-s", "400", *flags)["runs"]
    assert [(r["arm"], r["role"]) for r in runs] == expect


def test_a_begun_seed_is_not_cut_by_a_slightly_slower_run(tmp_path, monkeypatch):
    # seed 2 starts with 110 s left and 109.25 s reserved (its two runs and the closing run, x 1.15); its Dense run
    # then takes 45 s instead of seed 1's 35 s, leaving 65 s. The rest of a begun seed is reserved at its kept
    # estimate without the margin (w16 25 s; before, with the closing run at the longest Dense run x 1.15, 80.5 s),
    # so w16 seed 2 still runs and Dense seed 2 keeps its pair
    def run_s(arm, seed):
        return {"dense": 35.0 if seed == 1 else 45.0, "dasc-nr-w16": 25.0}[arm]
    runs = _call(tmp_path, monkeypatch, run_s, "--seeds", "1", "2", "--first-run-s", "30", "--deadline-s",
                 str(35 + 25 + 110))["runs"]
    got = [(r["arm"], r["seed"], r["role"]) for r in runs]
    assert ("dense", 2, "arm") in got and ("dasc-nr-w16", 2, "arm") in got, got


@pytest.mark.parametrize("dense_s", [60.0, 70.0])
def test_a_begun_seed_keeps_its_estimates(tmp_path, monkeypatch, dense_s):
    # the second review's case: w16 not yet run is estimated at the longest run so far (60 s, --first-run-s) when
    # the seed starts (3 x 60 x 1.15 = 207 s of 207). Dense then takes 60 s (as expected) or 70 s; w16's
    # estimate must not rise to it, and the seed finishes whenever w16's kept 60 s fit; the closing run follows
    # only if its own 1.15 x Dense's run is left
    runs = _call(tmp_path, monkeypatch, {"dense": dense_s, "dasc-nr-w16": 60.0}, "--first-run-s", "60",
                 "--deadline-s", "207")["runs"]
    got = [(r["arm"], r["role"]) for r in runs]
    assert got[:2] == [("dense", "arm"), ("dasc-nr-w16", "arm")], got
    assert (("dense", "drift") in got) == (207 - dense_s - 60 >= 1.15 * dense_s)


def test_run_estimates_follow_the_runs_of_the_call():
    from benchmarks.run_order import RUN_MARGIN, RunEstimates

    est = RunEstimates(60.0, expect={"w16": 20.0})
    assert est.run_s("dense", 1) == pytest.approx(60.0 * RUN_MARGIN)       # nothing ran: --first-run-s
    assert est.run_s("w16", 1, margin=False) == 20.0                         # its --expect-s
    est.record("dense", 1, 35.0)
    est.record("dense", 2, 41.0)
    est.record("dense", 1, 50.0)         # the closing run of seed 1 does not replace its opening run
    assert est.run_s("dense", 1, margin=False) == 35.0                       # the same seed: its own run
    assert est.run_s("dense", 3, margin=False) == 41.0                       # another seed: the arm's longest
    assert est.run_s("int8", 1, margin=False) == 41.0                        # not run, no estimate: the longest
    est.record("w16", 2, 30.0)
    assert est.run_s("w16", 3, margin=False) == 30.0                         # measured beats --expect-s
    # open loop: the seed's schedule span, or a longer run of that seed; no margin
    ol = RunEstimates(60.0, span={1: 150.0})
    assert ol.run_s("dense", 1) == 150.0
    ol.record("w16", 1, 160.0)
    assert ol.run_s("dense", 1) == 160.0


@pytest.mark.parametrize("extra, err", [
    (["--expect-s", "dasc-nr-w16"], "expected ARM=S with S a positive number of seconds, got 'dasc-nr-w16'"),
    (["--expect-s", "dasc-nr-w16=-5"], "expected ARM=S with S a positive number of seconds"),
    (["--expect-s", "dasc-nr-w16=nan"], "expected ARM=S with S a positive number of seconds"),
    (["--expect-s", "dasc-nr-w16=inf"], "expected ARM=S with S a positive number of seconds"),
    (["--expect-s", "=5"], "expected ARM=S"),
    (["--expect-s", "int8=50"], "--expect-s int8=50: not an arm of this call (the arms: dense dasc-nr-w16)"),
    (["--expect-s", "dense=60", "--expect-s", "dense=5"], "--expect-s dense: given twice (60 and 5 s)"),
    (["--expect-s", "dense=60", "--rate", "0.3", "--think-s", "10"], "--expect-s dense=60: only for the closed loop"),
    # not --expect-s, but refused the same way before any run: a seed the trace cannot hold (8 conversations, 4 a seed)
    (["--seeds", "2", "--conversations-per-seed", "4"], "trace seed 2: a trace of 8 conversations holds 2 disjoint seeds"),
    # the fresh-user trial of session 42: these ran (a NaN deadline skipped the time check and was written to the
    # manifest as NaN)
    (["--deadline-s", "nan"], "argument --deadline-s: expected a number of seconds above 0, got 'nan'"),
    (["--first-run-s", "-5"], "argument --first-run-s: expected a number of seconds above 0"),
    (["--clients", "0"], "argument --clients: expected an integer of at least 1"),
    (["--pad-tokens", "-1"], "argument --pad-tokens: expected an integer of at least 0"),
    (["--rate", "0", "--think-s", "1"], "argument --rate: expected a number of conversations/s above 0"),
    (["--rate", "0.3", "--think-s", "-1"], "argument --think-s: expected a number of seconds of at least 0"),
])
def test_a_bad_expected_run_time_is_refused_in_one_line(tmp_path, capsys, extra, err):
    import benchmarks.run_chat as rc

    work = tmp_path / "work"
    work.mkdir()
    (work / "servers.json").write_text(json.dumps({a: {"pid": 1, "port": 1, "up_s": 1.0} for a in ("dense", "dasc-nr-w16")}))
    argv = ["run", "--work", str(work), "--trace", str(REPO / "benchmarks/traces/sharegpt_qwen_n8_d64_s0.json.gz"),
            "--arms", "dense", "dasc-nr-w16", "--seeds", "1", *extra]
    try:
        code = rc.main(argv)
    except SystemExit as e:
        code = e.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and err in lines[0], (code, lines)
    assert not (work / "manifest.json").exists()


def test_check_prints_the_order_needs_no_server_and_writes_nothing(tmp_path, capsys):
    """``run --check`` (chat_bench.sh runs it before starting servers): the call's order, Dense first and last, from
    the settings alone; a seed the trace lacks is the same one-line refusal as ``run``'s."""
    import benchmarks.run_chat as rc

    work = tmp_path / "absent"
    argv = ["run", "--check", "--work", str(work), "--trace", str(TRACE), "--arms", "dense", "dasc-nr-w16",
            "--conversations-per-seed", "2"]
    assert rc.main([*argv, "--seeds", "1", "2"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == ("run settings accepted: 5 runs, " + ", ".join(
        f"{a} seed {s}" for a, s, _ in schedule(["dense", "dasc-nr-w16"], [1, 2])[:-1]) + ", dense seed 1 (closing)")
    assert out.startswith("run settings accepted: 5 runs, dense seed 1")
    assert rc.main([*argv, "--seeds", "4"]) == 2
    assert capsys.readouterr().err.strip() == ("error: trace seed 4: a trace of 8 conversations holds 4 disjoint "
                                              "seeds of 2 (0..3)")
    assert not work.exists()


def test_check_refuses_an_arm_the_plans_arms_json_lacks(tmp_path, capsys):
    """``run --check --arms-json``: an arm missing from the plans' arms.json is refused before any server starts
    (before this, ``up`` refused it only after the check had passed), naming the arm and the arms the file has."""
    import json

    import benchmarks.run_chat as rc

    arms_json = tmp_path / "arms.json"
    arms_json.write_text(json.dumps([{"arm": a, "kind": "dense", "flags": []} for a in ("dense", "int8")]))
    argv = ["run", "--check", "--work", str(tmp_path / "absent"), "--trace", str(TRACE), "--seeds", "1",
            "--conversations-per-seed", "2", "--arms-json", str(arms_json)]
    assert rc.main([*argv, "--arms", "dense", "int8"]) == 0
    capsys.readouterr()
    assert rc.main([*argv, "--arms", "dense", "dasc-nr-w16", "int8"]) == 2
    assert capsys.readouterr().err.strip() == f"error: --arms dasc-nr-w16: not in {arms_json} (dense, int8)"
    arms_json.write_text("[]")
    assert rc.main([*argv, "--arms", "dense"]) == 2
    assert "expected a non-empty list of arms" in capsys.readouterr().err
    assert not (tmp_path / "absent").exists()


def test_an_open_loop_runs_span_follows_from_its_seeds_schedule():
    from benchmarks.arrivals import OPEN_LOOP_TURN_S, arrival_offsets, open_loop_span_s, think_times
    from benchmarks.chat_trace import seed_conversations
    from benchmarks.trace_file import load_trace

    # no think time, one conversation starting at 0: its turns at turn_s each
    assert open_loop_span_s([4], [7], rate=1.0, seed=0, think_s=0.0, turn_s=2.5) == 10.0
    # two conversations: the later of (start + pauses between its turns + turns x turn_s)
    starts, (a, b) = arrival_offsets(2, 0.5, 3), (think_times(3, c, 10.0, 3) for c in (11, 12))
    want = max(starts[0] + sum(a[:2]) + 3 * 1.0, starts[1] + sum(b[:3]) + 4 * 1.0)
    assert open_loop_span_s([3, 4], [11, 12], rate=0.5, seed=3, think_s=10.0, turn_s=1.0) == pytest.approx(want)
    with pytest.raises(ValueError, match="one turn count per conversation"):
        open_loop_span_s([3], [11, 12], rate=0.5, seed=3, think_s=10.0)
    # the H200 runs it was fitted to (trace x1, 24 conversations a seed, think 10 s): measured wall times from
    # benchmarks/results/2026-12-04-h200-s27-wr-rho09 (rho 0.9, seed 1), ...-protocol-b-rho09-s20 (seed 0) and
    # ...-protocol-b-rho07-s18 (rho 0.7, seed 4); the span must cover each and over-shoot by at most 10 %
    _, convs = load_trace(REPO / "benchmarks/traces/sharegpt_qwen_n256_d1024_min4k_x1.json.gz")
    for seed, rate, wall in ((1, 0.4075, 163.0), (0, 0.4075, 142.3), (4, 0.317, 126.7)):
        idx = seed_conversations(len(convs), 24, seed)
        span = open_loop_span_s([convs[i].turns for i in idx], idx, rate, seed, 10.0)
        assert wall < span < 1.1 * wall, (seed, span, wall)
    assert OPEN_LOOP_TURN_S == 3.0


@pytest.mark.parametrize("deadline, expect", [
    # seed 1's expected span on the n8 trace (4 conversations, rho 0.4/s, think 10 s) is 86.5 s: three runs need
    # 259.6 s; first-run-s 60 (the closed loop's guess: 3 x 60 x 1.15 = 207 s) would have started the seed at 230 s
    (230.0, []),
    (265.0, [("dense", "arm"), ("dasc-nr-w16", "arm"), ("dense", "drift")]),
])
def test_an_open_loop_seed_starts_only_when_its_expected_runs_fit(tmp_path, monkeypatch, capsys, deadline, expect):
    man = _call(tmp_path, monkeypatch, 80.0, "--conversations-per-seed", "4", "--rate", "0.4", "--think-s", "10",
                "--first-run-s", "60", "--deadline-s", str(deadline))
    assert [(r["arm"], r["role"]) for r in man["runs"]] == expect
    assert man["calls"][0]["expected_run_s"] == {"1": 86.5}
    out = capsys.readouterr().out
    assert "open-loop runs expected from their seeds' schedules: seed 1 87 s" in out
    if not expect:
        assert "stop before dense seed 1: 230 s left, 260 s to reserve" in out


def test_kill_stops_children_left_after_the_leader_exited():
    """SGLang's scheduler can outlive the launcher and hold GPU memory: the whole group goes."""
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; exit 0"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    child = int(proc.stdout.readline())
    proc.wait(timeout=10)
    assert ss.alive(proc.pid) and _state(child) not in ("", "Z")       # orphan alive, leader gone
    ss.kill(proc.pid)
    deadline = time.monotonic() + 10
    while _state(child) not in ("", "Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _state(child) in ("", "Z") and not ss.alive(proc.pid)


def test_up_reports_a_server_that_exits_during_start_up_at_once(tmp_path, monkeypatch):
    """A server that dies at start (a bad flag, a missing file) is reported with its log's last lines
    at once, not after the whole --startup-deadline-s (330 s by default) of a device call."""
    from benchmarks import run_chat

    monkeypatch.setenv("FAKE_DIE", "1")
    monkeypatch.setenv("PATH", f"{_fake_nvidia_smi(tmp_path).parent}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "arms.json").write_text(json.dumps([{"arm": "dense", "kind": "dense", "capacity": 4,
                                                     "flags": ["--max-running-requests", "4"]}]))
    (tmp_path / "config.json").write_text("{}")
    work = tmp_path / "w"
    t0 = time.monotonic()
    rc = run_chat.main(["up", "--arms-json", str(tmp_path / "arms.json"), "--plans", str(tmp_path),
                        "--model", str(tmp_path), "--launcher",
                        f"{sys.executable} {REPO / 'tests/support/fake_sglang_server.py'}",
                        "--max-running-requests", "4", "--stagger-s", "0", "--startup-deadline-s", "40", "--base-port", str(free_port()),
                        "--work", str(work), "--gpu", "1"])
    assert rc == 1 and time.monotonic() - t0 < 20
    entry = json.loads((work / "servers.json").read_text())["dense"]
    assert entry["failure"].startswith("exited during start-up") and "dying at start as asked" in entry["failure"]
    assert entry["gpu"] == "NVIDIA H200"        # the card of --gpu 1 (the fake names 0 an H100), for the report


def test_up_refuses_to_reuse_a_resident_server_launched_with_other_flags(tmp_path):
    """A server kept up by the last call (DOWN=0) is reused only when this call would launch it with the
    same command: a --server-flag the resident one lacks is refused in one line, not silently dropped."""
    from benchmarks import run_chat

    (tmp_path / "arms.json").write_text(json.dumps([{"arm": "dense", "kind": "dense", "capacity": 4,
                                                     "flags": ["--max-running-requests", "4"]}]))
    (tmp_path / "config.json").write_text("{}")
    work = tmp_path / "w"
    base = ["up", "--arms-json", str(tmp_path / "arms.json"), "--plans", str(tmp_path), "--model", str(tmp_path),
            "--launcher", f"{sys.executable} {REPO / 'tests/support/fake_sglang_server.py'}",
            "--max-running-requests", "4", "--stagger-s", "0", "--startup-deadline-s", "60",
            "--base-port", str(free_port()), "--work", str(work), "--warm-lengths"]
    try:
        assert run_chat.main(base) == 0
        assert run_chat.main(base) == 0                                   # the same flags: reused
        assert run_chat.main([*base[:-1], "--server-flag=--mamba-track-interval=64", "--warm-lengths"]) == 2
        assert "--mamba-track-interval" not in json.loads((work / "servers.json").read_text())["dense"]["command"]
    finally:
        run_chat.main(["down", "--work", str(work)])


def test_up_refuses_bad_arms_model_or_plans_before_writing_or_launching(tmp_path, capsys):
    """A missing, unreadable or malformed arms.json was a traceback (exit 1); a missing --model or plan folder
    was found only by the launched server, after servers.json and the logs were written (s19 fresh-user run)."""
    from benchmarks import run_chat

    good = [{"arm": "w16", "kind": "dasc", "flags": ["--dasc-plan", "{plans}/w16-tp1-off"]}]
    (tmp_path / "arms.json").write_text(json.dumps(good))
    (tmp_path / "broken.json").write_text('[{"arm": "dense",')
    (tmp_path / "flagless.json").write_text(json.dumps([{"arm": "dense", "kind": "dense"}]))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "plans" / "w16-tp1-off").mkdir(parents=True)
    work = tmp_path / "w"

    def up(arms_json, plans=tmp_path / "plans", model=tmp_path / "m", arms=()):
        rc = run_chat.main(["up", "--arms-json", str(arms_json), "--plans", str(plans), "--model", str(model),
                            "--launcher", "false", "--max-running-requests", "4", "--work", str(work),
                            *(["--arms", *arms] if arms else [])])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and not work.exists(), (rc, err)
        return err[0]

    assert up(tmp_path / "nope.json").startswith(f"error: {tmp_path / 'nope.json'}: does not exist (expected the "
                                                 "arms.json")
    assert up(tmp_path).startswith(f"error: {tmp_path}: is a folder, not the arms.json")          # a folder
    assert up(tmp_path / "broken.json").startswith(f"error: {tmp_path / 'broken.json'}: not a readable arms.json")
    assert up(tmp_path / "flagless.json") == (f"error: {tmp_path / 'flagless.json'}: entry 0: expected an object "
                                              "with 'arm', 'kind' and a list of string 'flags'")
    assert up(tmp_path / "arms.json", model=tmp_path / "nope") == (
        f"error: --model {tmp_path / 'nope'}: expected the served model's folder with a config.json")
    assert up(tmp_path / "arms.json", plans=tmp_path / "nope").startswith(f"error: --plans {tmp_path / 'nope'}: not a folder")
    # an arm twice would start two servers of which servers.json keeps one: `down` then leaves the other running
    assert up(tmp_path / "arms.json", arms=("w16", "w16")) == "error: --arms w16 w16: an arm named twice; expected each arm once"
    assert up(tmp_path / "arms.json", plans=tmp_path / "m") == (
        f"error: w16: its plan {tmp_path / 'm' / 'w16-tp1-off'} does not exist (arms.json names "
        f"{{plans}}/w16-tp1-off; --plans {tmp_path / 'm'})")


def test_port_busy_only_while_someone_listens():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.listen()
        assert ss.port_busy(port) and not ss.healthy(port)
    assert not ss.port_busy(port)


def test_server_env_carries_the_arms_env_only_and_pins_the_gpus(monkeypatch):
    monkeypatch.setenv("DASC_RECLAIM_WAIT", "stream")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    arm = {"arm": "dasc-nr-w512-hostwait", "env": {"DASC_RECLAIM_WAIT": "host", "CUDA_VISIBLE_DEVICES": "9"}}
    env = ss.server_env(arm, [0, 1])
    assert env["DASC_RECLAIM_WAIT"] == "host" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["PYTHONUNBUFFERED"] == "1" and env["PATH"] == os.environ["PATH"]
    plain = ss.server_env({"arm": "dense"}, [3])      # arms JSON written before the env field existed
    assert "DASC_RECLAIM_WAIT" not in plain and plain["CUDA_VISIBLE_DEVICES"] == "3"
    # an A/B knob exported in the launching shell reaches only the arm that names it
    monkeypatch.setenv("DASC_EVICT_SHADOWED_FIRST", "1")
    monkeypatch.setenv("DASC_PLAN", "/tmp/some-plan")
    twin = {"arm": "dasc-nr-w16-shadowfirst", "env": {"DASC_EVICT_SHADOWED_FIRST": "1"}}
    # a plain dasc arm of an arms JSON written before the rule became the runtime's default keeps the LRU
    assert ss.server_env({"arm": "dasc-nr-w16", "env": {}}, [0])["DASC_EVICT_SHADOWED_FIRST"] == "0"
    assert ss.server_env({"arm": "w16", "kind": "dasc"}, [0])["DASC_EVICT_SHADOWED_FIRST"] == "0"
    assert ss.server_env(twin, [0])["DASC_EVICT_SHADOWED_FIRST"] == "1"
    assert not any(k.startswith("DASC_") for k in ss.server_env({"arm": "dense"}, [0]))


def _fake_nvidia_smi(tmp_path) -> Path:
    """An nvidia-smi that names GPU 1 an H200 and any other an H100."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text('#!/bin/sh\n[ "$4" = 1 ] && echo "NVIDIA H200" || echo "NVIDIA H100 80GB HBM3"\n')
    smi.chmod(0o755)
    return smi


def test_gpu_name_reads_nvidia_smi_and_is_none_without_it(tmp_path, monkeypatch):
    from benchmarks import card

    monkeypatch.setenv("PATH", str(_fake_nvidia_smi(tmp_path).parent))
    assert (card.gpu_name(0), card.gpu_name(1)) == ("NVIDIA H100 80GB HBM3", "NVIDIA H200")
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert card.gpu_name(0) is None


def test_the_report_carries_the_card_and_refuses_to_pair_two(tmp_path, capsys):
    """servers.json records each server's card (run_chat up); the summary names it, --gpu-name names it for folders
    from before, and a Dense run on one card never pairs with a dasc run on another."""
    w = _work(tmp_path)
    servers = {"dense": {"gpu": "NVIDIA H100 80GB HBM3"}, "w16": {"gpu": "NVIDIA H100 80GB HBM3"}}
    (w / "servers.json").write_text(json.dumps(servers))
    assert {r["gpu"] for r in srun.collect([w], exclude_calls=[1])} == {"NVIDIA H100 80GB HBM3"}
    assert sr.main([str(w), "--model", "m", "--decays", "init", "--out", str(tmp_path / "a"), "--exclude-call", "1"]) == 0
    assert {o["gpu"] for o in json.loads((tmp_path / "a" / "summary.json").read_text())} == {"NVIDIA H100 80GB HBM3"}
    assert "GPU: NVIDIA H100 80GB HBM3." in (tmp_path / "a" / "tables.md").read_text()
    err = _report_error(capsys, w, "--model", "m", "--decays", "init", "--out", tmp_path / "b",
                        "--gpu-name", "NVIDIA H200", "--exclude-call", 1)
    assert "--gpu-name 'NVIDIA H200': every work folder records its card ('NVIDIA H100 80GB HBM3')" in err
    assert not (tmp_path / "b").exists()
    servers["w16"]["gpu"] = "NVIDIA H200"
    (w / "servers.json").write_text(json.dumps(servers))
    err = _report_error(capsys, w, "--model", "m", "--decays", "init", "--out", tmp_path / "c", "--exclude-call", 1)
    assert "2 kinds of card" in err and not (tmp_path / "c").exists()
    (w / "servers.json").write_text("{}")       # a folder from before the card was recorded
    assert sr.main([str(w), "--model", "m", "--decays", "init", "--out", str(tmp_path / "d"),
                    "--gpu-name", "NVIDIA H200", "--exclude-call", "1"]) == 0
    assert {o["gpu"] for o in json.loads((tmp_path / "d" / "summary.json").read_text())} == {"NVIDIA H200"}


def test_log_tail_filters_and_cuts(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("a dasc: 1\nb\nc dasc: 2\n" + "d" * 900 + "\n")
    assert ss.log_tail(log, "dasc:", 5) == ["a dasc: 1", "c dasc: 2"]
    assert ss.log_tail(log, n=1) == ["d" * 600]
    assert ss.log_tail(tmp_path / "missing.log") == []


# ---------------------------------------------------------------- report

def _run(arm, seed, ttft, *, role="arm", call="w#0", wall=10.0, cond=("closed-loop-paper", "served-reply", 0, 256, 24, None, 24, 0),
         trace="t.json.gz"):
    return {"arm": arm, "seed": seed, "role": role, "call": call, "cond": cond, "launch": None, "max_running": 8,
            "trace": trace, "draw": f"{trace.removesuffix('.json.gz')}/{seed}",
            "mean_ttft_s": ttft, "p95_ttft_s": ttft, "mean_e2e_s": 2 * ttft, "hit_rate": 0.5, "reuse_bound": 0.7,
            "prefill_tokens_saved": 10, "ttft_hit_s": ttft, "ttft_miss_s": ttft, "later_turns": 3, "reply_end": 1,
            "prompt_end": 1, "lost": 1, "lost_reply_stored": 1, "lost_prompt_only": 0, "first_shared_hits": 0, "first_turns_mid": 0, "first_shared_hits_mid": 0, "first_shared_whole": 0, "first_shared_whole_mid": 0, "lost_shared_hit": 0, "away_lost_s": [20.0 + seed],
            "away_hit_s": [2.0, 4.0 + seed], "queue_s": 0.1, "prefill_s": 0.2, "initial_prompt_mean": 4000.0,
            "context_max": 9000, "inflight_mean": 20.0, "inflight_arrivals_mean": 21.0, "inflight_max": 30, "stable": True, "wall_s": wall, "failed": 0, "requests": 4}


def test_arrival_window_load_counts_only_while_conversations_arrive():
    # first turns start at 0, 1 and 4 s; samples after 4 s are the drain and stay out of the mean
    result = {"records": [{"turn": 0, "start_s": t} for t in (0.0, 1.0, 4.0)] + [{"turn": 1, "start_s": 9.0}],
              "inflight": [(0.0, 1), (2.0, 3), (4.0, 2), (6.0, 7), (8.0, 1)]}
    mean, peak = srun.arrival_window_load(result)
    assert mean == pytest.approx(2.0) and peak == 7
    assert math.isnan(srun.arrival_window_load({"records": [], "inflight": []})[0])


def test_live_conversations_by_hand():
    """A: 0-10 s; B: two turns 5-7 and 12-15 (live 5-15, its think time included); C: 20-22; D ends at 20
    as C starts (an end first: no instant with both). Live 1, 2, 1, 0 + D, 1 over 0-22 s."""
    rec = [{"conv": "A", "start_s": 0.0, "end_s": 10.0}, {"conv": "B", "start_s": 5.0, "end_s": 7.0},
           {"conv": "B", "start_s": 12.0, "end_s": 15.0}, {"conv": "C", "start_s": 20.0, "end_s": 22.0},
           {"conv": "D", "start_s": 16.0, "end_s": 20.0}, {"conv": "E", "start_s": None, "end_s": None}]
    mean, peak = srun.live_conversations(rec)
    # area: 0-5 x1, 5-10 x2, 10-15 x1, 16-20 x1 (D), 20-22 x1 (C) = 5 + 10 + 5 + 4 + 2 = 26 over 22 s
    assert peak == 2 and mean == pytest.approx(26 / 22)
    back_to_back = [{"conv": "X", "start_s": 0.0, "end_s": 5.0}, {"conv": "Y", "start_s": 5.0, "end_s": 10.0}]
    assert srun.live_conversations(back_to_back) == (1.0, 1)     # one ends as the next starts: never two
    assert srun.live_conversations([]) == (pytest.approx(float("nan"), nan_ok=True), 0)


def test_unstable_runs_are_reported_not_averaged():
    """Issue 24 item 2: a run whose open-loop queue grew is reported as unstable, not averaged. Seed 1's
    Dense run grew: the w16 ratio pairs seed 0 only, Dense's mean TTFT is seed 0's, and both say which seed."""
    ol = ("open-loop", "served-reply", 0, 256, None, 0.4, 24, 0)
    runs = [_run("dense", 0, 2.0, cond=ol), {**_run("dense", 1, 40.0, cond=ol), "stable": False},
            _run("w16", 0, 1.0, cond=ol), _run("w16", 1, 3.0, cond=ol)]
    dense, w16 = sr.summarize(runs, model="m", decays="d")
    assert dense["stable"] is False and dense["unstable_seeds"] == ["t/1"] and dense["mean_ttft_s"] == 2.0
    assert w16["stable"] is True and w16["unstable_seeds"] == [] and w16["mean_ttft_s"] == 2.0   # both its runs
    assert w16["ttft_ratio_vs_dense_by_seed"] == {"t/0": 0.5} and w16["mean_ttft_ratio_vs_dense"] == 0.5
    assert dense["inflight_mean"] == 20.0       # the in-flight load counts every run, the unstable one too
    from benchmarks.serving_tables import markdown
    text = markdown(sr.summarize(runs, model="m", decays="d"))
    assert "(UNSTABLE: the queue grew in t/1; left out of the means and ratios)" in text


def test_summary_pairs_ratios_by_seed_and_has_the_issue_keys():
    runs = [_run("dense", 0, 2.0), _run("dense", 1, 4.0), _run("w16", 0, 1.0), _run("w16", 1, 3.0),
            _run("dense", 0, 2.2, role="drift")]
    objs = sr.summarize(runs, model="m", decays="d")
    assert [o["arm"] for o in objs] == ["dense", "w16"]
    assert set(sr.SUMMARY_KEYS) <= set(objs[0])
    w16 = objs[1]
    # paired: mean(1/2, 3/4) = 0.625, not the ratio of means 2/3
    assert w16["mean_ttft_ratio_vs_dense"] == pytest.approx(0.625)
    assert w16["ttft_ratio_vs_dense_spread"]["min"] == pytest.approx(0.5)
    assert w16["seeds"] == [0, 1] and w16["seed_kind"] == "trace"
    assert objs[0]["dense_drift"]["mean"] == pytest.approx(1.1) and objs[0]["drift"]["mean"] == pytest.approx(1.1)
    assert "TTFT / Dense" in sr.markdown(objs) and "Dense drift over a call 1.100 (n=1)" in sr.markdown(objs)


def test_a_call_whose_baseline_is_int8_reports_int8s_drift_not_denses():
    """chat_bench BASELINE=int8 (no Dense arm): INT8 opens and closes the call; its drift is the one reported."""
    runs = [_run("int8", 0, 2.0), _run("int8", 1, 4.0), _run("w16", 0, 1.0), _run("w16", 1, 3.0),
            _run("int8", 0, 1.8, role="drift")]
    runs[2]["mean_e2e_s"], runs[3]["mean_e2e_s"] = 3.0, 4.0      # E2E ratios 3/4 and 4/8: paired mean 0.625
    runs[1]["mean_e2e_s"] = 8.0
    objs = sr.summarize(runs, model="m", decays="d")
    int8, w16 = objs
    assert int8["drift"]["mean"] == pytest.approx(0.9) and int8["dense_drift"] is None and w16["drift"] is None
    assert w16["mean_ttft_ratio_vs_int8"] == pytest.approx(0.625) and w16["mean_ttft_ratio_vs_dense"] is None
    assert w16["mean_e2e_ratio_vs_int8"] == pytest.approx(0.625) and w16["e2e_ratio_vs_int8_spread"]["min"] == pytest.approx(0.5)
    assert int8["mean_e2e_ratio_vs_int8"] is None and w16["mean_e2e_ratio_vs_dense"] is None
    md = sr.markdown(objs)
    assert "INT8 drift over a call 0.900 (n=1)" in md and "Dense drift" not in md
    assert "| E2E / INT8 |" in md and "| — | 0.625 |" in md


def test_a_condition_measured_under_two_baselines_reports_both_drifts():
    """Session 41: one call bracketed by Dense, a later one (same condition) by INT8; the header gave Dense's drift
    only, and INT8's sat in summary.json alone."""
    runs = [_run("dense", 0, 2.0, call="w#0"), _run("int8", 0, 1.5, call="w#0"), _run("dense", 0, 2.2, role="drift",
            call="w#0"), _run("int8", 1, 1.0, call="w#1"), _run("dense", 1, 2.0, call="w#1"),
            _run("int8", 1, 1.1, role="drift", call="w#1")]
    md = sr.markdown(sr.summarize(runs, model="m", decays="d"))
    assert "Dense drift over a call 1.100 (n=1); INT8 drift over a call 1.100 (n=1)" in md


def test_seed_numbers_of_two_traces_are_different_draws():
    """Seed 0 of another trace is another sample of conversations: it neither pairs with this trace's
    seed 0 nor counts as the same seed twice."""
    runs = [_run("dense", 0, 2.0), _run("w16", 0, 1.0), _run("w16", 0, 3.0, trace="x1.json.gz"),
            _run("dense", 0, 6.0, trace="x1.json.gz")]
    w16 = sr.summarize(runs, model="m", decays="d")[1]
    assert w16["ttft_ratio_vs_dense_by_seed"] == {"t/0": pytest.approx(0.5), "x1/0": pytest.approx(0.5)}
    assert w16["seeds"] == ["t/0", "x1/0"] and w16["traces"] == ["t.json.gz", "x1.json.gz"]
    runs[3] = _run("dense", 0, 2.0)     # only this trace's Dense: x1's seed 0 has no pair
    with pytest.raises(Exception, match="dense seed 0 is counted twice"):
        sr.summarize(runs + [_run("dense", 0, 2.0)], model="m", decays="d")
    assert sr.summarize(runs[:3], model="m", decays="d")[1]["ttft_ratio_vs_dense_spread"]["n"] == 1


def test_a_ratio_from_one_seed_pair_shows_no_spread_and_its_pair_count():
    # seed 1 has no Dense run: w16's ratio rests on one pair, whatever its own run count
    runs = [_run("dense", 0, 2.0), _run("w16", 0, 1.0), _run("w16", 1, 3.0)]
    objs = sr.summarize(runs, model="m", decays="d")
    w16 = objs[1]
    assert w16["mean_ttft_spread"]["n"] == 2 and w16["ttft_ratio_vs_dense_spread"]["n"] == 1
    assert w16["ttft_ratio_vs_dense_spread"]["sd"] is None
    row = next(line for line in sr.markdown(objs).splitlines() if line.startswith("| w16 |"))
    assert "0.500 (—) [0.500, 0.500], 1 |" in row


def test_summary_carries_capacity_under_load_and_old_arms_json_derives_it():
    """The 2026-12-01 H200 sizing (M = 56, R = 8): w16 81 / 41 under load, INT8 55 / 55, Dense 56 / 16; an
    arms.json from before the key gets it from its slots and flags (w64: 112 pool + max(0, 40 - 5 x 8));
    with the overlap scheduler off k is 4, so 8 of 40 native slots survive; no launch prints "—"."""
    launch = {"dense": {"kind": "dense", "capacity": 56, "capacity_under_load": 16, "ckpt_slots": 0},
              "int8": {"kind": "int8", "capacity": 55, "capacity_under_load": 55, "ckpt_slots": 55},
              "w16": {"kind": "dasc", "capacity": 81, "capacity_under_load": 41, "ckpt_slots": 41},
              "w64": {"kind": "dasc", "capacity": 152, "ckpt_slots": 112, "native_slots": 40,   # before the key
                      "flags": ["--max-running-requests", "8", "--mamba-radix-cache-strategy", "extra_buffer"]},
              "w64x": {"kind": "dasc", "capacity": 152, "ckpt_slots": 112, "native_slots": 40,
                       "flags": ["--max-running-requests", "8", "--disable-overlap-schedule"]}}
    runs = [{**_run(a, 0, t), "launch": launch[a]} for a, t in (("dense", 2.0), ("int8", 1.0), ("w16", 1.0),
                                                                   ("w64", 1.0), ("w64x", 1.0))]
    runs.append(_run("w128", 0, 1.0))                                                  # no launch at all
    objs = {o["arm"]: o for o in sr.summarize(runs, model="m", decays="d")}
    assert {a: (o["capacity"], o["capacity_under_load"]) for a, o in objs.items()} == {
        "dense": (56, 16), "int8": (55, 55), "w16": (81, 41), "w64": (152, 112), "w64x": (152, 120),
        "w128": (None, None)}
    rows = {ln.split(" | ")[0][2:]: ln for ln in sr.markdown(list(objs.values())).splitlines() if ln.startswith("| ")}
    assert "| capacity / under load |" in rows["arm"]
    assert rows["w16"].endswith("| 81 / 41 |") and rows["int8"].endswith("| 55 / 55 |")
    assert rows["dense"].endswith("| 56 / 16 |") and rows["w64"].endswith("| 152 / 112 |")
    assert rows["w128"].endswith("| — / — |")


def test_stability_rule_flags_a_growing_queue():
    flat = [[t, 10] for t in range(30)]
    growing = [[t, 10 + 2 * t] for t in range(30)]
    assert srun.stability(flat, 8) == (10, True)
    assert srun.stability(growing, 8)[1] is False
    assert srun.stability([[t, 10 + 0.2 * t] for t in range(30)], 8)[1] is True   # drifts, but less than R


def test_open_loop_rates_come_from_the_measured_saturation_throughput():
    runs = [_run("dense", 0, 2.0, wall=48.0), _run("dense", 1, 2.0, wall=60.0), _run("w16", 0, 1.0, wall=10.0)]
    out = sr.open_loop_rates(runs, [0.5, 0.7])
    assert out["x_sat"]["mean"] == pytest.approx((24 / 48 + 24 / 60) / 2)
    assert out["rates"][0.7] == pytest.approx(0.7 * 0.45) and out["saturated"]
    with pytest.raises(DascInputError, match="--rho"):
        sr.open_loop_rates(runs, [1.2])


def test_rates_name_their_card_and_refuse_two(tmp_path, capsys):
    """X_sat is a fraction of one card's work: `rates` reports the card, reads a run's own record before its
    server's, and never averages two cards' throughputs."""
    a = _work(tmp_path / "a")
    h100 = {"gpu": "NVIDIA H100 80GB HBM3"}
    (a / "servers.json").write_text(json.dumps({"dense": h100, "w16": h100}))
    assert sr.main(["rates", str(a), "--exclude-call", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["gpu"] == "NVIDIA H100 80GB HBM3"
    b = _work(tmp_path / "b")
    man = json.loads((b / "manifest.json").read_text())
    for e in man["runs"]:
        e["gpu"] = "NVIDIA H200"            # the run's own record (run_chat run) wins over servers.json's
    (b / "manifest.json").write_text(json.dumps(man))
    (b / "servers.json").write_text(json.dumps({"dense": h100, "w16": h100}))
    assert {r["gpu"] for r in srun.collect([b])} == {"NVIDIA H200"}
    assert sr.main(["rates", str(a), str(b), "--exclude-call", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "2 kinds of card" in err[0], err


# ---------------------------------------------------------------- client against the stand-in server

@pytest.fixture
def fake_server():
    port = free_port()
    p = subprocess.Popen([sys.executable, str(REPO / "tests/support/fake_sglang_server.py"), "--port", str(port),
                          "--max-running-requests", "4", "--max-mamba-cache-size", "400", "--enable-metrics"],
                         env={"FAKE_TOKEN_S": "0", "FAKE_PREFILL_S_PER_TOKEN": "0", "FAKE_BASE_S": "0"})
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    assert ss.healthy(port) and ss.flush(port)
    yield port
    p.kill()
    p.wait()


@pytest.mark.parametrize("replay", ["served-reply", "recorded-reply"])
def test_client_replays_chat_and_the_report_accounts_for_every_hit(fake_server, tmp_path, replay):
    out = tmp_path / f"{replay}.json.gz"
    rc = cr.main(["--trace", str(TRACE), "--url", f"http://127.0.0.1:{fake_server}", "--arm", "dense", "--seed", "1",
                  "--conversations-per-seed", "4", "--clients", "4", "--decode-clip", "64", "--replay", replay,
                  "--out", str(out)])
    assert rc == 0
    res = cr.read_json(out)
    recs = res["records"]
    assert sorted(r["conv"] for r in recs if r["turn"] == 0) == sorted(seed_conversations(8, 4, 1))
    assert all(r["success"] and r["completion_tokens"] == r["max_new_tokens"] for r in recs)
    assert all(not math.isnan(r["queue_s"]) and r["prefill_s"] >= 0 for r in recs)   # SGLang's metrics read
    later = [r for r in recs if r["turn"] > 0]
    # the stand-in caches prompt + reply: only a served reply lets a later turn hit beyond the previous prompt
    beyond = sum(r["cached_tokens"] > r["prev_prompt_tokens"] for r in later)
    if replay == "served-reply":
        assert beyond >= len(later) // 2
    else:
        assert beyond == 0 and all(0 < r["cached_tokens"] <= r["prev_prompt_tokens"] for r in later)
    assert all(r["cached_tokens"] <= r["reuse_bound"] for r in later)
    st = srun.run_stats(res, max_running=4)
    assert st["reply_end"] + st["prompt_end"] + st["lost"] <= st["later_turns"] == len(later)
    assert st["reply_end"] == beyond


def test_open_loop_arrivals_and_think_times_depend_on_the_seed_alone():
    a = cr.arrival_offsets(2000, 0.317, 1)
    assert a == cr.arrival_offsets(2000, 0.317, 1) and a[:24] != cr.arrival_offsets(24, 0.317, 2)
    assert a[0] == 0 and all(y > x for x, y in zip(a, a[1:]))
    gaps = [y - x for x, y in zip(a, a[1:])]
    assert abs(sum(gaps) / len(gaps) - 1 / 0.317) < 3 * (1 / 0.317) / len(gaps) ** 0.5   # mean 1/rate within 3 SE
    t = cr.think_times(1, 5, 10.0)
    assert t == cr.think_times(1, 5, 10.0) and t != cr.think_times(1, 6, 10.0) and t != cr.think_times(2, 5, 10.0)
    assert cr.think_times(1, 5, 0.0)[:3] == [0.0, 0.0, 0.0]


def test_two_arms_of_a_seed_see_the_same_arrivals_and_pauses(fake_server, tmp_path, monkeypatch):
    """Common random numbers: a slower server (the second run) must not shift when sessions start or how
    long they think; before session 14 one generator fed both, drawn in the order threads finished."""
    real = cr.generate
    starts = {}
    for delay in (0.0, 0.25):       # the slow arm's delay well above scheduling jitter on a loaded 2-core machine
        monkeypatch.setattr(cr, "generate", lambda *a, _d=delay, **k: (real(*a, **k), time.sleep(_d))[0])
        out = tmp_path / f"d{delay}.json.gz"
        assert cr.main(["--trace", str(TRACE), "--url", f"http://127.0.0.1:{fake_server}", "--arm", "x", "--seed", "1",
                        "--conversations-per-seed", "4", "--rate", "8", "--think-s", "0.05", "--decode-clip", "8",
                        "--out", str(out)]) == 0
        recs = cr.read_json(out)["records"]
        starts[delay] = {r["conv"]: r["start_s"] for r in recs if r["turn"] == 0}
        order = [r["conv"] for r in sorted(recs, key=lambda r: r["start_s"]) if r["turn"] == 0]
        # each start at its Poisson offset, within scheduling jitter (a start 50 ms late was seen in CI with two
        # suites sharing 2 cores; rounding to 0.1 s flipped on it)
        offsets = cr.arrival_offsets(4, 8, 1)
        assert all(abs(starts[delay][c] - t) < 0.1 for c, t in zip(order, offsets)), (starts[delay], offsets)
    assert all(abs(starts[0.0][c] - starts[0.25][c]) < 0.1 for c in starts[0.0])   # a shift by one reply: >= 0.25 s


def test_client_refuses_bad_input_with_one_line(tmp_path, capsys):
    base = ["--trace", str(TRACE), "--url", "http://127.0.0.1:9", "--arm", "x", "--seed", "0",
            "--conversations-per-seed", "4", "--out", str(tmp_path / "o.json")]
    assert cr.main(base) == 2 and "exactly one of --clients" in capsys.readouterr().err
    assert cr.main(base + ["--clients", "2", "--replay", "echo"]) == 2 and "--replay" in capsys.readouterr().err
    assert cr.main(base + ["--clients", "2", "--seed", "5"]) == 2 and "disjoint seeds" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


@pytest.mark.parametrize("extra, needle", [
    (["--vocab-size", "0"], "--vocab-size"),            # was: ZeroDivisionError in every client thread, exit 0
    (["--sample-s", "0"], "--sample-s"),                # was: a sampler spinning without a pause
    (["--timeout-s", "-1"], "--timeout-s"),             # was: every request failed, result written
    (["--url", "localhost:30000"], "--url"),            # was: sent to 127.0.0.1:80 (no scheme: no host parsed)
    (["--url", "https://127.0.0.1:30000"], "--url"),    # plain HTTP only
    (["--url", "http://127.0.0.1:30000/v1"], "--url"),  # the path would be dropped (requests go to /generate)
    (["--out", "."], "is a folder"),                    # was: the whole run, then IsADirectoryError
])
def test_client_refuses_bad_values_before_any_request(tmp_path, capsys, monkeypatch, extra, needle):
    monkeypatch.chdir(tmp_path)
    base = ["--trace", str(TRACE), "--url", "http://127.0.0.1:9", "--arm", "x", "--seed", "0",
            "--conversations-per-seed", "2", "--clients", "2", "--out", str(tmp_path / "o.json")]
    sent = []
    monkeypatch.setattr(cr, "generate", lambda *a, **k: sent.append(a) or [])
    assert cr.main(base + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0], err
    assert not sent and not (tmp_path / "o.json").exists()


def test_open_loop_refuses_a_think_time_that_is_not_a_number(tmp_path, capsys):
    base = ["--trace", str(TRACE), "--url", "http://127.0.0.1:9", "--arm", "x", "--seed", "0",
            "--conversations-per-seed", "2", "--rate", "1", "--out", str(tmp_path / "o.json")]
    assert cr.main(base + ["--think-s", "nan"]) == 2 and "--think-s" in capsys.readouterr().err


def _work(tmp_path, rate=None) -> Path:
    """A run_chat work folder of four runs over two calls (dense and w16, one closing drift run); ``rate``: the
    runs are open-loop at that many conversations/s."""
    w = tmp_path / "w"
    (w / "runs").mkdir(parents=True)
    rec = {"conv": 0, "turn": 0, "source_id": "a", "prompt_tokens": 100, "max_new_tokens": 4, "reuse_bound": 0,
           "prev_prompt_tokens": 0, "start_s": 0, "end_s": 1, "ttft_s": 1.0, "e2e_s": 2.0, "cached_tokens": 0,
           "completion_tokens": 4, "queue_s": 0.1, "prefill_s": 0.2, "success": True, "error": ""}
    runs = []
    for i, (arm, role, ttft, call) in enumerate([("dense", "arm", 9.0, 0), ("w16", "arm", 1.0, 0),
                                                  ("dense", "drift", 2.0, 0), ("w16", "arm", 5.0, 1)]):
        f = f"{arm}_{i}.json.gz"
        cfg = {"protocol": "open-loop" if rate else "closed-loop-paper", "replay": "served-reply", "pad_tokens": 0,
               "decode_clip": 4, "clients": None if rate else 2, "rate": rate, "conversations_per_seed": 2}
        cr.write_json(w / "runs" / f, {"config": cfg, "records": [{**rec, "ttft_s": ttft}], "inflight": [], "wall_s": 1})
        runs.append({"call": call, "index": i, "arm": arm, "seed": 0, "role": role, "file": f, "rc": 0})
    (w / "manifest.json").write_text(json.dumps({"runs": runs, "calls": [{}, {}]}))
    (w / "servers.json").write_text(json.dumps({a: {"pid": 1, "port": 1, "up_s": 1.0} for a in ("dense", "w16")}))
    return w


def test_a_folder_without_servers_json_is_reported_with_a_warning(tmp_path, capsys):
    w = _work(tmp_path)
    (w / "servers.json").unlink()
    assert sr.main([str(w), "--model", "m", "--decays", "init", "--out", str(tmp_path / "rep"),
                    "--exclude-call", "1"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: {w}: no servers.json") and "capacity unknown" in err[0]
    # one that lacks an arm names it
    (w / "servers.json").write_text(json.dumps({"dense": {"pid": 1, "port": 1, "up_s": 1.0}}))
    assert sr.main([str(w), "--model", "m", "--decays", "init", "--out", str(tmp_path / "rep1"),
                    "--exclude-call", "1"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: {w / 'servers.json'}: no entry for w16: w16 taken as 8")
    # with it, nothing on stderr
    _work(tmp_path / "again")
    assert sr.main([str(tmp_path / "again" / "w"), "--model", "m", "--decays", "init", "--out",
                    str(tmp_path / "rep2"), "--exclude-call", "1"]) == 0
    assert capsys.readouterr().err == ""


def test_report_excludes_a_call_and_lets_the_closing_run_stand_in(tmp_path):
    w = _work(tmp_path)
    got = srun.collect([w], exclude_calls=[1], exclude_runs=["dense_0.json.gz"])
    assert sorted((r["arm"], r["role"], r["mean_ttft_s"]) for r in got) == [("dense", "arm", 2.0), ("w16", "arm", 1.0)]
    o = {x["arm"]: x for x in sr.summarize(got, model="m", decays="d")}
    assert o["w16"]["mean_ttft_ratio_vs_dense"] == pytest.approx(0.5)
    assert o["w16"]["ttft_ratio_vs_dense_by_seed"] == {"/0": pytest.approx(0.5)}     # the fixture names no trace
    assert o["dense"]["ttft_ratio_vs_dense_by_seed"] is None


def test_closing_baseline_pairs_each_seed_with_the_run_after_the_other_arms(tmp_path, capsys):
    """Session 18: the opening Dense run paid first-use compiles (drift 0.59-0.82 on three seeds), so the
    ratio against it (0.78x) and against the closing run (0.90x) differ; --baseline-run closing gives the
    second without one --exclude-run per seed."""
    w = _work(tmp_path)
    opening = {x["arm"]: x for x in sr.summarize(srun.collect([w], exclude_calls=[1]), model="m", decays="d")}
    got = srun.collect([w], exclude_calls=[1], baseline_run="closing")
    assert sorted((r["arm"], r["role"], r["mean_ttft_s"]) for r in got) == [("dense", "arm", 2.0), ("w16", "arm", 1.0)]
    closing = {x["arm"]: x for x in sr.summarize(got, model="m", decays="d", baseline_run="closing")}
    assert opening["w16"]["mean_ttft_ratio_vs_dense"] == pytest.approx(1 / 9)
    assert closing["w16"]["mean_ttft_ratio_vs_dense"] == pytest.approx(0.5)
    assert opening["dense"]["drift"]["mean"] == pytest.approx(2 / 9) and closing["dense"]["drift"] is None
    assert (opening["w16"]["baseline_run"], closing["w16"]["baseline_run"]) == ("opening", "closing")
    assert "baseline: each seed's closing run" in sr.markdown(list(closing.values()))
    assert "baseline: each seed" not in sr.markdown(list(opening.values()))
    # the same through both commands' flag
    from benchmarks import ttft_account
    assert sr.main([str(w), "--model", "m", "--decays", "init", "--out", str(tmp_path / "rep"), "--exclude-call", "1",
                    "--baseline-run", "closing"]) == 0
    assert json.loads((tmp_path / "rep" / "summary.json").read_text())[1]["mean_ttft_ratio_vs_dense"] == pytest.approx(0.5)
    capsys.readouterr()
    assert ttft_account.main([str(w), "--arm", "w16", "--exclude-call", "1", "--baseline-run", "closing"]) == 0
    assert "| 2.000 | 1.000 | 0.500 |" in capsys.readouterr().out


def test_closing_baseline_refuses_a_seed_without_a_closing_run(tmp_path, capsys):
    """A baseline run with no closing run in its call would silently stay the opening baseline of its seed."""
    w = _work(tmp_path)
    man = json.loads((w / "manifest.json").read_text())
    man["runs"].append({"call": 1, "index": 4, "arm": "dense", "seed": 1, "role": "arm", "file": "dense_4.json.gz", "rc": 0})
    (w / "manifest.json").write_text(json.dumps(man))
    (w / "runs" / "dense_4.json.gz").write_bytes((w / "runs" / "dense_0.json.gz").read_bytes())
    with pytest.raises(DascInputError, match=r"dense \(the arm that bracketed its calls, chat_bench.s BASELINE\) seed 1 .* has no closing run in its call 1"):
        srun.collect([w], exclude_runs=["w16_3.json.gz"], baseline_run="closing")
    assert len(srun.collect([w], exclude_calls=[1], baseline_run="closing")) == 2
    err = _report_error(capsys, w, "--model", "m", "--decays", "init", "--out", tmp_path / "rep", "--exclude-call", 0,
                        "--baseline-run", "closing")
    assert "no counted closing (drift) run" in err
    assert not (tmp_path / "rep").exists()


def test_report_names_counted_runs_that_were_an_arms_first_timed_run(tmp_path):
    """Leaving out the start-up call does not cover an arm whose first timed run came later: the report
    names such runs (w16's first run is in call 0; excluding call 0 makes its call-1 run first-counted
    only if it was its first overall, which it is not)."""
    w = _work(tmp_path)
    got = srun.collect([w], exclude_calls=[0])
    assert [(r["arm"], r["first_timed"]) for r in got] == [("w16", False)]
    assert sr.first_timed_note(got) == ""
    got = srun.collect([w])
    assert sorted((r["arm"], r["role"], r["first_timed"]) for r in got) == [
        ("dense", "arm", True), ("dense", "drift", False), ("w16", "arm", False), ("w16", "arm", True)]
    assert sr.first_timed_note(got).strip() == (
        "Counted runs that were their arm's first timed run (first-use slowness not excluded): "
        "dense seed 0 (call 0); w16 seed 0 (call 0).")


def test_report_refuses_a_seed_counted_twice(tmp_path, capsys):
    """w16 ran seed 0 in both calls: pairing took the last run silently and n counted one trace draw twice
    (it happened when pooling sessions that reused seeds)."""
    w = _work(tmp_path)
    err = _report_error(capsys, w, "--model", "m", "--decays", "init", "--out", tmp_path / "rep")
    assert "w16 seed 0 is counted twice" in err and "w16_1.json.gz" in err and "w16_3.json.gz" in err
    assert not (tmp_path / "rep").exists()
    assert sr.main([str(w), "--model", "m", "--decays", "init", "--out", str(tmp_path / "rep"),
                    "--exclude-run", "w16_3.json.gz"]) == 0


def test_report_refuses_a_result_file_two_runs_name(tmp_path, capsys):
    """Session 36: a closed-loop Dense run of seed 4 in call 2 wrote over call 1's open-loop Dense run of seed 4
    (the names lacked load and call); the report then paired the saturation run as if it were the opening run.
    A file two counted runs name is refused with both calls; leaving one call out lets the other stand."""
    w = _work(tmp_path)
    man = json.loads((w / "manifest.json").read_text())
    man["runs"][3]["file"] = man["runs"][1]["file"]          # w16 of call 1 wrote over w16 of call 0
    (w / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(DascInputError, match=r"w16_1.json.gz: named by two runs .*w16 seed 0 of call 0 and w16 "
                                             r"seed 0 of call 1\): the later run wrote over"):
        srun.collect([w])
    err = _report_error(capsys, w, "--model", "m", "--decays", "init", "--out", tmp_path / "rep")
    assert "named by two runs" in err and not (tmp_path / "rep").exists()
    assert sorted((r["arm"], r["role"], r["mean_ttft_s"]) for r in srun.collect([w], exclude_calls=[1])) == [
        ("dense", "arm", 9.0), ("dense", "drift", 2.0), ("w16", "arm", 1.0)]
    # a later run that did not finish (cut by the deadline) wrote nothing: call 0's file stands, no refusal
    man["runs"][3]["rc"] = -9
    (w / "manifest.json").write_text(json.dumps(man))
    assert ("w16", "arm", 1.0) in {(r["arm"], r["role"], r["mean_ttft_s"]) for r in srun.collect([w])}


def test_report_refuses_a_result_file_whose_load_is_not_its_calls(tmp_path):
    """Leaving out the wrong call of an overwritten file (session 36's fresh-user trial: --exclude-call 2 kept call 1's
    entry, whose file held call 2's closed-loop run, and reported it as open-loop Dense): the run's own config is
    checked against its call's recorded load."""
    w = _work(tmp_path)
    man = json.loads((w / "manifest.json").read_text())
    man["calls"] = [{"settings": {"rate": None, "clients": 2}}, {"settings": {"rate": None, "clients": 2}}]
    (w / "manifest.json").write_text(json.dumps(man))
    assert len(srun.collect([w], exclude_runs=["w16_3.json.gz"])) == 3          # every file at its call's load
    res = cr.read_json(w / "runs" / "w16_3.json.gz")
    res["config"] = {**res["config"], "protocol": "open-loop", "clients": None, "rate": 0.5}
    cr.write_json(w / "runs" / "w16_3.json.gz", res)
    with pytest.raises(DascInputError, match=r"w16_3.json.gz: an open-loop run \(rate 0.5\), but manifest.json lists "
                                             r"it as w16 seed 0 of call 1, a closed-loop call \(clients 2\): another "
                                             r"call's run wrote over it; leave call 1 out with --exclude-call 1"):
        srun.collect([w], exclude_runs=["w16_1.json.gz"])


def test_report_excludes_a_run_by_path_from_one_folder_only(tmp_path, capsys):
    """Two sessions' folders held a Dense run of one file name (dense seed 3 ran alone in session 14 and
    in its pair in session 17): WORK/runs/NAME leaves it out of that folder only; a bare name that two folders
    hold is refused (leaving out both moved a pooled headline from 0.777 to 0.841 without a word, s19 audit)."""
    a, b = _work(tmp_path / "a"), _work(tmp_path / "b")
    by_path = srun.collect([a, b], exclude_calls=[1], exclude_runs=[str(a / "runs" / "dense_0.json.gz")])
    assert sorted((Path(r["work"]).parent.name, r["arm"], r["role"]) for r in by_path) == [
        ("a", "dense", "arm"), ("a", "w16", "arm"), ("b", "dense", "arm"), ("b", "dense", "drift"), ("b", "w16", "arm")]
    # in folder a the closing run stands in as the baseline; b keeps its opening run and its drift run
    assert [r["mean_ttft_s"] for r in by_path if r["work"] == str(a) and r["arm"] == "dense"] == [2.0]
    err = _report_error(capsys, a, b, "--model", "m", "--decays", "init", "--out", tmp_path / "rep",
                        "--exclude-call", "1", "--exclude-run", "dense_0.json.gz")
    assert "--exclude-run dense_0.json.gz: runs of that name are in 2 of the work folders" in err
    assert str(a / "runs" / "dense_0.json.gz") in err and str(b / "runs" / "dense_0.json.gz") in err
    # one folder: the bare name is unambiguous
    by_name = srun.collect([a], exclude_calls=[1], exclude_runs=["dense_0.json.gz"])
    assert [r["mean_ttft_s"] for r in by_name if r["arm"] == "dense"] == [2.0]
    # a path whose folder is not one of those given, or whose middle part is not runs/ (a typo that once
    # left out the run of that name silently), is refused; a path that resolves to WORK/runs/NAME is not
    for bad in (tmp_path / "c" / "w" / "runs" / "dense_0.json.gz", a / "rnus" / "dense_0.json.gz",
                a / "dense_0.json.gz"):
        err = _report_error(capsys, a, "--model", "m", "--decays", "init", "--out", tmp_path / "rep", "--exclude-run", bad)
        assert f"--exclude-run {bad}: expected" in err and "WORK one of the work folders given" in err
    assert not (tmp_path / "rep").exists()
    odd = str(a / "runs" / "x" / ".." / "dense_0.json.gz")
    assert [r["mean_ttft_s"] for r in srun.collect([a], exclude_calls=[1], exclude_runs=[odd])
            if r["arm"] == "dense"] == [2.0]


def test_report_and_account_refuse_an_out_they_cannot_write_in_one_line(tmp_path, capsys):
    from benchmarks import ttft_account

    w = _work(tmp_path)
    (tmp_path / "afile").write_text("x")
    base = [w, "--model", "m", "--decays", "init", "--exclude-run", "w16_3.json.gz"]
    assert "cannot write" in _report_error(capsys, *base, "--out", tmp_path / "afile" / "sub")   # was NotADirectoryError
    assert ttft_account.main([str(w), "--arm", "w16", "--exclude-run", "w16_3.json.gz",
                              "--out", "/proc/nope.md"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: --out /proc/nope.md: cannot write")     # the table was printed first


def _report_error(capsys, *argv) -> str:
    assert sr.main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_report_refuses_bad_input_with_one_line_and_writes_nothing(tmp_path, capsys):
    """Each was a traceback, or a silent report of runs the user meant to leave out."""
    w = _work(tmp_path)
    base = [w, "--model", "m", "--decays", "init"]
    (tmp_path / "file").write_text("x")
    assert "--out" in _report_error(capsys, *base, "--out", tmp_path / "file")             # was FileExistsError
    out = tmp_path / "rep"
    assert "--exclude-call 7" in _report_error(capsys, *base, "--out", out, "--exclude-call", 7)   # was ignored
    assert "--exclude-run nope.json.gz" in _report_error(capsys, *base, "--out", out, "--exclude-run", "nope.json.gz")
    assert "--exclude-call 7" in _report_error(capsys, "rates", w, "--exclude-call", 7)
    missing = tmp_path / "nope-work"              # the folder named once, not twice (s19 fresh-user run)
    assert _report_error(capsys, "rates", missing) == f"error: {missing}: does not exist (give an unpacked run_chat work folder)"
    (w / "runs" / "w16_3.json.gz").write_bytes(b"\x1f\x8b truncated")
    assert "w16_3.json.gz" in _report_error(capsys, *base, "--out", out)                  # was a gzip traceback
    (w / "manifest.json").write_text("{")
    assert "manifest.json" in _report_error(capsys, *base, "--out", out)                  # was JSONDecodeError
    assert not out.exists()


def test_report_names_a_missing_run_file_a_folder_without_dense_and_a_bad_flag_in_one_line(tmp_path, capsys):
    """A fresh user's tries: a finished run whose result file was not unpacked was left out silently (biasing
    the pairs) and reported as 'no successful run'; `rates` on a folder without Dense did not name the folder;
    argparse printed its usage block before the error."""
    w = _work(tmp_path)
    (w / "runs" / "w16_3.json.gz").unlink()
    err = _report_error(capsys, w, "--model", "m", "--decays", "init", "--out", tmp_path / "rep")
    assert "w16_3.json.gz" in err and "is missing" in err and "--exclude-run w16_3.json.gz" in err
    assert not (tmp_path / "rep").exists()
    w = _work(tmp_path / "second")
    m = json.loads((w / "manifest.json").read_text())
    m["runs"] = [r for r in m["runs"] if r["arm"] != "dense"]
    (w / "manifest.json").write_text(json.dumps(m))
    err = _report_error(capsys, "rates", w)
    assert err.startswith(f"error: {w}: no closed-loop run of 'dense'")
    with pytest.raises(SystemExit) as e:
        sr.main(["pooled", str(tmp_path / "s.json"), "--pad", "abc"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: argument --pad"), err


def test_open_loop_runs_are_reported_at_rho_from_the_measured_saturation_throughput(tmp_path, capsys):
    """Protocol B's summary carries rho = rate / Dense's saturation throughput (issue 24 item 7); without
    --x-sat an open-loop report would have rho None, so it is refused in one line."""
    w = _work(tmp_path, rate=0.317)
    base = [w, "--model", "m", "--decays", "init", "--out", tmp_path / "rep", "--exclude-run", "w16_3.json.gz"]
    assert "--x-sat" in _report_error(capsys, *base)
    with pytest.raises(SystemExit) as e:
        sr.main([str(a) for a in base] + ["--x-sat", "-1"])
    assert e.value.code == 2 and capsys.readouterr().err.startswith("error: argument --x-sat")
    assert sr.main([str(a) for a in base] + ["--x-sat", "0.4528"]) == 0
    objs = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert {o["arm"]: o["rho"] for o in objs} == {"dense": 0.7, "w16": 0.7}       # 0.317 / 0.4528 = 0.7001
    assert all(o["protocol"] == "open-loop" and o["rate"] == 0.317 for o in objs)
    assert "rate 0.317/s (rho 0.7)" in (tmp_path / "rep" / "tables.md").read_text()


def test_regime_map_pools_sessions_by_trace_seed_and_counts_a_reused_seed_once():
    from benchmarks.serving_tables import pool_points

    def arm(by_seed, x, pad=6000, name="w16"):
        vals = list(by_seed.values())
        return {"arm": name, "protocol": "closed-loop-paper", "replay": "served-reply", "rho": None, "rate": None,
                "pad_tokens": pad, "initial_prompt_mean": x, "ttft_ratio_vs_dense_by_seed": by_seed,
                "ttft_ratio_vs_dense_spread": {"mean": sum(vals) / len(vals), "min": min(vals), "max": max(vals),
                                               "n": len(vals)}}
    s1 = [arm({"t/1": 0.6, "t/2": 0.8}, 10000.0), arm({"t/0": 1.1}, 4000.0, pad=0)]
    s2 = [arm({"t/2": 0.6, "t/7": 0.5, "u/2": 0.9}, 10200.0), {"arm": "dense", "ttft_ratio_vs_dense_spread": None}]
    pts = sorted(pool_points([s1, s2]), key=lambda p: p["x"])
    # t/2 ran in both sessions (one draw); u/2 is seed 2 of another trace (another draw)
    assert [(p["pad"], p["n"], p["seeds"], p["repeated"]) for p in pts] == [
        (0, 1, ["t/0"], []), (6000, 4, ["t/1", "t/2", "t/7", "u/2"], ["t/2"])]
    long = pts[1]
    assert long["x"] == pytest.approx(10100.0)
    assert long["mean"] == pytest.approx((0.6 + 0.7 + 0.5 + 0.9) / 4)      # t/2: (0.8 + 0.6) / 2
    assert (long["min"], long["max"]) == (pytest.approx(0.5), pytest.approx(0.9))
    old = dict(arm({"t/3": 0.9}, 9000.0))
    del old["ttft_ratio_vs_dense_by_seed"]                        # written before per-seed ratios were kept
    assert [p["n"] for p in pool_points([[old]])] == [1]


def test_regime_map_refuses_bad_input_with_one_line(tmp_path, capsys):
    summary = tmp_path / "summary.json"
    summary.write_text("[]")
    assert "nope.json" in _report_error(capsys, "map", tmp_path / "nope.json", "--out", tmp_path / "m.png")
    (tmp_path / "plan.json").write_text('{"schema_version": 3}')
    assert "a list of arm objects" in _report_error(capsys, "map", tmp_path / "plan.json", "--out", tmp_path / "m.png")
    assert "does not exist" in _report_error(capsys, "map", summary, "--out", tmp_path / "no" / "m.png")
    (tmp_path / "d").mkdir()        # was: "wrote d" while matplotlib wrote d.png
    assert "ending in .png" in _report_error(capsys, "map", summary, "--out", tmp_path / "d")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "plan.json", "summary.json"]


@pytest.mark.parametrize("argv, needle", [
    (["run", "--seeds", "0"], "no servers.json"),                                         # nothing started
    (["down"], "no servers.json"),
    (["run", "--seeds", "0", "--think-s", "3"], "--think-s: only with --rate"),
    (["run", "--seeds", "0", "--rate", "0.2", "--clients", "8"], "--clients: only without --rate"),
    (["run", "--seeds", "0", "--replay", "bogus"], "--replay"),
    (["run", "--seeds", "0", "--trace", "nope.json.gz"], "--trace nope.json.gz: no such file"),
    (["run", "--seeds", "0", "--empty-servers"], "no server came up there"),
])
def test_run_chat_refuses_what_would_run_nothing(tmp_path, capsys, argv, needle):
    """Each of these ran nothing and exited 0 (or named the baseline, not the cause)."""
    from benchmarks import run_chat

    work = tmp_path / "w"
    if "--empty-servers" in argv:
        argv = [x for x in argv if x != "--empty-servers"]
        work.mkdir()
        (work / "servers.json").write_text("{}")
    if argv[0] == "run" and "--trace" not in argv:
        argv += ["--trace", str(TRACE)]
    try:
        code = run_chat.main(argv + ["--work", str(work)])
    except SystemExit as exc:                     # argparse's refusals
        code = exc.code
    assert code == 2 and needle in capsys.readouterr().err
    assert not (work / "manifest.json").exists()


def test_run_chat_refuses_a_vocabulary_below_the_chatml_ids(tmp_path, capsys):
    """The traces and the warm-up send Qwen's ChatML ids (up to 151,645): a smaller --vocab-size reached the
    server as out-of-range token ids (and at <= 1000 a ValueError in the warm-up) instead of one line."""
    from benchmarks import run_chat

    with pytest.raises(SystemExit) as e:
        run_chat.main(["up", "--arms-json", str(tmp_path / "a.json"), "--plans", str(tmp_path), "--model", str(tmp_path),
                       "--max-running-requests", "4", "--work", str(tmp_path / "w"), "--vocab-size", "151645"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "error: --vocab-size: expected more than 151645" in err and "got 151645" in err
    assert not (tmp_path / "w").exists()


def test_summary_splits_lost_turns_and_pools_the_time_away():
    runs = [_run("dense", 0, 2.0), _run("dense", 1, 4.0)]
    o = sr.summarize(runs, model="m", decays="d")[0]
    assert o["hit_account"]["lost_reply_stored"] == 2 and o["hit_account"]["lost_prompt_only"] == 0
    # lost gaps 20, 21 and hit gaps 2, 4, 2, 5, pooled over the two seeds
    assert o["away_median_s"] == {"lost": 20.5, "hit": 3.0}


def test_a_folder_whose_runs_are_all_left_out_is_refused_not_dropped(tmp_path):
    """--exclude-call applies to every folder given: a second folder whose only runs were in that call contributed
    nothing, and the report went on without it and without a word (fresh-user trial, session 37)."""
    a = _work(tmp_path / "a")
    b = _work(tmp_path / "b")
    man = json.loads((b / "manifest.json").read_text())
    for e in man["runs"]:
        e["call"] = 1                                 # every run of b is in call 1
    (b / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(DascInputError, match=rf"{b}: no finished run of this work folder is counted \(--exclude-call "
                                             rf"1 applies to every folder given\)"):
        srun.collect([a, b], exclude_calls=[1])
    assert {r["work"] for r in srun.collect([a, b])} == {str(a), str(b)}


def test_an_exclude_call_that_names_no_call_is_said_first(tmp_path):
    """--exclude-call 9 (no such call) on a folder with an overwritten result file gave the overwritten-file refusal,
    whose advice is another --exclude-call: the typo is named first."""
    w = _work(tmp_path)
    man = json.loads((w / "manifest.json").read_text())
    man["runs"][3]["file"] = man["runs"][1]["file"]
    (w / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(DascInputError, match=r"--exclude-call 9: no such call"):
        srun.collect([w], exclude_calls=[9])
