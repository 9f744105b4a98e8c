"""scripts/setup_env.sh refuses arguments it cannot use in one usage line, before it creates anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args, said", [(["--newest"], "VENV_DIR comes first"), (["--newst"], "VENV_DIR comes first"),
                                        (["{d}", "--newst"], "(got '--newst')"), (["{d}", "--newest", "x"], "(got 3 arguments)")])
def test_bad_arguments_are_one_usage_line(tmp_path, args, said):
    """A fresh user's `setup_env.sh --newest` (the flag without the folder) ended in Python venv's own 4-line usage."""
    venv = tmp_path / "env"
    r = subprocess.run(["bash", str(ROOT / "scripts" / "setup_env.sh"), *[a.format(d=venv) for a in args]],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("usage: bash scripts/setup_env.sh [VENV_DIR] [--newest] (")
    assert said in lines[0] and not venv.exists()


OLD_PYTHON = next(iter(sorted(Path.home().glob(".pyenv/versions/3.10.*/bin/python3.10"))),
                  Path("/nonexistent/python3.10"))                  # pyenv's 3.10 on these machines, if there


@pytest.mark.parametrize("python, said", [
    ("no-such-python", "error: PYTHON=no-such-python does not run here as a Python"),
    ("/bin/true", "error: PYTHON=/bin/true does not run here as a Python"),       # runs, exits 0, prints nothing
    pytest.param(str(OLD_PYTHON), "dasc needs Python >= 3.11, < 3.14 (pyproject's requires-python)",
                 marks=pytest.mark.skipif(not OLD_PYTHON.exists(), reason="no Python 3.10 on this machine")),
])
def test_a_python_that_cannot_build_the_environment_is_one_line(tmp_path, python, said):
    """PYTHON= names the environment's interpreter; one that does not run, is no Python, or lies outside
    pyproject's requires-python is refused in one line, exit status 2, before the environment's folder exists
    (`/bin/true` passed a bare `-c pass` check and the script died later on a missing venv python)."""
    venv = tmp_path / "env"
    r = subprocess.run(["bash", str(ROOT / "scripts" / "setup_env.sh"), str(venv)], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHON": python})
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and said in lines[0], lines
    assert not venv.exists()


def test_an_environment_whose_python_no_longer_runs_is_rebuilt(tmp_path):
    """An environment built by this script whose python points to a release pyenv removed kept its marker and was
    reused: the script died on its missing python (exit 127). It is rebuilt from empty (``venv --clear``); the stub
    interpreter here answers version checks as the real one and stops at the rebuild."""
    venv = tmp_path / "env"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(tmp_path / "removed-python")      # dangling
    (venv / ".dasc-env-v3").touch()
    stub = tmp_path / "python-stub"
    stub.write_text(f'#!/bin/bash\nif [ "$1" = -m ]; then echo "stub: $*" >&2; exit 3; fi\nexec {sys.executable} "$@"\n')
    stub.chmod(0o755)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "setup_env.sh"), str(venv)], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "PYTHON": str(stub)})
    assert r.returncode == 3, r.stderr
    assert f"note: {venv}'s python no longer runs: rebuilding it on Python" in r.stderr
    assert f"stub: -m venv --clear {venv}" in r.stderr
