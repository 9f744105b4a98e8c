"""Two-tier cache scenarios with hand-checked outcomes (paper App. B.2) on SGLang 0.5.17's classes."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.support.runtime_fixtures import SGLANG_SKIP_REASON

pytestmark = [pytest.mark.sglang,
              pytest.mark.skipif(bool(SGLANG_SKIP_REASON), reason=SGLANG_SKIP_REASON or "sglang available")]


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _sim(tmp_path, **kw):
    from tests.support.runtime_sim import Sim

    kw.setdefault("watermark", 0)
    return Sim(tmp_path, seed=0, **kw)


def _run(sim, seq, *, keep=False, chunked=False):
    """Admit one request for ``seq``, then finish it unless ``keep``; returns the request."""
    sim.rng.choice = lambda xs, _s=seq: _s            # deterministic pick
    n = len(sim.inflight)
    sim.admit(chunked=chunked, k=1)
    req = sim.inflight[-1]
    assert len(sim.inflight) == n + 1
    if not keep:
        sim.inflight.remove(req)
        sim.inflight.append(req)
        sim.rng.randrange = lambda k: k - 1
        sim.finish()
    sim.check(0, content=True)
    return req


def _node_of(sim, tokens):
    """The tree node whose key ends exactly at ``tokens`` (None if absent)."""
    for n in sim.nodes():
        if sim.prefix_tokens(n) == list(tokens):
            return n
    return None


SEQ_A = [11, 12, 13, 14]
SEQ_B = [21, 22, 23]
SEQ_C = [31, 32, 33, 34, 35]
SEQ_D = [41, 42]


def test_compressed_first_then_dense_spill_without_copy(tmp_path):
    sim = _sim(tmp_path, compressed_slots=1)
    _run(sim, SEQ_A)
    a = _node_of(sim, sim.request_tokens(SEQ_A))
    assert sim.comp.tier(a) == "compressed" and sim.dpool.available_size() == 0
    assert sim.pool.mamba_allocator.available_size() == sim.M         # the request's slot came back
    req = _run(sim, SEQ_B)
    b = _node_of(sim, sim.request_tokens(SEQ_B))
    assert sim.comp.tier(b) == "dense"
    # dense spill hands the finished request's own native slot to the tree (no copy)
    assert b.component_data[sim.MAMBA].value.tolist() == [int(sim.mamba(req).mamba_pool_idx)]
    assert sim.pool.mamba_allocator.available_size() == sim.M - 1
    c = sim.comp.counters
    assert (c.inserts_compressed, c.inserts_dense) == (1, 1)


def test_hits_restore_by_tier(tmp_path):
    sim = _sim(tmp_path, compressed_slots=1)
    _run(sim, SEQ_A)                                   # compressed
    _run(sim, SEQ_B)                                   # dense (spill)
    child_a = sim.request_tokens(SEQ_A) + [90, 91]
    child_b = sim.request_tokens(SEQ_B) + [92]
    _run(sim, child_a)
    _run(sim, child_b)
    # each restore was compared with the exact state (dense) or its dasc-nr image (compressed)
    assert sim.stats["restore_compressed"] == 1 and sim.stats["restore_dense"] == 1
    assert sim.comp.counters.hits_compressed == 1 and sim.comp.counters.hits_dense == 1
    assert sim.dpool.counters.loads_compressed == 1 and sim.dpool.counters.loads_dense == 1


def test_watermark_demotion_commits_after_event_and_unlock_keeping_lru(tmp_path):
    from dasc_runtime.tiers import TierPolicy

    sim = _sim(tmp_path, compressed_slots=3, mamba_size=6)
    for s in (SEQ_A, SEQ_B, SEQ_C):
        _run(sim, s)                                   # fill the compressed pool
    _run(sim, SEQ_D)                                   # dense
    d = _node_of(sim, sim.request_tokens(SEQ_D))
    assert sim.comp.tier(d) == "dense"
    sim.comp.evict_node(_node_of(sim, sim.request_tokens(SEQ_A)))   # room for one demotion
    native_free = sim.pool.mamba_allocator.available_size()
    lru_before = sim.lru_ids()
    sim.comp.policy = TierPolicy(watermark=native_free + 1)
    sim.comp.maintain()                                # free native < watermark: demote the oldest dense (D)
    assert list(sim.comp.pending) == [d.id] and sim.comp.counters.demotions_started == 1
    ev = sim.side_events[-1]
    assert not ev.done and d.component_data[sim.MAMBA].lock_ref == 1      # pinned, event pending
    assert sim.lru_ids() == lru_before                                     # demotion is not an access
    sim.comp.policy = TierPolicy(watermark=0)
    # a hit on D while it is demoting: copy-on-write from D's still-valid native slot, D locked
    _run(sim, sim.request_tokens(SEQ_D) + [77], keep=True)
    assert sim.stats["restore_dense"] == 1 and d.component_data[sim.MAMBA].lock_ref == 2
    sim.comp.maintain()
    sim.comp.maintain()
    assert sim.comp.tier(d) == "dense" and d.id in sim.comp.pending       # the hit holds it: no commit
    assert sim.pool.mamba_allocator.available_size() < native_free + 1
    sim.rng.randrange = lambda k: k - 1
    sim.finish()                                       # the hit ends (its cleanup runs maintain)
    sim.comp.maintain()
    # the pack has not completed: maintain neither waits for the event nor commits
    assert ev.waited == 0 and not ev.done and d.id in sim.comp.pending and sim.comp.tier(d) == "dense"
    sim.device.complete(ev)                            # the side-stream pack completes
    sim.comp.maintain()
    assert ev.waited == 0                              # committed on query(), never blocking
    assert sim.comp.tier(d) == "compressed" and not sim.comp.pending
    assert d.component_data[sim.MAMBA].lock_ref == 0
    assert sim.comp.counters.demotions_committed == 1
    sim.check(1, content=True)


def test_reclamation_order_follows_app_b2(tmp_path):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    sim = _sim(tmp_path, compressed_slots=2, mamba_size=6)
    _run(sim, SEQ_A)                                   # compressed, oldest
    _run(sim, SEQ_B)                                   # compressed
    _run(sim, SEQ_C)                                   # dense
    _run(sim, SEQ_D)                                   # dense, newest
    a, b, c, d = (_node_of(sim, sim.request_tokens(s)) for s in (SEQ_A, SEQ_B, SEQ_C, SEQ_D))
    free0 = sim.pool.mamba_allocator.available_size()
    # both pools full, oldest node compressed (A): evict A, demote the oldest dense (C) into its slot
    res = sim.cache.evict(EvictParams(num_tokens=0, mamba_num=1))
    assert res.mamba_num_evicted == 1 and sim.pool.mamba_allocator.available_size() == free0 + 1
    assert _node_of(sim, sim.request_tokens(SEQ_A)) is None
    assert sim.comp.tier(b) == "compressed" and sim.comp.tier(c) == "compressed" and sim.comp.tier(d) == "dense"
    assert sim.comp.counters.evictions_compressed == 1 and sim.comp.counters.demotions_sync == 1
    # compressed space free (evict B's state directly), oldest eligible dense is D: demoted, not evicted
    sim.comp.evict_node(b)
    res = sim.cache.evict(EvictParams(num_tokens=0, mamba_num=1))
    assert res.mamba_num_evicted == 1 and sim.comp.tier(d) == "compressed"
    # no dense node left: evicting compressed states cannot free a native slot
    res = sim.cache.evict(EvictParams(num_tokens=0, mamba_num=1))
    assert res.mamba_num_evicted == 0 and sim.comp.tier(c) == "compressed"
    sim.check(2, content=True)


def test_compressed_only_never_spills(tmp_path):
    sim = _sim(tmp_path, compressed_slots=2, compressed_only=True)
    for s in (SEQ_A, SEQ_B, SEQ_C, SEQ_D):
        _run(sim, s)
    assert sim.comp.book.counts() == {"dense": 0, "compressed": 2}
    assert _node_of(sim, sim.request_tokens(SEQ_A)) is None   # the oldest compressed node made room
    assert sim.comp.tier(_node_of(sim, sim.request_tokens(SEQ_D))) == "compressed"
    assert sim.comp.counters.inserts_dense == 0 and sim.comp.counters.evictions_compressed == 2


def test_chunked_prefill_inserts_compressed_and_rematches(tmp_path):
    sim = _sim(tmp_path, compressed_slots=4)
    toks = SEQ_C + [36, 37, 38]
    req = _run(sim, toks, keep=True, chunked=True)
    assert sim.stats["unfinished"] == 1 and sim.comp.counters.inserts_compressed == 1
    sim.rng.randrange = lambda k: k - 1
    sim.finish()
    sim.check(3, content=True)
    assert sim.comp.counters.inserts_compressed == 2 and sim.mamba(req).mamba_pool_idx is None


@pytest.mark.parametrize("mode", ["stream", "host"])
def test_maintain_never_waits_but_reclamation_does(tmp_path, monkeypatch, mode):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    monkeypatch.setenv("DASC_RECLAIM_WAIT", mode)
    sim = _sim(tmp_path, compressed_slots=2, mamba_size=6)
    for s in (SEQ_A, SEQ_B, SEQ_C):
        _run(sim, s)                                   # A, B compressed; C dense
    c = _node_of(sim, sim.request_tokens(SEQ_C))
    sim.comp.evict_node(_node_of(sim, sim.request_tokens(SEQ_A)))   # room for one demotion
    free0 = sim.pool.mamba_allocator.available_size()
    sim.comp.demote_async(c)
    ev = sim.side_events[-1]
    sim.comp.maintain()                                # launched in this epoch: not a candidate yet
    sim.comp.maintain()                                # a candidate, but its event has not completed
    assert c.id in sim.comp.pending and ev.waited == 0 and sim.comp.counters.demotions_committed == 0
    assert sim.pool.mamba_allocator.available_size() == free0
    # SGLang needs a native slot now: the walk orders the schedule stream after the pack (stream: the
    # host does not block; host: it synchronizes) and commits it (frees C's slot)
    res = sim.cache.evict(EvictParams(num_tokens=0, mamba_num=1))
    assert res.mamba_num_evicted == 1 and not sim.comp.pending
    if mode == "stream":
        assert ev.waited == 0 and ("wait", ev) in sim.device.main.queue
    else:
        assert ev.waited == 1 and ev.done
    assert sim.comp.tier(c) == "compressed" and sim.comp.counters.demotions_committed == 1
    assert sim.comp.counters.reclaim_waits == 1 and sim.comp.counters.reclaim_wait_host_s >= 0.0  # for the log
    assert sim.pool.mamba_allocator.available_size() == free0 + 1
    sim.check(4, content=True)


def test_storage_balanced_pool_demotes_on_the_current_stream(tmp_path):
    from dasc_runtime.tiers import TierPolicy

    # a TP=1 storage map: layout.storage is set (a real TP>1 pool would all-to-all on every pack)
    sim = _sim(tmp_path, compressed_slots=1, mamba_size=6, balance="storage")
    assert sim.dpool.layout.storage is not None
    _run(sim, SEQ_A)                                   # compressed
    _run(sim, SEQ_B)                                   # dense (spill)
    b = _node_of(sim, sim.request_tokens(SEQ_B))
    sim.comp.evict_node(_node_of(sim, sim.request_tokens(SEQ_A)))   # room for one demotion
    free0 = sim.pool.mamba_allocator.available_size()
    sim.comp.policy = TierPolicy(watermark=free0 + 1)
    sim.comp.maintain()                                # watermark demotion of B
    # no side-stream pack and nothing pending: B was packed on the current stream and committed
    assert sim.side_events == [] and not sim.comp.pending
    assert sim.comp.tier(b) == "compressed" and sim.comp.counters.demotions_sync == 1
    assert sim.comp.counters.demotions_started == 0
    assert sim.pool.mamba_allocator.available_size() == free0 + 1
    sim.check(5, content=True)


def test_compressed_only_skips_caching_when_every_checkpoint_is_locked(tmp_path):
    sim = _sim(tmp_path, compressed_slots=1, compressed_only=True)
    _run(sim, SEQ_A)                                   # A takes the only compressed slot
    a = _node_of(sim, sim.request_tokens(SEQ_A))
    held = _run(sim, sim.request_tokens(SEQ_A) + [90, 91], keep=True)   # a running hit locks A
    assert a.component_data[sim.MAMBA].lock_ref == 1
    free0 = sim.pool.mamba_allocator.available_size()
    _run(sim, SEQ_B)                                   # finished: nothing can be evicted -> not cached
    assert _node_of(sim, sim.request_tokens(SEQ_B)) is None
    assert sim.comp.counters.skipped == 1
    assert sim.pool.mamba_allocator.available_size() == free0   # B's native slot came back
    del sim.rng.randrange                              # the chunk split draws from the seeded rng
    _run(sim, SEQ_C, chunked=True)                     # unfinished chunk and the finish: both skipped
    assert sim.stats["unfinished"] == 1 and sim.comp.counters.skipped == 3
    assert _node_of(sim, sim.request_tokens(SEQ_C)) is None
    # the hit itself: A is still locked by it while its state is prepared, so it is skipped too
    sim.inflight.remove(held)
    sim.inflight.append(held)
    sim.finish()
    assert sim.comp.counters.skipped == 4 and a.component_data[sim.MAMBA].lock_ref == 0
    assert sim.comp.book.counts() == {"dense": 0, "compressed": 1} and sim.comp.counters.inserts_dense == 0
    assert sim.pool.mamba_allocator.available_size() == sim.M
    sim.check(6, content=True)


def test_reclaim_wait_mode_and_order_after(monkeypatch):
    """DASC_RECLAIM_WAIT: 'stream' (default) / 'host'; records without a stream are synchronized, an event
    of the device's streams is waited on by the current stream (host mode: synchronized)."""
    import random

    from tests.support.runtime_streams import SimDevice

    from dasc_compile.schema import DascInputError
    from dasc_runtime.demotion import CudaStreams, _DoneEvent, order_after, reclaim_wait_mode

    monkeypatch.delenv("DASC_RECLAIM_WAIT", raising=False)
    assert reclaim_wait_mode() == "stream"
    monkeypatch.setenv("DASC_RECLAIM_WAIT", " Host ")
    assert reclaim_wait_mode() == "host"
    monkeypatch.setenv("DASC_RECLAIM_WAIT", "spin")
    with pytest.raises(DascInputError, match="DASC_RECLAIM_WAIT: expected 'stream' or 'host', got 'spin'"):
        reclaim_wait_mode()
    monkeypatch.setenv("DASC_RECLAIM_WAIT", " Spin")             # echoed as set, as the yes / no variables are
    with pytest.raises(DascInputError, match="DASC_RECLAIM_WAIT: expected 'stream' or 'host', got ' Spin'$"):
        reclaim_wait_mode()
    for mode in ("stream", "host"):
        order_after(_DoneEvent(), mode, CudaStreams("cpu"))          # a CPU record: synchronized, no stream
        dev = SimDevice(random.Random(0))
        side = dev.new_stream()
        with dev.stream(side):
            dev.launch(lambda: None)
            ev = dev.new_event()
            ev.record(side)
        order_after(ev, mode, dev)
        if mode == "stream":      # the host did not block; the schedule stream waits on the event
            assert ev.waited == 0 and not ev.done and dev.main.queue == [("wait", ev)]
        else:
            assert ev.waited == 1 and ev.done and dev.main.queue == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_stream_wait_orders_later_work_after_the_side_stream_pack():
    """On a GPU the stream mode does not block the host, yet later current-stream work sees the pack."""
    from dasc_runtime.demotion import CudaStreams, order_after

    dev = torch.device("cuda")
    src = torch.zeros(1 << 20, device=dev)
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)          # ~0.1 s of GPU time before the "pack" lands
        src.fill_(1.0)
        ev = torch.cuda.Event()
        ev.record(side)
    order_after(ev, "stream", CudaStreams(dev))
    assert not ev.query()                        # the host did not wait
    seen = src.clone()                           # issued on the current stream after the wait
    torch.cuda.synchronize(dev)
    assert torch.equal(seen, torch.ones_like(seen))


