"""A CPU simulation of SGLang's scheduler driving the two-tier dasc cache (for the tier tests).

It builds SGLang 0.5.17's HybridReqToTokenPool, KV allocator and UnifiedRadixCache with
:class:`dasc_runtime.mamba_component.DascMambaComponent`, then runs requests the way the scheduler does:
``Req.init_next_round_input`` (match + staged copy-on-write), ``inc_lock_ref`` (admission),
``alloc_req_slots``, KV allocation with eviction, a "forward" that performs the staged restore
(``DascCheckpointPool.load_to_active``) and writes a state that is a pure function of the token
prefix, ``cache_unfinished_req`` for chunked prefill and ``cache_finished_req``.

:meth:`Sim.check` verifies every invariant named in ``dasc_runtime.mamba_component``,
``dasc_runtime.tiers`` and ``dasc_runtime.demotion`` plus SGLang's own ``sanity_check``; it raises
``AssertionError`` naming the violated invariant.
"""

from __future__ import annotations

import random
import zlib
from array import array
from collections import defaultdict

import torch

import runtime_fixtures as F


class FakeEvent:
    """Side-stream completion record whose completion the test controls."""

    def __init__(self) -> None:
        self.done = False
        self.waited = 0

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited += 1
        self.done = True


class FakeSideStream:
    """Runs the pack immediately (CPU) but hands back a :class:`FakeEvent` that starts incomplete."""

    def __init__(self) -> None:
        self.events: list[FakeEvent] = []

    def run(self, fn):
        fn()
        ev = FakeEvent()
        self.events.append(ev)
        return ev


