"""Why later turns were lost (``benchmarks/turn_account.py``): the reply-end checkpoint rule against
hand-computed cases, the server's tracking interval read from ``servers.json``, and the report line."""

from __future__ import annotations

import pytest

from benchmarks import serving_tables
from benchmarks.turn_account import SGLANG_TRACK_INTERVAL, lost_turns, track_interval
from dasc_compile.errors import DascInputError


def _rec(conv, turn, prompt, reply, start, end, cached=0, bound=100, success=True):
    return {"conv": conv, "turn": turn, "prompt_tokens": prompt, "completion_tokens": reply, "start_s": start,
            "end_s": end, "cached_tokens": cached, "reuse_bound": bound, "success": success,
            "ttft_s": 0.1, "e2e_s": end - start, "queue_s": 0.0, "prefill_s": 0.05}


# A: 1000 + 30 tokens crosses 1024, a reply-end checkpoint; lost after 30 s away.
# B: 1050 + 40 = 1090 crosses 1088 (a multiple of 64) but no multiple of 256; lost after 7 s away.
# C: 500 + 100 crosses 512; its next turn hit (1 s away). D: lost with no reuse bound (nothing to hit): not lost.
RECORDS = [
    _rec("A", 0, 1000, 30, 0.0, 10.0, bound=0), _rec("A", 1, 1100, 20, 40.0, 41.0),
    _rec("B", 0, 1050, 40, 0.0, 5.0, bound=0), _rec("B", 1, 1150, 20, 12.0, 13.0),
    _rec("C", 0, 500, 100, 0.0, 3.0, bound=0), _rec("C", 1, 700, 20, 4.0, 5.0, cached=512),
    _rec("D", 0, 300, 10, 0.0, 1.0, bound=0), _rec("D", 1, 400, 10, 2.0, 3.0, bound=0),
]


def test_lost_turns_by_hand_at_sglangs_default_interval():
    got = lost_turns(RECORDS)
    assert SGLANG_TRACK_INTERVAL == 256
    assert got["lost_reply_stored"] == 1 and got["lost_prompt_only"] == 1      # A stored one, B did not
    assert sorted(got["away_lost_s"]) == [7.0, 30.0] and got["away_hit_s"] == [1.0]


def test_the_interval_decides_whether_a_reply_left_a_checkpoint():
    got = lost_turns(RECORDS, 64)                     # B's reply now crosses 1088
    assert got["lost_reply_stored"] == 2 and got["lost_prompt_only"] == 0
    # a reply ending exactly on a boundary leaves one there; ending one token short does not
    on = [_rec("E", 0, 1000, 24, 0.0, 1.0, bound=0), _rec("E", 1, 1100, 5, 2.0, 3.0)]
    short = [_rec("F", 0, 1000, 23, 0.0, 1.0, bound=0), _rec("F", 1, 1100, 5, 2.0, 3.0)]
    assert lost_turns(on)["lost_reply_stored"] == 1 and lost_turns(short)["lost_prompt_only"] == 1


def test_the_previous_turn_is_the_one_before_not_the_first_nor_the_one_listed_before():
    """Three turns, listed out of order: turn 2 is judged by turn 1 (whose reply 1,200 + 100 crosses 1,280),
    never by turn 0 (500 + 10 crosses nothing) nor by the record listed just before it."""
    recs = [_rec("A", 2, 1400, 10, 60.0, 61.0), _rec("B", 0, 300, 10, 0.0, 1.0, bound=0),
            _rec("A", 0, 500, 10, 0.0, 2.0, bound=0), _rec("A", 1, 1200, 100, 5.0, 20.0, cached=500)]
    got = lost_turns(recs)
    assert got["lost_reply_stored"] == 1 and got["lost_prompt_only"] == 0
    assert got["away_lost_s"] == [40.0] and got["away_hit_s"] == [3.0]


def test_a_prompt_end_hit_counts_among_the_hits():
    """A hit no longer than the previous prompt (its reply-end checkpoint was gone, the prompt-end one was not)
    is a hit for the time away, and not lost."""
    recs = [_rec("A", 0, 1000, 30, 0.0, 10.0, bound=0), _rec("A", 1, 1100, 20, 25.0, 26.0, cached=1000)]
    got = lost_turns(recs)
    assert got["away_hit_s"] == [15.0] and got["away_lost_s"] == [] and got["lost_reply_stored"] == 0


