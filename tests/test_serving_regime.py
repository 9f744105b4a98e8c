"""Serving-regime planner (benchmarks/serving_regime.py): hand-computed replays of the three
prefill models, the 64-token state checkpoint floor, the hit-fraction scenario, and the
invariant that full prefix hits never raise the mean TTFT on the real trace; the finite
checkpoint cache (benchmarks/serving_regime_cache.py): a hand case evicted / kept, the LRU order,
the decode-track rule, capacity checks, and hits that never fall as K grows on the real trace.

Hand cases use prefill 100 tokens/s and 0.25 s decode steps, so every time is a multiple of
0.25 s and exact in binary floating point. Three conversations, C = 3 workers, R = 2 slots:
  c0: turn 0 prompt 25 (0.25 s prefill), d = 2 (one decode step after the first token);
  c1: turn 0 prompt 50 (0.5 s), d = 1; turn 1 prompt 75 (0.75 s), d = 2;
  c2: turn 0 prompt 25 (0.25 s), d = 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import build_trace as bt  # noqa: E402
import serving_regime as sr  # noqa: E402
import serving_regime_cache as src  # noqa: E402
from dasc_compile.errors import DascInputError  # noqa: E402

TRACE = ROOT / "benchmarks" / "traces" / "sharegpt_qwen_n128_d512_s0.json.gz"
SMALL_TRACE = ROOT / "benchmarks" / "traces" / "sharegpt_qwen_n8_d64_s0.json.gz"


def req(conv: int, turn: int, prompt: int, decode: int, cached: int = 0) -> sr.SimRequest:
    return sr.SimRequest(conv=conv, turn=turn, prompt_tokens=prompt, cached_tokens=cached,
                         decode_tokens=decode)


HAND = [[req(0, 0, 25, 2)], [req(1, 0, 50, 1), req(1, 1, 75, 2)], [req(2, 0, 25, 1)]]


def rates(model: str, **kw) -> sr.ServiceRates:
    return sr.ServiceRates(prefill_tok_s=100.0, decode_step_s=0.25, model=model, **kw)


# per model, in (conv, turn) order c0t0, c1t0, c1t1, c2t0: TTFTs, E2Es, wall, prefill busy.
# slot: c0t0 [0, .5], c1t0 [0, .5]; at 0.5 c0t0 pops first -> c2t0 (queued first) [.5, .75],
#   then c1t0's worker sends c1t1, admitted at once: first token 1.25, ends 1.5.
# interleaved: batch {c0t0, c1t0} 75 tok -> t .75 (c1t0 ends, sends c1t1); batch {c2t0} -> 1.0;
#   batch {c1t1} -> 1.75; one decode step -> 2.0 (c0t0 and c1t1 end).
# shared: prefill server c0t0 [0, .25], c1t0 [.25, .75]; c0t0 ends .5 -> c2t0 takes the slot
#   but waits for the server [.75, 1.0]; c1t0 ends .75 -> c1t1 [1.0, 1.75], ends 2.0.
EXPECTED = {
    "slot": ([0.25, 0.5, 0.75, 0.75], [0.5, 0.5, 1.0, 0.75], 1.5, 1.75),
    "interleaved": ([0.75, 0.75, 1.0, 1.0], [2.0, 0.75, 1.25, 1.0], 2.0, 1.75),
    "shared": ([0.25, 0.75, 1.0, 1.0], [0.5, 0.75, 1.25, 1.0], 2.0, 1.75),
}


@pytest.mark.parametrize("model", sr.PREFILL_MODELS)
def test_hand_replay_exact(model):
    res = sr.simulate(HAND, concurrency=3, max_running=2, rates=rates(model))
    ttft, e2e, wall, busy = EXPECTED[model]
    assert [(t.req.conv, t.req.turn) for t in res.timings] == [(0, 0), (1, 0), (1, 1), (2, 0)]
    assert [t.ttft_s for t in res.timings] == ttft
    assert [t.e2e_s for t in res.timings] == e2e
    assert res.wall_s == wall and res.prefill_busy_s == busy
    # closed loop: turn 1 leaves the client the instant turn 0 ends
    assert res.timings[2].sent_s == res.timings[1].finish_s


def test_interleaved_decode_pauses_and_slot_wait():
    # c0t0 needs one 0.25 s decode step after its first token, but the two later prefill
    # batches (c2t0 0.25 s, c1t1 0.75 s) pause decoding first
    res = sr.simulate(HAND, concurrency=3, max_running=2, rates=rates("interleaved"))
    c0 = res.timings[0]
    assert c0.finish_s - c0.first_token_s == 1.25
    assert [t.wait_s for t in res.timings] == [0.0, 0.0, 0.25, 0.75]


def test_interleaved_chunked_prefill():
    # budget 100 tokens = 1 s: A (150 tok) is cut at 100, finishes its last 50 in batch 2, which
    # also admits B (50 tok); A then decodes one 0.25 s step.
    reqs = [[req(0, 0, 150, 2)], [req(1, 0, 50, 1)]]
    res = sr.simulate(reqs, concurrency=2, max_running=2, rates=rates("interleaved", chunk_tokens=100))
    a, b = res.timings
    assert (a.admitted_s, a.first_token_s, a.finish_s) == (0.0, 2.0, 2.25)
    assert (b.admitted_s, b.first_token_s, b.finish_s) == (1.0, 2.0, 2.0)
    assert res.prefill_busy_s == 2.0
    # a per-batch overhead is paid once per forward, not per request
    res = sr.simulate(reqs, concurrency=2, max_running=2,
                      rates=rates("interleaved", chunk_tokens=100, prefill_overhead_s=0.5))
    assert res.timings[0].first_token_s == 3.0 and res.prefill_busy_s == 3.0


def test_slot_limit_one_serialises():
    res = sr.simulate(HAND, concurrency=3, max_running=1, rates=rates("slot"))
    # c0t0 [0, .5]; c1t0 [.5, 1.0]; c2t0 [1.0, 1.25] (queued before c1t1); c1t1 [1.25, 2.25]
    assert [t.finish_s for t in res.timings] == [0.5, 1.0, 2.25, 1.25]


def test_checkpoint_floor():
    assert sr.cached_tokens_for([100, 200, 130 + 64], [False, True, True]) == [0, 64, 192]
    assert sr.cached_tokens_for([63, 200], [False, True]) == [0, 0]
    assert sr.cached_tokens_for([128, 128], [False, True]) == [0, 127]     # >= 1 token computed
    assert sr.cached_tokens_for([300, 400], [True, False]) == [0, 0]       # turn 0 never hits


def _conv(seg_lens, decode):
    segs = tuple(tuple(range(1, n + 1)) for n in seg_lens)
    return bt.TraceConversation(source_id="x", segments=segs, decode_tokens=tuple(decode))


def test_build_requests_scenarios():
    conv = _conv([70, 10, 60, 5, 20, 3], [9, 4, 2])      # prompts 70, 140, 165
    none = sr.build_requests([conv], scenario="none", clip=3)[0]
    full = sr.build_requests([conv], scenario="all", clip=3)[0]
    assert [r.prompt_tokens for r in full] == [70, 140, 165]
    assert [r.cached_tokens for r in full] == [0, 64, 128]
    assert [r.cached_tokens for r in none] == [0, 0, 0]
    assert [r.decode_tokens for r in full] == [3, 3, 2]
    assert [r.decode_tokens for r in sr.build_requests([conv], scenario="all")[0]] == [9, 4, 2]


def test_hit_fraction_is_seeded_and_bounded():
    _, convs = bt.load_trace(SMALL_TRACE)

    def cached(f, seed=0, n=len(convs)):
        return [[r.cached_tokens for r in c]
                for c in sr.build_requests(convs[:n], scenario="hit", hit_fraction=f, hit_seed=seed)]

    assert cached(0.0) == [[r.cached_tokens for r in c] for c in sr.build_requests(convs, scenario="none")]
    assert cached(1.0) == [[r.cached_tokens for r in c] for c in sr.build_requests(convs, scenario="all")]
    half = cached(0.5)
    assert half == cached(0.5) and cached(0.5, n=4) == half[:4]
    hits = sum(x > 0 for c in half for x in c)
    assert 0 < hits < sum(len(c) - 1 for c in half)


def test_full_hits_never_raise_mean_ttft():
    _, convs = bt.load_trace(TRACE)
    for model in sr.PREFILL_MODELS:
        r = sr.ServiceRates(model=model)
        for c, n, clip in ((8, 16, 16), (24, 24, 128), (48, 32, 32)):
            got = sr.run_setting(convs[:n], concurrency=c, max_running=8, clip=clip, rates=r,
                                 scenarios=("none", "all"))
            assert got["all"]["ttft_mean_s"] <= got["none"]["ttft_mean_s"], (model, c, n, clip)
            assert got["all"]["hit_rate"] > 0.5 and got["none"]["hit_rate"] == 0.0


def test_summary_shares():
    s = sr.summarize(sr.simulate(HAND, concurrency=3, max_running=2, rates=rates("slot")))
    assert s["ttft_mean_s"] == 2.25 / 4 and s["e2e_mean_s"] == 2.75 / 4
    # slot time: prefill 0.25+0.5+0.75+0.25 = 1.75 of 0.5+0.5+1.0+0.25 = 2.25; only c2t0 waits
    assert s["prefill_slot_share"] == pytest.approx(1.75 / 2.25)
    assert s["wait_share"] == pytest.approx(0.5 / 2.25)
    assert s["wall_s"] == 1.5 and s["prefill_busy_share"] == pytest.approx(1.75 / 1.5)


def test_bad_input():
    with pytest.raises(DascInputError, match="scenario"):
        sr.build_requests([], scenario="some")
    with pytest.raises(DascInputError, match="--clip"):
        sr.build_requests([], scenario="all", clip=0)
    with pytest.raises(DascInputError, match="--hit-fraction"):
        sr.build_requests([], scenario="hit", hit_fraction=1.5)
    with pytest.raises(DascInputError, match="prefill model"):
        sr.simulate(HAND, concurrency=1, max_running=1, rates=rates("mixed"))
    with pytest.raises(DascInputError, match="prefill_tok_s"):
        sr.simulate(HAND, concurrency=1, max_running=1,
                    rates=sr.ServiceRates(prefill_tok_s=0.0))
    with pytest.raises(DascInputError, match="concurrency"):
        sr.simulate(HAND, concurrency=0, max_running=1, rates=rates("slot"))
    assert sr.main(["--trace", str(SMALL_TRACE), "--num-conversations", "99"]) == 2
    assert sr.main(["--trace", str(SMALL_TRACE), "--concurrency", "0"]) == 2


def test_cli_table(capsys):
    assert sr.main(["--trace", str(SMALL_TRACE), "--concurrency", "2", "4", "--max-running", "2",
                    "--clip", "16", "--hit-fraction", "0.5"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert len(rows) == 2 * 3                       # 2 settings x (none, all, hit=0.5)
    assert [ln.split("|")[5].strip() for ln in rows[:3]] == ["none", "all", "hit=0.5"]
    assert rows[0].split("|")[11].strip() == "1.000"


# --- finite checkpoint cache (benchmarks/serving_regime_cache.py, scenario cap=K) ---------------
# Hand case at 64 tokens/s (64 tokens = 1 s), one running slot (R = 1), two workers:
#   c0: turn 0 prompt 128 (2 s), d = 1; turn 1 prompt 192, d = 1 (a hit reuses 128 tokens: 1 s
#       prefill, a miss 3 s); c1: turn 0 prompt 64 (1 s), d = 1.
# Every model runs c0t0 [0, 2], then c1t0 [2, 3] (sent first), then c0t1 from 3; c0t1 is sent at 2.
# With s = 1 slot per running request and c = 2 checkpoints per finished request:
#   t=2 c0t0 ends: cache {c0t0.0, c0t0.1}; c1t0 admitted: 1 running + 2 cached = 3 slots.
#   t=3 c1t0 ends: inserts c1t0.0 and c1t0.1, each evicting the LRU one when 0 running + cached
#   would exceed K. K = 3: c0t0.0 is evicted by c1t0.1 -> c0t1 misses (first token 6, TTFT 4).
#   K = 4: all four fit -> c0t1 hits (first token 4, TTFT 2, 128 tokens cached).
CAP_HAND = [[req(0, 0, 128, 1, 0), req(0, 1, 192, 1, 128)], [req(1, 0, 64, 1, 0)]]


def cache_rates(model: str) -> sr.ServiceRates:
    return sr.ServiceRates(prefill_tok_s=64.0, decode_step_s=0.25, model=model)


@pytest.mark.parametrize("model", sr.PREFILL_MODELS)
@pytest.mark.parametrize("capacity,hit", [(3, False), (4, True)])
def test_capacity_hand_evicted_or_kept(model, capacity, hit):
    cache = src.CheckpointCache(capacity, max_running=1, slots_per_running=1, ckpts_per_request=2)
    res = sr.simulate(CAP_HAND, concurrency=2, max_running=1, rates=cache_rates(model), cache=cache)
    c0t0, c0t1, c1t0 = res.timings
    assert (c0t0.finish_s, c1t0.admitted_s, c1t0.finish_s) == (2.0, 2.0, 3.0)
    assert (c0t1.sent_s, c0t1.admitted_s) == (2.0, 3.0)
    assert c0t1.req.cached_tokens == (128 if hit else 0)
    assert c0t1.first_token_s == (4.0 if hit else 6.0) and c0t1.ttft_s == (2.0 if hit else 4.0)
    assert (cache.stats.lookups, cache.stats.hits) == (1, int(hit))
    # evicted: K = 3: c0t0.0 (by c1t0.1), c0t0.1 (at c0t1's admission), c1t0.0 (by c0t1.1);
    # K = 4: c0t0.1 (at c0t1's admission, c0t0.0 being refreshed), c1t0.0 (by c0t1.1)
    assert cache.stats.evictions == 3 - hit and cache.stats.inserts == 6
    assert list(cache.lru) == [(1, 0, 1)] + [(0, 0, 0)] * hit + [(0, 1, 0), (0, 1, 1)]
    assert cache.running == 0 and cache.stats.peak_cached == capacity
    assert sr.summarize(res)["hit_rate"] == (128 / 384 if hit else 0.0)


def _ck(conv, turn, prompt=100, decode=4):
    return req(conv, turn, prompt, decode)


def test_cache_lru_refresh_and_eviction_order():
    # K = 5, R = 2, s = 1, c = 1; keys (conv, turn, 0)
    cache = src.CheckpointCache(5, max_running=2, slots_per_running=1, ckpts_per_request=1)
    for conv in (0, 1):
        assert not cache.admit(_ck(conv, 0))
        cache.finish(_ck(conv, 0))
    assert list(cache.lru) == [(0, 0, 0), (1, 0, 0)]
    assert cache.admit(_ck(0, 1))                      # hit: refreshed, stays cached
    assert list(cache.lru) == [(1, 0, 0), (0, 0, 0)]
    cache.finish(_ck(0, 1))
    assert not cache.admit(_ck(2, 0)) and not cache.admit(_ck(3, 0))   # 2 running + 3 cached = 5
    cache.finish(_ck(2, 0))                            # 1 running + 4 cached = 5
    assert not cache.admit(_ck(4, 0))                  # 2 running: evict the LRU (1, 0, 0)
    assert list(cache.lru) == [(0, 0, 0), (0, 1, 0), (2, 0, 0)]
    cache.finish(_ck(3, 0))                            # 1 running + 4 cached
    assert list(cache.lru) == [(0, 0, 0), (0, 1, 0), (2, 0, 0), (3, 0, 0)]
    assert not cache.admit(_ck(1, 1))                  # its turn-0 checkpoint is gone
    assert list(cache.lru) == [(0, 1, 0), (2, 0, 0), (3, 0, 0)]     # (0, 0, 0) made room
    assert (cache.stats.lookups, cache.stats.hits, cache.stats.evictions) == (2, 1, 2)
    assert cache.stats.peak_cached == 4


def test_track_interval_checkpoint_count():
    cm = src.CheckpointCache(10, max_running=1, slots_per_running=1, ckpts_per_request=2,
                             track_interval=256)
    # decode steps reach P + 1 .. P + d - 1 tokens
    assert cm.ckpts_of(req(0, 0, 250, 8)) == 2         # reaches 256
    assert cm.ckpts_of(req(0, 0, 256, 8)) == 1         # 257..263
    assert cm.ckpts_of(req(0, 0, 240, 16)) == 1        # 241..255
    assert cm.ckpts_of(req(0, 0, 240, 17)) == 2        # 241..256
    assert cm.ckpts_of(req(0, 0, 255, 1)) == 1         # no decode step
    off = src.CheckpointCache(10, max_running=1, slots_per_running=1, ckpts_per_request=2)
    assert off.ckpts_of(req(0, 0, 256, 8)) == 2


def test_capacity_below_running_needs_raises():
    with pytest.raises(DascInputError, match="--capacity: K=23 .* 24 .* R=8"):
        src.CheckpointCache(23, max_running=8)
    src.CheckpointCache(24, max_running=8)              # exactly the running needs is allowed
    with pytest.raises(DascInputError, match="--capacity"):
        sr.run_setting(HAND, concurrency=2, max_running=2, clip=None, rates=rates("slot"),
                       scenarios=("none",), capacities=(6,),
                       cache_model=src.CacheModel(slots_per_running=4))
    with pytest.raises(DascInputError, match="--slots-per-running"):
        src.CheckpointCache(10, max_running=1, slots_per_running=0)
    with pytest.raises(DascInputError, match="--ckpts-per-request"):
        src.CheckpointCache(10, max_running=1, ckpts_per_request=-1)
    with pytest.raises(DascInputError, match="--track-interval"):
        src.CheckpointCache(10, max_running=1, track_interval=-256)
    assert sr.main(["--trace", str(SMALL_TRACE), "--max-running", "8", "--capacity", "23"]) == 2


def test_larger_capacity_never_lowers_hits_on_trace():
    # default (interleaved) model; the slot/shared models can dip by <= 0.01 at a few K on
    # C=64 N=64, since the order of lookups depends on the timing the hits change
    _, convs = bt.load_trace(TRACE)
    r = sr.ServiceRates()
    for c, n, clip, ks in ((24, 48, 128, range(24, 90)), (32, 80, 8, range(24, 110, 2))):
        got = sr.run_setting(convs[:n], concurrency=c, max_running=8, clip=clip, rates=r,
                             scenarios=("all",), capacities=tuple(ks))
        hits = [got[f"cap={k}"]["hit_rate"] for k in ks]
        assert all(a <= b for a, b in zip(hits, hits[1:])), (c, n, clip)
        assert hits[0] < 0.1 and hits[-1] == got["all"]["hit_rate"]
        # never evicting (K >= s R + c x requests): exactly the `all` scenario
        big = 24 + 2 * 4 * n
        full = sr.run_setting(convs[:n], concurrency=c, max_running=8, clip=clip, rates=r,
                              scenarios=("all",), capacities=(big,))
        assert full[f"cap={big}"]["evictions"] == 0
        assert full[f"cap={big}"]["ttft_mean_s"] == full["all"]["ttft_mean_s"]


def test_cli_capacity_rows_and_validation(capsys):
    assert sr.main(["--trace", str(SMALL_TRACE), "--concurrency", "4", "--max-running", "2",
                    "--clip", "16", "--capacity", "6", "40", "--order-seed", "0", "1"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert [ln.split("|")[5].strip() for ln in rows] == ["none", "all", "cap=6", "cap=40"]
    assert rows[3].split("|")[6] == rows[1].split("|")[6]        # 40 slots never evict on 8 convs
    assert sr.main(["--trace", str(TRACE), "--num-conversations", "8", "--validate-capacity"]) == 0
    out = capsys.readouterr().out
    table = [ln for ln in out.splitlines() if ln[:4] in ("| A ", "| B ") or ln.startswith("| C (")]
    assert len(table) == len(src.MEASURED_CAPACITY) + 3           # + the INT8 arm as K_eff, once a regime
    assert "| C (C=24, N=80) | int8 as K_eff (INT8 pool only) | 65 | 0.527 |" in out   # 3 * 8 + 41
    assert "| B (C=24, N=48) | dasc-nr-w512 | 74 | 0.304 |" in out


def test_every_regime_with_an_int8_arm_has_its_int8_pool_size():
    """--validate-capacity looks up INT8_POOL_SLOTS[regime] for each INT8 row; a regime added to
    MEASURED_CAPACITY without its pool size would fail there with a KeyError."""
    regimes = {row[0] for row in src.MEASURED_CAPACITY if row[1] == "int8"}
    assert regimes == set(src.INT8_POOL_SLOTS) == {"A", "B", "C"}
    for regime, arm, k, *_ in src.MEASURED_CAPACITY:
        if arm == "int8":          # the one-pool K counts M' = 40 native slots plus the INT8 pool
            assert k == 40 + src.INT8_POOL_SLOTS[regime]
