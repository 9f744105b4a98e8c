"""dasc-wr: the bounded suffix refresh of a compressed hit in SGLang (paper §4.2, App. B.2, Eq. 7).

On a compressed-tier hit the deferred copy-on-write restores the kept (global) units exactly and
zero-fills the local ones (dasc-nr, :meth:`~dasc_runtime.pool.DascCheckpointPool.load_to_active`).
dasc-wr then re-runs the last ``W = min(n_p, w_replay_cap)`` tokens of the cached prefix as a
*scratch pass* and copies only the local units of its result into the request's active state:

* **Planned** on the scheduler thread, inside the hit batch's ``ScheduleBatch.prepare_for_extend``
  (the plugin's AROUND of ``_collect_deferred_mamba_cow_and_clear``, after SGLang staged the
  copy-on-write): :func:`plan_refresh` groups the compressed hits into passes of at most B windows
  (:mod:`dasc_runtime.wr_scratch`), takes each window's KV slots from SGLang's allocator (evicting
  from the tree as SGLang's own ``alloc_token_slots`` does; a window that still does not fit is
  left at dasc-nr and counted ``skipped``) and builds one stand-in ``ScheduleBatch`` per pass: one
  stand-in ``Req`` per window on a hidden scratch row, extend mode, prefix = the request's cached
  KV locations before the window (read-only), extend tokens = the window, ``out_cache_loc`` = the
  fresh slots. The work rides to the model runner on the batch's ``mamba_cow_src_indices`` tensor
  (:func:`dasc_runtime.side_channels.attach_refresh_work`).
* **Run** on the forward stream, inside ``ModelRunner._maybe_execute_deferred_mamba_cow_and_clear``
  (:func:`around_deferred_cow`), after SGLang's restore and before the hit batch's own layers: per
  pass, write the scratch rows (prefix locations + window slots) and their Mamba mapping, zero the
  scratch slots (every recurrent unit, global too, and the conv state starts from zero), build
  SGLang's ``ForwardBatch`` from the stand-in batch and run it through SGLang's ``EagerRunner``
  (never a CUDA graph); its logits are dropped. Then ``refresh_copy`` (the plan's rendered kernel,
  or its PyTorch twin) copies the local units of each scratch slot into the hit's active slot and
  the window's KV slots go back to the allocator. Nothing is inserted in the radix tree; the cached
  KV and the stored checkpoint are only read.

A separate pass, not folded into the hit's extend: the refresh of layer l needs the scratch pass's
layer-l state before the hit's suffix enters layer l, and SGLang's varlen recurrent kernels run
every sequence of a batch through a layer at once. Chunked prefill: the copy-on-write (hence the
refresh) is staged once, at the request's first chunk, so later chunks start from the refreshed
state; a pass holds at most ``--chunked-prefill-size`` tokens. Overlap scheduling: planning and
freeing happen on the scheduler thread; the pass runs on the forward stream, which waits for the
schedule stream; SGLang's WAR barrier orders the next batch's writes after this forward, so freed
window slots are not reused early. TP: every rank's replicated scheduler plans the same passes, so
each rank runs them (its TP collectives match); storage balancing only moves stored units, the
refresh is rank-local.
"""

from __future__ import annotations

import logging
import os
from array import array
from dataclasses import dataclass, field
from typing import Optional

import torch

from dasc_runtime.settings import env_setting

__all__ = ["RefreshPass", "RefreshWork", "plan_refresh", "run_refresh", "around_deferred_cow", "refresh_copy_fn",
           "check_pass", "dump_pass"]

logger = logging.getLogger("dasc")

# DASC_WR_CHECK=1: after each pass, check the copy on the device and log how far the pass's own kept
# units are from the restored checkpoint's (0 when W = n_p: the pass then recomputes the whole prefix).
# DASC_WR_DUMP=DIR (implies the check): also write the first DASC_WR_DUMP_MAX (default 4) passes'
# refreshed states to DIR for an offline comparison against a PyTorch replay (benchmarks/wr_reference_check.py).
_DUMP_DIR = os.environ.get("DASC_WR_DUMP", "")
_DUMP_MAX = env_setting("DASC_WR_DUMP_MAX")
_CHECK = env_setting("DASC_WR_CHECK") or bool(_DUMP_DIR)
_DUMPED = [0]


