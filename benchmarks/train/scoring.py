"""One training step's forward/backward and what it measures: per-row losses, recall accuracy overall and per
synthetic row kind; and a reader of training histories.

:func:`forward_backward` (called by benchmarks/train/train.py) scores the teacher-forced greedy predictions
of the training forward pass itself (no extra pass) on the answer tokens of the recall rows
(benchmarks/train/data.py), tallied by the kind id each row carries from the generator. One overall figure
hid what the kinds do separately: key-value rows carry most answer tokens (a row asks as many lookups as
fit), so ``recall_acc`` was mostly kv. Each logged interval therefore also reports, per recall kind of
:data:`benchmarks.train.data.RECALL_KINDS`:

- ``recall_acc_<kind>``: hits / answer tokens of that kind's rows (None when the interval had none);
- ``recall_tokens``: ``{kind: answer tokens scored}``, the weights of the overall figure;
- ``recall_exact_<kind>`` / ``recall_exact`` (and ``recall_answers``): whole answers right (every token of the
  answer), which a guessed value almost never is, where the token accuracy of a model that recalls nothing
  is 0.267 (the value's leading space token is free; its digits are 1 in 10).

``recall_acc`` stays (hits / answer tokens over all kinds), so histories written before the split compare.
The opt-in ``copy`` rows (data.py ``copy_frac``) are a recall kind like the others (``recall_acc_copy``, None
in every interval of a run without them; histories written before the kind existed read as None too).
:func:`recall_by_kind` reads a record of either age; the command line prints the figures of history files:

    python -m benchmarks.train.scoring FILE ...   # log.jsonl, log-<family>.jsonl, run.log, summary.json
    python -m benchmarks.train.scoring RUN_LOG --write-summary OUT   # a device call's summary.json (run_summary)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from benchmarks.train.data import KINDS, RECALL_KINDS
from benchmarks.cli_args import OneLineParser


def answer_tally(pred: torch.Tensor, tgt: torch.Tensor, mask: torch.Tensor, kind: torch.Tensor,
                 n_kinds: int = len(KINDS)) -> tuple[torch.Tensor, torch.Tensor]:
    """Hits and answer tokens per row kind.

    Args:
        pred: predicted token ids ``[b, T]`` (int64; argmax of the logits).
        tgt: target token ids ``[b, T]`` (int64).
        mask: ``[b, T]`` bool, True on the answer tokens scored (aligned with ``tgt``).
        kind: ``[b]`` int64, each row's kind id (index into :data:`KINDS`), on ``pred``'s device.
        n_kinds: number of kind ids.

    Returns:
        (hits ``[n_kinds]`` int64, answer tokens ``[n_kinds]`` int64), on ``pred``'s device.
    """
    hit = ((pred == tgt) & mask).sum(dim=1)
    n = mask.sum(dim=1)
    hits = torch.zeros(n_kinds, dtype=torch.int64, device=pred.device).index_add_(0, kind, hit)
    answers = torch.zeros(n_kinds, dtype=torch.int64, device=pred.device).index_add_(0, kind, n)
    return hits, answers


def exact_tally(pred: torch.Tensor, tgt: torch.Tensor, mask: torch.Tensor, kind: torch.Tensor,
                n_kinds: int = len(KINDS)) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole answers right and answers, per row kind: an answer is a maximal run of ``mask`` within a row (the
    data separates two answers by their questions), right when every one of its tokens is. Unlike the token
    accuracy, whose chance level is 0.267 on digit values (the leading space token is free, the digits 1 in 10),
    a guessed 4-digit value is right about once in 9,000.

    Args: as :func:`answer_tally`.
    Returns:
        (answers right ``[n_kinds]`` int64, answers ``[n_kinds]`` int64), on ``pred``'s device.
    """
    start = mask & ~torch.nn.functional.pad(mask[:, :-1], (1, 0))           # first token of each answer
    run = (torch.cumsum(start.flatten().long(), 0) - 1).view_as(mask)        # answer number of each token
    n = int(start.sum())
    wrong = torch.zeros(n, dtype=torch.int64, device=pred.device).index_add_(0, run[mask], (pred != tgt)[mask].long())
    run_kind = kind.unsqueeze(1).expand_as(mask)[start]
    right = torch.zeros(n_kinds, dtype=torch.int64, device=pred.device).index_add_(0, run_kind, (wrong == 0).long())
    return right, torch.bincount(run_kind, minlength=n_kinds)


