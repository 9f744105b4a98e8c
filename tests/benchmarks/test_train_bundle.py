"""benchmarks/train/bundle.py on smoke-size checkpoints written by the trainer itself (two sessions each, CPU):
the bundle's shards hold exactly the checkpoint's tensors, transformers, dasc eval's loader and dasc compile
read it, PROVENANCE.md says how it was trained, and bad input is refused in one line with nothing written."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks.train import bundle as B  # noqa: E402
from benchmarks.train.bundle_md import _utc  # noqa: E402
from tests.benchmarks.test_train_refs import FAMILIES, _args, make_data  # noqa: E402

MODEL_TYPE = {"gdn": "qwen3_next", "kda": "kimi_linear", "mamba2": "nemotron_h"}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """{family: checkpoint dir}: built lazily, 2 steps at commit aaaa111 then 1 resumed step at bbbb222 with
    --attn-lr-mult 2 (each session records its own recipe)."""
    from benchmarks.train.train import main

    root = tmp_path_factory.mktemp("ck")
    data = make_data(root / "data")
    made = {}

    def get(family: str) -> Path:
        if family not in made:
            main(_args(data, root / "s0", family, 2, "--commit", "aaaa111"))
            main(_args(data, root / "s1", family, 1, "--commit", "bbbb222", "--resume", str(root / "s0" / family),
                       "--attn-lr-mult", "2"))
            made[family] = root / "s1" / family
        return made[family]
    return get


def _tensors(d: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(d.glob("model*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_through_shards_transformers_eval_and_compile(ckpts, tmp_path, family):
    from typer.testing import CliRunner
    from transformers import AutoModelForCausalLM

    from dasc_compile.cli import app
    from dasc_compile.eval.models import load_eval_model

    src = ckpts(family)
    out = tmp_path / "bundle"
    src_bytes = sum(f.stat().st_size for f in src.glob("model*.safetensors"))
    assert src_bytes > 100_000
    limit = 40_000                       # a smoke model is 110-160 kB: several shards
    files = B.bundle(src, out, max_bytes=limit)
    shards = sorted(out.glob("model-*-of-*.safetensors"))
    assert len(shards) >= src_bytes // limit >= 2 and not (out / "model.safetensors").exists()
    assert all(p.stat().st_size <= limit for p in out.iterdir()) and files == {p.name: p.stat().st_size
                                                                            for p in out.iterdir()}
    assert {p.name for p in out.iterdir()} == {s.name for s in shards} | {
        "config.json", "tokenizer.json", "tokenizer_config.json", B.INDEX, "train_log.json", "PROVENANCE.md"}
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (src / name).read_bytes()

    want, got = _tensors(src), _tensors(out)
    assert sorted(want) == sorted(got)
    for k, t in want.items():            # same dtype (bf16, decays fp32) and the same bits
        assert got[k].dtype == t.dtype and torch.equal(got[k], t), k
    assert {str(t.dtype) for k, t in got.items() if k.endswith(("A_log", "dt_bias"))} == {"torch.float32"}
    assert {str(t.dtype) for k, t in got.items() if not k.endswith(("A_log", "dt_bias"))} == {"torch.bfloat16"}
    index = json.loads((out / B.INDEX).read_text())
    assert set(index["weight_map"]) == set(want) and set(index["weight_map"].values()) == {s.name for s in shards}
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in want.values())

    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert model.config.model_type == MODEL_TYPE[family]
    live, ref_sd = model.state_dict(), AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).state_dict()
    assert sorted(live) == sorted(ref_sd) and all(torch.equal(live[k], ref_sd[k]) for k in live)
    # the stored decays are live parameters bit for bit (other tensors may be renamed or fused on load:
    # transformers >= 5.17 joins Kimi-Linear's q/k/v_conv1d into one conv1d)
    loaded = {v.numpy().tobytes() for v in live.values()}
    assert all(t.float().numpy().tobytes() in loaded for k, t in want.items() if k.endswith(("A_log", "dt_bias")))

    em, ref = load_eval_model(out), load_eval_model(src)
    assert em.family == family and em.layer_ids == ref.layer_ids and len(em.layer_ids) == 3
    ids = em.tokenizer.encode("the river")
    assert ids == ref.tokenizer.encode("the river") and em.tokenizer.decode(ids) == "the river"
    from dasc_compile.eval.models import HFTokenizer

    assert isinstance(em.tokenizer, HFTokenizer)
    assert torch.equal(em.forward(ids, em.new_cache()), ref.forward(ids, ref.new_cache()))

    plans = []
    for m, name in ((src, "src"), (out, "bundle")):
        r = CliRunner().invoke(app, ["compile", str(m), "--wmax", "512", "--out", str(tmp_path / f"{name}.dasc"),
                                     "--no-kernels", "-q"])
        assert r.exit_code == 0, r.output
        plans.append((tmp_path / f"{name}.dasc" / "plan.json").read_bytes())
    # 3 recurrent layers x (GDN: 4 value heads; Mamba2: 4 heads; KDA: 2 heads x 8 key channels)
    assert plans[0] == plans[1]
    assert json.loads(plans[1])["totals"]["n_units"] == {"gdn": 12, "kda": 48, "mamba2": 12}[family]


def test_one_file_when_it_fits_and_training_state_stays_out(ckpts, tmp_path):
    src = tmp_path / "ck"
    shutil.copytree(ckpts("gdn"), src)
    (src / "train_state" / "exact.pt").write_bytes(b"fp32 weights and Adam moments")   # as --exact-state leaves it
    B.bundle(src, tmp_path / "b")
    assert (tmp_path / "b" / "model.safetensors").is_file() and not (tmp_path / "b" / B.INDEX).exists()
    assert not list((tmp_path / "b").glob("model-*")) and not list((tmp_path / "b").rglob("*.pt"))
    assert not (tmp_path / "b" / "train_state").exists() and not (tmp_path / "b" / "provenance.json").exists()
    assert "the fp32 masters are not bundled (SRC's train_state/exact.pt holds them" in (
        tmp_path / "b" / "PROVENANCE.md").read_text()
    want, got = _tensors(src), _tensors(tmp_path / "b")
    assert sorted(want) == sorted(got) and all(torch.equal(got[k], want[k]) for k in want)


def test_provenance_and_train_log_say_how_it_was_trained(ckpts, tmp_path):
    from benchmarks.train.models import n_params
    from transformers import AutoModelForCausalLM

    src = ckpts("gdn")
    B.bundle(src, tmp_path / "b", max_bytes=40_000)
    md = (tmp_path / "b" / "PROVENANCE.md").read_text()
    params = n_params(AutoModelForCausalLM.from_pretrained(str(src)))
    assert md.startswith(f"# Trained reference: gdn hybrid, {params:,} parameters")
    assert "Qwen3-Next architecture" in md and "model_type `qwen3_next`" in md
    assert "layers: linear_attention x3, full_attention." in md
    assert f"Trained: {3 * 4 * 192:,} tokens in 3 steps over 2 session(s)" in md
    assert "Commit(s): aaaa111, bbbb222" in md
    assert "### Session 0 (commit aaaa111)" in md and "### Session 1 (commit bbbb222)" in md
    s0, s1 = md.split("### Session 0")[1].split("### Session 1")
    assert "attn_lr_mult=1.0" in s0 and "attn_lr_mult=2.0" in s1 and "attn_matrix: lr x2.0" in s1
    assert "attn_matrix" not in s0 and "Steps 0 to 2 (1,536 tokens)" in s0 and "Steps 2 to 3 (768 tokens)" in s1
    for s in (s0, s1):
        assert "decay (A_log / dt_bias): lr x5.0, weight decay 0.0, 6 tensors" in s and "seq=192, batch=4" in s
    assert "seed 0" in md and "build_model('gdn', 'smoke', 383, 380, 0, 'log-uniform-dt')" in md
    # what --data held (no meta.json in the test's folder), not a hard-coded ShareGPT
    assert "- Data: the token shards of --data data/ (it has no meta.json naming their source)." in md
    assert "Held out: not recorded (no meta.json)." in md and "ShareGPT" not in md
    assert "test: bytes + whole words of the recall templates (383 ids" in md
    # movement is measured from the initial decays at each session's end, not per session
    assert md.count("- Decays moved since init (cumulative, at this session's end): ") == 2
    state = json.loads((src / "train_state" / "state.json").read_text())
    saved = _utc(dt.datetime.fromisoformat(state["saved_utc"]).timestamp())
    assert f"Last session saved {saved} (state.json's saved_utc)" in md
    assert state["saved_utc"] == state["sessions"][-1]["saved_utc"] and f"; saved {state['saved_utc']}." in md
    assert "bfloat16: 43 tensors" in md and "float32: 6 tensors, 24 parameters" in md and "the fp32 masters are not bundled (and were not saved" in md
    for f in (tmp_path / "b").glob("model-*.safetensors"):
        assert f"- {f.name}: {f.stat().st_size:,} bytes, sha256 {hashlib.sha256(f.read_bytes()).hexdigest()}" in md

    log = json.loads((tmp_path / "b" / "train_log.json").read_text())
    state = json.loads((src / "train_state" / "state.json").read_text())
    lines = (src / "train_state" / "log.jsonl").read_text().splitlines()
    assert log["sessions"] == state["sessions"] and log["tokens"] == 2304 and log["step"] == 3
    assert len(log["log"]) == len(lines) == (1 + 2) + (1 + 1)          # per session: start, each step
    assert [r["step"] for r in log["log"] if "loss_text" in r] == [1, 2, 3]
    assert log["provenance"]["init"]["seed"] == 0 and "sessions" not in log["provenance"]


def _damage(kind: str, src: Path) -> tuple[Path, str]:
    """Break a copy of a checkpoint one way; returns (what to pass as SRC, a phrase the error names)."""
    ts = src / "train_state"
    if kind == "missing":
        return src / "nope", "nope: not a directory"
    if kind == "no-state":
        (ts / "state.json").unlink()
        return src, "state.json: missing"
    if kind == "bad-state":
        (ts / "state.json").write_text('{"family": "gdn", "sessions": []}')
        return src, "expected family"
    if kind == "bad-log":
        (ts / "log.jsonl").write_text('{"step": 1}\nnot json\n')
        return src, "log.jsonl line 2: not JSON"
    if kind == "no-tokenizer":
        (src / "tokenizer.json").unlink()
        return src, "expected tokenizer.json"
    if kind == "truncated":
        f = src / "model.safetensors"
        f.write_bytes(f.read_bytes()[:-100])
        return src, "model.safetensors: not a readable safetensors file"
    if kind == "params":
        st = json.loads((ts / "state.json").read_text())
        st["sessions"][-1]["params"] += 1
        (ts / "state.json").write_text(json.dumps(st))
        return src, "state.json's last session records"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["missing", "no-state", "bad-state", "bad-log", "no-tokenizer", "truncated", "params"])
def test_bad_checkpoints_are_refused_in_one_line_and_nothing_is_written(ckpts, tmp_path, capsys, kind):
    src = tmp_path / "ck"
    shutil.copytree(ckpts("gdn"), src)
    arg, phrase = _damage(kind, src)
    out = tmp_path / "dest" / "b"
    capsys.readouterr()         # the fixture's first use writes checkpoints, with progress bars, from this test
    assert B.main([str(arg), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and phrase in err[0], err
    assert not out.exists() and (not out.parent.exists() or not list(out.parent.iterdir()))


def test_limits_and_out_folder_are_refused_in_one_line(ckpts, tmp_path, capsys):
    src = ckpts("gdn")
    out = tmp_path / "b"
    # the embedding, 383 x 32 bf16 = 24.5 kB, cannot fit a file of 0.02 MiB
    assert B.main([str(src), "--out", str(out), "--max-shard-mib", "0.02"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tensor 'model.embed_tokens.weight' needs 24," in err[0]
    assert "bytes in a file, over the 20,971 bytes a file may hold (--max-shard-mib 0.02)" in err[0]
    assert not out.exists() and list(tmp_path.iterdir()) == []
    # shards fit but a 60 kB tokenizer.json does not: checked before anything is moved into place
    big = tmp_path.parent / f"{tmp_path.name}-big"
    shutil.copytree(src, big)
    (big / "tokenizer.json").write_text((src / "tokenizer.json").read_text() + " " * 45_000)
    assert B.main([str(big), "--out", str(out), "--max-shard-mib", "0.04"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    size = (big / "tokenizer.json").stat().st_size
    assert len(err) == 1 and f"tokenizer.json ({size:,} bytes) would be over the 41,943 bytes" in err[0], err
    assert list(tmp_path.iterdir()) == []
    assert B.main([str(src), "--out", str(out)]) == 0
    first = (out / "model.safetensors").read_bytes()
    capsys.readouterr()
    assert B.main([str(src), "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert B.main([str(src), "--out", str(src), "--replace"]) == 2
    assert "is SRC" in capsys.readouterr().err and (src / "train_state" / "state.json").is_file()
    assert B.main([str(src), "--out", str(out), "--replace", "--max-shard-mib", "0.04"]) == 0
    assert not (out / "model.safetensors").exists() and len(list(out.glob("model-*"))) >= 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"] and first


# ---- refusals found by a tester: each was data loss, a traceback or a silent wrong answer ----

def _snap(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() if p.is_file() else None for p in sorted(d.rglob("*"))}


def _one_line(capsys, *phrases) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    assert all(p in err[0] for p in phrases), err
    return err[0]


@pytest.fixture
def src(ckpts, tmp_path):
    """A copy of the GDN checkpoint, free to change."""
    shutil.copytree(ckpts("gdn"), tmp_path / "ck")
    return tmp_path / "ck"


def test_out_at_inside_or_holding_src_is_refused_and_src_is_untouched(src, tmp_path, capsys, monkeypatch):
    """--out inside SRC was written (with --replace it replaced the checkpoint's own train_state/)."""
    before = _snap(src)
    for out, how in ((src, "is SRC"), (src / "train_state", "is inside SRC"), (src / "b", "is inside SRC"),
                     (tmp_path, "holds SRC"), (src / ".." / "ck" / "train_state", "is inside SRC")):
        for extra in ([], ["--replace"]):
            assert B.main([str(src), "--out", str(out), *extra]) == 2
            _one_line(capsys, f"--out {out}: {how}")
    monkeypatch.chdir(src)                         # --out . from inside the checkpoint
    assert B.main([str(src), "--out", ".", "--replace"]) == 2
    _one_line(capsys, "--out .: is SRC")
    assert _snap(src) == before


def test_replace_replaces_only_a_bundle(src, tmp_path, capsys):
    """--replace deleted whatever --out named: a notes folder, or all of plans/reference."""
    ref = tmp_path / "reference"
    assert B.main([str(src), "--out", str(ref / "b")]) == 0
    (ref / "notes").mkdir()
    (ref / "notes" / "todo.md").write_text("mine")
    capsys.readouterr()
    before = _snap(ref)
    assert B.main([str(src), "--out", str(ref), "--replace"]) == 2              # a folder of bundles
    _one_line(capsys, f"--out {ref}: not a bundle (it also holds b/, notes/)", "replaces only a folder")
    assert B.main([str(src), "--out", str(ref / "notes"), "--replace"]) == 2     # no PROVENANCE.md
    _one_line(capsys, "not a bundle (it also holds todo.md)")
    (ref / "b" / "my-eval.txt").write_text("kept")                             # a bundle with a file of the user's
    assert B.main([str(src), "--out", str(ref / "b"), "--replace"]) == 2
    _one_line(capsys, "not a bundle (it also holds my-eval.txt)")
    (ref / "b" / "my-eval.txt").unlink()
    (ref / "b" / "PROVENANCE.md").rename(ref / "PROVENANCE.md.bak")
    assert B.main([str(src), "--out", str(ref / "b"), "--replace"]) == 2
    _one_line(capsys, "not a bundle (no PROVENANCE.md)")
    (ref / "PROVENANCE.md.bak").rename(ref / "b" / "PROVENANCE.md")
    assert _snap(ref) == before
    assert B.main([str(src), "--out", str(ref / "b"), "--replace", "--max-shard-mib", "0.04"]) == 0
    assert len(list((ref / "b").glob("model-*-of-*.safetensors"))) >= 3 and (ref / "notes" / "todo.md").is_file()
    assert B.main([str(src), "--out", str(ref / "b"), "--replace"]) == 0      # shards + index: still a bundle
    assert sorted(p.name for p in ref.iterdir()) == ["b", "notes"]


def test_out_that_is_a_file_or_under_one_is_refused(src, tmp_path, capsys, monkeypatch):
    """--out FILE --replace replaced the file by a folder; --out FILE/x, /proc/x and --out . were tracebacks."""
    f = tmp_path / "README.md"
    f.write_text("keep me")
    for extra in ([], ["--replace"]):
        assert B.main([str(src), "--out", str(f), *extra]) == 2
        _one_line(capsys, f"--out {f}: a file; expected a folder")
    assert B.main([str(src), "--out", str(f / "x")]) == 2
    _one_line(capsys, f"--out {f / 'x'}: {f} is a file; expected a folder path")
    assert f.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "ck"]
    (tmp_path / "link").symlink_to(src)
    assert B.main([str(src), "--out", str(tmp_path / "link"), "--replace"]) == 2
    _one_line(capsys, "a symbolic link")
    if Path("/proc/self").is_dir():
        assert B.main([str(src), "--out", "/proc/x"]) == 2
        _one_line(capsys, "--out /proc/x: cannot write there")
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    assert B.main([str(src), "--out", ".", "--replace"]) == 2
    _one_line(capsys, "--out .: not a bundle (it also holds notes.txt)")
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("value, phrase", [
    ("inf", "--max-shard-mib inf: expected a number of MiB above 0 and at most 16"),   # was OverflowError
    ("nan", "--max-shard-mib nan: expected"), ("200", "--max-shard-mib 200: expected"),  # 200: was accepted
    ("16.5", "--max-shard-mib 16.5: expected"), ("0", "--max-shard-mib 0: expected"),
    ("-1", "--max-shard-mib -1: expected"), ("lots", "--max-shard-mib lots: expected"),
    ("1e-300", "over the 0 bytes a file may hold (--max-shard-mib 1e-300)")])           # was echoed as 0
