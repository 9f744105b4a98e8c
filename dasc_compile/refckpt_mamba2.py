"""Published configs of the three Mamba2-hybrid reference models (data; :mod:`dasc_compile.refckpt_formats`
adds them to ``REFERENCE_CONFIGS``, :mod:`dasc_compile.refckpt` writes their decay-only checkpoints).

Transcribed, with their sources (the originals could not be downloaded from here):

* ``nemotron-h-8b-base-8k``: nvidia/Nemotron-H-8B-Base-8K ``config.json`` as transcribed in TensorRT-LLM's
  ``test_modeling_nemotron_h.py`` (52 layers, pattern ``M-M-M-M*-...``: 24 Mamba2, 4 attention, 24 MLP;
  128 heads x 64, d_state 128, n_groups 8, conv 4; NVIDIA's Megatron-Bridge docs give the same sizes).
  No ``time_step_*`` fields: transformers' defaults apply (min 0.001, max 0.1, floor 1e-4, limit (0, inf)).
* ``granite-4.0-h-tiny``: ibm-granite/granite-4.0-h-tiny, the fields a public importer's test lists from
  the published file (40 layers: 36 Mamba2 + 4 attention at 5, 15, 25, 35; 48 heads x 64, d_state 128,
  n_groups 1, conv 4, hidden 1536; MODELS.md agrees), plus ``architectures``.
* ``falcon-h1-0.5b``: tiiuae Falcon-H1-0.5B as transcribed in NVIDIA Megatron-Bridge's Falcon-H1 bridge
  test (36 layers, Mamba2 beside attention in each; 24 heads x 64, d_state 128, n_groups 1, conv 4,
  ``ssm_multipliers``), plus ``mamba_d_ssm: 1536``: the transcription omits it, yet 24 x 64 != mamba_expand *
  hidden_size = 2048, which transformers' ``FalconH1Config`` and SGLang refuse, so the published file must
  carry it (inferred, not seen).

Checkpoint formats (tensor names from transformers 5.12.1 / SGLang 0.5.17 model classes): Nemotron-H
``backbone.layers.{i}.mixer.{A_log,dt_bias}``, Granite-4.0-H and Falcon-H1 ``model.layers.{i}.mamba.{A_log,
dt_bias}``, all ``[H]``. Dtypes: FP32 for both (MODELS.md for Granite-4.0-H-Tiny; assumed for the other two,
as mamba_ssm keeps A_log / dt_bias / D in FP32).
"""

from __future__ import annotations

_NEMOTRON_H_8B = {
    "architectures": ["NemotronHForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attention_head_dim": 128, "bos_token_id": 1, "chunk_size": 256, "conv_kernel": 4, "eos_token_id": 2,
    "expand": 2, "hidden_dropout": 0.0, "hidden_size": 4096,
    "hybrid_override_pattern": "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-",
    "initializer_range": 0.02, "intermediate_size": 21504, "layer_norm_epsilon": 1e-05, "mamba_head_dim": 64,
    "mamba_hidden_act": "silu", "mamba_num_heads": 128, "mamba_proj_bias": False, "max_position_embeddings": 8192,
    "mlp_bias": False, "mlp_hidden_act": "relu2", "model_type": "nemotron_h", "n_groups": 8,
    "num_attention_heads": 32, "num_hidden_layers": 52, "num_key_value_heads": 8, "num_logits_to_keep": 1,
    "pad_token_id": 0, "rescale_prenorm_residual": True, "residual_in_fp32": False, "rms_norm_eps": 1e-05,
    "sliding_window": None, "ssm_state_size": 128, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_bias": False, "use_cache": True, "use_conv_bias": True, "use_mamba_kernels": True, "vocab_size": 131072,
}

_GRANITE_4_0_H_TINY = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "hidden_size": 1536,
    "num_hidden_layers": 40, "num_attention_heads": 12, "num_key_value_heads": 4, "intermediate_size": 512,
    "shared_intermediate_size": 1024, "num_local_experts": 64, "num_experts_per_tok": 6, "vocab_size": 100352,
    "tie_word_embeddings": True, "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_n_heads": 48,
    "mamba_d_head": 64, "mamba_expand": 2, "mamba_d_conv": 4, "mamba_chunk_size": 256,
    "max_position_embeddings": 131072,
    "layer_types": (["mamba"] * 5 + ["attention"] + ["mamba"] * 9 + ["attention"] + ["mamba"] * 9 + ["attention"]
                    + ["mamba"] * 9 + ["attention"] + ["mamba"] * 4),
}

_FALCON_H1_0_5B = {
    "architectures": ["FalconH1ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attention_in_multiplier": 1.0, "attention_out_multiplier": 0.9375, "attn_layer_indices": None,
    "embedding_multiplier": 5.656854249492381, "head_dim": 64, "hidden_act": "silu", "hidden_size": 1024,
    "initializer_range": 0.02, "intermediate_size": 2048, "key_multiplier": 0.39062499999999994,
    "lm_head_multiplier": 0.0390625, "mamba_chunk_size": 128, "mamba_conv_bias": True, "mamba_d_conv": 4,
    "mamba_d_head": 64, "mamba_d_ssm": 1536, "mamba_d_state": 128, "mamba_expand": 2, "mamba_n_groups": 1,
    "mamba_n_heads": 24, "mamba_norm_before_gate": False, "mamba_proj_bias": False, "mamba_rms_norm": False,
    "mamba_use_mlp": True, "max_position_embeddings": 16384, "mlp_bias": False,
    "mlp_multipliers": [0.8838834764831844, 0.5859375], "model_type": "falcon_h1", "num_attention_heads": 8,
    "num_hidden_layers": 36, "num_key_value_heads": 2, "projectors_bias": False, "rms_norm_eps": 1e-5,
    "rope_scaling": None, "rope_theta": 100000000000.0, "ssm_in_multiplier": 1.25,
    "ssm_multipliers": [0.3535533905932738, 0.25, 0.3535533905932738, 0.5, 0.3535533905932738],
    "ssm_out_multiplier": 0.23570226039551587, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "vocab_size": 32784,
}

#: Reference model name -> config.json of the Mamba2 hybrids.
MAMBA2_REFERENCE_CONFIGS: dict[str, dict] = {
    "nemotron-h-8b-base-8k": _NEMOTRON_H_8B,
    "granite-4.0-h-tiny": _GRANITE_4_0_H_TINY,
    "falcon-h1-0.5b": _FALCON_H1_0_5B,
}
