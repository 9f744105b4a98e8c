"""benchmarks/train/mqar_masks.py: answers are scored at the query positions; a plan that keeps every unit leaves
every arm equal to dense, one that keeps none makes dasc-nr, Random and init the same zero state; dasc-wr with a
window covering the whole prefix rebuilds dense; the probe's --save folders are what the masks read."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.train.mqar_masks import answer_scores

pytestmark = pytest.mark.transformers_range


def test_answer_scores_by_hand():
    # two rows, P = 2: suffix q1 a1 q2 (3 positions); the logit at positions 0 and 2 predicts a1, a2
    logits = torch.full((2, 3, 5), -10.0)
    logits[0, 0, 1] = logits[0, 2, 2] = 10.0      # row 0: a1 = 1 right, a2 = 2 right
    logits[1, 0, 3] = logits[1, 2, 4] = 10.0      # row 1: a1 = 3 wrong (answer 0), a2 = 4 right
    logits[:, 1, :] = 99.0                        # the answer positions themselves predict nothing scored
    s = answer_scores(logits, torch.tensor([[1, 2], [0, 4]]))
    assert s["acc"] == pytest.approx(3 / 4) and s["acc_first"] == pytest.approx(1 / 2)
    assert s["nll"] == pytest.approx(20.0 / 4, rel=1e-3)       # one answer costs ~20 nats, three ~0


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from dasc_compile.eval.hf_compat import MIN_TRANSFORMERS_ATTENTION_FREE, transformers_version

    if transformers_version() < MIN_TRANSFORMERS_ATTENTION_FREE:
        pytest.skip("a recurrent-only model needs transformers >= 5.17 in dasc eval")
    from benchmarks.train.mqar_probe import main

    root = tmp_path_factory.mktemp("mqar")
    save = root / "save"
    assert main(["--size", "smoke", "--steps", "3", "--log-every", "3", "--pairs", "3", "--gap", "6", "--batch", "4",
                 "--out", str(root / "p.json"), "--save", str(save)]) == 0
    return save


def test_save_writes_init_and_final_and_refuses_a_full_folder(saved, tmp_path, capsys):
    from benchmarks.train.mqar_probe import main

    rec = json.loads((saved / "final" / "mqar_probe.json").read_text())
    assert rec["steps_run"] == 3 and rec["config"]["save"] == str(saved) and "log" not in rec
    assert (saved / "init" / "model.safetensors").is_file() and (saved / "final" / "model.safetensors").is_file()
    with pytest.raises(SystemExit) as info:
        main(["--steps", "1", "--out", str(tmp_path / "q.json"), "--save", str(saved)])
    assert info.value.code == 2 and "--save" in capsys.readouterr().err


def test_keeping_every_unit_changes_nothing_and_keeping_none_is_one_state(saved):
    from benchmarks.train.mqar_masks import run

    doc = run(saved, [1, 10**9], rows=16)
    everything, nothing = doc["w_max"]["1"], doc["w_max"][str(10**9)]
    assert sum(everything["plan"]["kept_per_layer"]) == everything["plan"]["n_units"]
    dense = everything["arms"]["dense"]
    for arm in ("nr", "init", "wr"):
        assert everything["arms"][arm] == dense, arm
    assert all(p == dense for p in everything["random"]["per_seed"])
    assert sum(nothing["plan"]["kept_per_layer"]) == 0 and nothing["plan"]["c_ckpt"] > 1
    zero = nothing["arms"]["nr"]
    assert nothing["arms"]["init"] == zero and all(p == zero for p in nothing["random"]["per_seed"])
    assert nothing["arms"]["dense"] == dense            # the same rows, the same checkpoint
    assert zero["nll"] != pytest.approx(dense["nll"], abs=1e-6)      # zeroing the state is seen
    assert set(doc["untrained"]["1"]) == {"dense", "nr"}


def test_wr_over_the_whole_prefix_rebuilds_dense(saved):
    """Eq. 7 with W_replay = n_p replays every prefix token from zero: the local units then hold exactly what
    dense holds (no attention layers), so wr equals dense whatever the mask."""
    from benchmarks.train.mqar_masks import score_arms
    from benchmarks.train.mqar_probe import mqar_batch
    from dasc_compile.eval.models import load_eval_model

    em = load_eval_model(saved / "final", tokenizer=object())
    ids, _ = mqar_batch(torch.Generator().manual_seed(1), 4, pairs=3, gap=6, keys=64, values=64, vocab=256)
    n_p = 1 + 6 + 6
    none_kept = [[] for _ in em.layer_ids]
    out = score_arms(em, ids[:, :n_p], ids[:, n_p:-1], ids[:, n_p + 1::2], {"dense": None, "nr": none_kept},
                     wr_window=n_p)
    assert out["wr"]["nll"] == pytest.approx(out["dense"]["nll"], rel=1e-5)
    assert out["nr"]["nll"] != pytest.approx(out["dense"]["nll"], rel=1e-5)


def test_bad_paths_are_refused_before_anything_runs_or_is_written(tmp_path, capsys):
    """A fresh user (session 33): --out in a missing folder ended in a traceback after training started, leaving
    --save half-written; mqar_masks ran the whole experiment first."""
    from benchmarks.train.mqar_masks import main as masks
    from benchmarks.train.mqar_probe import main as probe

    for argv in (["--out", str(tmp_path / "no" / "p.json"), "--save", str(tmp_path / "s")],
                 ["--out", str(tmp_path / "p.json"), "--save", str(tmp_path / "no" / "s")]):
        with pytest.raises(SystemExit) as info:
            probe(["--steps", "1", *argv])
        assert info.value.code == 2 and "does not exist" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SystemExit) as info:
        masks(["--save", str(tmp_path), "--out", str(tmp_path / "no" / "m.json")])
    assert info.value.code == 2 and "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("record, needle", [("", "JSONDecodeError"), ("{}", "KeyError"),
                                            ('{"config": {"pairs": 2, "gap": 1, "keys": 8, "values": 8, "vocab": 64},'
                                             ' "steps_run": 0}', "steps_run 0")])
def test_masks_refuse_a_damaged_or_untrained_save_in_one_line(saved, tmp_path, capsys, record, needle):
    import shutil

    from benchmarks.train.mqar_masks import main as masks

    bad = tmp_path / "bad"
    shutil.copytree(saved, bad)
    (bad / "final" / "mqar_probe.json").write_text(record)
    with pytest.raises(SystemExit) as info:
        masks(["--save", str(bad), "--out", str(tmp_path / "m.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and needle in err[0] and "mqar_probe.json" in err[0], err
    assert not (tmp_path / "m.json").exists()


def test_a_deadline_before_the_first_step_still_writes_out_and_says_so(tmp_path, capsys):
    pytest.importorskip("transformers")
    from benchmarks.train.mqar_probe import main as probe

    out = tmp_path / "p.json"
    assert probe(["--size", "smoke", "--steps", "5", "--stop-at", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["log"] == [] and "nothing was trained" in capsys.readouterr().err
    assert json.loads(json.dumps(doc))["config"]["stop_at"] == 1.0
    out2 = tmp_path / "p2.json"
    assert probe(["--size", "smoke", "--steps", "1", "--out", str(out2)]) == 0
    assert '"stop_at": null' in out2.read_text()          # no Infinity: strict JSON readers reject it


def test_every_count_matched_mask_is_scored_once(saved):
    """--exhaustive scores the whole population the five Random masks sample: prod_l C(n_units_l, n_kept_l) masks,
    each keeping n_kept_l distinct units of layer l; the plan's own mask is one of them."""
    from math import comb, prod

    from benchmarks.train.mqar_masks import count_matched_masks, run

    doc = run(saved, [10**9, 1], rows=8, exhaustive=(10**9, 1), max_masks=1)
    assert doc["w_max"]["1"]["all_count_matched"]["n"] == 1        # every unit kept: one mask
    assert doc["w_max"]["1"]["all_count_matched"]["share_at_least_nr"] == 1.0
    assert doc["w_max"][str(10**9)]["all_count_matched"]["n"] == 1    # none kept: one mask too

    class _L:
        def __init__(self, n, k, kept):
            self.n_units, self.n_kept, self.kept_units = n, k, kept
    plan = type("P", (), {"layers": [_L(4, 2, [0, 3]), _L(3, 1, [2])]})()
    masks = count_matched_masks(plan)
    assert len(masks) == prod([comb(4, 2), comb(3, 1)]) == len({str(m) for m in masks})
    assert all(len(a) == 2 and len(set(a)) == 2 and len(b) == 1 for a, b in masks)
    assert [[0, 3], [2]] in masks
    many = run(saved, [10**9, 2], rows=4, exhaustive=(2,), max_masks=0)["w_max"]["2"]["all_count_matched"]
    assert set(many) == {"skipped"} and many["skipped"] >= 1


