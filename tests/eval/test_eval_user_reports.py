"""What a new user hit with ``dasc eval`` (issue 20, item 1): each case as the user saw it."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from dasc_compile.cli import app
from tests.support.cli_runner import cli as _cli, one_error_line as _one_error_line
from tests.support.tiny_models import compile_for

pytestmark = pytest.mark.transformers_range

runner = CliRunner()


def test_missing_transformers_is_one_line_naming_the_extra(gdn_dir, tmp_path, monkeypatch):
    plan = compile_for(gdn_dir, 16, tmp_path / "p.dasc")
    monkeypatch.setitem(sys.modules, "transformers", None)        # import transformers -> ImportError
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan))
    assert line == ("error: dasc eval needs the 'transformers' package (>= 5.12): pip install 'dasc[eval]' "
                    "(in a checkout: pip install -e '.[eval]', or bash scripts/setup_env.sh)")


def test_help_keeps_the_extra_name():
    r = runner.invoke(app, ["eval", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "pip install 'dasc[eval]'" in r.output


def test_prefix_beyond_a_nested_context_is_refused_before_loading(tmp_path):
    from tests.support.tiny_models import write_qwen35

    d = write_qwen35(tmp_path / "q35")
    cfg = json.loads((d / "config.json").read_text())
    assert "max_position_embeddings" not in cfg and cfg["text_config"]["max_position_embeddings"] == 2048
    plan = compile_for(d, 16, tmp_path / "p.dasc")
    line = _one_error_line(_cli("eval", d, "--plan", plan, "--prefix-len", 2050))
    assert line.startswith("error: --prefix-len = 2050 tokens is longer") and "text_config.max_position_embeddings 2048" in line


def test_kimi_context_is_model_max_length(kda_dir, tmp_path):
    cfg = json.loads((kda_dir / "config.json").read_text())
    assert cfg["model_max_length"] == 2048 and "max_position_embeddings" not in cfg
    plan = compile_for(kda_dir, 16, tmp_path / "p.dasc")
    line = _one_error_line(_cli("eval", kda_dir, "--plan", plan, "--prefix-len", 4000))
    assert "model_max_length 2048" in line


def test_random_plan_is_labelled_random_and_empty_plan_prints_inf(gdn_dir, tmp_path):
    rnd = compile_for(gdn_dir, 16, tmp_path / "r.dasc", random_seed=2027)
    none = compile_for(gdn_dir, 10 ** 9, tmp_path / "n.dasc")          # no horizon is that long: nothing kept
    out = tmp_path / "r.json"
    r = _cli("eval", gdn_dir, "--plan", rnd, "--plan", none, "--retrieval", 1, "--prefix-len", 80,
             "--arms", "dense,nr", "--json", out)
    assert r.exit_code == 0, r.output
    assert "Random plan (seed 2027), zero-filled" in r.output and "Random plan (seed 2027) w_max 16" in r.output
    assert r.output.count("dasc-nr") == 1                               # only the empty horizon plan's row
    assert "C_temp inf," in r.output and "infx" not in r.output
    doc = json.loads(out.read_text())                                   # strict JSON: inf is null
    assert doc["plans"][0]["plan"]["selection"] == "random" and doc["plans"][0]["plan"]["random_seed"] == 2027
    assert doc["plans"][1]["plan"]["n_kept"] == 0 and doc["plans"][1]["plan"]["c_temp_ragged"] is None


def test_interrupted_run_keeps_the_finished_prompts(gdn_dir, tmp_path, monkeypatch):
    from dasc_compile.eval import protocol

    plan = compile_for(gdn_dir, 16, tmp_path / "p.dasc")
    real, calls = protocol.run_prompt, []

    def stop_on_third(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(protocol, "run_prompt", stop_on_third)
    out = tmp_path / "r.json"
    r = _cli("eval", gdn_dir, "--plan", plan, "--retrieval", 4, "--prefix-len", 80,
             "--arms", "dense,nr", "--json", out)
    line = _one_error_line(r, code=130)
    assert line == f"error: interrupted (SIGINT) after 2 of 4 prompts; the 2 finished are in {out}"
    doc = json.loads(out.read_text())
    assert doc["protocol"]["n_prompts"] == 2 and doc["protocol"]["n_prompts_planned"] == 4
    assert doc["protocol"]["complete"] is False and doc["arms"]["nr"]["n_prompts"] == 2


@pytest.mark.parametrize("flag,value", [("--init-seed", 2**64), ("--init-seed", -1), ("--seed", -1), ("--seed", 2**63)])
def test_a_seed_outside_64_bits_is_refused_by_its_flag(gdn_dir, tmp_path, flag, value):
    """`--init-seed 18446744073709551616` read as "transformers cannot load this checkpoint (Overflow ...)", and
    negative seeds were taken as other 64-bit seeds; both are named by their flag now, before the model loads."""
    plan = compile_for(gdn_dir, 16, tmp_path / "p.dasc")
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, "--arms", "nr,untrained", flag, value))
    assert line == f"error: {flag} {value}: expected an integer in [0, {2**63 - 1}] (torch.Generator seeds are 64-bit)"


def test_the_seed_bounds_are_inclusive():
    from dasc_compile.errors import MAX_SEED, DascInputError, check_seed

    for ok in (None, 0, MAX_SEED):
        check_seed("--seed", ok)
    for bad in (-1, MAX_SEED + 1):
        with pytest.raises(DascInputError, match=f"^--init-seed {bad}: expected an integer in"):
            check_seed("--init-seed", bad)


def test_controls_without_an_initial_state_are_refused(gdn_dir, tmp_path):
    plan = compile_for(gdn_dir, 16, tmp_path / "p.dasc")
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, "--arms", "nr,init"))
    assert "--init-from DIR or --init-seed N" in line
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, "--init-from", gdn_dir, "--init-seed", 1))
    assert "alternatives" in line
    # a folder that is not a checkpoint: named as --init-from, without compile's "--config" hint eval lacks
    (tmp_path / "notes").mkdir()
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, "--arms", "nr,init", "--init-from",
                                tmp_path / "notes"))
    assert line.startswith(f"error: --init-from {tmp_path / 'notes'}: no config.json") and "--config" not in line


@pytest.mark.parametrize("ref", ["qwen3-next-80b-a3b-calibrated", "kimi-linear-48b-a3b-calibrated"])
def test_a_refused_reference_prints_only_the_error_line(ref, tmp_path):
    """In a real process transformers' own notices reached stderr before dasc's one line: "[transformers]
    The fast path is not available ..." (Qwen3-Next without flash-linear-attention, from the meta-device
    preflight) and a FutureWarning about config.json's ``rope_scaling`` (Kimi-Linear on transformers 5.24).
    In-process runners miss both (pytest records warnings; transformers' handler holds the real stderr)."""
    from tests.support.clihelp import ROOT, dasc, dasc_proc

    if ref.startswith("kimi"):
        from tests.eval.conftest import skip_without_kimi_linear

        skip_without_kimi_linear()
    model = ROOT / "plans/reference" / ref
    assert dasc("compile", model, "--wmax", 16, "--out", tmp_path / "p.dasc", "--no-kernels", "-q").code == 0
    r = dasc_proc("eval", model, "--plan", tmp_path / "p.dasc", "--retrieval", 1, cwd=tmp_path,
                  env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "whole trained checkpoint" in lines[0], r.stderr


@pytest.mark.parametrize("sig, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_real_ctrl_c_says_which_prompts_were_kept(gdn_dir, tmp_path, monkeypatch, sig, code):
    """Under the real entry point a Ctrl-C is cli_exit's Interrupted, not a KeyboardInterrupt: the user got
    a bare 'error: interrupted (SIGINT)' and was not told that the finished prompts were in --json."""
    import os
    import signal

    from dasc_compile.eval import protocol
    from tests.support.clihelp import dasc

    plan = compile_for(gdn_dir, 16, tmp_path / "p.dasc")
    real, calls = protocol.run_prompt, []

    def signal_on_third(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), getattr(signal, sig))
        return real(*a, **kw)

    monkeypatch.setattr(protocol, "run_prompt", signal_on_third)
    out = tmp_path / "r.json"
    r = dasc("eval", gdn_dir, "--plan", plan, "--retrieval", 4, "--prefix-len", 80,
             "--arms", "dense,nr", "--json", out)
    assert r.code == code and r.err_lines == [f"error: interrupted ({sig}) after 2 of 4 prompts; the 2 finished "
                                              f"are in {out}"], (r.code, r.err)
    doc = json.loads(out.read_text())
    assert doc["protocol"]["n_prompts"] == 2 and doc["protocol"]["complete"] is False


def test_init_from_a_missing_folder_names_the_flag(gdn_dir, tmp_path):
    plan = compile_for(gdn_dir, 16, tmp_path / "p.dasc")
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, "--arms", "dense,init", "--init-from",
                                tmp_path / "nowhere"))
    assert line.startswith(f"error: --init-from {tmp_path / 'nowhere'}: does not exist")


