"""Published configs and full parameter tables of the three reference hybrid models.

Data, not weights: for each reference model (Qwen3-Next-80B-A3B, Kimi-Linear-48B-A3B,
Qwen3.5-27B) its ``config.json`` (:data:`REFERENCE_CONFIGS`, :func:`resolve_config`) and every
tensor of its real checkpoint as ``(name, shape, safetensors dtype)`` (:func:`parameter_table`).
:mod:`dasc_compile.refckpt` writes checkpoints in these formats, with decay tensors drawn
from the initialisation, and re-exports the names above.

Where the formats come from:

* Configs: transcriptions of published ``config.json`` files (the Mamba2 hybrids' and their sources in
  :mod:`dasc_compile.refckpt_mamba2`; no full-size parameter list is modelled for them). Qwen3-Next-80B-A3B-Instruct as on
  Hugging Face. Kimi-Linear-48B-A3B-Instruct as re-published by a quantised mirror, with the
  mirror's ``quantization_config`` removed (its ``transformers_version`` is not known and left
  out). Qwen3.5-27B: the Qwen3.5-27B file itself was not reachable from here; the config is the
  published Qwen3.6-27B one, which has the same ``qwen3_5`` architecture and sizes (64 layers,
  48 GDN layers x 48 value heads, hidden 5120; every field the compiler reads matches
  /work/shared/MODELS.md, and its parameter table gives the 27.78 B parameters / 55.56 GB that
  the published index of that architecture lists).
* Parameter lists: Qwen3-Next and Qwen3.5 follow transformers' model classes (5.12.1), in the
  on-disk layout (per-expert tensors, which transformers fuses on load) plus the ``mtp.*`` tensors
  that transformers skips (SGLang ``models/qwen3_next_mtp.py``, ``qwen3_5_mtp.py``); a test
  checks the list against transformers' classes built on the meta device. transformers 5.12.1
  has no ``kimi_linear``: its list follows SGLang 0.5.17 ``models/kimi_linear.py``
  (``load_weights`` names, ``KimiDeltaAttention``, ``DeepseekV2AttentionMLA`` with
  ``q_lora_rank = None``, ``KimiMoE``).
* Dtypes: BF16 everywhere except A_log (FP32, all three), Kimi dt_bias (FP32) and Kimi's
  ``gate.e_score_correction_bias`` (FP32, DeepSeek-V3 convention; an assumption). Qwen3-Next and
  Qwen3.5 dt_bias are BF16 (MODELS.md; SGLang keeps them in the model dtype).
"""

from __future__ import annotations

import json

from dasc_compile.arch import ArchSpec, arch_from_config, text_config
from dasc_compile.errors import DascInputError
from dasc_compile.refckpt_mamba2 import MAMBA2_REFERENCE_CONFIGS

__all__ = ["MODEL_NAMES", "Param", "REFERENCE_CONFIGS", "parameter_table", "resolve_config"]

# ----------------------------------------------------------------------------- published configs

