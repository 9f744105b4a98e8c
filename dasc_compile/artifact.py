"""Writing and reading the plan directory atomically (DESIGN.md "Plan artifact").

A plan directory holds ``plan.json`` (written last) and the rendered kernel module(s). It is
built in a temporary sibling directory and renamed into place, so a failure leaves nothing
half-written and an existing plan at the same path is replaced whole.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from pydantic import ValidationError

from dasc_compile.errors import DascInputError
from dasc_compile.schema import PLAN_FILENAME, SCHEMA_VERSION, Plan, canonical_json, compute_content_hash


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
            (tmp / name).write_text(text)
        (tmp / PLAN_FILENAME).write_text(canonical_json(plan))
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


def plan_json_path(path: str | Path) -> Path:
    p = Path(path)
    return p / PLAN_FILENAME if p.is_dir() else p


def load_plan(path: str | Path) -> Plan:
    """Read and verify a plan (``plan.json`` or its directory).

    Checks: the file exists and parses; ``schema_version`` equals this dasc's
    :data:`~dasc_compile.schema.SCHEMA_VERSION`; the stored ``content_hash`` matches the content.

    Raises:
        DascInputError: naming the file and what is wrong.
    """
    p = plan_json_path(path)
    if not p.is_file():
        raise DascInputError(f"{p}: plan file not found")
    import json

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
            f"{p}: plan schema_version {ver!r} is not supported by this dasc (expects {SCHEMA_VERSION}); recompile the plan")
    try:
        plan = Plan.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise DascInputError(f"{p}: plan field '{loc}': {first['msg']}") from None
    want = compute_content_hash(plan)
    if plan.content_hash != want:
        raise DascInputError(
            f"{p}: content_hash {plan.content_hash[:12]}... does not match the content ({want[:12]}...): "
            f"the plan was edited or corrupted; recompile it")
    return plan