def forward_backward(model, xb, mask, kind, micro: int, dev, cuda: bool, unscored=None) -> dict:
    """Loss ``mean over all target tokens`` backpropagated in micro-batches; per-row losses and answer hits.

    ``xb`` ``[B, T + 1]`` int64 token ids, ``mask`` ``[B, T + 1]`` bool answer tokens, ``kind`` ``[B]`` int64 row
    kinds (data.KINDS), as ``Batches.get`` gives them; ``unscored`` (``Batches.batch``'s, or None) ``[B, T + 1]``
    bool targets left out of the loss, which is then the mean over the other targets (the per-row losses
    still average every token). Returns ``text`` / ``recall``: per-row mean losses (floats) of text / recall
    rows; ``hit`` / ``n_ans``: teacher-forced greedy hits / answer tokens per kind id (lists of
    ``len(KINDS)`` ints), read from the training forward pass itself; ``exact_hit`` / ``n_exact``: whole answers
    right / answers per kind id (:func:`exact_tally`).

    Raises:
        ValueError: ``unscored`` leaves no target (no loss to take a gradient of; ``Batches`` never makes one).
    """
    B = xb.shape[0]
    keep = None if unscored is None or not unscored.any() else ~unscored[:, 1:]
    kept = None if keep is None else keep.sum()
    if kept is not None and not kept:
        raise ValueError("every target of the batch is unscored: no loss to take a gradient of")
    hits, n_ans, right, n_exact = (torch.zeros(len(KINDS), dtype=torch.int64, device=dev) for _ in range(4))
    out = {"text": [], "recall": []}
    for i in range(0, B, micro):
        x = xb[i:i + micro].to(dev, non_blocking=True)
        m = mask[i:i + micro, 1:].to(dev)
        k = kind[i:i + micro].to(dev)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=cuda):
            logits = model(input_ids=x[:, :-1], use_cache=False).logits
        tgt = x[:, 1:]
        ce = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tgt.flatten(), reduction="none")
        ce = ce.view(tgt.shape)
        if keep is None:
            (ce.mean() * (x.shape[0] / B)).backward()
        else:             # the mean over the whole batch's kept targets, whatever the micro-batch
            ((ce * keep[i:i + micro].to(dev)).sum() / kept).backward()
        with torch.no_grad():
            row = ce.mean(dim=1).tolist()
            is_recall = m.any(dim=1).tolist()
            for r, rec in zip(row, is_recall):
                out["recall" if rec else "text"].append(r)
            if m.any():                  # text-only micro-batches: no argmax
                pred = logits.argmax(-1)
                h, n = answer_tally(pred, tgt, m, k, len(KINDS))
                hits += h
                n_ans += n
                h, n = exact_tally(pred, tgt, m, k, len(KINDS))
                right += h
                n_exact += n
    out["hit"], out["n_ans"], out["exact_hit"], out["n_exact"] = (t.tolist() for t in (hits, n_ans, right, n_exact))
    return out


def interval_fields(hits: list[int], answers: list[int], exact: list[int] | None = None,
                    n_exact: list[int] | None = None) -> dict:
    """The recall fields of one logged interval, from counts per kind id (lists of ``len(KINDS)`` ints): token
    accuracy ``recall_acc[_<kind>]`` from ``hits`` / ``answers``; with ``exact`` / ``n_exact`` (whole answers right /
    answers) also ``recall_exact[_<kind>]`` and ``recall_answers``."""
    out = _shares("recall_acc", hits, answers) | {"recall_tokens": _per_kind(answers)}
    if exact is not None and n_exact is not None:
        out |= _shares("recall_exact", exact, n_exact) | {"recall_answers": _per_kind(n_exact)}
    return out


def _per_kind(counts: list[int]) -> dict:
    return {kind: int(counts[KINDS.index(kind)]) for kind in RECALL_KINDS}


def _shares(name: str, num: list[int], den: list[int]) -> dict:
    """``{name: overall share, name_<kind>: share per recall kind}``; None where the denominator is 0."""
    out: dict = {name: sum(num) / sum(den) if sum(den) else None}
    for kind in RECALL_KINDS:
        i = KINDS.index(kind)
        out[f"{name}_{kind}"] = num[i] / den[i] if den[i] else None
    return out


