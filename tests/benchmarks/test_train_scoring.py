"""Training-time recall accuracy per synthetic row kind (benchmarks/train/scoring.py): hand-built batches with
known kinds and known predictions, counted by hand; the log fields; old and new history files read alike."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.train.data import KINDS, KV, MULTIKEY, NEEDLE, TEXT
from benchmarks.train.scoring import (answer_tally, exact_tally, forward_backward, interval_fields, main, read_history,
                                      recall_by_kind, run_summary)

V = 10          # vocabulary of the fake model


class _NextPlusOne(torch.nn.Module):
    """Predicts token (x + 1) mod V after token x, whatever the context: logits ``[b, T, V]`` float32."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(V))     # something for backward() to reach

    def forward(self, input_ids, use_cache=False):
        logits = 5.0 * torch.nn.functional.one_hot((input_ids + 1) % V, V).float() + self.bias
        return type("Out", (), {"logits": logits})()


def _row(hits: str) -> list[int]:
    """Token ids ``[len(hits) + 1]`` whose target t is predicted right iff hits[t] == "1": the next token is
    x + 1 (a hit) or x + 3 (a miss), mod V."""
    ids = [0]
    for h in hits:
        ids.append((ids[-1] + (1 if h == "1" else 3)) % V)
    return ids


# (kind, hit pattern over the 6 targets, answer targets): the hits on the answer targets, counted by hand
ROWS = [
    (NEEDLE, "110100", (2, 3)),          # targets 2, 3 -> 0, 1: needle 1 / 2
    (KV, "101011", (1, 2, 3, 4)),        # 0, 1, 0, 1: kv 2 / 4
    (MULTIKEY, "011000", (1, 2)),        # 1, 1: multikey 2 / 2
    (TEXT, "111111", ()),                # no answers: counts nowhere
    (KV, "000001", (3, 4, 5)),           # 0, 0, 1: kv 1 / 3 more (3 / 7 in all)
]


def _batch():
    """(ids ``[5, 7]`` int64, mask ``[5, 7]`` bool on the answer tokens, kinds ``[5]`` int64) as Batches.get."""
    xb = torch.tensor([_row(h) for _, h, _ in ROWS], dtype=torch.int64)
    mask = torch.zeros_like(xb, dtype=torch.bool)
    for r, (_, _, answers) in enumerate(ROWS):
        for t in answers:
            mask[r, t + 1] = True        # target t is token t + 1 of the row
    return xb, mask, torch.tensor([k for k, _, _ in ROWS], dtype=torch.int64)


@pytest.mark.parametrize("micro", [1, 2, 5])
def test_forward_backward_counts_hits_per_row_kind(micro):
    """Micro-batches of 2 split the two kv rows and put the multikey row beside the text row: a kind read
    from the wrong slice, or one shared kind per micro-batch, changes the counts."""
    xb, mask, kind = _batch()
    model = _NextPlusOne()
    out = forward_backward(model, xb, mask, kind, micro, torch.device("cpu"), cuda=False)
    want_hits, want_n = [0] * len(KINDS), [0] * len(KINDS)
    want_hits[NEEDLE], want_n[NEEDLE] = 1, 2
    want_hits[MULTIKEY], want_n[MULTIKEY] = 2, 2
    want_hits[KV], want_n[KV] = 3, 7
    assert out["hit"] == want_hits and out["n_ans"] == want_n
    assert len(out["recall"]) == 4 and len(out["text"]) == 1
    assert model.bias.grad is not None
    f = interval_fields(out["hit"], out["n_ans"])
    assert f["recall_acc"] == pytest.approx(6 / 11)
    assert f["recall_acc_needle"] == pytest.approx(0.5)
    assert f["recall_acc_multikey"] == pytest.approx(1.0)
    assert f["recall_acc_kv"] == pytest.approx(3 / 7)
    assert f["recall_tokens"] == {"needle": 2, "multikey": 2, "kv": 7, "copy": 0} and f["recall_acc_copy"] is None
    # whole answers (one per row here): needle 0 / 1, multikey 1 / 1, kv 0 / 2
    want_right, want_answers = [0] * len(KINDS), [0] * len(KINDS)
    want_right[MULTIKEY], want_answers[NEEDLE], want_answers[MULTIKEY], want_answers[KV] = 1, 1, 1, 2
    assert out["exact_hit"] == want_right and out["n_exact"] == want_answers
    f = interval_fields(out["hit"], out["n_ans"], out["exact_hit"], out["n_exact"])
    assert f["recall_exact"] == pytest.approx(1 / 4) and f["recall_exact_multikey"] == 1.0
    assert f["recall_exact_needle"] == 0.0 and f["recall_exact_kv"] == 0.0 and f["recall_exact_copy"] is None
    assert f["recall_answers"] == {"needle": 1, "multikey": 1, "kv": 2, "copy": 0}
    assert "recall_exact" not in interval_fields(out["hit"], out["n_ans"])     # older callers: token fields only


