"""Does a dasc plan keep the units that carry recall? Multi-query associative recall through the recurrent state
alone, under dasc-nr / dasc-wr masks, count-matched Random masks and the init-horizon masks (issue 20).

Issue 20 asks that dasc-nr's retrieval stay within 0.05 of dense at w_max 16 where dense retrieves at least 0.9,
and that Random's choice of units lose it. The trained references retrieve only through their full-attention
layers' exact KV, which no arm alters, so they cannot tell plan from Random ([E15]). A recurrent-only model that
learned MQAR (:mod:`benchmarks.train.mqar_probe` ``--save``) can: every stated value must cross the state
checkpoint in the recurrent state.

Protocol (``dasc eval``'s, :mod:`dasc_compile.eval.protocol`, on MQAR rows): each held-out row ``BOS k_1 v_1 ...
k_P v_P f_1 ... f_G | q_1 a_1 ... q_P a_P`` is cut at ``|``, the state checkpoint: the prefix runs once into a
fresh transformers cache; each arm takes a copy and alters the recurrent temporal state only
(:func:`dasc_compile.eval.arms.arm_cache`: dense as is; dasc-nr zeroes the plan's local units; Random zeroes
count-matched Random sets, the five seeds of ``dasc eval``; ``init`` zeroes all but the units the *initial* decays
rank longest, count-matched per layer; dasc-wr rebuilds the local units by replaying the last W_replay prefix
tokens from a zero state, Eq. 7); then the queries run teacher-forced and each answer is scored (argmax). Every
stated value lies at least G tokens (the fillers) before the checkpoint, so beyond every w_max below G. The untrained
model (``SAVE/init``) is scored dense and under dasc-nr as the floor.

Plans are compiled from ``SAVE/final`` (``dasc_compile.compiler.compile_plan``, default policy) at each
``--wmax``. Unit = GDN value head (the pilot has 4 per layer, 16 in all), so kept sets are coarse.

Run (repo root; transformers >= 5.17, which runs a model without attention layers):
    PYTHONPATH=. python -m benchmarks.train.mqar_masks --save .dev/mqar/ro-s0 --wmax 8 16 32 \\
        --out RESULT.json [--rows 512]
With ``--exhaustive W ...``, every count-matched mask at those w_max (``prod_l C(n_units_l, n_kept_l)``; the
population the five Random masks sample) is scored too: the share within 0.05 of dense, and the share at least as
accurate as dasc-nr (``w_max[W]["all_count_matched"]``).

Writes RESULT.json (``{"command", "save", "probe", "rows", "row_seed", "n_p" (prefix tokens), "w_max": {W:
{"plan": {...}, "arms": {arm: {"acc", "acc_first", "nll"}}, "random": {metric: {"mean", "sd"}, "per_seed": [...]}}},
"untrained": {W: {"dense": {...}, "nr": {...}}}}``) and prints a markdown table (the untrained model's dense
column; its dasc-nr is in the JSON).
"""

from __future__ import annotations

import json
import shlex
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.cli_args import OneLineParser, int_at_least, path_named, refuse_unusable_device, refuse_unusable_record
from benchmarks.train.mqar_probe import mqar_batch

#: Held-out rows come from their own generator seed, apart from training (the probe's seed) and its held-out
#: batch (10,000 + seed).
ROW_SEED = 20_000


#: Passed to ``load_eval_model`` as the tokenizer: MQAR rows are token ids, nothing is encoded or decoded.
NO_TOKENIZER = object()


def answer_scores(logits: torch.Tensor, answers: torch.Tensor) -> dict:
    """Scores of teacher-forced answers: ``logits`` float ``[B, 2P-1, vocab]`` over the suffix ``q_1 a_1 ... q_P``
    (the logit at ``q_i``, position ``2i``, predicts ``a_i``); ``answers`` int64 ``[B, P]`` (any device).

    Returns:
        ``{"acc": share of answers whose argmax is right, "acc_first": the same over each row's first answer,
        "nll": mean cross-entropy of the answers (nats)}``.
    """
    at_q = logits[:, 0::2, :]                                            # [B, P, vocab]
    answers = answers.to(at_q.device)
    right = at_q.argmax(-1) == answers
    nll = torch.nn.functional.cross_entropy(at_q.flatten(0, 1), answers.flatten()).item()
    return {"acc": right.float().mean().item(), "acc_first": right[:, 0].float().mean().item(), "nll": nll}


