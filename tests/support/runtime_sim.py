"""A CPU simulation of SGLang's scheduler driving the two-tier dasc cache (for the tier tests).

It builds the installed SGLang's (0.5.17 or 0.5.23) HybridReqToTokenPool, KV allocator and
UnifiedRadixCache with :class:`dasc_runtime.mamba_component.DascMambaComponent`, then runs requests the
way that release's scheduler does (the steps that differ are :mod:`tests.support.sglang_steps`):
``Req.init_next_round_input`` (match + staged copy-on-write), the admission lock,
``alloc_req_slots``, KV allocation with eviction, a batch of admitted requests whose copy-on-write is
collected through the plugin's own hint path (``plugin.around_collect_cow`` around SGLang's
``ScheduleBatch._collect_deferred_mamba_cow_and_clear``, so batches mix dense and compressed hits)
and restored as the model runner does (``DascCheckpointPool.load_to_active`` on the batch), a
"forward" that writes a state that is a pure function of the token prefix, a chunk's insert
(``cache_unfinished_req`` / ``checkpoint``) for chunked prefill and the finish
(``cache_finished_req`` / ``release_kv_cache``). Requests are also matched and not admitted (the
scheduler's revert), and matched with a Mamba eviction before their admission lock.

With ``streams=True`` (the default) the device is simulated (``tests/support/runtime_streams.py``): the
pool's stores and loads, SGLang's ``copy_from`` and the model's state writes are queued on the
schedule stream, demotion packs on a side stream through dasc's real ``SideStream`` and
``order_after``, and the device runs them later, a few entries per step, in random order where
streams allow it. Restores are checked when they run.

:meth:`Sim.check` verifies every invariant named in ``dasc_runtime.mamba_component``,
``dasc_runtime.tiers`` and ``dasc_runtime.demotion`` plus SGLang's own ``sanity_check``; it raises
``AssertionError`` naming the violated invariant. :func:`run_ops` runs a seeded sequence and names
the seed and step of a failure.
"""

from __future__ import annotations

import inspect
import os
import random
import zlib
from array import array
from collections import defaultdict
from types import SimpleNamespace

import torch

from tests.support import runtime_fixtures as F
from tests.support.runtime_streams import SimDevice, StreamedOps, stream_copy_from
from tests.support.sglang_steps import steps


