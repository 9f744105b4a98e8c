"""benchmarks/train/from_bundle.py on a smoke-size GDN the trainer trained and benchmarks/train/bundle.py bundled
(CPU): the rebuilt checkpoint holds the bundle's weights, step, tokens, initial decays and log; stage takes its
parts; train.py resumes it with a fresh AdamW for a new stage, keeping the earlier log; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks.train import bundle as B  # noqa: E402
from benchmarks.train import from_bundle as FB  # noqa: E402
from tests.benchmarks.test_train_refs import TREE_BYTES, _args, _prep, make_data  # noqa: E402


def _without_plan(args: list[str]) -> list[str]:
    i = args.index("--total-tokens")
    return args[:i] + args[i + 2:]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(data dir, bundle dir, its train_log.json): 3 steps of a smoke GDN, bundled in several shards."""
    from benchmarks.train.train import main

    root = tmp_path_factory.mktemp("fb")
    data = make_data(root / "data")
    main(_args(data, root / "run", "gdn", 3))
    B.bundle(root / "run" / "gdn", root / "bundle", max_bytes=40_000)
    return data, root / "bundle", json.loads((root / "bundle" / "train_log.json").read_text())


def test_rebuilt_checkpoint_holds_the_bundle_and_resumes_a_stage_with_a_fresh_adamw(made, tmp_path, capsys,
                                                                                      monkeypatch):
    from benchmarks.train import prepare
    from benchmarks.train.train import main

    data, bundle, tl = made
    assert FB.main([str(bundle), "--out", str(tmp_path / "ck"), "--pack-to", str(tmp_path / "parts")]) == 0
    summary = json.loads(capsys.readouterr().out.strip())
    ck = tmp_path / "ck" / "gdn"
    assert summary["out"] == str(ck) and summary["weights_equal_bundle"] is True
    assert (summary["family"], summary["size"], summary["step"], summary["tokens"]) == ("gdn", "smoke", 3, 3 * 768)
    assert summary["parts"] == [str(tmp_path / "parts" / "gdn.tzp.00")]

    want, got = FB.weights(bundle), FB.weights(ck)       # bf16 (decays fp32), the same bits
    assert sorted(got) == sorted(want) and summary["tensors"] == len(want) > 20
    assert all(got[k].dtype == t.dtype and torch.equal(got[k], t) for k, t in want.items())
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (ck / f).read_bytes() == (bundle / f).read_bytes()
    assert json.loads((ck / "provenance.json").read_text()) == tl["provenance"]
    ts = ck / "train_state"
    assert sorted(p.name for p in ts.iterdir()) == ["init_decays.safetensors", "log.jsonl", "state.json"]
    state = json.loads((ts / "state.json").read_text())
    assert (state["step"], state["tokens"]) == (tl["step"], tl["tokens"]) == (3, 3 * 768)
    assert state == {k: v for k, v in tl.items() if k not in ("provenance", "log", "init_decays")} | {
        "from_bundle": {"bundle": str(bundle), "optimizer": "not carried: the next session starts a fresh AdamW"}}
    from safetensors.torch import load_file

    init = load_file(str(ts / "init_decays.safetensors"))
    assert sorted(init) == sorted(tl["init_decays"]) and any(k.startswith("live:") for k in init)
    assert all(t.dtype == torch.float32 and t.flatten().tolist() == tl["init_decays"][k] for k, t in init.items())
    earlier = (ts / "log.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in earlier] == tl["log"] and len(earlier) == 4   # start + steps 1, 2, 3

    # stage takes the parts as a call's return: checked by unpacking, read as size smoke
    monkeypatch.setattr(prepare, "_tree_bytes", lambda root: TREE_BYTES)
    staged = prepare.stage(_prep(data, tmp_path), tmp_path / "dev" / "call", tmp_path / "parts",
                           Path(__file__).resolve().parents[2], [], families=["gdn"], size="smoke", check=True)
    assert staged["resume"] == ["gdn"] and staged["check"] == "nothing written" and not (tmp_path / "dev").exists()

    after = main(_without_plan(_args(data, tmp_path / "stage", "gdn", 2, "--resume", str(ck),
                                     "--stage-tokens", "1536")))
    s = after["sessions"][-1]
    assert (s["session"], s["start_step"], s["end_step"], after["step"]) == (1, 3, 5, 5)
    assert s["optimizer_restore"] == {"fresh": "the checkpoint carried no optimiser state"}
    assert (after["schedule_start"], after["total_steps"]) == (3, 5)
    assert after["from_bundle"] == state["from_bundle"]
    lines = (tmp_path / "stage" / "gdn" / "train_state" / "log.jsonl").read_text().splitlines()
    assert lines[:4] == earlier and [json.loads(x).get("step") for x in lines[4:]] == [None, 4, 5]
    assert json.loads(lines[4])["optimizer_restore"] == s["optimizer_restore"]
    assert (tmp_path / "stage" / "gdn" / "train_state" / "optim.safetensors").is_file()   # and it travels again

    # bundled again, PROVENANCE.md says which session started a fresh AdamW, and only that one
    B.bundle(tmp_path / "stage" / "gdn", tmp_path / "bundle2", max_bytes=40_000)
    md = (tmp_path / "bundle2" / "PROVENANCE.md").read_text()
    assert "except where a session below started a fresh AdamW." in md
    s0, s1 = md.split("### Session 0")[1].split("### Session 1")
    assert "fresh AdamW" not in s0
    assert "- Optimiser state: fresh AdamW (the checkpoint carried no optimiser state; from_bundle.py)." in s1


@pytest.mark.parametrize("case", ["missing", "not a bundle", "no init_decays", "out not empty", "parts there",
                                  "out in the bundle", "parts in the bundle"])
def test_bad_input_is_one_line_with_nothing_written(made, tmp_path, capsys, case):
    _, bundle, tl = made
    src, out, extra = bundle, tmp_path / "new" / "out", []
    if case == "missing":
        src = tmp_path / "nope"
    elif case == "not a bundle":                      # a folder of the trainer's data, no train_log.json
        src = made[0]
    elif case == "no init_decays":
        src = tmp_path / "old"
        src.mkdir()
        for f in bundle.iterdir():
            (src / f.name).write_bytes(f.read_bytes())
        (src / "train_log.json").write_text(json.dumps({k: v for k, v in tl.items() if k != "init_decays"}))
    elif case == "out not empty":
        out.mkdir(parents=True)
        (out / "keep.txt").write_text("mine")
    elif case == "out in the bundle":                # a committed reference model is never written into
        out = bundle / "sub"
    elif case == "parts in the bundle":
        extra = ["--pack-to", str(bundle)]
    else:
        (tmp_path / "parts").mkdir()
        (tmp_path / "parts" / "gdn.tzp.00").write_bytes(b"an earlier pack")
        extra = ["--pack-to", str(tmp_path / "parts")]
    before = sorted(str(p) for p in (*tmp_path.rglob("*"), *bundle.rglob("*")))
    assert FB.main([str(src), "--out", str(out), *extra]) == 2
    err = capsys.readouterr()
    lines = err.err.strip().splitlines()
    assert err.out == "" and len(lines) == 1 and lines[0].startswith("error: "), lines
    named = {"missing": str(src), "not a bundle": "train_log.json", "no init_decays": "init_decays",
             "out not empty": f"--out {out}", "parts there": "--pack-to",
             "out in the bundle": f"--out {out}: inside the bundle", "parts in the bundle": "--pack-to"}[case]
    assert named in lines[0] and "expected" in lines[0]
    assert sorted(str(p) for p in (*tmp_path.rglob("*"), *bundle.rglob("*"))) == before


def test_an_empty_optimiser_state_resumes_as_fresh(made, tmp_path, capsys):
    """A session that trained no step (a bundle's ended plan, resumed without --stage-tokens) saves an
    optim.safetensors of no tensors; the next resume must still say its AdamW started fresh."""
    from safetensors.torch import save_file

    from benchmarks.train.train import main

    data, bundle, _ = made
    assert FB.main([str(bundle), "--out", str(tmp_path / "ck")]) == 0
    ck = tmp_path / "ck" / "gdn"
    save_file({}, str(ck / "train_state" / "optim.safetensors"))
    after = main(_without_plan(_args(data, tmp_path / "stage", "gdn", 1, "--resume", str(ck),
                                     "--stage-tokens", "768")))
    assert after["sessions"][-1]["optimizer_restore"] == {"fresh": "the checkpoint carried no optimiser state"}


@pytest.mark.skipif(__import__("importlib.util").util.find_spec("transformers.models.kimi_linear") is not None,
                    reason="this transformers has KimiLinearForCausalLM, which reads a KDA bundle")
def test_a_kda_bundle_needs_a_transformers_with_kimi_linear(tmp_path, capsys):
    kda = Path(__file__).resolve().parents[2] / "plans" / "reference" / "kda-hybrid-11m-sharegpt"
    if not (kda / "train_log.json").is_file():
        pytest.skip("the bundled KDA reference is parked (benchmarks/h200/park.py)")
    assert FB.main([str(kda), "--out", str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "needs transformers >= 5.17" in lines[0] and str(kda) in lines[0]
    assert not (tmp_path / "out").exists()
