"""Atomic placement of a finished directory (a plan, a reference checkpoint) at its final path.

Invariant: at every instant the destination path holds either the old directory or the new one,
never neither and never a mix, even when SIGINT / SIGTERM arrive or the process dies between steps.

* When the destination does not exist, one ``rename`` moves the new directory there.
* When it exists, Linux ``renameat2(RENAME_EXCHANGE)`` swaps the two directories in one step (the
  new one appears at the destination, the old one at the staging path, which is then removed).
* Where the exchange is not available (another OS, a file system without it, an old libc), the old
  directory is first renamed aside to a sibling ``.<name>.old-XXXX/dir`` and the new one renamed
  into place; a failure of the second rename moves the old one back. A crash between the two
  renames (SIGKILL, power loss) leaves the old directory aside; :func:`recover` puts it back the
  next time the destination is written.

SIGINT and SIGTERM are held back (in the main thread, through the Python signal handlers) during
the swap and delivered right after it, so Ctrl-C never lands between two renames.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import signal
import stat
import tempfile
import threading
from pathlib import Path

__all__ = ["NAME_ROOM", "aside_dirs", "check_name_room", "check_new_dir", "fill_and_place", "not_a_folder",
           "recover", "replace_dir", "signals_held", "staging_dir", "write_new_dir"]

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_ASIDE_INFIX = ".old-"
_STAGING_INFIX = ".tmp-"
_ASIDE_ENTRY = "dir"
_HELD_SIGNALS = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None)) if s)


@contextlib.contextmanager
def signals_held():
    """Hold back SIGINT / SIGTERM for the duration of the block, then deliver them once.

    Works by swapping the Python-level handlers (Python runs them in the main thread whichever
    thread the kernel picked), so it is a no-op outside the main thread. A held signal is raised
    again after the block, reaching the handler that was installed before it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum, _frame):
        pending.append(signum)

    old = {}
    try:
        for s in _HELD_SIGNALS:
            old[s] = signal.signal(s, hold)
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if pending:
            signal.raise_signal(pending[0])


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` atomically (``renameat2(RENAME_EXCHANGE)``); False where unsupported.

    Raises:
        OSError: the call is supported but failed (permissions, read-only file system, ...).
    """
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):   # not Linux / glibc < 2.28
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def staging_dir(dest: Path) -> Path:
    """Create the empty staging directory ``.<name>.tmp-<pid>-XXXX`` beside ``dest`` (same file system).

    The pid lets :func:`recover` remove staging directories whose process died (SIGKILL, power loss).

    Raises:
        OSError: the parent cannot be created or written.
    """
    parent = dest.parent if str(dest.parent) else Path(".")
    parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}{_STAGING_INFIX}{os.getpid()}-", dir=parent))


def _dead_staging_dirs(dest: Path) -> list[Path]:
    prefix = f".{dest.name}{_STAGING_INFIX}"
    out = []
    try:
        entries = list(dest.parent.iterdir())
    except OSError:
        return []
    for p in entries:
        if not p.name.startswith(prefix) or p.is_symlink() or not p.is_dir():
            continue
        pid = p.name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            out.append(p)
        except OSError:
            pass   # alive (another user's process) or unknown: leave it
    return out


def aside_dirs(dest: Path) -> list[Path]:
    """Directories that :func:`replace_dir` moved ``dest`` aside to and did not remove, newest first."""
    parent = dest.parent
    try:
        found = [p for p in parent.iterdir()
                 if p.name.startswith(f".{dest.name}{_ASIDE_INFIX}") and (p / _ASIDE_ENTRY).is_dir()]
    except OSError:
        return []
    return sorted(found, key=lambda p: p.stat().st_mtime_ns, reverse=True)


def recover(dest: Path) -> Path | None:
    """Undo an interrupted fallback replacement of ``dest``; returns the directory put back, if any.

    When ``dest`` is missing and a directory moved aside by :func:`replace_dir` exists, the newest
    one is renamed back to ``dest``. When ``dest`` exists, leftovers aside are removed. Staging
    directories (:func:`staging_dir`) of processes that no longer run are removed too.

    Raises:
        OSError: the rename back failed.
    """
    for p in _dead_staging_dirs(dest):
        shutil.rmtree(p, ignore_errors=True)
    found = aside_dirs(dest)
    if not found:
        return None
    put_back = None
    if not os.path.lexists(dest):
        with signals_held():
            os.rename(found[0] / _ASIDE_ENTRY, dest)
        put_back = found[0]
    for p in found:
        shutil.rmtree(p, ignore_errors=True)
    return put_back


def replace_dir(new: Path, dest: Path) -> None:
    """Move directory ``new`` to ``dest``; an existing ``dest`` directory is replaced and removed.

    ``new`` and ``dest`` must be on one file system (``new`` is normally a sibling of ``dest``).
    See the module docstring for the invariant and the steps.

    Raises:
        OSError: a rename failed; ``dest`` then still holds what it held before.
    """
    with signals_held():
        if not os.path.lexists(dest):
            os.rename(new, dest)
            return
        if _exchange(new, dest):
            shutil.rmtree(new, ignore_errors=True)   # ``new`` now holds the old directory
            return
        aside = Path(tempfile.mkdtemp(prefix=f".{dest.name}{_ASIDE_INFIX}", dir=dest.parent))
        os.rename(dest, aside / _ASIDE_ENTRY)
        try:
            os.rename(new, dest)
        except BaseException:
            os.rename(aside / _ASIDE_ENTRY, dest)
            os.rmdir(aside)
            raise
        shutil.rmtree(aside, ignore_errors=True)


#: Room kept in a file name for the temporary suffixes (``.<name>.tmp-<pid>-XXXXXXXX``), bytes.
NAME_ROOM = 32


def check_name_room(out: Path, show: str | None = None) -> None:
    """Refuse an ``--out`` name too long to take the temporary suffixes (:data:`NAME_ROOM`) on its file system.

    Raises:
        DascInputError: the name is longer than the file system's ``PC_NAME_MAX`` (255 where unknown) less
            :data:`NAME_ROOM` bytes; ``show`` is how ``out`` is named (default ``str(out)``).
    """
    from dasc_compile.errors import DascInputError

    name_max = 255
    try:
        name_max = os.pathconf(out.parent if str(out.parent) else ".", "PC_NAME_MAX")
    except (OSError, ValueError):
        pass
    n = len(os.fsencode(out.name))
    if n + NAME_ROOM > name_max:
        raise DascInputError(f"{show or out}: --out name is {n} bytes long; expected at most "
                             f"{name_max - NAME_ROOM} (the file system allows {name_max}, dasc adds a temporary "
                             f"suffix)")


def check_new_dir(out: Path) -> None:
    """Refuse now, creating nothing, what :func:`write_new_dir` would refuse of ``out``'s path itself: an
    existing non-empty ``out`` or one that is not a directory, a name too long (:func:`check_name_room`), a folder
    above it that is not a directory (:func:`not_a_folder`). ``dasc sweep --out`` asks before its sweep and
    ``--eval`` run, so that such a path does not cost them. A parent that cannot be written is found only when
    :func:`write_new_dir` creates its staging directory.

    Raises:
        DascInputError: one of the above, or the path cannot be read.
    """
    from dasc_compile.errors import DascInputError

    check_name_room(out)
    try:
        if os.path.lexists(out) and (not out.is_dir() or any(out.iterdir())):
            raise DascInputError(f"{out}: --out must be a new or empty directory")
    except OSError as exc:
        raise DascInputError(f"{out}: cannot use this --out path ({not_a_folder(out) or exc.strerror or exc})") \
            from None
    blocker = not_a_folder(out)
    if blocker is not None:
        raise DascInputError(f"{out}: cannot create the directory ({blocker})")


def write_new_dir(out: Path, write) -> None:
    """Run ``write(tmp)`` into a temporary sibling of ``out``, then move it to ``out`` (new or empty):
    ``dasc reference`` and ``dasc sweep --out``.

    Nothing is left behind on failure or interrupt (no ``config.json.tmp``, no half a checkpoint, no
    half the plans of a sweep).

    Raises:
        DascInputError: ``out`` exists and is not an empty directory (:func:`check_new_dir`), or cannot be
            written.
    """
    from dasc_compile.errors import DascInputError

    check_new_dir(out)
    try:
        tmp = staging_dir(out)
    except OSError as exc:
        raise DascInputError(f"{out}: cannot create the directory ({not_a_folder(out) or exc.strerror or exc})") \
            from None
    fill_and_place(tmp, out, write, lambda why: f"{out}: cannot write ({why}); nothing was written")


def not_a_folder(path: Path) -> str | None:
    """Why the first folder above ``path`` that exists as something other than a directory cannot hold it
    (``notes.txt is a file, not a directory`` for ``notes.txt/x``; a symbolic link that leads to no directory), or
    None: mkdir's own word for each is "File exists", and lstat's "Not a directory" names neither. A folder that
    cannot be examined (permissions) ends the search with None, leaving the system's reason to the caller."""
    for p in reversed(path.parents):
        try:
            st = os.lstat(p)
        except OSError:             # missing (then nothing above blocks), or not to be examined
            return None
        if os.path.isdir(p):        # a directory, or a link to one
            continue
        if stat.S_ISLNK(st.st_mode) and not os.path.exists(p):   # a link to nothing, or a loop of links
            return f"{p} is a symbolic link that leads to no directory"
        return f"{p} is a file, not a directory" if os.path.isfile(p) else f"{p} is not a directory"
    return None


def fill_and_place(tmp: Path, out: Path, write, message) -> None:
    """Run ``write(tmp)`` into the staging directory ``tmp`` (:func:`staging_dir`), make it 0755 and move
    it to ``out`` (:func:`replace_dir`); on any failure or interrupt ``tmp`` is removed and ``out`` is
    untouched. Once ``out`` is in place it is recorded (:func:`dasc_compile.cli_exit.note_written`) with
    signals still held, so an ``error: interrupted`` line that follows always says ``out`` is whole
    (CI on 2026-12-04 caught a SIGINT between the move and a later record). Used by :func:`write_new_dir`
    and ``artifact.write_plan_dir``.

    Raises:
        DascInputError: an ``OSError`` while writing or moving, as ``message(reason)`` (reason: the
            error's ``strerror``).
    """
    from dasc_compile.cli_exit import note_written
    from dasc_compile.errors import DascInputError

    try:
        write(tmp)
        os.chmod(tmp, 0o755)
        with signals_held():   # a Ctrl-C just after the move still learns that ``out`` is complete
            replace_dir(tmp, out)
            note_written(out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DascInputError(message(exc.strerror or exc)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