def test_exact_tally_counts_each_run_of_answer_tokens_as_one_answer():
    pred = torch.tensor([[5, 1, 2, 0, 3, 4, 9], [1, 2, 3, 4, 5, 6, 7]])
    tgt = torch.tensor([[5, 1, 2, 0, 3, 0, 9], [1, 2, 3, 4, 5, 6, 7]])
    mask = torch.tensor([[False, True, True, False, True, True, False],      # two answers: right, then wrong
                         [True, False, True, True, True, False, True]])      # three answers, all right
    right, answers = exact_tally(pred, tgt, mask, torch.tensor([NEEDLE, KV]))
    assert right.tolist() == [0, 1, 0, 3, 0] and answers.tolist() == [0, 2, 0, 3, 0]
    right, answers = exact_tally(pred, tgt, torch.zeros_like(mask), torch.tensor([NEEDLE, KV]))
    assert right.tolist() == [0] * 5 and answers.tolist() == [0] * 5


def test_answer_tally_follows_the_kind_ids_not_the_row_order():
    pred = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 2, 3]])
    tgt = torch.tensor([[1, 2, 0], [1, 0, 0], [0, 0, 0]])
    mask = torch.tensor([[True, True, True], [True, True, False], [False, True, True]])
    hits, n = answer_tally(pred, tgt, mask, torch.tensor([KV, NEEDLE, KV]))
    assert hits.tolist() == [0, 1, 0, 2, 0] and n.tolist() == [0, 2, 0, 5, 0]      # kv: 2 of 3, then 0 of 2
    hits, n = answer_tally(pred, tgt, mask, torch.tensor([NEEDLE, KV, MULTIKEY]))
    assert hits.tolist() == [0, 2, 0, 1, 0] and n.tolist() == [0, 3, 2, 2, 0]


def test_interval_without_a_kind_reports_none_for_it():
    f = interval_fields([0, 3, 0, 0, 0], [0, 4, 0, 0, 0])
    assert f["recall_acc"] == 0.75 and f["recall_acc_needle"] == 0.75
    assert f["recall_acc_multikey"] is None and f["recall_acc_kv"] is None
    none = interval_fields([0] * len(KINDS), [0] * len(KINDS))
    assert none["recall_acc"] is None and none["recall_tokens"] == {"needle": 0, "multikey": 0, "kv": 0, "copy": 0}


OLD = {"step": 25, "loss_text": 3.1, "loss_recall": 2.0, "recall_acc": 0.25}
NEW = {"step": 50, "loss_text": 3.0, "loss_recall": 1.9, "recall_acc": 0.3, "recall_acc_needle": 1.0,
       "recall_acc_multikey": 0.9, "recall_acc_kv": 0.05, "recall_tokens": {"needle": 10, "multikey": 20, "kv": 200}}
COPY = NEW | {"step": 75, "recall_acc_copy": 0.4, "recall_tokens": {"needle": 10, "multikey": 20, "kv": 200, "copy": 50}}


def test_history_readers_take_old_and_new_records(tmp_path):
    assert recall_by_kind(OLD) == {"all": 0.25, "needle": None, "multikey": None, "kv": None, "copy": None}
    assert recall_by_kind(NEW) == {"all": 0.3, "needle": 1.0, "multikey": 0.9, "kv": 0.05, "copy": None}
    assert recall_by_kind(COPY) == {"all": 0.3, "needle": 1.0, "multikey": 0.9, "kv": 0.05, "copy": 0.4}
    log = tmp_path / "log.jsonl"                  # train_state/log.jsonl: an old session, then a new one
    log.write_text("\n".join(json.dumps(r) for r in ({"event": "start", "family": "gdn"}, OLD,
                                                     {"event": "start", "family": "gdn"}, NEW, COPY,
                                                     {"event": "saved", "step": 76})) + "\n")
    assert read_history(log) == [{"family": "gdn", "step": 25, "all": 0.25, "needle": None, "multikey": None,
                                  "kv": None, "copy": None},
                                 {"family": "gdn", "step": 50, "all": 0.3, "needle": 1.0, "multikey": 0.9, "kv": 0.05,
                                  "copy": None},
                                 {"family": "gdn", "step": 75, "all": 0.3, "needle": 1.0, "multikey": 0.9, "kv": 0.05,
                                  "copy": 0.4}]
    run = tmp_path / "run.log"                    # a device call's run.log: lines tagged by family
    run.write_text(f"[train_refs 0s] budget 570s\n[kda] {json.dumps(OLD)}\n[gdn] {json.dumps(NEW)}\n"
                   "[gdn] not json {\n[fla] FLA_PROBE {}\n")
    assert [(r["family"], r["step"], r["kv"]) for r in read_history(run)] == [("kda", 25, None), ("gdn", 50, 0.05)]
    summary = tmp_path / "summary.json"           # train_refs.sh's summary: each family's last interval
    summary.write_text(json.dumps({"kda": {"last_interval": OLD, "saved": {"event": "saved"}},
                                   "gdn": {"last_interval": NEW}, "fla_probe": {"ok": True}}))
    assert [(r["family"], r["all"], r["needle"]) for r in read_history(summary)] == [("kda", 0.25, None),
                                                                                      ("gdn", 0.3, 1.0)]