def test_max_shard_mib_is_finite_above_0_at_most_16_and_echoed_as_given(src, tmp_path, capsys, value, phrase):
    assert B.main([str(src), "--out", str(tmp_path / "b"), "--max-shard-mib", value]) == 2
    _one_line(capsys, phrase)
    assert not (tmp_path / "b").exists()


def test_usage_errors_are_one_line(capsys):
    assert B.main(["--replace"]) == 2
    _one_line(capsys, "required")


def _index(src: Path, wm) -> None:
    (src / B.INDEX).write_text(json.dumps(wm if wm is None else {"metadata": {}, "weight_map": wm}))


@pytest.mark.parametrize("kind, phrase", [
    ("null", "model.safetensors.index.json: expected a JSON object whose 'weight_map'"),
    ("int-name", "expected a JSON object whose 'weight_map' maps each tensor name to a shard file name"),
    ("outside", "weight_map names '../outside/model.safetensors', outside"),
    ("absolute", "outside"),
    ("provenance-list", "provenance.json: a JSON list; expected a JSON object"),
    ("family", "config.json: model_type 'qwen3_next', but"),
    ("saved-utc", "saved_utc 'yesterday'; expected an ISO 8601 time"),
    ("session-shape", "a record not shaped as the trainer writes it")])
def test_malformed_checkpoints_are_one_line(src, tmp_path, capsys, kind, phrase):
    """Each was a traceback, a read outside SRC, or (provenance, family) a silently wrong PROVENANCE.md."""
    names = list(_tensors(src))
    sp = src / "train_state" / "state.json"
    st = json.loads(sp.read_text())
    if kind == "null":
        _index(src, None)
    elif kind == "int-name":
        _index(src, {n: 5 for n in names})
    elif kind in ("outside", "absolute"):
        (tmp_path / "outside").mkdir()
        shutil.copy2(src / "model.safetensors", tmp_path / "outside" / "model.safetensors")
        _index(src, {n: "../outside/model.safetensors" if kind == "outside" else
                     str(tmp_path / "outside" / "model.safetensors") for n in names})
    elif kind == "provenance-list":
        (src / "provenance.json").write_text("[1, 2]")
    elif kind == "family":
        sp.write_text(json.dumps(st | {"family": "mamba2"}))
    elif kind == "saved-utc":
        sp.write_text(json.dumps(st | {"saved_utc": "yesterday"}))
    else:
        st["sessions"][0]["recipe"] = ["not", "a", "dict"]
        sp.write_text(json.dumps(st))
    out = tmp_path / "dest" / "b"
    assert B.main([str(src), "--out", str(out)]) == 2
    _one_line(capsys, phrase)
    assert not (tmp_path / "dest").exists()


