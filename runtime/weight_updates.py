"""The plan's decay check for the weights SGLang serves: at load, and after every weight update (issue 13 item 8).

A plan is valid for the decay values it was compiled from (``Plan.fingerprint``). SGLang checks
nothing of the kind when it replaces weights at run time, through the scheduler's
``SchedulerWeightUpdaterManager`` (sglang/srt/managers/scheduler_components/weight_updater.py):
``update_weights_from_disk``, ``update_weights_from_distributed``, ``update_weights_from_tensor``
and ``update_weights_from_ipc`` (the HTTP / ``Engine`` update paths all end there, on every TP rank),
and in 0.5.23 also ``end_weight_update``, which finalizes weights a session received by P2P / RDMA.
:func:`around_weight_update` wraps each one; after an update that replaced the weights (0.5.23
reports an update whose cache flush was refused as failed, though the weights changed) it

1. flushes the compressed tier, unless SGLang already flushed the whole cache (the request's
   ``flush_cache``, default True, asserted by SGLang): pending demotions are cancelled and every
   compressed checkpoint no running request holds is evicted, since they were packed from states
   of the old weights (those a running request holds stay, as SGLang keeps its own dense
   checkpoints when an update asks for no flush; SGLang waits for in-flight requests before an
   update, so normally there are none);
2. re-verifies the decay fingerprint of the weights now served (:func:`check_served_weights`,
   gathered over the attention-TP group, so every rank decides the same);
3. on a mismatch turns the compressed tier off for the rest of the process
   (``TierPolicy.compressed_tier = False``: nothing is packed, demoted or restored compressed any
   more; the server goes on as SGLang's dense cache of the native slots) and says so in one line in
   the update's reply message, the log and the batch log line. A restart with a plan compiled from
   the new weights brings the tier back.

The update's own success is left as SGLang reported it (the weights were replaced either way).
"""

from __future__ import annotations

import logging
from typing import Optional

__all__ = ["update_targets", "check_served_weights", "around_weight_update", "after_weight_update"]

logger = logging.getLogger("dasc")

_MANAGER = "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"


def update_targets(adapter) -> tuple[str, ...]:
    """The hook targets (``plugin.hooks()`` registers :func:`around_weight_update` on each, AROUND): the
    ``SchedulerWeightUpdaterManager`` methods of a release that replace the served weights (its adapter's
    ``WEIGHT_UPDATE_METHODS``: the four ``update_weights_from_*``, plus 0.5.23's ``end_weight_update``)."""
    return tuple(f"{_MANAGER}.{m}" for m in adapter.WEIGHT_UPDATE_METHODS)


def _attn_tp_gather():
    """Gather of one tensor over the attention-TP CPU group (None at attention TP 1)."""
    try:
        from sglang.srt.runtime_context import get_parallel

        size = int(get_parallel().attn_tp_size)
    except Exception:
        return None
    if size <= 1:
        return None
    import torch.distributed as dist
    from sglang.srt.distributed.parallel_state import get_attn_tp_group

    group = get_attn_tp_group().cpu_group

    def gather(t):
        out = [None] * size
        dist.all_gather_object(out, t, group=group)
        return out
    return gather


def check_served_weights(runner, plan, settings, *, load_format=None) -> dict:
    """Fingerprint of the decay tensors ``runner`` serves against the plan's.

    Args:
        runner: SGLang's ``ModelRunner`` (``model``, ``load_config``, ``server_args``).
        plan: the loaded plan. settings: :class:`~dasc_runtime.settings.DascSettings`.
        load_format: the format the weights came in (an update's ``load_format``); default the
            runner's ``load_config.load_format``, else ``server_args.load_format``.
    Returns:
        :func:`dasc_runtime.verify.check_fingerprint`'s match record.
    Raises:
        DascRefusal: the served decay tensors do not reproduce the plan's hash (see
            :func:`~dasc_runtime.verify.check_fingerprint`).
        DascInputError: a plan tensor has no counterpart in the served model.
    """
    from dasc_runtime.fingerprint import fingerprint_names, served_decay_tensors
    from dasc_runtime.verify import check_fingerprint

    served = served_decay_tensors(runner.model, fingerprint_names(plan.fingerprint), _attn_tp_gather())
    sa = getattr(runner, "server_args", None)
    load_config = getattr(runner, "load_config", None)          # what the loader received
    fmt = load_format or getattr(load_config, "load_format", None) or getattr(sa, "load_format", "")
    mode = getattr(load_config, "weight_cache_mode", None)
    if mode is None and sa is not None:
        from dasc_runtime.sglang_api import api

        mode = api().server_option(sa, "weight_cache_mode")
    hit = check_fingerprint(plan, served, dummy_decay_ok=settings.dummy_decay_ok, load_format=fmt,
                            weight_cache_mode=mode)
    hit["tensors"] = len(served)
    return hit


def after_weight_update(runner, *, flushed: bool, load_format=None) -> Optional[str]:
    """Steps 1-3 of the module docstring for this process; returns the one-line note for the reply.

    Args:
        runner: SGLang's ``ModelRunner`` whose weights were just replaced.
        flushed: SGLang flushed its whole cache after the update (``recv_req.flush_cache``).
        load_format: the update's ``load_format`` (None: the runner's).
    """
    from dasc_runtime.installed import INSTALLED
    from dasc_runtime.settings import current_settings
    from dasc_runtime.verify import DascRefusal

    comp, plan = INSTALLED.component, INSTALLED.plan
    if plan is None or INSTALLED.pool is None:
        return None
    dropped = kept = 0
    if comp is not None and not flushed:
        dropped, kept = comp.drop_compressed()
    held = (f", {kept} held by running requests kept (old-weight states, like SGLang's own dense checkpoints "
            f"without flush_cache)" if kept else "")
    flush = ("the cache was flushed" if flushed else
             f"{dropped} compressed checkpoints of the old weights dropped{held}")
    try:
        hit = check_served_weights(runner, plan, current_settings(), load_format=load_format)
    except DascRefusal as exc:
        reason = str(exc).removeprefix("dasc: refusing to start: ")
        if comp is not None:
            comp.disable_compressed_tier()
        INSTALLED.compressed_off = reason
        note = (f"dasc: compressed tier off after the weight update ({flush}): {reason}; restart with a plan "
                f"compiled from the new weights to compress again")
        logger.warning(note)
        return note
    INSTALLED.fingerprint_match = hit
    note = f"dasc: the updated weights match the plan's decay fingerprint ({hit['tensors']} tensors); {flush}"
    logger.info(note)
    return note


def around_weight_update(original, manager, recv_req, *args, **kwargs):
    """AROUND each weight-replacing ``SchedulerWeightUpdaterManager`` method (:func:`update_targets`): SGLang's
    update, then :func:`after_weight_update` when the release's adapter says the weights were replaced
    (``weights_replaced``); the cache counts as flushed only when the update asked for it and succeeded.
    The note is appended to the reply's ``message``."""
    from dasc_runtime.installed import INSTALLED

    from dasc_runtime.sglang_api import api

    out = original(manager, recv_req, *args, **kwargs)
    if INSTALLED.pool is None or not api().weights_replaced(out):
        return out
    flushed = bool(getattr(recv_req, "flush_cache", False)) and bool(getattr(out, "success", False))
    note = after_weight_update(manager.tp_worker.model_runner, flushed=flushed,
                               load_format=getattr(recv_req, "load_format", None))
    if note:
        out.message = f"{out.message}; {note}" if getattr(out, "message", "") else note
    return out

