"""Synthetic long-range recall prompts (in the manner of RULER's NIAH single / multi-key and key-value tasks).

Three kinds, each a prefix of exactly ``prefix_len`` tokens, a question (the suffix) and an answer:

* ``niah_single``: filler sentences with one needle "The special magic number for <key> is <4 digits>."
  at token position ``depth * filler length``;
* ``niah_multikey``: three needles with distinct keys at different depths; the question asks for one;
* ``kv_pairs``: filler, then "Key-value records:" and lines " <key>: <4 digits>" (keys are
  adjective-animal pairs) filling up to 70 % of the prefix; the queried record sits at ``depth`` of the
  list, every other record is a distractor; the question is "Lookup <key>:".

The suffix asks for the queried key's value; the answer is the value (its tokens are the tail that
``dasc eval`` scores: greedy exact match). Each prompt records its ``distance``: tokens from the end of
the queried fact to the prefix boundary, so accuracy can be read at distances beyond a plan's w_max.
Generation is seeded: the same arguments give the same prompts. :func:`recall_text` gives the same
items as text (for training data that teaches the format). In a hybrid, retrieval from the prefix can
use the cached full-attention KV, which every arm leaves exact, so a recurrent-state arm changes the answer
only through the states it alters; in a model without attention layers the recurrent state is the only
way back to the prefix (docs/eval.md).
"""

from __future__ import annotations

import random

from dasc_compile.errors import DascInputError
from dasc_compile.eval.prompts import Prompt

DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
KINDS = ("niah_single", "niah_multikey", "kv_pairs")

_FILLER = (
    "The river ran past the old mill and on towards the sea.",
    "Nobody in the village remembered who had planted the first orchard.",
    "A cold wind came down from the hills every evening in autumn.",
    "The market opened at dawn and closed when the bread was gone.",
    "Children walked to school along the road beside the canal.",
    "The library kept its oldest maps in a room without windows.",
    "Rain fell for three days, and the fields turned dark and soft.",
    "The baker's cart rattled over the bridge before sunrise.",
    "On the hill stood a tower that no one had climbed for years.",
    "Fishing boats came back late, their lanterns low over the water.",
    "The town clock was always four minutes behind the station clock.",
    "In winter the lake froze hard enough to cross on foot.",
)
_KEYS = ("amber-falcon", "silver-otter", "cobalt-heron", "crimson-lynx", "ivory-badger", "jade-sparrow",
         "onyx-marten", "scarlet-ibis", "umber-wolf", "violet-crane", "golden-hare", "slate-raven")


def _needle(key: str, value: str) -> str:
    return f" The special magic number for {key} is {value}."


_KV_HEAD = "\nKey-value records:\n"


def _kv_line(key: str, value: str) -> str:
    # the leading space gives the key the tokens it has after "Lookup" (a BPE tokenizer folds a word's leading
    # space into its first token): without it a record began "l|uck|y-koala" and its question " luck|y-koala"
    # (the trained references' tokenizer), and matching a key took a token map on top of the recall itself
    return f" {key}: {value}\n"


def _question(kind: str, key: str) -> str:
    if kind == "kv_pairs":
        return f"\nLookup {key}:"
    return f"\nQuestion: What is the special magic number for {key}?\nAnswer: The special magic number for {key} is"


def _niah(tok, prefix_len: int, depth: float, kind: str, rng: random.Random) -> tuple[list[int], str, str, int]:
    n_needles = 1 if kind == "niah_single" else 3
    keys = rng.sample(_KEYS, n_needles)
    values = [str(rng.randint(1000, 9999)) for _ in keys]
    needles = [tok.encode(_needle(k, v)) for k, v in zip(keys, values)]
    need_len = sum(len(n) for n in needles)
    if need_len + 16 > prefix_len:
        raise DascInputError(f"--prefix-len {prefix_len}: too short for the retrieval prompts "
                             f"(their needles take {need_len} tokens; use at least {need_len + 16})")
    budget = prefix_len - need_len
    filler: list[int] = []
    while len(filler) < budget:
        filler += tok.encode(" " + rng.choice(_FILLER))
    flat = filler[:budget]
    depths = [depth] + rng.sample([x for x in DEPTHS if x != depth], n_needles - 1)
    # insert at token positions d * budget, deepest first so earlier positions do not shift
    order = sorted(range(n_needles), key=lambda i: -depths[i])
    for i in order:
        at = int(depths[i] * budget)
        flat[at:at] = needles[i]
    # the queried needle (index 0) ends after every needle inserted before it and itself
    end = int(depths[0] * budget) + sum(len(needles[i]) for i in range(n_needles) if depths[i] <= depths[0])
    assert len(flat) == prefix_len
    return flat, keys[0], values[0], prefix_len - end


