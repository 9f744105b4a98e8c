"""dasc serving settings: where they come from and how they reach every SGLang process.

Sources, per setting (:func:`resolve_settings`):

1. a flag ``--dasc-*`` or an ``Engine(dasc_plan=..., ...)`` keyword argument wins over its variable; the
   plugin resolves them in the launching process and records the result on the ``ServerArgs`` object (the
   ``settings`` channel of :mod:`dasc_runtime.side_channels`; pickled with the server args into every
   scheduler process) and in the environment;
2. else its environment variable (inherited by every child process). A variable applies wherever no flag
   is given for that setting, and every variable is checked even when a flag overrides it (a bad value is
   refused, never skipped); an empty value counts as not given.

Refused in one line (``DascInputError``), naming the flag or variable: a value of the wrong kind, both pool
sizes from any two sources (``--dasc-pool-slots and DASC_POOL_BYTES are exclusive``), and, in the launching
process, any setting without a plan (``--dasc-pool-slots needs --dasc-plan (or DASC_PLAN)``).

   ======================  ==========================  =========================================
   flag / Engine kwarg     environment variable        meaning
   ======================  ==========================  =========================================
   --dasc-plan             DASC_PLAN                   plan directory (or its plan.json)
   --dasc-pool-slots       DASC_POOL_SLOTS             compressed slots C >= 1 (usable, slot 0 extra)
   --dasc-pool-bytes       DASC_POOL_BYTES             per-rank byte budget B: C = B // bytes - 1 (a size
                                                       as ``dasc size --budget`` reads it: 2147483648,
                                                       2GiB, 1.5e9)
   --dasc-compressed-only  DASC_COMPRESSED_ONLY=1      no dense spill (quality runs, §5.1)
   --dasc-demote-watermark DASC_DEMOTE_WATERMARK       free native slots below which demotion starts
   --dasc-dummy-decay-ok   DASC_DUMMY_DECAY_OK=1       with ``--load-format dummy`` only: serve a plan
                                                       whose decay fingerprint differs from the
                                                       (random) served weights; latency benchmarks
   --dasc-refresh-slots    DASC_REFRESH_SLOTS          dasc-wr: windows one scratch pass replays (scratch
                                                       request rows and native Mamba slots; default 8)
   ======================  ==========================  =========================================

Three more knobs are environment-only, for A/B runs of one runtime choice (read where they act, checked
at start-up by :func:`dasc_runtime.startup_checks.check_env_knobs`): ``DASC_RECLAIM_WAIT`` (``stream`` | ``host``,
:func:`dasc_runtime.demotion.reclaim_wait_mode`), ``DASC_EVICT_SHADOWED_FIRST`` (yes, the default / no,
:func:`dasc_runtime.tier_operations.evict_shadowed_first`) and ``DASC_EVICT_FORK_TEST`` (yes, the default / no: that
rule without its fork test, a control; :func:`dasc_runtime.tier_operations.evict_fork_test`). The diagnostics ``DASC_LOG_RESTORES``,
``DASC_WR_CHECK`` (yes / no) and ``DASC_WR_DUMP_MAX`` (a count) are read once at import, where a bad value
falls back to the default (:func:`env_setting`), and checked strictly by the same start-up check.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import asdict, dataclass
from typing import Mapping, Optional

from dasc_compile.schema import DascInputError
from dasc_runtime.side_channels import settings_of
from dasc_runtime.sizing_fit import parse_bytes

__all__ = ["DIAGNOSTIC_ENV", "DascSettings", "ENV_VARS", "current_settings", "env_setting", "parse_bool",
           "resolve_settings"]

ENV_VARS = {
    "plan": "DASC_PLAN",
    "pool_slots": "DASC_POOL_SLOTS",
    "pool_bytes": "DASC_POOL_BYTES",
    "compressed_only": "DASC_COMPRESSED_ONLY",
    "demote_watermark": "DASC_DEMOTE_WATERMARK",
    "dummy_decay_ok": "DASC_DUMMY_DECAY_OK",
    "refresh_slots": "DASC_REFRESH_SLOTS",
}


#: Why an integer setting has a floor above 0 (``--dasc-pool-slots 0`` used to pass until the pool was built).
_LEAST = {"pool_slots": (1, "the compressed pool needs at least 1 usable slot")}


def _int(name: str, raw, least: tuple[int, str] = (0, "")) -> Optional[int]:
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool):
        raise DascInputError(f"{name}: expected an integer, got {raw!r}")
    try:
        v = int(raw)
    except (TypeError, ValueError):
        raise DascInputError(f"{name}: expected an integer, got {raw!r}") from None
    if v < least[0]:
        floor = "a non-negative integer" if least[0] == 0 else f"an integer >= {least[0]} ({least[1]})"
        raise DascInputError(f"{name}: expected {floor}, got {v}")
    return v


def _parse(field: str, raw, name: str):
    """One setting's value from a flag, keyword or variable (``name`` in a refusal); None / False: not given."""
    if field == "plan":
        return str(raw) if raw not in (None, "") else None
    if field in ("compressed_only", "dummy_decay_ok"):
        return parse_bool(name, raw)
    if field == "pool_bytes":           # a size, as ``dasc size --budget`` reads it: 17179869184, 16GiB, 1.5e9
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return None
        if isinstance(raw, numbers.Integral) and not isinstance(raw, bool):    # numpy integers too
            raw = int(raw)
        elif isinstance(raw, numbers.Real) and not isinstance(raw, bool):      # Engine(dasc_pool_bytes=2e9)
            raw = float(raw)
        elif not isinstance(raw, str):
            raise DascInputError(f"{name}: expected a size in bytes such as 17179869184 or 16GiB, got {raw!r}")
        return parse_bytes(str(raw), name)
    return _int(name, raw, _LEAST.get(field, (0, "")))


