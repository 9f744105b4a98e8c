"""The checkpoint account (issue 24 item 5): where each state checkpoint was stored, whether it was reused,
how it left, logged as one line at every flush (``runtime/account.py``). The randomized tier test checks
the account against the tree after every operation (``tests/support/runtime_sim.py``, ``_check_account``);
here a scripted chat turn pins the values and the log line."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.support.runtime_fixtures import SGLANG_SKIP_REASON

from dasc_runtime.account import ACCOUNT_TAG, CheckpointAccount, classify_origin, parse_account_line
from dasc_runtime.tiers import TierCounters


@pytest.mark.parametrize("finished, fill, prompt, want", [
    (True, 10, 100, "reply"), (True, 300, 100, "reply"),         # finished wins whatever the length
    (False, 64, 100, "chunk"), (False, 99, 100, "chunk"),
    (False, 100, 100, "prompt"), (False, 101, 100, "prompt"),    # the first output token may be filled
    (False, 102, 100, "decode"),
])
def test_origin_of_a_cached_state(finished, fill, prompt, want):
    assert classify_origin(is_finished=finished, fill_len=fill, prompt_len=prompt) == want


def test_close_reports_changes_since_the_last_close_and_starts_again():
    acct, tc = CheckpointAccount(), TierCounters()
    acct.stored("prompt")
    acct.stored("reply")
    acct.reused("reply")
    acct.evicted("prompt", was_reused=False)
    tc.hits_compressed, tc.reclaim_wait_host_s = 3, 0.25
    first = acct.close(tc)
    assert first["origins"]["stored"] == {"chunk": 0, "prompt": 1, "decode": 0, "reply": 1}
    assert first["origins"]["evicted_unused"]["prompt"] == 1 and first["origins"]["reused"]["reply"] == 1
    assert first["tiers"]["hits_compressed"] == 3 and first["tiers"]["reclaim_wait_host_s"] == 0.25
    tc.hits_compressed = 5
    second = acct.close(tc)
    assert second["tiers"]["hits_compressed"] == 2 and second["tiers"]["reclaim_wait_host_s"] == 0
    assert sum(second["origins"]["stored"].values()) == 0 and not CheckpointAccount.is_empty(second)
    assert CheckpointAccount.is_empty(acct.close(tc))


def test_account_line_round_trip_and_cut_lines():
    line = f"[2026-12-01 12:00:00 TP0] {ACCOUNT_TAG}" + '{"origins":{"stored":{"reply":2}},"tiers":{}}'
    assert parse_account_line(line) == {"origins": {"stored": {"reply": 2}}, "tiers": {}}
    assert parse_account_line(line[:-5]) is None            # a log line cut short
    assert parse_account_line("dasc hits d/c: 1/2") is None


@pytest.mark.sglang
@pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")
def test_a_chat_turn_through_sglangs_classes(tmp_path, caplog):
    """Turn 1 (a chunked prefill, then the reply end), turn 2 extending turn 1's reply (a hit on the
    reply-end checkpoint), then every checkpoint dropped and the cache flushed: the logged account says
    chunk 1 stored and never reused, reply 2 stored and 1 reused, and restarts after the flush."""
    from tests.support.runtime_sim import Sim

    torch.set_num_threads(1)
    sim = Sim(tmp_path, streams=False, compressed_slots=5, watermark=0)

    def pick(seq):
        sim.rng.choice = lambda xs, _s=seq: _s

    turn1 = [11, 12, 13, 14, 15]
    pick(turn1)
    sim.admit(chunked=True, k=1)                       # a chunk checkpoint, then the forward to the end
    sim.rng.randrange = lambda k: k - 1
    sim.finish()                                       # reply-end checkpoint
    acct = sim.comp.account.counts
    assert acct["stored"] == {"chunk": 1, "prompt": 0, "decode": 0, "reply": 1}
    pick(sim.request_tokens(turn1) + [90, 91])         # turn 2 extends turn 1's whole request
    sim.admit(k=1)
    assert acct["reused"] == {"chunk": 0, "prompt": 0, "decode": 0, "reply": 1}
    assert sim.comp.counters.hits_compressed == 1
    sim.finish()
    assert acct["stored"]["reply"] == 2
    assert sim.comp.drop_compressed() == (3, 0)        # all three checkpoints leave the tree
    assert acct["evicted_unused"] == {"chunk": 1, "prompt": 0, "decode": 0, "reply": 1}
    assert acct["evicted_reused"] == {"chunk": 0, "prompt": 0, "decode": 0, "reply": 1}
    sim.check(0)

    with caplog.at_level(logging.INFO, logger="dasc_runtime.mamba_component"):
        sim.cache.reset()                              # /flush_cache
        lines = [r.getMessage() for r in caplog.records if ACCOUNT_TAG in r.getMessage()]
        assert len(lines) == 1
        got = parse_account_line(lines[0])
        assert got["origins"]["stored"] == {"chunk": 1, "prompt": 0, "decode": 0, "reply": 2}
        assert got["origins"]["reused"]["reply"] == 1 and got["origins"]["evicted_unused"]["chunk"] == 1
        assert got["tiers"]["hits_compressed"] == 1 and got["tiers"]["inserts_compressed"] == 3
        assert got["tiers"]["evictions_compressed"] == 3
        sim.cache.reset()                              # nothing happened since: no line
        assert sum(ACCOUNT_TAG in r.getMessage() for r in caplog.records) == 1
    assert sum(sim.comp.account.counts["stored"].values()) == 0
