"""Can this training stack learn associative recall at all? A multi-query associative recall (MQAR) probe
for issue 20's recurrent-only control.

The recurrent-only pilots of ``benchmarks/notes/2026-12-04-recurrent-only-control.md`` ([E17], [E18]) never
answered a needle: answer tokens stayed at the floor over 7-9M tokens. That is either capacity and budget
(multi-token digit values over real-text haystacks are a hard first task for a 1.7M model) or something in
the stack (transformers' pure-PyTorch recurrence, the configs of ``models.py``, the optimiser groups of
``optim.py``). This probe separates the two: the same model builder and optimiser groups on the simplest
recall task of the linear-attention literature (Zoology's MQAR), single-token keys and values, nothing else
to learn. A model that cannot learn it here has a defect in the stack; one that does moves the question to
the task and the budget.

Sequence (token ids, a synthetic vocabulary; no tokenizer): ``BOS k_1 v_1 ... k_P v_P f_1 ... f_G q_1 a_1 ...
q_P a_P``. Keys are drawn without replacement from ``[4, 4 + K)``, values with replacement from the next V ids,
fillers (the gap, G tokens: distance between a record and its query beyond ``w_max`` when G is large) from the
rest; queries are the P keys in a random order, each answered by its value. The loss is the cross-entropy of
the answer tokens only; accuracy is the share of answer tokens predicted (argmax) on a held-out batch drawn
from another generator, over all answers and over each row's first. Answers are teacher-forced, so a model that
binds nothing can still pick among the stated values not yet asked for: :func:`copy_baseline` (recorded as
``copy_baseline_acc``, 0.37 at 8 pairs on the held-out batch; 0.18 on the first answer) is the level to beat,
not 1/``values``. Seeded; fp32, on the CPU (one core: ``OMP_NUM_THREADS=1``) or ``--device cuda``.

Run (repo root):
    PYTHONPATH=. OMP_NUM_THREADS=1 python -m benchmarks.train.mqar_probe --family gdn --size pilot \\
        --pairs 8 --gap 48 --steps 1500 --out RESULT.json
With ``--save DIR``, also the initial and the last model (``DIR/init``, ``DIR/final``: config.json and
model.safetensors, loadable by transformers and compiled by ``dasc compile``) for :mod:`benchmarks.train.mqar_masks`.
Writes RESULT.json (``{"command", "config", "versions", "n_params", "chance_acc", "copy_baseline_acc",
"copy_baseline_acc_first", "log": [{"step", "tokens", "train_loss", "held_loss", "acc", "acc_first", "s"}],
"final_acc"}``) and prints one line per ``--log-every`` steps.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
import time
from pathlib import Path

import torch

from benchmarks.cli_args import (OneLineParser, int_at_least, number_above_zero, path_named, refuse_unusable_device,
                                 refuse_unusable_record)
from benchmarks.train.models import SIZES, build_model, n_params
from benchmarks.train.optim import lr_at, param_groups, set_lr

BOS, N_SPECIAL = 1, 4


def mqar_batch(gen: torch.Generator, batch: int, pairs: int, gap: int, keys: int, values: int,
               vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [batch, T], targets [batch, T])``, int64, ``T = 1 + 2 * pairs + gap + 2 * pairs``; ``targets`` is
    -100 except at the positions whose next token is an answer (teacher forcing: the model reads ``q_i`` and
    must emit ``a_i``).

    Raises:
        ValueError: ``pairs > keys`` or a vocabulary too small for keys, values and one filler id.
    """
    fill_lo = N_SPECIAL + keys + values
    if pairs > keys or fill_lo >= vocab:
        raise ValueError(f"pairs {pairs} keys {keys} values {values} vocab {vocab}: expected pairs <= keys and "
                         f"{N_SPECIAL} + keys + values < vocab")
    t = 1 + 4 * pairs + gap
    ids = torch.empty(batch, t, dtype=torch.long)
    tgt = torch.full((batch, t), -100, dtype=torch.long)
    for b in range(batch):
        k = torch.randperm(keys, generator=gen)[:pairs] + N_SPECIAL
        v = torch.randint(N_SPECIAL + keys, fill_lo, (pairs,), generator=gen)
        f = torch.randint(fill_lo, vocab, (gap,), generator=gen)
        order = torch.randperm(pairs, generator=gen)
        rec = torch.stack([k, v], 1).flatten()
        qa = torch.stack([k[order], v[order]], 1).flatten()
        ids[b] = torch.cat([torch.tensor([BOS]), rec, f, qa])
        q_at = 1 + 2 * pairs + gap + 2 * torch.arange(pairs)        # positions of the queries
        tgt[b, q_at] = v[order]                                      # the logit at q_i predicts a_i
    return ids, tgt