def test_tier_book_counts_follow_tier_and_lock_changes():
    """TierBook on SGLang's ComponentData: counts move with the tier; locked counts with lock_ref 0 <-> 1."""
    from sglang.srt.mem_cache.unified_cache.components import ComponentData

    from dasc_runtime.side_channels import node_tier
    from dasc_runtime.tiers import TierBook

    book = TierBook()
    a, b = ComponentData(), ComponentData()
    assert book.tier(a) is None                                   # no state: no tier
    a.value, b.value = torch.tensor([3]), torch.tensor([12])
    assert book.tier(a) == "dense"                                # SGLang's own value: dense until told
    book.set(a, "dense")
    book.set(b, "compressed")
    a.lock_ref = 1
    book.on_lock(a)
    assert book.counts() == {"dense": 1, "compressed": 1} and (book.dense_evictable(), book.dense_protected()) == (0, 1)
    book.set(a, "compressed")                                     # a locked node changes tier (demotion commit)
    assert book.counts() == {"dense": 0, "compressed": 2} and book.locked == {"dense": 0, "compressed": 1}
    assert node_tier(a) == "compressed"
    a.lock_ref = 0
    book.on_unlock(a)
    book.clear(b)
    assert book.counts() == {"dense": 0, "compressed": 1} and book.locked == {"dense": 0, "compressed": 0}
    assert node_tier(b) is None
    book.reset()
    assert book.counts() == {"dense": 0, "compressed": 0}


