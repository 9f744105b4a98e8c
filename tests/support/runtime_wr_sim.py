"""dasc-wr inside the CPU scheduler simulation (tests/support/runtime_sim.py): a compressed hit is refreshed
through :func:`dasc_runtime.wr_refresh.plan_refresh` / :func:`~dasc_runtime.wr_refresh.run_refresh`
with SGLang's own ``ScheduleBatch``, ``ForwardBatch`` and allocators.

SGLang's linear-attention kernels need a GPU, so the scratch pass's model forward is a stand-in
(:class:`StandInForward`): it asserts the scratch state it is handed is zero (temporal and conv), that
its KV writes (``out_cache_loc``) touch no cached or request-held KV slot, and writes a temporal
state that is a pure function of the window's tokens (:meth:`WrHarness.window_state`). Every refresh
is then checked: kept units exactly the restored checkpoint, local units that window state, the
window's KV slots back in the allocator.
"""

from __future__ import annotations

import zlib
from array import array
from types import SimpleNamespace

import torch


class StandInForward:
    """``EagerRunner.execute`` for the scratch pass (see module docstring)."""

    def __init__(self, harness) -> None:
        self.h = harness
        self.passes = 0

    def execute(self, fb):
        h, sim = self.h, self.h.sim
        pool = sim.pool
        mc = pool.mamba_pool.mamba_cache
        slots = pool.get_mamba_indices(fb.req_pool_indices).long().tolist()
        assert slots == list(h.budget.slots[:len(slots)]), f"scratch rows map to {slots}, not the scratch slots"
        locs = set(fb.out_cache_loc.tolist())
        held = set(sim.cache.all_values_flatten().tolist())
        for req in sim.inflight:
            held |= set(pool.req_to_token[sim.S.row(req), :len(req.origin_input_ids)].tolist())
        held |= h.current_kv
        assert not (locs & held), f"scratch pass writes cached / request KV slots {sorted(locs & held)}"
        ids, a = fb.input_ids.tolist(), 0
        for s, w, p in zip(slots, fb.extend_seq_lens_cpu, fb.extend_prefix_lens_cpu):
            assert not mc.temporal[:, s].any() and not any(c[:, s].any() for c in mc.conv), \
                f"scratch slot {s} does not start from zero"
            rows = pool.req_to_token[fb.req_pool_indices[slots.index(s)], :p + w].tolist()
            assert rows[p:] == fb.out_cache_loc[a:a + w].tolist(), "scratch row does not map the window to its slots"
            mc.temporal[:, s] = h.window_state(ids[a:a + w])
            a += w
        self.passes += 1


class WrHarness:
    """The model-runner side of dasc-wr for :class:`runtime_sim.Sim` (``Sim(wr=True)``)."""

    def __init__(self, sim) -> None:
        from sglang.srt.server_args import ServerArgs

        from dasc_runtime.installed import INSTALLED

        self.sim = sim
        self.budget = INSTALLED.refresh
        assert self.budget is not None, "the simulation's pool was not built with scratch slots"
        sa = ServerArgs(model_path="dummy", page_size=1, attention_backend="torch_native")
        self.mcfg = SimpleNamespace(vocab_size=100000, is_encoder_decoder=False, is_multimodal=False,
                                    model_is_mrope=False, requires_mm_token_modalities=False)
        self.runner = SimpleNamespace(device="cpu", req_to_token_pool=sim.pool, token_to_kv_pool_allocator=sim.alloc,
                                      is_draft_worker=False, server_args=sa, model_config=self.mcfg,
                                      ngram_embedding_manager=SimpleNamespace(enabled=False),
                                      _prepare_eager_forward_batch=lambda fb: None,
                                      **sim.S.runner_fields(sim.pool, sim.alloc))
        self.runner.eager_runner = StandInForward(self)
        self.current_kv: set = set()

    def window_state(self, tokens):
        """Temporal state ``[L, H, dv, dk]`` of the stand-in model after ``tokens`` from a zero state."""
        g = torch.Generator().manual_seed(zlib.crc32(array("q", [-1] + list(tokens)).tobytes()))
        return torch.randn(self.sim.pool.mamba_pool.mamba_cache.temporal[:, 0].shape, generator=g)

    def refresh(self, req, toks, prefix: int, src, kv) -> tuple:
        """Plan and run the refresh of the compressed hit ``req`` (restored, cached prefix ``prefix``).

        Returns ``(window, refreshed)``: the replayed tokens and whether the pass ran (False: no KV room).
        """
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        from dasc_runtime.wr_refresh import plan_refresh, run_refresh
        from dasc_runtime.wr_scratch import window_tokens

        sim = self.sim
        batch = ScheduleBatch.init_new([req], sim.pool, sim.alloc, sim.cache, self.mcfg, False,
                                       SpeculativeAlgorithm.NONE)
        batch.mamba_cow_src_indices = src
        self.current_kv = set(kv.tolist())
        skipped0 = self.budget.counters.skipped
        work = plan_refresh(batch, [req], [True])
        w = window_tokens(prefix, self.budget.w_cap)
        if work is None:
            assert self.budget.counters.skipped == skipped0 + 1, "a compressed hit was neither refreshed nor skipped"
            return toks[prefix - w:prefix], False
        (p,) = work.passes
        own = sim.pool.req_to_token[sim.S.row(req), :prefix - w].tolist()      # the hit's row, as the sim wrote it
        assert p.windows == [w] and p.prefix[0].tolist() == own
        free0 = sim.alloc.available_size()
        run_refresh(self.runner, work)
        assert sim.alloc.available_size() == free0 + w, "the window's KV slots did not go back to the allocator"
        assert not (set(self.budget.rows) & set(sim.pool.free_slots)), "a scratch row is in SGLang's free list"
        return toks[prefix - w:prefix], True

    def expected(self, nr_state, window):
        """The active state after a refresh: the dasc-nr restore with the local units of the window state."""
        from dasc_runtime.ops import flat_units, unflat_units

        lay = self.sim.layout
        flat = flat_units(lay, nr_state.unsqueeze(1)).clone()
        fresh = flat_units(lay, self.window_state(window).unsqueeze(1))
        flat[:, lay.local_flat] = fresh[:, lay.local_flat]
        return unflat_units(lay, flat)[:, 0]
