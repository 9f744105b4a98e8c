"""``dasc eval`` end to end: the JSON contract, the plot, and one-line errors with exit status 2."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from typer.testing import CliRunner

from dasc_compile.cli import app
from tests.support.tiny_models import compile_for, write_gdn

pytestmark = pytest.mark.transformers_range

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


def test_eval_json_contract_and_plot(gdn_dir, plans, tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    drawn = []
    real = Figure.supxlabel
    monkeypatch.setattr(Figure, "supxlabel", lambda self, s, **kw: (drawn.append(s), real(self, s, **kw))[1])
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
    assert doc["protocol"]["versions"] == {"transformers": transformers.__version__, "torch": torch.__version__}
    assert png.stat().st_size > 1000
    assert out.stat().st_mode & 0o777 == 0o644
    # w_max 200's replay window covers the whole 80-token prefix: wr equals dense by construction, said once
    assert [p["arms"]["wr"]["w_replay"] >= 80 for p in doc["plans"]] == [False, False, True]
    assert doc["plans"][2]["arms"]["wr"]["kl"] == 0.0
    cap = doc["plans"][2]["plan"]["w_replay_cap"]
    assert cap >= 80 and r.output.count(f"note: dasc-wr replays the whole 80-token prefix (the plan's W_replay is "
                                        f"{cap} tokens), so its row equals dense by construction; give --prefix-len "
                                        f"above {cap} to measure it\n") == 1       # the cap, not min(n_p, cap) = 80
    assert "-0.0000" not in r.output
    assert drawn == ["as read from checkpoint (trained weights)"]   # the figure names its source, once
    assert r.output.index("dasc-nr") < r.output.index(f"wrote {out}")                # tables before the files
    # under each plan's table, the paired difference over prompts (no init arm in this run: nr - Random only)
    p = doc["plans"][0]["paired"]["nr_minus_random"]["nll_delta_head"]
    assert "paired over prompts, dasc-nr − init" not in r.output
    assert (f"paired over prompts, dasc-nr − Random (mean of the masks on each prompt): ΔNLL 1st 16 {p['mean']:+.4f} "
            f"(SD {p['sd']:.4f}, n 3, nr lower on {round(p['frac_nr_lower'] * 3)}") in r.output


def test_figure_line_names_every_kind():
    from dasc_compile.provenance import CALIBRATED_PREFIX, figure_line

    assert figure_line(CALIBRATED_PREFIX + " (x)") == CALIBRATED_PREFIX
    assert figure_line("initialisation draw, not trained (seed 0)") == "initialisation draw, not trained weights"
    assert figure_line("trained here by x on H200") == "trained weights: trained here by x on H200"
    assert figure_line("") == "trained weights"
    assert figure_line("as read from checkpoint (trained weights)") == "as read from checkpoint (trained weights)"
    assert figure_line("t" * 200, width=20) == "trained weights: " + "t" * 17 + "..."


def test_builtin_prompts_only_without_another_source(gdn_model, tmp_path):
    from dasc_compile.eval.command import DEFAULT_RETRIEVAL

    f = _prompts(tmp_path / "p.jsonl", n=2, length=100)
    got, source = _prompts_of(gdn_model, f, None)
    assert source == f"jsonl:{f}" and len(got) == 2 and all(p.answer is None for p in got)
    got, source = _prompts_of(gdn_model, f, 1)                     # explicit --retrieval N adds them
    assert source == f"jsonl:{f}+builtin-retrieval:1:seed=0" and sum(p.answer is not None for p in got) == 1
    got, source = _prompts_of(gdn_model, None, None, prefix_len=256)  # no source: the built-in needle prompts
    assert source == f"builtin-retrieval:{DEFAULT_RETRIEVAL}:seed=0" and len(got) == DEFAULT_RETRIEVAL
    assert all(p.answer is not None for p in got)


def _prompts_of(em, prompts_file, retrieval, prefix_len=80):
    from dasc_compile.eval.run import make_prompts

    return make_prompts(em.tokenizer, prompts_file, None, 0, retrieval, prefix_len, 8)


def test_horizons_with_plot_is_refused_before_running(gdn_dir, tmp_path):
    png = tmp_path / "h.png"
    line = _one_error_line(_cli("eval", gdn_dir, "--horizons", "--plot", png))
    assert "--horizons" in line and "--plot" in line
    assert not png.exists()


@pytest.mark.parametrize("opt, value, said", [("--plot", ".png", "--plot '.png': give a file name ending in .png"),
                                              ("--device", "meta", "--device meta: the meta device holds no data"),
                                              ("--device", "gpu:0", "--device 'gpu:0': not a torch device")])
def test_a_flag_value_that_cannot_work_is_named(gdn_dir, plans, opt, value, said):
    """Fresh-user findings: --device meta ended in an internal error (--json '': tests/cli/test_user_messages.py)."""
    assert _one_error_line(_cli("eval", gdn_dir, "--plan", plans[1], opt, value)).startswith(f"error: {said}")


def test_prompt_fields_must_be_strings(gdn_dir, plans, tmp_path):
    """{"text": 5} was scored as the text '5' and refused as too short; now the field and its type are named."""
    f = tmp_path / "p.jsonl"
    f.write_text('{"text": 5}\n')
    assert _one_error_line(_cli("eval", gdn_dir, "--plan", plans[1], "--prompts", f)) == \
        f"error: {f}:1: 'text' is int 5; expected a string"
    f.write_text('{"prefix": "a b c", "suffix": ["x"]}\n')
    assert "'suffix' is list [\"x\"]; expected a string" in _one_error_line(_cli("eval", gdn_dir, "--plan", plans[1],
                                                                               "--prompts", f))


def test_an_output_folder_the_system_refuses_is_found_before_running(gdn_dir, plans, tmp_path, monkeypatch):
    """As root, os.access says yes to a folder the file system refuses (/sys, a read-only mount); the JSON
    write then failed after the first prompt. A temporary file is now created there first."""
    import tempfile

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plans[1], "--json", tmp_path / "r.json"))
    assert line == f"error: {tmp_path / 'r.json'}: cannot write there (Permission denied); give a path in a folder you can write to"
    assert not (tmp_path / "r.json").exists()


def test_prefix_beyond_max_position_embeddings_is_refused(gdn_dir, plans, tmp_path):
    # the tiny GDN config says max_position_embeddings 2048: 2000 + 64 + k 16 does not fit, 2000 alone does (horizons)
    f = tmp_path / "long.jsonl"
    f.write_text(json.dumps({"text": "a" * 2100}) + "\n")
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plans[1], "--prompts", f, "--prefix-len", 2000,
                                "--suffix-len", 64))
    assert line == (f"error: the longest prompt (prefix + suffix + answer or --gen-tokens) = 2080 tokens is longer than "
                    f"the model's context: max_position_embeddings 2048 ({gdn_dir / 'config.json'}); give a shorter "
                    f"--prefix-len")
    line = _one_error_line(_cli("eval", gdn_dir, "--horizons", "--prefix-len", 4096))
    assert "--prefix-len = 4096 tokens" in line


@pytest.mark.parametrize("opt,name", [("--json", "missing/r.json"), ("--plot", "missing/q.png"),
                                      ("--json", "adir"), ("--plot", "adir.png")])
def test_unwritable_outputs_are_refused_before_running(gdn_dir, plans, tmp_path, opt, name):
    (tmp_path / "adir").mkdir()
    (tmp_path / "adir.png").mkdir()
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plans[1], opt, tmp_path / name))
    assert str(tmp_path / name) in line
    assert ("does not exist" if "missing" in name else "is a folder") in line
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("opt, name, kind", [("--json", "notes.md", "JSON file"), ("--plot", "notes.png", "PNG image")])
def test_an_output_over_a_file_of_another_kind_is_refused_and_the_file_kept(gdn_dir, plans, tmp_path, opt, name, kind):
    """A fresh user's --json notes.md replaced the notes with JSON; a result file of the right kind is replaced."""
    note = tmp_path / name
    note.write_text("# my notes\n")
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plans[1], opt, note))
    assert f"{note}: exists and is not a {kind}" in line
    assert note.read_text() == "# my notes\n"
    from dasc_compile.userfiles import refuse_foreign_output

    note.write_text(' \n{"earlier": "result"}')             # an earlier --json: passes (it is rewritten)
    refuse_foreign_output(note, "JSON file")
    note.write_bytes(b"\x89PNG\r\n\x1a\n....")                # a PNG: passes here (figures.check_png
    refuse_foreign_output(note, "PNG image")                   # then asks for dasc's mark)
    note.write_bytes(b"")                                     # empty: passes
    refuse_foreign_output(note, "PNG image")