class Sim:
    """One TP rank's scheduler, cache and (simulated) device; see the module docstring.

    Args (the ones the tests vary): mamba_size M, compressed_slots C, kv_size, watermark,
    compressed_only, seed (host decisions), kind (gdn | kda | mamba2), int8, extra_buffer, chunk (SGLang's
    mamba cache chunk), balance / wr (plan policy), streams (simulated device; False: the real CPU
    path, packs inline), tp_rank / tp_size (this rank of a plan compiled for tp_size; the test sets
    the demotion engine's CPU group), max_states_per_path (SGLang's ``--mamba-max-states-per-path``),
    device_seed (device progress; default from seed and rank), eviction_policy (SGLang's
    ``--radix-eviction-policy``: it orders Full-KV leaf eviction, which cascades to Mamba states),
    shadowed_first (``DASC_EVICT_SHADOWED_FIRST=1`` while the cache is built: shadowed checkpoints are
    evicted first, :mod:`dasc_runtime.tier_operations`; False sets ``0``, App. B.2's one LRU, which the
    deterministic tier tests were written against, although the runtime's default is the rule).
    """

    def __init__(self, tmp, *, mamba_size=10, compressed_slots=5, kv_size=400, watermark=2, compressed_only=False,
                 seed=0, kind="gdn", int8=False, check_content_every=1, extra_buffer=False, chunk=4, balance=None,
                 wr=False, streams=True, tp_rank=0, tp_size=1, max_states_per_path=None, device_seed=None,
                 eviction_policy="lru", shadowed_first=False):
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.unified_cache.components import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        from dasc_runtime.demotion import SideStream
        from dasc_runtime.installed import INSTALLED
        from dasc_runtime.mamba_component import DascMambaComponent
        from dasc_runtime.pool import DascCheckpointPool
        from dasc_runtime.rank_layout import build_rank_layout
        from dasc_runtime.side_channels import attach_tier_policy
        from dasc_runtime.tiers import TierPolicy

        F.set_server_args(chunk=chunk, **({} if max_states_per_path is None else
                                          {"mamba_max_states_per_path": max_states_per_path}))
        from dasc_runtime.sglang_api import api

        self.S = steps()                    # the installed release's scheduler steps
        self.mamba = api().mamba_state      # a request's Mamba fields
        self.extra_buffer, self.chunk = extra_buffer, chunk
        self.seed = seed
        self.rng = random.Random(seed)
        policy = dict(int8=True) if int8 else {}
        if balance is not None:         # "storage": a storage map (at TP 1 no all-to-all, but layout.storage set)
            policy["balance"] = balance
        if wr:                          # dasc-wr: compressed hits are refreshed (tests/support/runtime_wr_sim.py)
            policy["load_policy"] = "wr"
        if tp_size > 1:
            policy["tp_size"] = tp_size
        self.plan, _, _ = F.compile_tiny(tmp, kind, **policy)
        cp = F.cache_params_for(kind, tp_size)
        self.pool, self.alloc = F.hybrid_pools(cp, mamba_size=mamba_size, req_size=8, kv_size=kv_size,
                                               extra_buffer=extra_buffer, wr_plan=self.plan if wr else None,
                                               refresh_slots=2 if wr else None)
        layout = build_rank_layout(self.plan, tp_rank, tp_size, len(cp.layers))
        self.dpool = DascCheckpointPool(layout=layout, num_slots=compressed_slots, conv_shapes=cp.shape.conv,
                                        native_size=self.pool.mamba_pool.size, device="cpu")
        attach_tier_policy(self.dpool, TierPolicy(compressed_only=compressed_only, watermark=watermark))
        self.pool.mamba_ckpt_pool = self.dpool
        self.MAMBA = ComponentType.MAMBA
        env_before = os.environ.get("DASC_EVICT_SHADOWED_FIRST")
        os.environ["DASC_EVICT_SHADOWED_FIRST"] = "1" if shadowed_first else "0"
        try:
            self.cache = UnifiedRadixCache(CacheInitParams(
                req_to_token_pool=self.pool, token_to_kv_pool_allocator=self.alloc, page_size=1, disable=False,
                tree_components=(ComponentType.FULL, ComponentType.MAMBA), enable_mamba_extra_buffer=extra_buffer,
                component_registry_override={ComponentType.MAMBA: DascMambaComponent}, eviction_policy=eviction_policy))
        finally:
            if env_before is None:
                del os.environ["DASC_EVICT_SHADOWED_FIRST"]
            else:
                os.environ["DASC_EVICT_SHADOWED_FIRST"] = env_before
        self.comp = self.cache.components[ComponentType.MAMBA]
        assert self.comp.shadows.on == shadowed_first
        self.device = None
        if streams:
            dseed = device_seed if device_seed is not None else seed * 7919 + 1000003 * tp_rank + 17
            self.device = SimDevice(random.Random(dseed))
            self.comp.demotions.streams = self.device
            self.comp.demotions.side = SideStream(self.device)
            self.dpool.ops = StreamedOps(self.dpool.ops, self.device)
            stream_copy_from(self.pool.mamba_pool, self.device)
        self.layout = layout
        self.M, self.C = mamba_size, compressed_slots
        self.inflight: list = []            # admitted, locked, not finished
        self.harness_locks: dict = {}       # node id -> (value list, tier) while a request holds it
        self.meta: dict = {}                # rid -> (tokens, cached prefix length, KV slots, matched node)
        self.rid = 0
        self.stats = defaultdict(int)
        self.failures: list[str] = []       # restores found wrong when they ran on the device
        self.check_content_every = check_content_every
        # the plugin's hint path (plugin.around_collect_cow) and the batch log line read these
        INSTALLED.pool, INSTALLED.component = self.dpool, self.comp
        self.wr = None
        if wr:
            from tests.support.runtime_wr_sim import WrHarness

            self.wr = WrHarness(self)
        self._universe()

    @property
    def side_events(self) -> list:
        """Events of the demotion packs launched on the side stream (simulated device), in launch order."""
        return self.device.side_events if self.device is not None else []

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

    def _new_req(self):
        toks = self.request_tokens(self.rng.choice(self.seqs))
        self.rid += 1
        return self.S.new_req(str(self.rid), toks), toks

    def admit(self, chunked=False, pressure=False, k=None):
        """Admit a batch of ``k`` (default: 1-3 at random) requests (match, lock, slots, KV each), then
        run their forward."""
        if len(self.inflight) >= 3 or self.pool.available_size() == 0:
            return self.finish()
        if k is None:
            k = self.rng.randint(1, min(3 - len(self.inflight), self.pool.available_size()))
        reqs = []
        for j in range(k):
            req = self._match_and_lock(pressure=pressure and j == 0)
            if req is None:
                break
            reqs.append(req)
        if reqs:
            self._forward(reqs, chunked)

    def _match_and_lock(self, pressure=False):
        """One request through match (staged copy-on-write) and admission; None on backpressure.

        ``pressure``: a Mamba eviction runs between the match and the admission lock (the window in
        which only the staging protection keeps the matched state in place).
        """
        from sglang.srt.mem_cache.allocation import alloc_req_slots
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        req, toks = self._new_req()
        req.init_next_round_input(self.cache)
        node = self.comp.tree_core.node_by_id(req.best_match_node)
        if pressure:
            self.cache.evict(EvictParams(num_tokens=0, mamba_num=self.rng.randint(1, 2)))
            self.stats["pressure"] += 1
        # admission lock (PrefillAdder)
        self.S.lock(self.cache, req)
        st = self.mamba(req)
        if self.pool.mamba_allocator.available_size() < 1 and st.mamba_pool_idx is None:
            self.cache.evict(EvictParams(num_tokens=0, mamba_num=1))
        if st.mamba_pool_idx is None and self.pool.mamba_allocator.available_size() < 1:
            # backpressure: the scheduler would not admit this request now
            self.S.unlock(self.cache, req)
            st.mamba_cow_src_index = None
            self.stats["backpressure"] += 1
            return None
        prefix_locs = self.S.prefix_locations(self.cache, req)
        alloc_req_slots(self.pool, [req], self.cache)
        prefix = len(prefix_locs)
        need = len(toks) - prefix
        if self.alloc.available_size() < need:
            self.cache.evict(EvictParams(num_tokens=need - self.alloc.available_size()))
        kv = self.alloc.alloc(need)
        assert kv is not None, "KV pool exhausted in the simulation"
        self.pool.req_to_token[self.S.row(req), :len(toks)] = torch.cat([prefix_locs.to(kv.dtype), kv]).to(torch.int32)
        self._lock_note(req)
        self.meta[req.rid] = (toks, prefix, kv, node)
        return req

    def match_drop(self):
        """A request matched (its copy-on-write staged) and then not admitted: SGLang's revert
        (``Scheduler._get_new_batch_prefill_raw`` when ``add_one_req`` rejects it)."""
        req, _ = self._new_req()
        req.init_next_round_input(self.cache)
        self.stats["matched_not_admitted"] += self.mamba(req).mamba_cow_src_index is not None
        self.S.drop_match(self.cache, req)

    def _collect(self, reqs):
        """The batch's copy-on-write through the plugin's hook around SGLang's own collector."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch

        from dasc_runtime.installed import INSTALLED
        from dasc_runtime.plugin import around_collect_cow

        batch = SimpleNamespace()
        original = inspect.unwrap(ScheduleBatch._collect_deferred_mamba_cow_and_clear)
        refresh, INSTALLED.refresh = INSTALLED.refresh, None     # the wr harness plans its refresh itself
        try:
            around_collect_cow(original, batch, reqs)
        finally:
            INSTALLED.refresh = refresh
        return batch

    def _held_values(self) -> set:
        out = set()
        for n in self.nodes():
            v = n.component_data[self.MAMBA].value
            if v is not None:
                out.update(v.tolist())
        return out

    def _forward(self, reqs, chunked):
        """The batch's forward: restore every hit (one ``load_to_active``, mixed tiers), check it, write states."""
        from dasc_runtime.side_channels import tier_hint

        cow = [r for r in reqs if self.mamba(r).mamba_cow_src_index is not None]
        srcs = {r.rid: self.mamba(r).mamba_cow_src_index for r in cow}
        batch = self._collect(reqs)
        src = batch.mamba_cow_src_indices
        if cow:
            hint = tier_hint(src)
            assert hint is not None and len(hint) == len(cow), "the plugin attached no tier hint to the batch"
            held = self._held_values()
            for v in src.tolist():
                assert v in held, (f"copy-on-write source {v} is no longer held by the tree when its batch is "
                                   f"collected (freed or moved between the match and the admission lock)")
            self.stats["batch_mixed"] += 0 < sum(hint) < len(hint)
            self.dpool.load_to_active(self.pool.mamba_pool, src, batch.mamba_cow_dst_indices)
            if self.wr is not None and self.device is not None:
                self.device.drain_main()        # the harness's refresh runs on the host, after the restore
            for req, compressed in zip(cow, hint):
                toks, prefix, kv, node = self.meta[req.rid]
                tier = "compressed" if compressed else "dense"
                exp_t, exp_c = self.state_of(toks[:prefix])
                want = exp_t if tier == "dense" else self.nr_of(exp_t)
                if self.wr is not None and tier == "compressed":
                    window, ran = self.wr.refresh(req, toks, prefix, srcs[req.rid], kv)
                    want = self.wr.expected(want, window) if ran else want
                    self.stats["wr_refreshed" if ran else "wr_skipped"] += 1
                self._launch(lambda s=int(self.mamba(req).mamba_pool_idx), w=want, c=exp_c, nid=node.id, t=tier:
                             self._check_restored(s, w, c, nid, t))
                self.stats[f"restore_{tier}"] += 1
        for req in reqs:
            toks, prefix, kv, node = self.meta.pop(req.rid)
            slot = self.mamba(req).mamba_pool_idx
            ext_start = prefix
            if chunked and len(toks) - prefix >= 2:
                k = self.rng.randint(prefix + 1, len(toks) - 1)
                self._write_state(slot, toks[:k])
                self._track(req, toks, prefix, k)
                self.S.start_extend(req, prefix, k, toks)
                self._unlock_note(req)
                self.S.checkpoint_chunk(self.cache, req)
                self._lock_note(req)
                self.stats["unfinished"] += 1
                ext_start = k
            self._track(req, toks, ext_start, len(toks))
            self._write_state(slot, toks)
            self.S.start_extend(req, ext_start, len(toks), toks)
            self.inflight.append(req)

    def _check_restored(self, slot, want, exp_conv, node_id, tier):
        """Runs on the device after the restore; a wrong state is recorded (raised by :meth:`check`),
        so device progress never raises in the middle of a cache call."""
        mc = self.pool.mamba_pool.mamba_cache
        if not torch.equal(mc.temporal[:, slot], want):
            self.failures.append(f"restored state of node {node_id} ({tier}) is wrong")
        elif not all(torch.equal(c[:, slot], e) for c, e in zip(mc.conv, exp_conv)):
            self.failures.append(f"restored conv of node {node_id} ({tier}) is wrong")

    def _launch(self, fn):
        """Run ``fn`` on the device's current stream (now, without a simulated device)."""
        if self.device is None:
            fn()
        else:
            self.device.launch(fn)

    def _track(self, req, toks, start, end):
        """Extra-buffer tracking (ScheduleBatch._prepare_mamba_track): the state at the last
        chunk-aligned position of this extend goes to ping-pong[next_track_idx], which then flips."""
        if not self.extra_buffer or end - start < self.chunk:
            return
        aligned = start + (end - start) // self.chunk * self.chunk
        self._write_state(self.S.track(self.pool, req, aligned), toks[:aligned])

    def _write_state(self, slot, toks):
        """The forward writes state(toks) into native slot ``slot`` (on the schedule stream)."""
        t, convs = self.state_of(toks)
        mc = self.pool.mamba_pool.mamba_cache
        slot = int(slot)

        def write():
            mc.temporal[:, slot] = t
            for c, v in zip(mc.conv, convs):
                c[:, slot] = v
        self._launch(write)

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
        self.S.finish(self.cache, self.pool, req)
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
        """The device catches up a little (side-stream packs complete, in random order)."""
        if self.device is not None:
            self.device.progress(self.device.rng.randint(2, 8))

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
        if content and self.device is not None:
            self.device.drain_main()            # host reads see what the schedule stream sees (packs may pend)
        assert not self.failures, f"step {step}: {self.failures[0]}"
        self.cache.sanity_check()
        c = comp.counters
        assert (c.hits_dense, c.hits_compressed) == (self.stats["restore_dense"], self.stats["restore_compressed"]), \
            (f"step {step}: hits d/c {c.hits_dense}/{c.hits_compressed} != admitted restores "
             f"{self.stats['restore_dense']}/{self.stats['restore_compressed']} (hits must count admissions)")
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
        self._check_account(step)
        self._check_shadows(step)
        assert locked == comp.book.locked, f"step {step}: locked counts {comp.book.locked} != recount {locked}"
        for req in self.inflight:
            st = self.mamba(req)
            native_held.append(int(st.mamba_pool_idx))
            if self.extra_buffer:
                native_held += [v for v in st.mamba_ping_pong_track_buffer.tolist() if v != -1]
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

    def _check_account(self, step):
        """The checkpoint account (runtime/account.py) agrees with the tree: per origin, stored minus evicted
        = nodes holding a state of that origin, reused minus evicted-after-reuse = those marked reused."""
        from dasc_runtime.account import ORIGINS

        held = dict.fromkeys(ORIGINS, 0)
        held_reused = dict.fromkeys(ORIGINS, 0)
        for n in self.nodes():
            md = n.component_data[self.MAMBA].metadata
            if n.component_data[self.MAMBA].value is None:
                assert "dasc_origin" not in md, f"step {step}: node {n.id} has an origin but no state"
                continue
            o = md.get("dasc_origin")
            assert o in ORIGINS, f"step {step}: node {n.id} holds a state of unknown origin {o!r}"
            held[o] += 1
            held_reused[o] += bool(md.get("dasc_reused"))
        c = self.comp.account.counts
        for o in ORIGINS:
            assert c["stored"][o] - c["evicted_unused"][o] - c["evicted_reused"][o] == held[o], \
                f"step {step}: {o}: stored {c['stored'][o]} - evicted != held {held[o]} ({c})"
            assert c["reused"][o] - c["evicted_reused"][o] == held_reused[o], \
                f"step {step}: {o}: reused {c['reused'][o]} - evicted after reuse != held reused {held_reused[o]}"
        assert c["stored"]["prompt"] == c["stored"]["decode"] == 0, f"step {step}: the simulation caches no prompt " \
            f"ends and no decode states, the account says {c['stored']}"

    def _check_shadows(self, step):
        """With the shadowed-first rule every node's count of cached descendants (ShadowCounts) equals a
        recount of the tree, and ``shadows.shadowed(node)`` is exactly "a cached node lies below it with no
        fork between" (each node between has one child; with ``DASC_EVICT_FORK_TEST=0``: "a cached node lies
        below it"); without it no node carries a count and none is shadowed."""
        below = {}

        def recount(n):                     # cached checkpoints strictly below n (iterative post-order)
            order, stack = [], [n]
            while stack:
                x = stack.pop()
                order.append(x)
                stack.extend(x.children.values())
            for x in reversed(order):
                below[x.id] = sum(below[c.id] + (c.component_data[self.MAMBA].value is not None)
                                  for c in x.children.values())

        recount(self.comp.tree_core.root_node)
        for n in self.nodes():
            md = n.component_data[self.MAMBA].metadata
            if self.comp.shadows.on:
                assert md.get("dasc_below", 0) == below[n.id], \
                    f"step {step}: node {n.id} counts {md.get('dasc_below', 0)} cached descendants, recount {below[n.id]}"
            else:
                assert "dasc_below" not in md, f"step {step}: node {n.id} has a descendant count with the rule off"
        # the predicate the rule evicts by, against a walk up from each cached node (not against its own
        # counts or its walk down): its ancestors up to the first one with a second child are shadowed
        chain_above = set()
        root = self.comp.tree_core.root_node
        for d in self.nodes():
            if d.component_data[self.MAMBA].value is None:
                continue
            a = d.parent
            while a is not None and a is not root and len(a.children) == 1:
                chain_above.add(a.id)
                a = a.parent
        for n in self.nodes():
            if self.comp.shadows.fork_test:
                want = self.comp.shadows.on and n.id in chain_above
                assert want <= (below[n.id] > 0)
            else:                   # the control DASC_EVICT_FORK_TEST=0: any cached descendant shadows
                want = self.comp.shadows.on and below[n.id] > 0
            assert self.comp.shadows.shadowed(n) == want, \
                f"step {step}: node {n.id} shadowed() {self.comp.shadows.shadowed(n)}, recount {below[n.id]}, " \
                f"on a chain above a cached node: {n.id in chain_above}"

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
            if self.layout.storage is not None and self.layout.tp_size > 1:
                pass        # the row holds units of both ranks (storage balancing): checked by the restores
            elif self.layout.int8:
                q, s = self.dpool.ops.quantize(self.layout, packed.unsqueeze(0))
                assert torch.equal(self.dpool.temporal[row], q[0]), f"step {step}: node {node.id} payload corrupted"
            else:
                assert torch.equal(self.dpool.temporal[row], packed), f"step {step}: node {node.id} payload corrupted"
            for c, e in zip(self.dpool.conv, exp_c):
                assert torch.equal(c[:, row], e), f"step {step}: node {node.id} conv corrupted"

    # ---------------------------------------------------------------- driver

    OPS = (("admit", 26), ("admit_chunked", 8), ("admit_pressure", 6), ("finish", 26), ("evict_mamba", 8),
           ("evict_tokens", 6), ("demote", 8), ("complete_events", 6), ("maintain", 6), ("match_only", 4),
           ("match_drop", 4))

    def step(self, i):
        names, weights = zip(*self.OPS)
        op = self.rng.choices(names, weights)[0]
        # ops that never access a state must leave the survivors' LRU order as it was
        before = self.lru_ids() if op in ("demote", "complete_events", "maintain", "evict_mamba", "evict_tokens") else None
        if op == "admit_chunked":
            self.admit(chunked=True)
        elif op == "admit_pressure":
            self.admit(pressure=True)
        else:
            getattr(self, op)()
        self.stats[op] += 1
        if before is not None:
            after = self.lru_ids()
            assert after == [x for x in before if x in set(after)], f"step {i}: {op} changed the LRU order"
        if self.device is not None:
            self.device.progress(self.device.rng.randint(0, 3))
        self.check(i, content=(i % self.check_content_every == 0))
        return op

    def digest(self) -> tuple:
        """Every host decision of the cache, rank-independent: per cached prefix its tier and value,
        the pending demotions, both free lists and the counters (TP ranks must agree on all of it)."""
        nodes = []
        for n in self.nodes():
            cd = n.component_data[self.MAMBA]
            if cd.value is not None:
                nodes.append((tuple(self.prefix_tokens(n)), self.comp.tier(n), tuple(cd.value.tolist()), cd.lock_ref))
        pending = sorted(tuple(self.prefix_tokens(d.node)) for d in self.comp.pending.values())
        return (sorted(nodes), pending, sorted(self.pool.mamba_allocator.free_slots.tolist()), sorted(self.dpool._free),
                tuple((k, v) for k, v in vars(self.comp.counters).items() if k != "reclaim_wait_host_s"))


def run_ops(sim, n_ops: int, label: str, after_step=None) -> None:
    """Run ``n_ops`` seeded steps of ``sim``; a failure names the seed and the step that broke.

    The sequence of a seed does not depend on ``n_ops``, so the failing step reproduces with any
    ``n_ops`` above it. ``label`` says how to rerun (test id and environment). ``after_step(i)``
    runs after every step (e.g. a cross-rank comparison).
    """
    for i in range(n_ops):
        try:
            sim.step(i)
            if after_step is not None:
                after_step(i)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n[{label}: seed {sim.seed} failed at step {i}]") from exc
