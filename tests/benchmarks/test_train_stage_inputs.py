"""``prepare stage``'s refusals from session 21's break-it pass: each is one ``error:`` line, exit 2, and leaves
the call folder and ``latest/`` as they were (a returned checkpoint of another size once replaced the only ref
one there; ``--call`` equal to ``--prep`` deleted the tokenizer; a ``gdn.tzp.00.orig`` travelled as a part)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from benchmarks.train import pack, prepare  # noqa: E402
from benchmarks.train.models import build_model, save_checkpoint  # noqa: E402
from tests.benchmarks.test_train_m30 import TREE_ALL_PARKED, _prep, _stage  # noqa: E402


def _packed(tmp_path: Path, family: str, size: str, name: str) -> Path:
    """A packed smoke-built checkpoint whose training state records ``size``, in folder ``name``."""
    d = tmp_path / f"build-{name}"
    ck = save_checkpoint(build_model(family, "smoke", 8192, 8189, seed=0), d / family, None, None)
    (ck / "train_state").mkdir()
    (ck / "train_state" / "state.json").write_text(json.dumps({"family": family, "seed": 0, "size": size}))
    pack.pack(ck, tmp_path / name)
    return tmp_path / name


def _listing(root: Path) -> dict:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line(rc, err, *needles):
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    for n in needles:
        assert n in err, err


@pytest.fixture
def staged(tmp_path, capsys, monkeypatch):
    """A ref-staged call folder whose latest/ holds a (smoke-built) ref gdn checkpoint (the tree measured as the
    parked checkout of 2026-12-03, so that shards fit)."""
    monkeypatch.setattr(prepare, "_tree_bytes", lambda root: TREE_ALL_PARKED)
    prep, whl = _prep(tmp_path)
    monkeypatch.setattr(prepare, "WHEELS", whl)         # where train_refs.sh installs them from
    call = tmp_path / "dev" / "call"
    ref = _packed(tmp_path, "gdn", "ref", "ret-ref")
    rc, _, err = _stage(capsys, prep, whl, call, "--returned", str(ref), "--families", "gdn")
    assert rc == 0, err
    return prep, whl, call


def test_a_returned_checkpoint_of_another_size_never_replaces_latest(staged, tmp_path, capsys):
    prep, whl, call = staged
    before = _listing(tmp_path / "dev")
    other = _packed(tmp_path, "gdn", "m30", "ret-m30")       # staged for kda only, yet it would have gone to latest/
    capsys.readouterr()                                       # the checkpoint writer's progress bar
    rc, _, err = _stage(capsys, prep, whl, call, "--returned", str(other), "--families", "kda", "--fresh", "kda")
    _one_line(rc, err, "--returned", "gdn checkpoint was trained at --size m30")
    assert _listing(tmp_path / "dev") == before


def test_a_stray_file_beside_the_parts_is_refused(staged, tmp_path, capsys):
    prep, whl, call = staged
    ret = _packed(tmp_path, "gdn", "ref", "ret-stray")
    shutil.copy2(ret / "gdn.tzp.00", ret / "gdn.tzp.00.orig")
    capsys.readouterr()                                       # the checkpoint writer's progress bar
    rc, _, err = _stage(capsys, prep, whl, call, "--returned", str(ret), "--families", "gdn")
    _one_line(rc, err, "gdn.tzp.00.orig is not a part")


def test_call_inside_prep_is_refused_and_prep_kept(staged, capsys):
    prep, whl, _ = staged
    before = _listing(prep)
    rc, _, err = _stage(capsys, prep, whl, prep, "--families", "gdn", "--fresh", "gdn", "--size", "smoke")
    _one_line(rc, err, "--call", "--prep")
    assert _listing(prep) == before


@pytest.mark.parametrize("bad", ["next_shard", "also_carried", "families_twice", "empty_returned", "call_file"])
def test_bad_bookkeeping_and_flags_are_one_line(staged, tmp_path, capsys, bad):
    prep, whl, call = staged
    argv = ["--families", "gdn"]
    if bad == "next_shard":
        (call / "next_shard").write_text("garbage\n")
        needle = "next_shard"
    elif bad == "also_carried":
        whl = tmp_path / "no-such-wheels"
        needle = "--also-carried"
    elif bad == "families_twice":
        argv = ["--families", "gdn", "gdn"]
        needle = "named twice"
    elif bad == "empty_returned":
        (tmp_path / "empty").mkdir()
        argv += ["--returned", str(tmp_path / "empty")]
        needle = "no <family>.tzp.NN part"
    else:
        call = tmp_path / "afile"
        call.write_text("x")
        needle = "is not a folder"
    before = _listing(tmp_path / "dev")
    rc, _, err = _stage(capsys, prep, whl, call, *argv)
    _one_line(rc, err, needle)
    assert _listing(tmp_path / "dev") == before


def test_a_failure_while_writing_leaves_the_call_folder_as_it_was(staged, tmp_path, capsys):
    prep, whl, call = staged
    before = _listing(call)
    (prep / "shard-001.u16.xz").unlink()                     # the copy of the second shard fails mid-way
    (call / "next_shard").write_text("0\n")
    before = _listing(call)
    rc, _, err = _stage(capsys, prep, whl, call, "--families", "gdn")
    _one_line(rc, err, "--call", "as it was")
    assert _listing(call) == before
    assert not [p for p in call.parent.iterdir() if p.name.startswith(".")]     # no staging folder left


@pytest.mark.parametrize("budget, env, needle", [("abc", {}, "BUDGET_S 'abc'"), ("10", {}, "BUDGET_S '10'"),
                                                 ("100", {"FAMILIES": "GDN"}, "FAMILIES has 'GDN'"),
                                                 ("100", {"FAMILIES": " "}, "FAMILIES is empty"),
                                                 ("100", {"OUT": ""}, "OUT: set it")])
def test_train_refs_refuses_bad_settings_before_anything_runs(tmp_path, budget, env, needle):
    import subprocess

    script = Path(__file__).resolve().parents[2] / "benchmarks/h200/train_refs.sh"
    full = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), **env}
    p = subprocess.run(["bash", str(script), budget], env=full, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and needle in p.stderr, p.stderr
    assert list(tmp_path.iterdir()) == []                    # no run.log: nothing ran
