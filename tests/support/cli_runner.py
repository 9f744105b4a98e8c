"""The typer app run in-process through click's test runner (output merged, as a terminal shows it), and the
check most eval tests make of a refusal: exit status 2 and exactly one non-empty line."""

from __future__ import annotations

from typer.testing import CliRunner

from dasc_compile.cli import app

runner = CliRunner()


def cli(*args):
    """``dasc ARGS...`` in this process (each argument ``str()``-ed); click's ``Result``."""
    return runner.invoke(app, [str(a) for a in args])


def one_error_line(r, code: int = 2) -> str:
    """The one non-empty output line of ``r``, after checking the exit status is ``code``."""
    assert r.exit_code == code, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, r.output
    return lines[0]