#: Spellings of a yes / no setting (case and surrounding spaces ignored; unset or empty is no).
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


#: Diagnostic environment variables: name -> (kind, default). Read at import by the modules that act on them.
DIAGNOSTIC_ENV = {"DASC_LOG_RESTORES": ("bool", False), "DASC_WR_CHECK": ("bool", False),
                  "DASC_WR_DUMP_MAX": ("count", 4)}


def env_setting(name: str, strict: bool = False):
    """The value of the diagnostic environment variable ``name`` (:data:`DIAGNOSTIC_ENV`): a bool as
    :func:`parse_bool` reads it, or a non-negative count (unset or empty: the default). With ``strict=False``
    (at import, where an exception would be a traceback in every scheduler process) a bad value gives the
    default; start-up calls it with ``strict=True`` first (``startup_checks.check_env_knobs``).

    Raises:
        DascInputError: with ``strict``, a value of the wrong kind, naming the variable.
    """
    kind, default = DIAGNOSTIC_ENV[name]
    raw = os.environ.get(name)
    try:
        if kind == "bool":
            return parse_bool(name, raw)
        v = _int(name, raw)
        return default if v is None else v
    except DascInputError:
        if strict:
            raise
        return default


def parse_bool(name: str, raw) -> bool:
    """A yes / no setting: a bool as it is, else one of :data:`TRUE_WORDS` / :data:`FALSE_WORDS`.

    Raises:
        DascInputError: any other value (``DASC_COMPRESSED_ONLY=2`` was silently "no"), naming ``name``.
    """
    if isinstance(raw, bool) or raw is None:
        return bool(raw)
    word = str(raw).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise DascInputError(f"{name}: expected 1 / true / yes / on or 0 / false / no / off, got {raw!r}")


