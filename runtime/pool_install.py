"""Building the dasc pool from the plan and the flags, and putting it in SGLang's request pool.

Called by the plugin's ``HybridReqToTokenPool._init_mamba_pool`` hook (:mod:`dasc_runtime.plugin`),
which first refuses the options dasc cannot serve. Here: the plan, read once per process; the checks
of the plan against the served state (:mod:`dasc_runtime.verify`); the rank's layout; the compressed
pool's size in slots (App. C.1 sizing from ``--dasc-pool-slots`` / ``--dasc-pool-bytes`` / the plan);
the store / load ops; the tier policy; and the start-up log line. Nothing heavy is imported at module
level (the plugin imports this module in every SGLang process).
"""

from __future__ import annotations

import logging

__all__ = ["install_pool", "load_plan_once", "published_server_args", "attn_tp"]

logger = logging.getLogger("dasc")


def load_plan_once(settings):
    """The plan of ``settings.plan`` (``DascSettings``), read once per process and kept in ``INSTALLED``;
    read again only when the plan directory changes.

    Raises:
        DascInputError: the plan (plan.json and its kernel file) does not read (``dasc_compile.schema.load_plan``).
    """
    from dasc_compile.schema import load_plan, plan_json_path
    from dasc_runtime.installed import INSTALLED

    plan_dir = str(plan_json_path(settings.plan).parent)
    if INSTALLED.plan is None or INSTALLED.plan_dir != plan_dir:
        INSTALLED.plan = load_plan(settings.plan)
        INSTALLED.plan_dir = plan_dir
        INSTALLED.settings = settings
    return INSTALLED.plan


def published_server_args():
    """SGLang's published ``ServerArgs`` (``sglang.srt.runtime_context.get_server_args``), or None when none
    is published (unit tests that build pools directly)."""
    try:
        from sglang.srt.runtime_context import get_server_args

        return get_server_args()
    except ValueError:          # no published server args (unit tests building pools directly)
        return None


def attn_tp() -> tuple[int, int]:
    """``(attn_tp_rank, attn_tp_size)`` of this process from SGLang's parallel context; ``(0, 1)`` without one."""
    try:
        from sglang.srt.runtime_context import get_parallel

        p = get_parallel()
        return int(p.attn_tp_rank), int(p.attn_tp_size)
    except Exception:
        return 0, 1


def _scratch_slots(refresh, mamba_size: int) -> int:
    """B, the dasc-wr scratch slots hidden at the top of the ``mamba_size`` native slots this pool is built with
    (``wr_scratch.build_pool_with_scratch`` builds ``M + B`` and sets ``INSTALLED.refresh`` first), else 0."""
    slots = getattr(refresh, "slots", ())
    return len(slots) if slots and slots[-1] == int(mamba_size) else 0


def install_pool(req_pool, *, mamba_size: int, cache_params, mamba_layer_ids, device, settings=None,
                 tp_rank: int | None = None, tp_size: int | None = None, tp_group=None):
    """Build the dasc pool for ``req_pool`` (a ``HybridReqToTokenPool``) and put it in ``mamba_ckpt_pool``.

    Sizing: ``--dasc-pool-slots`` C, else ``--dasc-pool-bytes`` B -> ``B // bottleneck_bytes_per_slot - 1``
    (the plan's bottleneck rank decides, so every rank has the same C; App. C.1), else the plan's
    ``pool_budget_bytes``, else ``2 * M`` (SGLang's INT8 pool default), M the native slots SGLang allocates:
    ``mamba_size`` less dasc-wr's hidden scratch slots.

    Returns:
        the :class:`~dasc_runtime.pool.DascCheckpointPool`.
    Raises:
        DascRefusal / DascInputError: the plan does not fit the served state (see :mod:`dasc_runtime.verify`).
    """
    import torch

    from dasc_runtime.installed import INSTALLED
    from dasc_runtime.ops import select_ops
    from dasc_runtime.pool import DascCheckpointPool, slots_for_budget
    from dasc_runtime.rank_layout import build_rank_layout
    from dasc_runtime.settings import current_settings
    from dasc_runtime.side_channels import attach_tier_policy
    from dasc_runtime.tiers import TierPolicy
    from dasc_runtime.verify import DascRefusal, check_plan_supported, check_state
    from dasc_runtime.wr_scratch import budget_after_scratch

    settings = settings or current_settings()
    plan = load_plan_once(settings)
    check_plan_supported(plan)
    if tp_rank is None or tp_size is None:
        tp_rank, tp_size = attn_tp()
    check_state(plan, layer_ids=list(mamba_layer_ids), temporal_shape=cache_params.shape.temporal,
                conv_shapes=cache_params.shape.conv, temporal_dtype=cache_params.dtype.temporal,
                conv_dtype=cache_params.dtype.conv, tp_rank=tp_rank, tp_size=tp_size)
    layout = build_rank_layout(plan, tp_rank, tp_size, num_layers=len(mamba_layer_ids), device=device)
    if layout.storage is not None and tp_group is None and tp_size > 1:
        from sglang.srt.distributed.parallel_state import get_attn_tp_group

        tp_group = get_attn_tp_group().device_group
    bottleneck = plan.tp.bottleneck_bytes_per_slot
    native = int(mamba_size) - _scratch_slots(INSTALLED.refresh, mamba_size)     # M: the slots SGLang allocates
    if settings.pool_slots is not None:
        slots = settings.pool_slots
    elif settings.pool_bytes is not None:
        slots = slots_for_budget(budget_after_scratch(settings.pool_bytes), bottleneck)
    elif plan.policy.pool_budget_bytes is not None:
        slots = slots_for_budget(budget_after_scratch(plan.policy.pool_budget_bytes, "the plan's pool_budget_bytes"),
                                 bottleneck)
    else:
        slots = 2 * native
    ops = select_ops(plan, INSTALLED.plan_dir, layout, device, tp_group=tp_group)
    dpool = DascCheckpointPool(layout=layout, num_slots=slots, conv_shapes=cache_params.shape.conv,
                               native_size=mamba_size, device=device, ops=ops)
    mine = dpool.bytes_per_slot()
    plan_bytes = plan.tp.payload_storage[tp_rank].bytes_per_slot
    if mine != plan_bytes:
        raise DascRefusal(f"bytes per compressed slot on TP rank {tp_rank}: plan {plan_bytes}, runtime layout {mine}")
    wm = settings.demote_watermark
    if wm is None:
        wm = 0 if settings.compressed_only else max(1, native // 10)
    attach_tier_policy(dpool, TierPolicy(compressed_only=settings.compressed_only, watermark=wm))
    req_pool.mamba_ckpt_pool = dpool
    INSTALLED.pool = dpool
    t = plan.totals
    logger.info(
        "dasc: plan %s (w_max=%s, %s, kept %d/%d units, C_ckpt=%.2f, TP %d/%d balance=%s): compressed pool %d slots x "
        "%d bytes = %.3f GB on %s (ops: %s); native slots %d%s; mode %s, demote watermark %d",
        INSTALLED.plan_dir, plan.policy.w_max, plan.model.unit_kind, t.n_kept, t.n_units, plan.tp.c_ckpt_tp, tp_rank,
        tp_size, plan.tp.balance, slots, mine, dpool.mem_usage_bytes() / 2 ** 30, device, ops.name, native,
        f" (+{int(mamba_size) - native} dasc-wr scratch)" if native != int(mamba_size) else "",
        "compressed-only" if settings.compressed_only else "two-tier", wm)
    if torch.device(device).type == "cuda":
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        logger.info("dasc: %.2f GB HBM free after the compressed pool", free / 2 ** 30)
    return dpool
