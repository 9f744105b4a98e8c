"""benchmarks/h200/park.py in a throw-away git repository: parking deletes tracked files and records them,
refuses (one line, nothing changed) paths that are untracked or have uncommitted changes, ``status`` adds up
what a device call no longer sends, ``restore`` gives back the committed bytes; the size checks of
``prepare stage`` do not count parked files, and its commit stamp is not made dirty by them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.h200 import park as P

ROOT = Path(__file__).resolve().parents[2]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    r = tmp_path / "repo"
    (r / "plans" / "reference" / "big").mkdir(parents=True)
    (r / "plans" / "reference" / "small").mkdir(parents=True)
    (r / "plans" / "reference" / "big" / "model-00001-of-00002.safetensors").write_bytes(b"a" * 3 * 2 ** 20)
    (r / "plans" / "reference" / "big" / "model-00002-of-00002.safetensors").write_bytes(b"b" * 2 ** 20)
    (r / "plans" / "reference" / "big" / "config.json").write_text("{}\n")
    (r / "plans" / "reference" / "small" / "config.json").write_text('{"x": 1}\n')
    (r / "code.py").write_text("print(1)\n")
    (r / ".gitignore").write_text(".dev/\n")
    _git(r, "init", "-q")
    _git(r, "add", ".")
    _git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    monkeypatch.chdir(r)
    return r


def _run(capsys, *argv) -> tuple[int, list[str], list[str]]:
    rc = P.main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out.strip().splitlines(), cap.err.strip().splitlines()


def test_park_status_restore(repo, capsys):
    big = repo / "plans" / "reference" / "big"
    before = {p.name: p.read_bytes() for p in big.iterdir()}
    rc, out, err = _run(capsys, "park", "plans/reference/big")
    assert rc == 0 and err == [] and out[0].startswith("parked 3 files (4.00 MiB)")
    assert not big.exists() and (repo / "plans" / "reference" / "small" / "config.json").is_file()
    assert P.parked(repo) == {"plans/reference/big/config.json": 3,
                              "plans/reference/big/model-00001-of-00002.safetensors": 3 * 2 ** 20,
                              "plans/reference/big/model-00002-of-00002.safetensors": 2 ** 20}
    assert "plans/reference/big" not in _git(repo, "ls-files", "--others", "--exclude-standard")
    rc, out, _ = _run(capsys, "status")
    assert rc == 0 and out[0].startswith("3 files parked, 4.00 MiB a device call does not send")
    assert out[1] == "  plans/reference/big/: 3 files, 4.00 MiB"
    # parking again (already parked) is a no-op, and parking one more path adds to the record
    assert _run(capsys, "park", "plans/reference/big")[0] == 0 and len(P.parked(repo)) == 3
    assert _run(capsys, "park", "plans/reference/small/config.json")[0] == 0 and len(P.parked(repo)) == 4
    rc, out, err = _run(capsys, "restore")
    assert rc == 0 and out == ["restored 4 files"] and err == []
    assert {p.name: p.read_bytes() for p in big.iterdir()} == before
    assert _git(repo, "status", "--porcelain") == "" and not (repo / ".dev" / "parked.txt").exists()
    assert _run(capsys, "restore")[1] == ["nothing parked"] and _run(capsys, "status")[1] == ["nothing parked"]


@pytest.mark.parametrize("case", ["untracked", "missing", "edited", "staged", "untracked-inside", "deleted", "root"])
def test_park_refuses_in_one_line_and_changes_nothing(repo, capsys, case):
    big = repo / "plans" / "reference" / "big"
    arg, phrase = "plans/reference/big", "has uncommitted changes"
    if case == "untracked":
        (repo / "notes.txt").write_text("x")
        arg, phrase = "notes.txt", "not tracked by git"
    elif case == "missing":
        arg, phrase = "nope", "not tracked by git"
    elif case == "edited":
        (big / "config.json").write_text('{"edited": true}\n')
    elif case == "staged":
        (big / "config.json").write_text('{"staged": true}\n')
        _git(repo, "add", str(big / "config.json"))
    elif case == "untracked-inside":
        (big / "extra.bin").write_bytes(b"x")
    elif case == "deleted":
        (big / "config.json").unlink()
    else:
        arg, phrase = ".", "is the checkout"
    status = _git(repo, "status", "--porcelain")
    rc, out, err = _run(capsys, "park", "plans/reference/small", arg)   # the good path is not parked either
    assert rc == 2 and out == [] and len(err) == 1 and err[0].startswith("error: ") and phrase in err[0], err
    assert _git(repo, "status", "--porcelain") == status and P.parked(repo) == {}
    assert (repo / "plans" / "reference" / "small" / "config.json").is_file()


def test_restore_refuses_to_overwrite_a_different_file(repo, capsys):
    assert _run(capsys, "park", "plans/reference/big")[0] == 0
    f = repo / "plans" / "reference" / "big" / "config.json"
    f.parent.mkdir(parents=True)
    f.write_text('{"someone else": 1}\n')
    rc, _, err = _run(capsys, "restore")
    assert rc == 2 and len(err) == 1 and "plans/reference/big/config.json: parked, but a different file" in err[0]
    assert f.read_text() == '{"someone else": 1}\n' and len(P.parked(repo)) == 3
    assert "warning: 1 parked files exist again" in _run(capsys, "status")[1][-1]
    f.unlink()
    assert _run(capsys, "restore")[0] == 0 and f.read_text() == "{}\n"


def test_command_line_runs_from_a_subfolder(repo):
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    sub = repo / "plans"
    r = subprocess.run([sys.executable, "-m", "benchmarks.h200.park", "park", "reference/big"], cwd=sub, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert not (repo / "plans" / "reference" / "big").exists() and (repo / ".dev" / "parked.txt").is_file()
    r = subprocess.run([sys.executable, "-m", "benchmarks.h200.park", "restore"], cwd=sub, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "restored 3 files\n"


def test_stage_counts_only_files_that_exist_and_parking_is_not_dirt(repo):
    from benchmarks.train.prepare import _tree_bytes, commit_stamp

    full = _tree_bytes(repo)
    head = _git(repo, "rev-parse", "HEAD").strip()
    assert commit_stamp(repo) == head
    P.park(repo, [str(repo / "plans" / "reference" / "big")])
    assert full - _tree_bytes(repo) == 4 * 2 ** 20 + 3
    assert commit_stamp(repo) == head                # parked files are not a change of the code that runs
    (repo / "code.py").write_text("print(2)\n")
    assert commit_stamp(repo) == head + "+dirty"