def test_a_checkpoint_saved_before_saved_utc_says_its_time_is_the_file_time(src, tmp_path):
    sp = src / "train_state" / "state.json"
    st = json.loads(sp.read_text())
    del st["saved_utc"]
    sp.write_text(json.dumps(st))
    B.bundle(src, tmp_path / "b")
    md = (tmp_path / "b" / "PROVENANCE.md").read_text()
    assert (f"Last session saved {_utc(sp.stat().st_mtime)} (state.json's file time: this checkpoint predates "
            f"saved_utc") in md


def test_trainer_records_what_its_data_folder_holds(tmp_path):
    from benchmarks.train.recipe import data_description

    d = tmp_path / "prep"
    d.mkdir()
    assert data_description(d)["text"] == "the token shards of --data prep/ (it has no meta.json naming their source)"
    (d / "meta.json").write_text(json.dumps({"source": "wikitext-103 train", "seed": 7, "tokenizer": "tok X, 512 ids",
                                             "held_out": "the validation split"}))
    got = data_description(d)
    assert got["text"] == ("wikitext-103 train, shuffled with seed 7, packed with <|endoftext|> between documents; "
                           "tokenized with tok X, 512 ids (--data prep/meta.json)")
    assert got["held_out"] == "the validation split" and "ShareGPT" not in json.dumps(got)


