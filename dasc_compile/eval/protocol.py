"""The cached-prefix protocol of ``dasc eval`` (paper §4.2, §5.1-5.2, Table 2, Fig. 4h).

Per prompt: run the prefix once into a fresh transformers cache (the state checkpoint at the prefix
boundary: recurrent + conv states and full-attention KV); for every arm take a copy, apply the arm to
the recurrent temporal state only (conv state and full-attention KV stay exact: dasc compresses only
the temporal state), run the suffix, then (a) teacher-forced: ``tail[:-1]``, scored against dense
(:mod:`dasc_compile.eval.metrics`), and (b) free-running (text prompts): the arm's own ``k`` greedy
tokens. The tail is the answer of a retrieval prompt, else dense's own greedy continuation of ``k``
tokens. Dense is computed the same way as every other arm.

Arms per plan: ``dense``, ``nr``, ``wr``, ``random`` (five count-matched masks), ``init`` (dasc-nr
with the init-horizon masks, :mod:`dasc_compile.eval.controls`). The ``untrained`` control is the
same protocol on the initial model (a second :class:`PlanCase` list).

Output (:func:`summarize_plan`): per arm the means over prompts of :data:`METRICS` (``retrieval_acc``
over the retrieval prompts, ``retrieval_acc_far`` over those whose answer lies more than the plan's
w_max tokens back; None without any); ``random`` gives ``{"mean", "sd"}`` (sample SD over the five
seeds) for each and ``per_seed``.

Per prompt (:func:`per_prompt_values`): the same metrics for every prompt, in prompt order, so runs
and arms can be paired; :func:`paired_summaries` gives the paired differences nr - init and nr -
Random (the mean of the masks on each prompt) over prompts: mean, SD, SE, n and the share of prompts
where nr is lower.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch

from dasc_compile.eval.hf_compat import stack_caches
from dasc_compile.eval.arms import (RANDOM_SEEDS, arm_cache, keep_grids, plan_kept_units, random_kept_units,
                                    replay_window)
from dasc_compile.eval.metrics import mean_or_none, mean_sd, prompt_scores
from dasc_compile.eval.prompts import Prompt

#: Most arm caches run as rows of one batch (bounds the memory of ``[rows, T, vocab]`` logits).
MAX_ROWS = 16
METRICS = ("nll_delta", "nll_delta_head", "kl", "kl_head", "agreement", "gen_agreement", "retrieval_acc",
           "retrieval_acc_far")
#: Per-prompt values in the JSON, named as the means they average to (``retrieval_acc``: 1 / 0 per
#: retrieval prompt; ``nll``: the arm's own NLL, dense's on the dense row).
PER_PROMPT = ("nll_delta", "nll_delta_head", "kl", "kl_head", "agreement", "gen_agreement", "retrieval_acc", "nll")
#: Significant digits of a per-prompt value in the JSON (the means and paired summaries use full precision).
PER_PROMPT_DIGITS = 6
#: Metrics of the paired summaries: the first 16 suffix tokens (issue 20's headline) and the whole suffix.
PAIRED_METRICS = ("nll_delta_head", "kl_head", "nll_delta", "kl")


@dataclass
class PlanCase:
    """One plan under evaluation on one model: its masks and the per-prompt scores of each arm.

    ``grids`` / ``init_grids`` / ``random_grids[seed]``: per recurrent layer bool ``[H, units_per_head]``."""

    plan: object
    label: str
    grids: list[torch.Tensor]
    random_grids: dict[int, list[torch.Tensor]]
    init_grids: list[torch.Tensor] | None = None
    scores: dict[str, list[dict]] = field(default_factory=dict)
    random_scores: dict[int, list[dict]] = field(default_factory=dict)
    windows: list[int] = field(default_factory=list)


def make_case(em, plan, label: str, arms: tuple[str, ...], seeds: tuple[int, ...] = RANDOM_SEEDS,
              init_kept: list[list[int]] | None = None) -> PlanCase:
    """Masks of ``plan`` for model ``em``: its own, its count-matched Random draws when ``random`` is an
    arm, and the init-horizon masks ``init_kept`` (unit ids per layer) when given."""
    grids = keep_grids(plan_kept_units(plan), em.num_heads, em.units_per_head)
    rnd = {s: keep_grids(random_kept_units(plan, s), em.num_heads, em.units_per_head)
           for s in seeds} if "random" in arms else {}
    init = keep_grids(init_kept, em.num_heads, em.units_per_head) if init_kept is not None else None
    return PlanCase(plan=plan, label=label, grids=grids, random_grids=rnd, init_grids=init)


def greedy(em, cache, last_logits: torch.Tensor, k: int) -> list[int]:
    """``k`` greedy tokens: the first from ``last_logits [V]``, then one-token decode steps on ``cache``."""
    out = [int(last_logits.argmax())]
    while len(out) < k:
        out.append(int(em.forward([out[-1]], cache)[-1].argmax()))
    return out


def run_arm(em, cache, suffix: list[int], tail: list[int] | None, k: int, free_run: bool):
    """Run ``suffix`` after ``cache`` (consumed), then teacher-forced ``tail[:-1]``.

    Returns ``(logits [T_s + k - 1, V] float32, gen)``: ``gen`` the free-running greedy ``k`` tokens
    after the suffix when ``free_run`` (else None). With ``tail=None`` the tail is ``gen`` itself
    (dense's own continuation), and ``free_run`` is implied.
    """
    logits_s = em.forward(suffix, cache)
    gen = None
    if free_run or tail is None:
        gen = greedy(em, copy.deepcopy(cache), logits_s[-1], k)
        tail = gen if tail is None else tail
    if len(tail) > 1:
        logits_s = torch.cat([logits_s, em.forward(tail[:-1], cache)])
    return logits_s, gen


def run_rows(em, cache, rows: int, suffix: list[int], tail: list[int], k: int, free_run: bool):
    """:func:`run_arm` for a batch of ``rows`` arm caches stacked into ``cache`` (consumed): the same
    suffix and tail on every row. Returns ``(logits [rows, T_s + k - 1, V], gens)``, ``gens`` one list of
    ``k`` free-running greedy tokens per row (None unless ``free_run``)."""
    ids = torch.as_tensor(suffix, dtype=torch.long).expand(rows, -1)
    logits = em.forward_rows(ids, cache)
    gens = None
    if free_run:
        fr = copy.deepcopy(cache)
        cur = logits[:, -1].argmax(-1)
        out = [cur]
        while len(out) < k:
            cur = em.forward_rows(cur[:, None], fr)[:, -1].argmax(-1)
            out.append(cur)
        gens = torch.stack(out, 1).tolist()
    if len(tail) > 1:
        logits = torch.cat([logits, em.forward_rows(torch.as_tensor(tail[:-1], dtype=torch.long).expand(rows, -1), cache)], 1)
    return logits, gens


def run_prompt(em, prompt: Prompt, cases: list[PlanCase], arms: tuple[str, ...], gen_tokens: int) -> None:
    """Evaluate every arm of every plan on one prompt; appends per-prompt score rows to each case.

    Dense runs first (it defines a text prompt's tail); the other arms' caches are built one by one
    (dasc-wr's replay included) and run together, :data:`MAX_ROWS` at a time, as rows of one batch.
    """
    prefix_cache = em.new_cache()
    em.forward(prompt.prefix, prefix_cache)
    answer = prompt.answer is not None
    text = not answer
    k = len(prompt.answer) if answer else gen_tokens
    dense_logits, gen = run_arm(em, arm_cache(em, prefix_cache, prompt.prefix, "dense", None), prompt.suffix,
                                None if text else list(prompt.answer), k, False)
    tail = gen if text else list(prompt.answer)
    base = {"distance": prompt.distance}
    dense = dict(prompt_scores(dense_logits, dense_logits, prompt.suffix, tail, answer, tail if text else None), **base)
    base.update(dense_nll=dense["nll"], dense_nll_head=dense["nll_head"])
    jobs = []                                      # (case, where the row goes, arm applied, masks, W_replay)
    for case in cases:
        if "dense" in arms:
            case.scores.setdefault("dense", []).append(dict(dense, dense_nll=dense["nll"], dense_nll_head=dense["nll_head"]))
        if "nr" in arms:
            jobs.append((case, "nr", "nr", case.grids, 0))
        if "wr" in arms:
            w = replay_window(case.plan, len(prompt.prefix))
            case.windows.append(w)
            jobs.append((case, "wr", "wr", case.grids, w))
        if "init" in arms and case.init_grids is not None:
            jobs.append((case, "init", "nr", case.init_grids, 0))
        jobs += [(case, seed, "nr", grids, 0) for seed, grids in case.random_grids.items()]
    for i in range(0, len(jobs), MAX_ROWS):
        chunk = jobs[i:i + MAX_ROWS]
        caches = [arm_cache(em, prefix_cache, prompt.prefix, arm, grids, w) for _, _, arm, grids, w in chunk]
        logits, gens = run_rows(em, stack_caches(caches, em.layer_ids, em.attention_layer_ids), len(chunk),
                                prompt.suffix, tail, k, text)
        for j, (case, where, *_rest) in enumerate(chunk):
            row = dict(prompt_scores(logits[j], dense_logits, prompt.suffix, tail, answer, gens[j] if gens else None),
                       **base)
            book = case.random_scores if isinstance(where, int) else case.scores
            book.setdefault(where, []).append(row)


def _values(rows: list[dict]) -> dict[str, list]:
    """Per-prompt values of :data:`PER_PROMPT` from an arm's score rows, in prompt order (None where a
    metric does not apply: ``gen_agreement`` of a retrieval prompt, ``retrieval_acc`` of a text prompt)."""
    return {
        "nll_delta": [r["nll"] - r["dense_nll"] for r in rows],
        "nll_delta_head": [r["nll_head"] - r["dense_nll_head"] for r in rows],
        "kl": [r["kl"] for r in rows],
        "kl_head": [r["kl_head"] for r in rows],
        "agreement": [r["agreement"] for r in rows],
        "gen_agreement": [r["gen_agreement"] for r in rows],
        "retrieval_acc": [r["retrieval"] for r in rows],
        "nll": [r["nll"] for r in rows],
    }


def _summary(rows: list[dict], w_max: int) -> dict:
    far = [r["retrieval"] for r in rows if r["retrieval"] is not None and (r["distance"] or 0) > w_max]
    v = _values(rows)
    out = {m: mean_or_none(v[m]) for m in METRICS if m != "retrieval_acc_far"}
    out.update(retrieval_acc_far=mean_or_none(far), n_retrieval_far=len(far), nll=mean_or_none(v["nll"]),
               n_prompts=len(rows))
    return out


def summarize_plan(case: PlanCase) -> dict:
    """Arm name -> metrics for one plan (see the module docstring for the keys)."""
    w_max = case.plan.policy.w_max
    out = {arm: _summary(rows, w_max) for arm, rows in case.scores.items()}
    if "wr" in out and case.windows:
        out["wr"]["w_replay"] = max(case.windows)
    if case.random_scores:
        per_seed = {str(s): _summary(rows, w_max) for s, rows in case.random_scores.items()}
        rnd = {m: mean_sd([per_seed[s][m] for s in per_seed]) for m in METRICS + ("nll",)}
        rnd["per_seed"] = per_seed
        rnd["seeds"] = [int(s) for s in case.random_scores]
        out["random"] = rnd
    return out


def per_prompt_values(case: PlanCase) -> dict:
    """Arm name -> metric -> per-prompt values (full precision), prompt order; ``random`` gives
    ``{"mean": {metric: [mean over the masks per prompt]}, "per_seed": {seed: {metric: [...]}}}``."""
    out = {arm: _values(rows) for arm, rows in case.scores.items()}
    if case.random_scores:
        per_seed = {str(s): _values(rows) for s, rows in case.random_scores.items()}
        seeds = list(per_seed.values())
        mean = {m: [mean_or_none([v[m][i] for v in seeds]) for i in range(len(seeds[0][m]))] for m in PER_PROMPT}
        out["random"] = {"mean": mean, "per_seed": per_seed}
    return out


def paired_difference(a: list, b: list) -> dict:
    """The paired difference ``a - b`` over the prompts where both are measured: ``mean``, ``sd`` (sample
    SD of the differences, n - 1; None below 2 prompts), ``se`` (sd / sqrt(n)), ``n``, ``frac_nr_lower``
    (share of prompts with ``a < b``) and ``frac_tied`` (``a == b``)."""
    d = [x - y for x, y in zip(a, b) if x is not None and y is not None]
    n = len(d)
    if not n:
        return {"mean": None, "sd": None, "se": None, "n": 0, "frac_nr_lower": None, "frac_tied": None}
    ms = mean_sd(d)                                  # the one sample-SD formula of dasc eval
    m, sd = ms["mean"], ms["sd"] if n > 1 else None
    return {"mean": m, "sd": sd, "se": None if sd is None else sd / math.sqrt(n), "n": n,
            "frac_nr_lower": sum(x < 0 for x in d) / n, "frac_tied": sum(x == 0 for x in d) / n}


def paired_summaries(values: dict) -> dict:
    """From :func:`per_prompt_values`: ``nr_minus_init`` and ``nr_minus_random`` (Random: the mean of the
    masks on each prompt), each ``{metric: paired_difference}`` for :data:`PAIRED_METRICS`; a comparison
    is left out when either arm was not run."""
    if "nr" not in values:
        return {}
    others = {"nr_minus_init": values.get("init"), "nr_minus_random": values.get("random", {}).get("mean")}
    return {name: {m: paired_difference(values["nr"][m], other[m]) for m in PAIRED_METRICS}
            for name, other in others.items() if other is not None}


def _sig(x):
    return x if x is None else float(f"{x:.{PER_PROMPT_DIGITS}g}")


def rounded(values):
    """:func:`per_prompt_values` with every number to :data:`PER_PROMPT_DIGITS` significant digits (the JSON)."""
    if isinstance(values, dict):
        return {k: rounded(v) for k, v in values.items()}
    return [_sig(x) for x in values]


def plan_record(plan, label: str) -> dict:
    """What the JSON output says about a plan: identity, selection and the compression it gives (Eq. 6)."""
    t = plan.totals
    return {
        "path": label,
        "content_hash": plan.content_hash,
        "w_max": plan.policy.w_max,
        "selection": plan.selection,
        "random_seed": plan.policy.random_seed,
        "a_s": plan.policy.a_s,
        "n_kept": t.n_kept,
        "n_units": t.n_units,
        "kept_per_layer": [lp.n_kept for lp in plan.layers],
        "c_temp_ragged": t.c_temp_ragged,
        "c_ckpt": t.c_ckpt,
        "w_replay_cap": plan.refresh.w_replay_cap,
    }