def test_device_is_recorded_and_an_unusable_one_refused_in_one_line(saved, tmp_path, capsys):
    """--device moves both models (the 33.9M MQAR plan runs the masks on the GPU); the JSON says where they ran, and
    a device torch cannot use is one line naming --device, nothing written."""
    from benchmarks.train.mqar_masks import main

    out = tmp_path / "m.json"
    assert main(["--save", str(saved), "--wmax", "2", "--rows", "8", "--device", "cpu", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["device"] == "cpu"
    capsys.readouterr()
    bad = tmp_path / "bad.json"
    # meta holds no data (it was a traceback inside the model); cuda:99 is a CUDA device no machine here has
    for device, says in (("gpu9", "not a torch device"), ("meta", "meta device holds no data"), ("cuda:99", "CUDA")):
        with pytest.raises(SystemExit) as info:
            main(["--save", str(saved), "--wmax", "2", "--rows", "8", "--device", device, "--out", str(bad)])
        err = capsys.readouterr().err.strip().splitlines()
        assert info.value.code == 2 and len(err) == 1 and not bad.exists(), (device, err)
        assert err[0].startswith("error: --device ") and device in err[0] and says in err[0], err


def _mqar_call(tmp_path, budget: str, **env):
    """benchmarks/h200/mqar_call.sh on the CPU (the python running the tests first on PATH)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    repo = Path(__file__).resolve().parents[2]
    full = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OUT": str(out), **env}
    p = subprocess.run(["bash", str(repo / "benchmarks/h200/mqar_call.sh"), budget], env=full, capture_output=True,
                       text=True, timeout=300)
    return p, out


@pytest.mark.parametrize("env, needle", [({"RUNS": "16-320"}, "RUNS has '16-320': expected PAIRS:GAP"),
                                         ({"RUNS": "  "}, "RUNS is empty"),
                                         ({"MASKS": "some"}, "MASKS 'some': expected bound or all"),
                                         ({"TRAIN_S": "1.5"}, "TRAIN_S '1.5'"), ({"TRAIN_S": "0.0"}, "TRAIN_S '0.0'"),
                                         ({"SIZE": "huge"}, "SIZE 'huge'"), ({"ROWS": "abc"}, "ROWS 'abc'"),
                                         ({"WMAX_8_48": "8,16"}, "WMAX_8_48 '8,16'"),
                                         ({"RUNS": "300:48"}, "300 pairs, more than KEYS 256"),
                                         # checked only by the probe, after the wheels and the other probe started
                                         ({"LR": "abc"}, "LR 'abc': expected a learning rate"),
                                         ({"LR": "1e9"}, "LR '1e9'"), ({"DEVICE": "meta"}, "DEVICE 'meta'"),
                                         # two probes writing one record and one saved model at once
                                         ({"RUNS": "8:48 16:320 8:048"}, "RUNS has the shape 8:048 twice")])
def test_mqar_call_refuses_bad_settings_in_one_line_before_any_work(tmp_path, env, needle):
    p, out = _mqar_call(tmp_path, "60", **env)
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [p.stderr.strip()] and needle in p.stderr
    assert list(out.iterdir()) == []


def test_mqar_call_refuses_a_budget_with_leading_zeros_and_an_out_with_an_earlier_calls_files(tmp_path):
    p, _ = _mqar_call(tmp_path, "0090")
    assert p.returncode == 2 and p.stderr.strip() == "error: BUDGET_S '0090': expected whole seconds, 60 to 999999"
    (tmp_path / "out" / "run.log").write_text("an earlier call\n")
    p, out = _mqar_call(tmp_path, "60")
    assert p.returncode == 2 and "holds an earlier call's files" in p.stderr
    assert (out / "run.log").read_text() == "an earlier call\n"


def test_mqar_call_exits_1_and_says_so_when_a_probe_fails(tmp_path):
    """A device the probe cannot use fails inside the python step: the call says which probe failed, runs no masks
    on it, and exits 1 (it used to exit 0 with a misleading 'masks not run')."""
    p, out = _mqar_call(tmp_path, "60", DEVICE="cuda:99", SIZE="smoke", RUNS="3:6", KEYS="16", VALUES="16",
                        VOCAB="64", BATCH="4", TRAIN_S="0.2")
    log = (out / "run.log").read_text()
    assert p.returncode == 1, p.stderr[-2000:]
    assert "p3-g6: the probe failed (exit " in log and "a step failed (exit 1)" in log and "masks" not in log


def test_mqar_call_rehearsal_trains_then_scores_masks(tmp_path):
    """The device call's two steps on the CPU at the smoke size: the probe's record, the binding verdict in run.log,
    and (MASKS=all) the masks' JSON at the w_max the shape's gap implies."""
    from dasc_compile.eval.hf_compat import MIN_TRANSFORMERS_ATTENTION_FREE, transformers_version

    if transformers_version() < MIN_TRANSFORMERS_ATTENTION_FREE:
        pytest.skip("a recurrent-only model needs transformers >= 5.17 in dasc eval")
    p, out = _mqar_call(tmp_path, "90", DEVICE="cpu", SIZE="smoke", RUNS="3:6", KEYS="16", VALUES="16", VOCAB="64",
                        BATCH="4", LOG_EVERY="2", ROWS="8", TRAIN_S="0.15", MASKS="all")
    assert p.returncode == 0, p.stderr[-2000:]
    log = (out / "run.log").read_text()
    assert "p3-g6: binds or not (MASKS=all): does not bind" in log and "p3-g6: masks exit 0" in log
    probe = json.loads((out / "p3-g6.json").read_text())
    assert probe["config"]["pairs"] == 3 and probe["config"]["gap"] == 6 and probe["log"]
    masks = json.loads((out / "masks-p3-g6.json").read_text())
    assert sorted(masks["w_max"], key=int) == ["8", "16", "32"] and masks["device"] == "cpu" and masks["rows"] == 8
