"""Gated DeltaNet (Qwen3-Next, Qwen3.5/3.6): one unit per value head (paper §3.3, §4.1).

Static log-decay g_s(h) = -exp(A_log[h]) * softplus(a_s + dt_bias[h]) (Eq. 2). Temporal state
per layer ``[H_v, d_v, d_k]`` FP32, conv state ``[2*H_k*d_k + H_v*d_v, K-1]`` BF16
(SGLang ``configs/qwen3_next.py`` -> ``Mamba2StateShape``).
"""

from __future__ import annotations

from pydantic import model_validator

from dasc_compile.archspec import ArchSpec, layer_kinds, require, text_config
from dasc_compile.config_fields import ConvKernel, HeadCount, HeadDim, LayerKindFields, validate_config
from dasc_compile.errors import DascInputError
from dasc_compile.families.base import DecayFamily, register_family, register_model_type, softplus_gate

GDN = register_family(DecayFamily(name="gdn", unit_kind="gdn_head", default_a_s=-0.3, static_log_decay=softplus_gate))


class GdnConfigFields(LayerKindFields):
    """The config fields :func:`parse_gdn` reads (flat, or under ``text_config`` for Qwen3.5), strict and bounded."""

    linear_num_key_heads: HeadCount
    linear_num_value_heads: HeadCount
    linear_key_head_dim: HeadDim
    linear_value_head_dim: HeadDim
    linear_conv_kernel_dim: ConvKernel

    @model_validator(mode="after")
    def _value_heads_share_key_heads(self):
        hv, hk = self.linear_num_value_heads, self.linear_num_key_heads
        if hv % hk:
            raise ValueError(f"linear_num_value_heads ({hv}) must be a multiple of linear_num_key_heads ({hk})")
        return self


@register_model_type("qwen3_next", "qwen3_5", "qwen3_5_moe")
def parse_gdn(config: dict, source: str) -> ArchSpec:
    """Qwen3-Next (flat config, ``model.layers.``) and Qwen3.5 (``text_config``, ``model.language_model.layers.``)."""
    nested = isinstance(config.get("text_config"), dict)
    cfg = text_config(config)
    where = f"{source} (text_config)" if nested else source
    validate_config(GdnConfigFields, cfg, where)   # types and bounds of every field read below
    num_layers = require(cfg, "num_hidden_layers", where)
    hk = require(cfg, "linear_num_key_heads", where)
    hv = require(cfg, "linear_num_value_heads", where)
    dk = require(cfg, "linear_key_head_dim", where)
    dv = require(cfg, "linear_value_head_dim", where)
    kconv = require(cfg, "linear_conv_kernel_dim", where)
    if hv % hk != 0:
        raise DascInputError(f"{where}: linear_num_value_heads ({hv}) must be a multiple of linear_num_key_heads ({hk})")
    rec, kind_src = layer_kinds(cfg, num_layers, where, {"linear_attention"})
    prefix = "model.language_model.layers." if nested else "model.layers."
    field_prefix = "text_config." if config["model_type"] in ("qwen3_5", "qwen3_5_moe") else ""
    a_names = tuple(f"{prefix}{i}.linear_attn.A_log" for i in rec)
    d_names = tuple(f"{prefix}{i}.linear_attn.dt_bias" for i in rec)
    return ArchSpec(
        model_type=config["model_type"],
        architectures=tuple(config.get("architectures") or ()),
        num_hidden_layers=num_layers,
        recurrent_layer_ids=tuple(rec),
        full_attention_layer_ids=tuple(i for i in range(num_layers) if i not in set(rec)),
        family="gdn",
        num_value_heads=hv,
        num_key_heads=hk,
        head_k_dim=dk,
        head_v_dim=dv,
        unit_kind=GDN.unit_kind,
        conv_kernel=kconv,
        conv_dim=2 * hk * dk + hv * dv,
        a_log_names=a_names,
        dt_bias_names=d_names,
        a_log_shape=(hv,),
        dt_bias_shape=(hv,),
        safe_gate_lower_bound=None,
        layer_kind_source=kind_src,
        recurrent_tensor_marker=".linear_attn.",
        head_fields=(f"{field_prefix}linear_num_value_heads", f"{field_prefix}linear_num_key_heads"),
    )
