"""Architecture spec and the config helpers every model parser uses (a leaf module: no dasc imports
beyond errors and the schema's unit kinds).

:class:`ArchSpec` is everything the compiler needs to know about a hybrid model, independent of weight
values; family modules (:mod:`dasc_compile.families`) build it from config.json with
:func:`text_config`, :func:`require` and :func:`layer_kinds`. State shapes follow SGLang 0.5.17
(``sglang/srt/configs/mamba_utils.py``: ``Mamba2StateShape`` for GDN, ``KimiLinearStateShape`` for KDA).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from dasc_compile.errors import DascInputError
from dasc_compile.schema.units import UnitSpec, lookup_unit_kind

if TYPE_CHECKING:  # pragma: no cover
    from dasc_compile.policy import Policy

__all__ = ["ArchSpec", "layer_kinds", "require", "text_config"]


@dataclass(frozen=True, kw_only=True)
class ArchSpec:
    """Everything the compiler needs to know about a hybrid model, independent of weight values.

    Attributes:
        model_type / architectures / num_hidden_layers: from config.json.
        recurrent_layer_ids / full_attention_layer_ids: 0-indexed model layer ids.
        family: decay family name (see :mod:`dasc_compile.families.base`).
        num_value_heads: H_v (GDN) or H (KDA, Mamba2); num_key_heads: H_k (GDN), H (KDA, Mamba2: heads
            are the TP bundles, one each).
        head_k_dim / head_v_dim: d_k / d_v of the temporal state ``[H_v, d_v, d_k]`` (Mamba2: d_state / head_dim).
        unit_kind: the family's unit (:data:`dasc_compile.schema.units.UNIT_KINDS`): ``gdn_head``,
            ``kda_column`` or ``mamba2_head``; ``units_per_head`` follows from it (1 or d_k).
        conv_kernel: K; conv state keeps K-1 columns. conv_dim: conv channels at TP=1.
        a_log_names / dt_bias_names: decay tensor names, one per recurrent layer, in order.
        a_log_shape / dt_bias_shape: expected shapes of those tensors.
        safe_gate_lower_bound: l of the KDA safe gate when the config declares one, else None.
        layer_kind_source: which config field decided the layer kinds (for messages).
        head_fields: config field names of H_v and H_k (for messages, e.g.
            ``("text_config.linear_num_value_heads", "text_config.linear_num_key_heads")``).
        conv_groups: Mamba2 ``n_groups`` (B/C groups at the end of the conv state), 0 for other families
            (:class:`~dasc_compile.schema.units.UnitSpec` splits the conv state over ranks with it).
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
    unit_kind: str
    conv_kernel: int
    conv_dim: int
    a_log_names: tuple[str, ...]
    dt_bias_names: tuple[str, ...]
    a_log_shape: tuple[int, ...]
    dt_bias_shape: tuple[int, ...]
    safe_gate_lower_bound: float | None
    layer_kind_source: str
    recurrent_tensor_marker: str            # substring that only recurrent layers' tensors carry
    head_fields: tuple[str, str]
    conv_groups: int = 0

    @property
    def units_per_head(self) -> int:
        """U: 1 when a unit is a whole head, d_k when it is a column (from :attr:`unit_kind`)."""
        return 1 if lookup_unit_kind(self.unit_kind).whole_head else self.head_k_dim

    @property
    def n_units_per_layer(self) -> int:
        """n_l = H_v * U units per recurrent layer."""
        return self.num_value_heads * self.units_per_head

    def unit_spec(self, policy: "Policy") -> UnitSpec:
        """The :class:`UnitSpec` of this model's units under ``policy``'s state dtypes and INT8 setting."""
        return UnitSpec(kind=self.unit_kind, d_v=self.head_v_dim, d_k=self.head_k_dim,
                        temporal_dtype=policy.temporal_dtype, conv_dim=self.conv_dim, conv_kernel=self.conv_kernel,
                        conv_dtype=policy.conv_dtype, int8=bool(policy.int8), conv_groups=self.conv_groups)


def layer_kinds(cfg: dict, num_layers: int, source: str, linear_names: Iterable[str]) -> tuple[list[int], str]:
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
    """``cfg[key]``, which must be present (and a positive integer when ``kind is int``).

    Raises:
        DascInputError: the field is missing, null, or not a positive integer; names ``source`` and ``key``.
    """
    if key not in cfg or cfg[key] is None:
        raise DascInputError(f"{source}: config field '{key}' is missing")
    val = cfg[key]
    if kind is int and (not isinstance(val, int) or isinstance(val, bool) or val <= 0):
        raise DascInputError(f"{source}: config field '{key}' must be a positive integer, got {val!r}")
    return val
