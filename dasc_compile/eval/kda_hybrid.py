"""A small KDA hybrid: transformers' Qwen3-Next backbone with Kimi Delta Attention token mixers.

transformers 5.12 has no Kimi-Linear model and flash-linear-attention's KDA kernels need a GPU, so
``dasc eval`` runs KDA through this model: every full-attention layer, MLP, norm, rotary embedding,
cache object and mask is transformers' own Qwen3-Next code; only the recurrent token mixer of the
``linear_attention`` layers is replaced by :class:`KDAMixer` (Kimi-Linear's KDA layer in its
essentials: q/k/v short convolution, low-rank channel-wise forget gate with ``A_log [1, 1, H, 1]`` and
``dt_bias [H * d_k]``, sigmoid beta, gated RMSNorm output; paper Eq. 1 and Eq. 2). It is *not* the
Kimi-Linear-48B architecture (no MLA, no MoE): checkpoints of this model are marked
``architectures: ["DascKDAHybridForCausalLM"]``.

On disk (``save_kda_hybrid``): ``config.json`` with ``model_type: kimi_linear`` and a Kimi-Linear
``linear_attn_config`` (so ``dasc compile`` reads it like Kimi-Linear), the backbone's Qwen3-Next
fields under ``dasc_backbone``, and tensors named as Kimi-Linear names them
(``model.layers.{i}.self_attn.A_log``, ``.dt_bias``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dasc_compile.eval.kda_ops import kda_chunked, kda_recurrent

ARCHITECTURE = "DascKDAHybridForCausalLM"


class KDAMixer(nn.Module):
    """KDA token mixer with the call signature of transformers' ``Qwen3NextGatedDeltaNet``.

    Args:
        hidden_size: model width D. num_heads: H. head_dim: d (= d_k = d_v). conv_kernel: K.
        layer_idx: index of the decoder layer (the cache slot).
    State in the transformers cache: ``conv_states [B, 3*H*d, K]`` (model dtype) and
    ``recurrent_states [B, H, d_k, d_v]`` (key-major, see :mod:`dasc_compile.eval.kda_ops`).
    ``self.chunk_kernel`` / ``self.step_kernel`` are attributes so that horizon validation can wrap
    them to observe the token-dependent log-decay ``g [B, T, H, d_k]``.
    """

    def __init__(self, hidden_size: int, num_heads: int, head_dim: int, conv_kernel: int, layer_idx: int,
                 eps: float = 1e-6):
        super().__init__()
        self.layer_idx, self.num_heads, self.head_dim, self.conv_kernel_size = layer_idx, num_heads, head_dim, conv_kernel
        hd = num_heads * head_dim
        self.q_proj = nn.Linear(hidden_size, hd, bias=False)
        self.k_proj = nn.Linear(hidden_size, hd, bias=False)
        self.v_proj = nn.Linear(hidden_size, hd, bias=False)
        self.conv1d = nn.Conv1d(3 * hd, 3 * hd, conv_kernel, groups=3 * hd, padding=conv_kernel - 1, bias=False)
        self.f_a_proj = nn.Linear(hidden_size, head_dim, bias=False)
        self.f_b_proj = nn.Linear(head_dim, hd, bias=False)
        self.b_proj = nn.Linear(hidden_size, num_heads, bias=False)
        self.g_a_proj = nn.Linear(hidden_size, head_dim, bias=False)
        self.g_b_proj = nn.Linear(head_dim, hd, bias=False)
        self.A_log = nn.Parameter(torch.zeros(1, 1, num_heads, 1))
        self.dt_bias = nn.Parameter(torch.zeros(hd))
        self.o_norm_weight = nn.Parameter(torch.ones(head_dim))
        self.o_proj = nn.Linear(hd, hidden_size, bias=False)
        self.eps = eps
        self.chunk_kernel = kda_chunked
        self.step_kernel = kda_recurrent

    @torch.no_grad()
    def reset_decay_parameters(self, generator: torch.Generator | None = None) -> None:
        """Kimi-Linear / fla initialisation (MODELS.md): A_log = log U(1, 16); dt ~ exp U(ln 1e-3, ln 1e-1),
        clamped >= 1e-4, dt_bias = dt + log(-expm1(-dt)) (inverse softplus)."""
        a = torch.empty(self.A_log.shape).uniform_(1.0, 16.0, generator=generator)
        self.A_log.copy_(a.log())
        dt = torch.empty(self.dt_bias.shape).uniform_(math.log(1e-3), math.log(1e-1), generator=generator).exp()
        dt = dt.clamp_min(1e-4)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """Token-dependent log-decay g = -exp(A_log[h]) * softplus(f(x)[h, k] + dt_bias[h, k]) (Eq. 2 with
        the observed gate input), float32 ``[B, T, H, d_k]``."""
        B, T, _ = x.shape
        f = self.f_b_proj(self.f_a_proj(x)).float().view(B, T, self.num_heads, self.head_dim)
        f = f + self.dt_bias.float().view(self.num_heads, self.head_dim)
        return -self.A_log.float().view(self.num_heads, 1).exp() * F.softplus(f)

    def forward(self, hidden_states: torch.Tensor, cache_params=None, attention_mask=None, **kwargs) -> torch.Tensor:
        """``hidden_states [B, T, D]`` -> ``[B, T, D]``; reads and updates the layer's cache slot."""
        B, T, _ = hidden_states.shape
        H, d, K = self.num_heads, self.head_dim, self.conv_kernel_size
        use_prev = cache_params is not None and cache_params.has_previous_state(self.layer_idx)
        x = torch.cat([self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)], dim=-1)
        x = x.transpose(1, 2)                                                   # [B, 3*H*d, T]
        if use_prev:
            x = torch.cat([cache_params.layers[self.layer_idx].conv_states.to(x.dtype), x], dim=-1)
        if cache_params is not None:
            cache_params.update_conv_state(F.pad(x, (K - x.shape[-1], 0)), self.layer_idx)
        x = F.silu(self.conv1d(x)[:, :, : x.shape[-1]])[:, :, -T:].transpose(1, 2)
        q, k, v = (t.reshape(B, T, H, d) for t in x.split(H * d, dim=-1))
        q = F.normalize(q.float(), dim=-1, eps=1e-6)
        k = F.normalize(k.float(), dim=-1, eps=1e-6)
        g = self.log_decay(hidden_states)
        beta = torch.sigmoid(self.b_proj(hidden_states).float())
        init = cache_params.layers[self.layer_idx].recurrent_states if use_prev else None
        kernel = self.step_kernel if (use_prev and T == 1) else self.chunk_kernel
        o, state = kernel(q, k, v, g, beta, initial_state=init)
        if cache_params is not None:
            cache_params.update_recurrent_state(state, self.layer_idx)
        o = o.float()
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps) * self.o_norm_weight.float()
        gate = torch.sigmoid(self.g_b_proj(self.g_a_proj(hidden_states)).float()).view(B, T, H, d)
        return self.o_proj((o * gate).reshape(B, T, H * d).to(hidden_states.dtype))


