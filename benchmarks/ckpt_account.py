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
``serving_report.run_stats``; this module only reads what the server counted. Arms without a dasc
plan (Dense, SGLang INT8) have no account.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

ORIGINS = ("chunk", "prompt", "decode", "reply")
KINDS = ("stored", "reused", "evicted_unused", "evicted_reused")


def aggregate(accounts: Iterable[Optional[dict]]) -> Optional[dict]:
    """Sum the per-run accounts (None entries skipped) of one arm and condition.

    Returns:
        None when no run has an account, else ``{"runs": n, KIND: {origin: int}, "reuse_frac":
        {origin: float}, "wasted_frac": {origin: float}, "hits_compressed": int, "hits_dense": int}``
        (fractions NaN where nothing of that origin was stored).
    """
    got = [a for a in accounts if isinstance(a, dict) and isinstance(a.get("origins"), dict)]
    if not got:
        return None
    out: dict = {"runs": len(got)}
    for k in KINDS:
        out[k] = {o: sum(int((a["origins"].get(k) or {}).get(o, 0)) for a in got) for o in ORIGINS}
    out["reuse_frac"] = {o: out["reused"][o] / out["stored"][o] if out["stored"][o] else math.nan for o in ORIGINS}
    out["wasted_frac"] = {o: out["evicted_unused"][o] / out["stored"][o] if out["stored"][o] else math.nan
                          for o in ORIGINS}
    for k in ("hits_compressed", "hits_dense"):
        out[k] = sum(int((a.get("tiers") or {}).get(k, 0)) for a in got)
    return out


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
           f"| arm | runs | {head} | hits c / d |", "|---|---:|" + "---|" * len(used) + "---|"]
    for o in rows:
        a = o["server_account"]
        cells = " | ".join(f"{a['stored'][x]} / {_frac(a['reuse_frac'][x])} / {_frac(a['wasted_frac'][x])}"
                           for x in used)
        out.append(f"| {o['arm']} | {a['runs']} | {cells} | {a['hits_compressed']} / {a['hits_dense']} |")
    out.append("")
    return out
