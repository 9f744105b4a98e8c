"""``dasc eval`` end to end: the JSON contract, the plot, and one-line errors with exit status 2."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dasc_compile.cli import app
from tests.support.tiny_models import compile_for, write_gdn

runner = CliRunner()


def _cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def _prompts(path, n=2, length=90):
    text = "User: tell me about rivers.\n\nAssistant: Rivers carry water from hills to the sea, and towns grow by them. " * 3
    path.write_text("".join(json.dumps({"text": text[i:i + length]}) + "\n" for i in range(n)))
    return path


@pytest.fixture(scope="module")
def plans(gdn_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("plans")
    return [compile_for(gdn_dir, w, d / f"w{w}.dasc") for w in (4, 16, 200)]


def test_eval_json_contract_and_plot(gdn_dir, plans, tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "q.png"
    r = _cli("eval", gdn_dir, *sum((["--plan", p] for p in plans), []), "--prompts", _prompts(tmp_path / "p.jsonl", length=100),
             "--retrieval", 1, "--prefix-len", 80, "--suffix-len", 8, "--gen-tokens", 4, "--json", out, "--plot", png)
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert set(doc) >= {"arms", "plan", "model", "protocol", "plans"}
    assert [p["plan"]["w_max"] for p in doc["plans"]] == [4, 16, 200]
    for arm in ("dense", "nr", "wr"):
        assert set(doc["arms"][arm]) >= {"nll_delta", "kl", "agreement", "retrieval_acc"}
        assert all(isinstance(doc["arms"][arm][m], float) for m in ("nll_delta", "kl", "agreement", "retrieval_acc"))
    for m in ("nll_delta", "kl", "agreement", "retrieval_acc"):
        assert set(doc["arms"]["random"][m]) == {"mean", "sd"}
    assert doc["arms"]["dense"]["nll_delta"] == 0.0 and doc["arms"]["dense"]["kl"] == 0.0
    assert doc["protocol"]["n_prompts"] == 3 and doc["protocol"]["n_retrieval_prompts"] == 1
    assert len(doc["protocol"]["prompts_sha256"]) == 64 and len(doc["plan"]["content_hash"]) == 64
    assert doc["protocol"]["random_seeds"] == [1234, 2027, 3407, 4519, 5683]
    assert png.stat().st_size > 1000


def test_eval_horizons_table(gdn_dir, tmp_path):
    out = tmp_path / "h.json"
    r = _cli("eval", gdn_dir, "--horizons", "--prompts", _prompts(tmp_path / "p.jsonl"), "--retrieval", 0,
             "--prefix-len", 64, "--json", out)
    assert r.exit_code == 0, r.output
    t = json.loads(out.read_text())["table_1b"]
    assert t["n_pairs"] == 2 * 2                       # 2 prefixes x 2 GDN layers
    assert set(t["hs_he"]) == {"median", "q25", "q75", "n"}
    assert "Table 1(b)" in r.output


def _one_error_line(r):
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    return lines[0]


def test_model_without_recurrent_layers_is_refused(tmp_path, plans):
    d = tmp_path / "llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    assert "no recurrent" in _one_error_line(_cli("eval", d, "--plan", plans[0]))
    attn_only = write_gdn(tmp_path / "attn", layer_types=("full_attention", "full_attention"))
    assert "no recurrent" in _one_error_line(_cli("eval", attn_only, "--plan", plans[0]))


def test_plan_from_other_decay_tensors_is_refused(tmp_path, plans):
    other = write_gdn(tmp_path / "other", a_log=(0.1, 0.2, 0.3, 0.4))
    out = tmp_path / "r.json"
    line = _one_error_line(_cli("eval", other, "--plan", plans[1], "--json", out))
    assert "other decay tensors" in line
    assert not out.exists()


def test_prompts_shorter_than_the_prefix_are_refused(gdn_dir, plans, tmp_path):
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plans[1], "--prompts",
                                _prompts(tmp_path / "p.jsonl", length=50), "--prefix-len", 64, "--suffix-len", 8))
    assert "shorter than --prefix-len 64" in line


@pytest.mark.parametrize("args", [["--arms", "dense,bogus"], ["--prefix-len", 0], [], ["--plot", "x.jpg"]])
def test_other_bad_options(gdn_dir, plans, args):
    base = ["eval", gdn_dir] + ([] if args == [] else ["--plan", plans[1]])
    _one_error_line(_cli(*base, *args))


def test_decay_only_reference_is_refused_not_filled_with_random_weights(tmp_path):
    from dasc_compile.compiler import compile_plan
    from dasc_compile.policy import Policy
    from pathlib import Path

    ref = Path(__file__).resolve().parents[2] / "plans" / "reference" / "qwen3-next-80b-a3b"
    _, plan = compile_plan(ref, Policy(w_max=16), tmp_path / "p.dasc", with_kernels=False)
    line = _one_error_line(_cli("eval", ref, "--plan", plan))
    assert "parameters config.json describes" in line