@dataclass
class RefreshPass:
    """One scratch pass (host side; tensors on the pool device).

    Attributes:
        batch: the stand-in ``ScheduleBatch`` (extend) SGLang's ``ForwardBatch.init_new`` reads.
        rows: scratch ``req_to_token`` rows, one per window; slots: their scratch Mamba slots.
        prefix: per window, int64 ``[n_p - W]`` cached KV locations before the window (the hit's own).
        windows: per window, W in tokens.
        dst: int64 ``[n]`` active Mamba slots of the hits (refresh targets).
    """

    batch: object
    rows: list
    slots: list
    prefix: list
    windows: list
    dst: torch.Tensor
    rids: list = field(default_factory=list)
    ids: list = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(self.windows)


@dataclass
class RefreshWork:
    """The refresh passes of one hit batch, in order."""

    passes: list


def _stand_in_batch(batch, budget, hits, out_locs):
    """A ``ScheduleBatch`` of stand-in requests replaying each hit's window (see module docstring).

    ``hits``: ``(req, n_p, W, prefix)`` per window, ``prefix`` the hit's cached KV locations before its
    window (int64 ``[n_p - W]``). The fields a release's ``ForwardBatch.init_new`` reads beyond
    0.5.17's are set by the adapter (:func:`dasc_runtime.sglang_0523.stand_in_inputs`).
    """
    from sglang.srt.managers.schedule_batch import ScheduleBatch, compute_extend_logprob_start_len
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from dasc_runtime.sglang_api import api

    adapter = api()
    reqs, tokens = [], []
    for k, (req, n_p, w, _) in enumerate(hits):
        ids = array("q", req.full_untruncated_fill_ids[:n_p])
        reqs.append(adapter.stand_in_request(f"dasc-refresh-{k}", ids, n_p - w, n_p, budget.rows[k]))
        tokens.extend(ids[n_p - w:])
    sb = ScheduleBatch.init_new(reqs, batch.req_to_token_pool, batch.token_to_kv_pool_allocator, batch.tree_cache,
                                batch.model_config, batch.enable_overlap, SpeculativeAlgorithm.NONE)
    dev = batch.device
    n = len(hits)
    seq = [n_p for _, n_p, _, _ in hits]
    sb.forward_mode = ForwardMode.EXTEND
    sb.prefix_lens = [n_p - w for _, n_p, w, _ in hits]
    sb.extend_lens = [w for _, _, w, _ in hits]
    sb.extend_num_tokens = len(tokens)
    sb.extend_logprob_start_lens = [
        compute_extend_logprob_start_len(logprob_start_len=-1, prefix_len=p, extend_len=e, full_untruncated_fill_len=s)
        for p, e, s in zip(sb.prefix_lens, sb.extend_lens, seq)]
    sb.req_pool_indices_cpu = torch.tensor(budget.rows[:n], dtype=torch.int64)
    sb.req_pool_indices = budget.rows_t[:n]
    sb.seq_lens_cpu = torch.tensor(seq, dtype=torch.int64)
    sb.seq_lens = sb.seq_lens_cpu.to(dev, non_blocking=True)
    sb.orig_seq_lens = torch.tensor(seq, dtype=torch.int32).to(dev, non_blocking=True)
    sb.seq_lens_sum = sum(seq)
    sb.out_cache_loc = out_locs
    sb.multimodal_inputs = [None] * n
    # the window's tokens, and no Mamba tracking in a scratch pass (mask False everywhere)
    adapter.stand_in_inputs(sb, torch.tensor(tokens, dtype=torch.int64).to(dev, non_blocking=True),
                            track_slots=budget.slots_t[:n].clone() if adapter.extra_buffer_on() else None)
    sb.sampling_info = SamplingBatchInfo.from_schedule_batch(sb, batch.model_config.vocab_size)
    return sb


def _alloc_window_slots(batch, need: int) -> Optional[torch.Tensor]:
    """``need`` KV slots from SGLang's allocator, evicting from the tree as ``alloc_token_slots`` does; None if full."""
    from sglang.srt.mem_cache.common import evict_from_tree_cache

    alloc = batch.token_to_kv_pool_allocator
    evict_from_tree_cache(batch.tree_cache, need)
    if alloc.available_size() < need:
        return None
    return alloc.alloc(need)


