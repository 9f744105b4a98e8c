"""Run in a fresh process by tests/runtime/test_wr.py: dasc-wr's scheduling path through SGLang's own
classes with the plugin's hooks applied by ``load_plugins()`` (they patch SGLang process-wide).

A compressed hit is prepared by SGLang's ``ScheduleBatch.prepare_for_extend`` (the hook plans the
scratch pass there), its ``ForwardBatch`` goes through ``ModelRunner._maybe_execute_deferred_mamba_cow_and_clear``
(SGLang's restore, then the refresh). The scratch pass's forward is SGLang's real extend attention
(``TorchNativeAttnBackend`` + ``RadixAttention`` on the hybrid KV pool, the backend that runs on a CPU)
for the one full-attention layer; the recurrent layers, whose kernels need a GPU, are a stand-in that
checks its scratch state starts at zero and writes a value that is a function of the window's tokens.

Usage (from the repository root): python -m tests.support.runtime_wr_check WR_PLAN_DIR NR_PLAN_DIR
-> prints one JSON object of findings.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from types import SimpleNamespace

warnings.filterwarnings("ignore")

import torch  # noqa: E402

from tests.support import runtime_fixtures as F  # noqa: E402
from tests.support.sglang_steps import steps  # noqa: E402

M, SIZE, KV = 10, 8, 400


def server_args(plan_dir, **extra):
    """Publish SGLang's server args; the ``dasc_*`` settings reach the pool hooks through ``DASC_*`` (what
    a scheduler process inherits from the launcher in either release)."""
    from dasc_runtime.settings import resolve_settings

    dasc = {"plan": plan_dir, "compressed_only": True}
    if "dasc_pool_bytes" not in extra:
        extra["dasc_pool_slots"] = 4
    dasc.update({k[len("dasc_"):]: extra.pop(k) for k in list(extra) if k.startswith("dasc_")})
    for k in [k for k in os.environ if k.startswith("DASC_")]:
        os.environ.pop(k)
    resolve_settings(dasc, env={}, need_plan=False)[0].export()
    F.as_scheduler_env()
    return F.set_server_args(chunk=4, attention_backend="torch_native", **extra)


def refusal(fn) -> str:
    from dasc_runtime.installed import INSTALLED

    INSTALLED.reset()
    try:
        fn()
        return "started"
    except Exception as exc:                    # DascRefusal: one line
        return f"{type(exc).__name__}: {exc}"


def window_state(tokens, shape):
    """The stand-in recurrent layers' state after running ``tokens`` from zero (a function of the tokens)."""
    g = torch.Generator().manual_seed(sum((i + 1) * t for i, t in enumerate(tokens)) % (2 ** 31))
    return torch.randn(shape, generator=g)


class StandInEager:
    """``EagerRunner.execute`` of the scratch pass: SGLang's torch-native extend attention for the
    full-attention layer, a stand-in for the recurrent layers (see module docstring)."""

    def __init__(self, runner, layer_id, emb):
        self.runner, self.layer_id, self.emb, self.calls = runner, layer_id, emb, []

    def execute(self, fb):
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
        from sglang.srt.layers.radix_attention import RadixAttention
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        pool = self.runner.req_to_token_pool
        be = TorchNativeAttnBackend(self.runner)
        be.init_forward_metadata(fb)
        layer = RadixAttention(num_heads=1, head_dim=16, scaling=0.25, num_kv_heads=1, layer_id=self.layer_id)
        e = self.emb[fb.input_ids]
        with forward_context(ForwardContext(attn_backend=be)):
            o = be.forward(e[:, 0].contiguous(), e[:, 1:2].contiguous(), e[:, 2:3].contiguous(), layer, fb)
        slots = pool.get_mamba_indices(fb.req_pool_indices).long()
        mc = pool.mamba_pool.mamba_cache
        start = [float(mc.temporal[:, s].abs().sum()) + sum(float(c[:, s].float().abs().sum()) for c in mc.conv)
                 for s in slots.tolist()]
        ids = fb.input_ids.tolist()
        a = 0
        for s, w in zip(slots.tolist(), fb.extend_seq_lens_cpu):
            mc.temporal[:, s] = window_state(ids[a:a + w], mc.temporal[:, s].shape)
            a += w
        self.calls.append(dict(positions=fb.positions.tolist(), prefix=list(fb.extend_prefix_lens_cpu),
                               seq_lens=fb.seq_lens.tolist(), slots=slots.tolist(), start_abs=start,
                               out_cache_loc=fb.out_cache_loc.tolist(), input_ids=ids, attn=o.float()))
        return None


