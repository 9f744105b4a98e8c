"""scripts/setup_env.sh refuses arguments it cannot use in one usage line, before it creates anything."""

from __future__ import annotations

import os
import subprocess
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


OLD_PYTHON = Path("/root/.pyenv/versions/3.10.13/bin/python3")      # pyenv's 3.10 on these machines, if there


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