def plan_refresh(batch, cow_reqs: list, compressed: list) -> Optional[RefreshWork]:
    """Plan the scratch passes of a hit batch (scheduler thread; see module docstring).

    Args:
        batch: SGLang's ``ScheduleBatch`` in ``prepare_for_extend``, after its own allocation.
        cow_reqs: the batch's requests with a staged copy-on-write source, in SGLang's order.
        compressed: per request of ``cow_reqs``, True when its source is a compressed checkpoint.
    Returns:
        the :class:`RefreshWork` (also attached to ``batch.mamba_cow_src_indices``), or None when
        no hit needs a refresh (dense hits, W_replay = 0, or no wr plan).
    """
    from dasc_runtime.installed import INSTALLED
    from dasc_runtime.sglang_api import api
    from dasc_runtime.side_channels import attach_refresh_work
    from dasc_runtime.wr_scratch import window_tokens

    budget = INSTALLED.refresh
    if budget is None or batch.mamba_cow_src_indices is None:
        return None
    adapter = api()
    hits = []
    for req, c in zip(cow_reqs, compressed):
        if not c:
            continue                                   # dense hit: exact copy, no refresh
        prefix = adapter.prefix_locations(req, batch.req_to_token_pool)
        n_p = int(prefix.numel())
        w = window_tokens(n_p, budget.w_cap, budget.page_size)
        if w > 0:
            hits.append((req, n_p, w, prefix[: n_p - w]))
    passes = []
    for i in range(0, len(hits), budget.seqs):
        group = hits[i:i + budget.seqs]
        locs = _alloc_window_slots(batch, sum(w for _, _, w, _ in group))
        while locs is None and len(group) > 1:         # fewer windows before giving up
            budget.counters.skipped += 1
            group = group[:-1]
            locs = _alloc_window_slots(batch, sum(w for _, _, w, _ in group))
        if locs is None:
            budget.counters.skipped += len(group)
            continue
        sb = _stand_in_batch(batch, budget, group, locs)
        dst = torch.stack([adapter.mamba_state(req).mamba_pool_idx.reshape(()) for req, _, _, _ in group])
        passes.append(RefreshPass(batch=sb, rows=list(budget.rows[:len(group)]),
                                  slots=list(budget.slots[:len(group)]), prefix=[pre for _, _, _, pre in group],
                                  windows=[w for _, _, w, _ in group], dst=dst.to(torch.int64),
                                  rids=[req.rid for req, _, _, _ in group],
                                  ids=[list(req.full_untruncated_fill_ids[:n_p]) for req, n_p, _, _ in group]
                                  if _DUMP_DIR else []))
    if not passes:
        return None
    work = RefreshWork(passes=passes)
    attach_refresh_work(batch.mamba_cow_src_indices, work)
    return work


def refresh_copy_fn(pool):
    """The ``refresh_copy`` of the pool's plan: the rendered Triton kernel when the pool's ops run the
    plan's kernels (``KernelOps.module``), else :func:`dasc_runtime.torch_kernels.refresh_copy`."""
    module = getattr(pool.ops, "module", None)
    if module is not None and hasattr(module, "refresh_copy"):
        return module.refresh_copy
    from dasc_runtime.torch_kernels import refresh_copy

    return refresh_copy


def run_refresh(runner, work: RefreshWork) -> None:
    """Run the scratch passes on the current (forward) stream and copy the local units back.

    Args:
        runner: SGLang's ``ModelRunner`` (``req_to_token_pool``, ``token_to_kv_pool_allocator``,
            ``eager_runner``, ``_prepare_eager_forward_batch``).
        work: from :func:`plan_refresh`.
    """
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from dasc_runtime.installed import INSTALLED

    budget, dpool = INSTALLED.refresh, INSTALLED.pool
    pool = runner.req_to_token_pool
    r2t = pool.req_to_token
    mp = pool.mamba_pool
    temporal = mp.mamba_cache.temporal
    copy = refresh_copy_fn(dpool)
    index = dpool.layout.index
    for p in work.passes:
        n = len(p.rows)
        for row, pre, w, a in zip(p.rows, p.prefix, p.windows, _starts(p.windows)):
            n0 = pre.numel()
            r2t[row, :n0] = pre.to(r2t.dtype)
            r2t[row, n0:n0 + w] = p.batch.out_cache_loc[a:a + w].to(r2t.dtype)
        slots = budget.slots_t[:n]
        pool.req_index_to_mamba_index_mapping[budget.rows_t[:n]] = slots.to(
            pool.req_index_to_mamba_index_mapping.dtype)
        mp.clear_slots(slots)
        fb = ForwardBatch.init_new(p.batch, runner, return_hidden_states_before_norm=False)
        runner._prepare_eager_forward_batch(fb)
        runner.eager_runner.execute(fb)                # logits dropped
        s0 = p.slots[0]
        before = temporal[:, p.dst].clone() if _CHECK else None
        copy(scratch=temporal[:, s0:s0 + n], temporal=temporal, dst_slots=p.dst, unit_row=index.unit_row,
             local_heads=index.local_heads, check_slots=False)
        if _CHECK:
            out = check_pass(dpool.layout, before, temporal[:, p.dst], temporal[:, s0:s0 + n], p)
            if _DUMP_DIR and _DUMPED[0] < _DUMP_MAX:
                dump_pass(_DUMP_DIR, _DUMPED[0], dpool.layout, before, temporal[:, p.dst], p, out)
                _DUMPED[0] += 1
        runner.token_to_kv_pool_allocator.free(p.batch.out_cache_loc)
        budget.counters.refreshed += n
        budget.counters.tokens += p.tokens
        budget.counters.passes += 1


