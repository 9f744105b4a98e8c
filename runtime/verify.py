"""Start-up checks of a plan against the served model and server options (DESIGN.md "Runtime in SGLang").

Every check raises :class:`DascRefusal` (a :class:`~dasc_compile.schema.DascInputError`) with one
line that names what differs; the server does not start. Nothing is ever silently ignored.
"""

from __future__ import annotations

import logging
import math
from typing import Sequence

import torch

from dasc_compile.schema import Plan
from dasc_runtime.refusal import DascRefusal  # noqa: F401  (its home; importers name it through this module)
from dasc_runtime.rank_layout import torch_dtype

__all__ = ["DascRefusal", "check_server_args", "check_plan_supported",
           "check_model_type",
           "check_state", "check_fingerprint"]

logger = logging.getLogger("dasc")


def check_server_args(sa, plan: Plan | None = None) -> None:
    """Refuse server options the plan cannot serve, all in one line (each named with the flag that turns
    it off). ``plan``: the loaded plan, or None (then only the plan-independent options are checked).

    The SGLang version itself is checked by :func:`dasc_runtime.sglang_api.check_version`.

    Checked: radix cache on and built-in (no ``--disable-radix-cache``, no ``--radix-cache-backend``),
    no ``--enable-hierarchical-cache``, no ``--enable-unified-memory`` / ``--enable-page-major-kv-layout``
    (page-major state layout, ``mamba_ckpt_pool`` is None there), no ``--enable-int8-mamba-checkpoint``
    (the plan's ``int8`` composes INT8 instead), no speculative decoding, no ReplaySSM rings, no
    session radix cache / streaming sessions, pipeline parallel size 1.

    Refused options (item 11) and why:

    ==================================  ===============================================================
    ``--mamba-radix-cache-strategy      its second ping-pong slot is allocated and freed on demand by
    extra_buffer_lazy``                 SGLang's batch result processor (``mamba_lazy_*``), a path
                                        dasc's insertion (which donates / packs that slot) is not tested
                                        on; ``extra_buffer`` (SGLang's default) and ``no_buffer`` are
    ``--enable-mixed-chunk``            a MIXED batch joins decode requests to the hit batch whose
                                        copy-on-write and dasc-wr refresh dasc plans; not tested
    ``--enable-dp-attention``           each DP rank schedules its own requests while the tier agreement
                                        and the decay fingerprint gather run on the attention-TP group;
                                        not tested
    ``--enable-memory-saver``           it releases and restores SGLang's tagged allocations; the dasc
                                        pool is allocated outside them, so a release would keep it and a
                                        resume would not restore what it held
    ``--enable-lmcache``,               external stores and SGLang 0.5.23's unified-cache linker copy a
    ``--enable-flexkv``,                node's Mamba state out by its native slot id; a compressed
    ``--enable-unified-cache-external-  checkpoint's id names a dasc pool row, so they would copy the
    linker`` (0.5.23)                   wrong slot
    ==================================  ===============================================================

    ``--mamba-max-states-per-path`` is served: SGLang's path cap evicts interior states through the
    component's ``evict_component``, which frees either tier (tested in ``tests/runtime/``).

    Storage balancing under overlap scheduling (item 9): a storage-balanced pack is an all-to-all on
    the attention-TP group issued on the scheduler's current stream. With SGLang's overlap scheduler
    that is the schedule stream, while the previous batch's forward, and its TP collectives, may still
    run on the forward stream: the two streams' collectives could interleave differently on different
    ranks (a cross-rank deadlock). Without overlap scheduling the scheduler thread issues cache work and
    forwards on one stream in one order, the same on every rank. So a storage-balanced plan at TP > 1
    is refused unless ``--disable-overlap-schedule`` is given.
    """
    from dasc_runtime.sglang_api import api

    adapter = api()
    option = adapter.server_option        # the value in effect (0.5.23 resolves beside the raw input)
    g = lambda name, default=None: option(sa, name, default)  # noqa: E731
    bad = []
    if g("disable_radix_cache"):
        bad.append("--disable-radix-cache (dasc compresses radix-cached state checkpoints)")
    if g("radix_cache_backend"):
        bad.append(f"--radix-cache-backend={g('radix_cache_backend')} (dasc plugs into the built-in cache)")
    if g("enable_hierarchical_cache"):
        bad.append("--enable-hierarchical-cache (host offload of compressed checkpoints is not supported)")
    if g("enable_unified_memory"):
        bad.append("--enable-unified-memory (the unified memory pool has no checkpoint pool slot)")
    if g("enable_page_major_kv_layout"):
        bad.append("--enable-page-major-kv-layout (page-major Mamba state layout is not supported)")
    if g("enable_int8_mamba_checkpoint"):
        bad.append("--enable-int8-mamba-checkpoint (compile the plan with int8: true instead)")
    if g("speculative_algorithm"):
        bad.append(f"--speculative-algorithm {g('speculative_algorithm')} (speculative states are not supported)")
    if g("enable_linear_replayssm") or g("enable_linear_replayssm_spec"):
        bad.append("--enable-linear-replayssm (ring-buffered states are not supported)")
    if g("enable_session_radix_cache"):
        bad.append("--enable-session-radix-cache (not supported)")
    if g("enable_streaming_session"):
        bad.append("--enable-streaming-session (not supported)")
    if g("disaggregation_mode") not in (None, "null"):
        bad.append(f"--disaggregation-mode {g('disaggregation_mode')} (PD disaggregation is not supported)")
    if (g("pp_size", 1) or 1) > 1:
        bad.append(f"--pp-size {g('pp_size')} (pipeline parallelism is not supported)")
    if g("mamba_radix_cache_strategy") == "extra_buffer_lazy":
        bad.append("--mamba-radix-cache-strategy extra_buffer_lazy (use extra_buffer, SGLang's default, or "
                   "no_buffer)")
    if g("enable_mixed_chunk"):
        bad.append("--enable-mixed-chunk (drop it)")
    if adapter.dp_attention_on(sa):
        bad.append("DP attention (--enable-dp-attention / --attn-dp-size > 1: not supported)")
    if g("enable_memory_saver"):
        bad.append("--enable-memory-saver (the dasc pool lies outside the memory it releases and restores)")
    if g("enable_lmcache") or g("enable_flexkv"):
        bad.append("--enable-lmcache / --enable-flexkv (external KV stores offload Mamba states by native slot id)")
    if g("enable_unified_cache_external_linker"):
        bad.append("--enable-unified-cache-external-linker (SGLang 0.5.23's linker offloads a node's Mamba state "
                   "by its native slot id; a compressed checkpoint has none)")
    if plan is not None and plan.tp.balance == "storage" and plan.tp.tp_size > 1 \
            and not g("disable_overlap_schedule", False):
        bad.append(f"a storage-balanced plan at TP {plan.tp.tp_size} with overlap scheduling (its all-to-all "
                   f"on the schedule stream could interleave with the forward's TP collectives differently "
                   f"on each rank; add --disable-overlap-schedule, or recompile with --balance off)")
    if bad:
        raise DascRefusal("unsupported option(s): " + "; ".join(bad))


