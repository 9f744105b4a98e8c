"""benchmarks/h200/chat_bench.sh's arms: UP_ARMS (the servers a call brings up) must hold every arm the call
measures (ARMS); a call that would measure an arm with no server is refused before anything starts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    out = tmp_path / "out"
    full = {**os.environ, "OUT": str(out), **env}
    return subprocess.run(["bash", "benchmarks/h200/chat_bench.sh"], cwd=REPO, env=full, capture_output=True,
                          text=True, timeout=60)


def test_up_arms_without_a_measured_arm_is_refused_in_one_line(tmp_path):
    p = run(tmp_path, ARMS="dense dasc-nr-w16", UP_ARMS="dense dasc-wr-w16")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert lines == ["error: UP_ARMS 'dense dasc-wr-w16' lacks 'dasc-nr-w16' of ARMS: expected every measured arm "
                     "among the servers to start"]
    assert not (tmp_path / "out").exists()      # refused before $OUT is made: no run.log, nothing started
    assert not p.stdout


def test_an_arm_name_that_only_contains_another_is_not_taken_for_it(tmp_path):
    # "dasc-nr-w16" is a prefix of "dasc-nr-w16-int8": a substring match would let the call through
    p = run(tmp_path, ARMS="dasc-nr-w16", UP_ARMS="dense dasc-nr-w16-int8")
    assert p.returncode == 2 and "lacks 'dasc-nr-w16' of ARMS" in p.stderr


def test_up_arms_split_by_tabs_and_newlines_like_arms(tmp_path):
    # words, whatever the white space: the tab-separated UP_ARMS holds 'dense', and only the arm it lacks is named
    p = run(tmp_path, ARMS="dense bogus", UP_ARMS="dense\tdasc-nr-w16\n")
    assert p.returncode == 2
    assert p.stderr.strip() == ("error: UP_ARMS 'dense dasc-nr-w16' lacks 'bogus' of ARMS: expected every measured "
                                "arm among the servers to start")
