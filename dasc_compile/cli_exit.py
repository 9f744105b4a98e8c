"""How a ``dasc`` process ends: closed pipes, full disks on stdout, signals and unexpected errors.

:func:`run_guarded` runs the CLI and turns every way it can end into an exit status and at most one
line on stderr, never a traceback:

=====================================  ======================================================  ======
condition                              what the user sees                                      status
=====================================  ======================================================  ======
stdout closed early (``| head -1``)    nothing more; the work goes on to its end                the work's
stdout cannot be written (ENOSPC)      ``error: cannot write to standard output (...)``        2
bad input (:class:`DascInputError`)    ``error: <message>``                                   2
a path too long / in a link loop       ``error: <path>: cannot use this path: <why>``          2
SIGINT (Ctrl-C) / SIGTERM              ``error: interrupted (SIGINT)``                         130 / 143
anything else (a bug)                  ``error: internal error (<type>: <message>) ...``       1
=====================================  ======================================================  ======

A signal that arrives while a module is being imported is held until the import is over (an
exception thrown through a native extension's set-up, torch's among them, aborts the process).
A signal that arrives while the CLI itself starts (typer, rich and the commands are imported before
:func:`run_guarded` runs) is held by :func:`hold_signals`, which the entry points (``cli.py``,
:func:`dasc_compile.entry.main` of the console script) call first, and delivered as soon as :func:`run_guarded` starts;
only the interpreter's own start-up, before the entry point's first line, is left uncovered.

An output placed whole (a directory by :func:`dasc_compile.atomic.fill_and_place`, a PNG by
:func:`dasc_compile.figures.save_png`, eval's finished ``--json``) is recorded by :func:`note_written`; the commands
write every file before they print their summary, so if stdout then fails or a signal arrives, the ``error:`` line
goes on to say which PATHs were written completely and that only the summary was lost (``...; PATH was written
completely, only the summary was not printed``); an output still to come (:func:`note_pending`: eval's ``--plot``
after its ``--json``) is then named as not written.
The status stays 2 / 130 / 143: what was asked for on stdout was not delivered.

A closed stdout is not an error, as for other Unix filters: later output is discarded and the
exit status is the one the command would have had (0 when ``dasc compile ... | true`` wrote its plan).
Setting ``DASC_TRACEBACK=1`` prints the traceback of an internal error as well.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
import traceback
from typing import Callable

from dasc_compile.errors import DascInputError, one_line, short_text

__all__ = ["Interrupted", "StdoutGuard", "finish", "hold_signals", "note_pending", "note_written", "run_guarded"]

#: Output paths the running command has written completely (reset by each :func:`run_guarded`).
_written: list[str] = []
#: Output paths the running command is still to write before its summary (reset by each :func:`run_guarded`).
_pending: list[str] = []


def note_pending(path) -> None:
    """Record that ``path`` (a ``--plot`` PNG written after ``--json``) is still to be written before the summary.

    An ``error:`` line that follows before :func:`note_written` records it (a signal during the figure) then says
    it was not written, instead of implying that only the summary was lost.
    """
    if str(path) not in _pending:
        _pending.append(str(path))


def note_written(path) -> None:
    """Record that ``path`` (a plan or checkpoint directory, a ``--plot`` PNG, a finished ``--json`` file) is
    complete on disk.

    An ``error:`` line that follows (stdout full, SIGINT / SIGTERM) then says so instead of leaving
    the user to guess whether the output is whole.
    """
    if str(path) not in _written:
        _written.append(str(path))


def _written_note() -> str:
    # only what is still there: a plan placed inside a staging folder (sweep --out writes its plans into one and
    # moves it at the end) is gone when an interrupt removed that folder, and was never the user's output
    kept = [p for p in _written if os.path.lexists(p)]
    missing = [p for p in _pending if p not in _written]
    if not kept and not missing:
        return ""

    def names(paths):
        return paths[0] if len(paths) == 1 else f"{', '.join(paths[:-1])} and {paths[-1]}"

    written = f"{names(kept)} {'was' if len(kept) == 1 else 'were'} written completely" if kept else ""
    not_written = f"{names(missing)} {'was' if len(missing) == 1 else 'were'} not written" if missing else ""
    if not missing:
        return f"; {written}, only the summary was not printed"
    return f"; {written}, {not_written} and the summary was not printed" if kept else f"; {not_written}"


class Interrupted(BaseException):
    """SIGINT / SIGTERM arrived (raised by the handlers :func:`run_guarded` installs).

    A ``BaseException`` so that ``except Exception`` blocks do not swallow it, and not a
    ``KeyboardInterrupt`` so that typer does not turn it into a silent exit.
    """

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class _StdoutError(DascInputError):
    """Standard output cannot be written (not a closed pipe): one line, exit status 2."""


class StdoutGuard:
    """A stand-in for ``sys.stdout`` that survives a closed pipe and reports other write errors once.

    On ``BrokenPipeError`` the pipe is marked closed, the real stdout descriptor is pointed at
    ``/dev/null`` (so Python's final flush cannot fail) and later writes are discarded. Any other
    ``OSError`` (a full disk, ``/dev/full``) raises :class:`_StdoutError` once.
    """

    def __init__(self, stream):
        self._stream = stream
        self.pipe_closed = False
        self.error: OSError | None = None

    def _silence(self) -> None:
        try:
            fd = self._stream.fileno()
        except (AttributeError, OSError, ValueError):
            return
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
        except OSError:
            pass

    def _failed(self, exc: OSError):
        if isinstance(exc, BrokenPipeError):
            self.pipe_closed = True
            self._silence()
            return None
        first = self.error is None
        self.error = exc
        self._silence()
        if first:
            raise _StdoutError(_stdout_failure(exc)) from None
        return None

    def write(self, text):
        if self.pipe_closed or self.error is not None:
            return len(text)
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._failed(exc)
            return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.pipe_closed or self.error is not None:
            return
        try:
            self._stream.flush()
        except OSError as exc:
            self._failed(exc)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _last_resort_line(exc: Exception) -> str:
    """The one line for an exception nothing else caught: a package missing from the environment (an install that
    lacks a dependency dasc declares, such as matplotlib or jinja2), else an internal error, a bug in dasc."""
    missing = (getattr(exc, "name", None) or "").split(".")[0] if isinstance(exc, ModuleNotFoundError) else ""
    if missing and not missing.startswith("dasc"):      # dasc's own module missing is a bug, not an install
        return (f"error: the Python package '{missing}' is missing from this environment; reinstall dasc with its "
                f"dependencies (pip install dasc; in a checkout: bash scripts/setup_env.sh)")
    msg = short_text(str(exc).splitlines()[0] if str(exc) else "", 300)
    return (f"error: internal error ({type(exc).__name__}{': ' + msg if msg else ''}); this is a bug in dasc "
            f"(rerun with DASC_TRACEBACK=1 and report it)")


def _stdout_failure(exc: OSError) -> str:
    """What the error line says of a write to stdout that failed with ``exc`` (a full disk, ``/dev/full``)."""
    return f"cannot write to standard output ({exc.strerror or exc})"


def _say(line: str) -> None:
    try:
        sys.stderr.write(one_line(line) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


#: True while :func:`run_guarded` runs; a re-delivery (:func:`_deliver_later`) after it is dropped.
_active = False
_redelivery: threading.Timer | None = None
#: The signal a timer of :func:`_deliver_later` is due to send again (None: none due); a SIGTERM replaces a SIGINT.
_due_signum: int | None = None
#: Counts :func:`run_guarded` calls: a timer set in an earlier call sends nothing.
_run = 0
_REDELIVERY_S = 0.05
#: True once :func:`_raise_interrupted` has raised in this :func:`run_guarded`; later signals are dropped.
_interrupting = False


def _importing(frame) -> bool:
    """True when ``frame`` or a caller runs inside the import system (a module is being executed).

    An exception raised there can cross a native extension's initialisation (torch's pybind11
    module set-up calls back into Python); pybind11 cannot carry it through and aborts the process
    (``terminate called after throwing ... error_already_set``), so a signal is not raised there.
    """
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _deliver_later(signum: int) -> None:
    """Send ``signum`` to this process again in ``_REDELIVERY_S`` seconds (one delivery due at a time).

    A delivery is due from here until its timer sends the signal, not until the timer's thread ends: the handler
    that receives the signal may run while that thread is still alive, and if it lands in an import again it must
    be able to send it once more (asking whether the thread was alive lost the Ctrl-C on a loaded machine). A
    SIGTERM that comes while a SIGINT is due replaces it. The timer sends nothing once its :func:`run_guarded`
    call has ended (that call reports a delivery still due, and cancels the timer).
    """
    global _redelivery, _due_signum
    if _due_signum is not None:
        if signum == signal.SIGTERM:
            _due_signum = signum
        return
    run = _run

    def again():
        global _due_signum
        if _run != run:
            return
        sig, _due_signum = _due_signum, None
        if _active and sig is not None:
            os.kill(os.getpid(), sig)

    timer = threading.Timer(_REDELIVERY_S, again)
    timer.daemon = True
    _due_signum = signum
    try:
        timer.start()
    except BaseException:
        _due_signum = None
        raise
    _redelivery = timer


def _raise_interrupted(signum, frame):
    """Handler for SIGINT / SIGTERM: raise :class:`Interrupted`, or defer it out of an import.

    Inside an import (see :func:`_importing`) the signal is sent again a moment later, until it
    lands in ordinary Python code; Ctrl-C during ``import torch`` thus ends the command a few
    seconds later, cleanly, instead of aborting it with status -6.
    """
    global _interrupting
    if _interrupting:      # a second Ctrl-C while the first unwinds / is reported: that one ends it
        return
    if _importing(frame):
        _deliver_later(signum)
        return
    _interrupting = True
    raise Interrupted(signum)


#: Signals that arrived between :func:`hold_signals` and :func:`run_guarded` (delivered by the latter).
_held: list[int] = []


def _hold(signum, frame):
    """Start-up handler: remember the signal for :func:`run_guarded` (raising here would be a
    KeyboardInterrupt traceback, or for SIGTERM a silent death, from the middle of an import)."""
    if signum not in _held:
        _held.append(signum)


def hold_signals() -> None:
    """Hold SIGINT / SIGTERM until :func:`run_guarded` runs, which then ends the command with its
    ``error: interrupted (...)`` line. Entry points call it before importing the CLI; after
    :func:`run_guarded` returns, a late signal is ignored and the command's own status stands."""
    if threading.current_thread() is not threading.main_thread():
        return
    for s in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(s, _hold)
        except (OSError, ValueError):
            pass


