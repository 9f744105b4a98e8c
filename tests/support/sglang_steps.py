"""The scheduler's steps on one request, as each tested SGLang release takes them (the tests' adapter).

The tier tests drive SGLang's real cache the way its scheduler does (``tests/support/runtime_sim.py``).
What the scheduler calls changed between releases (0.5.17: ``cache_unfinished_req`` /
``cache_finished_req`` and request fields on ``Req``; 0.5.23: ``checkpoint`` / ``on_release`` through
``mem_cache/common.py``'s ``checkpoint_kv_cache`` / ``release_kv_cache``, request fields on
``req.kv`` and tree locks held as ``req.lock``). :func:`steps` returns the class for the installed
release; like ``runtime/sglang_api.py`` for the runtime, this is the one test module that knows
which release is which (``tests/architecture/test_sglang_adapter.py``).
"""

from __future__ import annotations

from array import array

import torch


class Steps0517:
    """SGLang 0.5.17 (``managers/schedule_batch.py``, ``managers/schedule_policy.py``, ``mem_cache/unified_radix_cache.py``)."""

    @staticmethod
    def new_req(rid: str, tokens):
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        return Req(rid=rid, origin_input_text="", origin_input_ids=array("q", tokens),
                   sampling_params=SamplingParams(temperature=0, max_new_tokens=1))

    @staticmethod
    def lock(cache, req) -> None:
        """Admission lock on the matched node (``PrefillAdder._req_inc_lock_ref``)."""
        cache.inc_lock_ref(req.last_node)
        req.skip_lock_node_ids = {}

    @staticmethod
    def unlock(cache, req) -> None:
        """Undo :meth:`lock` (the request is not admitted after all)."""
        cache.dec_lock_ref(req.last_node)

    @staticmethod
    def row(req) -> int:
        return req.req_pool_idx

    @staticmethod
    def prefix_locations(cache, req) -> torch.Tensor:
        """KV locations of the matched prefix, int64 ``[prefix_len]``."""
        return req.prefix_indices

    @staticmethod
    def start_extend(req, prefix: int, end: int, tokens) -> None:
        """The request's KV is committed up to ``len(tokens)`` and this forward extends ``[prefix, end)``."""
        req.kv_committed_len = len(tokens)
        req.full_untruncated_fill_ids = array("q", tokens)
        req.set_extend_range(prefix, end)

    @staticmethod
    def checkpoint_chunk(cache, req) -> None:
        """A chunked prefill's chunk goes to the tree (``cache_unfinished_req(req, chunked=True)``)."""
        cache.cache_unfinished_req(req, chunked=True)

    @staticmethod
    def finish(cache, pool, req) -> None:
        """The request finished: its state goes to the tree and its row is freed."""
        cache.cache_finished_req(req, kv_len_to_handle=len(req.origin_input_ids))
        pool.free(req)

    @staticmethod
    def track(pool, req, aligned: int):
        """Extra-buffer tracking of one extend (``ScheduleBatch._prepare_mamba_track``): returns the
        ping-pong slot the state at ``aligned`` tokens is written to, and flips the buffer."""
        idx = req.mamba_next_track_idx
        slot = req.mamba_ping_pong_track_buffer[idx]
        req.mamba_next_track_idx = 1 - idx
        req.mamba_last_track_seqlen = aligned
        return slot

    @staticmethod
    def drop_match(cache, req) -> None:
        """The scheduler's revert of a matched, not admitted request: staged copy-on-write and slot dropped."""
        req.mamba_cow_src_index = None
        req.mamba_needs_clear = False
        if req.mamba_pool_idx is not None:
            cache.req_to_token_pool.mamba_allocator.free(req.mamba_pool_idx.unsqueeze(-1))
            req.mamba_pool_idx = None

    @staticmethod
    def runner_fields(pool, alloc) -> dict:
        """What ``ForwardBatch.init_new`` reads from a model runner beyond 0.5.17's (none)."""
        return {}

    @staticmethod
    def cow_request(src, dst, clear: bool = False):
        """A stand-in request carrying a staged copy-on-write (for the collector hook)."""
        from types import SimpleNamespace

        return SimpleNamespace(mamba_cow_src_index=src, mamba_pool_idx=dst, mamba_needs_clear=clear)


