"""Write-side errors (issue 13 item 4): full disk, read-only target, odd --out paths, the user's own files.

Real conditions where the machine allows them (a small tmpfs for ENOSPC, a read-only bind mount; both need
mount rights and are skipped otherwise), plus the same failures injected in-process, which always run.
Every case: exit 2, one ``error:`` line naming --out and the cause, nothing half-written, an earlier plan kept.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess

import pytest

from tests.support.clihelp import assert_one_error, dasc, snapshot


def _mount(args: list[str]) -> bool:
    try:
        return subprocess.run(["mount", *args], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _umount(path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=20)


@pytest.fixture
def full_fs(tmp_path):
    """A 256 KiB tmpfs filled to the last byte (a real ENOSPC); skipped where mounting is not allowed."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if not _mount(["-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)]):
        pytest.skip("cannot mount a tmpfs here (needs CAP_SYS_ADMIN)")
    try:
        with open(mnt / "filler", "wb", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * 4096)
                    fh.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        yield mnt
    finally:
        _umount(mnt)


@pytest.fixture
def ro_fs(tmp_path):
    """A read-only bind mount of a fresh directory; skipped where mounting is not allowed."""
    src, mnt = tmp_path / "ro-src", tmp_path / "ro"
    src.mkdir()
    mnt.mkdir()
    if not _mount(["--bind", "-o", "ro", str(src), str(mnt)]):
        pytest.skip("cannot bind-mount here (needs CAP_SYS_ADMIN)")
    try:
        if os.access(mnt, os.W_OK) and _probe_writable(mnt):
            pytest.skip("bind mount did not become read-only")
        yield mnt
    finally:
        _umount(mnt)


def _probe_writable(d) -> bool:
    try:
        (d / ".probe").write_text("x")
        (d / ".probe").unlink()
        return True
    except OSError:
        return False


def _compile(ck, out, *more):
    return dasc("compile", ck, "--wmax", 16, "--out", out, *more)


# ----------------------------------------------------------------------------- full disk


def test_enospc_real_tmpfs(full_fs, gdn):
    before = snapshot(full_fs)
    r = _compile(gdn, full_fs / "plan")
    assert_one_error(r, str(full_fs / "plan"), "No space left on device")
    assert snapshot(full_fs) == before