@dataclass(frozen=True, kw_only=True)
class DascSettings:
    """Resolved serving settings (see module docstring). ``plan is None`` means dasc is off."""

    plan: Optional[str] = None
    pool_slots: Optional[int] = None
    pool_bytes: Optional[int] = None
    compressed_only: bool = False
    demote_watermark: Optional[int] = None
    dummy_decay_ok: bool = False
    refresh_slots: Optional[int] = None

    def __post_init__(self) -> None:
        if self.pool_slots is not None and self.pool_bytes is not None:
            raise DascInputError("--dasc-pool-slots and --dasc-pool-bytes are exclusive: size the pool one way")

    @property
    def active(self) -> bool:
        return self.plan is not None

    def given(self) -> dict:
        """The fields that are set (field -> value; None and False left out): what :meth:`to_env` exports."""
        return {k: v for k, v in asdict(self).items() if v is not None and v is not False}

    def to_env(self) -> dict[str, str]:
        """Environment variables that carry these settings to child processes (unset fields omitted)."""
        return {ENV_VARS[k]: "1" if v is True else str(v) for k, v in self.given().items()}

    def export(self) -> None:
        """Write :meth:`to_env` into ``os.environ`` (children inherit it)."""
        os.environ.update(self.to_env())


def resolve_settings(given: Mapping, names: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None,
                     *, need_plan: bool = True) -> tuple[DascSettings, dict[str, str]]:
    """The settings in effect: per field the given value (a flag or keyword argument; None, False or "" is not
    given) wins, else its ``DASC_*`` variable (module docstring). Every variable is parsed, also under a flag.

    Args:
        given: field -> raw value (argparse values, ``Engine`` keyword arguments, or the values attached to the
            server args). names: field -> how a given value is named in a refusal (``--dasc-pool-slots``); default
            ``"server args: <field>"``. env: the environment (default ``os.environ``).
        need_plan: refuse settings given without a plan (the launching process; a scheduler resolves what the
            launcher attached).
    Returns:
        ``(settings, source)``: ``source`` maps each set field to the flag, keyword or variable it came from.
    Raises:
        DascInputError: a value of the wrong kind, named by its flag or variable (``DASC_REFRESH_SLOTS: expected an
            integer, got 'abc'``); ``--dasc-pool-slots 0``; both pool sizes (``X and Y are exclusive``); with
            ``need_plan``, a setting and no plan (``--dasc-pool-slots needs --dasc-plan (or DASC_PLAN)``).
    """
    env = os.environ if env is None else env

    def name(field: str) -> str:
        return names[field] if names and field in names else f"server args: {field}"

    def set_here(field: str, raw, env_var: bool) -> bool:
        if raw is None or raw is False or (isinstance(raw, str) and not raw.strip()):
            return False
        return not (env_var and field in ("compressed_only", "dummy_decay_ok") and str(raw).strip().lower()
                    in FALSE_WORDS)

    has_plan = set_here("plan", given.get("plan"), False) or set_here("plan", env.get("DASC_PLAN"), True)
    if need_plan and not has_plan:
        orphans = [name(f) for f in ENV_VARS if set_here(f, given.get(f), False)]
        orphans += [var for f, var in ENV_VARS.items() if set_here(f, env.get(var), True)]
        if orphans:
            plan = names["plan"] if names and "plan" in names else "--dasc-plan"
            raise DascInputError(f"{' and '.join(orphans)} {'needs' if len(orphans) == 1 else 'need'} {plan} "
                                 f"(or DASC_PLAN)")
    values, source = {}, {}
    for field, var in ENV_VARS.items():
        from_env = _parse(field, env.get(var), var)              # checked even when a flag wins
        mine = _parse(field, given.get(field), name(field))
        if mine is not None and mine is not False:
            values[field], source[field] = mine, name(field)
        elif from_env is not None and from_env is not False:
            values[field], source[field] = from_env, var
    if "pool_slots" in values and "pool_bytes" in values:
        raise DascInputError(f"{source['pool_slots']} and {source['pool_bytes']} are exclusive: size the pool one way")
    return DascSettings(**values), source


def current_settings(server_args=None) -> DascSettings:
    """Settings of this process: the values attached to the server args (the launcher's, :func:`resolve_settings`),
    each set one winning over its ``DASC_*`` variable, the environment for the rest.

    Raises:
        DascInputError: see :func:`resolve_settings` (without the plan requirement).
    """
    if server_args is None:
        try:
            from sglang.srt.runtime_context import get_server_args

            server_args = get_server_args()
        except Exception:
            server_args = None
    return resolve_settings(settings_of(server_args) or {}, need_plan=False)[0]