def checkpoint(em, prefix: torch.Tensor):
    """The state checkpoint of ``prefix`` (int64 ``[B, n_p]``): a fresh transformers cache after the prefix."""
    cache = em.new_cache()
    em.forward_rows(prefix, cache)
    return cache


def score_arms(em, prefix: torch.Tensor, suffix: torch.Tensor, answers: torch.Tensor, masks: dict,
               wr_window: int | None = None, cache=None) -> dict:
    """Each arm's :func:`answer_scores` from one state checkpoint of ``prefix`` (int64 ``[B, n_p]``), each arm
    applied by ``dasc eval``'s :func:`dasc_compile.eval.arms.arm_cache`.

    Args:
        masks: arm name -> kept unit ids per recurrent layer (None: dense, the state as cached).
        wr_window: with a value, also arm ``wr``: the ``nr`` mask's local units rebuilt from the last ``wr_window``
            prefix tokens (W_replay, Eq. 7).
        cache: ``checkpoint(em, prefix)`` when the caller has it (else it is computed here).
    """
    from dasc_compile.eval.arms import arm_cache, keep_grids

    cache = checkpoint(em, prefix) if cache is None else cache

    def grids(kept):
        return keep_grids(kept, em.num_heads, em.units_per_head)

    out = {arm: answer_scores(em.forward_rows(suffix, arm_cache(em, cache, prefix, "dense" if kept is None else "nr",
                                                                 None if kept is None else grids(kept))), answers)
           for arm, kept in masks.items()}
    if wr_window is not None:
        wr = arm_cache(em, cache, prefix, "wr", grids(masks["nr"]), wr_window)
        out["wr"] = answer_scores(em.forward_rows(suffix, wr), answers)
    return out


def count_matched_masks(plan) -> list[list[list[int]]]:
    """Every count-matched mask of ``plan``: per recurrent layer each choice of ``n_kept`` of its ``n_units`` units
    (the population ``dasc eval``'s five Random masks sample), in a fixed order; ``prod_l C(n_units_l, n_kept_l)``
    masks."""
    from itertools import combinations, product

    per_layer = [[list(c) for c in combinations(range(lp.n_units), lp.n_kept)] for lp in plan.layers]
    return [list(m) for m in product(*per_layer)]


def exhaustive_record(em, prefix, suffix, answers, plan, nr_acc: float, dense_acc: float, max_masks: int,
                      cache=None) -> dict:
    """Accuracy of every count-matched mask (:func:`count_matched_masks`) of ``plan``, or ``{"skipped": n}`` when
    there are more than ``max_masks``: the share within 0.05 of dense, and the share at least as accurate as the
    plan's own mask (``nr_acc``; its rank among all count-matched masks, 1/n at best)."""
    masks = count_matched_masks(plan)
    if len(masks) > max_masks:
        return {"skipped": len(masks)}
    scores = score_arms(em, prefix, suffix, answers, {f"m{i}": m for i, m in enumerate(masks)}, cache=cache)
    acc = [scores[f"m{i}"]["acc"] for i in range(len(masks))]
    return {"n": len(acc), "acc": acc, "share_within_0.05_of_dense": sum(a >= dense_acc - 0.05 for a in acc) / len(acc),
            "share_at_least_nr": sum(a >= nr_acc - 1e-12 for a in acc) / len(acc)}


