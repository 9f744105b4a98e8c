"""Mamba2 hybrids (Nemotron-H, Granite-4.0-H, Falcon-H1): one unit per head (beyond the paper).

A Mamba2 head h decays its whole ``[head_dim, d_state]`` state by one scalar per token,
``exp(dt_t * A_h)`` with ``A_h = -exp(A_log[h])`` and ``dt_t = softplus(x_t W_dt + dt_bias[h])``, so the
unit is the head, as for GDN. The static log-decay at a representative gate input a_s (Eq. 2 with the
step clamp the server applies) and the horizon (Eq. 3) are::

    g_s(h) = -exp(A_log[h]) * clamp(softplus(a_s + dt_bias[h]), dt_lo, dt_hi),   H_s(h) = ln(eps) / g_s(h)

**Which dt clamp.** dasc follows SGLang, the server whose state it compresses: its ``MambaMixer2``
(``layers/attention/mamba/mamba.py``) passes ``dt_limit=(0.0, inf)`` to the chunked scan and no limit to
the one-token update, whatever the config says, so ``(dt_lo, dt_hi) = (0, inf)`` and the clamp changes
nothing (:data:`SGLANG_DT_LIMIT`). transformers' PyTorch path of Nemotron-H instead clamps ``dt`` from below
at ``time_step_min`` (``modeling_nemotron_h.py``, ``torch.clamp(dt, self.time_step_min)``; its Granite /
Falcon paths clamp to ``time_step_limit``): a head whose step stays below ``time_step_min`` decays faster
there than in SGLang. The horizon describes the state that is served, hence SGLang's limit.
``time_step_limit`` / ``time_step_min`` / ``time_step_floor`` are still checked (numbers, ordered) and
the floor and bounds feed the Nemotron-H initialisation draw (:func:`reference_init`).

**Default a_s = 0.** Mamba2 builds ``dt_bias = softplus^-1(dt_0)`` with ``dt_0`` log-uniform in
``[time_step_min, time_step_max]`` (mamba_ssm, transformers' Nemotron-H ``_init_weights``) and a
zero-mean ``W_dt`` projection, so at a_s = 0 the static step ``softplus(dt_bias)`` is the step each head
was designed around. GDN/KDA's -0.3 came from the paper's calibration of those gates, which says nothing
about Mamba2; ``dasc eval --horizons`` checks the ranking against the observed ``dt_t * A_h`` (Eq. 4).

Configs (strict; one error line naming the file and field):

* ``nemotron_h`` (transformers ``NemotronHConfig``, SGLang ``configs/nemotron_h.py``): layer kinds from
  ``layers_block_type`` (alias ``layer_types``) or ``hybrid_override_pattern`` (M Mamba2, * attention,
  - MLP, E MoE); ``mamba_num_heads``, ``mamba_head_dim``, ``ssm_state_size``, ``n_groups``
  (alias ``mamba_n_groups``), ``conv_kernel`` (alias ``mamba_d_conv``). Tensors
  ``backbone.layers.{i}.mixer.{A_log,dt_bias} [H]`` (transformers renames ``backbone.`` to ``model.`` on load).
* ``granitemoehybrid`` (Granite-4.0-H): ``layer_types`` ('mamba' | 'attention', required: transformers
  and SGLang default a missing list differently), ``mamba_n_heads``, ``mamba_d_head`` (or "auto"),
  ``mamba_d_state``, ``mamba_n_groups``, ``mamba_d_conv``; ``hidden_size * mamba_expand`` must equal
  ``mamba_n_heads * mamba_d_head``. Tensors ``model.layers.{i}.mamba.{A_log,dt_bias} [H]``.
* ``falcon_h1``: every layer runs attention and Mamba2 side by side (all layers recurrent); as Granite
  plus ``mamba_d_ssm`` (the SSM width, else ``mamba_expand * hidden_size``) and ``ssm_multipliers`` (five
  muP factors on the in_proj blocks z, x, B, C, dt; the dt factor scales ``x_t W_dt`` before ``dt_bias``
  is added, so a_s stands for the scaled value and the static decay does not read them).

State (SGLang ``Mamba2StateShape``): temporal ``[H, head_dim, d_state]`` in the temporal dtype (FP32 by
default, ``mamba_ssm_dtype``), conv ``(H*head_dim + 2*n_groups*d_state, K-1)`` BF16, kept whole; the
unit kind ``mamba2_head`` is the ``[d_v, d_k] = [head_dim, d_state]`` head layout.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Optional, Union

import torch
from pydantic import Field, model_validator

from dasc_compile.archspec import ArchSpec
from dasc_compile.config_fields import ConfigFields, ConvKernel, HeadCount, HeadDim, LayerCount, validate_config
from dasc_compile.errors import DascInputError
from dasc_compile.families.base import DecayFamily, register_family, register_model_type

#: SGLang's step limit for Mamba2 (``MambaMixer2``: ``dt_limit=(0.0, float("inf"))``), tokens^-1.
SGLANG_DT_LIMIT = (0.0, math.inf)
#: Relative tolerance of the served ``A = -exp(A_log)`` (FP32 ``exp`` on the server's device: a few ulp).
A_RTOL = 2.0 ** -21
#: Relative tolerance of the served ``dt_bias`` (SGLang keeps it in the model dtype: BF16 rounds to 2^-9).
DT_BIAS_RTOL = 2.0 ** -8


def mamba2_gate(a_log: torch.Tensor, dt_bias: torch.Tensor, a_s: float, lower_bound: float) -> torch.Tensor:
    """g_s(h) = -exp(A_log[h]) * clamp(softplus(a_s + dt_bias[h]), 0, inf) (module docstring).

    Args:
        a_log / dt_bias: float64 ``[H]``. a_s: representative gate input. lower_bound: unused (safe gate only).
    Returns:
        float64 ``[H]``: log-decay per token of each head (< 0 unless softplus underflows to 0).
    """
    del lower_bound
    dt = torch.nn.functional.softplus(a_s + dt_bias).clamp(*SGLANG_DT_LIMIT)
    return -torch.exp(a_log) * dt


# ----------------------------------------------------------------------------- config fields

TimeStep = Annotated[float, Field(ge=0.0)]             # a step size (tokens^-1); inf allowed as an upper limit
Multiplier = Annotated[float, Field(allow_inf_nan=False)]
NEMOTRON_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
#: block names of ``layers_block_type``; MODELS.md reports transformers 5.24 writing the last two (not seen here)
NEMOTRON_BLOCKS = {"mamba": "mamba", "attention": "attention", "mlp": "mlp", "moe": "moe",
                   "linear_attention": "mamba", "full_attention": "attention"}
HeadDimOrAuto = Union[HeadDim, Literal["auto"]]


class _TimeStepFields(ConfigFields):
    time_step_limit: Optional[list[TimeStep]] = Field(default=None, min_length=2, max_length=2)
    time_step_min: Optional[TimeStep] = None
    time_step_max: Optional[TimeStep] = None
    time_step_floor: Optional[TimeStep] = None

    @model_validator(mode="after")
    def _ordered(self):
        lim = self.time_step_limit
        if lim is not None and lim[0] > lim[1]:
            raise ValueError(f"field 'time_step_limit' must be [low, high] with low <= high, got {lim}")
        lo, hi = self.time_step_min, self.time_step_max
        if lo is not None and hi is not None and not 0 < lo <= hi < math.inf:
            raise ValueError(f"fields 'time_step_min' / 'time_step_max' must satisfy 0 < min <= max < inf, "
                             f"got {lo} / {hi}")
        return self


class NemotronHFields(_TimeStepFields):
    """The ``nemotron_h`` config fields :func:`parse_nemotron_h` reads (aliases resolved first)."""

    num_hidden_layers: Optional[LayerCount] = None
    layers_block_type: Optional[list[str]] = Field(default=None, min_length=1, max_length=4096)
    hybrid_override_pattern: Optional[str] = Field(default=None, min_length=1, max_length=4096)
    mamba_num_heads: HeadCount
    mamba_head_dim: HeadDim
    ssm_state_size: HeadDim
    n_groups: HeadCount
    conv_kernel: ConvKernel


class _MambaFields(_TimeStepFields):
    num_hidden_layers: LayerCount
    mamba_n_heads: HeadCount
    mamba_d_head: HeadDimOrAuto
    mamba_d_state: HeadDim
    mamba_n_groups: HeadCount
    mamba_d_conv: ConvKernel
    hidden_size: Optional[Annotated[int, Field(ge=1, le=2**20)]] = None
    mamba_expand: Optional[Annotated[int, Field(ge=1, le=64)]] = None


class GraniteHybridFields(_MambaFields):
    """The ``granitemoehybrid`` fields :func:`parse_granite_falcon` reads."""

    layer_types: list[Literal["mamba", "attention"]] = Field(min_length=1, max_length=4096)


class FalconH1Fields(_MambaFields):
    """The ``falcon_h1`` fields :func:`parse_granite_falcon` reads."""

    mamba_d_ssm: Optional[Annotated[int, Field(ge=1, le=2**20)]] = None
    ssm_multipliers: Optional[list[Multiplier]] = Field(default=None, min_length=5, max_length=5)


def _decode_special_floats(v):
    """transformers 5 writes inf as ``{"__float__": "Infinity"}`` (``PretrainedConfig._encode_special_floats``)."""
    if isinstance(v, dict) and set(v) == {"__float__"}:
        return {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}.get(v["__float__"], v)
    if isinstance(v, list):
        return [_decode_special_floats(x) for x in v]
    return v


def _resolved(config: dict, aliases: dict[str, str], source: str) -> dict:
    """``config`` with the time-step floats decoded and each alias (transformers' ``__post_init__``)
    moved to its canonical name; a field given under both names is refused."""
    cfg = dict(config)
    for key in ("time_step_limit", "time_step_min", "time_step_max", "time_step_floor"):
        if key in cfg:
            cfg[key] = _decode_special_floats(cfg[key])
    for alias, name in aliases.items():
        if alias in cfg:
            if name in cfg and cfg[name] != cfg[alias]:
                raise DascInputError(f"{source}: config fields '{name}' ({cfg[name]!r}) and '{alias}' "
                                     f"({cfg[alias]!r}) disagree; expected one of them")
            cfg[name] = cfg.pop(alias)
    return cfg


# ----------------------------------------------------------------------------- parsers

def _spec(config: dict, source: str, *, num_layers: int, rec: list[int], attn: list[int], h: int, p: int, n: int, g: int,
          k: int, prefix: str, mixer: str, kind_src: str, heads_field: str) -> ArchSpec:
    if h % g:
        raise DascInputError(f"{source}: config field '{heads_field}' ({h}) must be a multiple of the B/C groups ({g}, n_groups); "
                             f"each group serves H / n_groups heads")
    return ArchSpec(
        model_type=config["model_type"], architectures=tuple(config.get("architectures") or ()),
        num_hidden_layers=num_layers, recurrent_layer_ids=tuple(rec), full_attention_layer_ids=tuple(attn),
        family="mamba2", num_value_heads=h, num_key_heads=h, head_k_dim=n, head_v_dim=p,
        unit_kind=MAMBA2.unit_kind, conv_kernel=k, conv_dim=h * p + 2 * g * n, conv_groups=g,
        a_log_names=tuple(f"{prefix}{i}.{mixer}.A_log" for i in rec),
        dt_bias_names=tuple(f"{prefix}{i}.{mixer}.dt_bias" for i in rec),
        a_log_shape=(h,), dt_bias_shape=(h,), safe_gate_lower_bound=None, layer_kind_source=kind_src,
        recurrent_tensor_marker=f".{mixer}.", head_fields=(heads_field, heads_field))


def _nemotron_kinds(f: NemotronHFields, source: str) -> tuple[list[str], str]:
    pattern = None
    if f.hybrid_override_pattern is not None:
        bad = sorted(set(f.hybrid_override_pattern) - set(NEMOTRON_PATTERN))
        if bad:
            raise DascInputError(f"{source}: config field 'hybrid_override_pattern' has unknown character(s) {bad}; "
                                 f"expected M (Mamba2), * (attention), - (MLP) or E (MoE)")
        pattern = [NEMOTRON_PATTERN[c] for c in f.hybrid_override_pattern]
    blocks = None
    if f.layers_block_type is not None:
        bad = sorted(set(f.layers_block_type) - set(NEMOTRON_BLOCKS))
        if bad:
            raise DascInputError(f"{source}: config field 'layers_block_type' has unknown kind(s) {bad}; expected "
                                 f"one of {sorted(NEMOTRON_BLOCKS)}")
        blocks = [NEMOTRON_BLOCKS[b] for b in f.layers_block_type]
    if blocks is not None and pattern is not None and blocks != pattern:
        raise DascInputError(f"{source}: config fields 'layers_block_type' and 'hybrid_override_pattern' give "
                             f"different layer kinds; expected one of them, or both equal")
    kinds, src = (blocks, "layers_block_type") if blocks is not None else (pattern, "hybrid_override_pattern")
    if kinds is None:
        raise DascInputError(f"{source}: config has no layer kinds: expected 'layers_block_type' or "
                             f"'hybrid_override_pattern'")
    if f.num_hidden_layers is not None and f.num_hidden_layers != len(kinds):
        raise DascInputError(f"{source}: config field '{src}' lists {len(kinds)} layers but 'num_hidden_layers' "
                             f"is {f.num_hidden_layers}; expected equal counts")
    return kinds, src


@register_model_type("nemotron_h")
def parse_nemotron_h(config: dict, source: str) -> ArchSpec:
    """Nemotron-H (``NemotronHForCausalLM``): Mamba2 layers where the layer kinds say 'M' / 'mamba'."""
    cfg = _resolved(config, {"mamba_n_groups": "n_groups", "mamba_d_conv": "conv_kernel",
                             "layer_types": "layers_block_type"}, source)
    f = validate_config(NemotronHFields, cfg, source)
    kinds, src = _nemotron_kinds(f, source)
    return _spec(cfg, source, num_layers=len(kinds), rec=[i for i, t in enumerate(kinds) if t == "mamba"],
                 attn=[i for i, t in enumerate(kinds) if t == "attention"], h=f.mamba_num_heads, p=f.mamba_head_dim,
                 n=f.ssm_state_size, g=f.n_groups, k=f.conv_kernel, prefix="backbone.layers.", mixer="mixer",
                 kind_src=src, heads_field="mamba_num_heads")


@register_model_type("granitemoehybrid", "falcon_h1")
def parse_granite_falcon(config: dict, source: str) -> ArchSpec:
    """Granite-4.0-H (``layer_types``) and Falcon-H1 (Mamba2 beside attention in every layer)."""
    falcon = config["model_type"] == "falcon_h1"
    cfg = _resolved(config, {}, source)
    f = validate_config(FalconH1Fields if falcon else GraniteHybridFields, cfg, source)
    h = f.mamba_n_heads
    width = f.mamba_d_ssm if falcon and f.mamba_d_ssm is not None else (
        f.mamba_expand * f.hidden_size if f.mamba_expand and f.hidden_size else None)
    width_src = "mamba_d_ssm" if falcon and f.mamba_d_ssm is not None else "mamba_expand * hidden_size"
    p = f.mamba_d_head
    if p == "auto":
        if width is None or width % h:
            raise DascInputError(f"{source}: config field 'mamba_d_head' is 'auto' but {width_src} "
                                 f"({width}) is not a multiple of mamba_n_heads ({h})")
        p = width // h
    if width is not None and p * h != width:
        raise DascInputError(f"{source}: mamba_n_heads * mamba_d_head = {h} * {p} must equal {width_src} = {width}")
    n = f.num_hidden_layers
    if falcon:
        rec, attn, src = list(range(n)), list(range(n)), "falcon_h1 (Mamba2 and attention in every layer)"
    else:
        if len(f.layer_types) != n:
            raise DascInputError(f"{source}: config field 'layer_types' must list {n} layer kinds (num_hidden_layers), "
                                 f"got {len(f.layer_types)}")
        rec = [i for i, t in enumerate(f.layer_types) if t == "mamba"]
        attn, src = [i for i, t in enumerate(f.layer_types) if t == "attention"], "layer_types"
    return _spec(cfg, source, num_layers=n, rec=rec, attn=attn, h=h, p=p, n=f.mamba_d_state, g=f.mamba_n_groups,
                 k=f.mamba_d_conv, prefix="model.layers.", mixer="mamba", kind_src=src, heads_field="mamba_n_heads")


# ----------------------------------------------------------------------------- served form and initialisation

def served_decay(tensors: list[tuple[str, torch.Tensor]]):
    """The decay tensors as SGLang serves them (the plan's ``Fingerprint.served``).

    SGLang's ``MambaMixer2`` loads ``A_log`` into ``A = -exp(A_log.float())`` FP32 and keeps ``dt_bias`` in
    the model dtype; its model files rename ``A_log`` to ``A`` and ``backbone.`` to ``model.``
    (``models/nemotron_h.py``, ``granitemoehybrid.py``, ``falcon_h1.py``).

    Args:
        tensors: ``[(A_log name, [H]), (dt_bias name, [H]), ...]`` as read from the checkpoint.
    Returns:
        :class:`~dasc_compile.schema.ServedDecay` with float64 values and the tolerances
        :data:`A_RTOL` / :data:`DT_BIAS_RTOL`.
    """
    from dasc_compile.schema import ServedDecay

    names, values, rtol = [], [], []
    for name, t in tensors:
        served = name.replace("backbone.", "model.", 1) if name.startswith("backbone.") else name
        x = t.detach().reshape(-1).to(torch.float64)
        if name.endswith(".A_log"):
            names.append(served[: -len("A_log")] + "A")
            values.append((-torch.exp(x)).tolist())
            rtol.append(A_RTOL)
        else:
            names.append(served)
            values.append(x.tolist())
            rtol.append(DT_BIAS_RTOL)
    return ServedDecay(names=names, values=values, rtol=rtol)


def reference_init(spec: ArchSpec, config: dict, gen: torch.Generator) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], str]:
    """Each model's own initialisation (transformers 5.12.1 ``_init_weights``), per recurrent layer.

    * ``nemotron_h``: ``A_log[h] = log(h + 1)``; ``dt = exp(U(ln time_step_min, ln time_step_max))`` clamped
      ``>= time_step_floor`` (config values, else the class defaults 0.001 / 0.1 / 1e-4),
      ``dt_bias = dt + log(-expm1(-dt))`` (inverse softplus).
    * ``granitemoehybrid``, ``falcon_h1``: ``A_log[h] = log(h + 1)``, ``dt_bias = 1``.

    Returns:
        ``([(A_log [H] float64, dt_bias [H] float64), ...], scheme)``; not trained values.
    """
    h = spec.num_value_heads
    a = torch.log(torch.arange(1, h + 1, dtype=torch.float64))
    if spec.model_type != "nemotron_h":
        return [(a.clone(), torch.ones(h, dtype=torch.float64)) for _ in spec.recurrent_layer_ids], (
            f"{spec.model_type} (transformers _init_weights): A_log = log(1..H), dt_bias = 1")
    cfg = _resolved(config, {"mamba_dt_min": "time_step_min", "mamba_dt_max": "time_step_max",
                             "mamba_dt_init_floor": "time_step_floor"}, "config")
    lo, hi = float(cfg.get("time_step_min") or 1e-3), float(cfg.get("time_step_max") or 1e-1)
    floor = float(cfg.get("time_step_floor") or 1e-4)
    out = []
    for _ in spec.recurrent_layer_ids:
        dt = torch.exp(torch.rand(h, generator=gen, dtype=torch.float64) * (math.log(hi) - math.log(lo))
                       + math.log(lo)).clamp(min=floor)
        out.append((a.clone(), dt + torch.log(-torch.expm1(-dt))))
    return out, (f"nemotron_h (transformers _init_weights): A_log = log(1..H); dt = exp(U(ln {lo:g}, ln {hi:g})) "
                 f"clamped >= {floor:g}, dt_bias = dt + log(-expm1(-dt))")


MAMBA2 = register_family(DecayFamily(name="mamba2", unit_kind="mamba2_head", default_a_s=0.0,
                                     static_log_decay=mamba2_gate, served_decay=served_decay,
                                     reference_init=reference_init))

__all__ = ["MAMBA2", "SGLANG_DT_LIMIT", "mamba2_gate", "parse_granite_falcon", "parse_nemotron_h",
           "reference_init", "served_decay"]
