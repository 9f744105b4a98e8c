"""Architecture detection: which layers are recurrent, their decay family, tensor names and state shapes.

An :class:`~dasc_compile.archspec.ArchSpec` (re-exported here with :func:`text_config`) is built from
config.json alone by the family module registered for its ``model_type`` (:func:`arch_from_config`),
then cross-checked against the tensor names the checkpoint actually holds (:func:`check_against_tensors`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from dasc_compile.archspec import ArchSpec, text_config
from dasc_compile.config_fields import RootFields, validate_config
from dasc_compile.errors import DascInputError
from dasc_compile.families import MODEL_PARSERS, load_all

__all__ = ["ArchSpec", "arch_from_config", "check_against_tensors", "text_config"]


def arch_from_config(config: dict, source: str = "config.json", family_override: str | None = None) -> ArchSpec:
    """Parse a model config into an :class:`ArchSpec`.

    Args:
        config: the parsed config.json.
        source: file name used in error messages.
        family_override: policy ``family``: must be the config's own family (a check, never a change:
            SGLang serves the decay the config describes).
    Raises:
        DascInputError: unknown ``model_type``, missing or invalid fields, no layer kinds, or a
            ``family_override`` other than the config's family.
    """
    load_all()  # each family module registers the model types it parses

    validate_config(RootFields, config, source)   # model_type a string, architectures a list of names, ...
    model_type = config.get("model_type")
    if model_type not in MODEL_PARSERS:
        raise DascInputError(
            f"{source}: model_type {model_type!r} is not supported; supported: {sorted(MODEL_PARSERS)}")
    spec = MODEL_PARSERS[model_type](config, source)
    if family_override is not None and family_override != spec.family:
        # the served model computes its decay as its config says, so a plan of another family would
        # keep the wrong units; only the config can change the family
        hint = ""
        if {family_override, spec.family} == {"kda", "kda_safe_gate"}:
            hint = ("; a Kimi-K3-style safe gate is declared in config.json's linear_attn_config "
                    "(safe_gate: true or gate_lower_bound)" if family_override == "kda_safe_gate" else
                    "; this config declares the safe gate (safe_gate / gate_lower_bound)")
        raise DascInputError(
            f"{source}: family {family_override!r} (--family or the policy field 'family') does not fit "
            f"model_type {model_type!r}, whose config makes it {spec.family!r}{hint}; drop --family or give "
            f"{spec.family!r}")
    return spec


def check_against_tensors(spec: ArchSpec, tensor_names: Iterable[str], source: str) -> None:
    """Fail when the config's layer kinds disagree with the recurrent tensors the checkpoint holds.

    Raises:
        DascInputError: a recurrent layer's A_log / dt_bias is missing, or a layer the config calls
            full attention carries recurrent decay tensors.
    """
    names = set(tensor_names)
    for a, d in zip(spec.a_log_names, spec.dt_bias_names):
        for n in (a, d):
            if n not in names:
                raise DascInputError(
                    f"{source}: tensor '{n}' is missing, but the config ({spec.layer_kind_source}) makes its layer recurrent")
    expected = set(spec.a_log_names)
    for n in names:
        if n.endswith(".A_log") and spec.recurrent_tensor_marker in n and n not in expected:
            raise DascInputError(
                f"{source}: tensor '{n}' is a recurrent decay tensor, but the config ({spec.layer_kind_source}) "
                f"makes that layer full attention")
