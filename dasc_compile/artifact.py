"""Writing the plan directory atomically (DESIGN.md "Plan artifact").

A plan directory holds ``plan.json`` (written last) and the rendered kernel module(s). It is
built in a temporary sibling directory and moved into place by :func:`dasc_compile.atomic.replace_dir`,
so a failure or an interrupt leaves nothing half-written, and the ``--out`` path always holds either
the earlier plan or the new one. An existing ``--out`` is replaced only when it holds an earlier dasc
plan, recognised by its content (:func:`is_dasc_plan_file`: a ``plan.json`` whose bytes hash to its own
``content_hash``), never by file names alone. Reading is :func:`dasc_compile.schema.load_plan`, the
one plan reader shared with the runtime.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from dasc_compile import atomic
from dasc_compile.errors import DascInputError
from dasc_compile.schema import PLAN_FILENAME, Plan, canonical_json
from dasc_compile.schema.reader import DuplicateKeyError, OverLongIntegerError, loads_plan_json

__all__ = ["KERNEL_FILE_PATTERN", "check_replaceable", "is_dasc_plan_file", "prepare_out", "recover_out",
           "write_plan_dir"]

#: Rendered kernel modules that may sit beside plan.json (and their ``__pycache__`` after an import).
KERNEL_FILE_PATTERN = "dasc_kernels_*.py"
_PYCACHE_PATTERN = "dasc_kernels_*.pyc"
#: Largest plan.json read when recognising an earlier plan, bytes (real plans are well under 10 MB).
MAX_PLAN_BYTES = 256 * 2**20
_HASH_FIELD = re.compile(rb'"content_hash"\s*:\s*"([0-9a-f]{64})"')


def is_dasc_plan_file(path: Path) -> tuple[bool, str]:
    """Whether ``path`` is a ``plan.json`` written by dasc (of any schema version) and not edited since.

    A dasc plan is a JSON object with an integer ``schema_version`` and a 64-hex ``content_hash``,
    and the sha256 of its bytes with that hash value blanked (``"content_hash":""``) equals the hash:
    the canonical form dasc writes (:func:`dasc_compile.schema.compute_content_hash`). A plan of this
    schema version in another layout (re-indented or key-sorted by a JSON tool) counts too when its content hashes to
    the stored hash, as :func:`dasc_compile.schema.load_plan` checks it.

    Returns:
        ``(True, "")`` or ``(False, why)`` with a short reason for messages.
    """
    try:
        if path.is_symlink():
            return False, "a symbolic link, which dasc never writes"
        if not path.is_file():
            return False, "not a regular file"
        if path.stat().st_size > MAX_PLAN_BYTES:
            return False, f"larger than {MAX_PLAN_BYTES} bytes"
        raw = path.read_bytes()
    except OSError as exc:
        return False, f"unreadable ({exc.strerror or exc})"
    try:
        obj = loads_plan_json(raw)
    except (DuplicateKeyError, OverLongIntegerError) as exc:
        return False, f"{exc} (edited since dasc wrote it)"
    except (ValueError, RecursionError):
        return False, "not JSON"
    if not isinstance(obj, dict) or type(obj.get("schema_version")) is not int or "content_hash" not in obj:
        return False, "no schema_version / content_hash fields"
    m = _HASH_FIELD.search(raw)
    if m is None or obj.get("content_hash") != m.group(1).decode():
        return False, "no content hash"
    blank = raw[:m.start(1)] + raw[m.end(1):]
    if hashlib.sha256(blank).hexdigest() == m.group(1).decode() or _same_content(obj):
        return True, ""
    return False, "content_hash does not match its content (edited since dasc wrote it)"


def _same_content(obj: dict) -> bool:
    """Whether a plan of this schema version, written in another layout (pretty-printed, keys spaced or sorted), has
    the content its hash was computed from: the test ``dasc inspect`` applies (``load_plan``), so a plan
    the reader accepts is never called edited here."""
    from pydantic import ValidationError

    from dasc_compile.schema import SCHEMA_VERSION, compute_content_hash

    if obj.get("schema_version") != SCHEMA_VERSION:
        return False
    try:
        plan = Plan.model_validate(obj)
    except (ValidationError, ValueError, RecursionError):
        return False
    return compute_content_hash(plan) == plan.content_hash


def _is_plan_companion(p: Path) -> bool:
    """A file dasc puts beside plan.json: a rendered kernel module, or its bytecode cache."""
    if p.is_symlink():
        return False
    if p.is_file():
        return p.match(KERNEL_FILE_PATTERN)
    if p.is_dir() and p.name == "__pycache__":
        return all(c.is_file() and not c.is_symlink() and c.match(_PYCACHE_PATTERN) for c in p.iterdir())
    return False


def _resolve_out(out: Path) -> Path:
    """``out`` itself, or the directory a symbolic link ``out`` points to.

    Raises:
        DascInputError: a dangling link, a link to a non-directory, an unusable path (name too
            long, a file in place of a parent directory, permissions, a link loop).
    """
    atomic.check_name_room(out, _show(out))
    try:
        if out.is_symlink():
            target = Path(os.path.realpath(out))
            try:
                os.stat(out)
            except FileNotFoundError:
                raise DascInputError(f"{_show(out)}: --out is a symbolic link to {_show(target)}, which does not "
                                     f"exist; remove the link or pass another --out") from None
            if not target.is_dir():
                raise DascInputError(f"{_show(out)}: --out is a symbolic link to {_show(target)}, which is not a "
                                     f"directory")
            return _resolve_out(target)
        os.lstat(out)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise DascInputError(f"{_show(out)}: cannot use this --out path "
                             f"({atomic.not_a_folder(out) or exc.strerror or exc})") from None
    return out


def _show(p: Path) -> str:
    """``p`` for a message, the middle cut out when it is very long."""
    s = str(p)
    return s if len(s) <= 240 else s[:100] + "..." + s[-137:]


def check_replaceable(out: Path) -> None:
    """Refuse an output path whose replacement would destroy anything but an earlier dasc plan.

    ``out`` may be absent, an empty directory, or a directory holding an earlier plan: a
    ``plan.json`` that :func:`is_dasc_plan_file` recognises, plus rendered ``dasc_kernels_*.py``
    modules (and their ``__pycache__``). Anything else (a file, a user's own ``plan.json``, an
    edited plan, a directory with other content such as the model's checkpoint, the current
    directory or one of its parents) is refused.

    Raises:
        DascInputError: naming ``out`` and why it cannot be replaced.
    """
    out = _resolve_out(out)
    if not os.path.lexists(out):
        return
    if not out.is_dir():
        raise DascInputError(f"{_show(out)}: output path exists and is not a directory; choose another --out")
    here = Path.cwd().resolve()
    target = out.resolve()
    if target == here or target in here.parents:
        raise DascInputError(f"{_show(out)}: --out must not be the current directory or one of its parents")
    try:
        entries = sorted(out.iterdir())
    except OSError as exc:
        raise DascInputError(f"{_show(out)}: cannot list the output directory ({exc.strerror or exc})") from None
    if not entries:
        return
    plan_file = out / PLAN_FILENAME
    others = sorted(p.name for p in entries if p != plan_file and not _is_plan_companion(p))
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise DascInputError(
            f"{_show(out)}: output directory exists and holds more than a dasc plan ({shown}); "
            f"choose another --out or remove it")
    ok, why = is_dasc_plan_file(plan_file) if os.path.lexists(plan_file) else (False, f"no {PLAN_FILENAME}")
    if not ok:
        raise DascInputError(
            f"{_show(out)}: output directory exists but does not hold a plan written by dasc ({PLAN_FILENAME}: {why}); "
            f"choose another --out or remove it")


def recover_out(out: Path) -> None:
    """Undo an interrupted earlier replacement of ``out`` (:func:`dasc_compile.atomic.recover`).

    A replacement that died between its two renames left the earlier plan aside: it is put back,
    so ``out`` holds it again whatever this run then does. ``dasc compile`` calls this first.

    Raises:
        DascInputError: the earlier plan cannot be put back; ``out`` is not a usable path.
    """
    try:
        atomic.recover(_resolve_out(out))
    except OSError as exc:
        raise DascInputError(f"{_show(out)}: cannot restore the plan an interrupted run moved aside "
                             f"({exc.strerror or exc})") from None


def prepare_out(out: Path) -> Path:
    """Make ``out`` ready to receive a plan: undo an interrupted earlier replacement, then check it.

    Called at the start of ``dasc compile`` (before any checkpoint is read) and again when writing.
    A replacement that died between its two renames (:mod:`dasc_compile.atomic`, fallback path) left
    the earlier plan aside: it is put back first, so ``out`` holds it again even if this run fails.

    Returns:
        the path the plan will be written to (``out``, or the directory a symbolic link points to).
    Raises:
        DascInputError: as :func:`check_replaceable`, or the earlier plan cannot be put back.
    """
    recover_out(out)
    check_replaceable(out)
    return _resolve_out(out)


def write_plan_dir(plan: Plan, out_dir: str | Path, files: dict[str, str] | None = None) -> Path:
    """Write ``plan`` (its content hash must be set) and ``files`` (name -> text) into ``out_dir``.

    First :func:`prepare_out` (undo an interrupted earlier replacement, check that ``out_dir`` may be
    replaced). The directory is
    assembled under a temporary name beside ``out_dir`` (``plan.json`` last, each file fsynced) and
    moved into place atomically. A symbolic link ``out_dir`` is followed: the directory it points
    to is replaced. Returns the final directory.

    Raises:
        DascInputError: ``out_dir`` may not be replaced, or cannot be written (no space, read-only,
            permissions, name too long); nothing is left behind and an earlier plan is kept.
    """
    out = prepare_out(Path(out_dir))
    try:
        tmp = atomic.staging_dir(out)
    except OSError as exc:
        what = "replace the plan in this directory" if (out / PLAN_FILENAME).is_file() else "create the plan directory"
        raise DascInputError(f"{_show(out)}: cannot {what} "
                             f"({atomic.not_a_folder(out) or exc.strerror or exc})") from None

    def write(d: Path) -> None:
        for name, text in [*(files or {}).items(), (PLAN_FILENAME, canonical_json(plan))]:
            with open(d / name, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())

    atomic.fill_and_place(tmp, out, write,
                          lambda why: f"{_show(out)}: cannot write the plan ({why}); nothing was changed")
    return out