def _kv(tok, prefix_len: int, depth: float, rng: random.Random) -> tuple[list[int], str, str, int]:
    words = sorted({k.split("-")[0] for k in _KEYS}), sorted({k.split("-")[1] for k in _KEYS})
    keys = [f"{a}-{b}" for a in words[0] for b in words[1]]
    rng.shuffle(keys)
    head = tok.encode(_KV_HEAD)
    lines: list[list[int]] = []
    pairs: list[tuple[str, str]] = []
    total = len(head)
    for key in keys:                                  # records fill at most 70 % of the prefix
        pair = (key, str(rng.randint(1000, 9999)))
        ids = tok.encode(_kv_line(*pair))
        if total + len(ids) > int(0.7 * prefix_len):
            break
        lines.append(ids)
        pairs.append(pair)
        total += len(ids)
    if len(lines) < 2:
        raise DascInputError(f"--prefix-len {prefix_len}: too short for the key-value retrieval prompts")
    q = min(int(depth * len(lines)), len(lines) - 1)
    pad: list[int] = []
    while len(pad) < prefix_len - total:              # text before the records, as in training data
        pad += tok.encode(" " + rng.choice(_FILLER))
    flat = pad[: prefix_len - total] + head + [t for ids in lines for t in ids]
    end = (prefix_len - total) + len(head) + sum(len(ids) for ids in lines[: q + 1])
    return flat, pairs[q][0], pairs[q][1], prefix_len - end


def niah_prompt(tok, prefix_len: int, depth: float, kind: str, rng: random.Random) -> Prompt:
    """One retrieval prompt of ``kind`` (:data:`KINDS`) whose queried fact sits at ``depth`` (0..1) of
    the prefix; ``tok`` has ``encode(str) -> list[int]``.

    Raises:
        DascInputError: ``prefix_len`` too short to hold the facts.
    """
    if kind == "kv_pairs":
        flat, key, value, distance = _kv(tok, prefix_len, depth, rng)
    else:
        flat, key, value, distance = _niah(tok, prefix_len, depth, kind, rng)
    return Prompt(prefix=flat, suffix=tok.encode(_question(kind, key)), answer=tok.encode(" " + value), kind=kind,
                  source=f"builtin:{kind}:depth={depth}", distance=distance)


def builtin_retrieval(tok, prefix_len: int, n: int, seed: int = 0) -> list[Prompt]:
    """``n`` retrieval prompts cycling over (kind, depth): single needle, three-key needles and key-value
    lists at depths 0.1 .. 0.9 of the prefix, seeded by ``seed``."""
    rng = random.Random(seed)
    grid = [(k, d) for k in KINDS for d in DEPTHS]
    return [niah_prompt(tok, prefix_len, grid[i % len(grid)][1], grid[i % len(grid)][0], rng) for i in range(n)]


class _Chars:
    """A 'tokenizer' over characters: lets :func:`recall_text` size items in characters."""

    def encode(self, text: str) -> list[str]:
        return list(text)


def recall_text(n_chars: int, kind: str, depth: float, rng: random.Random) -> tuple[str, str, str]:
    """One recall item as text, ``(context, question, answer)``, the context ``n_chars`` characters long:
    the same formats as :func:`niah_prompt`, for training data that teaches them (a model trained on
    these can then be scored by ``dasc eval --retrieval``)."""
    p = niah_prompt(_Chars(), n_chars, depth, kind, rng)
    return "".join(p.prefix), "".join(p.suffix), "".join(p.answer)
