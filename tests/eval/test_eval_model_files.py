"""What a user test of 2026-12 hit around the model folder and the outputs: tokenizer files, a model type the
transformers release lacks under ``--horizons``, the ``--horizons`` plan, a Random plan's paired lines, and a
signal between ``--json`` and ``--plot``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.json_messages import decode_error
from tests.support.clihelp import ROOT, dasc
from tests.support.cli_runner import cli as _cli, one_error_line as _one_error_line
from tests.support.tiny_models import compile_for

pytestmark = pytest.mark.transformers_range

EXPECTED = ("expected the model's tokenizer.json (the tokenizers library's file) or, for a byte vocabulary, "
            "'dasc_tokenizer': 'bytes' in config.json")


@pytest.fixture(scope="module")
def tok_model(gdn_dir, tmp_path_factory):
    """The tiny GDN model with a Hugging Face tokenizer config (the bundled references') instead of bytes."""
    d = tmp_path_factory.mktemp("tok") / "m"
    shutil.copytree(gdn_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["dasc_tokenizer"]
    (d / "config.json").write_text(json.dumps(cfg))
    shutil.copy(ROOT / "plans/reference/gdn-hybrid-11m-sharegpt/tokenizer_config.json", d)
    return d, compile_for(d, 16, d.parent / "w16.dasc")


@pytest.mark.parametrize("mode", ["plan", "horizons", "sweep"])
def test_a_missing_tokenizer_json_is_one_line_naming_it(tok_model, mode):
    """It was 'error: internal error (ValueError: Couldn't instantiate the backend tokenizer ...); this is a bug in
    dasc', exit status 1, in dasc eval (also --horizons) and dasc sweep --eval."""
    import transformers

    d, plan = tok_model
    args = {"plan": ["eval", d, "--plan", plan, "--retrieval", 1, "--prefix-len", 64],
            "horizons": ["eval", d, "--horizons", "--retrieval", 1, "--prefix-len", 64],
            "sweep": ["sweep", d, "--wmax", 64, "--eval", "retrieval:1", "--prefix-len", 64]}[mode]
    line = _one_error_line(_cli(*args))
    assert line.startswith(f"error: {d / 'tokenizer.json'}: not found, and transformers {transformers.__version__} "
                           f"cannot build a tokenizer from tokenizer_config.json alone (ValueError: ")
    assert line.endswith(f"); {EXPECTED}")


@pytest.mark.parametrize("content, said", [
    ("{garbage", f"not readable JSON ({decode_error('{garbage')})"),
    ("", f"not readable JSON ({decode_error('')})"),
    ("[]", "a tokenizer file must be a JSON object, got list"),
])
def test_a_garbage_tokenizer_json_is_one_line_naming_it(tok_model, content, said):
    d, plan = tok_model
    try:
        (d / "tokenizer.json").write_text(content)
        line = _one_error_line(_cli("eval", d, "--plan", plan, "--retrieval", 1, "--prefix-len", 64))
    finally:
        (d / "tokenizer.json").unlink()
    assert line == f"error: {d / 'tokenizer.json'}: {said}; {EXPECTED}"


def test_a_tokenizer_json_transformers_cannot_read_is_one_line(tok_model):
    import transformers

    d, plan = tok_model
    try:
        (d / "tokenizer.json").write_text("{}")
        line = _one_error_line(_cli("eval", d, "--horizons", "--retrieval", 1, "--prefix-len", 64))
    finally:
        (d / "tokenizer.json").unlink()
    assert line.startswith(f"error: {d}: transformers {transformers.__version__} cannot build a tokenizer from "
                           f"tokenizer.json, tokenizer_config.json (") and line.endswith(f"); {EXPECTED}")


def test_horizons_refuses_a_missing_model_class_before_transformers_speaks(capfd):
    """On transformers 5.12 (no kimi_linear) --horizons printed transformers' own "[transformers] You are using a
    model of type `kimi_linear` to instantiate a model of type ``" before the error line (the --plan path did not),
    and with --init-seed gave transformers' "cannot load" text instead of the release to install."""
    from dasc_compile.eval.hf_compat import MIN_TRANSFORMERS_KDA, transformers_version
    from transformers.utils import logging as hf_logging

    if transformers_version() >= MIN_TRANSFORMERS_KDA:
        pytest.skip("this transformers release has kimi_linear")
    ref = ROOT / "plans/reference/kda-hybrid-11m-sharegpt"
    before = hf_logging.get_verbosity()
    for extra in ([], ["--init-seed", 0]):
        hf_logging.set_verbosity_warning()        # as in a fresh process: an earlier test may have quieted it
        try:
            line = _one_error_line(_cli("eval", ref, "--horizons", "--retrieval", 1, "--prefix-len", 64, *extra))
        finally:
            hf_logging.set_verbosity(before)
        assert line.startswith(f"error: dasc eval of a kimi_linear (KDA) model ({ref}) needs transformers >= 5.17")
        assert capfd.readouterr().err == ""


def test_horizons_says_whose_policy_gives_h_s(gdn_dir, tmp_path):
    """--plan with --horizons gives H_s its a_s and eps; the run printed nothing that said so."""
    plan = compile_for(gdn_dir, 16, tmp_path / "p.dasc", a_s=1.5, eps=0.01)
    out = tmp_path / "h.json"
    r = _cli("eval", gdn_dir, "--horizons", "--plan", plan, "--retrieval", 1, "--prefix-len", 80, "--json", out)
    assert r.exit_code == 0, r.output
    assert f"H_s with a_s 1.5, eps 0.01: the policy of --plan {plan}\n" in r.output
    pr = json.loads(out.read_text())["protocol"]
    assert (pr["plan"], pr["a_s"], pr["eps"]) == (str(plan), 1.5, 0.01)
    r = _cli("eval", gdn_dir, "--horizons", "--retrieval", 1, "--prefix-len", 80)
    assert r.exit_code == 0 and "H_s with a_s -0.3, eps 0.001: the family's defaults\n" in r.output


def test_a_random_plan_s_paired_lines_name_it(gdn_dir, tmp_path):
    """They read "Random plan (seed 7), zero-filled − ... (..., nr lower on 2)"."""
    rnd = compile_for(gdn_dir, 16, tmp_path / "r.dasc", random_seed=7)
    r = _cli("eval", gdn_dir, "--plan", rnd, "--retrieval", 2, "--prefix-len", 80, "--arms", "nr,random")
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.output.splitlines() if ln.startswith("paired over prompts"))
    assert line.startswith("paired over prompts, Random plan (seed 7), zero-filled − Random (mean of the masks on "
                           "each prompt): ΔNLL 1st 16 ")
    assert "the Random plan lower on" in line and "nr lower" not in line


def test_a_signal_during_the_plot_says_the_plot_was_not_written(gdn_dir, tmp_path, monkeypatch):
    """'error: interrupted (SIGINT); J was written completely, only the summary was not printed' while the --plot
    PNG was never written."""
    import os
    import signal

    from dasc_compile.eval import plotting

    plan = compile_for(gdn_dir, 16, tmp_path / "p.dasc")
    monkeypatch.setattr(plotting, "plot_quality", lambda doc, path: os.kill(os.getpid(), signal.SIGINT))
    out, png = tmp_path / "r.json", tmp_path / "q.png"
    r = dasc("eval", gdn_dir, "--plan", plan, "--retrieval", 1, "--prefix-len", 80, "--arms", "nr", "--json", out,
             "--plot", png)
    assert r.code == 130 and r.err_lines == [f"error: interrupted (SIGINT); {out} was written completely, {png} was "
                                             f"not written and the summary was not printed"], r.err
    assert json.loads(out.read_text())["protocol"]["complete"] is True and not png.exists()


def test_the_written_note_names_pending_outputs():
    import dasc_compile.cli_exit as cx

    saved = cx._written[:], cx._pending[:]
    try:
        cx._written[:], cx._pending[:] = [], ["q.png"]
        assert cx._written_note() == "; q.png was not written"
        cx._written[:] = [str(Path(__file__))]
        cx._pending[:] = [str(Path(__file__))]              # pending, then written: only the summary is lost
        assert cx._written_note() == f"; {Path(__file__)} was written completely, only the summary was not printed"
    finally:
        cx._written[:], cx._pending[:] = saved
