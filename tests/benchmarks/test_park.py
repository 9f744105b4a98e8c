"""benchmarks/h200/park.py in a throw-away git repository: parking deletes tracked files and records them,
refuses (one line, nothing changed) paths that are untracked or have uncommitted changes, ``status`` adds up
what a device call no longer sends, ``restore`` gives back the committed bytes; the size checks of
``prepare stage`` do not count parked files, and its commit stamp is not made dirty by them."""

from __future__ import annotations

import os
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
    assert rc == 0 and err == [] and out == ["3 files parked, 4.00 MiB a device call does not send "
                                             "(restore: python -m benchmarks.h200.park restore)"]
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
    rc, out, _ = _run(capsys, "park", "plans/reference/small/config.json")
    assert rc == 0 and len(P.parked(repo)) == 4 and out[0].startswith("parked 1 more files (0.00 MiB); in all 4 files parked")
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
        arg, phrase = "nope", f"nope: does not exist (relative to {repo})"
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


def test_stamp_ignores_parked_names_git_would_quote_and_refuses_a_broken_record(repo):
    """git status without -z quotes names with spaces or non-ASCII, so they did not match the record."""
    from benchmarks.train.prepare import StageError, commit_stamp

    odd = repo / "plans" / "reference" / "a b é.txt"
    odd.write_text("x\n")
    _commit(repo, "plans/reference/a b é.txt")
    head = _git(repo, "rev-parse", "HEAD").strip()
    P.park(repo, [str(odd)])
    assert not odd.exists() and commit_stamp(repo) == head
    (repo / ".dev" / "parked.txt").write_text("not a record\n")
    with pytest.raises(StageError, match="parked.txt line"):
        commit_stamp(repo)


def _commit(repo: Path, *paths: str) -> None:
    _git(repo, "add", "--", *paths)
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "more")


def test_files_checked_out_by_hand_are_parked_again(repo, capsys):
    big = repo / "plans" / "reference" / "big"
    assert _run(capsys, "park", "plans/reference/big")[0] == 0
    record = (repo / ".dev" / "parked.txt").read_bytes()
    _git(repo, "checkout", "--", "plans/reference/big")              # the record is stale now
    rc, out, _ = _run(capsys, "status")
    assert out[0].startswith("0 files parked, 0.00 MiB") and out[-1].startswith("warning: 3 parked files exist")
    rc, out, err = _run(capsys, "park", "plans/reference/big")
    assert rc == 0 and err == [] and out[0].startswith("3 files parked, 4.00 MiB"), out
    assert not big.exists() and (repo / ".dev" / "parked.txt").read_bytes() == record   # no duplicate lines
    assert _run(capsys, "restore")[1] == ["restored 3 files"] and _git(repo, "status", "--porcelain") == ""


@pytest.mark.parametrize("flag", ["assume-unchanged", "skip-worktree", "neither"])
def test_edits_git_status_does_not_show_are_not_lost(repo, capsys, flag):
    f = repo / "plans" / "reference" / "big" / "config.json"
    if flag == "neither":             # an edit of the same size and mtime, ctime not trusted: only the hash sees it
        _git(repo, "config", "core.trustctime", "false")
        os.utime(f, (1_600_000_000, 1_600_000_000))
        _git(repo, "update-index", "--refresh")
    else:
        _git(repo, "update-index", f"--{flag}", "--", str(f))
    f.write_text("[]\n")
    os.utime(f, (1_600_000_000, 1_600_000_000))
    assert _git(repo, "status", "--porcelain") == ""                  # git status is blind to the edit
    rc, out, err = _run(capsys, "park", "plans/reference/big")
    phrase = f"is marked {flag}" if flag != "neither" else "config.json differs from the index"
    assert rc == 2 and out == [] and len(err) == 1 and phrase in err[0], err
    assert f.read_text() == "[]\n" and P.parked(repo) == {} and len(list(f.parent.iterdir())) == 3


def test_a_file_that_cannot_be_deleted_puts_everything_back(repo, capsys, monkeypatch):
    assert _run(capsys, "park", "plans/reference/small")[0] == 0
    record = (repo / ".dev" / "parked.txt").read_bytes()
    big = repo / "plans" / "reference" / "big"
    before = {p.name: p.read_bytes() for p in big.iterdir()}
    unlink = Path.unlink

    def refuse(self, *a, **k):
        if self.name == "model-00001-of-00002.safetensors":
            raise PermissionError(13, "Permission denied", str(self))
        return unlink(self, *a, **k)

    monkeypatch.setattr(Path, "unlink", refuse)
    rc, out, err = _run(capsys, "park", "plans/reference/big")
    assert rc == 2 and out == [] and len(err) == 1, err
    assert "model-00001-of-00002.safetensors: cannot be deleted (Permission denied)" in err[0]
    assert "the 1 files deleted before it are checked out again" in err[0]
    assert {p.name: p.read_bytes() for p in big.iterdir()} == before
    assert (repo / ".dev" / "parked.txt").read_bytes() == record
    assert _git(repo, "status", "--porcelain") == " D plans/reference/small/config.json\n"