class Sim:
    def __init__(self, tmp, *, mamba_size=10, compressed_slots=5, kv_size=400, watermark=2, compressed_only=False,
                 seed=0, kind="gdn", int8=False, check_content_every=1, extra_buffer=False, chunk=4, balance=None,
                 wr=False):
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        from dasc_runtime.mamba_component import DascMambaComponent
        from dasc_runtime.pool import DascCheckpointPool
        from dasc_runtime.rank_layout import build_rank_layout
        from dasc_runtime.side_channels import attach_tier_policy
        from dasc_runtime.tiers import TierPolicy

        F.set_server_args(chunk=chunk)
        self.extra_buffer, self.chunk = extra_buffer, chunk
        self.rng = random.Random(seed)
        policy = dict(int8=True) if int8 else {}
        if balance is not None:         # e.g. "storage": a TP=1 storage map (no all-to-all, layout.storage set)
            policy["balance"] = balance
        if wr:                          # dasc-wr: compressed hits are refreshed (tests/runtime_wr_sim.py)
            policy["load_policy"] = "wr"
        self.plan, _, _ = F.compile_tiny(tmp, kind, **policy)
        cp = F.gdn_cache_params() if kind == "gdn" else F.kda_cache_params()
        self.pool, self.alloc = F.hybrid_pools(cp, mamba_size=mamba_size, req_size=8, kv_size=kv_size,
                                               extra_buffer=extra_buffer, wr_plan=self.plan if wr else None,
                                               refresh_slots=2 if wr else None)
        layout = build_rank_layout(self.plan, 0, 1, len(cp.layers))
        self.dpool = DascCheckpointPool(layout=layout, num_slots=compressed_slots, conv_shapes=cp.shape.conv,
                                        native_size=self.pool.mamba_pool.size, device="cpu")
        attach_tier_policy(self.dpool, TierPolicy(compressed_only=compressed_only, watermark=watermark))
        self.pool.mamba_ckpt_pool = self.dpool
        self.MAMBA = ComponentType.MAMBA
        self.cache = UnifiedRadixCache(CacheInitParams(
            req_to_token_pool=self.pool, token_to_kv_pool_allocator=self.alloc, page_size=1, disable=False,
            tree_components=(ComponentType.FULL, ComponentType.MAMBA), enable_mamba_extra_buffer=extra_buffer,
            component_registry_override={ComponentType.MAMBA: DascMambaComponent}))
        self.comp = self.cache.components[ComponentType.MAMBA]
        self.side = FakeSideStream()
        self.comp.demotions.side = self.side
        self.layout = layout
        self.M, self.C = mamba_size, compressed_slots
        self.inflight: list = []            # admitted, locked, not finished
        self.harness_locks: dict = {}       # node id -> (value list, tier) while a request holds it
        self.rid = 0
        self.stats = defaultdict(int)
        self.check_content_every = check_content_every
        self.wr = None
        if wr:
            from runtime_wr_sim import WrHarness
            from dasc_runtime.installed import INSTALLED

            INSTALLED.pool = self.dpool
            self.wr = WrHarness(self)
        self._universe()

    # ---------------------------------------------------------------- token universe and states

    def _universe(self, n_seq=28):
        """Sequences that extend earlier requests: child = request(parent) + new tokens."""
        nxt = [1000]

        def fresh(k):
            out = list(range(nxt[0], nxt[0] + k))
            nxt[0] += k
            return out

        self.seqs = []
        for i in range(n_seq):
            if i < 4 or self.rng.random() < 0.3:
                s = fresh(self.rng.randint(3, 8))
            else:
                parent = self.rng.choice(self.seqs)
                s = parent + [self._tail(parent)] + fresh(self.rng.randint(1, 5))
            self.seqs.append(s)

    @staticmethod
    def _tail(seq):
        return 100 + zlib.crc32(array("q", seq).tobytes()) % 800

    def request_tokens(self, seq):
        return seq + [self._tail(seq)]

    def state_of(self, tokens):
        """Deterministic (temporal, conv list) for a token prefix."""
        g = torch.Generator().manual_seed(zlib.crc32(array("q", tokens).tobytes()))
        mc = self.pool.mamba_pool.mamba_cache
        t = torch.randn(mc.temporal[:, 0].shape, generator=g)
        convs = [torch.randn(c[:, 0].shape, generator=g).to(c.dtype) for c in mc.conv]
        return t, convs

    def nr_of(self, temporal):
        """dasc-nr image of a dense temporal state [L, H, dv, dk]: local units zero; with INT8 the kept
        units are the Eq. 8 round trip."""
        from dasc_runtime.ops import flat_units, unflat_units

        flat = flat_units(self.layout, temporal.unsqueeze(1)).clone()
        flat[:, self.layout.local_flat] = 0
        if self.layout.int8:
            ops = self.dpool.ops
            kept = flat[:, self.layout.kept_flat]
            q, s = ops.quantize(self.layout, kept)
            flat[:, self.layout.kept_flat] = ops.dequantize(self.layout, q, s)
        return unflat_units(self.layout, flat)[:, 0]

    # ---------------------------------------------------------------- scheduler-like steps

    def admit(self, chunked=False):
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.mem_cache.allocation import alloc_req_slots
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams
        from sglang.srt.sampling.sampling_params import SamplingParams

        if len(self.inflight) >= 3 or self.pool.available_size() == 0:
            return self.finish()
        seq = self.rng.choice(self.seqs)
        toks = self.request_tokens(seq)
        self.rid += 1
        req = Req(rid=str(self.rid), origin_input_text="", origin_input_ids=array("q", toks),
                  sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
        req.init_next_round_input(self.cache)
        node = self.comp.tree_core.node_by_id(req.best_match_node)
        staged = req.mamba_cow_src_index
        # admission lock (PrefillAdder._req_inc_lock_ref)
        self.cache.inc_lock_ref(req.last_node)
        req.skip_lock_node_ids = {}
        if self.pool.mamba_allocator.available_size() < 1 and req.mamba_pool_idx is None:
            self.cache.evict(EvictParams(num_tokens=0, mamba_num=1))
        if req.mamba_pool_idx is None and self.pool.mamba_allocator.available_size() < 1:
            # backpressure: the scheduler would not admit this request now
            self.cache.dec_lock_ref(req.last_node)
            req.mamba_cow_src_index = None
            self.stats["backpressure"] += 1
            return
        alloc_req_slots(self.pool, [req], self.cache)
        prefix = len(req.prefix_indices)
        need = len(toks) - prefix
        if self.alloc.available_size() < need:
            self.cache.evict(EvictParams(num_tokens=need - self.alloc.available_size()))
        kv = self.alloc.alloc(need)
        assert kv is not None, "KV pool exhausted in the simulation"
        self.pool.req_to_token[req.req_pool_idx, :len(toks)] = torch.cat([req.prefix_indices, kv]).to(torch.int32)
        self._lock_note(req)
        # forward: staged restore on the "forward stream", then the prefill writes state(prefix)
        slot = req.mamba_pool_idx
        if staged is not None:
            assert req.mamba_cow_src_index is not None
            tier = self.comp.tier(node)
            self.dpool.load_to_active(self.pool.mamba_pool, req.mamba_cow_src_index, slot.view(1))
            req.mamba_cow_src_index = None
            exp_t, exp_c = self.state_of(toks[:prefix])
            want = exp_t if tier == "dense" else self.nr_of(exp_t)
            if self.wr is not None and tier == "compressed":
                window, ran = self.wr.refresh(req, toks, prefix, staged, kv)
                want = self.wr.expected(want, window) if ran else want
                self.stats["wr_refreshed" if ran else "wr_skipped"] += 1
            got = self.pool.mamba_pool.mamba_cache.temporal[:, int(slot)]
            assert torch.equal(got, want), f"restored state of node {node.id} ({tier}) is wrong"
            for c, e in zip(self.pool.mamba_pool.mamba_cache.conv, exp_c):
                assert torch.equal(c[:, int(slot)], e), f"restored conv of node {node.id} is wrong"
            self.stats[f"restore_{tier}"] += 1
        req.kv_committed_len = len(toks)
        req.full_untruncated_fill_ids = array("q", toks)
        ext_start = prefix
        if chunked and len(toks) - prefix >= 2:
            k = self.rng.randint(prefix + 1, len(toks) - 1)
            self._write_state(slot, toks[:k])
            self._track(req, toks, prefix, k)
            req.set_extend_range(prefix, k)
            self._unlock_note(req)
            self.cache.cache_unfinished_req(req, chunked=True)
            self._lock_note(req)
            self.stats["unfinished"] += 1
            ext_start = k
        self._track(req, toks, ext_start, len(toks))
        self._write_state(slot, toks)
        req.set_extend_range(0, len(toks))
        self.inflight.append(req)

    def _track(self, req, toks, start, end):
        """Extra-buffer tracking (ScheduleBatch._prepare_mamba_track): the state at the last
        chunk-aligned position of this extend goes to ping-pong[next_track_idx], which then flips."""
        if not self.extra_buffer or end - start < self.chunk:
            return
        aligned = start + (end - start) // self.chunk * self.chunk
        idx = req.mamba_next_track_idx
        self._write_state(req.mamba_ping_pong_track_buffer[idx], toks[:aligned])
        req.mamba_next_track_idx = 1 - idx
        req.mamba_last_track_seqlen = aligned

    def _write_state(self, slot, toks):
        t, convs = self.state_of(toks)
        mc = self.pool.mamba_pool.mamba_cache
        mc.temporal[:, int(slot)] = t
        for c, v in zip(mc.conv, convs):
            c[:, int(slot)] = v

    def _lock_note(self, req):
        n = self.comp.tree_core.node_by_id(req.last_node)
        cd = n.component_data[self.MAMBA]
        if cd.value is not None:
            self.harness_locks.setdefault(n.id, [0, None, None])
            e = self.harness_locks[n.id]
            e[0] += 1
            e[1], e[2] = cd.value.tolist(), self.comp.tier(n)

    def _unlock_note(self, req):
        nid = req.last_node
        if nid in self.harness_locks:
            self.harness_locks[nid][0] -= 1
            if self.harness_locks[nid][0] == 0:
                del self.harness_locks[nid]

    def finish(self):
        if not self.inflight:
            return self.admit()
        req = self.inflight.pop(self.rng.randrange(len(self.inflight)))
        self._unlock_note(req)
        self.cache.cache_finished_req(req, kv_len_to_handle=len(req.origin_input_ids))
        self.pool.free(req)
        self.stats["finished"] += 1

    def evict_mamba(self):
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        free0 = self.pool.mamba_allocator.available_size()
        n = self.rng.randint(1, 2)
        res = self.cache.evict(EvictParams(num_tokens=0, mamba_num=n))
        assert self.pool.mamba_allocator.available_size() - free0 == res.mamba_num_evicted, \
            "mamba_num_evicted must count native slots freed"

    def evict_tokens(self):
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        self.cache.evict(EvictParams(num_tokens=self.rng.randint(1, 30)))

    def demote(self):
        x = self.comp._oldest("dense")
        if x is not None and self.dpool.available_size() > 0:
            self.comp.demote_async(x)
            self.stats["demote_async"] += 1

    def complete_events(self):
        for ev in self.side.events:
            if self.rng.random() < 0.5:
                ev.done = True

    def maintain(self):
        self.comp.maintain()

    def match_only(self):
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

        seq = self.rng.choice(self.seqs)
        self.cache.match_prefix(MatchPrefixParams(key=F.radix_key(self.request_tokens(seq))))

    # ---------------------------------------------------------------- invariants

    def lru_ids(self):
        lru = self.comp.tree_core.lru_lists[self.MAMBA]
        out, x = [], lru.tail.lru_prev[lru._pt]
        while x is not lru.head:
            if x is not lru.mid and x is not lru.cursor:
                out.append(x.id)
            x = x.lru_prev[lru._pt]
        return out

    def nodes(self):
        tc = self.comp.tree_core
        out, stack = [], [tc.root_node]
        while stack:
            n = stack.pop()
            if n is not tc.root_node:
                out.append(n)
            stack.extend(n.children.values())
        return out

    def prefix_tokens(self, node):
        parts = []
        tc = self.comp.tree_core
        while node is not tc.root_node:
            parts.append(list(node.key.token_ids) if hasattr(node.key, "token_ids") else list(node.key))
            node = node.parent
        return [t for p in reversed(parts) for t in p]

    def check(self, step, content=False):
        comp, dp = self.comp, self.dpool
        self.cache.sanity_check()
        count = {"dense": 0, "compressed": 0}
        locked = {"dense": 0, "compressed": 0}
        native_held, comp_held = [], []
        for n in self.nodes():
            cd = n.component_data[self.MAMBA]
            if cd.value is None:
                assert "dasc_tier" not in cd.metadata, f"step {step}: node {n.id} has a tier but no state"
                continue
            t = comp.tier(n)
            count[t] += 1
            locked[t] += cd.lock_ref > 0
            if t == "dense":
                assert not dp.is_own_id_tensor(cd.value), f"step {step}: dense node {n.id} holds a compressed id"
                native_held += cd.value.tolist()
            else:
                assert dp.is_own_id_tensor(cd.value), f"step {step}: compressed node {n.id} id is not a pool view"
                comp_held += dp.slots_of(cd.value)
            if content:
                self._check_content(step, n, t)
        assert count == comp.book.counts(), f"step {step}: tier counts {comp.book.counts()} != recount {count}"
        assert locked == comp.book.locked, f"step {step}: locked counts {comp.book.locked} != recount {locked}"
        for req in self.inflight:
            native_held.append(int(req.mamba_pool_idx))
            if self.extra_buffer:
                native_held += [v for v in req.mamba_ping_pong_track_buffer.tolist() if v != -1]
        free_native = self.pool.mamba_allocator.free_slots.tolist()
        every = sorted(free_native + native_held)
        assert every == list(range(1, self.M + 1)), \
            f"step {step}: native slots leaked or double-owned: free={sorted(free_native)} held={sorted(native_held)}"
        for d in comp.pending.values():
            comp_held += dp.slots_of(d.target)
            cd = d.node.component_data[self.MAMBA]
            assert cd.lock_ref >= 1 and comp.tier(d.node) == "dense", f"step {step}: pending node {d.node.id} unpinned"
        every_c = sorted(dp._free + comp_held)
        assert every_c == list(range(1, self.C + 1)), \
            f"step {step}: compressed slots leaked or double-owned: free={sorted(dp._free)} held={sorted(comp_held)}"
        assert all(dp._in_use[c] for c in comp_held) and not any(dp._in_use[c] for c in dp._free), \
            f"step {step}: allocator flags disagree with ownership"
        assert comp.book.dense_evictable() + comp.book.dense_protected() == count["dense"]
        for nid, (_, value, tier) in self.harness_locks.items():
            n = comp.tree_core._node_arena.get(nid)
            assert n is not None, f"step {step}: locked node {nid} was deleted"
            cd = n.component_data[self.MAMBA]
            assert cd.value is not None and cd.value.tolist() == value and comp.tier(n) == tier, \
                f"step {step}: locked node {nid} changed ({tier}->{comp.tier(n)})"

    def _check_content(self, step, node, tier):
        toks = self.prefix_tokens(node)
        exp_t, exp_c = self.state_of(toks)
        cd = node.component_data[self.MAMBA]
        if tier == "dense":
            got = self.pool.mamba_pool.mamba_cache.temporal[:, int(cd.value)]
            assert torch.equal(got, exp_t), f"step {step}: dense node {node.id} content corrupted"
        else:
            row = self.dpool.slots_of(cd.value)[0]
            packed = self.dpool.ops.pack_units(self.layout, exp_t.unsqueeze(1), torch.tensor([0]))[0]
            if self.layout.int8:
                q, s = self.dpool.ops.quantize(self.layout, packed.unsqueeze(0))
                assert torch.equal(self.dpool.temporal[row], q[0]), f"step {step}: node {node.id} payload corrupted"
            else:
                assert torch.equal(self.dpool.temporal[row], packed), f"step {step}: node {node.id} payload corrupted"
            for c, e in zip(self.dpool.conv, exp_c):
                assert torch.equal(c[:, row], e), f"step {step}: node {node.id} conv corrupted"

    # ---------------------------------------------------------------- driver

    OPS = (("admit", 26), ("admit_chunked", 8), ("finish", 26), ("evict_mamba", 8), ("evict_tokens", 6),
           ("demote", 8), ("complete_events", 6), ("maintain", 6), ("match_only", 6))

    def step(self, i):
        names, weights = zip(*self.OPS)
        op = self.rng.choices(names, weights)[0]
        # ops that never access a state must leave the survivors' LRU order as it was
        before = self.lru_ids() if op in ("demote", "complete_events", "maintain", "evict_mamba", "evict_tokens") else None
        if op == "admit_chunked":
            self.admit(chunked=True)
        else:
            getattr(self, op)()
        self.stats[op] += 1
        if before is not None:
            after = self.lru_ids()
            assert after == [x for x in before if x in set(after)], f"step {i}: {op} changed the LRU order"
        self.check(i, content=(i % self.check_content_every == 0))
        return op
