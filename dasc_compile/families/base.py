"""Decay families and the model-type registry.

A *decay family* knows how one recurrent layer's decay tensors turn into static log-decays
g_s(u) per state unit (paper Eq. 2), and names its unit kind (a key of
:data:`dasc_compile.schema.units.UNIT_KINDS`, which gives every shape and byte count of the unit). A
*model parser* turns a model's config.json into an :class:`~dasc_compile.archspec.ArchSpec`. Adding an
architecture (e.g. Mamba2) means one new module in this package that calls :func:`register_family`
and :func:`register_model_type` (and lists itself in ``FAMILY_MODULES``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from dasc_compile.archspec import ArchSpec
from dasc_compile.schema.units import lookup_unit_kind


@dataclass(frozen=True, kw_only=True)
class DecayFamily:
    """One decay family (a row of DESIGN.md's family table).

    Attributes:
        name: ``gdn`` | ``kda`` | ``kda_safe_gate`` | ``mamba2``.
        unit_kind: a key of :data:`~dasc_compile.schema.units.UNIT_KINDS`: ``gdn_head`` (unit = a
            value head's whole ``[d_v, d_k]`` state), ``kda_column`` (unit = column ``S[h, :, k]``,
            ``[d_v]``) or ``mamba2_head`` (a Mamba2 head's ``[head_dim, d_state]``); checked when the
            family is created.
        default_a_s: representative gate input a_s (Eq. 2 text: -0.3 softplus, 0.8 safe gate; Mamba2 0).
        static_log_decay: ``f(a_log, dt_bias, a_s, lower_bound) -> g_s`` where ``a_log`` is
            float64 ``[H]``, ``dt_bias`` float64 ``[H * units_per_head]`` and the result is
            float64 ``[H * units_per_head]`` (natural-log decay per token, normally < 0).
        served_decay: for a family whose server transforms the decay tensors at load (Mamba2:
            ``A = -exp(A_log)``), ``f([(name, tensor), ...]) -> ServedDecay`` recorded in the plan's
            fingerprint so the runtime can compare what it serves; None when the server keeps them as stored.
        reference_init: ``f(spec, config, generator) -> ([(A_log, dt_bias), ...], scheme)``, float64 draws
            of the model's own initialisation per recurrent layer (``dasc_compile.refckpt``); None for the
            families whose draws ``refckpt`` still holds itself (GDN, KDA).
    """

    name: str
    unit_kind: str
    default_a_s: float
    static_log_decay: Callable[[torch.Tensor, torch.Tensor, float, float], torch.Tensor]
    served_decay: Optional[Callable[[list], object]] = None
    reference_init: Optional[Callable[[ArchSpec, dict, torch.Generator], tuple[list, str]]] = None

    def __post_init__(self) -> None:
        lookup_unit_kind(self.unit_kind)   # raises DascInputError for a kind the schema does not know


FAMILIES: dict[str, DecayFamily] = {}
MODEL_PARSERS: dict[str, Callable[[dict, str], ArchSpec]] = {}


def register_family(family: DecayFamily) -> DecayFamily:
    """Add ``family`` to :data:`FAMILIES` under its name; returns it (for a module-level constant)."""
    FAMILIES[family.name] = family
    return family


def register_model_type(*model_types: str):
    """Decorator: ``parser(config: dict, source: str) -> ArchSpec`` handles these model types."""

    def deco(fn):
        for mt in model_types:
            MODEL_PARSERS[mt] = fn
        return fn

    return deco


def softplus_gate(a_log: torch.Tensor, dt_bias: torch.Tensor, a_s: float, lower_bound: float) -> torch.Tensor:
    """Eq. 2 (standard): g = -exp(A_log[h]) * softplus(a_s + d_u), per unit u = (h, k).

    Args:
        a_log: float64 ``[H]``.
        dt_bias: float64 ``[H * U]`` with U units per head (1 for GDN/Mamba2, d_k for KDA).
    Returns:
        float64 ``[H * U]`` log-decay per token.
    """
    del lower_bound
    per_head = dt_bias.numel() // a_log.numel()
    scale = torch.exp(a_log).repeat_interleave(per_head)
    return -scale * torch.nn.functional.softplus(a_s + dt_bias)


def safe_gate(a_log: torch.Tensor, dt_bias: torch.Tensor, a_s: float, lower_bound: float) -> torch.Tensor:
    """Eq. 2 (Kimi-K3 safe gate): g = l * sigmoid(exp(A_log[h]) * (a_s + d_u)), l < 0.

    Shapes as :func:`softplus_gate`; ``lower_bound`` is l (Kimi-K3: -5).
    """
    per_head = dt_bias.numel() // a_log.numel()
    scale = torch.exp(a_log).repeat_interleave(per_head)
    return lower_bound * torch.sigmoid(scale * (a_s + dt_bias))