def test_a_missing_or_non_folder_model_says_which(gdn_dir, tmp_path):
    plan = compile_for(gdn_dir, 16, tmp_path / "p.dasc")
    gone = tmp_path / "nowhere"
    assert _one_error_line(_cli("eval", gone, "--plan", plan)).startswith(f"error: {gone}: no such directory")
    afile = tmp_path / "weights.bin"
    afile.write_bytes(b"x")
    assert _one_error_line(_cli("eval", afile, "--plan", plan)).startswith(f"error: {afile}: not a directory")


@pytest.mark.parametrize("arms, needle", [("untrained", "give at least one of dense,nr,wr,random beside it"),
                                          (" , ", "names no arm"), ("dense,,nr", "an empty name between commas"),
                                          ("dense,nr,nr,random,dense", "dense, nr named more than once")])
def test_arms_that_would_run_nothing_are_refused(gdn_dir, tmp_path, arms, needle):
    """`--arms untrained` alone ran the model and printed two empty tables (status 0); `--arms ''` read
    "unknown arm(s) []"; `--arms dense,nr,nr` ran nr twice and `dense,,nr` passed."""
    plan = compile_for(gdn_dir, 16, tmp_path / "w16.dasc")
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, "--arms", arms, "--init-seed", 0))
    assert line.startswith(f"error: --arms {arms!r}: ") and needle in line