def test_time_away_runs_to_the_turns_scheduling():
    """SGLang's queue time counts (the closed loop's wait); a missing (NaN) one does not."""
    queued = [_rec("A", 0, 1000, 30, 0.0, 10.0, bound=0), {**_rec("A", 1, 1100, 20, 10.5, 41.0), "queue_s": 2.5},
              _rec("B", 0, 500, 100, 0.0, 3.0, bound=0), {**_rec("B", 1, 700, 20, 4.0, 5.0, cached=512),
                                                           "queue_s": float("nan")}]
    got = lost_turns(queued)
    assert got["away_lost_s"] == [3.0] and got["away_hit_s"] == [1.0]


def test_a_failed_previous_turn_counts_as_prompt_only_without_a_gap():
    recs = [_rec("A", 0, 1000, 30, 0.0, 10.0, bound=0, success=False), _rec("A", 1, 1100, 20, 40.0, 41.0)]
    assert lost_turns(recs) == {"lost_reply_stored": 0, "lost_prompt_only": 1, "away_lost_s": [],
                                "away_hit_s": []}


@pytest.mark.parametrize("server, want", [
    ({"launch": {"flags": ["--max-running-requests", "8", "--mamba-track-interval", "64"]}}, 64),
    ({"launch": {"flags": []}, "command": "python -m sglang.launch_server --mamba-track-interval=128 --port 1"}, 128),
    # the command is what ran, and SGLang's parser keeps the last value given
    ({"launch": {"flags": ["--mamba-track-interval", "64"]},
      "command": "x --mamba-track-interval 64 --mamba-track-interval=32"}, 32),
    ({"launch": {"flags": ["--max-running-requests", "8"]}, "command": "python -m sglang.launch_server"}, 256),
    (None, 256),
])
def test_track_interval_from_servers_json(server, want):
    assert track_interval(server) == want


@pytest.mark.parametrize("command", ["x --mamba-track-interval=abc", "x --mamba-track-interval=0", "x --mamba-track-interval"])
def test_a_bad_track_interval_is_one_error(command):
    with pytest.raises(DascInputError, match="--mamba-track-interval"):
        track_interval({"command": command})


def test_the_report_line_names_both_causes():
    o = {"arm": "dense", "hit_account": {"later_turns": 3, "reply_end": 0, "prompt_end": 0, "lost": 2,
                                         "lost_reply_stored": 1, "lost_prompt_only": 1},
         "away_median_s": {"lost": 18.5, "hit": 1.0}}
    line = serving_tables.lost_turns_line([o])
    assert "dense 2 (1 / 1), 18.5 s vs 1.0 s" in line
    assert serving_tables.lost_turns_line([{"arm": "x", "hit_account": {"lost": 0}}]) == ""   # summaries before the split


def test_collect_reads_each_servers_interval(tmp_path):
    """``serving_runs.collect`` judges a run by the interval its own server ran with (servers.json): a reply of
    1,050 + 40 tokens crosses a multiple of 64 but none of 256."""
    import gzip
    import json

    from benchmarks.serving_runs import collect
    w = tmp_path / "chat"
    (w / "runs").mkdir(parents=True)
    recs = [_rec("B", 0, 1050, 40, 0.0, 5.0, bound=0), _rec("B", 1, 1150, 20, 12.0, 13.0)]
    cfg = {"protocol": "open-loop", "replay": "served-reply", "pad_tokens": 0, "decode_clip": 256, "rate": 0.3,
           "conversations_per_seed": 1, "trace": "t.json.gz"}
    for arm in ("a64", "a256"):
        with gzip.open(w / "runs" / f"{arm}.json.gz", "wt") as f:
            json.dump({"format": "dasc-chat-replay", "version": 1, "config": cfg, "records": recs, "inflight": [],
                       "wall_s": 13.0}, f)
    (w / "manifest.json").write_text(json.dumps({"calls": [{}], "runs": [
        {"arm": arm, "seed": 0, "role": "arm", "call": 0, "index": i, "rc": 0, "file": f"{arm}.json.gz"}
        for i, arm in enumerate(("a64", "a256"))]}))
    (w / "servers.json").write_text(json.dumps({
        "a64": {"launch": {"flags": ["--max-running-requests", "8"]}, "command": "x --mamba-track-interval 64"},
        "a256": {"launch": {"flags": ["--max-running-requests", "8"]}, "command": "x"}}))
    got = {r["arm"]: (r["lost_reply_stored"], r["lost_prompt_only"]) for r in collect([w])}
    assert got == {"a64": (1, 0), "a256": (0, 1)}
