"""Kimi Delta Attention (Kimi-Linear; Kimi-K3 with the safe gate): one unit per (head, key channel).

A unit is the column ``S[h, :, k]`` of the ``[d_v, d_k]`` head state (paper §4.1). Static
log-decay (Eq. 2): softplus gate ``-exp(A_log[h]) * softplus(a_s + dt_bias[h*d_k + k])``; safe
gate ``l * sigmoid(exp(A_log[h]) * (a_s + dt_bias[h*d_k + k]))`` with l = -5 for Kimi-K3.
Decay tensors: ``model.layers.{i}.self_attn.A_log [1, 1, H, 1]``, ``.dt_bias [H * d_k]``.
State (SGLang ``KimiLinearStateShape``): temporal ``[H, d, d]`` FP32, conv ``[K-1, 3*H*d]`` BF16.
"""

from __future__ import annotations

from typing import Optional

from pydantic import Field, model_validator

from dasc_compile.archspec import ArchSpec, layer_kinds, require
from dasc_compile.config_fields import (
    ConfigFields,
    ConvKernel,
    HeadCount,
    HeadDim,
    LayerKindFields,
    LayerNumber,
    NegativeBound,
    validate_config,
)
from dasc_compile.errors import DascInputError
from dasc_compile.families.base import DecayFamily, register_family, register_model_type, safe_gate, softplus_gate

KDA = register_family(DecayFamily(name="kda", unit_kind="kda_column", default_a_s=-0.3, static_log_decay=softplus_gate))
KDA_SAFE = register_family(
    DecayFamily(name="kda_safe_gate", unit_kind="kda_column", default_a_s=0.8, static_log_decay=safe_gate))


class _SafeGateFields(ConfigFields):
    gate_lower_bound: Optional[NegativeBound] = None    # l of the safe gate: finite and negative
    lower_bound: Optional[NegativeBound] = None
    safe_gate: Optional[bool] = None


class KdaAttnFields(_SafeGateFields):
    """``linear_attn_config`` as :func:`parse_kimi_linear` reads it."""

    num_heads: HeadCount
    head_dim: HeadDim
    short_conv_kernel_size: ConvKernel
    kda_layers: Optional[list[LayerNumber]] = Field(default=None, max_length=4096)

    @model_validator(mode="after")
    def _each_layer_once(self):
        seen = set()
        for n in self.kda_layers or ():
            if n in seen:
                raise ValueError(f"field 'kda_layers' lists layer {n} twice; expected each 1-indexed layer once")
            seen.add(n)
        return self


class KimiConfigFields(LayerKindFields, _SafeGateFields):
    """The Kimi-Linear / Kimi-K3 config fields :func:`parse_kimi_linear` reads, strict and bounded: the
    released checkpoints' ``linear_attn_config``, or the top-level spelling transformers'
    ``KimiLinearConfig.save_pretrained`` writes (``linear_num_heads``, ``linear_head_dim``,
    ``linear_conv_kernel_dim`` beside ``layer_types``)."""

    linear_attn_config: Optional[KdaAttnFields] = None
    linear_num_heads: Optional[HeadCount] = None
    linear_head_dim: Optional[HeadDim] = None
    linear_conv_kernel_dim: Optional[ConvKernel] = None


def _kda_fields(config: dict, source: str) -> dict:
    """``linear_attn_config`` as released checkpoints write it, else built from transformers' top-level fields."""
    lac = config.get("linear_attn_config")
    if isinstance(lac, dict):
        return lac
    if lac is None and config.get("linear_num_heads") is not None:
        return {"num_heads": config.get("linear_num_heads"), "head_dim": config.get("linear_head_dim"),
                "short_conv_kernel_size": config.get("linear_conv_kernel_dim")}
    raise DascInputError(f"{source}: config field 'linear_attn_config' is missing or not a mapping (nor are "
                         f"transformers' 'linear_num_heads' / 'linear_head_dim' / 'linear_conv_kernel_dim' given)")


def _safe_gate_bound(cfg: dict, lac: dict) -> float | None:
    for where in (lac, cfg):
        for key in ("gate_lower_bound", "lower_bound"):
            if where.get(key) is not None:
                return float(where[key])
        if where.get("safe_gate") is True:
            return -5.0
    return None


@register_model_type("kimi_linear")
def parse_kimi_linear(config: dict, source: str) -> ArchSpec:
    """Kimi-Linear / Kimi-K3 config (``linear_attn_config`` with 1-indexed ``kda_layers``)."""
    validate_config(KimiConfigFields, config, source)   # types and bounds of every field read below
    num_layers = require(config, "num_hidden_layers", source)
    lac = _kda_fields(config, source)
    where = f"{source} (linear_attn_config)" if "linear_attn_config" in config else source
    h = require(lac, "num_heads", where)
    d = require(lac, "head_dim", where)
    kconv = require(lac, "short_conv_kernel_size", where)
    rec, kind_src = layer_kinds(config, num_layers, source, {"linear_attention", "kda"})
    bound = _safe_gate_bound(config, lac)
    prefix = "model.layers."
    return ArchSpec(
        model_type=config["model_type"],
        architectures=tuple(config.get("architectures") or ()),
        num_hidden_layers=num_layers,
        recurrent_layer_ids=tuple(rec),
        full_attention_layer_ids=tuple(i for i in range(num_layers) if i not in set(rec)),
        family="kda_safe_gate" if bound is not None else "kda",
        num_value_heads=h,
        num_key_heads=h,
        head_k_dim=d,
        head_v_dim=d,
        unit_kind=KDA.unit_kind,
        conv_kernel=kconv,
        conv_dim=3 * h * d,
        a_log_names=tuple(f"{prefix}{i}.self_attn.A_log" for i in rec),
        dt_bias_names=tuple(f"{prefix}{i}.self_attn.dt_bias" for i in rec),
        a_log_shape=(1, 1, h, 1),
        dt_bias_shape=(h * d,),
        safe_gate_lower_bound=bound,
        layer_kind_source=kind_src,
        recurrent_tensor_marker=".self_attn.",
        head_fields=("linear_attn_config.num_heads", "linear_attn_config.num_heads"),
    )
