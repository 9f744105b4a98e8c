"""Validation of the config.json fields dasc reads, before anything is sized or allocated from them.

Each family module declares a pydantic model of exactly the fields its parser reads, built from the
bounded types here, and calls :func:`validate_config` first (fields it does not read are allowed
and ignored). Validation is strict: a value of the wrong JSON type is refused, never converted
(``num_hidden_layers: 1e8`` is not an integer, ``layer_types: [1, 2]`` holds no kind names,
``gate_lower_bound: "abc"`` is not a number); integers are accepted for float fields. Bounds keep a
config from sizing work that no real model needs (``num_hidden_layers: 100000000`` is refused at
once instead of building a hundred-million-entry layer list).

The first problem becomes one :class:`DascInputError` line naming the file, the field (with its list
index) and what was expected; echoed values are cut short (:func:`dasc_compile.errors.short_repr`).
"""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dasc_compile.errors import DascInputError, pydantic_message, short_repr, short_text

__all__ = ["ConfigFields", "ConvKernel", "HeadCount", "HeadDim", "LayerKindFields", "LayerNumber", "MAX_HEADS",
           "MAX_HEAD_DIM", "MAX_LAYERS", "NegativeBound", "RootFields", "validate_config"]

#: Largest layer count accepted (real hybrids have at most a few hundred layers).
MAX_LAYERS = 4096
#: Largest head count of a recurrent layer accepted.
MAX_HEADS = 4096
#: Largest head dimension accepted.
MAX_HEAD_DIM = 8192
#: Largest short-convolution kernel accepted.
MAX_CONV_KERNEL = 1024

LayerCount = Annotated[int, Field(ge=1, le=MAX_LAYERS)]
LayerNumber = Annotated[int, Field(ge=1, le=MAX_LAYERS)]          # 1-indexed layer numbers
HeadCount = Annotated[int, Field(ge=1, le=MAX_HEADS)]
HeadDim = Annotated[int, Field(ge=1, le=MAX_HEAD_DIM)]
ConvKernel = Annotated[int, Field(ge=2, le=MAX_CONV_KERNEL)]       # the conv state keeps K - 1 >= 1 columns
NegativeBound = Annotated[float, Field(lt=0.0, allow_inf_nan=False)]
ShortName = Annotated[str, Field(min_length=1, max_length=200)]


class ConfigFields(BaseModel):
    """Base of the config models: strict types, fields dasc does not read pass through unchecked."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)


class RootFields(ConfigFields):
    """Top-level fields every model type is read through (``arch_from_config``, the compiler)."""

    model_type: ShortName
    architectures: Optional[list[ShortName]] = Field(default=None, max_length=64)
    text_config: Optional[dict] = None
    quantization_config: Optional[dict] = None


class LayerKindFields(ConfigFields):
    """The layer count and the fields the layer kinds are read from (:func:`dasc_compile.archspec.layer_kinds`)."""

    num_hidden_layers: LayerCount
    layer_types: Optional[list[ShortName]] = Field(default=None, max_length=MAX_LAYERS)
    full_attention_interval: Optional[LayerCount] = None
    hybrid_override_pattern: Optional[str] = Field(default=None, max_length=MAX_LAYERS)

    @model_validator(mode="after")
    def _lengths_match_the_layer_count(self):
        n = self.num_hidden_layers
        if self.layer_types is not None and len(self.layer_types) != n:
            raise ValueError(f"field 'layer_types' must list {n} layer kinds (num_hidden_layers), "
                             f"got {len(self.layer_types)}")
        if self.hybrid_override_pattern is not None and len(self.hybrid_override_pattern) != n:
            raise ValueError(f"field 'hybrid_override_pattern' must have one character per layer ({n}, "
                             f"num_hidden_layers), got {len(self.hybrid_override_pattern)}")
        return self


def _loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc)


def validate_config(model: type[ConfigFields], cfg: dict, source: str, prefix: str = "") -> ConfigFields:
    """Validate ``cfg`` against ``model``; returns the validated model (``cfg`` itself is not changed).

    Args:
        model: a :class:`ConfigFields` subclass naming the fields read.
        cfg: the (sub-)mapping of config.json holding them.
        source: file (and section) for messages, e.g. ``config.json (text_config)``.
        prefix: dotted path of ``cfg`` inside the file, prepended to field names in messages.
    Raises:
        DascInputError: ``cfg`` is not a mapping, or the first field that is missing, of the wrong
            type, out of bounds or inconsistent, e.g. ``config.json: config field
            'num_hidden_layers': Input should be less than or equal to 4096 (got 100000000)``.
    """
    if not isinstance(cfg, dict):
        raise DascInputError(f"{source}: {prefix.rstrip('.') or 'config'} must be a JSON object, "
                             f"got {type(cfg).__name__}")
    try:
        return model.model_validate(cfg)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = prefix + _loc(first["loc"])
        kind = first["type"]
        if kind == "missing":
            raise DascInputError(f"{source}: config field '{loc}' is missing") from None
        if kind == "value_error":   # a cross-field check (model validator): its message names the field
            msg = short_text(pydantic_message(first))
            where = f"config field '{loc}': " if first["loc"] else ""
            raise DascInputError(f"{source}: {where}{msg}") from None
        msg = "Input should be a JSON object" if kind in ("model_type", "dict_type") else first["msg"]
        raise DascInputError(f"{source}: config field '{loc}': {msg} (got {short_repr(first.get('input'))})") from None