_SIGNAL_CHILD = """
import os, signal, sys
import safetensors.torch as st
from benchmarks.train import bundle as B
# as from a terminal: CI runs pytest as a background job of a non-interactive shell, which ignores SIGINT
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
real = st.save_file
def save_then_signal(*a, **k):      # the first weight file is half the bundle: the signal comes mid-write
    real(*a, **k)
    os.kill(os.getpid(), signal.{sig})
st.save_file = save_then_signal
rc = B.main(sys.argv[1:])
print("restored", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
      signal.getsignal(signal.SIGINT) is signal.default_int_handler)
sys.exit(rc)
"""


@pytest.mark.parametrize("sig, rc, line", [("SIGTERM", 143, "error: terminated (SIGTERM); nothing written"),
                                           ("SIGINT", 130, "error: interrupted; nothing written")])
def test_a_signal_mid_write_leaves_nothing_and_says_so_in_one_line(src, tmp_path, sig, rc, line):
    """SIGTERM left a hidden half-written .b.* folder beside --out (a device call carries it, git add -A takes
    it); SIGINT was a KeyboardInterrupt traceback."""
    import subprocess
    import sys

    dest = tmp_path / "dest"
    dest.mkdir()
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "-c", _SIGNAL_CHILD.format(sig=sig), str(src), "--out", str(dest / "b"),
                        "--max-shard-mib", "0.04"], cwd=root, capture_output=True, text=True, timeout=300)
    assert p.returncode == rc and p.stderr.strip().splitlines() == [line], (p.returncode, p.stderr)
    assert "restored True True" in p.stdout and list(dest.iterdir()) == []


