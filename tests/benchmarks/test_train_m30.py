"""The ~30M reference size (``m30``, issue 20): built by transformers' own classes at the measured parameter
counts, one packed checkpoint per call, and what ``prepare stage`` / train_refs.sh / train.py say about whether
a call with it fits the 64 MiB in and 8 files / 64 MiB out."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from benchmarks.train import pack, prepare, staged_parts  # noqa: E402
from benchmarks.train.models import FAMILIES, SIZES, build_model, n_params, save_checkpoint  # noqa: E402
from tests.benchmarks.test_train_refs import _args, make_data  # noqa: E402

MIB = 2 ** 20
VOCAB, EOS_ID = 8192, 8189          # the trimmed Qwen vocabulary (benchmarks/train/tokenizer.py)
# prepare data's shards of 2026-12-03 (.dev/train/prep/meta.json): bytes, tokens
SHARDS = [(2789004, 4194304), (2688492, 4194304), (2751632, 4194304), (2798832, 4194304), (2812852, 4194304),
          (2771700, 4194304), (1828256, 2659456)]
TREE_BUNDLES_PARKED = round(22.81 * MIB)        # the checkout of 2026-12-03, `park bundles`
TREE_ALL_PARKED = round(10.66 * MIB)            # ... and `park benchmarks/results`
WHEELS = 2788012                               # .dev/train/whl (pydantic's, for the decay report)


def _has_kimi() -> bool:
    try:
        import transformers.models.kimi_linear  # noqa: F401
        return True
    except ImportError:
        return False


@pytest.fixture(scope="module")
def gdn_m30():
    return build_model("gdn", "m30", VOCAB, EOS_ID, seed=0)


def test_m30_gdn_is_a_30m_qwen3_next_of_the_ref_layout(gdn_m30):
    from transformers import Qwen3NextForCausalLM

    cfg = gdn_m30.config
    assert type(gdn_m30) is Qwen3NextForCausalLM and n_params(gdn_m30) == 31_450_432
    assert 28e6 <= n_params(gdn_m30) <= 35e6
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (512, 1024, 8)
    assert cfg.layer_types == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + [
        "full_attention"]
    assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
            cfg.linear_value_head_dim) == (8, 32, 64, 32)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (8, 2, 64)
    assert gdn_m30.model.rotary_emb.inv_freq.numel() > 0          # RoPE, as the ref GDN


@pytest.mark.parametrize("family, params", [
    pytest.param("kda", 29_663_280, marks=pytest.mark.skipif(not _has_kimi(), reason="transformers < 5.17")),
    ("mamba2", 31_084_096)])
def test_m30_builds_for_the_other_families_at_about_30m(family, params):
    model = build_model(family, "m30", VOCAB, EOS_ID, seed=0)
    assert n_params(model) == params and 28e6 <= params <= 35e6


def test_every_size_and_family_has_a_measured_packed_size():
    assert set(staged_parts.PACKED_MIB) == {(f, s) for f in FAMILIES for s in SIZES}


@pytest.fixture(scope="module")
def packed_m30(gdn_m30, tmp_path_factory):
    """The m30 GDN at init as a resume checkpoint travels: checkpoint directory with a state naming its size,
    packed."""
    d = tmp_path_factory.mktemp("m30")
    ck = save_checkpoint(gdn_m30, d / "gdn", None, None)
    (ck / "train_state").mkdir()
    (ck / "train_state" / "state.json").write_text(json.dumps({"family": "gdn", "seed": 0, "size": "m30"}))
    pack.pack(ck, d / "returned")
    shutil.rmtree(ck)
    return d / "returned"


def test_m30_gdn_packs_to_three_parts_of_the_measured_size(packed_m30):
    """PACKED_MIB (with the training state and the 0.7 MiB tokenizer) less what this checkpoint lacks."""
    sizes = [p.stat().st_size for p in sorted(packed_m30.glob("gdn.tzp.*"))]
    assert len(sizes) == 3 and sizes[:2] == [pack.PART_BYTES] * 2
    assert staged_parts.PACKED_MIB["gdn", "m30"] - 1.5 < sum(sizes) / MIB < staged_parts.PACKED_MIB["gdn", "m30"]


def test_the_recurrent_only_m30_gdn_packs_to_four_parts_and_stage_expects_them(tmp_path):
    """The recurrent-only control (train.py --no-attention) packs larger than the hybrid (46.1 vs 42.8 MiB: 4
    parts, not 3); a fresh start's estimate is the larger of the two, since stage does not see the flags."""
    model = build_model("gdn", "m30", VOCAB, EOS_ID, seed=0, attention=False)
    ck = save_checkpoint(model, tmp_path / "gdn", None, None)
    (ck / "train_state").mkdir()
    (ck / "train_state" / "state.json").write_text(json.dumps({"family": "gdn", "seed": 0, "size": "m30"}))
    pack.pack(ck, tmp_path / "returned")
    sizes = [p.stat().st_size for p in sorted((tmp_path / "returned").glob("gdn.tzp.*"))]
    measured = staged_parts.PACKED_MIB_NO_ATTENTION["gdn", "m30"]
    assert len(sizes) == 4 and measured - 1.5 < sum(sizes) / MIB < measured
    assert staged_parts.fresh_packed_mib("gdn", "m30") == measured > staged_parts.PACKED_MIB["gdn", "m30"]
    assert staged_parts.fresh_packed_mib("gdn", "smoke") == staged_parts.PACKED_MIB["gdn", "smoke"]
    assert set(staged_parts.PACKED_MIB_NO_ATTENTION) <= set(staged_parts.PACKED_MIB)


