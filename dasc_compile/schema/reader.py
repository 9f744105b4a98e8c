"""The one plan reader of compiler and runtime (DESIGN.md "Plan artifact"): read, validate, verify.

:func:`load_plan` is what ``dasc inspect``, the artifact writer's callers and the runtime
(``dasc_runtime.plan_io``) use; every problem is one :class:`DascInputError` line naming the file
and the field.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from dasc_compile.errors import DascInputError
from dasc_compile.schema.canonical import compute_content_hash
from dasc_compile.schema.plan import PLAN_FILENAME, SCHEMA_VERSION, Plan

__all__ = ["load_plan", "plan_json_path"]


def plan_json_path(path: str | Path) -> Path:
    """``path/plan.json`` when ``path`` is a directory, else ``path`` itself."""
    p = Path(path)
    return p / PLAN_FILENAME if p.is_dir() else p


def load_plan(path: str | Path) -> Plan:
    """Read and verify a plan (``plan.json`` or its directory): the one plan reader of compiler and runtime.

    Checks, in order: the file exists; it parses as a JSON object with ``schema_version`` and
    ``content_hash`` fields; ``schema_version`` equals :data:`SCHEMA_VERSION`; the content
    validates against :class:`Plan`; the stored ``content_hash`` equals
    :func:`compute_content_hash` (always checked: an empty hash is refused too).

    Args:
        path: plan directory or its ``plan.json``.
    Returns:
        the validated :class:`Plan`.
    Raises:
        DascInputError: one line naming the file and what is wrong.
    """
    p = plan_json_path(path)
    if not p.is_file():
        raise DascInputError(f"{p}: dasc plan not found (pass the plan directory or its {PLAN_FILENAME})")
    try:
        raw = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise DascInputError(f"{p}: not a readable JSON plan ({exc})") from None
    if not isinstance(raw, dict):
        raise DascInputError(f"{p}: a plan must be a JSON object")
    if "schema_version" not in raw or "content_hash" not in raw:
        raise DascInputError(f"{p}: not a dasc plan (no 'schema_version' / 'content_hash' field); pass a plan.json "
                             f"written by 'dasc compile'")
    ver = raw.get("schema_version")
    if ver != SCHEMA_VERSION:
        raise DascInputError(
            f"{p}: plan schema_version {ver!r} is not {SCHEMA_VERSION}, the version this dasc reads; "
            f"recompile the plan with this dasc version")
    try:
        plan = Plan.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise DascInputError(f"{p}: plan field '{loc}': {first['msg']}") from None
    want = compute_content_hash(plan)
    if plan.content_hash != want:
        raise DascInputError(
            f"{p}: content_hash does not match the plan's content (stored {plan.content_hash[:12] or 'empty'}..., "
            f"computed {want[:12]}...): the plan was edited or corrupted; recompile it")
    return plan