_QWEN3_NEXT_80B_A3B = {
    "architectures": ["Qwen3NextForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "decoder_sparse_step": 1, "eos_token_id": 151645, "full_attention_interval": 4, "head_dim": 256,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5120,
    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
    "mlp_only_layers": [], "model_type": "qwen3_next", "moe_intermediate_size": 512, "norm_topk_prob": True,
    "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 48,
    "num_key_value_heads": 2, "output_router_logits": False, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 10000000, "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 512, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.57.0.dev0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}

_KIMI_LINEAR_48B_A3B = {
    "architectures": ["KimiLinearForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_kimi.KimiLinearConfig", "AutoModel": "modeling_kimi.KimiLinearModel",
                 "AutoModelForCausalLM": "modeling_kimi.KimiLinearForCausalLM"},
    "bos_token_id": 163584, "dtype": "bfloat16", "eos_token_id": 163586, "first_k_dense_replace": 1, "head_dim": 72,
    "hidden_act": "silu", "hidden_size": 2304, "initializer_range": 0.02, "intermediate_size": 9216,
    "kv_lora_rank": 512,
    "linear_attn_config": {
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27], "head_dim": 128,
        "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
        "num_heads": 32, "short_conv_kernel_size": 4},
    "mla_use_nope": True, "model_max_length": 1048576, "model_type": "kimi_linear", "moe_intermediate_size": 1024,
    "moe_layer_freq": 1, "moe_renormalize": True, "moe_router_activation_func": "sigmoid", "num_attention_heads": 32,
    "num_expert_group": 1, "num_experts": 256, "num_experts_per_token": 8, "num_hidden_layers": 27,
    "num_key_value_heads": 32, "num_nextn_predict_layers": 0, "num_shared_experts": 1, "pad_token_id": 163839,
    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05,
    "rope_scaling": None, "rope_theta": 10000.0, "routed_scaling_factor": 2.446, "tie_word_embeddings": False,
    "topk_group": 1, "use_cache": True, "use_grouped_topk": True, "v_head_dim": 128, "vocab_size": 163840,
}

_QWEN3_5_27B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "image_token_id": 248056, "language_model_only": False,
    "model_type": "qwen3_5",
    "text_config": {
        "attention_bias": False, "attention_dropout": 0.0, "attn_output_gate": True, "bos_token_id": 248044,
        "dtype": "bfloat16", "eos_token_id": 248044, "full_attention_interval": 4, "head_dim": 256,
        "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 17408,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 16,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 48, "linear_value_head_dim": 128, "mamba_ssm_dtype": "float32",
        "max_position_embeddings": 262144, "model_type": "qwen3_5_text", "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False, "num_attention_heads": 24, "num_hidden_layers": 64,
        "num_key_value_heads": 4, "output_gate_type": "swish", "pad_token_id": None, "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "partial_rotary_factor": 0.25,
                            "rope_theta": 10000000, "rope_type": "default"},
        "tie_word_embeddings": False, "use_cache": True, "vocab_size": 248320},
    "tie_word_embeddings": False, "transformers_version": "4.57.1", "video_token_id": 248057,
    "vision_config": {
        "deepstack_visual_indexes": [], "depth": 27, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1152,
        "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 4304, "model_type": "qwen3_5",
        "num_heads": 16, "num_position_embeddings": 2304, "out_hidden_size": 5120, "patch_size": 16,
        "spatial_merge_size": 2, "temporal_patch_size": 2},
    "vision_end_token_id": 248054, "vision_start_token_id": 248053,
}

#: Reference model name -> published config.json (the Mamba2 hybrids' in :mod:`dasc_compile.refckpt_mamba2`).
REFERENCE_CONFIGS: dict[str, dict] = {
    "qwen3-next-80b-a3b": _QWEN3_NEXT_80B_A3B,
    "kimi-linear-48b-a3b": _KIMI_LINEAR_48B_A3B,
    "qwen3.5-27b": _QWEN3_5_27B,
    **MAMBA2_REFERENCE_CONFIGS,
}
MODEL_NAMES = tuple(REFERENCE_CONFIGS)

Param = tuple[str, tuple[int, ...], str]   # (tensor name, shape, safetensors dtype code)


def resolve_config(model: str | dict) -> tuple[str, dict]:
    """``(name, config)`` for a reference model name or a config dict (small test configs).

    Raises:
        DascInputError: unknown model name.
    """
    if isinstance(model, dict):
        return str(model.get("model_type", "custom")), json.loads(json.dumps(model))
    if model not in REFERENCE_CONFIGS:
        raise DascInputError(f"reference model {model!r} is unknown; expected one of {list(MODEL_NAMES)}")
    return model, json.loads(json.dumps(REFERENCE_CONFIGS[model]))


# ----------------------------------------------------------------------------- parameter lists


def _gated_attention(p: str, cfg: dict) -> list[Param]:
    hs, hd, nh, nkv = cfg["hidden_size"], cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    return [(f"{p}self_attn.q_proj.weight", (nh * hd * 2, hs), "BF16"),     # queries + output gate
            (f"{p}self_attn.k_proj.weight", (nkv * hd, hs), "BF16"),
            (f"{p}self_attn.v_proj.weight", (nkv * hd, hs), "BF16"),
            (f"{p}self_attn.o_proj.weight", (hs, nh * hd), "BF16"),
            (f"{p}self_attn.q_norm.weight", (hd,), "BF16"),
            (f"{p}self_attn.k_norm.weight", (hd,), "BF16")]