@pytest.mark.parametrize("what", ["config", "plan", "fifo", "symlink"])
def test_eval_json_replaces_only_an_earlier_eval_result(gdn_dir, plans, tmp_path, what):
    """A fresh user's --json replaced a model's config.json, the plan's plan.json, and (as root) /dev/null with a
    regular file: --json now replaces only an earlier dasc eval result (a JSON object with dasc_eval_version),
    never a link, device or FIFO; --plot likewise keeps off anything but a regular file."""
    import os

    from dasc_compile.userfiles import refuse_foreign_output

    if what == "config":
        target = tmp_path / "config.json"
        target.write_text((gdn_dir / "config.json").read_text())
        needle = "not an earlier result of this command (a JSON object with 'dasc_eval_version')"
    elif what == "plan":
        target = tmp_path / "plan.json"
        target.write_text((plans[1] / "plan.json").read_text())
        needle = "not an earlier result of this command"
    elif what == "fifo":
        target = tmp_path / "pipe.json"
        os.mkfifo(target)
        needle = "exists and is a FIFO (named pipe)"
    else:
        real = tmp_path / "real.json"
        real.write_text('{"dasc_eval_version": 1}')
        target = tmp_path / "link.json"
        target.symlink_to(real)
        needle = "is a symbolic link"
    before = os.lstat(target)
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plans[1], "--json", target))
    assert str(target) in line and needle in line
    after = os.lstat(target)
    assert (after.st_mode, after.st_ino, after.st_mtime_ns) == (before.st_mode, before.st_ino, before.st_mtime_ns)
    png = target.with_suffix(".png")
    if what in ("fifo", "symlink"):
        os.rename(target, png)
        line = _one_error_line(_cli("eval", gdn_dir, "--plan", plans[1], "--plot", png))
        assert needle in line
    earlier = tmp_path / "earlier.json"
    earlier.write_text('{"dasc_eval_version": 3, "arms": {}}')
    refuse_foreign_output(earlier, "JSON file", marker="dasc_eval_version")     # an earlier result: passes


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