# ---------------------------------------------------------------- DASC_EVICT_SHADOWED_FIRST

SEQ_X = [51, 52, 53, 54, 55, 56]


def _chat(sim):
    """An unrelated reply-end checkpoint U, then one conversation's two turns, each chunked: chunk c1 and
    reply r1, then c2 and r2 on the same radix path (turn 2 extends turn 1's reply and hits r1).
    Returns ``(U, [c1, r1, c2, r2])``; the Mamba LRU, oldest first, is U c1 r1 c2 r2 (the hit on r1 moved it
    to the front before c2 and r2 entered), so plain LRU evicts the unrelated reply-end U first."""
    sim.rng.randint = lambda a, b: (a + b) // 2       # the chunk split: mid-prompt
    _run(sim, SEQ_B)
    u = _node_of(sim, sim.request_tokens(SEQ_B))
    _run(sim, SEQ_X, chunked=True)
    turn2 = sim.request_tokens(SEQ_X) + [57, 58, 59, 60]
    _run(sim, turn2, chunked=True)
    full = sim.request_tokens(turn2)
    path = sorted((n for n in sim.nodes() if n.component_data[sim.MAMBA].value is not None
                   and full[:len(sim.prefix_tokens(n))] == sim.prefix_tokens(n)),
                  key=lambda n: len(sim.prefix_tokens(n)))
    assert [n.component_data[sim.MAMBA].metadata["dasc_origin"] for n in path] == ["chunk", "reply", "chunk", "reply"]
    assert sim.lru_ids() == [n.id for n in [u] + path]
    assert sim.comp.account.counts["reused"]["reply"] == 1            # turn 2 restored r1
    return u, path