class Steps0523(Steps0517):
    """SGLang 0.5.23: request fields on ``req.kv`` (``ReqKvInfo``), tree locks as ``req.lock``
    (``TreeLock``), chunks and finishes through ``mem_cache/common.py``."""

    @staticmethod
    def lock(cache, req) -> None:
        """``PrefillAdder._commit_prefill_admission``: ``req.lock = tree_cache.lock(req.last_node)``."""
        req.lock = cache.lock(req.last_node)

    @staticmethod
    def unlock(cache, req) -> None:
        cache.unlock(req.lock)
        req.lock = None

    @staticmethod
    def row(req) -> int:
        return req.kv.req_pool_idx

    @staticmethod
    def prefix_locations(cache, req) -> torch.Tensor:
        """A new request reads its match off the tree (``mem_cache/allocation.py``'s ``_prefix_kv_indices``)."""
        if req.prefix_len == 0:
            return torch.empty((0,), dtype=torch.int64)
        return cache.prefix_device_indices(req).to(torch.int64)

    @staticmethod
    def start_extend(req, prefix: int, end: int, tokens) -> None:
        req.kv.kv_committed_len = len(tokens)
        req.kv.kv_allocated_len = len(tokens)
        req.full_untruncated_fill_ids = array("q", tokens)
        req.prefix_len = prefix
        req.extend_end = end

    @staticmethod
    def checkpoint_chunk(cache, req) -> None:
        """``checkpoint_kv_cache``: ``tree_cache.checkpoint(req, up_to=req.extend_end)``."""
        from sglang.srt.mem_cache.common import checkpoint_kv_cache

        checkpoint_kv_cache(req, cache)

    @staticmethod
    def finish(cache, pool, req) -> None:
        """``release_kv_cache(req, tree_cache, checkpoint=True)``: ``checkpoint`` then ``on_release``."""
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH
        from sglang.srt.mem_cache.common import release_kv_cache

        req.finished_reason = FINISH_LENGTH(length=0)
        release_kv_cache(req, cache, checkpoint=True)

    @staticmethod
    def track(pool, req, aligned: int):
        """``ScheduleBatch._prepare_mamba_track`` and the batch result processor: the previous length
        is kept (``mamba_prev_track_seqlen``), the written slot becomes ``mamba_last_track_idx``."""
        kv = req.kv
        idx = kv.mamba_next_track_idx
        slot = kv.mamba_ping_pong_track_buffer[idx]
        kv.mamba_prev_track_seqlen = kv.mamba_last_track_seqlen
        kv.mamba_last_track_idx = idx
        kv.mamba_next_track_idx = pool.get_mamba_ping_pong_other_idx(idx)
        kv.mamba_last_track_seqlen = aligned
        return slot

    @staticmethod
    def drop_match(cache, req) -> None:
        kv = req.kv
        kv.mamba_cow_src_index = None
        kv.mamba_needs_clear = False
        if kv.mamba_pool_idx is not None:
            cache.req_to_token_pool.mamba_allocator.free(kv.mamba_pool_idx.unsqueeze(-1))
            kv.mamba_pool_idx = None

    @staticmethod
    def runner_fields(pool, alloc) -> dict:
        """0.5.23's ``ForwardBatch.init_new`` binds the batch's KV ids through the runner's
        ``kv_index_translator`` (``mem_cache/kv_index_translator.py``, built as ``ModelRunner`` does)."""
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

        translator = KVIndexTranslator(req_to_token=pool.req_to_token, token_to_kv_pool_allocator=alloc,
                                       token_to_kv_pool=alloc.get_kvcache(), page_size=1, device="cpu")
        return dict(kv_index_translator=translator, lora_manager=None, prefill_attention_backend_str="torch_native",
                    attn_tp_sequence_sharded=False)

    @staticmethod
    def cow_request(src, dst, clear: bool = False):
        from types import SimpleNamespace

        return SimpleNamespace(kv=SimpleNamespace(mamba_cow_src_index=src, mamba_pool_idx=dst,
                                                  mamba_needs_clear=clear))


_STEPS = {"0.5.17": Steps0517, "0.5.23": Steps0523}


def steps():
    """The steps of the installed SGLang release (the runtime's adapter says which one it is)."""
    from dasc_runtime.sglang_api import api

    return _STEPS[api().VERSION]
