"""Read a plan artifact at serve time (DESIGN.md "Plan artifact"), without the compiler.

The runtime may import only the schema from the compiler (DESIGN.md "Data flow"); the plan
reader lives there (:func:`dasc_compile.schema.load_plan`: schema version, validation and the
content hash checked before anything else looks at the plan), shared with the CLI.
"""

from __future__ import annotations

from pathlib import Path

from dasc_compile.schema import Plan
from dasc_compile.schema import load_plan as _load_plan

__all__ = ["load_plan", "plan_dir_of"]


def plan_dir_of(path: str | Path) -> Path:
    """The plan directory for ``path`` (a plan directory or its ``plan.json``)."""
    p = Path(path)
    return p if p.is_dir() else p.parent


def load_plan(path: str | Path) -> Plan:
    """Load and validate ``plan.json`` (or the directory holding it) for serving.

    Args:
        path: plan directory or the ``plan.json`` file.
    Returns:
        the validated :class:`Plan`.
    Raises:
        DascInputError: see :func:`dasc_compile.schema.load_plan` (missing file, not a JSON plan,
            ``schema_version`` not this dasc's, invalid field, ``content_hash`` not matching).
    """
    return _load_plan(path)