def _cached(sim, nodes) -> list[bool]:
    return [n.component_data[sim.MAMBA].value is not None for n in nodes]


@pytest.mark.parametrize("shadowed_first", [False, True])
def test_compressed_only_pool_full_evicts_shadowed_checkpoints_first(tmp_path, shadowed_first, caplog):
    """Compressed pool full (compressed-only, 5 slots): each new unrelated reply takes one slot. Plain LRU
    (flag off) evicts the older unrelated reply-end U, then c1, r1; with DASC_EVICT_SHADOWED_FIRST the
    path's shadowed checkpoints c1, r1, c2 go first, oldest first, and U and the path's reply-end r2 stay."""
    with caplog.at_level(logging.INFO, logger="dasc_runtime.mamba_component"):
        sim = _sim(tmp_path, compressed_slots=5, compressed_only=True, shadowed_first=shadowed_first)
    # the server log says which order evicts: the departure from App. B.2's one LRU, or that LRU alone
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dasc: eviction: ")]
    assert len(said) == 1 and ("cached descendant and no fork" in said[0]) is shadowed_first
    assert ("the LRU order alone, App. B.2" in said[0]) is not shadowed_first
    u, (c1, r1, c2, r2) = _chat(sim)
    assert sim.dpool.available_size() == 0
    evicted = []
    for s in (SEQ_C, SEQ_D, [61, 62, 63]):
        before = [u, c1, r1, c2, r2]
        alive = _cached(sim, before)
        _run(sim, s)
        evicted += [n for n, a, b in zip(before, alive, _cached(sim, before)) if a and not b]
    acct = sim.comp.account.counts
    gone = (acct["evicted_unused"]["chunk"], acct["evicted_unused"]["reply"], acct["evicted_reused"]["reply"])
    if shadowed_first:
        assert evicted == [c1, r1, c2] and _cached(sim, [u, r2]) == [True, True]
        assert gone == (2, 0, 1)            # two chunks never reused, r1 after its one reuse
    else:
        assert evicted == [u, c1, r1] and _cached(sim, [c2, r2]) == [True, True]
        assert gone == (1, 1, 1)            # U's reply-end went unused
    assert sim.comp.counters.evictions_compressed == 3
    assert sim.comp.counters.evictions_shadowed == (3 if shadowed_first else 0)   # the rule's own victims
    # a fourth: under the rule nothing shadowed is left, so it falls back to the plain LRU and takes U;
    # the plain LRU takes c2. r2, the path's reply-end, stays either way
    _run(sim, [64, 65])
    assert _cached(sim, [u, c1, r1, c2, r2]) == [False, False, False, False, True]
    assert sim.comp.counters.evictions_shadowed == (3 if shadowed_first else 0)   # the fallback's U is not one
    sim.check(7, content=True)