def backbone_config(cfg: dict):
    """The Qwen3-Next config of the backbone from a DascKDAHybrid ``config.json`` dict."""
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(**cfg["dasc_backbone"])


def build_kda_hybrid(backbone, kda_heads: int, kda_head_dim: int, conv_kernel: int, seed: int | None = None):
    """A :class:`transformers.Qwen3NextForCausalLM` whose ``linear_attention`` layers hold a :class:`KDAMixer`.

    Args:
        backbone: a ``Qwen3NextConfig`` (dense MLP: ``num_experts = 0``); its ``layer_types`` decide
            which layers are KDA. kda_heads / kda_head_dim / conv_kernel: the KDA layer's H, d, K.
        seed: when given, the KDA decay parameters are drawn from it (Kimi-Linear initialisation).
    """
    from transformers import Qwen3NextForCausalLM

    model = Qwen3NextForCausalLM(backbone)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    for i, layer in enumerate(model.model.layers):
        if backbone.layer_types[i] == "linear_attention":
            mixer = KDAMixer(backbone.hidden_size, kda_heads, kda_head_dim, conv_kernel, i, backbone.rms_norm_eps)
            for lin in (mixer.q_proj, mixer.k_proj, mixer.v_proj, mixer.f_a_proj, mixer.f_b_proj, mixer.b_proj,
                        mixer.g_a_proj, mixer.g_b_proj, mixer.o_proj):
                nn.init.normal_(lin.weight, std=backbone.initializer_range, generator=gen)
            mixer.reset_decay_parameters(gen)
            layer.linear_attn = mixer
    return model


def kda_config_json(backbone, kda_heads: int, kda_head_dim: int, conv_kernel: int) -> dict:
    """``config.json`` of a DascKDAHybrid checkpoint: Kimi-Linear fields for ``dasc compile`` + the backbone."""
    kinds = list(backbone.layer_types)
    return {
        "model_type": "kimi_linear",
        "architectures": [ARCHITECTURE],
        "num_hidden_layers": len(kinds),
        "hidden_size": backbone.hidden_size,
        "vocab_size": backbone.vocab_size,
        "linear_attn_config": {
            "kda_layers": [i + 1 for i, k in enumerate(kinds) if k == "linear_attention"],
            "full_attn_layers": [i + 1 for i, k in enumerate(kinds) if k == "full_attention"],
            "num_heads": kda_heads,
            "head_dim": kda_head_dim,
            "short_conv_kernel_size": conv_kernel,
        },
        "dasc_backbone": backbone.to_dict(),
    }


def _rename_kda_layers(state: dict[str, torch.Tensor], kda_layers: list[int], src: str, dst: str) -> dict[str, torch.Tensor]:
    """Rename ``model.layers.{i}.{src}.*`` -> ``model.layers.{i}.{dst}.*`` for the KDA layers ``i``."""
    prefixes = {f"model.layers.{i}.{src}.": f"model.layers.{i}.{dst}." for i in kda_layers}
    out = {}
    for name, t in state.items():
        for pre, repl in prefixes.items():
            if name.startswith(pre):
                name = repl + name[len(pre):]
                break
        out[name] = t
    return out


def to_kimi_names(state: dict[str, torch.Tensor], kda_layers: list[int]) -> dict[str, torch.Tensor]:
    """Rename ``model.layers.{i}.linear_attn.*`` -> ``model.layers.{i}.self_attn.*`` for the KDA layers
    (the tensor names of a Kimi-Linear checkpoint, MODELS.md)."""
    return _rename_kda_layers(state, kda_layers, "linear_attn", "self_attn")


def from_kimi_names(state: dict[str, torch.Tensor], kda_layers: list[int]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`to_kimi_names`."""
    return _rename_kda_layers(state, kda_layers, "self_attn", "linear_attn")