def test_init_seed_is_checked_against_the_record_on_kda_too(tmp_path):
    """`--init-seed 1` and `12345` passed on the bundled KDA 11M, whose train_log.json records seed 0's decays:
    the record names Kimi-Linear's live parameters (...forget_gate.A_log), the rebuild the checkpoint's, and
    an exact-name match checked nothing."""
    from pathlib import Path

    from tests.eval.conftest import skip_without_kimi_linear

    skip_without_kimi_linear()
    ref = Path(__file__).resolve().parents[2] / "plans" / "reference" / "kda-hybrid-11m-sharegpt"
    plan = compile_for(ref, 16, tmp_path / "w16.dasc")
    line = _one_error_line(_cli("eval", ref, "--plan", plan, "--arms", "nr,init", "--init-seed", 1))
    assert "--init-seed 1: transformers' initialisation differs from the initial decays" in line
    assert "model.layers.0.self_attn.A_log" in line


@pytest.mark.parametrize("case", ["unreadable-record", "init-from-itself"])
def test_init_controls_that_cannot_be_trusted_are_refused(gdn_dir, tmp_path, case):
    """A train_log.json that cannot be read skipped the check silently; --init-from the trained model itself gave
    an init control identical to the plan (Jaccard 1.000) without a word."""
    import shutil

    model = tmp_path / "m"
    shutil.copytree(gdn_dir, model)
    plan = compile_for(model, 16, tmp_path / "w16.dasc")
    if case == "unreadable-record":
        (model / "train_log.json").write_text('{"init_decays": ')
        line = _one_error_line(_cli("eval", model, "--plan", plan, "--arms", "nr,init", "--init-seed", 0))
        assert "train_log.json is there but unreadable" in line
    else:
        line = _one_error_line(_cli("eval", model, "--plan", plan, "--arms", "nr,init", "--init-from", model))
        assert f"--init-from {model}: its decay tensors equal the model's" in line