@pytest.mark.parametrize("shadowed_first", [False, True])
def test_reclamation_walk_evicts_shadowed_checkpoints_first(tmp_path, shadowed_first):
    """Two tiers, compressed pool full (U, the oldest, holds its one slot; the path spilled dense). SGLang
    asks for native slots three times. Plain LRU: evict U (compressed) and demote c1 into its slot, then
    evict c1 and demote r1, ...; with the rule the shadowed dense c1, r1, c2 are evicted (each frees a
    native slot at once), U and r2 stay as they were."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    sim = _sim(tmp_path, compressed_slots=1, mamba_size=8, shadowed_first=shadowed_first)
    u, (c1, r1, c2, r2) = _chat(sim)
    assert [sim.comp.tier(n) for n in (u, c1, r1, c2, r2)] == ["compressed"] + ["dense"] * 4
    free0 = sim.pool.mamba_allocator.available_size()
    for i in range(3):
        res = sim.cache.evict(EvictParams(num_tokens=0, mamba_num=1))
        assert res.mamba_num_evicted == 1 and sim.pool.mamba_allocator.available_size() == free0 + i + 1
        sim.check(8 + i, content=True)
    if shadowed_first:
        assert _cached(sim, [u, c1, r1, c2, r2]) == [True, False, False, False, True]
        assert [sim.comp.tier(n) for n in (u, r2)] == ["compressed", "dense"]
        assert (sim.comp.counters.evictions_dense, sim.comp.counters.evictions_compressed) == (3, 0)
        assert sim.comp.counters.demotions_sync == 0 and sim.comp.counters.evictions_shadowed == 3
    else:
        assert _cached(sim, [u, c1, r1, c2, r2]) == [False, False, False, True, True]
        assert [sim.comp.tier(n) for n in (c2, r2)] == ["compressed", "dense"]
        assert (sim.comp.counters.evictions_dense, sim.comp.counters.evictions_compressed) == (0, 3)
        assert sim.comp.counters.demotions_sync == 3 and sim.comp.counters.evictions_shadowed == 0


@pytest.mark.parametrize("shadowed_first", [False, True])
def test_watermark_step_evicts_a_shadowed_checkpoint_first(tmp_path, shadowed_first):
    """The watermark step after a cache call, both pools full: plain LRU evicts U (compressed) and starts
    demoting c1 into its slot; with the rule it evicts the shadowed dense c1 and U stays."""
    from dasc_runtime.tiers import TierPolicy

    sim = _sim(tmp_path, compressed_slots=1, mamba_size=8, shadowed_first=shadowed_first)
    u, (c1, r1, c2, r2) = _chat(sim)
    free0 = sim.pool.mamba_allocator.available_size()
    sim.comp.policy = TierPolicy(watermark=free0 + 1)
    sim.comp.maintain()
    if shadowed_first:
        assert _cached(sim, [u, c1, r1, c2, r2]) == [True, False, True, True, True] and not sim.comp.pending
        assert sim.pool.mamba_allocator.available_size() == free0 + 1
    else:
        assert _cached(sim, [u, c1, r1, c2, r2]) == [False, True, True, True, True] and list(sim.comp.pending) == [c1.id]
    sim.check(11, content=True)


def test_evict_shadowed_first_setting(monkeypatch):
    """DASC_EVICT_SHADOWED_FIRST: on unless set to 0 / false / no / off (the default since the 16k seeds of
    session 53); unset and empty are the default; any other value is refused."""
    from dasc_compile.schema import DascInputError
    from dasc_runtime.tier_operations import evict_shadowed_first

    monkeypatch.delenv("DASC_EVICT_SHADOWED_FIRST", raising=False)
    assert evict_shadowed_first() is True
    for raw, want in (("1", True), (" On ", True), ("true", True), ("", True), (" ", True), ("0", False),
                      ("off", False), (" No", False)):
        monkeypatch.setenv("DASC_EVICT_SHADOWED_FIRST", raw)
        assert evict_shadowed_first() is want
    monkeypatch.setenv("DASC_EVICT_SHADOWED_FIRST", "2")
    with pytest.raises(DascInputError, match="DASC_EVICT_SHADOWED_FIRST: expected 1 / true / yes / on or 0 / false / no / off, got '2'"):
        evict_shadowed_first()


SHARED = [71, 72, 73, 74, 75, 76, 77, 78]          # a prefix two conversations share (a system prompt)


def test_a_checkpoint_above_a_fork_is_not_shadowed(tmp_path):
    """Conversations 1 and 2 share SHARED; conversation 1's chunk checkpoint c sits inside it (6 tokens), and
    the two diverge after it (8 tokens: a fork node with no state). c has two cached descendants (r1, r2), but
    a new conversation that shares the prefix restores c, so the rule must not take it first; the chain-only
    chunk c3 of an unrelated conversation goes instead. With c counted as shadowed (counts alone) it was the
    rule's first victim (the oldest shadowed node), and conversation 4 would have missed."""
    from dasc_runtime.side_channels import cached_below

    sim = _sim(tmp_path, compressed_slots=5, compressed_only=True, shadowed_first=True)
    sim.rng.randint = lambda a, b: 6 if b > 10 else (a + b) // 2    # chunk split: 6 tokens into SHARED
    _run(sim, SHARED + [81, 82, 83, 84, 85, 86, 87, 88], chunked=True)
    c = _node_of(sim, SHARED[:6])
    r1 = _node_of(sim, sim.request_tokens(SHARED + [81, 82, 83, 84, 85, 86, 87, 88]))
    _run(sim, SHARED + [91, 92, 93])                  # restores c, splits the tree at SHARED's end
    r2 = _node_of(sim, sim.request_tokens(SHARED + [91, 92, 93]))
    fork = _node_of(sim, SHARED)
    assert fork is not None and fork.component_data[sim.MAMBA].value is None and len(fork.children) == 2
    _run(sim, SEQ_X, chunked=True)                    # an unrelated conversation: chunk c3, reply r3 on one chain
    r3 = _node_of(sim, sim.request_tokens(SEQ_X))
    c3 = r3.parent
    assert c3.component_data[sim.MAMBA].value is not None and c3.component_data[sim.MAMBA].metadata["dasc_origin"] == "chunk"
    assert _cached(sim, [c, r1, r2, c3, r3]) == [True] * 5 and sim.dpool.available_size() == 0
    assert cached_below(c.component_data[sim.MAMBA]) == 2                    # counted, yet not shadowed:
    assert [sim.comp.shadows.shadowed(n) for n in (c, r1, r2, c3, r3)] == [False, False, False, True, False]
    lru = sim.lru_ids()
    assert lru.index(c.id) < lru.index(c3.id)        # c is the older: a count-only rule would take it
    _run(sim, SEQ_D)                                  # the pool is full: one checkpoint goes
    assert _cached(sim, [c, r1, r2, c3, r3]) == [True, True, True, False, True]
    assert sim.comp.counters.evictions_shadowed == 1
    restored = sim.stats["restore_compressed"]
    _run(sim, SHARED + [95, 96])                      # a new conversation on the shared prefix restores c
    assert sim.stats["restore_compressed"] == restored + 1
    sim.check(12, content=True)