def _prep(tmp_path) -> tuple[Path, Path]:
    """A prep folder with stand-in shards of the real shards' sizes (meta.json lists them), and a wheels folder
    of the real size."""
    data = make_data(tmp_path / "data")
    prep = tmp_path / "prep"
    shutil.copytree(data / "tokenizer", prep / "tokenizer")
    for i, (b, _) in enumerate(SHARDS):
        (prep / f"shard-{i:03d}.u16.xz").write_bytes(b"\0" * b)
    (prep / "meta.json").write_text(json.dumps({"shards": [
        {"file": f"shard-{i:03d}.u16.xz", "bytes": b, "tokens": t} for i, (b, t) in enumerate(SHARDS)]}))
    (tmp_path / "whl").mkdir()
    (tmp_path / "whl" / "pydantic-2.14.4-py3-none-any.whl").write_bytes(b"\0" * (WHEELS - 1))
    (tmp_path / "whl" / "pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.whl").write_bytes(b"\0")
    return prep, tmp_path / "whl"


def _stage(capsys, prep, whl, call, *argv) -> tuple[int, str, str]:
    rc = prepare.main(["stage", "--prep", str(prep), "--call", str(call), "--also-carried", str(whl), *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err.strip()


def test_stage_resumes_one_m30_family_only_with_bundles_and_results_parked(packed_m30, tmp_path, capsys,
                                                                           monkeypatch):
    prep, whl = _prep(tmp_path)
    call = tmp_path / "dev" / "call"
    resume = ["--returned", str(packed_m30), "--families", "gdn", "--size", "m30"]
    monkeypatch.setattr(prepare, "_tree_bytes", lambda root: TREE_BUNDLES_PARKED)
    rc, _, err = _stage(capsys, prep, whl, call, *resume)
    assert rc == 2 and len(err.splitlines()) == 1 and not (tmp_path / "dev").exists()
    assert err.startswith("error: --families gdn (--size m30): no shard fits: ")
    assert "(tree 22.8, packed checkpoints to resume 42." in err and "park benchmarks/results" in err
    # only what is still in the tree is suggested: parked bundles are not named again
    monkeypatch.setattr(prepare, "parkable", lambda root: {"bundles": 0, "benchmarks/results": 8 << 20,
                                                           "benchmarks/traces": 6 << 20})
    rc, _, err = _stage(capsys, prep, whl, call, *resume)
    assert rc == 2 and "python -m benchmarks.h200.park park benchmarks/results benchmarks/traces: " in err
    assert "park bundles" not in err
    monkeypatch.setattr(prepare, "parkable", lambda root: {"bundles": 0, "benchmarks/results": 0})
    rc, _, err = _stage(capsys, prep, whl, call, *resume)
    assert rc == 2 and "nothing is left to park" in err and "benchmarks.h200.park" not in err

    monkeypatch.setattr(prepare, "_tree_bytes", lambda root: TREE_ALL_PARKED)
    rc, out, _ = _stage(capsys, prep, whl, call, *resume, "--check")
    plan = json.loads(out)
    assert rc == 0 and not (tmp_path / "dev").exists()
    assert plan["shards"] and plan["total_mib"] <= 62 and plan["resume"] == ["gdn"]
    assert (plan["return_files"], plan["size"]) == (5, "m30") and 42 < plan["return_mib"] < 45

    rc, _, err = _stage(capsys, prep, whl, call, "--returned", str(packed_m30), "--families", "gdn", "--check")
    assert rc == 2 and len(err.splitlines()) == 1 and not (tmp_path / "dev").exists()
    assert err.startswith("error: --returned ") and "gdn checkpoint was trained at --size m30" in err


def test_stage_refuses_two_m30_families_whose_return_is_over_64_mib(tmp_path, capsys, monkeypatch):
    """Out: run.log + summary.json + the parts of each fresh m30 family at the larger of its hybrid and
    recurrent-only sizes (gdn 46.14, mamba2 49.97 MiB, x1.02 growth: 4 parts each): 10 files, 1 + 47.06 + 50.97 MiB."""
    monkeypatch.setattr(prepare, "_tree_bytes", lambda root: TREE_ALL_PARKED)
    prep, whl = _prep(tmp_path)
    monkeypatch.setattr(prepare, "WHEELS", whl)         # where train_refs.sh installs them from
    call = tmp_path / "dev" / "call"
    rc, _, err = _stage(capsys, prep, whl, call, "--families", "gdn", "mamba2", "--fresh", "gdn", "mamba2",
                        "--size", "m30")
    assert rc == 2 and len(err.splitlines()) == 1 and not (tmp_path / "dev").exists()
    assert err.startswith("error: --families gdn mamba2 (--size m30): the call would return ~99.0 MiB")
    assert "in 10 files" in err and "over the 8 files / 64 MiB a call returns" in err
    rc, out, _ = _stage(capsys, prep, whl, call, "--families", "gdn", "--fresh", "gdn", "--size", "m30")
    assert rc == 0 and json.loads(out)["return_files"] == 6 and len(json.loads(out)["shards"]) == len(SHARDS)
    assert json.loads((call / "staged.json").read_text())["size"] == "m30"


def test_trainer_refuses_a_size_other_than_the_resumed_one(tmp_path, capsys):
    from benchmarks.train.train import main

    data = make_data(tmp_path / "data")
    ck = tmp_path / "ck"
    (ck / "train_state").mkdir(parents=True)
    (ck / "train_state" / "state.json").write_text(json.dumps({"family": "mamba2", "seed": 0, "size": "smoke"}))
    argv = _args(data, tmp_path / "out", "mamba2", 1, "--resume", str(ck))
    argv[argv.index("--size") + 1] = "m30"
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and not (tmp_path / "out").exists()
    assert err[0].startswith(f"error: --size m30: {ck} was trained at --size smoke")


@pytest.mark.parametrize("size, staged, refused, call", [("m30", "ref", True, ""), ("", "m30", False, ""),
                                                         ("m30", "m30", False, ""), ("", None, False, ""),
                                                         ("", "m30", False, ".dev/train/m30/call")])
def test_train_refs_passes_the_staged_size_and_refuses_another(tmp_path, size, staged, refused, call):
    """SIZE defaults to the staged size (staged.json of CALL, default .dev/train/call) and must equal it."""
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "benchmarks/h200").mkdir(parents=True)
    shutil.copy(root / "benchmarks/h200/train_refs.sh", tmp_path / "benchmarks/h200/train_refs.sh")
    folder = tmp_path / (call or ".dev/train/call")
    folder.mkdir(parents=True)
    rec = {"shards": [], "tokens": 0, "families": ["gdn"]} | ({"size": staged} if staged else {})
    (folder / "staged.json").write_text(json.dumps(rec))
    (tmp_path / "out").mkdir()
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "FAMILIES": "gdn", "FLA_PROBE": "0",
           "SIZE": size, "TRAIN_ARGS": "--max-steps 0"} | ({"CALL": call} if call else {})
    p = subprocess.run(["bash", str(tmp_path / "benchmarks/h200/train_refs.sh"), "40"], env=env, capture_output=True,
                       text=True, timeout=120)
    log = (tmp_path / "out" / "run.log").read_text()
    if refused:
        assert p.returncode == 2 and "error: SIZE is m30 but the call was staged for --size ref" in log, log
        assert "trainer exit" not in log
    else:
        assert f"size {size or staged or 'ref'}\n" in log and "trainer exit" in log, log


