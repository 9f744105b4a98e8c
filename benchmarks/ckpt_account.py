"""The server's own checkpoint account over a benchmark's runs (issue 24 item 5), for ``serving_report``.

Each dasc run of ``benchmarks/run_chat.py`` carries the account its server logged at the flush after
the run (``manifest.json``, ``dasc_account``; format: ``runtime/account.py``): per origin (``chunk``,
``prompt`` end, ``decode``, ``reply`` end) the checkpoints ``stored``, ``reused`` (a copy-on-write
source at least once), ``evicted_unused`` and ``evicted_reused``. Over the seeds of one arm and
condition :func:`aggregate` sums them and derives, per origin,

* ``reuse_frac`` = reused / stored: the share of those checkpoints that ever served a hit;
* ``wasted_frac`` = evicted_unused / stored: the share that held a slot and left without serving one.

With chat replay, a prompt-end checkpoint serves a hit only when its request's reply-end checkpoint
is gone (or a prompt is sent again); a high ``stored`` and low ``reuse_frac`` for ``prompt`` beside
``lost`` later turns (client side) is the pattern that would argue for dropping it once the reply-end
one is stored. The client-side hit account (reply-end / prompt-end / lost later turns) stays in
``serving_runs.run_stats``; this module only reads what the server counted. Arms without a dasc
plan (Dense, SGLang INT8) have no account.
"""

from __future__ import annotations

import json
import math
from typing import Iterable, Optional, Sequence

from dasc_runtime.account import KINDS, ORIGINS  # noqa: F401  (the runtime's names, one definition)


def _show(x) -> str:
    try:
        text = json.dumps(x)
    except (TypeError, ValueError):
        text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def problem(account) -> Optional[str]:
    """What is wrong with one run's ``dasc_account`` (``None`` is fine: no account), or None.

    The runtime's format: ``{"origins": {KIND: {ORIGIN: count}}, "tiers": {name: number}}`` with
    KIND in :data:`KINDS`, ORIGIN in :data:`ORIGINS` and counts non-negative integers (a kind or
    origin left out counts 0). Anything else would be summed wrongly or dropped without a word.
    """
    want = ('expected null or {"origins": {KIND: {ORIGIN: count}}, "tiers": {...}} with KIND one of '
            f"{', '.join(KINDS)}, ORIGIN one of {', '.join(ORIGINS)} and counts integers >= 0")
    if account is None:
        return None
    if not isinstance(account, dict) or not isinstance(account.get("origins"), dict):
        return f"{want}; got {_show(account)}"
    for k, per in account["origins"].items():
        if k not in KINDS:
            return f"origins.{k}: not a kind of the account; {want}"
        if not isinstance(per, dict):
            return f"origins.{k}: {want}; got {_show(per)}"
        for o, v in per.items():
            if o not in ORIGINS:
                return f"origins.{k}.{o}: not an origin of the account; {want}"
            if not _count(v):
                return f"origins.{k}.{o}: {want}; got {_show(v)}"
    tiers = account.get("tiers", {})
    if not isinstance(tiers, dict):
        return f"tiers: expected an object of tier counters, got {_show(tiers)}"
    for k in ("hits_compressed", "hits_dense", "evictions_shadowed"):
        if k in tiers and not _count(tiers[k]):
            return f"tiers.{k}: expected an integer >= 0, got {_show(tiers[k])}"
    return None


def aggregate(accounts: Iterable[Optional[dict]], *, without: int = 0) -> Optional[dict]:
    """Sum the per-run accounts (None entries skipped) of one arm and condition.

    Args:
        accounts: each run's ``dasc_account`` (checked by :func:`problem` beforehand).
        without: the arm's dasc runs whose flush logged no account (refused, or the line was cut).
    Returns:
        None when no run has an account and none lacks one (no dasc arm, or manifests from before
        the account), else ``{"runs": n, "runs_without_account": without, KIND: {origin: int},
        "reuse_frac": {origin: float}, "wasted_frac": {origin: float}, "hits_compressed": int,
        "hits_dense": int, "evictions_shadowed": int}`` (fractions NaN where nothing of that origin was
        stored; evictions_shadowed: the victims of DASC_EVICT_SHADOWED_FIRST, 0 without it or in
        accounts from before the counter).
    """
    got = [a for a in accounts if isinstance(a, dict) and isinstance(a.get("origins"), dict)]
    if not got and not without:
        return None
    out: dict = {"runs": len(got), "runs_without_account": without}
    for k in KINDS:
        out[k] = {o: sum(int((a["origins"].get(k) or {}).get(o, 0)) for a in got) for o in ORIGINS}
    out["reuse_frac"] = {o: out["reused"][o] / out["stored"][o] if out["stored"][o] else math.nan for o in ORIGINS}
    out["wasted_frac"] = {o: out["evicted_unused"][o] / out["stored"][o] if out["stored"][o] else math.nan
                          for o in ORIGINS}
    for k in ("hits_compressed", "hits_dense", "evictions_shadowed"):
        out[k] = sum(int((a.get("tiers") or {}).get(k, 0)) for a in got)
    return out


def _runs(a: dict) -> str:
    n, m = a["runs"], a.get("runs_without_account", 0)
    return f"{n} of {n + m}" if m else str(n)


def _frac(x: float) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def markdown_rows(objs: Sequence[dict]) -> list[str]:
    """A table of the server accounts of one condition's arms (``obj["server_account"]``), or [] when
    none has one. Columns per origin that occurred: stored, reused share, evicted-unused share."""
    rows = [o for o in objs if o.get("server_account")]
    if not rows:
        return []
    used = [x for x in ORIGINS if any(o["server_account"]["stored"][x] for o in rows)] or ["prompt", "reply"]
    head = " | ".join(f"{x}: stored / share reused / share evicted unused" for x in used)
    out = ["Server-side checkpoint account (runtime/account.py; summed over the runs):", "",
           f"| arm | runs | {head} | hits: compressed / dense checkpoints | evicted by the shadowed-first rule |",
           "|---|---:|" + "---|" * len(used) + "---|---:|"]
    for o in rows:
        a = o["server_account"]
        cells = " | ".join(f"{a['stored'][x]} / {_frac(a['reuse_frac'][x])} / {_frac(a['wasted_frac'][x])}"
                           for x in used)
        out.append(f"| {o['arm']} | {_runs(a)} | {cells} | {a['hits_compressed']} / {a['hits_dense']} | "
                   f"{a.get('evictions_shadowed', 0)} |")
    if any(o["server_account"].get("runs_without_account") for o in rows):
        out += ["", "runs 'n of m': the other dasc runs' flush logged no account (the flush was refused, or no "
                "complete 'dasc account:' line came; manifest.json has dasc_account null); the sums are of n runs."]
    out.append("")
    return out
