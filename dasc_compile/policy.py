"""Compile policy: every setting of ``dasc compile``, from a YAML file and/or CLI flags.

A policy file is a YAML mapping whose keys are the fields of :class:`Policy`; unknown keys are
errors. CLI flags override the file's values (:func:`resolve_policy`). Documented defaults per
model family live in ``plans/policies/*.yaml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dasc_compile.errors import DascInputError, pydantic_message, short_repr, short_text
from dasc_compile.strict_yaml import load_yaml_file

FamilyName = Literal["gdn", "kda", "kda_safe_gate", "mamba2"]
StateDType = Literal["float32", "bfloat16", "float16"]
#: Largest ``random_seed``: the per-layer seed ``seed * 1_000_003 + layer_id`` must fit 64 bits.
MAX_RANDOM_SEED = 2**43
#: Largest ``tp_size`` accepted (far above any real tensor-parallel group).
MAX_TP_SIZE = 4096


class Policy(BaseModel):
    """Resolved compile settings (paper §3.3, §4.1, §4.2, App. B.1, C.1, E.1).

    Fields:
        w_max: retention-horizon cutoff W_max in tokens; a unit is global (kept) iff
            H_s(u) > w_max (§4.1). ``0`` keeps every unit with positive horizon.
        a_s: representative gate input a_s of Eq. 2; ``None`` takes the family default
            (-0.3 for softplus gates, 0.8 for the KDA safe gate).
        eps: residual-weight threshold epsilon of Eq. 3 (default 1e-3).
        family: force a decay family instead of detecting it from the config
            (e.g. ``kda_safe_gate`` for a Kimi-K3-style checkpoint whose config lacks the flag).
        safe_gate_lower_bound: l of the safe gate (Eq. 2, Kimi-K3: -5).
        load_policy: ``nr`` (zero-fill local units) or ``wr`` (refresh from a bounded suffix, Eq. 7).
        tp_size: tensor-parallel degree P the plan is compiled for.
        balance: TP placement mode (App. B.1): ``off`` | ``storage`` | ``hybrid``.
        temporal_dtype / conv_dtype: dtypes of the temporal and conv state (SGLang default
            float32 / bfloat16), used for byte accounting and kernels.
        int8: store kept temporal units as symmetric INT8 with one scale per (layer, head, k)
            (App. E.1).
        random_seed: when set, replace the horizon selection by a count-matched random mask
            drawn from this seed (the paper's Random baseline, §5.2).
        pool_budget_bytes: per-rank byte budget of the compressed pool, for the usable-slot
            figure floor(B / max_r bytes_per_slot_r) - 1 (App. C.1).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    w_max: Optional[int] = Field(default=None, ge=0, le=2**40)
    a_s: Optional[float] = Field(default=None, allow_inf_nan=False)
    eps: float = Field(default=1e-3, gt=0.0, lt=1.0, allow_inf_nan=False)
    family: Optional[FamilyName] = None
    safe_gate_lower_bound: float = Field(default=-5.0, lt=0.0, allow_inf_nan=False)
    load_policy: Literal["nr", "wr"] = "nr"
    tp_size: int = Field(default=1, ge=1)
    balance: Literal["off", "storage", "hybrid"] = "off"
    temporal_dtype: StateDType = "float32"
    conv_dtype: StateDType = "bfloat16"
    int8: bool = False
    random_seed: Optional[int] = Field(default=None, ge=0)
    pool_budget_bytes: Optional[int] = Field(default=None, gt=0, le=2**50)


    @property
    def selection(self) -> Literal["horizon", "random"]:
        """The plan's ``selection``: ``random`` when ``random_seed`` draws a count-matched Random mask (§5.2), else
        ``horizon`` (global iff H_s > w_max, §4.1)."""
        return "random" if self.random_seed is not None else "horizon"

    # Bounds checked by validators rather than Field(le=...): the class (and its docstring) is part of
    # the published plan schema, which these input checks must not change.
    @field_validator("random_seed")
    @classmethod
    def _seed_fits_the_generator(cls, v: Optional[int]) -> Optional[int]:
        # the per-layer seed seed * 1_000_003 + layer_id must fit torch.Generator's 64 bits
        if v is not None and v > MAX_RANDOM_SEED:
            raise ValueError(f"Input should be less than or equal to {MAX_RANDOM_SEED}")
        return v

    @field_validator("tp_size")
    @classmethod
    def _tp_size_bounded(cls, v: int) -> int:
        if v > MAX_TP_SIZE:
            raise ValueError(f"Input should be less than or equal to {MAX_TP_SIZE}")
        return v


#: The ``dasc compile`` / ``dasc sweep`` flag of each policy field (bad values are named by their flag).
POLICY_FLAGS = {"w_max": "--wmax", "tp_size": "--tp", "balance": "--balance", "a_s": "--a-s", "eps": "--eps",
                "family": "--family", "load_policy": "--load-policy", "int8": "--int8", "random_seed": "--random-seed",
                "pool_budget_bytes": "--pool-budget"}


def _format_validation_error(source: str, err: ValidationError) -> str:
    first = err.errors()[0]
    loc = short_text(".".join(str(p) for p in first["loc"]) or "<root>", 80)
    if first["type"] == "extra_forbidden":
        known = ", ".join(Policy.model_fields)
        return f"{source}: unknown policy key '{loc}' (known keys: {known})"
    got = first.get("input")
    hint = ""
    if isinstance(got, bool) and first["type"] == "literal_error":
        hint = " (quote the value: a bare true/false is a boolean)"
    return f"{source}: policy field '{loc}': {pydantic_message(first)} (got {short_repr(got)}{hint})"


def load_policy_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML policy file into a dict of raw (unvalidated) fields.

    Read strictly (:func:`dasc_compile.strict_yaml.load_yaml_file`: YAML 1.2 core types, unique
    keys, bounded alias expansion, regular UTF-8 files of at most 1 MiB).

    Raises:
        DascInputError: the file is missing or unreadable, is not valid YAML, repeats a key,
            expands too far, or is not a mapping with string keys.
    """
    p = Path(path)
    data = load_yaml_file(p, "policy file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise DascInputError(f"{p}: a policy must be a YAML mapping of fields, got {type(data).__name__}")
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise DascInputError(f"{p}: policy keys must be field names (strings), got {short_repr(bad[0])}")
    return data


def resolve_policy(path: str | Path | None = None, *, flags: Optional[dict[str, str]] = None,
                   **overrides: Any) -> Policy:
    """Build a :class:`Policy` from an optional YAML file, then CLI overrides (``None`` = unset).

    The file is validated in pydantic strict mode: a value of the wrong type is refused, never
    converted (``w_max: true`` is not 1, ``int8: "yes"`` is not true, ``w_max: "64"`` is not 64);
    integers are accepted for float fields.

    Args:
        path: the YAML policy file, or None. flags: field -> the flag that set each override
            (:data:`POLICY_FLAGS` from the CLI), so a bad value is named by its flag; None for
            library callers (then ``command-line flags: policy field '<name>'``).
        overrides: field -> value (None: unset).
    Raises:
        DascInputError: unknown key, wrong type or out-of-range value, naming the file (or the flag)
            and the field.
    """
    fields: dict[str, Any] = load_policy_file(path) if path is not None else {}
    source = str(path) if path is not None else "policy"
    try:
        Policy.model_validate(fields, strict=True)
    except ValidationError as exc:
        raise DascInputError(_format_validation_error(source, exc)) from None
    given = {k: v for k, v in overrides.items() if v is not None}
    fields.update(given)
    try:
        return Policy(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        if flags and field in given and field in flags:
            v = given[field]        # a whole float as typed (--eps 0), not as parsed (0.0)
            shown = str(int(v)) if isinstance(v, float) and v.is_integer() and abs(v) < 1e16 else str(v)
            raise DascInputError(f"{flags[field]} {short_text(shown, 80)}: {pydantic_message(first)} (policy field "
                                 f"'{field}')") from None
        raise DascInputError(_format_validation_error("command-line flags", exc)) from None