def finish(rc: int):
    """Exit with ``rc``, ignoring SIGINT / SIGTERM from now on: the command is over, and Python's
    shutdown (long after importing torch) puts the default handlers back, so a late Ctrl-C killed the
    process by the signal, with no line, after its output was complete."""
    for s in (signal.SIGINT, signal.SIGTERM):
        try:
            signal.signal(s, signal.SIG_IGN)
        except (OSError, ValueError):
            pass
    sys.exit(rc)


def _unraisable(args) -> None:
    """``sys.unraisablehook`` during :func:`run_guarded`: an :class:`Interrupted` raised where Python
    cannot propagate it (a ``__del__``, a weakref or GC callback: 'Exception ignored in ...') is not
    printed but delivered again a moment later, in ordinary code; anything else goes to the old hook."""
    global _interrupting
    exc = args.exc_value
    if isinstance(exc, Interrupted):
        _interrupting = False
        _deliver_later(exc.signum)
        return
    _saved_unraisablehook(args)


_saved_unraisablehook = sys.unraisablehook


def _install_handlers() -> dict:
    if threading.current_thread() is not threading.main_thread():
        return {}
    old = {}
    for s in (signal.SIGINT, signal.SIGTERM):
        try:
            old[s] = signal.signal(s, _raise_interrupted)
        except (OSError, ValueError):
            pass
    return old


