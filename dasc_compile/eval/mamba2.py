"""``dasc eval`` on Mamba2 hybrids through transformers' own classes (Nemotron-H, Granite-4.0-H, Falcon-H1).

transformers 5.12.1's PyTorch path of these mixers (``torch_forward``, the only one on a CPU) runs a
multi-token chunk from a zero state (the chunked scan sets ``previous_states`` to zeros) and treats a
cache with a previous state as one decoding token; and Nemotron-H's chunked scan passes states between
chunks wrongly (``modeling_nemotron_h.py`` sums ``decay_chunk * states`` over the target chunk,
``.sum(dim=2)``, where Bamba / Granite / Falcon transpose first and sum over the source chunk): on the tiny
test model its logits leave its own one-token recurrence by up to 0.76 after the first ``chunk_size``
tokens. ``dasc eval`` therefore runs at most one chunk from a fresh cache and steps every other token
through the one-token recurrence (``EvalModel.max_chunk``), which is exact for all three models. The recurrent state checkpoint is
``cache.layers[i].recurrent_states`` ``[B, H, head_dim, d_state]`` (transformers ``LinearAttentionLayer``),
one unit per head, so the arms of :mod:`dasc_compile.eval.arms` apply unchanged.

Observed log-decay (Eq. 4, ``dasc eval --horizons``): a forward hook on each mixer's ``in_proj`` takes the
``dt`` channels (the last H of the projection; Falcon-H1 first scales the projection by its muP vector),
forms ``dt = softplus(dt + dt_bias)`` with the model's own clamp (Nemotron-H: from below at
``time_step_min``; Granite / Falcon: ``time_step_limit``) and reports ``g = dt * A``, ``A = -exp(A_log)``,
``[B, T, H]`` through ``mixer.dasc_observe_decay(g=...)``, the attribute that
:class:`~dasc_compile.eval.horizons.DecayRecorder` wraps (:data:`KERNEL_ATTRS`). So the horizons measured
are those of transformers' PyTorch path, whose Nemotron-H clamp differs from SGLang's (0, inf)
(:mod:`dasc_compile.families.mamba2`): for a head whose step stays above ``time_step_min`` they agree.
"""

from __future__ import annotations

import torch

__all__ = ["KERNEL_ATTRS", "mamba2_mixers"]

#: the mixer attribute the horizon recorder wraps (called with ``g=[B, T, H]`` by the in_proj hook)
KERNEL_ATTRS = ("dasc_observe_decay",)


def _observed_step(mixer, projected: torch.Tensor) -> torch.Tensor:
    """``dt`` [B, T, H] as ``mixer.torch_forward`` forms it from the in_proj output."""
    if hasattr(mixer, "mup_vector"):                                   # Falcon-H1's muP multipliers
        projected = projected * mixer.mup_vector
    dt = torch.nn.functional.softplus(projected[..., -mixer.num_heads:].float() + mixer.dt_bias.float())
    if type(mixer).__name__.startswith("NemotronH"):                    # modeling_nemotron_h: clamp(dt, time_step_min)
        return dt.clamp(min=mixer.time_step_min)
    lo, hi = mixer.time_step_limit if mixer.time_step_limit is not None else (0.0, float("inf"))
    return dt.clamp(lo, hi)


def _install_observer(mixer) -> None:
    mixer.dasc_observe_decay = lambda *args, g=None, **kwargs: None

    def hook(_module, _inputs, output):
        a = -torch.exp(mixer.A_log.float())
        mixer.dasc_observe_decay(g=_observed_step(mixer, output) * a)

    mixer.in_proj.register_forward_hook(hook)


def mamba2_mixers(model) -> tuple[dict, int, int, tuple[str, ...], int]:
    """The Mamba2 mixers of a transformers model, each with the decay observer installed.

    Returns:
        ``({layer id: mixer}, H, 1, KERNEL_ATTRS, chunk)``: heads per layer, one unit per head, the attribute
        the horizon recorder wraps, and the largest chunk one call may take (the mixers' ``chunk_size``), the
        values :func:`~dasc_compile.eval.models.load_eval_model` builds its ``EvalModel`` from.
    """
    mixers = {}
    for mod in model.modules():
        if all(hasattr(mod, a) for a in ("A_log", "dt_bias", "in_proj", "torch_forward", "layer_idx", "num_heads")):
            _install_observer(mod)
            mixers[int(mod.layer_idx)] = mod
    heads = next(iter(mixers.values())).num_heads if mixers else 0
    chunk = min((int(getattr(m, "chunk_size", 1) or 1) for m in mixers.values()), default=1)
    return mixers, heads, 1, KERNEL_ATTRS, chunk