def main(wr_dir: str, nr_dir: str) -> dict:
    out: dict = {}
    from sglang.srt.plugins import load_plugins

    for k in [k for k in os.environ if k.startswith("DASC_")]:
        os.environ.pop(k)
    load_plugins()
    import pkgutil

    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from dasc_runtime.sglang_api import api

    S, mamba = steps(), api().mamba_state

    import sglang.srt.model_executor.forward_batch_info as fbi
    from dasc_runtime.installed import INSTALLED, status_line

    fbi.enable_num_token_non_padded = lambda: False          # no MoE-EP parallel state on one CPU process
    sa = server_args(wr_dir)
    cp = F.gdn_cache_params()
    pool, alloc = F.hybrid_pools(cp, mamba_size=M, req_size=SIZE, kv_size=KV)
    kv = alloc.get_kvcache()
    budget, dpool = INSTALLED.refresh, pool.mamba_ckpt_pool
    out["budget"] = dict(seqs=budget.seqs, rows=list(budget.rows), slots=list(budget.slots), w_cap=budget.w_cap)
    out["sizes"] = dict(size=pool.size, free_rows=len(pool.free_slots), req_rows=pool.req_to_token.shape[0],
                        mamba_physical=pool.mamba_pool.size, mamba_alloc=pool.mamba_allocator.size,
                        mamba_free=pool.mamba_allocator.available_size(), native_size=dpool.native_size)
    params = CacheInitParams(req_to_token_pool=pool, token_to_kv_pool_allocator=alloc, page_size=1, disable=False)
    cache = S.call_cache_factory(pkgutil.resolve_name(api().CACHE_FACTORY_TARGET), sa, params)
    mcfg = SimpleNamespace(vocab_size=1000, is_encoder_decoder=False, is_multimodal=False, model_is_mrope=False,
                           requires_mm_token_modalities=False)

    lid = max(cp.layers) + 1
    kb, vb = kv.get_key_buffer(lid), kv.get_value_buffer(lid)
    g = torch.Generator().manual_seed(0)
    kb.copy_(torch.randn(kb.shape, generator=g).to(kb.dtype))
    vb.copy_(torch.randn(vb.shape, generator=g).to(vb.dtype))
    emb = torch.randn(1000, 3, 16, generator=g).to(torch.bfloat16)
    runner = SimpleNamespace(device="cpu", req_to_token_pool=pool, token_to_kv_pool=kv,
                             token_to_kv_pool_allocator=alloc, is_draft_worker=False, server_args=sa,
                             model_config=mcfg, ngram_embedding_manager=SimpleNamespace(enabled=False),
                             _prepare_eager_forward_batch=lambda fb: None, **S.runner_fields(pool, alloc))
    runner.eager_runner = StandInEager(runner, lid, emb)

    def admit(tokens):
        req = S.new_req(str(len(tokens)), tokens)
        req.init_next_round_input(cache)
        S.admit_extend(cache, req, tokens)
        b = ScheduleBatch.init_new([req], pool, alloc, cache, mcfg, False, SpeculativeAlgorithm.NONE)
        b.prepare_for_extend()                                  # the hook plans the refresh here
        return req, b

    mc = pool.mamba_pool.mamba_cache
    t1 = list(range(100, 120))
    r1, _ = admit(t1)
    exact = torch.randn(mc.temporal[:, 0].shape, generator=g)
    mc.temporal[:, int(mamba(r1).mamba_pool_idx)] = exact
    S.commit_kv(r1, len(t1))
    S.finish(cache, pool, r1)                                # compressed-only: packed into the pool
    out["compressed_after_insert"] = dpool.used_size()
    cached_kv = sorted(set(cache.all_values_flatten().tolist()))

    r2, b2 = admit(t1 + list(range(300, 306)))
    from dasc_runtime.side_channels import refresh_work, tier_hint

    work = refresh_work(b2.mamba_cow_src_indices)
    out["hint"] = tier_hint(b2.mamba_cow_src_indices)
    out["planned"] = None if work is None else [dict(rows=p.rows, slots=p.slots, windows=p.windows,
                                                     locs=p.batch.out_cache_loc.tolist()) for p in work.passes]
    r2_prefix = S.prefix_locations(cache, r2)
    out["n_p"] = len(r2_prefix)
    own_kv = pool.req_to_token[S.row(r2), :len(t1) + 6].tolist()
    S.forward_inputs(b2)
    fb = ForwardBatch.init_new(b2, runner, return_hidden_states_before_norm=False)
    kb0, vb0 = kb.clone(), vb.clone()
    free0 = alloc.available_size()
    dst = int(mamba(r2).mamba_pool_idx)
    ModelRunner._maybe_execute_deferred_mamba_cow_and_clear(runner, fb)   # restore, then refresh (hooks)
    call = runner.eager_runner.calls[0] if runner.eager_runner.calls else None
    changed = ((kb != kb0).flatten(1).any(1) | (vb != vb0).flatten(1).any(1)).nonzero().flatten().tolist()
    out["kv_rows_written"] = changed
    out["kv_written_in_cache"] = sorted(set(changed) & (set(cached_kv) | set(own_kv)))
    out["kv_free_delta"] = alloc.available_size() - free0
    if call is not None:
        n_p, w = out["n_p"], out["planned"][0]["windows"][0]
        pre = r2_prefix[: n_p - w].tolist()
        ref = reference_attention(kb0, vb0, pre, emb[torch.tensor(call["input_ids"])])
        out["attn_max_err"] = float((call.pop("attn") - ref).abs().max())
        out["scratch_call"] = call
        local = dpool.layout.local_flat
        from dasc_runtime.ops import flat_units

        got = flat_units(dpool.layout, mc.temporal[:, dst:dst + 1])[0]
        want_local = flat_units(dpool.layout, window_state(call["input_ids"], mc.temporal[:, 0].shape).unsqueeze(1))[0]
        want_kept = flat_units(dpool.layout, exact.unsqueeze(1))[0]
        kept = dpool.layout.kept_flat
        out["local_equal_window"] = bool(torch.equal(got[local], want_local[local]))
        out["kept_equal_checkpoint"] = bool(torch.equal(got[kept], want_kept[kept]))
    # a hit whose window finds no KV room (every free slot held, nothing evictable): it stays dasc-nr
    S.unlock(cache, r2)
    hog = alloc.alloc(alloc.available_size() - 4)            # room for the request itself only
    locks = [cache.inc_lock_ref(n) for n in [r2.last_node]]
    r3, b3 = admit(t1 + list(range(400, 404)))
    src3 = b3.mamba_cow_src_indices
    out["no_room"] = dict(work=refresh_work(src3) is not None, hint=tier_hint(src3), skipped=budget.counters.skipped)
    alloc.free(hog)
    del locks
    out["status"] = status_line()
    out["rows_never_free"] = not (set(budget.rows) & set(pool.free_slots))
    out["slots_never_free"] = not (set(budget.slots) & set(pool.mamba_allocator.free_slots.tolist()))
    pool.clear()
    out["after_clear"] = dict(rows=not (set(budget.rows) & set(pool.free_slots)),
                              slots=not (set(budget.slots) & set(pool.mamba_allocator.free_slots.tolist())))

    # refusals, one line each
    def build(**kw):
        F.hybrid_pools(cp, mamba_size=M, req_size=SIZE, kv_size=KV, **kw)

    def with_args(plan_dir, **extra):
        def go():
            server_args(plan_dir, **extra)
            build()
        return go

    out["refuse_zero"] = refusal(with_args(wr_dir, dasc_refresh_slots=0))
    out["refuse_pool_bytes"] = refusal(with_args(wr_dir, dasc_pool_bytes=budget.state_bytes))
    out["pool_bytes_ok"] = refusal(with_args(wr_dir, dasc_pool_bytes=budget.state_bytes + 3 * dpool.bytes_per_slot()))
    out["pool_bytes_slots"] = INSTALLED.pool.num_slots if INSTALLED.pool is not None else None
    out["refuse_nr_slots"] = refusal(with_args(nr_dir, dasc_refresh_slots=4))
    out["refuse_chunk"] = refusal(with_args(wr_dir, chunked_prefill_size=4))
    out["refuse_dp"] = refusal(with_args(wr_dir, enable_dp_attention=True, dp_size=2, tp_size=2))
    server_args(wr_dir)

    def short_context():
        from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool

        HybridReqToTokenPool(size=SIZE, mamba_size=M, mamba_spec_state_size=SIZE, max_context_len=budget.w_cap,
                             device="cpu", enable_memory_saver=False, cache_params=cp, mamba_layer_ids=list(cp.layers),
                             enable_mamba_extra_buffer=False)
    out["refuse_context"] = refusal(short_context)
    return out


def reference_attention(kb, vb, prefix_locs, e):
    """Causal attention of the window over the cached prefix K/V (rows ``prefix_locs``) and the window's own."""
    q, k, v = e[:, 0].float(), e[:, 1].float(), e[:, 2].float()
    pk = kb[prefix_locs, 0].float()
    pv = vb[prefix_locs, 0].float()
    keys, vals = torch.cat([pk, k.to(kb.dtype).float()]), torch.cat([pv, v.to(vb.dtype).float()])
    n0, w = len(prefix_locs), q.shape[0]
    mask = torch.arange(n0 + w)[None, :] <= (n0 + torch.arange(w))[:, None]
    s = (q @ keys.T) * 0.25
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, -1) @ vals


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1], sys.argv[2]), default=str))