def test_without_the_fork_test_the_shared_checkpoint_goes_first(tmp_path, monkeypatch):
    """The control DASC_EVICT_FORK_TEST=0 on the case above: c (inside the shared prefix, two cached
    descendants past the fork) counts as shadowed and, the oldest such, is the first to go; a new conversation
    on the shared prefix then finds no compressed checkpoint to restore. The default keeps c (test above)."""
    monkeypatch.setenv("DASC_EVICT_FORK_TEST", "0")
    sim = _sim(tmp_path, compressed_slots=5, compressed_only=True, shadowed_first=True)
    assert sim.comp.shadows.on and not sim.comp.shadows.fork_test
    sim.rng.randint = lambda a, b: 6 if b > 10 else (a + b) // 2
    _run(sim, SHARED + [81, 82, 83, 84, 85, 86, 87, 88], chunked=True)
    c = _node_of(sim, SHARED[:6])
    r1 = _node_of(sim, sim.request_tokens(SHARED + [81, 82, 83, 84, 85, 86, 87, 88]))
    _run(sim, SHARED + [91, 92, 93])
    r2 = _node_of(sim, sim.request_tokens(SHARED + [91, 92, 93]))
    _run(sim, SEQ_X, chunked=True)
    r3 = _node_of(sim, sim.request_tokens(SEQ_X))
    c3 = r3.parent
    assert _cached(sim, [c, r1, r2, c3, r3]) == [True] * 5 and sim.dpool.available_size() == 0
    assert [sim.comp.shadows.shadowed(n) for n in (c, r1, r2, c3, r3)] == [True, False, False, True, False]
    _run(sim, SEQ_D)
    assert _cached(sim, [c, r1, r2, c3, r3]) == [False, True, True, True, True]
    assert sim.comp.counters.evictions_shadowed == 1
    restored = sim.stats["restore_compressed"]
    _run(sim, SHARED + [95, 96])
    assert sim.stats["restore_compressed"] == restored
    sim.check(13, content=True)