def test_a_signal_the_process_ignores_stays_ignored(src, tmp_path):
    """A background job of a non-interactive shell ignores SIGINT: bundling must not take that away (a SIGINT
    sent mid-write is ignored, the bundle completes)."""
    import subprocess
    import sys

    child = """
import os, signal, sys
import safetensors.torch as st
from benchmarks.train import bundle as B
signal.signal(signal.SIGINT, signal.SIG_IGN)
real = st.save_file
def save_then_signal(*a, **k):
    real(*a, **k)
    os.kill(os.getpid(), signal.SIGINT)
st.save_file = save_then_signal
rc = B.main(sys.argv[1:])
print("ignored", signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
sys.exit(rc)
"""
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "-c", child, str(src), "--out", str(tmp_path / "b"), "--max-shard-mib", "0.04"],
                       cwd=root, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "ignored True" in p.stdout, (p.returncode, p.stderr)
    assert (tmp_path / "b" / "PROVENANCE.md").is_file()


def test_dead_runs_staging_folders_are_removed_and_a_half_done_replace_is_undone(src, tmp_path, capsys):
    """A killed run (SIGKILL) leaves its staging folder, or a bundle --replace moved aside with OUT missing:
    the next run for the same OUT removes the one (only a dead process's, only for that OUT) and puts the
    other back (dasc_compile.atomic.recover)."""
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    dest = tmp_path / "dest"
    stale = [dest / f".b.tmp-{dead}-abcd1234"]
    kept = [dest / ".b.notes", dest / f".b.tmp-{os.getpid()}-abcd1234", dest / f".other.tmp-{dead}-abcd1234",
            dest / ".b.tmp-notapid-abcd1234"]
    for d in stale + kept:
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"half")
    assert B.main([str(src), "--out", str(dest / "b")]) == 0
    assert sorted(dest.iterdir()) == sorted(kept + [dest / "b"])
    # a bundle a killed --replace moved aside while --out is gone: put back, then checked as before that run
    (dest / "b" / "config.json").write_text("{}")
    aside = dest / ".b.old-abcd1234"
    aside.mkdir()
    (dest / "b").rename(aside / "dir")
    capsys.readouterr()
    assert B.main([str(src), "--out", str(dest / "b")]) == 2
    _one_line(capsys, f"--out {dest / 'b'}: already exists; expected a new folder (or --replace, for a bundle)")
    assert (dest / "b" / "config.json").read_text() == "{}" and not aside.exists()
    aside.mkdir()                                  # again, now with --replace: put back, then replaced
    (dest / "b").rename(aside / "dir")
    assert B.main([str(src), "--out", str(dest / "b"), "--replace"]) == 0
    assert (dest / "b" / "config.json").read_text() != "{}" and not aside.exists()
    assert sorted(dest.iterdir()) == sorted(kept + [dest / "b"])


