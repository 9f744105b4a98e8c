"""Per-seed TTFT ratios pooled over sessions (issue 24): the regime map's points and the pooled table; the
summary statistics every serving table uses (:func:`spread`, :func:`summarise`).

Each ``serving_report`` summary (a list of arm objects) keeps, per arm, the mean-TTFT ratio of every trace
seed to Dense's run of the same seed (``ttft_ratio_vs_dense_by_seed``) and to INT8's
(``ttft_ratio_vs_int8_by_seed``), keyed ``"<trace stem>/<seed>"``. A seed measured in two summaries (two
sessions that reused it) is one draw: its ratios are averaged and it counts once.

Used by ``python -m benchmarks.serving_report pooled SUMMARY.json ...`` (:func:`pooled_table`) and by the
regime map (:func:`benchmarks.serving_tables.pool_points`).
"""

from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence

from benchmarks.card import card_label
from dasc_compile.errors import DascInputError

BASELINES = {"dense": "ttft_ratio_vs_dense_by_seed", "int8": "ttft_ratio_vs_int8_by_seed"}


def group_label(o: dict) -> str:
    """``arm (protocol, replay[, N clients][, rho R], card)``: the series an arm object belongs to. The closed
    loop's client count is part of it: 24 and 42 clients put different working sets on the same cache, and
    pooling their ratios would average two conditions. So is the card (``gpu``, :func:`benchmarks.card.card_label`):
    rho is a fraction of one card's saturation, and a prefill's share of the work differs between cards. So is a
    shared system prompt (``shared_prefix_tokens``): first turns can hit there."""
    return (f"{o['arm']} ({o['protocol']}, {o['replay']}" + (f", {o['clients']} clients" if o.get("clients") else "")
            + (f", rho {o['rho']}" if o.get("rho") else "")
            + (f", {o['shared_prefix_tokens']} shared" if o.get("shared_prefix_tokens") else "")
            + f", {card_label(o.get('gpu'))})")


def pool_seed_ratios(docs: Sequence[list], key: str) -> dict:
    """Group the per-seed ratios ``key`` of every arm object in ``docs`` by (label, pad tokens, rate).

    Returns ``{(label, pad, rate): {"x": [initial prompt means, tokens], "seeds": {seed: [ratio, ...]}, "arm",
    "protocol", "replay", "clients", "gpu"}}`` (the label holds the client count and the card, so each group has
    one); arm objects without ``key`` are left out.
    """
    groups: dict = {}
    for doc in docs:
        for o in doc:
            per = o.get(key)
            if not per:
                continue
            g = groups.setdefault((group_label(o), o.get("pad_tokens"), o.get("rate")),
                                  {"x": [], "seeds": {}, "arm": o["arm"], "protocol": o.get("protocol"),
                                   "replay": o.get("replay"), "clients": o.get("clients"),
                                   "gpu": o.get("gpu")})
            g["x"].append(o["initial_prompt_mean"])
            for seed, r in per.items():
                g["seeds"].setdefault(seed, []).append(float(r))
    return groups


def pctl(xs: Sequence[float], q: float) -> float:
    """q-th percentile, linear interpolation between order statistics; NaN for no values."""
    v = sorted(x for x in xs if not math.isnan(x))
    if not v:
        return math.nan
    pos = (len(v) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def spread(xs: Sequence[float]) -> dict:
    """mean, SD (n - 1; None for one value: one sample has no spread to report), min, max, P95 and n of
    the finite values."""
    v = [x for x in xs if x is not None and not math.isnan(x)]
    if not v:
        return {"mean": None, "sd": None, "min": None, "max": None, "p95": None, "n": 0}
    return {"mean": statistics.fmean(v), "sd": statistics.stdev(v) if len(v) > 1 else None,
            "min": min(v), "max": max(v), "p95": pctl(v, 95), "n": len(v)}


def t_quantile_975(df: int) -> float:
    """Student's t quantile at 0.975 for ``df`` >= 1 degrees of freedom (two-sided 95 %), by bisection on
    the CDF integrated with Simpson's rule (no SciPy needed; 1e-4 accurate: 12.706 at df 1, 2.571 at 5)."""
    if df < 1:
        raise ValueError(f"t quantile needs df >= 1, got {df}")
    logc = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf_half(x: float) -> float:          # P(0 < T < x)
        n = 2000
        h = x / n
        f = [math.exp(logc - (df + 1) / 2 * math.log1p((i * h) ** 2 / df)) for i in range(n + 1)]
        return h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    lo, hi = 0.0, 100.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if cdf_half(mid) < 0.475:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def summarise(vals: Sequence[float]) -> dict:
    """:func:`spread` plus the 95 % t interval of the mean (``ci95``, None below two values) and how many
    values lie below 1 (``below_1``)."""
    s = spread(vals)
    s["ci95"] = None
    if s["sd"] is not None:
        h = t_quantile_975(s["n"] - 1) * s["sd"] / math.sqrt(s["n"])
        s["ci95"] = (s["mean"] - h, s["mean"] + h)
    s["below_1"] = sum(1 for v in vals if v < 1)
    return s


def pooled_table(docs: Sequence[list], pad: Optional[int] = None) -> str:
    """Markdown: per (arm, protocol, replay, rate, pad) the pooled per-seed ratio to Dense and to INT8
    (mean (SD), n, 95 % interval, seeds below 1, seeds measured twice); ``pad`` keeps one context pad.

    Raises:
        DascInputError: no arm object with per-seed ratios (at ``pad``); the message lists the pads there are.
    """
    rows: dict = {}
    pads: set = set()
    for base, key in BASELINES.items():
        for (lab, p, rate), g in pool_seed_ratios(docs, key).items():
            pads.add(p)
            if pad is not None and p != pad:
                continue
            vals = [sum(v) / len(v) for _, v in sorted(g["seeds"].items())]
            rows.setdefault((lab, p, rate), {})[base] = (summarise(vals),
                                                         sorted(s for s, v in g["seeds"].items() if len(v) > 1))

    if not rows:
        where = f" at pad {pad}" if pad is not None else ""
        have = f" (pads present: {', '.join(map(str, sorted(pads, key=lambda x: (x is None, x or 0))))})" if pads else \
            " (none has ttft_ratio_vs_dense_by_seed / ttft_ratio_vs_int8_by_seed: summaries written before 2026-12-02 " \
            "lack them; regenerate them with serving_report from their chat.tar.gz)"
        raise DascInputError(f"no arm with per-seed TTFT ratios{where} in the summaries given{have}")

    def cell(entry) -> str:
        if entry is None:
            return "—"
        s, rep = entry
        txt = f"{s['mean']:.3f}"
        if s["sd"] is not None:
            txt += f" ({s['sd']:.3f}), n = {s['n']}, [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}], below 1: {s['below_1']}"
        else:
            txt += ", n = 1"
        return txt + (f"; {len(rep)} seed(s) measured twice" if rep else "")

    lines = ["| arm (protocol, replay, clients, rho, shared prefix, card) | pad | TTFT / Dense: mean (SD), n, 95 % interval "
             "| TTFT / INT8: mean (SD), n, 95 % interval |",
             "|---|---:|---|---|"]
    for (lab, p, rate), r in sorted(rows.items(), key=lambda kv: (kv[0][1] if kv[0][1] is not None else -1, kv[0][0],
                                                                   str(kv[0][2]))):
        lines.append(f"| {lab}{f' at rate {rate}' if rate else ''} | {p} | {cell(r.get('dense'))} | {cell(r.get('int8'))} |")
    return "\n".join(lines)