def _qwen3_next_moe(p: str, cfg: dict) -> list[Param]:
    hs, e, i, s = cfg["hidden_size"], cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
    out: list[Param] = [(f"{p}mlp.gate.weight", (e, hs), "BF16")]
    for j in range(e):
        out += [(f"{p}mlp.experts.{j}.gate_proj.weight", (i, hs), "BF16"),
                (f"{p}mlp.experts.{j}.up_proj.weight", (i, hs), "BF16"),
                (f"{p}mlp.experts.{j}.down_proj.weight", (hs, i), "BF16")]
    return out + [(f"{p}mlp.shared_expert.gate_proj.weight", (s, hs), "BF16"),
                  (f"{p}mlp.shared_expert.up_proj.weight", (s, hs), "BF16"),
                  (f"{p}mlp.shared_expert.down_proj.weight", (hs, s), "BF16"),
                  (f"{p}mlp.shared_expert_gate.weight", (1, hs), "BF16")]


def _dense_mlp(p: str, hs: int, i: int) -> list[Param]:
    return [(f"{p}mlp.gate_proj.weight", (i, hs), "BF16"), (f"{p}mlp.up_proj.weight", (i, hs), "BF16"),
            (f"{p}mlp.down_proj.weight", (hs, i), "BF16")]


def _norms(p: str, hs: int) -> list[Param]:
    return [(f"{p}input_layernorm.weight", (hs,), "BF16"), (f"{p}post_attention_layernorm.weight", (hs,), "BF16")]


def _mtp_head(hs: int) -> list[Param]:
    return [("mtp.fc.weight", (hs, 2 * hs), "BF16"), ("mtp.pre_fc_norm_embedding.weight", (hs,), "BF16"),
            ("mtp.pre_fc_norm_hidden.weight", (hs,), "BF16")]


def _qwen3_next_params(cfg: dict, spec: ArchSpec) -> list[Param]:
    hs, v = cfg["hidden_size"], cfg["vocab_size"]
    hk, hv, dk, dv, k = (cfg[n] for n in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                          "linear_value_head_dim", "linear_conv_kernel_dim"))
    rec = set(spec.recurrent_layer_ids)
    out: list[Param] = [("model.embed_tokens.weight", (v, hs), "BF16")]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        if i in rec:
            out += [(f"{p}linear_attn.dt_bias", (hv,), "BF16"), (f"{p}linear_attn.A_log", (hv,), "F32"),
                    (f"{p}linear_attn.conv1d.weight", (2 * hk * dk + hv * dv, 1, k), "BF16"),
                    (f"{p}linear_attn.in_proj_qkvz.weight", (2 * hk * dk + 2 * hv * dv, hs), "BF16"),
                    (f"{p}linear_attn.in_proj_ba.weight", (2 * hv, hs), "BF16"),
                    (f"{p}linear_attn.norm.weight", (dv,), "BF16"),
                    (f"{p}linear_attn.out_proj.weight", (hs, hv * dv), "BF16")]
        else:
            out += _gated_attention(p, cfg)
        out += _qwen3_next_moe(p, cfg) + _norms(p, hs)
    out += [("model.norm.weight", (hs,), "BF16"), ("lm_head.weight", (v, hs), "BF16")]
    # multi-token prediction head: one full-attention MoE layer (SGLang models/qwen3_next_mtp.py)
    return out + _mtp_head(hs) + _gated_attention("mtp.layers.0.", cfg) + _qwen3_next_moe("mtp.layers.0.", cfg) \
        + _norms("mtp.layers.0.", hs) + [("mtp.norm.weight", (hs,), "BF16")]


