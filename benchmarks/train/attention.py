"""The softmax-attention layers of the reference hybrids: which modules and parameters they are (for their own
learning rate, benchmarks/train/optim.py) and how spread out their attention is (the entropy logged with
``--log-attn-entropy``).

Which modules, by transformers class (Qwen3-Next's and Nemotron-H's the same in transformers 5.12 and 5.17;
Kimi-Linear's from 5.17, its first release; the recurrent layers'
classes are others, so matching the class never picks a KDA, GDN or Mamba2 layer):

- GDN (Qwen3-Next): ``Qwen3NextAttention``, ``model.layers.{i}.self_attn`` of the ``full_attention`` layers
  (the GDN layers are ``model.layers.{i}.linear_attn``); params ``q_proj`` (queries and output gate),
  ``k_proj``, ``v_proj``, ``o_proj``, ``q_norm``, ``k_norm``;
- KDA (Kimi-Linear): ``KimiLinearAttention`` (MLA), ``model.layers.{i}.self_attn`` of the ``full_attention``
  layers. The KDA layers are ``self_attn`` too (``KimiLinearDeltaAttention``): the name alone does not tell
  them apart. Params ``q_proj``, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``;
- Mamba2 (Nemotron-H): ``NemotronHAttention``, ``model.layers.{i}.mixer`` of the attention blocks (checkpoint
  names ``backbone.layers.{i}.mixer``); params ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``.

Entropy (:func:`entropy_fields`): after each logged interval, one no-grad forward of one row of the step's batch
(its first recall row, else row 0) through the training model, in training mode and under the training's
autocast, with the attention function the model uses (``config._attn_implementation``, sdpa) wrapped so that
it also computes, from the query and key it is given, the probabilities of the row (``H x T x T`` fp32) and
their entropy. Cost (estimated, not yet timed on the H200): one forward of 1 row where a training step is
forward + backward of B rows, about 1/(3B) of a step per logged interval, ~0.1 % of the training time at B 16
and --log-every 25; plus 3-4 ``H x T x T`` fp32 buffers while a layer is measured (logits, mask, probabilities, entropy terms: ~0.3-0.4 GB at H 4, T 2560). The training forward is not touched (nothing in it is
recorded), the wrapper returns what the wrapped function returns (for a model set to "eager", which has no shared function, it computes causal attention itself: :func:`_eager`, the probe row has no padding), and no random numbers are drawn: the weights
and the token stream are the same with and without it.
"""

from __future__ import annotations

import contextlib
import math

import torch

ATTENTION_CLASSES = ("Qwen3NextAttention", "KimiLinearAttention", "NemotronHAttention")


def attention_modules(model) -> list[tuple[str, torch.nn.Module]]:
    """(qualified name, module) of the softmax-attention layers of ``model``, in layer order."""
    return [(n, m) for n, m in model.named_modules() if type(m).__name__ in ATTENTION_CLASSES]


def attention_param_names(model) -> set[str]:
    """Names (as ``model.named_parameters`` gives them) of the attention layers' parameters."""
    return {f"{mn}.{pn}" for mn, m in attention_modules(model) for pn, _ in m.named_parameters()}


