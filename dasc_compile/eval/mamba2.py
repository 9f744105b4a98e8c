"""``dasc eval`` on Mamba2 hybrids through transformers' own classes (Nemotron-H, Granite-4.0-H, Falcon-H1).

The mixers are found by their attributes (:func:`is_mamba2_mixer`), pinned to transformers' PyTorch path
and counted like GDN's (one unit per head) by :func:`dasc_compile.eval.models.recurrent_mixers`. The
recurrent state checkpoint is ``cache.layers[i]``'s temporal state ``[B, H, head_dim, d_state]`` (read
through :mod:`dasc_compile.eval.hf_compat`), one unit per head, so the arms of
:mod:`dasc_compile.eval.arms` apply unchanged.

transformers 5.12's PyTorch path (``torch_forward``) runs a multi-token call from a zero state and
treats a cache with a previous state as one decoding token; and Nemotron-H's chunked scan there passes
states between chunks wrongly (``modeling_nemotron_h.py`` sums ``decay_chunk * states`` over the target
chunk, ``.sum(dim=2)``, where Bamba / Granite / Falcon transpose first and sum over the source chunk): on
the tiny test model its logits leave its own one-token recurrence by up to 0.76 after the first
``chunk_size`` tokens. There ``dasc eval`` runs at most one chunk from a fresh cache and steps every
other token through the one-token recurrence (``EvalModel.max_chunk``, also for a batch of arm caches),
which is exact for all three models; later releases continue a cached state in the chunked scan, and
``max_chunk`` is None (:func:`~dasc_compile.eval.hf_compat.mamba2_max_chunk`).

Observed log-decay (Eq. 4, ``dasc eval --horizons``): a forward hook on each mixer's ``in_proj`` takes the
``dt`` channels (the last H of the projection; Falcon-H1 first scales the projection by its muP vector),
forms ``dt = softplus(dt + dt_bias)`` clamped as the call's path clamps it
(:func:`~dasc_compile.eval.hf_compat.mamba2_dt_limit`) and reports ``g = dt * A``, ``A = -exp(A_log)``,
``[B, T, H]`` through ``mixer.dasc_observe_decay(g=...)``, the slot that
:class:`~dasc_compile.eval.horizons.DecayRecorder` wraps (:func:`~dasc_compile.eval.hf_compat.kernel_slots`).
So the horizons measured are those of transformers' PyTorch path, whose Nemotron-H clamp differs from
SGLang's (0, inf) (:mod:`dasc_compile.families.mamba2`): for a head whose step stays above
``time_step_min`` they agree.
"""

from __future__ import annotations

import torch

from dasc_compile.eval.hf_compat import OBSERVER, mamba2_dt_limit, mamba2_max_chunk, mixer_cache

__all__ = ["is_mamba2_mixer", "observe_mamba2"]

_ATTRS = ("A_log", "dt_bias", "in_proj", "conv1d", "layer_idx", "num_heads", "chunk_size")


def is_mamba2_mixer(mod) -> bool:
    """A transformers Mamba2 mixer (``A_log [H]``, ``dt_bias``, ``in_proj``, ``conv1d``, ``chunk_size``)."""
    return all(hasattr(mod, a) for a in _ATTRS)


def _observed_step(mixer, projected: torch.Tensor, limit: tuple[float, float]) -> torch.Tensor:
    """``dt`` [B, T, H] as the mixer forms it from the in_proj output."""
    if hasattr(mixer, "mup_vector"):                                   # Falcon-H1's muP multipliers
        projected = projected * mixer.mup_vector
    dt = torch.nn.functional.softplus(projected[..., -mixer.num_heads:].float() + mixer.dt_bias.float())
    return dt.clamp(*limit)


def _install_observer(mixer) -> None:
    setattr(mixer, OBSERVER, lambda *args, g=None, **kwargs: None)
    call = {}

    def before(_module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        call["limit"] = mamba2_dt_limit(mixer, mixer_cache(args, kwargs), hidden.shape[1])

    def hook(_module, _inputs, output):
        a = -torch.exp(mixer.A_log.float())
        getattr(mixer, OBSERVER)(g=_observed_step(mixer, output, call["limit"]) * a)

    mixer.register_forward_pre_hook(before, with_kwargs=True)
    mixer.in_proj.register_forward_hook(hook)


def observe_mamba2(mixers: dict) -> int | None:
    """Install the decay observer on each Mamba2 mixer among ``mixers`` (layer id -> recurrent module; other
    mixers are left alone, so a model of any family may be passed); returns the largest chunk one call may
    take from a fresh cache (``EvalModel.max_chunk``: the smallest ``chunk_size`` on 5.12, else None; None
    when there is no Mamba2 mixer)."""
    mamba2 = [m for m in mixers.values() if is_mamba2_mixer(m)]
    for mixer in mamba2:
        _install_observer(mixer)
    chunks = [c for c in (mamba2_max_chunk(m) for m in mamba2) if c is not None]
    return min(chunks) if chunks else None
