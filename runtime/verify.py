"""Start-up checks of a plan against the served model and server options (DESIGN.md "Runtime in SGLang").

Every check raises :class:`DascRefusal` (a :class:`~dasc_compile.schema.DascInputError`) with one
line that names what differs; the server does not start. Nothing is ever silently ignored.
"""

from __future__ import annotations

import logging
import math
from typing import Optional, Sequence

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

    The rules, and why each exists, are :data:`dasc_runtime.serving_rules.RULES` (scope ``option``);
    ``dasc size`` checks its printed flags with the same function. ``--mamba-max-states-per-path`` is
    served: SGLang's path cap evicts interior states through the component's ``evict_component``,
    which frees either tier (tested in ``tests/runtime/``). The SGLang release itself is checked by
    :func:`dasc_runtime.sglang_api.check_version`; option values are read as the release resolves them
    (its adapter's ``server_option``).

    Raises:
        DascRefusal: ``unsupported option(s): <clause>; <clause>...``.
    """
    from dasc_runtime.serving_rules import serving_refusals
    from dasc_runtime.sglang_api import api

    bad = serving_refusals(sa, plan, scopes=("option",), read_option=api().server_option)
    if bad:
        raise DascRefusal("unsupported option(s): " + "; ".join(r.text for r in bad))


def check_plan_supported(plan: Plan) -> None:
    """Refuse plan features this runtime does not serve yet (:data:`dasc_runtime.serving_rules.RULES`, scope
    ``plan``: hybrid TP balancing). dasc-wr plans are served; their own start-up checks are
    :func:`dasc_runtime.wr_scratch.check_refresh_startup`."""
    from dasc_runtime.serving_rules import serving_refusals

    bad = serving_refusals(None, plan, scopes=("plan",))
    if bad:
        raise DascRefusal("; ".join(r.text for r in bad))


def check_model_type(plan: Plan, model_type: str, architectures: Sequence[str] = (),
                     served: str = "the server loaded") -> None:
    """Raises DascRefusal when the served model type differs from the plan's (``served``: where ``model_type`` was
    read, as the refusal says it)."""
    if model_type != plan.model.model_type:
        raise DascRefusal(f"model type: plan is for '{plan.model.model_type}', {served} '{model_type}'")
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
        raise DascRefusal(f"TP size: plan compiled for tp_size={tp.tp_size}, server runs attention TP size {tp_size} "
                          f"(launch with --tp-size {tp.tp_size}, or compile a plan with dasc compile --tp {tp_size})")
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
        raise DascRefusal(f"conv state dtype: plan {pol.conv_dtype}, server {conv_dtype} (SGLang takes it from the "
                          f"environment variable SGLANG_MAMBA_CONV_DTYPE, default bfloat16; or recompile with conv_dtype)")
    conv_elems = sum(math.prod(s) for s in conv_shapes)
    itemsize = torch.empty((), dtype=conv_dtype).element_size()
    plan_conv = tp.payload_contiguous[tp_rank].bytes_conv
    if conv_elems * itemsize * len(layer_ids) != plan_conv:
        raise DascRefusal(f"conv state bytes per rank: plan {plan_conv}, server {conv_elems * itemsize * len(layer_ids)} "
                          f"(shapes {[tuple(s) for s in conv_shapes]} x {len(layer_ids)} layers)")


def dummy_decay_refusal(dummy_decay_ok: bool, load_format, what: str = "--dasc-dummy-decay-ok",
                        weight_cache_mode=None) -> Optional[str]:
    """The refusal of ``--dasc-dummy-decay-ok`` where the weights may be real, or None: a load format other than
    ``dummy`` (None or unset reads as SGLang's ``auto``), and SGLang's IPC weight cache on. The cache is on when
    ``weight_cache_mode`` is given and is not exactly ``off`` (SGLang compares it so) or when the format is
    ``ipc_cache``, which no ``--load-format`` accepts: SGLang switches the loader to it when the cache is on
    (``model_executor/model_runner_components/load_model_utils.py``, ``maybe_enable_ipc_weight_cache``), and the IPC
    loader serves a daemon's weights, real ones when it holds them, falling back to the given format only in
    ``client`` mode (``weight_cache/ipc_loader.py``; 0.5.17 and 0.5.23). Both refusals are joined with "; " when both
    apply. ``what`` names where the setting came from (the flag, ``DASC_DUMMY_DECAY_OK`` or the ``Engine`` keyword).
    Checked at launch (``startup_checks.check_launch``, the options as given) and again when the weights are loaded
    (:func:`check_fingerprint`, the format and mode SGLang's loader used)."""
    if not dummy_decay_ok:
        return None
    fmt = str(getattr(load_format, "value", load_format) or "").strip().lower()
    mode_on = weight_cache_mode is not None and weight_cache_mode != "off"
    parts = []
    if fmt not in ("dummy", "ipc_cache"):
        parts.append(f"{what} needs --load-format dummy (got {fmt or 'auto'!r}): real weights must match the plan's "
                     f"decay fingerprint")
    if mode_on or fmt == "ipc_cache":
        shown = str(weight_cache_mode)
        shown = shown if shown and shown.split() == [shown] else repr(shown)      # as given; quoted when blank
        cache = f"--weight-cache-mode {shown}" if mode_on else "SGLang's weight cache (load format ipc_cache)"
        parts.append(f"{what} needs SGLang's dummy loader, and {cache} loads the weights through SGLang's IPC weight "
                     f"cache, which may hold real ones: drop --weight-cache-mode or {what}")
    return "; ".join(parts) or None


def check_fingerprint(plan: Plan, served: Sequence[tuple[str, torch.Tensor]], *, dummy_decay_ok: bool = False,
                      load_format="", weight_cache_mode=None) -> dict:
    """Compare the served decay tensors' fingerprint with the plan's (see :mod:`dasc_runtime.fingerprint`).

    Args:
        plan: the loaded plan. served: ``[(name, tensor), ...]`` of the served model, in
            ``plan.fingerprint.decay_tensors`` order (``A_log`` / ``dt_bias`` ``[H]``, any float dtype), or in
            ``plan.fingerprint.served.names`` order when the plan records a served form (Mamba2's ``A``,
            compared by value within its tolerance: :func:`dasc_runtime.fingerprint.match_served_values`).
        dummy_decay_ok: ``--dasc-dummy-decay-ok``: accept a mismatch, but only when
            ``load_format == "dummy"`` (SGLang's random weights give every head the same decay, so no
            plan compiled from a real checkpoint can match them; latency does not depend on the
            values). A mismatch is then logged as a warning and the result has ``"stand_in": True``.
        load_format: the format the weights were loaded with: a str (``server_args.load_format``) or
            SGLang's ``LoadFormat`` enum (``ModelRunner.load_config.load_format``, what actually
            picked the loader); compared by value and case-insensitively, as SGLang's
            ``LoadConfig`` does (``configs/load_config.py``). Note ``str(LoadFormat.DUMMY)`` is
            ``'LoadFormat.DUMMY'``, which is refused: pass the value or the enum itself.
        weight_cache_mode: SGLang's ``--weight-cache-mode`` (None: ``off``); on, ``dummy_decay_ok`` is refused
            (:func:`dummy_decay_refusal`).
    Returns:
        the match (dtypes used and sha256), or for an accepted dummy mismatch
        ``{"sha256": <served>, "stand_in": True}``.
    Raises:
        DascRefusal: no lossless dtype combination reproduces the plan's hash (names the first
            tensor and both hashes), or ``dummy_decay_ok`` with a load format other than ``dummy`` or with
            SGLang's weight cache on.
    """
    from dasc_runtime.fingerprint import decay_sha256, match_decay_fingerprint, match_served_values

    line = dummy_decay_refusal(dummy_decay_ok, load_format, weight_cache_mode=weight_cache_mode)
    if line:
        raise DascRefusal(line)
    form = plan.fingerprint.served          # Mamba2: compared by value (SGLang serves A = -exp(A_log))
    hit = match_served_values(form, served) if form is not None else \
        match_decay_fingerprint(plan.fingerprint.decay_sha256, served)
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
