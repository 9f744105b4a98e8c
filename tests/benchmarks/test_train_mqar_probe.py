"""benchmarks/train/mqar_probe.py: the MQAR rows are what its docstring says (every answer is its key's value,
scored only where the query is read), and a short run writes its record."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.train.mqar_probe import N_SPECIAL, copy_baseline, mqar_batch


def test_rows_pair_each_query_with_its_records_value():
    ids, tgt = mqar_batch(torch.Generator().manual_seed(3), 4, pairs=5, gap=7, keys=16, values=8, vocab=64)
    assert ids.shape == tgt.shape == (4, 1 + 4 * 5 + 7)
    for row, t in zip(ids.tolist(), tgt.tolist()):
        record = dict(zip(row[1:11:2], row[2:12:2]))                 # key -> value, as stated
        assert len(record) == 5 and all(N_SPECIAL <= k < N_SPECIAL + 16 for k in record)
        assert all(N_SPECIAL + 16 <= v < N_SPECIAL + 24 for v in record.values())
        assert all(f >= N_SPECIAL + 24 for f in row[11:18])          # the gap holds fillers only
        scored = [i for i, y in enumerate(t) if y != -100]
        assert scored == list(range(18, 28, 2))                       # the queries, never the records
        for i in scored:
            assert t[i] == record[row[i]] == row[i + 1]               # the logit at q predicts its value


def test_a_vocabulary_too_small_is_refused():
    with pytest.raises(ValueError, match="pairs <= keys"):
        mqar_batch(torch.Generator(), 1, pairs=9, gap=0, keys=8, values=8, vocab=64)


def test_a_short_run_writes_its_record(tmp_path):
    pytest.importorskip("transformers")
    from benchmarks.train.mqar_probe import main

    out = tmp_path / "m.json"
    assert main(["--steps", "2", "--log-every", "1", "--pairs", "2", "--gap", "2", "--batch", "2", "--out",
                 str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["step"] for r in doc["log"]] == [1, 2] and 0.0 <= doc["final_acc"] <= 1.0
    assert doc["config"]["seq"] == 1 + 4 * 2 + 2 and doc["n_params"] > 0 and doc["chance_acc"] == 1 / 64
    assert 0.5 <= doc["copy_baseline_acc"] <= 1 and all(0 <= r["acc_first"] <= 1 for r in doc["log"])


@pytest.mark.parametrize("device", ["meta", "gpu9", "cuda:99", "mps"])    # mps: not in a Linux torch build
def test_a_device_that_cannot_train_is_one_line_before_any_model(tmp_path, capsys, device):
    """--device meta passed the old check (an empty tensor can live there) and ended in a traceback inside the
    model; every unusable device is now one line naming --device, and nothing is written."""
    from benchmarks.train.mqar_probe import main

    out = tmp_path / "m.json"
    with pytest.raises(SystemExit) as info:
        main(["--steps", "1", "--pairs", "2", "--gap", "2", "--batch", "2", "--device", device, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1 and err[0].startswith("error: --device ") and device in err[0]
    assert not out.exists()


def test_an_existing_record_and_a_deadline_that_is_not_a_time_are_refused(tmp_path, capsys):
    """--out over an existing file replaced it (a copy of README.md became JSON) and --stop-at nan never stopped
    (fresh-user trial, session 37): both are one line, before any model, and the file is as it was."""
    from benchmarks.train.mqar_probe import main

    out = tmp_path / "notes.md"
    out.write_text("mine\n")
    for argv, needle in ((["--out", str(out)], "exists; give a new file name"),
                         (["--out", str(tmp_path / "m.json"), "--stop-at", "nan"], "--stop-at")):
        with pytest.raises(SystemExit) as info:
            main(["--steps", "1", "--pairs", "2", "--gap", "2", "--batch", "2", *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert info.value.code == 2 and len(err) == 1 and needle in err[0], err
    assert out.read_text() == "mine\n" and not (tmp_path / "m.json").exists()


def test_the_no_binding_baseline_by_hand():
    """Two rows, gap 0: ``BOS k1 v1 k2 v2 q a q a``. Distinct values: the first answer is one of two (1/2), the
    second is the one left (1). Equal values: both answers are right whatever the key (1, 1)."""
    ids = torch.tensor([[1, 4, 20, 5, 21, 5, 21, 4, 20],
                        [1, 4, 30, 5, 30, 4, 30, 5, 30]])
    tgt = torch.full_like(ids, -100)
    tgt[:, [5, 7]] = ids[:, [6, 8]]
    assert copy_baseline(ids, tgt, 2) == (pytest.approx((0.5 + 1 + 1 + 1) / 4), pytest.approx((0.5 + 1) / 2))
