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

    #: server options dasc refuses that this release does not have (added in a later one)
    ABSENT_OPTIONS = frozenset({"enable_unified_cache_external_linker", "attn_dp_size"})

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
    def commit_kv(req, n: int) -> None:
        """The forward committed ``n`` tokens of KV (what the batch result processor records)."""
        req.kv_committed_len = n

    @classmethod
    def admit_extend(cls, cache, req, tokens) -> None:
        """A matched request admitted for one extend of the rest of ``tokens`` (lock + extend range)."""
        cls.lock(cache, req)
        req.set_extend_range(len(req.prefix_indices), len(tokens))

    @staticmethod
    def forward_inputs(batch) -> None:
        """What the scheduler does to a prepared batch before ``ForwardBatch.init_new`` (nothing in 0.5.17)."""

    @staticmethod
    def call_cache_factory(factory, server_args, params):
        """Build the tree cache through the unified radix cache factory, ``(ctx, server_args, params)``."""
        from types import SimpleNamespace

        ctx = SimpleNamespace(is_hybrid_swa=False, is_hybrid_ssm=True, enable_hierarchical_cache=False)
        return factory(ctx, server_args, params)

    @staticmethod
    def engine_server_args(**kwargs):
        """The ``ServerArgs`` ``Engine(**kwargs)`` builds, without launching anything: 0.5.17's Engine
        builds ``ServerArgs(**kwargs)``, which is where dasc's keyword-argument hook sits."""
        from sglang.srt.server_args import ServerArgs

        return ServerArgs(**kwargs)

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
    def weight_manager(worker, flush_cache):
        """SGLang's ``SchedulerWeightUpdaterManager`` over a stand-in ``TpModelWorker`` (no TP group, no draft)."""
        from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager

        return SchedulerWeightUpdaterManager(tp_worker=worker, draft_worker=None, tp_cpu_group=None,
                                            memory_saver_adapter=None, flush_cache=flush_cache,
                                            is_fully_idle=lambda: True)

    @staticmethod
    def update_requests(flush_cache: bool) -> dict:
        """One request per weight-replacing manager method (the runtime adapter's ``WEIGHT_UPDATE_METHODS``)."""
        from sglang.srt.managers import io_struct as io

        return {
            "update_weights_from_disk": io.UpdateWeightFromDiskReqInput(model_path="/new", flush_cache=flush_cache),
            "update_weights_from_distributed": io.UpdateWeightsFromDistributedReqInput(
                names=[], dtypes=[], shapes=[], flush_cache=flush_cache),
            "update_weights_from_tensor": io.UpdateWeightsFromTensorReqInput(serialized_named_tensors=[],
                                                                             flush_cache=flush_cache),
            "update_weights_from_ipc": io.UpdateWeightsFromIPCReqInput(zmq_handles={}, flush_cache=flush_cache),
        }

    @staticmethod
    def before_update(manager, method: str) -> None:
        """What an update call needs first (nothing in 0.5.17)."""

    @staticmethod
    def cow_request(src, dst, clear: bool = False):
        """A stand-in request carrying a staged copy-on-write (for the collector hook)."""
        from types import SimpleNamespace

        return SimpleNamespace(mamba_cow_src_index=src, mamba_pool_idx=dst, mamba_needs_clear=clear)


class Steps0523(Steps0517):
    """SGLang 0.5.23: request fields on ``req.kv`` (``ReqKvInfo``), tree locks as ``req.lock``
    (``TreeLock``), chunks and finishes through ``mem_cache/common.py``."""

    ABSENT_OPTIONS = frozenset()

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
    def commit_kv(req, n: int) -> None:
        req.kv.kv_committed_len = n

    @classmethod
    def admit_extend(cls, cache, req, tokens) -> None:
        cls.lock(cache, req)
        req.extend_end = len(tokens)                # prefix_len was set by the match

    @staticmethod
    def forward_inputs(batch) -> None:
        """0.5.23 stages prefill ids on the host; ``overlap_utils.resolve_forward_inputs`` moves them."""
        batch.input_ids = batch.prefill_input_ids_cpu.to(batch.device)
        batch.prefill_input_ids_cpu = None

    @staticmethod
    def call_cache_factory(factory, server_args, params):
        """``create_unified_radix_cache(ctx)``: the params and server args ride on the build context."""
        from types import SimpleNamespace

        ctx = SimpleNamespace(is_hybrid_swa=False, is_hybrid_ssm=True, enable_hierarchical_cache=False,
                              params=params, server_args=server_args, tp_worker=None)
        return factory(ctx)

    @staticmethod
    def engine_server_args(**kwargs):
        """The ``ServerArgs`` ``Engine(**kwargs)`` builds: 0.5.23's Engine (where dasc's keyword-argument hook
        sits) runs up to launching its subprocesses, which this stand-in replaces by a stop."""
        from sglang.srt.entrypoints.engine import Engine

        class _Stop(Exception):
            pass

        built = []

        class _NoLaunch(Engine):
            def _launch_subprocesses(self, server_args, **_):
                built.append(server_args)
                raise _Stop

        try:
            _NoLaunch(**kwargs)
        except _Stop:
            pass
        return built[0]

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
    def weight_manager(worker, flush_cache):
        """0.5.23's manager reads the TP CPU group from the runtime context and records weight versions on
        its scheduler; a one-process stand-in for both."""
        from types import SimpleNamespace

        from sglang.srt.managers.scheduler_components.weight_updater import SchedulerWeightUpdaterManager
        from sglang.srt.runtime_context import get_parallel

        with get_parallel().override(tp_group=SimpleNamespace(cpu_group=None)):
            return SchedulerWeightUpdaterManager(
                tp_worker=worker, draft_worker=None, memory_saver_adapter=None, flush_cache=flush_cache,
                is_fully_idle=lambda: True, scheduler=SimpleNamespace(record_weight_version_change=lambda **_: None))

    @classmethod
    def update_requests(cls, flush_cache: bool) -> dict:
        """0.5.17's four, plus ``end_weight_update`` (weights that arrived by P2P / RDMA in the session)."""
        from sglang.srt.managers import io_struct as io

        return {**Steps0517.update_requests(flush_cache), "end_weight_update": io.EndWeightUpdateReqInput()}

    @staticmethod
    def before_update(manager, method: str) -> None:
        """The distributed and tensor paths need an open update session; ``end_weight_update`` gets a fresh
        one with no load in it (weights that arrived by P2P / RDMA, finalized by ``post_load_weights``)."""
        from sglang.srt.managers import io_struct as io

        if method == "end_weight_update" and manager._session is not None:
            assert manager.end_weight_update(io.EndWeightUpdateReqInput()).success
        if method in ("update_weights_from_distributed", "update_weights_from_tensor", "end_weight_update") \
                and manager._session is None:
            assert manager.begin_weight_update(io.BeginWeightUpdateReqInput()).success

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