def check_plan_supported(plan: Plan) -> None:
    """Refuse plan features this runtime does not serve yet: hybrid TP balancing. (dasc-wr plans are
    served; their own start-up checks are :func:`dasc_runtime.wr_scratch.check_refresh_startup`.)"""
    if plan.tp.balance == "hybrid":
        raise DascRefusal("the plan uses balance=hybrid (compute-head permutation of the loaded weights), "
                          "which this runtime does not apply yet; recompile with --balance storage or off")


def check_model_type(plan: Plan, model_type: str, architectures: Sequence[str] = ()) -> None:
    """Raises DascRefusal when the served model type differs from the plan's."""
    if model_type != plan.model.model_type:
        raise DascRefusal(f"model type: plan is for '{plan.model.model_type}', the server loaded '{model_type}'")
    if architectures and plan.model.architectures and list(architectures) != list(plan.model.architectures):
        raise DascRefusal(f"architectures: plan {plan.model.architectures}, server {list(architectures)}")


def check_state(plan: Plan, *, layer_ids: Sequence[int], temporal_shape: Sequence[int],
                conv_shapes: Sequence[Sequence[int]], temporal_dtype: torch.dtype, conv_dtype: torch.dtype,
                tp_rank: int, tp_size: int) -> None:
    """Check SGLang's state cache parameters on this rank against the plan.

    Args:
        layer_ids: SGLang's mamba (recurrent) layer ids.
        temporal_shape: per-rank temporal state ``(H/P, d_v, d_k)`` (``cache_params.shape.temporal``).
        conv_shapes: per-rank conv state shapes (``cache_params.shape.conv``).
        temporal_dtype / conv_dtype: SGLang's state dtypes (``cache_params.dtype``).
    Raises:
        DascRefusal: TP size, recurrent layer ids, heads per rank, head dims, dtypes or conv size differ.
    """
    m, tp = plan.model, plan.tp
    if tp_size != tp.tp_size:
        raise DascRefusal(f"TP size: plan compiled for tp_size={tp.tp_size}, server runs attention TP size {tp_size}")
    if list(layer_ids) != list(m.recurrent_layer_ids):
        raise DascRefusal(f"recurrent layer ids: plan {list(m.recurrent_layer_ids)}, server {list(layer_ids)}")
    want = (tp.heads_per_rank, m.head_v_dim, m.head_k_dim)
    if tuple(temporal_shape) != want:
        raise DascRefusal(f"temporal state per rank (heads, d_v, d_k): plan {want} for TP rank {tp_rank}/{tp_size}, "
                          f"server {tuple(temporal_shape)}")
    pol = plan.policy
    if temporal_dtype != torch_dtype(pol.temporal_dtype):
        raise DascRefusal(f"temporal state dtype: plan {pol.temporal_dtype}, server {temporal_dtype} "
                          f"(set --mamba-ssm-dtype or recompile with temporal_dtype)")
    if conv_dtype != torch_dtype(pol.conv_dtype):
        raise DascRefusal(f"conv state dtype: plan {pol.conv_dtype}, server {conv_dtype}")
    conv_elems = sum(math.prod(s) for s in conv_shapes)
    itemsize = torch.empty((), dtype=conv_dtype).element_size()
    plan_conv = tp.payload_contiguous[tp_rank].bytes_conv
    if conv_elems * itemsize * len(layer_ids) != plan_conv:
        raise DascRefusal(f"conv state bytes per rank: plan {plan_conv}, server {conv_elems * itemsize * len(layer_ids)} "
                          f"(shapes {[tuple(s) for s in conv_shapes]} x {len(layer_ids)} layers)")


