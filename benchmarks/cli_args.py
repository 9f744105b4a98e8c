"""The argument parser of the benchmark scripts: a refusal is one ``error:`` line and exit status 2.

argparse prints its usage block before the error; the project's rule for bad input is one line naming the
flag and what was expected (``dasc`` itself does the same through typer), so scripts parse with
:class:`OneLineParser`.
"""

from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose :meth:`error` prints ``error: <message>`` alone and exits 2."""

    def error(self, message: str):          # noqa: D102 (argparse's hook)
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)