@pytest.mark.parametrize("name", ["a\nb", "a\rb"])
def test_names_with_line_breaks_are_refused(repo, capsys, name):
    (repo / "odd").mkdir()
    (repo / "odd" / name).write_text("x")
    (repo / "odd" / "plain").write_text("y")
    _commit(repo, "odd")
    rc, out, err = _run(capsys, "park", "odd")
    assert rc == 2 and out == [] and len(err) == 1, err
    assert "a name with a line break" in err[0] and repr("odd/" + name) in err[0]
    assert (repo / "odd" / name).is_file() and P.parked(repo) == {}


def test_record_header_quotes_the_paths(repo, capsys):
    d = repo / "plans" / "mod èle\tx"
    d.mkdir()
    (d / "w.bin").write_bytes(b"w")
    _commit(repo, str(d))
    assert _run(capsys, "park", str(d))[0] == 0
    lines = (repo / ".dev" / "parked.txt").read_text().splitlines()
    assert len(lines) == 2 and lines[0].endswith(': "plans/mod \\u00e8le\\tx"')
    assert lines[1] == "1\tplans/mod èle\tx/w.bin"
    assert P.parked(repo) == {"plans/mod èle\tx/w.bin": 1}


@pytest.mark.parametrize("record, phrase", [
    ("# parked\n12\tcode.py\nno tab here\n", ".dev/parked.txt line 3: expected SIZE<TAB>PATH"),
    ("twelve\tcode.py\n", ".dev/parked.txt line 1: expected SIZE<TAB>PATH"),
    ("12\t/etc/passwd\n", ".dev/parked.txt line 1: expected SIZE<TAB>PATH"),
    (None, ".dev/parked.txt: is not a file")])
@pytest.mark.parametrize("cmd", ["status", "restore", "park"])
def test_a_malformed_record_is_one_line(repo, capsys, record, phrase, cmd):
    rec = repo / ".dev" / "parked.txt"
    rec.parent.mkdir()
    rec.mkdir() if record is None else rec.write_text(record)
    rc, out, err = _run(capsys, cmd, *(["plans/reference/big"] if cmd == "park" else []))
    assert rc == 2 and out == [] and len(err) == 1 and err[0].startswith(f"error: {phrase}"), err
    assert _git(repo, "status", "--porcelain") == ""


def test_dev_being_a_file_is_one_line(repo, capsys):
    (repo / ".dev").write_text("not a folder\n")
    status = _git(repo, "status", "--porcelain")
    rc, out, err = _run(capsys, "park", "plans/reference/big")
    assert rc == 2 and out == [] and err[0].startswith("error: .dev: is not a folder") and len(err) == 1
    assert _git(repo, "status", "--porcelain") == status and (repo / ".dev").read_text() == "not a folder\n"


def test_a_broken_symlink_is_parked_and_restored(repo, capsys):
    link = repo / "plans" / "reference" / "big" / "latest"
    link.symlink_to("nowhere")
    _commit(repo, str(link))
    rc, out, err = _run(capsys, "park", "plans/reference/big")
    assert rc == 0 and err == [] and out[0].startswith("4 files parked"), err
    assert not os.path.lexists(link) and P.parked(repo)["plans/reference/big/latest"] == len("nowhere")
    assert _run(capsys, "restore")[1] == ["restored 4 files"] and os.readlink(link) == "nowhere"
    link.unlink()
    link.symlink_to("elsewhere")                       # a changed target is an uncommitted change
    assert _run(capsys, "park", "plans/reference/big")[0] == 2 and os.readlink(link) == "elsewhere"


def test_parked_names_with_spaces_and_non_ascii_do_not_block_parking_again(repo, capsys):
    d = repo / "plans" / "reference" / "modèle un"
    d.mkdir()
    (d / "poids é.bin").write_bytes(b"p" * 10)
    _commit(repo, str(d))
    assert _run(capsys, "park", "plans/reference")[0] == 0 and not d.exists()
    rc, out, err = _run(capsys, "park", "plans/reference")
    assert rc == 0 and err == [] and out[0].startswith("parked 0 more files (0.00 MiB); in all 5 files parked"), err
    assert _run(capsys, "restore")[1] == ["restored 5 files"] and (d / "poids é.bin").read_bytes() == b"p" * 10


