"""The cached-prefix protocol of ``dasc eval`` (paper §4.2, §5.1-5.2, Table 2, Fig. 4h).

Per prompt: run the prefix once into a fresh transformers cache (the state checkpoint at the prefix
boundary: recurrent + conv states and full-attention KV); for every arm take a copy, apply the arm to
the recurrent temporal state only (conv state and full-attention KV stay exact: dasc compresses only
the temporal state), then run ``suffix + tail[:-1]`` and score it against dense
(:mod:`dasc_compile.eval.metrics`). The tail is the answer of a retrieval prompt, else dense's own
greedy continuation of ``k`` tokens. Dense is computed the same way as every other arm.

Output (:func:`summarize_plan`): per arm ``{"nll_delta", "kl", "agreement", "retrieval_acc", "nll"}``
averaged over prompts (``retrieval_acc`` over the retrieval prompts only, None without any);
``random`` gives ``{"mean", "sd"}`` (sample SD over the five seeds) for each and ``per_seed``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from dasc_compile.eval.arms import (RANDOM_SEEDS, arm_cache, keep_grids, plan_kept_units, random_kept_units,
                                    replay_window)
from dasc_compile.eval.metrics import mean_or_none, mean_sd, prompt_scores
from dasc_compile.eval.prompts import Prompt

METRICS = ("nll_delta", "kl", "agreement", "retrieval_acc")


@dataclass
class PlanCase:
    """One plan under evaluation: its masks and the per-prompt scores of each arm."""

    plan: object
    label: str
    grids: list[torch.Tensor]
    random_grids: dict[int, list[torch.Tensor]]
    scores: dict[str, list[dict]] = field(default_factory=dict)
    random_scores: dict[int, list[dict]] = field(default_factory=dict)
    windows: list[int] = field(default_factory=list)


def make_case(em, plan, label: str, arms: tuple[str, ...], seeds: tuple[int, ...] = RANDOM_SEEDS) -> PlanCase:
    """Masks of ``plan`` (and of its count-matched Random draws when ``random`` is an arm) for model ``em``."""
    grids = keep_grids(plan_kept_units(plan), em.num_heads, em.units_per_head)
    rnd = {s: keep_grids(random_kept_units(plan, s), em.num_heads, em.units_per_head)
           for s in seeds} if "random" in arms else {}
    return PlanCase(plan=plan, label=label, grids=grids, random_grids=rnd)


def greedy_tail(em, prefix_cache, suffix: list[int], k: int) -> list[int]:
    """Dense greedy continuation: ``k`` tokens after ``prefix + suffix`` (one-token decode steps)."""
    cache = copy.deepcopy(prefix_cache)
    logits = em.forward(suffix, cache)
    out = [int(logits[-1].argmax())]
    while len(out) < k:
        out.append(int(em.forward([out[-1]], cache)[-1].argmax()))
    return out


def run_prompt(em, prompt: Prompt, cases: list[PlanCase], arms: tuple[str, ...], gen_tokens: int) -> dict:
    """Evaluate every arm of every plan on one prompt; appends per-prompt scores to each case.

    Returns dense's scores (against itself) for the record.
    """
    prefix_cache = em.new_cache()
    em.forward(prompt.prefix, prefix_cache)
    answer = prompt.answer is not None
    tail = list(prompt.answer) if answer else greedy_tail(em, prefix_cache, prompt.suffix, gen_tokens)
    x = list(prompt.suffix) + tail[:-1]
    dense_logits = em.forward(x, arm_cache(em, prefix_cache, prompt.prefix, "dense", None))

    def score(arm: str, grids, window: int = 0) -> dict:
        logits = em.forward(x, arm_cache(em, prefix_cache, prompt.prefix, arm, grids, window))
        return prompt_scores(logits, dense_logits, prompt.suffix, tail, answer)

    dense = prompt_scores(dense_logits, dense_logits, prompt.suffix, tail, answer)
    for case in cases:
        if "dense" in arms:
            case.scores.setdefault("dense", []).append(dict(dense, dense_nll=dense["nll"]))
        if "nr" in arms:
            case.scores.setdefault("nr", []).append(dict(score("nr", case.grids), dense_nll=dense["nll"]))
        if "wr" in arms:
            w = replay_window(case.plan, len(prompt.prefix))
            case.windows.append(w)
            case.scores.setdefault("wr", []).append(dict(score("wr", case.grids, w), dense_nll=dense["nll"]))
        for seed, grids in case.random_grids.items():
            case.random_scores.setdefault(seed, []).append(dict(score("nr", grids), dense_nll=dense["nll"]))
    return dense


def _summary(rows: list[dict]) -> dict:
    return {
        "nll_delta": mean_or_none([r["nll"] - r["dense_nll"] for r in rows]),
        "kl": mean_or_none([r["kl"] for r in rows]),
        "agreement": mean_or_none([r["agreement"] for r in rows]),
        "retrieval_acc": mean_or_none([r["retrieval"] for r in rows]),
        "nll": mean_or_none([r["nll"] for r in rows]),
        "n_prompts": len(rows),
    }


def summarize_plan(case: PlanCase) -> dict:
    """Arm name -> metrics for one plan (see the module docstring for the keys)."""
    out = {arm: _summary(rows) for arm, rows in case.scores.items()}
    if "wr" in out and case.windows:
        out["wr"]["w_replay"] = max(case.windows)
    if case.random_scores:
        per_seed = {str(s): _summary(rows) for s, rows in case.random_scores.items()}
        rnd = {m: mean_sd([per_seed[s][m] for s in per_seed]) for m in METRICS + ("nll",)}
        rnd["per_seed"] = per_seed
        rnd["seeds"] = [int(s) for s in case.random_scores]
        out["random"] = rnd
    return out


def plan_record(plan, label: str) -> dict:
    """What the JSON output says about a plan: identity, selection and the compression it gives (Eq. 6)."""
    t = plan.totals
    return {
        "path": label,
        "content_hash": plan.content_hash,
        "w_max": plan.policy.w_max,
        "selection": plan.selection,
        "a_s": plan.policy.a_s,
        "n_kept": t.n_kept,
        "n_units": t.n_units,
        "kept_per_layer": [lp.n_kept for lp in plan.layers],
        "c_temp_ragged": t.c_temp_ragged,
        "c_ckpt": t.c_ckpt,
        "w_replay_cap": plan.refresh.w_replay_cap,
    }