@pytest.mark.parametrize("var, value", [("SIZE", "m3O"), ("KERNELS", "triton"), ("OUT", "/nonexistent/out")])
def test_train_refs_refuses_a_size_or_kernels_it_does_not_know_before_anything_runs(tmp_path, var, value):
    """A typo in SIZE was echoed back as the fix ("run prepare stage --size m3O"); KERNELS=triton trained with
    the torch kernels without a word. Both are one line naming the variable and the choices, exit 2."""
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "benchmarks/h200").mkdir(parents=True)
    shutil.copy(root / "benchmarks/h200/train_refs.sh", tmp_path / "benchmarks/h200/train_refs.sh")
    (tmp_path / "out").mkdir()
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "FAMILIES": "gdn", var: value}
    p = subprocess.run(["bash", str(tmp_path / "benchmarks/h200/train_refs.sh"), "40"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [p.stderr.strip()]
    assert p.stderr.startswith(f"error: {var} '{value}': expected ") and not any((tmp_path / "out").iterdir())


def test_train_refs_knows_the_sizes_models_py_defines():
    """The driver's SIZE check is a shell `case`; it must list models.py's SIZES, no more, no fewer."""
    import re

    script = (Path(__file__).resolve().parents[2] / "benchmarks/h200/train_refs.sh").read_text()
    listed = re.search(r"case \$\{SIZE:-ref\} in ([\w|]+)\)", script).group(1).split("|")
    assert sorted(listed) == sorted(SIZES)