def test_enospc_real_tmpfs_keeps_the_earlier_plan(tmp_path, gdn):
    mnt = tmp_path / "m"
    mnt.mkdir()
    if not _mount(["-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)]):
        pytest.skip("cannot mount a tmpfs here")
    try:
        assert _compile(gdn, mnt / "plan").code == 0
        with open(mnt / "filler", "wb", buffering=0) as fh:   # now fill what is left
            try:
                while True:
                    fh.write(b"\0" * 4096)
                    fh.flush()
            except OSError:
                pass
        before = snapshot(mnt)
        r = dasc("compile", gdn, "--wmax", 4, "--out", mnt / "plan")
        assert_one_error(r, "No space left on device")
        assert snapshot(mnt) == before
    finally:
        _umount(mnt)


def test_enospc_injected(tmp_path, gdn, monkeypatch):
    import dasc_compile.artifact as art

    assert _compile(gdn, tmp_path / "plan").code == 0
    before = snapshot(tmp_path)

    def no_space(_fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(art.os, "fsync", no_space)
    r = dasc("compile", gdn, "--wmax", 4, "--out", tmp_path / "plan")
    assert_one_error(r, "cannot write the plan (No space left on device); nothing was changed")
    assert snapshot(tmp_path) == before


def test_reference_onto_a_full_disk(full_fs):
    before = snapshot(full_fs)
    r = dasc("reference", "qwen3-next-80b-a3b", "--out", full_fs / "ref")
    assert_one_error(r, str(full_fs / "ref"), "No space left on device")
    assert snapshot(full_fs) == before            # no config.json.tmp, no half a checkpoint


# ----------------------------------------------------------------------------- read-only target


def test_compile_onto_read_only_mount(ro_fs, gdn):
    r = _compile(gdn, ro_fs / "plan")
    assert_one_error(r, str(ro_fs / "plan"), "Read-only file system")
    assert list(ro_fs.iterdir()) == []


def test_compile_over_a_plan_on_a_read_only_mount_says_replace(ro_fs, gdn):
    # the plan is there (written through the mount's writable source): "cannot create the plan directory" misled
    assert _compile(gdn, ro_fs.parent / "ro-src" / "plan").code == 0
    before = snapshot(ro_fs)
    r = _compile(gdn, ro_fs / "plan")
    assert_one_error(r, f"{ro_fs / 'plan'}: cannot replace the plan in this directory (Read-only file system)")
    assert snapshot(ro_fs) == before


def test_reference_onto_read_only_mount(ro_fs):
    r = dasc("reference", "kimi-linear-48b-a3b", "--out", ro_fs / "ref")
    assert_one_error(r, str(ro_fs / "ref"), "Read-only file system")
    assert list(ro_fs.iterdir()) == []


def test_file_in_place_of_the_parent_directory(tmp_path, gdn):
    (tmp_path / "afile").write_text("not a directory")
    before = snapshot(tmp_path)
    assert_one_error(_compile(gdn, tmp_path / "afile" / "plan"), "afile/plan")
    # reference and sweep name the file in the way (mkdir's own word was "File exists")
    want = f"cannot create the directory ({tmp_path / 'afile'} is a file, not a directory)"
    assert_one_error(dasc("reference", "qwen3.5-27b", "--out", tmp_path / "afile" / "ref" / "x"), "afile/ref/x", want)
    assert_one_error(dasc("sweep", gdn, "--wmax", "16,64", "--out", tmp_path / "afile" / "s"), "afile/s", want)
    assert snapshot(tmp_path) == before


def test_a_broken_link_above_out_is_named_as_one(tmp_path, gdn):
    """A dangling link or a loop of links above --out was called "a file" (reference, sweep)."""
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    before = snapshot(tmp_path)
    for link in ("dangling", "loop"):
        want = f"cannot create the directory ({tmp_path / link} is a symbolic link that leads to no directory)"
        assert_one_error(dasc("reference", "qwen3.5-27b", "--out", tmp_path / link / "ref"), want)
        assert_one_error(dasc("sweep", gdn, "--wmax", "16,64", "--out", tmp_path / link / "s"), want)
    assert snapshot(tmp_path) == before


def test_a_folder_above_out_that_cannot_be_examined_leaves_the_system_reason(tmp_path, monkeypatch):
    """A link into a folder the user may not enter made the lookup of the folders above --out raise
    PermissionError (a traceback) where the system's one-line reason stood before."""
    import os as os_module

    from dasc_compile import atomic

    blocked = tmp_path / "lnk"
    real_lstat = os_module.lstat

    def lstat(p, *a, **k):
        if str(p) == str(blocked):
            raise PermissionError(13, "Permission denied", str(p))
        return real_lstat(p, *a, **k)

    monkeypatch.setattr(atomic.os, "lstat", lstat)
    assert atomic.not_a_folder(blocked / "x" / "y") is None
    (tmp_path / "afile").write_text("x")
    assert atomic.not_a_folder(tmp_path / "afile" / "y") == f"{tmp_path / 'afile'} is a file, not a directory"


@pytest.mark.parametrize("kind", ["file_above", "non_empty"])
def test_sweep_refuses_its_out_before_the_sweep_runs(tmp_path, gdn, monkeypatch, kind):
    """`dasc sweep --out` was checked only after the sweep and its --eval had run, so a bad path cost them."""
    from dasc_compile import sweep

    def no_sweep(*a, **k):
        raise AssertionError("the sweep ran before --out was checked")

    monkeypatch.setattr(sweep, "run_sweep", no_sweep)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("x")
    out = tmp_path / "afile" / "s" if kind == "file_above" else tmp_path / "full"
    want = "is a file, not a directory" if kind == "file_above" else "--out must be a new or empty directory"
    assert_one_error(dasc("sweep", gdn, "--wmax", "16,64", "--out", out), str(out), want)


# ----------------------------------------------------------------------------- odd --out paths


@pytest.mark.parametrize("kind", ["long_name", "long_path", "dangling_link", "link_to_file", "link_loop",
                                  "existing_file", "cwd", "parent_of_cwd", "empty_string"])
def test_unusable_out_path(tmp_path, gdn, kind):
    needles = {"long_name": ["--out name is 300 bytes long", "expected at most"],
               "long_path": ["File name too long"],
               "dangling_link": ["symbolic link to", "which does not exist"],
               "link_to_file": ["symbolic link to", "not a directory"],
               "link_loop": ["cannot use this --out path"],
               "existing_file": ["exists and is not a directory"],
               "cwd": ["must not be the current directory"],
               "parent_of_cwd": ["must not be the current directory or one of its parents"],
               "empty_string": ["Invalid value for '--out': expected a path, got ''"]}[kind]
    work = tmp_path / "work"
    work.mkdir()
    out = tmp_path / "o"
    if kind == "long_name":
        out = tmp_path / ("n" * 300)
    elif kind == "long_path":
        out = tmp_path.joinpath(*["d" * 200] * 25, "plan")
    elif kind == "dangling_link":
        out.symlink_to(tmp_path / "nowhere")
    elif kind == "link_to_file":
        (tmp_path / "f").write_text("x")
        out.symlink_to(tmp_path / "f")
    elif kind == "link_loop":
        out.symlink_to(out)
    elif kind == "existing_file":
        out.write_text("mine")
    elif kind == "cwd":
        out = work
    elif kind == "parent_of_cwd":
        out = tmp_path
    elif kind == "empty_string":
        out = ""
    before = snapshot(tmp_path)
    r = dasc("compile", gdn, "--wmax", 16, "--out", out, cwd=work)
    assert_one_error(r, *needles)
    assert snapshot(tmp_path) == before


def test_symlink_to_an_earlier_plan_is_followed(tmp_path, gdn):
    from dasc_compile.schema import load_plan

    assert _compile(gdn, tmp_path / "real").code == 0
    (tmp_path / "link").symlink_to(tmp_path / "real")
    r = dasc("compile", gdn, "--wmax", 4, "--out", tmp_path / "link")
    assert r.code == 0, r.err
    assert (tmp_path / "link").is_symlink() and load_plan(tmp_path / "real").policy.w_max == 4


# ----------------------------------------------------------------------------- what may be replaced


def _dasc_plan(tmp_path, gdn, name="plan"):
    assert _compile(gdn, tmp_path / name).code == 0
    return tmp_path / name


@pytest.mark.parametrize("kind", ["users_plan_json", "edited_plan", "rehashed_by_name_only", "kernels_only",
                                  "plan_plus_notes", "plan_json_is_dir", "plan_json_symlink", "foreign_pycache",
                                  "edited_pretty_plan"])
def test_out_that_is_not_an_earlier_dasc_plan_is_refused_and_kept(tmp_path, gdn, kind):
    out = tmp_path / "plan"
    needles = ["choose another --out"]
    if kind == "users_plan_json":
        out.mkdir()
        (out / "plan.json").write_text(json.dumps({"my": "own plan", "steps": [1, 2, 3]}))
        needles.append("no schema_version / content_hash")
    else:
        _dasc_plan(tmp_path, gdn)
        pj = out / "plan.json"
        if kind == "edited_plan":
            pj.write_text(pj.read_text().replace('"w_max":16', '"w_max":17'))
            needles.append("edited since dasc wrote it")
        elif kind == "edited_pretty_plan":      # re-indented and then edited: still the user's
            doc = json.loads(pj.read_text())
            doc["policy"]["w_max"] = 17
            pj.write_text(json.dumps(doc, indent=2))
            assert dasc("inspect", out).code == 2
            needles.append("edited since dasc wrote it")
        elif kind == "rehashed_by_name_only":   # a look-alike: right field names, hash of something else
            pj.write_text(json.dumps({"schema_version": 2, "content_hash": "0" * 64, "x": 1}))
            needles.append("content_hash does not match")
        elif kind == "kernels_only":
            pj.unlink()
            needles.append("no plan.json")
        elif kind == "plan_plus_notes":
            (out / "notes.txt").write_text("keep me")
            needles.append("holds more than a dasc plan (notes.txt)")
        elif kind == "plan_json_is_dir":
            pj.unlink()
            pj.mkdir()
            needles.append("plan.json")
        elif kind == "plan_json_symlink":
            (tmp_path / "elsewhere.json").write_bytes(pj.read_bytes())
            pj.unlink()
            pj.symlink_to(tmp_path / "elsewhere.json")
            needles.append("plan.json")
        elif kind == "foreign_pycache":
            (out / "__pycache__").mkdir()
            (out / "__pycache__" / "mine.cpython-311.pyc").write_bytes(b"x")
            needles.append("__pycache__")
    before = snapshot(tmp_path)
    r = dasc("compile", gdn, "--wmax", 4, "--out", out)
    assert_one_error(r, str(out), *needles)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("kind", ["earlier_plan", "earlier_plan_with_pycache", "no_kernels_plan", "empty_dir",
                                  "pretty_printed_plan", "key_sorted_plan"])
def test_earlier_plan_or_empty_dir_is_replaced(tmp_path, gdn, kind):
    from dasc_compile.schema import load_plan

    out = tmp_path / "plan"
    if kind == "empty_dir":
        out.mkdir()
    elif kind == "no_kernels_plan":
        assert _compile(gdn, out, "--no-kernels").code == 0
    else:
        _dasc_plan(tmp_path, gdn)
        if kind == "earlier_plan_with_pycache":   # what importing the kernel module leaves behind
            (kname,) = [p.name for p in out.glob("dasc_kernels_*.py")]
            (out / "__pycache__").mkdir()
            (out / "__pycache__" / kname.replace(".py", ".cpython-311.pyc")).write_bytes(b"\0")
        if kind == "pretty_printed_plan":   # issue 22: inspect reads a re-indented plan, so compile replaces it too
            pj = out / "plan.json"
            pj.write_text(json.dumps(json.loads(pj.read_text()), indent=2))
            assert dasc("inspect", out).code == 0
        if kind == "key_sorted_plan":       # jq -S / json.tool --sort-keys: kernels.constants sorted too (schema 5)
            pj = out / "plan.json"
            pj.write_text(json.dumps(json.loads(pj.read_text()), indent=1, sort_keys=True))
            assert dasc("inspect", out).code == 0
    r = dasc("compile", gdn, "--wmax", 4, "--out", out)
    assert r.code == 0, r.err
    assert load_plan(out).policy.w_max == 4
    assert not (out / "__pycache__").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".plan")) == []


# ----------------------------------------------------------------------------- dasc reference


@pytest.mark.parametrize("seed, needle", [(2**70, "--seed 1180591620717411303424"), (-1, "--seed -1")])
def test_reference_seed_out_of_range(tmp_path, seed, needle):
    r = dasc("reference", "qwen3-next-80b-a3b", "--out", tmp_path / "ref", "--seed", seed)
    assert_one_error(r, needle, "expected an integer in [0, 9223372036854775807]")
    assert list(tmp_path.iterdir()) == []


def test_reference_into_non_empty_dir_and_unknown_name(tmp_path):
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "x").write_text("keep")
    before = snapshot(tmp_path)
    assert_one_error(dasc("reference", "qwen3-next-80b-a3b", "--out", tmp_path / "ref"), "new or empty directory")
    r = dasc("reference", "no-such-model", "--out", tmp_path / "new")
    assert_one_error(r, "no-such-model")
    assert snapshot(tmp_path) == before


def test_reference_interrupted_leaves_nothing(tmp_path, monkeypatch):
    import signal

    import dasc_compile.refckpt as ref

    orig = ref.write_decay_only

    def interrupted(*a, **k):
        out = orig(*a, **k)
        os.kill(os.getpid(), signal.SIGINT)   # after the files are written, before the move into place
        return out

    monkeypatch.setattr(ref, "write_decay_only", interrupted)
    r = dasc("reference", "qwen3-next-80b-a3b", "--out", tmp_path / "ref")
    assert_one_error(r, "interrupted (SIGINT)", code=130)
    assert list(tmp_path.iterdir()) == []


def test_inspect_plot_onto_a_full_disk_or_read_only_mount(tmp_path, gdn, full_fs, ro_fs):
    assert _compile(gdn, tmp_path / "plan").code == 0
    # a read-only mount is found before drawing (a temporary file is tried first); a full disk when writing
    for fs, said, cause in ((full_fs, "cannot write the plot", "No space left on device"),
                            (ro_fs, "cannot write there", "Read-only file system")):
        before = snapshot(fs)
        r = dasc("inspect", tmp_path / "plan", "--plot", fs / "fig.png")
        assert_one_error(r, "fig.png", said, cause)
        assert snapshot(fs) == before