@pytest.mark.parametrize("args", [["--arms", "dense,bogus"], ["--prefix-len", 0], [], ["--plot", "x.jpg"],
                                  ["--sharegpt-offset", -1]])
def test_other_bad_options(gdn_dir, plans, args):
    base = ["eval", gdn_dir] + ([] if args == [] else ["--plan", plans[1]])
    _one_error_line(_cli(*base, *args))


def test_a_checkpoint_without_some_weights_is_refused_with_both_counts(tmp_path):
    """Past the embedding-table floor (the embeddings and every decay tensor are there), the exact count
    against the model config.json describes still refuses a checkpoint without its MLP weights."""
    import shutil
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    from dasc_compile.compiler import compile_plan
    from dasc_compile.policy import Policy

    ref = Path(__file__).resolve().parents[2] / "plans" / "reference" / "gdn-hybrid-11m-sharegpt"
    part = tmp_path / "part"
    part.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ref / f, part / f)
    tensors = {k: v for f in sorted(ref.glob("*.safetensors")) for k, v in load_file(f).items() if ".mlp." not in k}
    save_file(tensors, part / "model.safetensors")
    have = sum(t.numel() for t in tensors.values())
    _, plan = compile_plan(ref, Policy(w_max=16), tmp_path / "p.dasc", with_kernels=False)
    line = _one_error_line(_cli("eval", part, "--plan", plan))
    assert f"the weights hold {have:,} of the 10,564,480 parameters config.json describes" in line, line


@pytest.mark.parametrize("name, numbers", [
    ("qwen3-next-80b-a3b", "151,936 x 2,048"),
    # said before the transformers >= 5.17 that kimi_linear needs (a fresh user installed it, then met this)
    ("kimi-linear-48b-a3b-calibrated", "82,560 parameters, fewer than the 163,840 x 2,304"),
])
def test_decay_only_reference_is_refused_not_filled_with_random_weights(tmp_path, name, numbers):
    from dasc_compile.compiler import compile_plan
    from dasc_compile.policy import Policy
    from pathlib import Path

    ref = Path(__file__).resolve().parents[2] / "plans" / "reference" / name
    _, plan = compile_plan(ref, Policy(w_max=16), tmp_path / "p.dasc", with_kernels=False)
    line = _one_error_line(_cli("eval", ref, "--plan", plan))
    assert numbers in line and "embedding table" in line and "needs the whole trained checkpoint" in line


def test_a_panel_with_nothing_measured_says_so():
    """Fresh-user finding: on retrieval prompts only, the free-running agreement panel was blank."""
    from dasc_compile.eval.plotting import draw_panels
    from dasc_compile.figures import pyplot

    plt = pyplot()
    arms = {"nr": {"kl": 0.1, "gen_agreement": None}, "dense": {"kl": 0.0, "gen_agreement": None}}
    doc = {"plans": [{"plan": {"w_max": 16}, "arms": arms}, {"plan": {"w_max": 64}, "arms": arms}]}
    fig, axes = plt.subplots(1, 2)
    draw_panels(axes, doc, metrics=(("kl", "KL"), ("gen_agreement", "free")))
    texts = [[t.get_text() for t in ax.texts] for ax in axes]
    plt.close(fig)
    assert texts == [[], ["not measured on these prompts"]]


def test_plan_whose_kept_units_its_policy_does_not_select_is_refused(gdn_dir, plans, tmp_path):
    """A plan edited and re-sealed so that every count still agrees (one kept unit swapped for an omitted one of the
    same layer): the plan reader cannot see it, eval recomputes the selection from the model's decays (§4.1)."""
    import shutil

    from dasc_compile.schema import Plan, canonical_json, with_content_hash

    p = shutil.copytree(plans[1], tmp_path / "forged.dasc")
    raw = json.loads((p / "plan.json").read_text())
    layer = next(lp for lp in raw["layers"] if 0 < lp["n_kept"] < lp["n_units"])
    omitted = next(u for u in range(layer["n_units"]) if u not in layer["kept_units"])
    layer["kept_units"] = sorted(layer["kept_units"][1:] + [omitted])
    (p / "plan.json").write_text(canonical_json(with_content_hash(Plan.model_validate(raw))))
    out = tmp_path / "r.json"
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", p, "--json", out))
    assert "kept_units" in line and "w_max 16" in line and "2 differ" in line, line
    assert not out.exists()
