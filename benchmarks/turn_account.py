"""Where a run's later turns found their state, seen from the client's records (issue 24 item 5): the
conversations live at once (the working set the cached states must cover), and why a turn that should have
hit was lost (its reply left no checkpoint past the prompt, or the one it left was evicted) with how long its
conversation had been away. :mod:`benchmarks.serving_runs` adds these to each run's statistics; the server's
own count of stored and evicted checkpoints is :mod:`benchmarks.ckpt_account`.
"""

from __future__ import annotations

import math
from typing import Sequence

from benchmarks.chat_trace import CHECKPOINT_ALIGN
from dasc_compile.errors import DascInputError


def turn_class(record: dict) -> str:
    """The class of one successful ``chat_replay`` record, the one rule every report counts hits by:

    * ``first``: a conversation's first turn (turn 0), whatever it hit;
    * ``hit``: a later turn that hit beyond ``shared_tokens``, the part of its prompt another conversation
      already sent (a shared system prompt; 0 in runs without one, and in records written before the field
      existed): it found its own conversation's checkpoint;
    * ``lost``: a later turn that found no more than the shared part although its reuse bound was beyond it
      (its own checkpoint was evicted before it came back; a hit on the shared block alone counts here);
    * ``fresh``: a later turn with nothing of its own to reuse (bound within the shared part).
    """
    if record["turn"] == 0:
        return "first"
    shared = record.get("shared_tokens", 0)
    if record["cached_tokens"] > shared:
        return "hit"
    return "lost" if record["reuse_bound"] > shared else "fresh"


def whole_shared_hit(record: dict, chunk: int = CHECKPOINT_ALIGN) -> bool:
    """True when a record hit the whole shared part of its prompt, as far as the server can cache it: at least
    ``shared_tokens`` rounded down to a multiple of ``chunk`` tokens (a positive number; the checkpoint grid,
    SGLang's Mamba cache chunk: server_args.py ``mamba_cache_chunk_size``, where a prefill caches a state, its
    branching point included). A first turn that hit less found only a state cached inside the shared part (a
    chunk end, an earlier branching point)."""
    whole = record.get("shared_tokens", 0) // chunk * chunk
    return whole > 0 and record["cached_tokens"] >= whole


def live_conversations(records: Sequence[dict]) -> tuple[float, int]:
    """(time-average, peak) number of *live* conversations in a run: a conversation is live from its first
    request's ``start_s`` to its last request's ``end_s`` (s from the run's start), think time included.
    Between two turns its checkpoint must stay cached to be hit, so this is the run's working set in
    conversations, to set beside an arm's capacity under load (session 19: Dense lost 4-8 of 72 later
    turns at peaks of 11-14 live conversations, 16-17 at 18-19, with 16 states cached under load).
    The average is exact over [first start, last end] (a sweep over the interval ends); ``(nan, 0)`` when
    no record has both times."""
    spans: dict = {}
    for r in records:
        if r.get("start_s") is None or r.get("end_s") is None:
            continue
        a, b = spans.get(r["conv"], (math.inf, -math.inf))
        spans[r["conv"]] = (min(a, r["start_s"]), max(b, r["end_s"]))
    if not spans:
        return math.nan, 0
    events = sorted([(a, 1) for a, _ in spans.values()] + [(b, -1) for _, b in spans.values()],
                    key=lambda e: (e[0], e[1]))            # an end before a start at the same instant
    t0, t1 = events[0][0], events[-1][0]
    live = peak = 0
    area, last = 0.0, t0
    for t, d in events:
        area += live * (t - last)
        live, last = live + d, t
        peak = max(peak, live)
    return (area / (t1 - t0) if t1 > t0 else float(peak)), peak


# SGLang's --mamba-track-interval default (server_args.py ``mamba_track_interval``, 0.5.17 and 0.5.23): under
# ``extra_buffer`` a decoding request's state is tracked each time its length reaches a multiple of it, and a
# finished request caches the last tracked state.
SGLANG_TRACK_INTERVAL = 256


def track_interval(server: dict | None) -> int:
    """The ``--mamba-track-interval`` (tokens) a ``run_chat`` server ran with, from its ``servers.json`` entry:
    the server's ``command`` when recorded (what ran), else its launch ``flags``; ``--flag N`` or ``--flag=N``,
    the last one given winning as in SGLang's argument parser; SGLang's default :data:`SGLANG_TRACK_INTERVAL`
    when the flag is absent.

    Raises:
        DascInputError: the flag is there without a positive integer.
    """
    server = server or {}
    words = str(server["command"]).split() if server.get("command") else \
        [str(w) for w in (server.get("launch") or {}).get("flags") or []]
    flag, value = "--mamba-track-interval", None
    for i, w in enumerate(words):
        if w == flag or w.startswith(flag + "="):
            value = w.split("=", 1)[1] if "=" in w else (words[i + 1] if i + 1 < len(words) else "")
    if value is None:
        return SGLANG_TRACK_INTERVAL
    if not value.isdigit() or int(value) < 1:
        raise DascInputError(f"servers.json: {flag} {value!r}: expected a positive number of tokens")
    return int(value)


def _finite(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def lost_turns(records: Sequence[dict], interval: int = SGLANG_TRACK_INTERVAL) -> dict:
    """Why a run's later turns were lost, and how long their conversations had been away.

    A turn's time away is from its previous turn's end to its own scheduling: its start plus SGLang's queue
    time (``queue_s``, when the server reported it): the think time in the open loop, the queue wait in the
    closed loop, both of which a cached state must outlive.

    A finished request leaves a reply-end checkpoint only when its reply crossed a multiple of ``interval``
    (tokens, the server's ``--mamba-track-interval``): prompt ``P`` and reply ``L`` tokens leave one at
    ``floor((P + L) / interval) * interval`` when that is past ``P`` (on the committed runs every hit beyond the
    previous prompt matched exactly that length). A turn is lost as :func:`turn_class` says.

    Args:
        records: a run's ``chat_replay`` records, in any order (successful ones are read; a lost turn whose
            previous turn has no successful record counts as prompt-only; a turn without both times has no
            time away).
        interval: tokens between tracked states.
    Returns:
        ``{"lost_reply_stored": int, "lost_prompt_only": int, "away_lost_s": [s, ...],
        "away_hit_s": [s, ...]}``.
    """
    recs = [r for r in records if r["success"]]
    prev = {(r["conv"], r["turn"]): r for r in recs}
    out = {"lost_reply_stored": 0, "lost_prompt_only": 0, "away_lost_s": [], "away_hit_s": []}
    for r in recs:
        if r["turn"] == 0:
            continue
        p = prev.get((r["conv"], r["turn"] - 1))
        cls = turn_class(r)
        lost = cls == "lost"
        if lost:
            reply = p is not None and (p["prompt_tokens"] + p["completion_tokens"]) // interval > p["prompt_tokens"] // interval
            out["lost_reply_stored" if reply else "lost_prompt_only"] += 1
        if p is not None and _finite(r.get("start_s")) and _finite(p.get("end_s")) and cls in ("lost", "hit"):
            queue = r.get("queue_s") if _finite(r.get("queue_s")) else 0.0
            out["away_lost_s" if lost else "away_hit_s"].append(r["start_s"] + queue - p["end_s"])
    return out
