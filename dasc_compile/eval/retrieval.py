"""Synthetic needle-in-a-haystack retrieval prompts (in the manner of RULER's NIAH single and multi-key).

A prompt's prefix is exactly ``prefix_len`` tokens of filler sentences with one needle ("The special
magic number for <key> is <4 digits>.") inserted at token position ``depth * filler length``, or
three needles with distinct keys (multi-key: the question asks for one of them, the others are
distractors at other depths). The
suffix asks for the queried key's number; the answer is the number (its tokens are the tail that
``dasc eval`` scores by teacher-forced greedy exact match). Generation is seeded: the same arguments
give the same prompts. Retrieval from the prefix needs the cached full-attention KV, which every arm
leaves exact; a recurrent-state arm changes the answer only through the states it alters.
"""

from __future__ import annotations

import random

from dasc_compile.errors import DascInputError
from dasc_compile.eval.prompts import Prompt

DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
KINDS = ("niah_single", "niah_multikey")

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


def niah_prompt(tok, prefix_len: int, depth: float, kind: str, rng: random.Random) -> Prompt:
    """One retrieval prompt; ``tok`` has ``encode(str) -> list[int]``.

    Raises:
        DascInputError: ``prefix_len`` too short to hold the needles.
    """
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
    filler = filler[:budget]
    depths = [depth] + [d for d in rng.sample([x for x in DEPTHS if x != depth], n_needles - 1)]
    # insert at token positions d * budget, deepest first so earlier positions do not shift
    flat = list(filler)
    for d, needle in sorted(zip(depths, needles), key=lambda x: -x[0]):
        at = int(d * budget)
        flat[at:at] = needle
    assert len(flat) == prefix_len
    q = keys[0]
    suffix = tok.encode(f"\nQuestion: What is the special magic number for {q}?\n"
                        f"Answer: The special magic number for {q} is")
    return Prompt(prefix=flat, suffix=suffix, answer=tok.encode(" " + values[0]), kind=kind,
                  source=f"builtin:{kind}:depth={depth}")


def builtin_retrieval(tok, prefix_len: int, n: int, seed: int = 0) -> list[Prompt]:
    """``n`` retrieval prompts cycling over (kind, depth): single and multi-key needles at depths
    0.1 .. 0.9 of the prefix, seeded by ``seed``."""
    rng = random.Random(seed)
    grid = [(k, d) for k in KINDS for d in DEPTHS]
    return [niah_prompt(tok, prefix_len, grid[i % len(grid)][1], grid[i % len(grid)][0], rng) for i in range(n)]