@pytest.mark.parametrize("family", FAMILIES)
def test_the_untrained_control_rebuilds_from_a_bundle_exactly_as_from_the_checkpoint(ckpts, tmp_path, family):
    """dasc eval's init / untrained controls need the initialisation; a user has the bundle, not train_state/.
    The bundle carries the recorded initial decays, and init_model rebuilds the same model from either."""
    from safetensors.torch import load_file

    from benchmarks.train.init_model import rebuild

    src = ckpts(family)
    B.bundle(src, tmp_path / "b")
    log = json.loads((tmp_path / "b" / "train_log.json").read_text())
    rec = load_file(str(src / "train_state" / "init_decays.safetensors"))
    assert sorted(log["init_decays"]) == sorted(rec)
    assert all(torch.equal(torch.tensor(log["init_decays"][k]), rec[k].float().flatten()) for k in rec)
    a, b = rebuild(src, tmp_path / "from-ck"), rebuild(tmp_path / "b", tmp_path / "from-bundle")
    assert a["weights_sha256_match_record"] and b["weights_sha256_match_record"]
    ta, tb = _tensors(tmp_path / "from-ck"), _tensors(tmp_path / "from-bundle")
    assert sorted(ta) == sorted(tb) and all(torch.equal(ta[k], tb[k]) for k in ta)


