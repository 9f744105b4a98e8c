"""Leaving runs out of a report: the ``--exclude-call`` / ``--exclude-run`` / ``--baseline-run`` options and the
key an ``--exclude-run`` value is matched by (:func:`benchmarks.serving_runs.collect` applies them)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from benchmarks.cli_args import int_at_least
from dasc_compile.errors import DascInputError

__all__ = ["add_run_exclusions", "run_path", "exclusion_key"]


def add_run_exclusions(ap) -> None:
    """The ``--exclude-call`` / ``--exclude-run`` / ``--baseline-run`` options of every command that reads work folders through
    :func:`benchmarks.serving_runs.collect` (:mod:`benchmarks.serving_report`, :mod:`benchmarks.ttft_account`)."""
    ap.add_argument("--exclude-call", type=int_at_least(0), action="append", default=[],
                    help="leave out this call's runs (its index in manifest.json 'calls', in every work folder "
                         "given; repeatable), e.g. 0 for the call that started the servers")
    ap.add_argument("--exclude-run", action="append", default=[],
                    help="leave out this result file: its name under runs/ (when one work folder given holds a "
                         "run of that name) or its path WORK/runs/NAME, WORK one of the folders given, relative paths "
                         "from the current folder (e.g. /tmp/pb/chat/runs/dense__s3__served-reply__p6000__r0.2264__k1.json.gz); "
                         "repeatable. An excluded opening baseline run is replaced by the call's closing run of the "
                         "same seed")
    ap.add_argument("--baseline-run", choices=("opening", "closing"), default="opening",
                    help="which of the bracketing arm's two runs of a seed in one call counts for that seed (the arm that "
                         "opened and closed each call, chat_bench's BASELINE; not a report's --baseline): "
                         "opening (default: the call's first run, which pays what the warm-up left, e.g. compiles) "
                         "or closing (the drift run after the other arms; every counted baseline run must have one, "
                         "and the calls then have no drift figure). Report both when they differ")


def run_path(work: Path, name) -> str:
    """The key of one work folder's result file ``name`` for ``--exclude-run WORK/runs/NAME``."""
    return str((Path(work) / "runs" / str(name)).resolve())


def exclusion_key(value: str, works: Sequence[Path]) -> str:
    """An ``--exclude-run`` value as :func:`benchmarks.serving_runs.collect` matches it: a bare name as given, a path as the
    :func:`run_path` of its folder's run.

    Raises:
        DascInputError: a path that is not ``WORK/runs/NAME`` with WORK one of ``works`` (a typo in the
            middle part would otherwise leave out the run of that name in WORK silently).
    """
    if "/" not in value:
        return value
    p = Path(value).resolve()
    roots = {str(Path(w).resolve()) for w in works}
    if p.parent.name != "runs" or str(p.parent.parent) not in roots:
        raise DascInputError(f"--exclude-run {value}: expected a file name under runs/ or WORK/runs/NAME with WORK "
                             f"one of the work folders given ({', '.join(map(str, works))})")
    return str(p)
