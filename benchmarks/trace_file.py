"""The serving trace file: its format, statistics, writer and reader.

A trace holds N conversations of T turns (T = 4 in the paper). Each conversation is stored as
its 2T token segments ``[user_1, reply_1, ..., user_T, reply_T]`` (token ids, int):

  * ``user_k``  = ``<|im_start|>`` + enc("user\\n" + text) + ``<|im_end|>`` + enc("\\n")
                  + ``<|im_start|>`` + enc("assistant\\n")       (ChatML, Qwen's chat format)
  * ``reply_k`` = enc(recorded assistant text) + ``<|im_end|>`` + enc("\\n")

Turn k's request sends the conversation so far and the new user turn, and decodes
``decode_tokens[k]`` = min(recorded reply length incl. ``<|im_end|>``, ``max_decode_tokens``)
tokens with ``ignore_eos``; which reply the earlier turns carry (the recorded one, or the one the
server generated) is the replay's choice (``benchmarks/chat_trace.py``).

The file is one JSON object (gzip when its name ends in ``.gz``; :func:`trace_to_json`):
``format`` (:data:`TRACE_FORMAT`), ``version`` (:data:`TRACE_VERSION`), ``params`` (the
builder's shape parameters), ``source`` (the ShareGPT file, its sha256, and the selection
counts), ``tokenizer``, ``stats`` (:func:`trace_stats`) and ``conversations``, each
``{"id", "first_pair", "segments", "decode_tokens"}`` (:class:`TraceConversation`).

Building a trace from ShareGPT (shape rules, selection, tokenizer) is
``benchmarks/build_trace.py``. This module imports only the standard library (plus the
stdlib-only ``dasc_compile.errors``), so the serving client can read traces on a machine
without the tokenizer.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

from dasc_compile.errors import DascInputError  # stdlib-only module

if TYPE_CHECKING:                                 # annotation only: the builder is not imported
    from benchmarks.build_trace import TraceParams

TRACE_FORMAT = "dasc-serving-trace"
# Bump when a field is added, removed or changes meaning; readers refuse other versions.
TRACE_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class TraceConversation:
    """One conversation of a trace.

    Attributes:
        source_id: the ShareGPT conversation id (split parts rejoined).
        first_pair: index of turn 1's user message among the source's dialogue pairs (0 unless
            earlier pairs ride in ``segments[0]`` as history).
        segments: 2T token-id lists ``[user_1, reply_1, ..., user_T, reply_T]``, int.
        decode_tokens: T decode lengths (tokens), ``min(len(reply_k) - 1, max_decode_tokens)``.
    """

    source_id: str
    segments: tuple[tuple[int, ...], ...]
    decode_tokens: tuple[int, ...]
    first_pair: int = 0

    @property
    def turns(self) -> int:
        return len(self.decode_tokens)

    def prompt_len(self, turn: int) -> int:
        """Tokens in the prompt of 0-indexed ``turn``: all segments before reply_turn."""
        return sum(len(s) for s in self.segments[: 2 * turn + 1])


def trace_stats(convs: Sequence[TraceConversation]) -> dict:
    """Token counts of a trace: per-turn prompt means, initial/final ranges, decode totals, and
    ``prompt_reuse_bound``, the cache-hit token rate of a cache that keeps every prompt's end."""
    if not convs:
        return {}
    turns = convs[0].turns
    initial = [c.prompt_len(0) for c in convs]
    final = [c.prompt_len(turns - 1) + c.decode_tokens[-1] for c in convs]
    decode = [d for c in convs for d in c.decode_tokens]
    total = sum(c.prompt_len(k) for c in convs for k in range(turns))
    reusable = sum(c.prompt_len(k - 1) for c in convs for k in range(1, turns))
    return {
        "conversations": len(convs), "requests": len(convs) * turns,
        "initial_prompt_tokens": {"min": min(initial), "mean": round(sum(initial) / len(initial), 1),
                                  "max": max(initial)},
        "final_context_tokens": {"min": min(final), "mean": round(sum(final) / len(final), 1),
                                 "max": max(final)},
        "mean_prompt_tokens_per_turn": [
            round(sum(c.prompt_len(k) for c in convs) / len(convs), 1) for k in range(turns)],
        "decode_tokens": {"total": sum(decode), "mean": round(sum(decode) / len(decode), 1),
                          "max": max(decode)},
        "prompt_tokens_total": total,
        # cached/prompt tokens if every turn k > 1 reused exactly turn k-1's prompt (a state
        # checkpoint at each prompt end; generated tokens never match the recorded reply)
        "prompt_reuse_bound": round(reusable / total, 4),
        "stored_tokens": sum(len(s) for c in convs for s in c.segments),
    }