def _qwen3_5_vision(vc: dict) -> list[Param]:
    h, i, m = vc["hidden_size"], vc["intermediate_size"], vc["spatial_merge_size"] ** 2 * vc["hidden_size"]
    p = "model.visual."
    out: list[Param] = [
        (f"{p}patch_embed.proj.weight", (h, vc["in_channels"], vc["temporal_patch_size"], vc["patch_size"],
                                         vc["patch_size"]), "BF16"),
        (f"{p}patch_embed.proj.bias", (h,), "BF16"), (f"{p}pos_embed.weight", (vc["num_position_embeddings"], h), "BF16")]
    for b in range(vc["depth"]):
        q = f"{p}blocks.{b}."
        out += [(f"{q}norm1.weight", (h,), "BF16"), (f"{q}norm1.bias", (h,), "BF16"),
                (f"{q}norm2.weight", (h,), "BF16"), (f"{q}norm2.bias", (h,), "BF16"),
                (f"{q}attn.qkv.weight", (3 * h, h), "BF16"), (f"{q}attn.qkv.bias", (3 * h,), "BF16"),
                (f"{q}attn.proj.weight", (h, h), "BF16"), (f"{q}attn.proj.bias", (h,), "BF16"),
                (f"{q}mlp.linear_fc1.weight", (i, h), "BF16"), (f"{q}mlp.linear_fc1.bias", (i,), "BF16"),
                (f"{q}mlp.linear_fc2.weight", (h, i), "BF16"), (f"{q}mlp.linear_fc2.bias", (h,), "BF16")]
    if vc.get("deepstack_visual_indexes"):
        raise DascInputError("reference config: deepstack vision mergers are not modelled; expected deepstack_visual_indexes = []")
    return out + [(f"{p}merger.norm.weight", (h,), "BF16"), (f"{p}merger.norm.bias", (h,), "BF16"),
                  (f"{p}merger.linear_fc1.weight", (m, m), "BF16"), (f"{p}merger.linear_fc1.bias", (m,), "BF16"),
                  (f"{p}merger.linear_fc2.weight", (vc["out_hidden_size"], m), "BF16"),
                  (f"{p}merger.linear_fc2.bias", (vc["out_hidden_size"],), "BF16")]


def _qwen3_5_params(config: dict, spec: ArchSpec) -> list[Param]:
    cfg = text_config(config)
    if "num_experts" in cfg:
        raise DascInputError("reference config: only dense Qwen3.5 (qwen3_5) full-size checkpoints are modelled")
    hs, v, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    hk, hv, dk, dv, k = (cfg[n] for n in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                                          "linear_value_head_dim", "linear_conv_kernel_dim"))
    rec = set(spec.recurrent_layer_ids)
    out = _qwen3_5_vision(config["vision_config"]) if isinstance(config.get("vision_config"), dict) else []
    out.append(("model.language_model.embed_tokens.weight", (v, hs), "BF16"))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.language_model.layers.{i}."
        if i in rec:
            out += [(f"{p}linear_attn.dt_bias", (hv,), "BF16"), (f"{p}linear_attn.A_log", (hv,), "F32"),
                    (f"{p}linear_attn.conv1d.weight", (2 * hk * dk + hv * dv, 1, k), "BF16"),
                    (f"{p}linear_attn.norm.weight", (dv,), "BF16"),
                    (f"{p}linear_attn.out_proj.weight", (hs, hv * dv), "BF16"),
                    (f"{p}linear_attn.in_proj_qkv.weight", (2 * hk * dk + hv * dv, hs), "BF16"),
                    (f"{p}linear_attn.in_proj_z.weight", (hv * dv, hs), "BF16"),
                    (f"{p}linear_attn.in_proj_b.weight", (hv, hs), "BF16"),
                    (f"{p}linear_attn.in_proj_a.weight", (hv, hs), "BF16")]
        else:
            out += _gated_attention(p, cfg)
        out += _dense_mlp(p, hs, inter) + _norms(p, hs)
    out += [("model.language_model.norm.weight", (hs,), "BF16"), ("lm_head.weight", (v, hs), "BF16")]
    for j in range(int(cfg.get("mtp_num_hidden_layers") or 0)):   # SGLang models/qwen3_5_mtp.py
        if j == 0:
            out += _mtp_head(hs)
        p = f"mtp.layers.{j}."
        out += _gated_attention(p, cfg) + _dense_mlp(p, hs, inter) + _norms(p, hs)
    if cfg.get("mtp_num_hidden_layers"):
        out.append(("mtp.norm.weight", (hs,), "BF16"))
    return out