def test_parking_the_current_folder_keeps_it(repo, capsys, monkeypatch):
    big = repo / "plans" / "reference" / "big"
    monkeypatch.chdir(big)
    rc, out, err = _run(capsys, "park", ".")
    assert rc == 0 and out[0].startswith("3 files parked") and err == []
    assert big.is_dir() and list(big.iterdir()) == []             # the shell's current folder stays
    assert _run(capsys, "status")[0] == 0 and _run(capsys, "restore")[1] == ["restored 3 files"]


@pytest.mark.parametrize("cmd", [["status"], ["restore"], ["park", "x"]])
def test_a_vanished_current_folder_is_one_line(repo, capsys, monkeypatch, cmd):
    gone = repo / "plans" / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    rc, out, err = _run(capsys, *cmd)
    assert rc == 2 and out == [] and err == ["error: the current directory no longer exists; cd into the checkout"]


@pytest.mark.parametrize("case", ["dotdot-name", "through-a-symlink", "outside", "absolute-elsewhere"])
def test_paths_that_look_outside_but_are_not(repo, capsys, tmp_path, case):
    if case == "dotdot-name":
        (repo / "..notes").write_text("n\n")
        _commit(repo, "..notes")
        arg, n = "..notes", 1
    elif case == "through-a-symlink":
        (tmp_path / "via-link").symlink_to(repo)
        arg, n = str(tmp_path / "via-link" / "plans" / "reference" / "big"), 3
    else:
        arg, n = str(tmp_path / "elsewhere") if case == "outside" else "/no/such/thing", 0
    rc, out, err = _run(capsys, "park", arg)
    if n:
        assert rc == 0 and err == [] and len(P.parked(repo)) == n, err
    else:
        assert rc == 2 and len(err) == 1 and f"error: {arg}: is outside the checkout {repo}" in err[0]


@pytest.mark.parametrize("n", [1, 4])
def test_restore_without_a_record_hints_at_deleted_files(repo, capsys, monkeypatch, n):
    files = ["code.py", "plans/reference/small/config.json", "plans/reference/big/config.json",
             "plans/reference/big/model-00002-of-00002.safetensors"][:n]
    for f in files:
        (repo / f).unlink()
    monkeypatch.chdir(repo / "plans")
    rc, out, err = _run(capsys, "restore")
    assert rc == 0 and err == [] and out[0] == "nothing parked" and len(out) == 2
    assert out[1].startswith(f"hint: {n} tracked files are deleted in the working tree (git ls-files -d)")
    cmd = out[1].split("; bring them back: ", 1)[1]
    assert cmd == ("git checkout -- ../code.py" if n == 1
                   else "git ls-files -z -d :/ | xargs -0 git --literal-pathspecs checkout --")
    (repo / "plans" / "reference" / "big" / "model-00001-of-00002.safetensors").write_bytes(b"kept")
    subprocess.run(cmd, shell=True, cwd=repo / "plans", check=True)     # run where restore ran
    assert _git(repo, "status", "--porcelain") == " M plans/reference/big/model-00001-of-00002.safetensors\n"


def test_park_bundles_parks_every_bundled_trained_model_and_nothing_else(repo, capsys):
    rc, _, err = _run(capsys, "park", "bundles")
    assert rc == 2 and len(err) == 1 and "no tracked plans/reference/*/PROVENANCE.md" in err[0]
    assert (repo / "plans" / "reference" / "big" / "config.json").exists()
    (repo / "plans" / "reference" / "big" / "PROVENANCE.md").write_text("trained here\n")
    (repo / "plans" / "reference" / "small" / "deep").mkdir()
    (repo / "plans" / "reference" / "small" / "deep" / "PROVENANCE.md").write_text("not a bundle's own\n")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "bundle")
    assert P.bundled_models(repo) == ["plans/reference/big"]
    rc, out, _ = _run(capsys, "park", "bundles")
    assert rc == 0 and out[0].startswith("4 files parked, 4.00 MiB")
    assert not (repo / "plans" / "reference" / "big").exists()
    assert (repo / "plans" / "reference" / "small" / "config.json").exists()
    rc, out, _ = _run(capsys, "restore")
    assert rc == 0 and out == ["restored 4 files"]
    assert (repo / "plans" / "reference" / "big" / "model-00001-of-00002.safetensors").stat().st_size == 3 * 2 ** 20
    rc, out, err = _run(capsys, "park", "bundles", "code.py")         # the word among paths, in one call
    assert rc == 0 and err == [] and out[0].startswith("5 files parked")
    assert not (repo / "plans" / "reference" / "big").exists() and not (repo / "code.py").exists()
    assert _run(capsys, "restore")[1] == ["restored 5 files"]
