"""The rich consoles every ``dasc`` command prints through.

One rule lives here: a console never rewrites text. Rich replaces ``:name:`` codes with emoji by default, so a
path or flag value such as ``retrieval:abc`` or ``x:cat:y.dasc`` echoed in an ``error:`` or ``wrote`` line would
print as something the user never typed; every console is made with emoji replacement off. (Markup is turned
off where user text is printed, ``print(..., markup=False)``, as before.)
"""

from __future__ import annotations

from rich.console import Console


def console(**kwargs) -> Console:
    """A :class:`rich.console.Console` with ``emoji=False``; other keyword arguments as rich's (``stderr``,
    ``highlight``, ``soft_wrap``, ``width``)."""
    return Console(emoji=False, **kwargs)


def progress_bar(con: Console, enabled: bool = True):
    """A transient :class:`rich.progress.Progress` on ``con`` (stderr), drawn only when its stream is a terminal:
    piped or redirected, rich still writes an empty line when the bar stops, which then stood before the
    command's ``error:`` line or alone in a log. The stream itself is asked, not rich's ``is_terminal``, which
    ``FORCE_COLOR`` (set by many CI systems) turns true for a file: the log then held the bar's frames.
    A bar that is not drawn is never started or stopped (a context that only hands it over): before rich 14.3,
    stopping a disabled bar still wrote that empty line."""
    from contextlib import nullcontext

    from rich.progress import Progress

    try:
        tty = con.file.isatty()
    except (AttributeError, ValueError, OSError):
        tty = False
    drawn = enabled and tty and con.is_terminal
    bar = Progress(console=con, transient=True, disable=not drawn)
    return bar if drawn else nullcontext(bar)


def counted(n: int, noun: str) -> str:
    """``"1 prompt"`` / ``"2 prompts"`` / ``"1,000 prompts"``: a count (thousands separated) with its noun in the
    right number (plural: ``noun + "s"``)."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"
