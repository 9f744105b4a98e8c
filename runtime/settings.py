"""dasc serving settings: where they come from and how they reach every SGLang process.

Sources, first match wins:

1. the ``ServerArgs`` object (the ``settings`` channel of :mod:`dasc_runtime.side_channels`, set
   by the plugin from the CLI flags ``--dasc-*`` or from ``Engine(dasc_plan=..., ...)`` keyword
   arguments; pickled with the server args into every scheduler process);
2. environment variables (inherited by every child process; the plugin also exports the CLI
   values here):

   ======================  ==========================  =========================================
   flag / Engine kwarg     environment variable        meaning
   ======================  ==========================  =========================================
   --dasc-plan             DASC_PLAN                   plan directory (or its plan.json)
   --dasc-pool-slots       DASC_POOL_SLOTS             compressed slots C (usable, slot 0 extra)
   --dasc-pool-bytes       DASC_POOL_BYTES             per-rank byte budget B: C = B // bytes - 1
   --dasc-compressed-only  DASC_COMPRESSED_ONLY=1      no dense spill (quality runs, §5.1)
   --dasc-demote-watermark DASC_DEMOTE_WATERMARK       free native slots below which demotion starts
   --dasc-dummy-decay-ok   DASC_DUMMY_DECAY_OK=1       with ``--load-format dummy`` only: serve a plan
                                                       whose decay fingerprint differs from the
                                                       (random) served weights; latency benchmarks
   --dasc-refresh-slots    DASC_REFRESH_SLOTS          dasc-wr: windows one scratch pass replays (scratch
                                                       request rows and native Mamba slots; default 8)
   ======================  ==========================  =========================================

Two more knobs are environment-only, for A/B runs of one runtime choice (read where they act, checked
at start-up by :func:`dasc_runtime.startup_checks.check_env_knobs`): ``DASC_RECLAIM_WAIT`` (``stream`` | ``host``,
:func:`dasc_runtime.demotion.reclaim_wait_mode`) and ``DASC_EVICT_SHADOWED_FIRST`` (yes / no,
:func:`dasc_runtime.tier_operations.evict_shadowed_first`). The diagnostics ``DASC_LOG_RESTORES``,
``DASC_WR_CHECK`` (yes / no) and ``DASC_WR_DUMP_MAX`` (a count) are read once at import, where a bad value
falls back to the default (:func:`env_setting`), and checked strictly by the same start-up check.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Mapping, Optional

from dasc_compile.schema import DascInputError
from dasc_runtime.side_channels import settings_of

__all__ = ["DIAGNOSTIC_ENV", "DascSettings", "ENV_VARS", "current_settings", "env_setting", "parse_bool"]

ENV_VARS = {
    "plan": "DASC_PLAN",
    "pool_slots": "DASC_POOL_SLOTS",
    "pool_bytes": "DASC_POOL_BYTES",
    "compressed_only": "DASC_COMPRESSED_ONLY",
    "demote_watermark": "DASC_DEMOTE_WATERMARK",
    "dummy_decay_ok": "DASC_DUMMY_DECAY_OK",
    "refresh_slots": "DASC_REFRESH_SLOTS",
}


def _int(name: str, raw) -> Optional[int]:
    if raw is None or raw == "":
        return None
    try:
        v = int(raw)
    except (TypeError, ValueError):
        raise DascInputError(f"{name}: expected an integer, got {raw!r}") from None
    if v < 0:
        raise DascInputError(f"{name}: expected a non-negative integer, got {v}")
    return v


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

    @classmethod
    def from_mapping(cls, d: Mapping, source: str = "settings", names: Mapping[str, str] | None = None
                     ) -> "DascSettings":
        """From a dict of field -> raw value (CLI namespace values, Engine kwargs or env strings). A bad value is
        named ``names[field]`` (e.g. the ``--dasc-*`` flag it came from), else ``"{source}: {field}"``.

        Raises:
            DascInputError: a value of the wrong kind, or both pool sizes.
        """
        def name(field: str) -> str:
            return names[field] if names and field in names else f"{source}: {field}"

        plan = d.get("plan")
        return cls(
            plan=str(plan) if plan not in (None, "") else None,
            pool_slots=_int(name("pool_slots"), d.get("pool_slots")),
            pool_bytes=_int(name("pool_bytes"), d.get("pool_bytes")),
            compressed_only=parse_bool(name("compressed_only"), d.get("compressed_only", False)),
            demote_watermark=_int(name("demote_watermark"), d.get("demote_watermark")),
            dummy_decay_ok=parse_bool(name("dummy_decay_ok"), d.get("dummy_decay_ok", False)),
            refresh_slots=_int(name("refresh_slots"), d.get("refresh_slots")),
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "DascSettings":
        env = os.environ if env is None else env
        return cls.from_mapping({k: env.get(v) for k, v in ENV_VARS.items()}, source="environment")

    def to_env(self) -> dict[str, str]:
        """Environment variables that carry these settings to child processes (unset fields omitted)."""
        out = {}
        for k, v in asdict(self).items():
            if v is None or v is False:
                continue
            out[ENV_VARS[k]] = "1" if v is True else str(v)
        return out

    def export(self) -> None:
        """Write :meth:`to_env` into ``os.environ`` (children inherit it)."""
        os.environ.update(self.to_env())


def current_settings(server_args=None) -> DascSettings:
    """Settings of this process: the server args' attribute if present, else the environment."""
    if server_args is None:
        try:
            from sglang.srt.runtime_context import get_server_args

            server_args = get_server_args()
        except Exception:
            server_args = None
    raw = settings_of(server_args)
    if raw:
        return DascSettings.from_mapping(raw, source="server args")
    return DascSettings.from_env()
