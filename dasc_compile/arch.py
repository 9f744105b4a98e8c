"""Architecture spec: which layers are recurrent, their decay family, tensor names and state shapes.

Built from config.json alone (:func:`arch_from_config`), then cross-checked against the tensor
names the checkpoint actually holds (:func:`check_against_tensors`). State shapes follow
SGLang 0.5.17 (``sglang/srt/configs/mamba_utils.py``: ``Mamba2StateShape`` for GDN,
``KimiLinearStateShape`` for KDA).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from dasc_compile.errors import DascInputError
from dasc_compile.families import base as _base


@dataclass(frozen=True, kw_only=True)
class ArchSpec:
    """Everything the compiler needs to know about a hybrid model, independent of weight values.

    Attributes:
        model_type / architectures / num_hidden_layers: from config.json.
        recurrent_layer_ids / full_attention_layer_ids: 0-indexed model layer ids.
        family: decay family name (see :mod:`dasc_compile.families.base`).
        num_value_heads: H_v (GDN, Mamba2) or H (KDA); num_key_heads: H_k (GDN), H (KDA).
        head_k_dim / head_v_dim: d_k / d_v of the temporal state ``[H_v, d_v, d_k]``.
        units_per_head: 1 for head units, d_k for KDA column units.
        conv_kernel: K; conv state keeps K-1 columns. conv_dim: conv channels at TP=1.
        conv_shard_blocks: sizes of the independently head-sharded conv channel blocks
            (e.g. [q, k, v]); each block is split evenly over TP ranks.
        a_log_names / dt_bias_names: decay tensor names, one per recurrent layer, in order.
        a_log_shape / dt_bias_shape: expected shapes of those tensors.
        safe_gate_lower_bound: l of the KDA safe gate when the config declares one, else None.
        layer_kind_source: which config field decided the layer kinds (for messages).
    """

    model_type: str
    architectures: tuple[str, ...]
    num_hidden_layers: int
    recurrent_layer_ids: tuple[int, ...]
    full_attention_layer_ids: tuple[int, ...]
    family: str
    num_value_heads: int
    num_key_heads: int
    head_k_dim: int
    head_v_dim: int
    units_per_head: int
    conv_kernel: int
    conv_dim: int
    conv_shard_blocks: tuple[int, ...]
    a_log_names: tuple[str, ...]
    dt_bias_names: tuple[str, ...]
    a_log_shape: tuple[int, ...]
    dt_bias_shape: tuple[int, ...]
    safe_gate_lower_bound: float | None
    layer_kind_source: str
    recurrent_tensor_marker: str            # substring that only recurrent layers' tensors carry

    @property
    def n_units_per_layer(self) -> int:
        return self.num_value_heads * self.units_per_head

    @property
    def unit_kind(self) -> str:
        return "gdn_head" if self.units_per_head == 1 else "kda_column"

    def temporal_shape(self, tp_size: int = 1) -> tuple[int, int, int]:
        """SGLang temporal state shape per layer and rank: ``[H_v / P, d_v, d_k]``."""
        return (self.num_value_heads // tp_size, self.head_v_dim, self.head_k_dim)

    def conv_numel(self, tp_size: int = 1) -> int:
        """Elements of one layer's conv state on one rank: (conv_dim / P) * (K - 1)."""
        return sum(b // tp_size for b in self.conv_shard_blocks) * (self.conv_kernel - 1)


def _layer_kinds(cfg: dict, num_layers: int, source: str, linear_names: Iterable[str]) -> tuple[list[int], str]:
    """Recurrent layer ids from ``layer_types`` (wins), else ``full_attention_interval``, else
    ``linear_attn_config.kda_layers`` (1-indexed), else ``hybrid_override_pattern``."""
    linear_names = set(linear_names)
    if cfg.get("layer_types") is not None:
        kinds = cfg["layer_types"]
        if not isinstance(kinds, list) or len(kinds) != num_layers:
            raise DascInputError(
                f"{source}: field 'layer_types' must list {num_layers} layer kinds, got "
                f"{len(kinds) if isinstance(kinds, list) else type(kinds).__name__}")
        unknown = sorted({k for k in kinds if k not in linear_names and k != "full_attention"})
        if unknown:
            raise DascInputError(
                f"{source}: field 'layer_types' has unknown kind(s) {unknown}; expected "
                f"'full_attention' or one of {sorted(linear_names)}")
        return [i for i, k in enumerate(kinds) if k in linear_names], "layer_types"
    if cfg.get("full_attention_interval") is not None:
        n = cfg["full_attention_interval"]
        if not isinstance(n, int) or n < 1:
            raise DascInputError(f"{source}: field 'full_attention_interval' must be a positive integer, got {n!r}")
        return [i for i in range(num_layers) if (i + 1) % n != 0], "full_attention_interval"
    lac = cfg.get("linear_attn_config")
    if isinstance(lac, dict) and lac.get("kda_layers") is not None:
        ids = lac["kda_layers"]
        if not all(isinstance(i, int) and 1 <= i <= num_layers for i in ids):
            raise DascInputError(
                f"{source}: field 'linear_attn_config.kda_layers' must hold 1-indexed layer numbers in "
                f"[1, {num_layers}], got {ids}")
        return sorted(i - 1 for i in ids), "linear_attn_config.kda_layers"
    if cfg.get("hybrid_override_pattern") is not None:
        pat = cfg["hybrid_override_pattern"]
        return [i for i, c in enumerate(pat) if c == "M"], "hybrid_override_pattern"
    raise DascInputError(
        f"{source}: config has no layer kinds: expected one of 'layer_types', 'full_attention_interval', "
        f"'linear_attn_config.kda_layers' or 'hybrid_override_pattern'")


def text_config(config: dict) -> dict:
    """The language-model part of a config: nested ``text_config`` (Qwen3.5) or the config itself."""
    tc = config.get("text_config")
    return tc if isinstance(tc, dict) else config


def require(cfg: dict, key: str, source: str, kind=int):
    if key not in cfg or cfg[key] is None:
        raise DascInputError(f"{source}: config field '{key}' is missing")
    val = cfg[key]
    if kind is int and (not isinstance(val, int) or isinstance(val, bool) or val <= 0):
        raise DascInputError(f"{source}: config field '{key}' must be a positive integer, got {val!r}")
    return val


def arch_from_config(config: dict, source: str = "config.json", family_override: str | None = None) -> ArchSpec:
    """Parse a model config into an :class:`ArchSpec`.

    Args:
        config: the parsed config.json.
        source: file name used in error messages.
        family_override: policy ``family`` (e.g. ``kda_safe_gate``) to force a decay family.
    Raises:
        DascInputError: unknown ``model_type``, missing or invalid fields, no layer kinds.
    """
    from dasc_compile.families import load_all

    load_all()  # each family module registers the model types it parses

    model_type = config.get("model_type")
    if model_type not in _base.MODEL_PARSERS:
        raise DascInputError(
            f"{source}: model_type {model_type!r} is not supported; supported: {sorted(_base.MODEL_PARSERS)}")
    spec = _base.MODEL_PARSERS[model_type](config, source)
    if family_override is not None and family_override != spec.family:
        compatible = {"kda": {"kda_safe_gate"}, "kda_safe_gate": {"kda"}}
        if family_override not in compatible.get(spec.family, set()):
            raise DascInputError(
                f"{source}: policy family {family_override!r} does not fit model_type {model_type!r} "
                f"(its family is {spec.family!r})")
        from dataclasses import replace
        spec = replace(spec, family=family_override)
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
