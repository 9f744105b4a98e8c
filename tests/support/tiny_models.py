"""Tiny, randomly initialised real hybrid models for the ``dasc eval`` tests (built here, no downloads).

GDN: transformers' own Qwen3-Next (4 layers: GDN, attention, GDN, attention; 4 value heads) with
A_log set so that two heads have long static horizons and two short ones. KDA: transformers' own
Kimi-Linear (same layer pattern; 2 heads x d_k 8 = 16 column units per layer, Kimi-Linear
initialisation), which needs transformers >= 5.17. Mamba2: transformers' own Nemotron-H, Granite-4.0-H
and Falcon-H1 (4 heads of [8, 8] per Mamba2 layer). All are saved as Hugging Face checkpoints with a
byte vocabulary.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch


def backbone(layer_types=("linear_attention", "full_attention", "linear_attention", "full_attention")):
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=len(layer_types),
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        num_experts=0, layer_types=list(layer_types), tie_word_embeddings=False, max_position_embeddings=2048,
        initializer_range=0.2)


def _save(model, cfg: dict, out: Path) -> Path:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"),
              {"format": "pt"})
    return out


def write_gdn(out: Path, seed: int = 0, a_log=(math.log(0.05), math.log(0.02), math.log(2.0), math.log(3.0)),
              layer_types=None) -> Path:
    from transformers import Qwen3NextForCausalLM

    torch.manual_seed(seed)
    cfg = backbone(layer_types) if layer_types else backbone()
    model = Qwen3NextForCausalLM(cfg)
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer, "linear_attn"):
                layer.linear_attn.A_log.copy_(torch.tensor(a_log))
    d = cfg.to_dict()
    d["dasc_tokenizer"] = "bytes"
    return _save(model, d, out)


def kimi_config(layer_types=("linear_attention", "full_attention", "linear_attention", "full_attention")):
    """A tiny transformers ``KimiLinearConfig``: KDA 2 heads x d 8 (16 column units per layer), NoPE MLA
    attention, dense MLPs."""
    from transformers import KimiLinearConfig

    n = len(layer_types)
    return KimiLinearConfig(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=n, num_attention_heads=2,
        num_key_value_heads=2, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16,
        v_head_dim=16, mlp_layer_types=["dense"] * n, layer_types=list(layer_types), linear_num_heads=2,
        linear_head_dim=8, linear_conv_kernel_dim=4, max_position_embeddings=2048, tie_word_embeddings=False,
        initializer_range=0.2, pad_token_id=None, bos_token_id=None, eos_token_id=None)


def save_hf(model, out: Path, **extra) -> Path:
    """``model.save_pretrained(out)`` (transformers' own checkpoint format), then ``extra`` keys in
    config.json (``dasc_tokenizer: bytes``, a provenance line)."""
    model.save_pretrained(out)
    d = json.loads((out / "config.json").read_text())
    d.update({"dasc_tokenizer": "bytes", **extra})
    (out / "config.json").write_text(json.dumps(d))
    return out


def write_kda(out: Path, seed: int = 0, decays=None, layer_types=None) -> Path:
    """transformers' own ``KimiLinearForCausalLM`` (transformers >= 5.17), initialised by transformers
    after ``torch.manual_seed(seed)`` (Kimi-Linear / fla decay initialisation), saved with
    ``save_pretrained``. ``decays``: optional ``{layer_id: (A_log [1,1,H,1], dt_bias [H*d])}`` to set;
    ``layer_types``: instead of :func:`kimi_config`'s default."""
    from transformers import KimiLinearForCausalLM

    torch.manual_seed(seed)
    model = KimiLinearForCausalLM(kimi_config(layer_types) if layer_types else kimi_config())
    with torch.no_grad():
        for lid, (a_log, dt_bias) in (decays or {}).items():
            gate = model.model.layers[lid].self_attn.forget_gate
            gate.A_log.copy_(torch.as_tensor(a_log).view_as(gate.A_log))
            gate.dt_bias.copy_(torch.as_tensor(dt_bias).view_as(gate.dt_bias))
    return save_hf(model, out)


def compile_for(model: Path, w_max: int, out: Path, **kw) -> Path:
    from dasc_compile.compiler import compile_plan
    from dasc_compile.policy import Policy

    _, path = compile_plan(model, Policy(w_max=w_max, **kw), out, with_kernels=False)
    return path


def write_qwen35(out: Path, seed: int = 0) -> Path:
    """A tiny Qwen3.5 (``qwen3_5``: nested ``text_config``, ``model.language_model.`` tensor names)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    torch.manual_seed(seed)
    text = {k: v for k, v in backbone().to_dict().items()
            if k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
                     "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "layer_types",
                     "max_position_embeddings", "initializer_range")}
    vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64)
    try:
        model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision))
    except ValueError as exc:            # 5.17's vision tower refuses its own default rope ("supports only axial")
        if "axial" not in str(exc):
            raise
        vision["rope_parameters"] = {"rope_type": "axial", "rope_theta": 10000.0}
        model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision))
    model.save_pretrained(out)
    d = json.loads((out / "config.json").read_text())
    d["dasc_tokenizer"] = "bytes"
    (out / "config.json").write_text(json.dumps(d))
    return out


def _set_decays(model, a_log=None, dt_bias=None):
    """Set A_log / dt_bias [H] of every Mamba2 mixer of ``model`` (None: keep transformers' initialisation)."""
    with torch.no_grad():
        for mod in model.modules():
            if hasattr(mod, "A_log") and hasattr(mod, "in_proj"):
                for name, value in (("A_log", a_log), ("dt_bias", dt_bias)):
                    if value is not None:
                        getattr(mod, name).copy_(torch.tensor(value))


M2_A_LOG = (math.log(0.05), math.log(0.5), math.log(2.0), math.log(8.0))


def write_nemotron_h(out: Path, seed: int = 0, a_log=M2_A_LOG, dt_bias=None) -> Path:
    """A tiny Nemotron-H (transformers' ``NemotronHForCausalLM``): layers Mamba2, attention, Mamba2, MLP; 4 heads of
    [head_dim 8, d_state 8], 2 B/C groups; A_log set per head (two long static horizons, two short), dt_bias from
    transformers' initialisation unless given. Saved by ``save_pretrained`` (``backbone.`` names)."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    torch.manual_seed(seed)
    cfg = NemotronHConfig(vocab_size=256, hidden_size=32, layers_block_type=["mamba", "attention", "mamba", "mlp"],
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=64,
                          mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=8, n_groups=2, conv_kernel=4,
                          chunk_size=16, max_position_embeddings=2048, initializer_range=0.2, use_mamba_kernels=False)
    model = NemotronHForCausalLM(cfg)
    _set_decays(model, a_log, dt_bias)
    return save_hf(model, out)


def write_granite_h(out: Path, seed: int = 0, a_log=M2_A_LOG, dt_bias=None) -> Path:
    """A tiny Granite-4.0-H (``GraniteMoeHybridForCausalLM``, dense MLP): layers Mamba2, attention (RoPE),
    Mamba2; Mamba2 as in :func:`write_nemotron_h`."""
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    torch.manual_seed(seed)
    cfg = GraniteMoeHybridConfig(vocab_size=256, hidden_size=32, num_hidden_layers=3,
                                 layer_types=["mamba", "attention", "mamba"], num_attention_heads=2,
                                 num_key_value_heads=1, intermediate_size=64, shared_intermediate_size=64,
                                 num_local_experts=0, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8,
                                 mamba_n_groups=2, mamba_d_conv=4, mamba_chunk_size=16, mamba_expand=1,
                                 max_position_embeddings=2048, initializer_range=0.2)
    model = GraniteMoeHybridForCausalLM(cfg)
    _set_decays(model, a_log, dt_bias)
    # the published names, which every transformers release and dasc compile read (5.24 saves
    # linear_attention / full_attention, which 5.12 and SGLang would read as attention layers)
    return save_hf(model, out, layer_types=["mamba", "attention", "mamba"])


def write_falcon_h1(out: Path, seed: int = 0, a_log=M2_A_LOG, dt_bias=None) -> Path:
    """A tiny Falcon-H1 (``FalconH1ForCausalLM``): two ``hybrid`` layers, each attention (RoPE) beside a Mamba2
    mixer in one cache layer; muP multipliers at their defaults; Mamba2 as in :func:`write_nemotron_h`."""
    from transformers import FalconH1Config, FalconH1ForCausalLM

    torch.manual_seed(seed)
    cfg = FalconH1Config(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=16, intermediate_size=64, mamba_d_ssm=32, mamba_n_heads=4,
                         mamba_d_head=8, mamba_d_state=8, mamba_n_groups=2, mamba_d_conv=4, mamba_chunk_size=16,
                         mamba_expand=1, max_position_embeddings=2048, initializer_range=0.2)
    model = FalconH1ForCausalLM(cfg)
    _set_decays(model, a_log, dt_bias)
    return save_hf(model, out)