def check_pass(layout, before, after, scratch, p: RefreshPass) -> dict:
    """``DASC_WR_CHECK=1``: one log line per pass (device reads; a diagnostic, not for serving).

    Args:
        layout: the rank layout; before / after: ``[L, n, H, dv, dk]`` active states of the hits
            around ``refresh_copy``; scratch: ``[L, n, H, dv, dk]``; p: the pass.
    Returns:
        ``{"kept_unchanged", "local_copied", "kept_vs_scratch_max"}`` (bool, bool, float per window).
    """
    from dasc_runtime.ops import flat_units

    b, a, x = (flat_units(layout, t) for t in (before, after, scratch))
    kept, local = layout.kept_flat, layout.local_flat
    out = {"kept_unchanged": bool(torch.equal(a[:, kept], b[:, kept])),
           "local_copied": bool(torch.equal(a[:, local], x[:, local])),
           "kept_vs_scratch_max": [float((x[i, kept] - b[i, kept]).abs().max()) if kept.numel() else 0.0
                                   for i in range(x.shape[0])]}
    n_p = [int(t.numel()) + w for t, w in zip(p.prefix, p.windows)]
    logger.info("dasc-wr check: windows %s of prefixes %s: kept units unchanged %s, local units copied %s, "
                "max |scratch - checkpoint| over kept units %s", p.windows, n_p, out["kept_unchanged"],
                out["local_copied"], ["%.3g" % v for v in out["kept_vs_scratch_max"]])
    return out


def dump_pass(directory: str, k: int, layout, before, after, p: RefreshPass, check: dict) -> str:
    """``DASC_WR_DUMP=DIR``: write pass ``k`` to ``DIR/pass-K.pt`` (``torch.save`` of a dict; a diagnostic
    for a TP-1 server: the file name carries no rank).

    Args:
        layout: the rank layout; before / after: ``[L, n, H, d_v, d_k]`` active states of the hits
            around ``refresh_copy`` (SGLang's ``temporal`` layout and dtype); p: the pass (with its
            hits' ``rids`` and cached-prefix token ids ``ids``, each ``[n_p]``); check: :func:`check_pass`'s result.
    Returns:
        the file written. The dict holds ``after`` (on the CPU), ``kept_mask`` (bool ``[L, H, d_v, d_k]``,
        True for a global unit), ``windows``, ``n_p``, ``rids``, ``ids``, ``check`` and
        ``before_kept_equal`` (bool per hit: global units of ``after`` bit-identical to ``before``).
    """
    from pathlib import Path

    from dasc_runtime.ops import flat_units, unflat_units

    flat = flat_units(layout, torch.zeros_like(after[:, :1]))
    flat[:, layout.kept_flat] = 1
    mask = unflat_units(layout, flat)[:, 0] != 0
    equal = [bool(torch.equal(after[:, i][mask], before[:, i][mask])) for i in range(after.shape[1])]
    path = Path(directory) / f"pass-{k}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"after": after.detach().cpu(), "kept_mask": mask.cpu(), "windows": list(p.windows),
                "n_p": [int(t.numel()) + w for t, w in zip(p.prefix, p.windows)], "rids": list(p.rids),
                "ids": [list(map(int, x)) for x in p.ids], "check": check, "before_kept_equal": equal}, path)
    logger.info("dasc-wr dump: %s (%d windows)", path, len(p.windows))
    return str(path)


def _starts(windows):
    out, a = [], 0
    for w in windows:
        out.append(a)
        a += w
    return out


def around_deferred_cow(original, runner, forward_batch):
    """AROUND ``ModelRunner._maybe_execute_deferred_mamba_cow_and_clear``: SGLang's restore, then the refresh."""
    from dasc_runtime.side_channels import pop_refresh_work

    src = getattr(forward_batch, "mamba_cow_src_indices", None)
    work = pop_refresh_work(src) if src is not None else None
    out = original(runner, forward_batch)
    if work is not None:
        run_refresh(runner, work)
    return out