def recall_by_kind(rec: dict) -> dict:
    """``{"all": recall_acc, <kind>: recall_acc_<kind>, ...}`` of one logged record; a record written
    before the split (only ``recall_acc``) gives None for every kind."""
    return {"all": rec.get("recall_acc")} | {kind: rec.get(f"recall_acc_{kind}") for kind in RECALL_KINDS}


def _json_lines(text: str, family: str | None):
    """``(family, record)`` for each JSON-object line of a history: a trainer log (untagged lines, ``family``
    given or named by the session's ``start`` record) or a device call's ``run.log`` (``[<family>] {...}``)."""
    for line in text.splitlines():
        fam, body = family, line
        if line.startswith("[") and "] {" in line:
            tag, _, body = line.partition("] ")
            fam = tag[1:]
        if not body.startswith("{"):
            continue
        try:
            rec = json.loads(body)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        if rec.get("event") == "start" and fam is None:       # untagged log.jsonl: the session's start names it
            family = rec.get("family")
            continue
        yield fam, rec


def read_history(path: Path) -> list[dict]:
    """Logged intervals of a history file: ``[{"family", "step", "all", <kind>...}]``.

    Reads a trainer log (``log.jsonl`` / ``log-<family>.jsonl``: one JSON record a line), a device call's
    ``run.log`` (lines tagged ``[<family>] {...}``) or its ``summary.json`` (each family's ``last_interval``).
    """
    path = Path(path)
    text = path.read_text(errors="replace")
    if path.suffix == ".json":
        rows = []
        for fam, recs in json.loads(text).items():
            rec = recs.get("last_interval") if isinstance(recs, dict) else None
            if rec is not None:
                rows.append({"family": fam, "step": rec.get("step")} | recall_by_kind(rec))
        return rows
    family = path.stem[4:] if path.stem.startswith("log-") else None
    return [{"family": fam, "step": rec["step"]} | recall_by_kind(rec)
            for fam, rec in _json_lines(text, family) if "step" in rec and "recall_acc" in rec]


FLA_PROBE_TAG = "[fla] FLA_PROBE "


def run_summary(run_log: Path) -> dict:
    """A device call's ``summary.json`` (benchmarks/h200/train_refs.sh) from its ``run.log``: for each family
    its last logged interval (``last_interval``: any record with a ``step``) and its last ``saved`` event, plus
    the fla probe's result line (``fla_probe``) when the call ran one. Unreadable lines are skipped."""
    last: dict = {}
    text = Path(run_log).read_text(errors="replace")
    for fam, rec in _json_lines(text, None):
        if fam is None:
            continue
        if rec.get("event") == "saved":
            last.setdefault(fam, {})["saved"] = rec
        elif "step" in rec:
            last.setdefault(fam, {})["last_interval"] = rec
    for line in text.splitlines():
        if line.startswith(FLA_PROBE_TAG):
            try:
                last["fla_probe"] = json.loads(line[len(FLA_PROBE_TAG):])
            except ValueError:
                pass
    return last


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description="Training recall accuracy per row kind, from history files.")
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--last", action="store_true", help="only each family's last interval per file")
    ap.add_argument("--write-summary", type=Path, metavar="OUT",
                    help="write the summary.json of the one run.log given (what train_refs.sh returns) and print nothing")
    a = ap.parse_args(argv)
    for f in a.files:
        if not f.is_file():
            print(f"error: {f}: expected a history file (log.jsonl, log-<family>.jsonl, run.log or summary.json)",
                  file=sys.stderr)
            return 2
    if a.write_summary is not None:
        if len(a.files) != 1:
            ap.error("--write-summary takes exactly one run.log")
        if not a.write_summary.parent.is_dir():
            print(f"error: --write-summary {a.write_summary}: its folder does not exist", file=sys.stderr)
            return 2
        a.write_summary.write_text(json.dumps(run_summary(a.files[0]), indent=1))
        return 0
    cols = ["all", *RECALL_KINDS]
    print("file\tfamily\tstep\t" + "\t".join(cols))
    for f in a.files:
        rows = read_history(f)
        if a.last:
            rows = list({r["family"]: r for r in rows}.values())
        for r in rows:
            print(f"{f}\t{r['family']}\t{r['step']}\t" + "\t".join(_fmt(r[c]) for c in cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
