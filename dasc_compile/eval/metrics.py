"""Scores of one arm on one prompt, and the statistics ``dasc eval`` reports.

Per prompt, an arm's logits ``L [T_s + k - 1, V]`` come from running ``suffix + tail[:-1]`` after the
(modified) prefix checkpoint; ``L[i]`` predicts token ``i + 1`` of ``suffix + tail``:

* ``nll``: mean negative log-likelihood (nats/token) of ``suffix[1:]`` (the first suffix token is
  predicted from the prefix's last position, before any arm acts); ``nll_head``: the same over the
  first :data:`HEAD` targets ``suffix[1:HEAD+1]`` only, right after the cache hit, where a damaged
  state costs most;
* ``kl`` / ``kl_head``: mean over the ``T_s`` (first :data:`HEAD`) suffix positions of
  KL(p_dense || p_arm) of the next-token distributions (nats);
* ``agreement``: fraction of the ``k`` tail positions where the arm's argmax equals dense's argmax,
  both teacher-forced on the same tail (dense's own greedy continuation for text prompts; the answer
  for retrieval prompts);
* ``gen_agreement`` (text prompts): free-running: the arm generates its own ``k`` greedy tokens after
  the suffix; the fraction of positions equal to dense's greedy tokens (after the first difference
  the two continue from different text, as a user would see);
* ``retrieval``: 1.0 when the arm's argmax equals the answer at every answer position (exactly
  when greedy decoding would produce the answer), else 0.0; None for text prompts.
"""

from __future__ import annotations

import math

import torch

#: Suffix positions of the "head" window (right after the cache hit).
HEAD = 16


def prompt_scores(logits: torch.Tensor, dense_logits: torch.Tensor, suffix: list[int], tail: list[int],
                  answer: bool, gen: list[int] | None = None) -> dict[str, float | None]:
    """Scores of one arm on one prompt (see the module docstring).

    Args:
        logits, dense_logits: float32 ``[T_s + len(tail) - 1, V]`` of the arm and of dense.
        suffix: ``T_s >= 2`` token ids; tail: ``k >= 1`` ids; answer: tail is a retrieval answer.
        gen: the arm's own ``k`` greedy tokens (free-running), compared with ``tail``; None: not scored.
    """
    ts, k = len(suffix), len(tail)
    lp = torch.log_softmax(logits.float(), dim=-1)
    lp_d = torch.log_softmax(dense_logits.float(), dim=-1)
    tgt = torch.as_tensor(suffix[1:], dtype=torch.long, device=lp.device)
    tok_nll = -lp[: ts - 1].gather(1, tgt[:, None])[:, 0]                   # [T_s - 1]
    tok_kl = (lp_d[:ts].exp() * (lp_d[:ts] - lp[:ts])).sum(-1).clamp_min(0)   # [T_s]
    arg = lp[ts - 1: ts - 1 + k].argmax(-1)
    agree = float((arg == lp_d[ts - 1: ts - 1 + k].argmax(-1)).float().mean())
    ret = None
    if answer:
        ret = float(bool((arg == torch.as_tensor(tail, dtype=torch.long, device=arg.device)).all()))
    gen_agree = None if gen is None else sum(a == b for a, b in zip(gen, tail)) / k
    return {"nll": float(tok_nll.mean()), "kl": float(tok_kl.mean()), "nll_head": float(tok_nll[:HEAD].mean()),
            "kl_head": float(tok_kl[:HEAD].mean()), "agreement": agree, "gen_agreement": gen_agree, "retrieval": ret}


def mean_or_none(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def mean_sd(xs: list[float]) -> dict[str, float | None]:
    """Mean and sample standard deviation (n - 1), as the paper reports Random over five seeds."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return {"mean": None, "sd": None}
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return {"mean": m, "sd": sd}


def ranks(x: torch.Tensor) -> torch.Tensor:
    """Average ranks (1-based, ties share their mean rank) of a 1-D tensor; +inf ranks last."""
    x = x.detach().cpu().to(torch.float64).reshape(-1)
    order = torch.argsort(x, stable=True)
    r = torch.empty_like(x)
    r[order] = torch.arange(1, x.numel() + 1, dtype=torch.float64)
    # ties: average the ranks of equal values
    uniq, inv = torch.unique(x, return_inverse=True)
    sums = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inv, r)
    cnts = torch.zeros(uniq.numel(), dtype=torch.float64).index_add_(0, inv, torch.ones_like(r))
    return (sums / cnts)[inv]


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two equal-length 1-D tensors (Pearson of average ranks).

    Returns NaN when either side is constant (no ranking to compare) or has fewer than 2 values.
    """
    if a.numel() != b.numel():
        raise ValueError(f"spearman needs equal lengths, got {a.numel()} and {b.numel()}")
    if a.numel() < 2:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = math.sqrt(float((ra * ra).sum()) * float((rb * rb).sum()))
    return float((ra * rb).sum()) / den if den > 0 else float("nan")


def median_iqr(xs: list[float]) -> dict[str, float | int | None]:
    """Median and interquartile range [q25, q75] (linear interpolation) of the finite values."""
    v = torch.tensor([x for x in xs if x is not None and math.isfinite(x)], dtype=torch.float64)
    if v.numel() == 0:
        return {"median": None, "q25": None, "q75": None, "n": 0}
    q = torch.quantile(v, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64))
    return {"median": float(q[1]), "q25": float(q[0]), "q75": float(q[2]), "n": int(v.numel())}
