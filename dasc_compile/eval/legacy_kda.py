"""The first bundled KDA reference (``plans/reference/kda-hybrid-3m-sharegpt``), run by transformers' own layers.

That checkpoint (``architectures: ["DascKDAHybridForCausalLM"]``, ``model_type: kimi_linear`` for
``dasc compile``) was trained before transformers had a Kimi-Linear model: transformers' Qwen3-Next
backbone (its gated softmax attention with partial RoPE and q/k norms, dense MLP, norms) whose
``linear_attention`` layers hold a Kimi Delta Attention layer. Its full-attention layers cannot be
rewritten as Kimi-Linear's NoPE MLA attention (no per-head q/k norm, no output gate, no RoPE there), so
it is not converted; it is run here as it was built, with transformers' ``KimiLinearDeltaAttention``
(transformers >= 5.17, the same KDA layer as ``kimi_linear`` models) in place of dasc's former
hand-written KDA layer. The tensors map one to one (names below); measured on that checkpoint, the
logits agree with the hand-written layer's to within float32 rounding (PROVENANCE.md beside it).
"""

from __future__ import annotations

import torch

from dasc_compile.errors import DascInputError

ARCHITECTURE = "DascKDAHybridForCausalLM"

# checkpoint tensor (under model.layers.{i}.self_attn.) -> transformers KDA layer (under .linear_attn.)
_RENAMES = {"A_log": "forget_gate.A_log", "dt_bias": "forget_gate.dt_bias", "f_a_proj.weight": "forget_gate.f_a_proj.weight",
            "f_b_proj.weight": "forget_gate.f_b_proj.weight", "o_norm_weight": "o_norm.weight"}


def is_legacy_kda(cfg: dict) -> bool:
    """A DascKDAHybrid ``config.json`` (a ``kimi_linear`` config carrying its backbone under ``dasc_backbone``)."""
    return ARCHITECTURE in (cfg.get("architectures") or []) and isinstance(cfg.get("dasc_backbone"), dict)


def legacy_state_dict(state: dict[str, torch.Tensor], kda_layers: list[int]) -> dict[str, torch.Tensor]:
    """Checkpoint tensor names -> the names of :func:`build_legacy_kda`'s model (KDA layers only change)."""
    out = {}
    for name, t in state.items():
        for i in kda_layers:
            pre = f"model.layers.{i}.self_attn."
            if name.startswith(pre):
                rest = name[len(pre):]
                name = f"model.layers.{i}.linear_attn." + _RENAMES.get(rest, rest)
                break
        out[name] = t
    return out


def build_legacy_kda(cfg: dict):
    """transformers' ``Qwen3NextForCausalLM`` from ``cfg["dasc_backbone"]`` with a transformers
    ``KimiLinearDeltaAttention`` (H = ``linear_attn_config.num_heads``, d = ``head_dim``, conv K =
    ``short_conv_kernel_size``) as the token mixer of every ``linear_attention`` layer; weights uninitialised."""
    from transformers import KimiLinearConfig, Qwen3NextConfig, Qwen3NextForCausalLM
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

    backbone = Qwen3NextConfig(**cfg["dasc_backbone"])
    lac = cfg["linear_attn_config"]
    kda_cfg = KimiLinearConfig(hidden_size=backbone.hidden_size, num_hidden_layers=backbone.num_hidden_layers,
                               layer_types=list(backbone.layer_types), linear_num_heads=lac["num_heads"],
                               linear_head_dim=lac["head_dim"], linear_conv_kernel_dim=lac["short_conv_kernel_size"],
                               hidden_act="silu", rms_norm_eps=backbone.rms_norm_eps)
    model = Qwen3NextForCausalLM(backbone)
    for i, kind in enumerate(backbone.layer_types):
        if kind == "linear_attention":
            model.model.layers[i].linear_attn = KimiLinearDeltaAttention(kda_cfg, i)
    return model


def load_legacy_kda(state: dict[str, torch.Tensor], cfg: dict, source: str):
    """The DascKDAHybrid model with ``state`` (checkpoint names) loaded; float32, eval mode.

    Raises:
        DascInputError: tensors that do not fit the model (naming ``source``).
    """
    model = build_legacy_kda(cfg)
    kda_layers = [i - 1 for i in cfg["linear_attn_config"]["kda_layers"]]
    missing, unexpected = model.load_state_dict(legacy_state_dict(state, kda_layers), strict=False)
    tied = model.config.tie_word_embeddings
    missing = [m for m in missing if not (tied and m.endswith("lm_head.weight"))]
    if missing or unexpected:
        raise DascInputError(f"{source}: weights do not fit {ARCHITECTURE} (missing {missing[:3]}, unexpected {unexpected[:3]})")
    if tied:
        model.tie_weights()
    return model.float().eval()
