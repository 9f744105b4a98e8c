"""The argument parser of the benchmark scripts: a refusal is one ``error:`` line and exit status 2.

argparse prints its usage block before the error; the project's rule for bad input is one line naming the
flag and what was expected (``dasc`` itself does the same through typer), so scripts parse with
:class:`OneLineParser`, and the value checks they share (:func:`int_at_least`, :func:`number_above_zero`,
:func:`fraction`, :func:`open_fraction`, :func:`nonempty`, :func:`path_named`) live here too, with the two
refusals the training scripts share (:func:`refuse_unusable_device`, :func:`refuse_unusable_record`) and the
report tools' ``--out`` rules (:func:`refuse_to_replace`, :func:`check_out_file`, :func:`write_out_file`).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose :meth:`error` prints ``error: <message>`` alone and exits 2 (as
    ``dasc_runtime.one_line_parser``'s, which these scripts cannot import: on a device machine they run from a bare
    checkout, where the runtime folder is not the ``dasc_runtime`` package). It takes no abbreviated flag: ``--over``
    is refused, not read as ``--overwrite``."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):          # noqa: D102 (argparse's hook)
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)


def int_at_least(least: int):
    """argparse ``type``: an integer of at least ``least`` (else ``expected an integer of at least N``)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = least - 1
        if n < least:
            raise argparse.ArgumentTypeError(f"expected an integer of at least {least}, got {text!r}")
        return n
    return parse


def number_above_zero(unit: str, *, zero: bool = False):
    """argparse ``type``: a finite number above 0 (at least 0 with ``zero``), in ``unit`` (named in the refusal:
    "a number of {unit}", or "a {unit}" when ``unit`` starts with "a " or "an ", e.g. "a learning rate")."""
    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            x = math.nan
        if not (math.isfinite(x) and (x >= 0 if zero else x > 0)):
            what = unit if unit.startswith(("a ", "an ")) else f"a number of {unit}"
            raise argparse.ArgumentTypeError(f"expected {what} {'of at least 0' if zero else 'above 0'}, got {text!r}")
        return x
    return parse


def fraction(text: str) -> float:
    """argparse ``type``: a finite number in [0, 1] (else ``expected a fraction in [0, 1]``)."""
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not 0.0 <= x <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {text!r}")
    return x


def open_fraction(text: str) -> float:
    """argparse ``type``: a number strictly between 0 and 1 (else ``expected a fraction in (0, 1)``)."""
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not 0.0 < x < 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1), got {text!r}")
    return x


def path_named(what: str):
    """argparse ``type``: a path given by a non-blank string (``''`` is the current folder to ``Path``, so an
    empty ``--out`` wrote there): else ``expected WHAT, got ''``."""
    text_of = nonempty(what)
    return lambda text: Path(text_of(text))


def refuse_unusable_device(ap: OneLineParser, device: str) -> None:
    """``ap.error`` (one line, exit 2) for a ``--device`` torch cannot use here: ``dasc eval``'s rule,
    :func:`dasc_compile.eval.inputs.check_device` (meta, mps / xpu / CUDA this machine lacks, a malformed name)."""
    from dasc_compile.errors import DascInputError
    from dasc_compile.eval.inputs import check_device

    try:
        check_device(device)
    except DascInputError as exc:
        ap.error(str(exc))


def refuse_unusable_record(ap: OneLineParser, flag: str, path: Path, example: str) -> None:
    """``ap.error`` for an output file that cannot be a new record: a folder, an existing file (a record is never
    written over), or a path whose folder does not exist."""
    if path.is_dir():
        ap.error(f"{flag} {path}: a folder; give a file name such as {example}")
    if path.exists():
        ap.error(f"{flag} {path}: exists; give a new file name (a record is never written over)")
    if not path.absolute().parent.is_dir():
        ap.error(f"{flag} {path}: its folder {path.absolute().parent} does not exist")


def nonempty(what: str):
    """argparse ``type``: a string with a non-blank character (else ``expected WHAT, got ''``)."""
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return text
    return parse


def refuse_to_replace(out: Path, paths: list, overwrite: bool) -> None:
    """Refuse, before any work, to replace output files that exist (a re-run of a note's command would otherwise
    rewrite the committed results it means to check) unless ``--overwrite`` was given. ``out`` is the ``--out``
    as given: a file (then ``paths`` is ``[out]``) or a folder whose ``paths`` are the files it would write.

    Raises:
        DascInputError: ``--out <out>: the file exists ...`` or ``--out <out>: already holds <names> ...``.
    """
    from dasc_compile.errors import DascInputError

    there = [p.name for p in paths if Path(p).is_file()]
    if there and not overwrite:
        if out in paths:
            raise DascInputError(f"--out {out}: the file exists (an earlier result); give a new file name, or "
                                 f"--overwrite to replace it")
        raise DascInputError(f"--out {out}: already holds {' and '.join(there)} (an earlier report); give a new "
                             f"folder, or --overwrite to replace {'it' if len(there) == 1 else 'them'}")


def check_out_file(out: Path, overwrite: bool) -> None:
    """Before any work: ``--out`` names a file in an existing folder, and an existing one is replaced only with
    ``--overwrite`` (:func:`refuse_to_replace`).

    Raises:
        DascInputError: ``--out <out>: expected a file name in an existing folder ...`` or the refusal to replace.
    """
    from dasc_compile.errors import DascInputError

    if out.is_dir() or not out.parent.is_dir():
        raise DascInputError(f"--out {out}: expected a file name in an existing folder for the table")
    refuse_to_replace(out, [out], overwrite)


def write_out_file(out: Path, text: str) -> None:
    """Write the table ``text`` to ``--out``.

    Raises:
        DascInputError: ``--out <out>: cannot write the table there (<why>)``.
    """
    from dasc_compile.errors import DascInputError

    try:
        out.write_text(text)
    except OSError as e:
        raise DascInputError(f"--out {out}: cannot write the table there ({e.strerror or type(e).__name__})") from None