#: OS errors that say a path given on the command line cannot be used as given (ENAMETOOLONG: a name or part
#: over the file system's limit; ELOOP: a cycle of symbolic links), raised by ``Path.exists()`` and the like in
#: checks that expect a plain yes or no.
_PATH_ERRNOS = (errno.ENAMETOOLONG, errno.ELOOP)


def path_error_line(exc: OSError) -> str | None:
    """The one line (without ``error:``) for an OS error about a path the user gave, or None for any other
    OS error (which stays an internal error: it is a bug that no check caught it)."""
    if exc.errno not in _PATH_ERRNOS or exc.filename is None:
        return None
    name = os.fsdecode(exc.filename)
    shown = name if len(name) <= 120 else f"{name[:60]}...{name[-40:]} ({len(os.fsencode(name))} bytes)"
    why = ("a file name or folder name in it is longer than the file system allows (255 bytes on most)"
           if exc.errno == errno.ENAMETOOLONG else "its symbolic links form a loop")
    return f"{shown}: cannot use this path: {why}"


def run_guarded(body: Callable[[], int]) -> int:
    """Run ``body`` (the CLI; returns an exit status) and return the status to exit with.

    Installs :class:`StdoutGuard` as ``sys.stdout`` and SIGINT / SIGTERM handlers for the call,
    restores both afterwards, and flushes stdout inside the guard (so a full disk is reported
    here, not by Python at shutdown). See the module docstring for the outcomes.
    """
    guard = StdoutGuard(sys.stdout)
    saved_stdout = sys.stdout
    sys.stdout = guard
    global _active, _interrupting, _saved_unraisablehook, _run, _due_signum
    _run += 1
    _due_signum = None
    _interrupting = False
    _saved_unraisablehook, sys.unraisablehook = sys.unraisablehook, _unraisable
    old_handlers = _install_handlers()
    _written.clear()
    _pending.clear()
    _active = True
    try:
        try:
            if _held:   # a signal came while the CLI was starting (hold_signals)
                signum = _held[0]
                _held.clear()
                _interrupting = True
                raise Interrupted(signum)
            rc = body()
            guard.flush()
        except Interrupted as exc:
            _say(f"error: interrupted ({exc.name}){_written_note()}")
            rc = 128 + exc.signum
        except KeyboardInterrupt:
            _say(f"error: interrupted (SIGINT){_written_note()}")
            rc = 130
        except DascInputError as exc:
            _say(f"error: {exc}{_written_note() if isinstance(exc, _StdoutError) else ''}")
            rc = 2
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except OSError as exc:
            line = path_error_line(exc)
            if line is None:
                raise
            _say(f"error: {line}")
            rc = 2
        except MemoryError:
            _say("error: out of memory; this is a bug in dasc for inputs that passed validation "
                 "(rerun with DASC_TRACEBACK=1 and report it)")
            rc = 1
        except Exception as exc:   # last resort: one line, never a traceback
            if os.environ.get("DASC_TRACEBACK"):
                traceback.print_exc()
            _say(_last_resort_line(exc))
            rc = 1
        due = _due_signum
        if due is not None and rc == 0 and not _interrupting:   # a signal deferred out of the body's last import,
            #                                                     which ended before the signal came back
            _say(f"error: interrupted ({signal.Signals(due).name}){_written_note()}")
            rc = 128 + due
        if guard.error is not None and rc == 0:   # the failed write's error was swallowed on its way up (click's
            #                                         own probe of stdout, under `dasc --version`): say it here
            _say(f"error: {_stdout_failure(guard.error)}{_written_note()}")
            rc = 2
        return rc
    finally:
        _active = False
        if _redelivery is not None:
            _redelivery.cancel()
        _due_signum = None
        for s, h in old_handlers.items():
            signal.signal(s, h)
        sys.unraisablehook = _saved_unraisablehook
        sys.stdout = saved_stdout