def trace_to_json(convs: Sequence[TraceConversation], params: TraceParams, *, source: dict,
                  tokenizer: dict) -> dict:
    """The trace file's JSON object (format ``dasc-serving-trace``, version TRACE_VERSION)."""
    return {
        "format": TRACE_FORMAT, "version": TRACE_VERSION,
        "params": asdict(params), "source": source, "tokenizer": tokenizer,
        "stats": trace_stats(convs),
        "conversations": [{"id": c.source_id, "first_pair": c.first_pair,
                           "segments": [list(s) for s in c.segments],
                           "decode_tokens": list(c.decode_tokens)} for c in convs],
    }


def write_trace(path: str | Path, obj: dict) -> None:
    """Write the trace JSON (gzip when ``path`` ends in .gz) via a temporary file + os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(obj, separators=(",", ":")).encode()
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".gz":
        # no file name and mtime 0 in the gzip header: the same trace gives the same bytes
        with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb",
                                                   mtime=0) as f:
            f.write(data)
    else:
        tmp.write_bytes(data)
    os.replace(tmp, path)


def load_trace(path: str | Path) -> tuple[dict, list[TraceConversation]]:
    """Read a trace file written by :func:`write_trace`.

    Returns:
        (header, conversations): the JSON object without ``conversations``, and the conversations.
    Raises:
        DascInputError: unreadable file, wrong format/version, or a conversation whose segment
        count, decode lengths or token ids break the format.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
        obj = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, ValueError) as e:
        raise DascInputError(f"{path}: cannot read trace JSON ({e})") from None
    if not isinstance(obj, dict) or obj.get("format") != TRACE_FORMAT:
        raise DascInputError(f"{path}: expected format {TRACE_FORMAT!r}")
    if obj.get("version") != TRACE_VERSION:
        raise DascInputError(f"{path}: trace version {obj.get('version')!r}, expected {TRACE_VERSION}")
    convs = []
    for i, c in enumerate(obj.get("conversations") or []):
        segs, dec = c.get("segments"), c.get("decode_tokens")
        if (not isinstance(segs, list) or not isinstance(dec, list) or not dec
                or len(segs) != 2 * len(dec)):
            raise DascInputError(
                f"{path}: conversations[{i}] needs 2*T segments and T decode_tokens")
        if any(not isinstance(d, int) or d < 1 for d in dec):
            raise DascInputError(f"{path}: conversations[{i}].decode_tokens must be ints >= 1")
        if any(not s or any(not isinstance(t, int) or t < 0 for t in s) for s in segs):
            raise DascInputError(
                f"{path}: conversations[{i}].segments must be non-empty lists of ids >= 0")
        convs.append(TraceConversation(source_id=str(c.get("id", i)),
                                       first_pair=int(c.get("first_pair", 0)),
                                       segments=tuple(tuple(s) for s in segs),
                                       decode_tokens=tuple(dec)))
    if not convs:
        raise DascInputError(f"{path}: trace has no conversations")
    header = {k: v for k, v in obj.items() if k != "conversations"}
    return header, convs


def content_key(conv: TraceConversation) -> str:
    """sha256 of a conversation's token segments: equal for the same conversation stored under two ShareGPT
    ids (the dataset repeats some), given the same trace shape parameters."""
    return hashlib.sha256(json.dumps(conv.segments).encode()).hexdigest()


def excluded_conversations(paths: Iterable[str | Path]) -> tuple[frozenset[str], frozenset[str], list[dict]]:
    """The source ids and content keys of the conversations of earlier traces (``--exclude-trace``).

    Returns:
        (ids, keys, provenance): every conversation id of the traces, their :func:`content_key`, and per
        trace its file name, sha256 and conversation count (recorded in the new trace's ``source``).
    Raises:
        DascInputError: a file that is not a readable trace (:func:`load_trace`).
    """
    ids: set[str] = set()
    keys: set[str] = set()
    provenance = []
    for p in paths:
        p = Path(p)
        try:
            _, convs = load_trace(p)
            digest = hashlib.sha256(p.read_bytes()).hexdigest()
        except DascInputError as e:
            raise DascInputError(f"--exclude-trace {e}") from None
        except OSError as e:
            raise DascInputError(f"--exclude-trace {p}: cannot read ({e})") from None
        ids.update(c.source_id for c in convs)
        keys.update(content_key(c) for c in convs)
        provenance.append({"file": p.name, "sha256": digest, "conversations": len(convs)})
    return frozenset(ids), frozenset(keys), provenance