@pytest.mark.parametrize("args, needle", [
    (["--horizons", "--arms", "nr,bogus"], "--arms acts only without --horizons"),
    (["--horizons", "--suffix-len", "8"], "--suffix-len acts only without --horizons"),
    (["--horizons", "--gen-tokens", "3"], "--gen-tokens acts only without --horizons"),
    (["--sharegpt-offset", "5"], "--sharegpt-offset acts only with --sharegpt N"),
    (["--sharegpt-offset", "0"], "--sharegpt-offset acts only with --sharegpt N")])
def test_options_the_run_would_ignore_are_refused(gdn_dir, tmp_path, args, needle):
    """`--horizons --arms nr,bogus --suffix-len 8 --gen-tokens 3` ran with no word about the ignored options
    (not even the unknown arm), and `--sharegpt-offset 5` without --sharegpt was ignored; dasc sweep refuses
    the same kind of thing."""
    plan = compile_for(gdn_dir, 16, tmp_path / "w16.dasc")
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, *args))
    assert line == f"error: {needle}" + ("" if "sharegpt" in needle else " (the horizon validation scores no arm)")


def test_a_fifo_as_prompts_file_is_refused_instead_of_blocking(gdn_dir, tmp_path):
    """`--prompts FIFO` blocked until killed; `--policy FIFO` was already refused at once."""
    import os

    fifo = tmp_path / "p.jsonl"
    os.mkfifo(fifo)
    plan = compile_for(gdn_dir, 16, tmp_path / "w16.dasc")
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, "--prompts", fifo))
    assert line == f"error: {fifo}: prompts file is a FIFO (named pipe); expected a regular file"


def test_init_from_a_file_and_json_under_a_file_name_what_is_wrong(gdn_dir, tmp_path):
    """`--init-from FILE` gave an error that did not name the flag; `--json afile/r.json` said the folder
    did not exist."""
    plan = compile_for(gdn_dir, 16, tmp_path / "w16.dasc")
    f = tmp_path / "afile"
    f.write_text("x")
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, "--arms", "nr,init", "--init-from", f))
    assert line.startswith(f"error: --init-from {f}: not a directory; expected the model's initial checkpoint")
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, "--json", f / "r.json"))
    assert line == f"error: {f / 'r.json'}: {f} is not a folder; give a path in an existing folder"


def test_init_seed_is_checked_against_a_trainer_checkpoints_record(gdn_dir, tmp_path):
    """A checkpoint written by benchmarks/train keeps its initial decays in train_state/init_decays.safetensors,
    not train_log.json, and --init-seed with the wrong seed (or GDN's log-uniform dt) passed unchecked."""
    import shutil

    import torch
    from safetensors.torch import save_file

    from dasc_compile.eval.controls import init_decay_tensors
    from dasc_compile.eval.run import checkpoint_decays

    model = tmp_path / "m"
    shutil.copytree(gdn_dir, model)
    plan = compile_for(model, 16, tmp_path / "w16.dasc")
    spec, _, _ = checkpoint_decays(model)
    seed0, _ = init_decay_tensors(model, spec, None, 0)            # no record yet: nothing to check against
    (model / "train_state").mkdir()
    rec = {f"live:{n}": t.clone().contiguous() for n, t in seed0}
    save_file(rec, str(model / "train_state" / "init_decays.safetensors"))
    init_decay_tensors(model, spec, None, 0)                        # the recorded seed passes
    rec = {k: (v + 0.5).contiguous() for k, v in rec.items()}
    save_file(rec, str(model / "train_state" / "init_decays.safetensors"))
    line = _one_error_line(_cli("eval", model, "--plan", plan, "--arms", "nr,init", "--init-seed", 0))
    assert "--init-seed 0: transformers' initialisation differs from the initial decays" in line
    assert "init_decays.safetensors" in line and torch.is_tensor(seed0[0][1])


def test_horizons_with_the_model_as_its_own_init_and_one_path_for_json_and_plot_are_refused(gdn_dir, tmp_path):
    plan = compile_for(gdn_dir, 16, tmp_path / "w16.dasc")
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, "--horizons", "--init-from", gdn_dir))
    assert f"--init-from {gdn_dir}: its decay tensors equal the model's" in line
    same = tmp_path / "same.png"
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, "--json", same, "--plot", same))
    assert line == f"error: {same}: given as both --json and --plot; give each its own file" and not same.exists()


