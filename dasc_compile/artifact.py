"""Writing and reading the plan directory atomically (DESIGN.md "Plan artifact").

A plan directory holds ``plan.json`` (written last) and the rendered kernel module(s). It is
built in a temporary sibling directory and renamed into place, so a failure leaves nothing
half-written and an existing plan at the same path is replaced whole. Reading is
:func:`dasc_compile.schema.load_plan` (re-exported here with ``plan_json_path``), the one plan
reader shared with the runtime.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from dasc_compile.errors import DascInputError
from dasc_compile.schema import PLAN_FILENAME, Plan, canonical_json
from dasc_compile.schema import load_plan, plan_json_path  # re-exported: the one plan reader

__all__ = ["PLAN_FILE_PATTERNS", "check_replaceable", "load_plan", "plan_json_path", "write_plan_dir"]


PLAN_FILE_PATTERNS = (PLAN_FILENAME, "dasc_kernels_*.py")


def check_replaceable(out: Path) -> None:
    """Refuse an output path whose replacement would destroy anything but an earlier dasc plan.

    ``out`` may be absent, or an existing directory holding only a plan (``plan.json`` and rendered
    ``dasc_kernels_*.py`` modules). Anything else (a file, a directory with other content such as
    the model's own checkpoint, the current directory or one of its parents) is refused.

    Raises:
        DascInputError: naming ``out`` and why it cannot be replaced.
    """
    if not out.exists():
        return
    if not out.is_dir():
        raise DascInputError(f"{out}: output path exists and is not a directory; choose another --out")
    here = Path.cwd().resolve()
    target = out.resolve()
    if target == here or target in here.parents:
        raise DascInputError(f"{out}: --out must not be the current directory or one of its parents")
    others = sorted(p.name for p in out.iterdir()
                    if not any(p.match(pat) for pat in PLAN_FILE_PATTERNS) or not p.is_file())
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise DascInputError(
            f"{out}: output directory exists and holds more than a dasc plan ({shown}); "
            f"choose another --out or remove it")


def write_plan_dir(plan: Plan, out_dir: str | Path, files: dict[str, str] | None = None) -> Path:
    """Write ``plan`` (its content hash must be set) and ``files`` (name -> text) into ``out_dir``.

    The directory is assembled under a temporary name beside ``out_dir`` and moved into place
    with ``os.replace``; ``plan.json`` is written last. Returns the final directory.

    Raises:
        DascInputError: ``out_dir`` exists and is not a directory, or cannot be written.
    """
    out = Path(out_dir)
    check_replaceable(out)
    parent = out.parent if str(out.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    except OSError as exc:
        raise DascInputError(f"{out}: cannot create the plan directory ({exc.strerror})") from None
    try:
        for name, text in (files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        (tmp / PLAN_FILENAME).write_text(canonical_json(plan), encoding="utf-8")
        os.chmod(tmp, 0o755)
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
            os.replace(out, old / "plan")
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