def test_evict_fork_test_setting(monkeypatch):
    """DASC_EVICT_FORK_TEST: on unless 0 / false / no / off; off with the shadowed-first rule off is refused
    (the test is that rule's), and so is any other value."""
    from dasc_compile.schema import DascInputError
    from dasc_runtime.tier_operations import evict_fork_test

    monkeypatch.delenv("DASC_EVICT_SHADOWED_FIRST", raising=False)
    monkeypatch.delenv("DASC_EVICT_FORK_TEST", raising=False)
    assert evict_fork_test() is True
    for raw, want in (("1", True), ("", True), (" yes", True), ("0", False), ("Off ", False)):
        monkeypatch.setenv("DASC_EVICT_FORK_TEST", raw)
        assert evict_fork_test() is want
    monkeypatch.setenv("DASC_EVICT_FORK_TEST", "sometimes")
    with pytest.raises(DascInputError, match="DASC_EVICT_FORK_TEST: expected 1 / true / yes / on or 0 / false / no / off, got 'sometimes'"):
        evict_fork_test()
    monkeypatch.setenv("DASC_EVICT_SHADOWED_FIRST", "0")
    monkeypatch.setenv("DASC_EVICT_FORK_TEST", "1")
    assert evict_fork_test() is True                 # on is the default: nothing to refuse
    monkeypatch.setenv("DASC_EVICT_FORK_TEST", " 0")
    with pytest.raises(DascInputError) as err:
        evict_fork_test()
    assert str(err.value) == ("DASC_EVICT_FORK_TEST=0: the fork test belongs to the shadowed-first rule, which "
                              "DASC_EVICT_SHADOWED_FIRST=0 turns off; unset one of them")
