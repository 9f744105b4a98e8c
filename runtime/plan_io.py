"""Read a plan artifact at serve time (DESIGN.md "Plan artifact"), without the compiler.

The runtime may import only the schema from the compiler (DESIGN.md "Data flow"), so this is a
small reader of its own: ``plan.json`` -> :class:`dasc_compile.schema.Plan`, with the schema
version and the content hash checked before anything else looks at the plan.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from dasc_compile.errors import DascInputError
from dasc_compile.schema import PLAN_FILENAME, SCHEMA_VERSION, Plan, compute_content_hash

__all__ = ["load_plan", "plan_dir_of"]


def plan_dir_of(path: str | Path) -> Path:
    """The plan directory for ``path`` (a plan directory or its ``plan.json``)."""
    p = Path(path)
    return p if p.is_dir() else p.parent


def load_plan(path: str | Path) -> Plan:
    """Load and validate ``plan.json`` (or the directory holding it).

    Args:
        path: plan directory or the ``plan.json`` file.
    Returns:
        the validated :class:`Plan`.
    Raises:
        DascInputError: the file is missing or not JSON of the schema, its ``schema_version`` is
            not this runtime's, or its ``content_hash`` does not match its content (edited file).
    """
    p = Path(path)
    f = p / PLAN_FILENAME if p.is_dir() else p
    if not f.is_file():
        raise DascInputError(f"{f}: dasc plan not found (pass the plan directory or its {PLAN_FILENAME})")
    text = f.read_text()
    try:
        import json

        raw = json.loads(text)
    except ValueError as exc:
        raise DascInputError(f"{f}: not valid JSON ({exc})") from None
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if version != SCHEMA_VERSION:
        raise DascInputError(
            f"{f}: plan schema_version {version!r} is not {SCHEMA_VERSION}, the version this dasc runtime reads; "
            "recompile the plan with this dasc version")
    try:
        plan = Plan.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise DascInputError(f"{f}: plan field '{loc}': {first['msg']}") from None
    if plan.content_hash and plan.content_hash != compute_content_hash(plan):
        raise DascInputError(f"{f}: content_hash does not match the plan's content (the file was edited); recompile it")
    return plan