def _plan_record(plan, trained_h, init_h, init_kept) -> dict:
    from dasc_compile.eval.controls import jaccard

    kept = [list(lp.kept_units) for lp in plan.layers]
    return {"kept_per_layer": [len(k) for k in kept], "n_units": sum(lp.n_units for lp in plan.layers),
            "kept_units": kept, "init_kept_units": init_kept, "c_ckpt": plan.totals.c_ckpt,
            "w_replay_cap": plan.refresh.w_replay_cap,
            "jaccard_kept_vs_init_top": jaccard({(i, u) for i, k in enumerate(kept) for u in k},
                                                {(i, u) for i, k in enumerate(init_kept) for u in k}),
            "horizons": [[round(float(x), 2) for x in h] for h in trained_h],
            "init_horizons": [[round(float(x), 2) for x in h] for h in init_h]}


def run(save: Path, w_maxes: list[int], rows: int, row_seed: int = ROW_SEED, exhaustive: tuple[int, ...] = (),
        max_masks: int = 1000, device: str = "cpu") -> dict:
    """The experiment of the module docstring on the probe's ``save`` folder (``init/`` and ``final/``); at each
    w_max in ``exhaustive`` also every count-matched mask (:func:`exhaustive_record`, up to ``max_masks``).
    ``device``: where both models run (fp32; the rows are drawn on the CPU, as the probe draws them).

    Raises:
        DascInputError: a folder that is not a probe's ``--save`` output, or a model dasc eval cannot run.
    """
    from dasc_compile.compiler import compile_plan, layer_horizons, resolve_family_policy
    from dasc_compile.errors import DascInputError
    from dasc_compile.eval.arms import RANDOM_SEEDS, plan_kept_units, random_kept_units, replay_window
    from dasc_compile.eval.controls import init_kept_units
    from dasc_compile.eval.metrics import mean_sd
    from dasc_compile.eval.models import load_eval_model
    from dasc_compile.eval.run import checkpoint_decays
    from dasc_compile.policy import Policy

    final, init = save / "final", save / "init"
    rec_file = final / "mqar_probe.json"
    if not rec_file.is_file() or not (init / "config.json").is_file():
        raise DascInputError(f"--save {save}: expected the folder benchmarks.train.mqar_probe --save wrote "
                             f"(init/ and final/ with final/mqar_probe.json)")
    try:
        probe = json.loads(rec_file.read_text())
        cfg = probe["config"]
        shape = {k: int(cfg[k]) for k in ("pairs", "gap", "keys", "values", "vocab")}
        steps_run = int(probe["steps_run"])
    except (ValueError, KeyError, TypeError) as exc:
        raise DascInputError(f"{rec_file}: not the record mqar_probe --save writes ({type(exc).__name__}: {exc}); "
                             f"expected JSON with config.pairs / gap / keys / values / vocab and steps_run") from None
    if steps_run < 1:
        raise DascInputError(f"{rec_file}: steps_run {steps_run}: final/ is the untrained model; train it first")
    ids, _ = mqar_batch(torch.Generator().manual_seed(row_seed), rows, **shape)
    n_p = 1 + 2 * cfg["pairs"] + cfg["gap"]
    prefix, suffix, answers = ids[:, :n_p], ids[:, n_p:-1], ids[:, n_p + 1::2]

    em = load_eval_model(final, device=device, tokenizer=NO_TOKENIZER)
    em0 = load_eval_model(init, device=device, tokenizer=NO_TOKENIZER)
    cache, cache0 = checkpoint(em, prefix), checkpoint(em0, prefix)          # one checkpoint a model, every w_max
    spec, tensors, _ = checkpoint_decays(final)
    _, init_tensors, _ = checkpoint_decays(init)
    doc = {"save": str(save), "probe": probe, "rows": rows, "row_seed": row_seed, "n_p": n_p, "device": device,
           "w_max": {}, "untrained": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for w in w_maxes:
            plan, _ = compile_plan(final, Policy(w_max=w), Path(tmp) / f"w{w}", with_kernels=False)
            pol = resolve_family_policy(spec, plan.policy)
            trained_h, init_h = layer_horizons(spec, pol, tensors), layer_horizons(spec, pol, init_tensors)
            ik = init_kept_units(plan, init_h)
            masks = {"dense": None, "nr": plan_kept_units(plan), "init": ik}
            masks |= {f"random:{s}": random_kept_units(plan, s) for s in RANDOM_SEEDS}
            arms = score_arms(em, prefix, suffix, answers, masks, wr_window=replay_window(plan, n_p), cache=cache)
            per_seed = [arms.pop(f"random:{s}") for s in RANDOM_SEEDS]
            rnd = {m: mean_sd([p[m] for p in per_seed]) for m in ("acc", "acc_first", "nll")}
            doc["w_max"][str(w)] = {"plan": _plan_record(plan, trained_h, init_h, ik), "arms": arms,
                                    "random": rnd | {"per_seed": per_seed}}
            doc["untrained"][str(w)] = score_arms(em0, prefix, suffix, answers,
                                                  {"dense": None, "nr": masks["nr"]}, cache=cache0)
            if w in exhaustive:
                doc["w_max"][str(w)]["all_count_matched"] = exhaustive_record(
                    em, prefix, suffix, answers, plan, arms["nr"]["acc"], arms["dense"]["acc"], max_masks, cache)
    return doc


def table(doc: dict) -> str:
    """Markdown: per w_max, accuracy over all answers (and first answers) of each arm, Random as mean ± SD."""
    head = ("| w_max | kept units | C_ckpt | dense | dasc-nr | dasc-wr | init masks | Random (5 masks) | "
            "untrained dense |")
    lines = [head, "|" + "---|" * 9]
    notes = []
    for w, r in doc["w_max"].items():
        a, rnd, p = r["arms"], r["random"], r["plan"]

        def f(x):
            return f"{x['acc']:.3f} ({x['acc_first']:.3f})"
        lines.append(f"| {w} | {sum(p['kept_per_layer'])}/{p['n_units']} | {p['c_ckpt']:.2f} | {f(a['dense'])} | "
                     f"{f(a['nr'])} | {f(a['wr'])} | {f(a['init'])} | {rnd['acc']['mean']:.3f} ± "
                     f"{rnd['acc']['sd']:.3f} ({rnd['acc_first']['mean']:.3f}) | "
                     f"{f(doc['untrained'][w]['dense'])} |")
        ex = r.get("all_count_matched")
        if ex and "n" in ex:
            notes.append(f"w_max {w}: all {ex['n']} count-matched masks: {ex['share_within_0.05_of_dense']:.3f} within "
                         f"0.05 of dense; {ex['share_at_least_nr']:.3f} at least as accurate as dasc-nr's")
        elif ex:
            notes.append(f"w_max {w}: {ex['skipped']} count-matched masks, more than --max-masks: not scored")
    return "\n".join(lines + ([""] + notes if notes else []))


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--save", type=Path, required=True, help="the folder benchmarks.train.mqar_probe --save wrote")
    ap.add_argument("--wmax", type=int_at_least(1), nargs="+", default=[8, 16, 32])
    ap.add_argument("--rows", type=int_at_least(1), default=512, help="held-out MQAR rows")
    ap.add_argument("--row-seed", type=int, default=ROW_SEED)
    ap.add_argument("--exhaustive", type=int_at_least(1), nargs="*", default=[],
                    help="at these w_max (also given to --wmax) score every count-matched mask, not five")
    ap.add_argument("--max-masks", type=int_at_least(1), default=1000,
                    help="skip --exhaustive at a w_max with more count-matched masks than this")
    ap.add_argument("--device", default="cpu", help="torch device of both models, e.g. cpu or cuda (fp32)")
    ap.add_argument("--out", type=path_named("an output path"), required=True)
    a = ap.parse_args(argv)
    refuse_unusable_record(ap, "--out", a.out, "masks.json")
    if set(a.exhaustive) - set(a.wmax):
        ap.error(f"--exhaustive {' '.join(map(str, a.exhaustive))}: each must also be in --wmax")
    refuse_unusable_device(ap, a.device)
    from dasc_compile.errors import DascInputError

    try:
        doc = run(a.save, a.wmax, a.rows, a.row_seed, tuple(a.exhaustive), a.max_masks, a.device)
    except DascInputError as exc:
        ap.error(str(exc))
    doc["command"] = "python -m benchmarks.train.mqar_masks " + shlex.join(sys.argv[1:] if argv is None else argv)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