def _kimi_params(cfg: dict, spec: ArchSpec) -> list[Param]:
    hs, v = cfg["hidden_size"], cfg["vocab_size"]
    lac = cfg["linear_attn_config"]
    h, d, k = lac["num_heads"], lac["head_dim"], lac["short_conv_kernel_size"]
    nh, nope, rope, vd, kvr = (cfg[n] for n in ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim",
                                                 "v_head_dim", "kv_lora_rank"))
    if cfg.get("q_lora_rank") is not None:
        raise DascInputError("reference config: Kimi MLA with q_lora_rank is not modelled; expected q_lora_rank = null")
    e, mi, ns = cfg.get("num_experts"), cfg["moe_intermediate_size"], cfg.get("num_shared_experts") or 0
    rec = set(spec.recurrent_layer_ids)
    out: list[Param] = [("model.embed_tokens.weight", (v, hs), "BF16")]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn."
        if i in rec:   # KimiDeltaAttention (unfused checkpoint names, SGLang load_weights)
            out += [(f"{p}q_proj.weight", (h * d, hs), "BF16"), (f"{p}k_proj.weight", (h * d, hs), "BF16"),
                    (f"{p}v_proj.weight", (h * d, hs), "BF16"),
                    (f"{p}q_conv1d.weight", (h * d, 1, k), "BF16"), (f"{p}k_conv1d.weight", (h * d, 1, k), "BF16"),
                    (f"{p}v_conv1d.weight", (h * d, 1, k), "BF16"),
                    (f"{p}A_log", (1, 1, h, 1), "F32"), (f"{p}dt_bias", (h * d,), "F32"),
                    (f"{p}f_a_proj.weight", (d, hs), "BF16"), (f"{p}f_b_proj.weight", (h * d, d), "BF16"),
                    (f"{p}b_proj.weight", (h, hs), "BF16"),
                    (f"{p}g_a_proj.weight", (d, hs), "BF16"), (f"{p}g_b_proj.weight", (h * d, d), "BF16"),
                    (f"{p}o_norm.weight", (d,), "BF16"), (f"{p}o_proj.weight", (hs, h * d), "BF16")]
        else:          # MLA without q LoRA (NoPE in Kimi-Linear, but the rope slice is still projected)
            out += [(f"{p}q_proj.weight", (nh * (nope + rope), hs), "BF16"),
                    (f"{p}kv_a_proj_with_mqa.weight", (kvr + rope, hs), "BF16"),
                    (f"{p}kv_a_layernorm.weight", (kvr,), "BF16"),
                    (f"{p}kv_b_proj.weight", (nh * (nope + vd), kvr), "BF16"),
                    (f"{p}o_proj.weight", (hs, nh * vd), "BF16")]
        q = f"model.layers.{i}."
        if e and i >= cfg.get("first_k_dense_replace", 0) and i % cfg.get("moe_layer_freq", 1) == 0:
            m = f"{q}block_sparse_moe."
            out += [(f"{m}gate.weight", (e, hs), "BF16"), (f"{m}gate.e_score_correction_bias", (e,), "F32")]
            for j in range(e):
                out += [(f"{m}experts.{j}.w1.weight", (mi, hs), "BF16"), (f"{m}experts.{j}.w2.weight", (hs, mi), "BF16"),
                        (f"{m}experts.{j}.w3.weight", (mi, hs), "BF16")]
            if ns:
                out += [(f"{m}shared_experts.gate_proj.weight", (mi * ns, hs), "BF16"),
                        (f"{m}shared_experts.up_proj.weight", (mi * ns, hs), "BF16"),
                        (f"{m}shared_experts.down_proj.weight", (hs, mi * ns), "BF16")]
        else:
            out += _dense_mlp(q, hs, cfg["intermediate_size"])
        out += _norms(q, hs)
    return out + [("model.norm.weight", (hs,), "BF16"), ("lm_head.weight", (v, hs), "BF16")]


def parameter_table(config: dict, spec: ArchSpec | None = None) -> list[Param]:
    """Every tensor of the real checkpoint: ``[(name, shape, safetensors dtype), ...]`` in model order.

    Raises:
        DascInputError: a model type without a modelled parameter list.
    """
    spec = spec or arch_from_config(config, "reference config")
    mt = config.get("model_type")
    if mt == "qwen3_next":
        return _qwen3_next_params(config, spec)
    if mt == "qwen3_5":
        return _qwen3_5_params(config, spec)
    if mt == "kimi_linear":
        return _kimi_params(config, spec)
    raise DascInputError(f"reference config: no full-size parameter list for model_type {mt!r}; "
                         f"expected qwen3_next, qwen3_5 or kimi_linear")