def test_init_rebuild_takes_the_recorded_decays_within_rounding_and_refuses_another_draw(ckpts, tmp_path,
                                                                                        monkeypatch):
    import benchmarks.train.train as T
    from benchmarks.train.init_model import InitError, rebuild

    B.bundle(ckpts("gdn"), tmp_path / "b")      # first: the trainer records its versions when it builds
    # rounding one ulp apart happens under another torch; under the same versions the sha256 check is exact
    monkeypatch.setattr(T, "_versions", lambda: {"torch": "another", "transformers": "another", "python": "3"})
    path = tmp_path / "b" / "train_log.json"
    log = json.loads(path.read_text())
    key = next(k for k in log["init_decays"] if k.endswith("A_log"))
    orig = log["init_decays"][key]
    # one fp32 ulp apart (as another torch's log may round): accepted, and the record is what lands
    bumped = torch.tensor(orig).nextafter(torch.tensor(float("inf"))).tolist()
    log["init_decays"][key] = bumped
    path.write_text(json.dumps(log))
    out = rebuild(tmp_path / "b", tmp_path / "i1")
    assert 0 < out["decays_max_abs_diff_before_copy"] < 1e-5
    got = _tensors(tmp_path / "i1")[key[len("live:"):]]
    assert torch.equal(got.flatten(), torch.tensor(bumped))
    # another draw: refused, naming the tensor
    log["init_decays"][key] = [v + 0.01 for v in orig]
    path.write_text(json.dumps(log))
    with pytest.raises(InitError, match=key[len("live:"):].replace(".", r"\.") + ": the rebuilt initial decays differ"):
        rebuild(tmp_path / "b", tmp_path / "i2")
    # a bundle made before the record existed: one line saying what to do
    del log["init_decays"]
    path.write_text(json.dumps(log))
    with pytest.raises(InitError) as exc:
        rebuild(tmp_path / "b", tmp_path / "i3")
    assert str(exc.value).startswith(f"{path}: no init_decays record")      # not wrapped as a malformed record
    (tmp_path / "not-a-model").mkdir()
    with pytest.raises(InitError, match="neither train_state/state.json"):
        rebuild(tmp_path / "not-a-model", tmp_path / "i4")