def check_fingerprint(plan: Plan, served: Sequence[tuple[str, torch.Tensor]], *, dummy_decay_ok: bool = False,
                      load_format="") -> dict:
    """Compare the served decay tensors' fingerprint with the plan's (see :mod:`dasc_runtime.fingerprint`).

    Args:
        plan: the loaded plan. served: ``[(name, tensor), ...]`` of the served model, in
            ``plan.fingerprint.decay_tensors`` order (``A_log`` / ``dt_bias`` ``[H]``, any float dtype).
        dummy_decay_ok: ``--dasc-dummy-decay-ok``: accept a mismatch, but only when
            ``load_format == "dummy"`` (SGLang's random weights give every head the same decay, so no
            plan compiled from a real checkpoint can match them; latency does not depend on the
            values). A mismatch is then logged as a warning and the result has ``"stand_in": True``.
        load_format: the format the weights were loaded with: a str (``server_args.load_format``) or
            SGLang's ``LoadFormat`` enum (``ModelRunner.load_config.load_format``, what actually
            picked the loader); compared by value and case-insensitively, as SGLang's
            ``LoadConfig`` does (``configs/load_config.py``). Note ``str(LoadFormat.DUMMY)`` is
            ``'LoadFormat.DUMMY'``, which is refused: pass the value or the enum itself.
    Returns:
        the match (dtypes used and sha256), or for an accepted dummy mismatch
        ``{"sha256": <served>, "stand_in": True}``.
    Raises:
        DascRefusal: no lossless dtype combination reproduces the plan's hash (names the first
            tensor and both hashes), or ``dummy_decay_ok`` with a load format other than ``dummy``.
    """
    from dasc_runtime.fingerprint import decay_sha256, match_decay_fingerprint

    fmt = str(getattr(load_format, "value", load_format) or "").strip().lower()
    if dummy_decay_ok and fmt != "dummy":
        raise DascRefusal(f"--dasc-dummy-decay-ok needs --load-format dummy (got {fmt or 'auto'!r}): real "
                          "weights must match the plan's decay fingerprint")
    hit = match_decay_fingerprint(plan.fingerprint.decay_sha256, served)
    if hit is None:
        first = served[0]
        served_sha = decay_sha256(served)
        msg = (f"decay tensors of the served weights (sha256 {served_sha[:16]}...) differ from the ones the plan "
               f"was compiled from (sha256 {plan.fingerprint.decay_sha256[:16]}...), e.g. '{first[0]}' "
               f"{first[1].dtype} {list(first[1].shape)}")
        if dummy_decay_ok:
            logger.warning("dasc: %s; accepted (--dasc-dummy-decay-ok, dummy weights): the plan's masks come from "
                           "its own checkpoint, not from the served values", msg)
            return {"sha256": served_sha, "stand_in": True}
        raise DascRefusal(msg + "; recompile the plan from the served checkpoint")
    return hit
