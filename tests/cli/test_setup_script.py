"""scripts/setup_env.sh refuses arguments it cannot use in one usage line, before it creates anything."""

from __future__ import annotations

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