def test_init_model_refuses_bad_paths_in_one_line_and_replaces_nothing(ckpts, tmp_path, capsys):
    """A fresh user's tries: --out over an existing folder wiped it; --out at the trained model replaced the
    model with its initialisation; a missing model exited 1 with no "error:"; an unwritable --out was a
    traceback."""
    from benchmarks.train.init_model import main

    B.bundle(ckpts("gdn"), tmp_path / "b")
    before = {p.name: p.read_bytes() for p in (tmp_path / "b").iterdir()}
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    (tmp_path / "file").write_text("mine too")
    capsys.readouterr()                     # what building the fixture printed

    def refused(*argv, phrase):
        with pytest.raises(SystemExit) as exc:
            main([str(a) for a in argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and len(err) == 1 and err[0].startswith("error: ") and phrase in err[0], err

    refused(tmp_path / "b", "--out", tmp_path / "notes", phrase="already exists")
    refused(tmp_path / "b", "--out", tmp_path / "file", phrase="already exists")
    refused(tmp_path / "b", "--out", tmp_path / "b", phrase="lies inside the trained model")
    refused(tmp_path / "b", "--out", tmp_path / "b" / "init", phrase="lies inside the trained model")
    refused(tmp_path / "b", "--out", tmp_path / "no-such-dir" / "init", phrase="does not exist")
    refused(tmp_path / "nope", "--out", tmp_path / "i", phrase="does not exist")
    refused(tmp_path / "notes", "--out", tmp_path / "i", phrase="expected a trained reference model")
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine" and (tmp_path / "file").read_text() == "mine too"
    assert {p.name: p.read_bytes() for p in (tmp_path / "b").iterdir()} == before
    assert not (tmp_path / "i").exists() and not list(tmp_path.glob("*.tmp"))


def test_text_repeated_line_counts_text_rows_over_the_distinct_shards():
    from benchmarks.train.bundle_md import text_seen_line

    a, b = {"sha256": "a", "tokens": 4_000_000}, {"sha256": "b", "tokens": 1_000_000}
    ses = [{"tokens": 10_000_000, "recipe": {"recall_frac": 0.3}, "shards": [a, b]},
           {"tokens": 5_000_000, "recipe": {"recall_frac": 0.5}, "shards": [a]}]     # shard a carried twice: counted once
    line = text_seen_line(ses)
    # 10M x 0.7 + 5M x 0.5 = 9.5M text-row tokens over 5.0M distinct: 1.9 times
    assert "9.5M tokens of text rows" in line and "from 5.0M distinct tokens" in line and "about 1.9 times" in line
    assert text_seen_line([ses[0], {"tokens": 1, "recipe": {"recall_frac": 0.3}}]) is None   # shards not recorded