def test_run_summary_keeps_each_familys_last_interval_and_save_and_the_probe(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("\n".join([
        "[train_refs 0s] budget 570s, families: gdn kda",
        '[gdn] {"event": "start", "family": "gdn"}',
        '[gdn] {"step": 10, "loss": 5.0, "recall_acc": 0.1}',
        '[kda] {"step": 10, "loss": 6.0, "recall_acc": 0.2}',
        '[gdn] {"step": 20, "loss": 4.0, "recall_acc": 0.3}',
        '[gdn] {"step": 2',                                     # cut short when the call ended: skipped
        '[gdn] {"event": "saved", "step": 20, "path": "ref"}',
        '[fla] FLA_PROBE {"ok": true, "ops": 2}',
        '[train_refs 560s] done',
    ]) + "\n")
    s = run_summary(log)
    assert s == {"gdn": {"last_interval": {"step": 20, "loss": 4.0, "recall_acc": 0.3},
                         "saved": {"event": "saved", "step": 20, "path": "ref"}},
                 "kda": {"last_interval": {"step": 10, "loss": 6.0, "recall_acc": 0.2}},
                 "fla_probe": {"ok": True, "ops": 2}}
    out = tmp_path / "summary.json"
    assert main([str(log), "--write-summary", str(out)]) == 0
    assert json.loads(out.read_text()) == s
    # the summary reads back as history: each family's last interval
    assert [(r["family"], r["step"]) for r in read_history(out)] == [("gdn", 20), ("kda", 10)]


def test_a_missing_history_file_or_summary_folder_is_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "nope.log")]) == 2
    assert main([str(tmp_path)]) == 2
    log = tmp_path / "run.log"
    log.write_text('[gdn] {"step": 1, "recall_acc": 0.5}\n')
    assert main([str(log), "--write-summary", str(tmp_path / "no" / "s.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("error: ") for e in err)
    assert "nope.log" in err[0] and "--write-summary" in err[2] and not (tmp_path / "no").exists()


@pytest.mark.parametrize("micro", [1, 2, 5])
def test_unscored_targets_leave_the_loss_whatever_the_micro_batch(micro):
    """The gradient with ``unscored`` is that of the mean over the kept targets of the whole batch (worked out
    here from the model's own logits), for every micro-batch size; an all-False mask is the plain mean."""
    xb, mask, kind = _batch()
    unscored = torch.zeros_like(mask)
    unscored[0, 1:3] = True        # a needle's source digits, say
    unscored[1, 5:7] = True
    unscored[3, 2] = True

    def grad(**kw):
        model = _NextPlusOne()
        forward_backward(model, xb, mask, kind, micro, torch.device("cpu"), cuda=False, **kw)
        return model.bias.grad.clone()

    ref = _NextPlusOne()
    ce = torch.nn.functional.cross_entropy(ref(xb[:, :-1]).logits.flatten(0, 1), xb[:, 1:].flatten(),
                                           reduction="none").view(xb.shape[0], -1)
    keep = ~unscored[:, 1:]
    ((ce * keep).sum() / keep.sum()).backward()
    assert torch.allclose(grad(unscored=unscored), ref.bias.grad, atol=1e-6)
    plain = _NextPlusOne()
    ce_all = torch.nn.functional.cross_entropy(plain(xb[:, :-1]).logits.flatten(0, 1), xb[:, 1:].flatten())
    ce_all.backward()
    assert not torch.allclose(ref.bias.grad, plain.bias.grad, atol=1e-4)     # the mask does change the loss
    assert torch.allclose(grad(unscored=torch.zeros_like(mask)), plain.bias.grad, atol=1e-6)
    assert torch.allclose(grad(), plain.bias.grad, atol=1e-6)


def test_a_batch_with_every_target_unscored_is_refused():
    xb, mask, kind = _batch()
    with pytest.raises(ValueError, match="every target of the batch is unscored"):
        forward_backward(_NextPlusOne(), xb, mask, kind, 2, torch.device("cpu"), cuda=False,
                         unscored=torch.ones_like(mask))
