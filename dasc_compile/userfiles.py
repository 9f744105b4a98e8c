"""Reading files a user points dasc at (config.json, index, policy) without hanging or crashing, and checking
the output files a user names (``--json``, ``--plot``) before any work.

Each reader opens the path without blocking (``O_NONBLOCK``: a FIFO or a device never stalls the
process), requires a regular file of bounded size, and turns every OS / decoding / parsing problem,
including JSON nested deeper than Python can parse and integers with more digits than Python
converts, into one :class:`DascInputError` line naming the file and what was expected.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from dasc_compile.errors import DascInputError

__all__ = ["MAX_JSON_DEPTH", "check_output_folder", "load_json_file", "path_text", "read_user_bytes",
           "refuse_foreign_output", "require_regular_file"]

#: Deepest nesting accepted in a JSON file dasc reads (real configs nest 3-4 levels).
MAX_JSON_DEPTH = 64

_KINDS = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


def path_text(text: str) -> Path:
    """The ``parser`` of every path option and argument of the CLI: ``Path(text)``. An empty or blank string is
    refused (``Path("")`` is the current folder, so ``--out ''`` named ``.`` and ``dasc inspect ''`` looked for
    ``plan.json`` there).

    Raises:
        typer.BadParameter: ``text`` is blank (reported as one ``Invalid value for '--out'`` line).
    """
    if not str(text).strip():
        import typer

        raise typer.BadParameter(f"expected a path, got {text!r}")
    return Path(text)


def _not_regular(path: Path, what: str, mode: int) -> DascInputError:
    kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
    return DascInputError(f"{path}: {what} is {kind}; expected a regular file")


def require_regular_file(path: Path, what: str) -> os.stat_result:
    """``os.stat`` of ``path``, which must be a regular file (symbolic links are followed).

    Raises:
        DascInputError: missing, unreadable, or a directory / FIFO / device / socket.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise DascInputError(f"{path}: {what} not found") from None
    except OSError as exc:
        raise DascInputError(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, what, st.st_mode)
    return st


def read_user_bytes(path: str | Path, what: str, max_bytes: int) -> bytes:
    """All bytes of the regular file ``path`` (at most ``max_bytes``), opened without blocking.

    Raises:
        DascInputError: missing, unreadable, not a regular file, or larger than ``max_bytes``.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise DascInputError(f"{p}: {what} not found") from None
    except IsADirectoryError:
        raise DascInputError(f"{p}: {what} is a directory; expected a regular file") from None
    except OSError as exc:
        raise DascInputError(f"{p}: cannot read {what} ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(p, what, st.st_mode)
        if st.st_size > max_bytes:
            raise DascInputError(f"{p}: {what} is {st.st_size} bytes; expected at most {max_bytes}")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise DascInputError(f"{p}: cannot read {what} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise DascInputError(f"{p}: {what} is larger than {max_bytes} bytes")
    return data


def _depth(obj: Any) -> int:
    """Nesting depth of a parsed JSON value (iterative: no recursion limit)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict):
            deepest = max(deepest, d)
            stack.extend((v, d + 1) for v in o.values())
        elif isinstance(o, list):
            deepest = max(deepest, d)
            stack.extend((v, d + 1) for v in o)
    return deepest


def load_json_file(path: str | Path, what: str, max_bytes: int = 64 * 2**20, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse the JSON file ``path`` (UTF-8, at most ``max_bytes``, nested at most ``max_depth`` levels).

    Raises:
        DascInputError: as :func:`read_user_bytes`; not UTF-8; not valid JSON (with line and column);
            nested too deeply; a number Python cannot convert.
    """
    p = Path(path)
    raw = read_user_bytes(p, what, max_bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DascInputError(f"{p}: {what} is not UTF-8 text (byte {exc.start} is 0x{raw[exc.start]:02x}); "
                             f"expected a JSON file") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DascInputError(f"{p}: {what} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise DascInputError(f"{p}: {what} is nested too deeply to parse; expected at most {max_depth} levels") from None
    except ValueError as exc:   # e.g. an integer with more digits than Python converts
        raise DascInputError(f"{p}: {what} is not valid JSON ({str(exc)[:120]})") from None
    depth = _depth(obj)
    if depth > max_depth:
        raise DascInputError(f"{p}: {what} is nested {depth} levels deep; expected at most {max_depth}")
    return obj


#: How the start of each kind of file dasc writes looks (the first bytes after any whitespace).
_OUTPUT_STARTS = {"JSON file": (b"{", b"["), "PNG image": (b"\x89PNG\r\n\x1a\n",)}


def refuse_foreign_output(path: str | Path, kind: str, marker: str | None = None) -> None:
    """Refuse to replace anything at ``path`` but a missing, empty or earlier output file: a ``kind`` file
    (``"JSON file"`` or ``"PNG image"``) and, with ``marker``, a JSON object holding that key (what the
    command itself wrote). ``--json r.json`` run again replaces its earlier result; ``--json notes.md``,
    ``--json config.json`` or ``--json /dev/null`` is a slip, and dasc writes by replacing the file, so a
    symbolic link, a device or a FIFO would be replaced by a regular file. Unreadable paths pass (the write
    reports its own errors).

    Raises:
        DascInputError: naming the path, what it holds and what to do.
    """
    path = Path(path)
    try:
        st = path.lstat()
    except OSError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise DascInputError(f"{path}: is a symbolic link; dasc writes its {kind} by replacing the file, which would "
                             f"replace the link: give the path it points to, or another one")
    if stat.S_ISDIR(st.st_mode):
        raise DascInputError(f"{path}: is a folder; give a file name for the output")
    if not stat.S_ISREG(st.st_mode):
        raise DascInputError(f"{path}: exists and is {_KINDS.get(stat.S_IFMT(st.st_mode), 'not a regular file')}; "
                             f"dasc writes its {kind} by replacing the file: give the path of a regular file")
    if st.st_size == 0:
        return
    try:
        with open(path, "rb") as fh:
            data = fh.read() if marker else fh.read(64)
    except OSError:
        return
    what = None if data.lstrip().startswith(_OUTPUT_STARTS[kind]) else f"a {kind}"
    if what is None and marker:
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        if not (isinstance(doc, dict) and marker in doc):
            what = f"an earlier result of this command (a JSON object with '{marker}')"
    if what is not None:
        raise DascInputError(f"{path}: exists and is not {what}; dasc would overwrite it: give another path "
                             f"or remove the file first")


def check_output_folder(out: str | Path) -> None:
    """Refuse, before any work, an output file path (``--json``, ``--plot``) whose folder is missing, not a
    folder, or not writable. Writability is tried with a real temporary file (created and removed), as the write
    will do: ``os.access`` says yes to root on a read-only mount or in /proc and /sys, which was found only after
    the work had run.

    Raises:
        DascInputError: naming the path and what is wrong.
    """
    import tempfile

    out = Path(out)
    parent = out.parent if str(out.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise DascInputError(f"{out}: {parent} is not a folder; give a path in an existing folder")
    if not parent.is_dir():
        raise DascInputError(f"{out}: folder {parent} does not exist; create it or give another path")
    if out.exists() and not os.access(out, os.W_OK):
        raise DascInputError(f"{out}: not writable; give a path in a folder you can write to")
    try:        # a short name: a 255-byte output name leaves no room for a temporary name built from it
        fd, tmp = tempfile.mkstemp(prefix=".dasc-", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise DascInputError(f"{out}: cannot write there ({exc.strerror or exc}); give a path in a folder you "
                             f"can write to") from None
    os.close(fd)
    os.unlink(tmp)
