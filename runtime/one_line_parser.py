"""``argparse`` for dasc's ``python -m`` tools: a bad flag or value is one ``error:`` line and exit status 2.

argparse prints its usage block above the error; the project's rule for bad input is one line naming the flag
and what was expected (``dasc`` itself does the same through typer). The package's tools
(``python -m dasc_runtime.sizing``, ``dasc_compile.calibrated``, ``dasc_compile.refckpt``) parse with
:class:`OneLineParser`; ``--help`` is unchanged. It lives in the runtime, which may import no compiler module but
the schema (tests/architecture/test_runtime_imports.py), so that both sides can use it. The benchmark scripts keep
the same class in ``benchmarks/cli_args.py``: they run on device machines from a bare checkout, where the runtime
folder is not importable as ``dasc_runtime``.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["OneLineParser", "int_in", "out_path"]


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose :meth:`error` prints ``error: <message>`` alone and exits 2, and which
    takes no abbreviated flag (``--over`` is not ``--overwrite``: a flag is spelled out or refused)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):          # noqa: D102 (argparse's hook)
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def int_in(least: int, most: int):
    """argparse ``type``: an integer in ``[least, most]`` (else ``expected an integer >= least and <= most``)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or not least <= n <= most:
            raise argparse.ArgumentTypeError(f"expected an integer >= {least} and <= {most}, got {text!r}")
        return n
    return parse


def out_path(text: str):
    """argparse ``type``: a non-empty output path (an empty one would write into the current directory)."""
    from pathlib import Path

    if not text.strip():
        raise argparse.ArgumentTypeError("expected an output directory, got ''")
    return Path(text)