def entropy(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None = None,
            scaling: float | None = None, is_causal: bool = True) -> tuple[float, float]:
    """Mean entropy of the attention probabilities of one row, and what uniform attention would give.

    Args:
        query: ``[H, T, d]`` (any float dtype; computed in fp32).
        key: ``[Hkv, S, d]``, Hkv dividing H (grouped-query heads: key head j serves query heads j*H/Hkv...).
        attention_mask: None (``is_causal``: the T queries are the last T of the S positions; else every key),
            or ``[T, S]`` / ``[1 or H, T, S]``, bool (True: attended) or float (added to the logits).
        scaling: logit scale (None: ``d ** -0.5``, as sdpa).

    Returns:
        (entropy in nats, mean over heads and queries; mean over queries of ``log(number of keys attended)``,
        the entropy of uniform attention, the largest possible), both floats.
    """
    H, T, d = query.shape
    k = key.float().repeat_interleave(H // key.shape[0], dim=0)
    logits = torch.einsum("htd,hsd->hts", query.float(), k) * (d ** -0.5 if scaling is None else scaling)
    S = k.shape[1]
    if attention_mask is None:
        keep = _causal(T, S, logits.device) if is_causal else torch.ones(T, S, dtype=torch.bool, device=logits.device)
        keep = keep.expand(H, T, S)
    else:
        m = attention_mask[..., :S].reshape(-1, T, S).expand(H, T, S)
        if m.dtype == torch.bool:
            keep = m
        else:                                     # additive: masked where it is -inf or near the dtype's minimum
            keep = m > torch.finfo(m.dtype).min / 2
            logits = logits + m.float()
    logits = logits.masked_fill(~keep, float("-inf"))
    p = torch.softmax(logits, dim=-1)
    ent = torch.special.entr(p).sum(dim=-1)                              # [H, T]; entr(0) = 0
    visible = keep.sum(dim=-1).clamp_min(1).float()
    return float(ent.mean()), float(visible.log().mean())


def _causal(T: int, S: int, device) -> torch.Tensor:
    """``[T, S]`` bool: query t (the last T of S positions) attends keys up to its own position."""
    return torch.arange(S, device=device)[None, :] <= torch.arange(S - T, S, device=device)[:, None]


@contextlib.contextmanager
def _measuring(impl: str, sink: dict):
    """Within: the attention function ``impl`` of transformers' ``ALL_ATTENTION_FUNCTIONS`` (its instance-local
    entry, removed or restored after) also puts ``{layer_idx: (entropy, uniform)}`` of batch row 0 into ``sink``."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as F

    inner = F[impl] if impl in F else None                       # "eager": each modeling file's own function
    had, old = impl in F._local_mapping, F._local_mapping.get(impl)

    def wrapped(module, query, key, value, attention_mask, scaling=None, **kw):
        with torch.no_grad():
            mask = attention_mask[0] if isinstance(attention_mask, torch.Tensor) else None
            sink[module.layer_idx] = entropy(query[0], key[0], mask, scaling, getattr(module, "is_causal", True))
        if inner is not None:
            return inner(module, query, key, value, attention_mask, scaling=scaling, **kw)
        return _eager(query, key, value, scaling)

    F[impl] = wrapped
    try:
        yield sink
    finally:
        if had:
            F._local_mapping[impl] = old
        else:
            del F[impl]


def _eager(query, key, value, scaling):
    """Causal softmax attention (no padding: the probe's one row) of query ``[b, H, T, d]``, key / value
    ``[b, Hkv, S, d or dv]``: (output ``[b, T, H, dv]``,
    probabilities ``[b, H, T, S]`` fp32), as transformers' attention functions return them."""
    H, T = query.shape[1], query.shape[2]
    k = key.repeat_interleave(H // key.shape[1], dim=1)
    v = value.repeat_interleave(H // value.shape[1], dim=1)
    logits = query.float() @ k.float().transpose(-1, -2) * (query.shape[-1] ** -0.5 if scaling is None else scaling)
    p = torch.softmax(logits.masked_fill(~_causal(T, k.shape[2], query.device), float("-inf")), dim=-1)
    return (p @ v.float()).to(value.dtype).transpose(1, 2).contiguous(), p


def probe(model, ids: torch.Tensor, dev: torch.device, cuda: bool) -> dict[int, tuple[float, float]]:
    """``{layer_idx: (entropy, uniform)}`` of every attention layer on the token ids ``ids`` ``[T]`` (int64), from
    one no-grad forward (module docstring)."""
    sink: dict[int, tuple[float, float]] = {}
    impl = model.config._attn_implementation or "eager"
    with _measuring(impl, sink), torch.no_grad(), \
            torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=cuda):
        model(input_ids=ids[None].to(dev), use_cache=False)
    return sink


def entropy_fields(model, xb: torch.Tensor, kind: torch.Tensor, dev: torch.device, cuda: bool) -> dict:
    """The log fields of one interval: ``attn_entropy`` (mean over the attention layers, nats),
    ``attn_entropy_uniform`` (the same for uniform attention: the ceiling), ``attn_entropy_layers``
    (``{layer index: entropy}``) and ``attn_entropy_row`` (the kind of the row measured).

    Args:
        xb: the step's token ids ``[B, T + 1]`` int64 (the row's first T are fed); kind: its row kinds ``[B]``
            int64 (data.KINDS; the first non-text row is measured, else row 0).
    """
    from benchmarks.train.data import KINDS, TEXT

    rows = (kind != TEXT).nonzero().flatten().tolist()
    r = rows[0] if rows else 0
    got = probe(model, xb[r, :-1], dev, cuda)
    if not got:
        return {"attn_entropy": None}
    ent = [got[i][0] for i in sorted(got)]
    return {"attn_entropy": sum(ent) / len(ent), "attn_entropy_uniform": sum(got[i][1] for i in got) / len(got),
            "attn_entropy_layers": {str(i): round(got[i][0], 4) for i in sorted(got)},
            "attn_entropy_row": KINDS[int(kind[r])]}


def uniform_causal(T: int) -> float:
    """Mean over T causal queries of log(keys visible): the entropy of uniform causal attention."""
    return sum(math.log(i + 1) for i in range(T)) / T