def copy_baseline(ids: torch.Tensor, tgt: torch.Tensor, pairs: int) -> tuple[float, float]:
    """The best a model with no key-to-value binding scores on ``(ids, tgt)``: it can only pick among the stated
    values whose keys were not yet asked (teacher forcing shows the answers given so far), at best the most frequent
    of them (right with probability max count / values left), over all answers and over each row's first answer
    (1 / ``pairs`` there, more where values repeat).
    Accuracy above it is evidence of binding; below or at it, none (session 32 review)."""
    q0 = ids.shape[1] - 2 * pairs
    all_p, first_p = [], []
    for row in ids.tolist():
        left = list(row[2:2 + 2 * pairs:2])                     # the stated values, a multiset
        for j in range(pairs):
            ans = row[q0 + 2 * j + 1]
            p = max(left.count(v) for v in left) / len(left)
            all_p.append(p)
            if j == 0:
                first_p.append(p)
            left.remove(ans)
    return sum(all_p) / len(all_p), sum(first_p) / len(first_p)


def accuracy(model, ids: torch.Tensor, tgt: torch.Tensor) -> tuple[float, float, float]:
    """(loss, share of answer tokens whose argmax is right, the same over each row's first answer only) of
    ``model`` on one batch, no gradient."""
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits
    m = tgt != -100
    loss = torch.nn.functional.cross_entropy(logits[m], tgt[m]).item()
    first = m & (m.cumsum(1) == 1)
    return (loss, (logits[m].argmax(-1) == tgt[m]).float().mean().item(),
            (logits[first].argmax(-1) == tgt[first]).float().mean().item())


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=("gdn",), default="gdn",
                    help="gdn (transformers' PyTorch fallbacks, as train.py runs it); kda and mamba2 need train.py's "
                         "own scans installed, not done here")
    ap.add_argument("--size", choices=SIZES, default="pilot")
    ap.add_argument("--with-attention", action="store_true", help="the hybrid (default: every mixer recurrent)")
    ap.add_argument("--pairs", type=int_at_least(1), default=8)
    ap.add_argument("--gap", type=int_at_least(0), default=48, help="filler tokens between the records and the queries")
    ap.add_argument("--keys", type=int_at_least(1), default=64)
    ap.add_argument("--values", type=int_at_least(1), default=64)
    ap.add_argument("--vocab", type=int_at_least(8), default=256)
    ap.add_argument("--batch", type=int_at_least(1), default=32)
    ap.add_argument("--steps", type=int_at_least(1), default=1500)
    ap.add_argument("--lr", type=number_above_zero("a learning rate"), default=2e-3)
    ap.add_argument("--decay-lr-mult", type=number_above_zero("times --lr"), default=5.0)
    ap.add_argument("--warmup", type=int_at_least(0), default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int_at_least(1), default=50)
    ap.add_argument("--stop-at", type=number_above_zero("Unix seconds"), default=math.inf,
                    help="wall-clock deadline (Unix seconds)")
    ap.add_argument("--device", default="cpu", help="torch device (fp32 everywhere; the batches are drawn on the CPU)")
    ap.add_argument("--out", type=path_named("an output path"), required=True)
    ap.add_argument("--save", type=Path, default=None,
                    help="also write the initial and the last model (transformers' save_pretrained) to SAVE/init and "
                         "SAVE/final, for benchmarks.train.mqar_masks")
    a = ap.parse_args(argv)
    if a.pairs > a.keys or 4 + a.keys + a.values >= a.vocab:
        ap.error(f"--pairs {a.pairs} --keys {a.keys} --values {a.values} --vocab {a.vocab}: expected pairs <= keys and "
                 f"4 + keys + values < vocab (the rest are fillers)")
    refuse_unusable_record(ap, "--out", a.out, "mqar.json")
    if a.save is not None and a.save.exists() and (not a.save.is_dir() or any(a.save.iterdir())):
        ap.error(f"--save {a.save}: exists and is not an empty folder; give a new folder")
    if a.save is not None and not a.save.absolute().parent.is_dir():
        ap.error(f"--save {a.save}: its folder {a.save.absolute().parent} does not exist")
    refuse_unusable_device(ap, a.device)
    torch.manual_seed(a.seed)
    model = build_model(a.family, a.size, a.vocab, eos_id=2, seed=a.seed, attention=a.with_attention).to(a.device)
    groups = param_groups(model, a.lr, 0.1, a.decay_lr_mult)
    opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95))
    train_gen, held_gen = torch.Generator().manual_seed(a.seed), torch.Generator().manual_seed(10_000 + a.seed)
    shape = dict(pairs=a.pairs, gap=a.gap, keys=a.keys, values=a.values, vocab=a.vocab)
    held = tuple(t.to(a.device) for t in mqar_batch(held_gen, 256, **shape))
    import transformers

    doc = {"command": "python -m benchmarks.train.mqar_probe " + shlex.join(sys.argv[1:] if argv is None else argv),
           "config": vars(a) | {"out": str(a.out), "save": a.save and str(a.save), "seq": held[0].shape[1],
                                "stop_at": a.stop_at if math.isfinite(a.stop_at) else None,
                                "attention": a.with_attention},
           "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
           "n_params": n_params(model), "chance_acc": 1 / a.values, "log": []}
    doc["copy_baseline_acc"], doc["copy_baseline_acc_first"] = copy_baseline(held[0].cpu(), held[1].cpu(), a.pairs)
    if a.save is not None:
        model.save_pretrained(a.save / "init")
    t0, done = time.time(), 0
    model.train()
    for step in range(a.steps):
        if time.time() > a.stop_at:
            break
        set_lr(opt, lr_at(step, a.lr, a.warmup, a.steps, 0.2, 0.1))
        ids, tgt = (t.to(a.device) for t in mqar_batch(train_gen, a.batch, **shape))
        logits = model(input_ids=ids, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        done = step + 1
        if (step + 1) % a.log_every == 0 or step + 1 == a.steps:
            model.eval()
            h_loss, h_acc, h_first = accuracy(model, *held)
            model.train()
            rec = {"step": step + 1, "tokens": (step + 1) * a.batch * held[0].shape[1], "train_loss": loss.item(),
                   "held_loss": h_loss, "acc": h_acc, "acc_first": h_first, "s": round(time.time() - t0, 1)}
            doc["log"].append(rec)
            print(json.dumps(rec), flush=True)
            doc["final_acc"] = h_acc
            a.out.write_text(json.dumps(doc, indent=1) + "\n")
    a.out.write_text(json.dumps(doc, indent=1) + "\n")        # also when --stop-at came before the first log
    if done == 0:
        print(f"warning: --stop-at {a.stop_at:.0f} passed before the first step: nothing was trained", file=sys.stderr)
    if a.save is not None:
        model.save_pretrained(a.save / "final")
        record = {k: v for k, v in doc.items() if k != "log"} | {"steps_run": done}
        (a.save / "final" / "mqar_probe.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