def test_weights_under_another_release_s_names_say_so(gdn_dir, tmp_path):
    """A Nemotron-H checkpoint written by transformers 5.12 and read by 5.24 was refused as '1 weights missing
    ... needs the whole trained checkpoint': the weight was there under 5.12's name. A renamed tensor (missing
    under the expected name, present under another) now says the names differ and which release wrote it."""
    import shutil

    from safetensors.torch import load_file, save_file

    model = tmp_path / "model"
    shutil.copytree(gdn_dir, model)
    files = sorted(model.glob("*.safetensors"))
    for f in files:
        t = load_file(f)
        if "model.norm.weight" in t:
            t["model.final_norm.weight"] = t.pop("model.norm.weight")
            save_file(t, f, metadata={"format": "pt"})
    index = model / "model.safetensors.index.json"
    if index.exists():
        doc = json.loads(index.read_text())
        doc["weight_map"]["model.final_norm.weight"] = doc["weight_map"].pop("model.norm.weight")
        index.write_text(json.dumps(doc))
    cfg = json.loads((model / "config.json").read_text())
    cfg["transformers_version"] = "4.99.0"
    (model / "config.json").write_text(json.dumps(cfg))
    plan = compile_for(model, 16, tmp_path / "p.dasc")
    line = _one_error_line(_cli("eval", model, "--plan", plan))
    import transformers

    v = transformers.__version__
    assert line == (f"error: {model}: transformers {v} expects 1 weight under other names than the checkpoint's "
                    f"(e.g. it expects model.norm.weight, the checkpoint has model.final_norm.weight); it was "
                    f"written by transformers 4.99.0: run dasc eval with transformers 4.99.0, or load and save it "
                    f"again with {v}")


def test_a_weight_truly_missing_is_still_called_missing(gdn_dir, tmp_path):
    from dasc_compile.eval.hf_compat import missing_weights_error

    err = missing_weights_error(tmp_path, {}, ["model.norm.weight"], [])
    assert str(err) == (f"{tmp_path}: 1 weight missing from the checkpoint (e.g. model.norm.weight); dasc eval needs "
                        f"the whole trained checkpoint")
    err = missing_weights_error(tmp_path, {}, ["a", "b"], ["c"])     # no release recorded in the config
    assert "2 weights under other names" in str(err) and "written by another transformers release" in str(err)


def test_json_dash_is_refused_and_a_decay_only_init_for_untrained_names_the_flag(gdn_dir, tmp_path, monkeypatch):
    """`--json -` wrote a file named '-'; `--arms untrained --init-from DECAY_ONLY` said 'needs the whole trained
    checkpoint' without naming --init-from or the arm that reads the initial weights."""
    import shutil

    from safetensors.torch import load_file, save_file

    monkeypatch.chdir(tmp_path)
    plan = compile_for(gdn_dir, 16, tmp_path / "w16.dasc")
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, "--json", "-"))
    assert line.startswith("error: --json -: give a file name") and not (tmp_path / "-").exists()
    init = tmp_path / "init"
    init.mkdir()
    shutil.copy(gdn_dir / "config.json", init / "config.json")
    weights = {}
    for f in sorted(gdn_dir.glob("*.safetensors")):
        weights.update({k: v for k, v in load_file(str(f)).items() if k.endswith(("A_log", "dt_bias"))})
    save_file({k: (v + 0.25).contiguous() for k, v in weights.items()}, str(init / "model.safetensors"))
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, "--arms", "dense,nr,untrained", "--init-from", init))
    assert line.startswith(f"error: --init-from {init}: the weights hold") and "--arms untrained" in line
    assert "trained checkpoint" not in line


def test_one_plan_given_twice_is_refused(gdn_dir, tmp_path):
    """`--plan P --plan P/plan.json` evaluated the same plan twice: two identical tables, no word."""
    plan = compile_for(gdn_dir, 16, tmp_path / "w16.dasc")
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, "--plan", plan / "plan.json"))
    assert line == f"error: --plan {plan / 'plan.json'}: the same plan as --plan {plan}; give each plan once"
