"""Entry point of the installed ``dasc`` console script (``pyproject.toml``, ``[project.scripts]``).

Its own module so that SIGINT / SIGTERM are held (:func:`dasc_compile.cli_exit.hold_signals`) before the
CLI's imports (typer, rich, the commands) begin, without ``cli_exit`` importing the CLI that imports it.
``cli.py`` at the repository root does the same for ``python cli.py``.
"""

from dasc_compile.cli_exit import finish, hold_signals

__all__ = ["main"]


def main() -> None:
    """Hold signals, import and run the CLI, exit with its status (a signal after the command ignored)."""
    hold_signals()
    from dasc_compile.cli import run

    finish(run())
