"""Training batches: windows of pre-tokenised ShareGPT text mixed with synthetic long-range recall.

Shards (written by ``prepare.py``) are xz-compressed little-endian uint16 token ids, conversations
separated by ``<|endoftext|>``. A batch is a function of (seed, step, the shards loaded): each step
draws from its own generator, so resuming at step s needs only s (no generator state to save).

Recall sequences (``recall_frac`` of the rows) end in one or two questions whose answers sit in the
sequence at any depth, most of them further back than every tested ``w_max`` (256 tokens) and up to
the whole sequence:

- ``needle``: 1-4 needles "The special magic number for <key> is <value>." (or a pass-key variant)
  inserted at token positions in a haystack of ShareGPT text or of plain filler sentences, then
  "Question: What is the special magic number for <key>?\\nAnswer: The special magic number for
  <key> is <value>." (the question format of ``dasc eval``'s built-in retrieval prompts);
- ``kv``: a list of " <key>: <value>" lines, then "Lookup <key>: <value>" lines for some of them. The records'
  leading space gives each key the same tokens as in its lookup (a BPE tokenizer folds a word's leading space
  into its first token); until 2026-12-04 they had none, and the record and the lookup of "lucky-koala" began
  with other tokens (``l|uck|y-k|o|ala`` against ``Ġluck|y-k|o|ala`` in the 8,192-id tokenizer): the rows of
  every model trained before then;
- ``copy`` (opt-in, ``copy_frac`` of the recall rows, 0 by default): "\\nCopy this:" and a span of 8-32 tokens
  drawn one by one from random stream positions (no language-model shortcut: only looking back finds them), a
  gap of text, then "\\nRepeat it exactly:" and the span again, which is what is scored (the mask covers
  exactly the copied span, the row's last tokens).

``min_gap`` (opt-in, 0 by default: depths as above) puts every answer's source at least that many tokens before
its question: needles are inserted no closer than ``min_gap`` haystack tokens to the first question, kv rows get
``min_gap`` tokens of text between the records and the lookups (and each record is looked up at most once, so no
earlier lookup repeats the answer nearby), copy rows' gap is drawn in [min_gap, all that is left]. Made for a model
whose recurrent layers answer short-range recall by themselves, so that its attention layers never have to learn
it (Kimi-Linear's MLA layers stayed at uniform attention). With the defaults the generator takes exactly the
draws it takes without these options (the kv records' leading space, above, changed the default rows once).

Each row carries its kind (:data:`KINDS`, an index into it): ``text`` (no answers), ``needle`` (a needle row
holding one needle), ``multikey`` (a needle row holding 2-4 needles with distinct keys, 1 or 2 of them asked),
``kv`` or ``copy``; the first three recall kinds are those of ``dasc eval``'s built-in retrieval (niah_single,
niah_multikey, kv_pairs). Drawn with the row, never read back from its tokens. Kind ids are stable: new kinds
are appended.

Keys combine words of :data:`ADJECTIVES` and :data:`ANIMALS` but never equal one of ``dasc eval``'s
twelve built-in keys (``dasc_compile.eval.retrieval._KEYS``, listed in :data:`EVAL_KEYS`), so
evaluation keys are unseen pairs. Values are 4-digit numbers (as evaluated) or 5-6 digits. Every
token, recall or text, carries the ordinary next-token loss, unless ``skip_sources`` (opt-in) leaves out the
*sources*: the value digits where a needle or a key-value record states them, and a copy row's source span. They
are random, so no model predicts them; trained on them, a 31M GDN model learned to answer a needle's template with
uniform digits while it copied the same number in other words (benchmarks/notes/2026-12-04-m30-gdn-100m.md).
:meth:`Batches.batch` gives that mask (``unscored``) beside the batch.
"""

from __future__ import annotations

import lzma
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

ADJECTIVES = ("amber", "silver", "cobalt", "crimson", "ivory", "jade", "onyx", "scarlet", "umber", "violet",
              "golden", "slate", "azure", "copper", "dusky", "emerald", "frosty", "gentle", "hazel", "indigo",
              "khaki", "lemon", "maroon", "navy", "olive", "pearl", "quiet", "russet", "sable", "tawny",
              "ultra", "velvet", "wild", "young", "zesty", "brave", "calm", "eager", "fancy", "lucky")
ANIMALS = ("falcon", "otter", "heron", "lynx", "badger", "sparrow", "marten", "ibis", "wolf", "crane", "hare",
           "raven", "beaver", "bison", "camel", "dingo", "eagle", "ferret", "gecko", "hyena", "iguana", "jackal",
           "koala", "lemur", "moose", "newt", "ocelot", "panda", "quail", "robin", "stoat", "tapir", "urchin",
           "viper", "walrus", "yak", "zebra", "cobra", "dove", "finch")
EVAL_KEYS = frozenset(("amber-falcon", "silver-otter", "cobalt-heron", "crimson-lynx", "ivory-badger",
                       "jade-sparrow", "onyx-marten", "scarlet-ibis", "umber-wolf", "violet-crane", "golden-hare",
                       "slate-raven"))
FILLER = (
    "The wind moved slowly over the fields near the town.", "A small boat was tied to the post by the river.",
    "The shop on the corner sold bread, milk and old newspapers.", "Clouds gathered above the hills in the afternoon.",
    "The road to the coast was long and mostly empty.", "An old dog slept in the sun beside the gate.",
    "Lamps were lit in the square as the evening came.", "The teacher wrote the date on the board each morning.",
    "Snow covered the roofs and the streets were quiet.", "A train passed through the valley twice a day.",
)
KINDS = ("text", "needle", "multikey", "kv", "copy")     # row kind ids: the index in this tuple (append only)
RECALL_KINDS = KINDS[1:]
TEXT, NEEDLE, MULTIKEY, KV, COPY = range(len(KINDS))
COPY_PROMPTS = ("\nCopy this:", "\nRepeat it exactly:")      # before the source span, before its copy
COPY_SPAN = (8, 32)                                          # span length in tokens, both ends included
TEMPLATES = (  # (needle, question, answer lead); the first is dasc eval's wording
    (" The special magic number for {k} is {v}.",
     "\nQuestion: What is the special magic number for {k}?\nAnswer: The special magic number for {k} is", " {v}"),
    (" The pass key for {k} is {v}. Remember it.",
     "\nQuestion: What is the pass key for {k}?\nAnswer: The pass key for {k} is", " {v}"),
)


def read_shard(path: Path) -> np.ndarray:
    """Token ids ``[n]`` uint16 of one ``*.u16.xz`` shard."""
    return np.frombuffer(lzma.decompress(Path(path).read_bytes()), dtype="<u2")


def write_shard(ids: np.ndarray, path: Path) -> int:
    """Write ``ids`` (uint16) as an xz shard; returns the file size in bytes."""
    data = lzma.compress(np.ascontiguousarray(ids, dtype="<u2").tobytes(), preset=6)
    Path(path).write_bytes(data)
    return len(data)


class Batch(NamedTuple):
    """One step's batch: token ids ``[B, T + 1]`` int64, ``answers`` ``[B, T + 1]`` bool (recall answer tokens),
    ``kinds`` ``[B]`` int64 (:data:`KINDS` ids), ``unscored`` ``[B, T + 1]`` bool (sources that carry no loss;
    all False unless ``skip_sources``)."""

    ids: torch.Tensor
    answers: torch.Tensor
    kinds: torch.Tensor
    unscored: torch.Tensor


def _find(seq: list[int], sub: list[int]) -> int:
    """Start of the last occurrence of ``sub`` in ``seq`` (-1: none)."""
    for i in range(len(seq) - len(sub), -1, -1):
        if seq[i:i + len(sub)] == sub:
            return i
    return -1


class Batches:
    """Batches ``[B, T + 1]`` int64 (inputs ``[:, :-1]``, targets ``[:, 1:]``) for a given step.

    Args:
        stream: concatenated token ids of the loaded shards, uint16 ``[n]`` with n > T + 1.
        tokenizer: a ``tokenizers.Tokenizer`` (encodes the recall strings).
        recall_frac: share of recall rows.
        min_gap: least distance in tokens from an answer's source to its question (module docstring; 0: any
            depth, the original placement), at most ``seq // 2`` and at most what a needle row leaves beside its
            longest needle, question and answer (checked here with every key, template and a 6-digit value, so no
            row fails mid-run).
        copy_frac: share of the recall rows that are ``copy`` rows (0: none, the original stream).
        skip_sources: mark the sources as unscored (module docstring); the rows themselves are unchanged.
    """

    def __init__(self, stream: np.ndarray, tokenizer, seq: int, batch: int, seed: int, recall_frac: float,
                 min_gap: int = 0, copy_frac: float = 0.0, skip_sources: bool = False):
        if stream.size <= 2 * (seq + 1):
            raise ValueError(f"the token stream must hold more than {2 * (seq + 1)} tokens, got {stream.size}")
        if not 0.0 <= recall_frac <= 1.0:
            raise ValueError(f"recall_frac must be in [0, 1], got {recall_frac}")
        if not 0.0 <= copy_frac <= 1.0:
            raise ValueError(f"copy_frac must be in [0, 1], got {copy_frac}")
        if not 0 <= min_gap <= seq // 2:
            raise ValueError(f"min_gap must be in [0, seq // 2 = {seq // 2}] (room for the recall rows' sources and "
                             f"questions), got {min_gap}")
        self.stream = torch.from_numpy(stream.astype(np.int64))
        self.tok, self.seq, self.batch_size, self.seed, self.recall_frac = tokenizer, seq, batch, seed, recall_frac
        self.min_gap, self.copy_frac, self.skip_sources = int(min_gap), float(copy_frac), bool(skip_sources)
        self._copy_prompts = [self._enc(p) for p in COPY_PROMPTS]
        longest = sum(map(len, self._copy_prompts)) + 2 * COPY_SPAN[1] + self.min_gap
        if copy_frac and longest > seq + 1:
            raise ValueError(f"seq {seq} is too short for copy rows with a gap of {min_gap} (they need {longest})")
        self._filler = [self._enc(" " + s) for s in FILLER]
        self.keys = [f"{a}-{b}" for a in ADJECTIVES for b in ANIMALS if f"{a}-{b}" not in EVAL_KEYS]
        self._needle_fixed, self._lookup = self._longest_parts() if recall_frac else (0, 0)   # no recall rows
        most = seq + 1 - self._needle_fixed                  # the largest gap a needle row can always hold
        if recall_frac and most < max(1, self.min_gap):
            need = self._needle_fixed + max(1, self.min_gap) - 1
            fix = f"the gap can be at most {most} (or seq at least {need})" if most >= 1 else \
                f"seq must be at least {need}"
            raise ValueError(f"seq {seq} is too short for the recall rows with a gap of {min_gap}: a needle row "
                             f"spends up to {self._needle_fixed} tokens on one needle, its question and answer, so "
                             f"{fix}")

    def _longest_parts(self) -> tuple[int, int]:
        """(tokens, at most, of one needle plus its question and answer; of one kv lookup and its answer) over
        every key and template, with a value at its longest (6 digits: the recall rows' worst case, so a row that
        passes the constructor's check always fits; the needle rows' and kv rows' guarantees rest on it)."""
        v = "9" * 6
        needle = max(sum(len(self._enc(t.format(k=k, v=v))) for t in tpl) for tpl in TEMPLATES for k in self.keys)
        return needle, max(len(self._enc(f"\nLookup {k}: {v}")) for k in self.keys)

    def _enc(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def _window(self, gen: torch.Generator, n: int) -> list[int]:
        i = int(torch.randint(0, self.stream.numel() - n, (1,), generator=gen))
        return self.stream[i:i + n].tolist()

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Batch of ``step``: (token ids ``[B, T + 1]`` int64, answer mask ``[B, T + 1]`` bool marking the
        tokens of recall answers, row kinds ``[B]`` int64 indexing :data:`KINDS`; text rows have no True)."""
        return self.batch(step)[:3]

    def batch(self, step: int) -> Batch:
        """:meth:`get`'s batch with its ``unscored`` mask (:class:`Batch`); the same draws, so the same rows."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        rows, masks, kinds, skips = [], [], [], []
        for _ in range(self.batch_size):
            mask = torch.zeros(self.seq + 1, dtype=torch.bool)
            skip = torch.zeros(self.seq + 1, dtype=torch.bool)
            if float(torch.rand((), generator=gen)) < self.recall_frac:
                ids, answers, kind, sources = self._recall(gen)
                mask[answers] = True
                skip[sources] = self.skip_sources
                rows.append(ids)
            else:
                rows.append(self._window(gen, self.seq + 1))
                kind = TEXT
            masks.append(mask)
            skips.append(skip)
            kinds.append(kind)
        return Batch(torch.tensor(rows, dtype=torch.int64), torch.stack(masks), torch.tensor(kinds, dtype=torch.int64),
                     torch.stack(skips))

    def _value(self, gen: torch.Generator) -> str:
        digits = 4 if float(torch.rand((), generator=gen)) < 0.7 else int(torch.randint(5, 7, (1,), generator=gen))
        return str(int(torch.randint(10 ** (digits - 1), 10 ** digits, (1,), generator=gen)))

    def _keys(self, gen: torch.Generator, n: int) -> list[str]:
        return [self.keys[int(i)] for i in torch.randperm(len(self.keys), generator=gen)[:n]]

    def _recall(self, gen: torch.Generator) -> tuple[list[int], list[int], int, list[int]]:
        """(token ids, answer positions, kind id, source positions) of one recall row of ``seq + 1`` tokens."""
        n = self.seq + 1
        if self.copy_frac and float(torch.rand((), generator=gen)) < self.copy_frac:   # no draw when off
            return self._copy(gen, n)
        if float(torch.rand((), generator=gen)) < 0.75:
            return self._needles(gen, n)
        return self._kv(gen, n)

    def _needles(self, gen: torch.Generator, n: int) -> tuple[list[int], list[int], int, list[int]]:
        n_needles = int(torch.randint(1, 5, (1,), generator=gen))
        needle_t, question_t, answer_t = TEMPLATES[int(torch.randint(0, len(TEMPLATES), (1,), generator=gen))]
        keys = self._keys(gen, n_needles)
        values = [self._value(gen) for _ in keys]
        need = max(n // 4, self.min_gap)                              # haystack tokens wanted
        needles = [self._enc(needle_t.format(k=k, v=v)) for k, v in zip(keys, values)]
        for n_asked in (min(n_needles, 2), 1):   # needles sit at random depths, so asking the first ones is fair
            tail: list[int] = []
            answers: list[int] = []                                   # positions within tail
            for i in range(n_asked):
                tail += self._enc(question_t.format(k=keys[i]))
                ans = self._enc(answer_t.format(v=values[i]))
                answers += range(len(tail), len(tail) + len(ans))
                tail += ans
            while len(needles) > n_asked and n - len(tail) - sum(map(len, needles)) < need:
                needles.pop()                                        # short sequences: fewer distractors
            budget = n - len(tail) - sum(map(len, needles))
            if budget >= need:
                break
        if budget < max(1, self.min_gap):
            raise ValueError(f"seq {n - 1} is too short for the recall rows (they need {n - budget} tokens"
                             f"{f' and a gap of {self.min_gap}' if self.min_gap else ''})")
        if float(torch.rand((), generator=gen)) < 0.3:           # plain filler sentences, as dasc eval's haystack
            hay: list[int] = []
            while len(hay) < budget:
                hay += self._filler[int(torch.randint(0, len(self._filler), (1,), generator=gen))]
            hay = hay[:budget]
        else:
            hay = self._window(gen, budget)
        # at most budget - min_gap: at least min_gap haystack tokens follow every needle
        at = sorted((int(torch.randint(0, budget + 1 - self.min_gap, (1,), generator=gen)) for _ in needles),
                    reverse=True)
        for pos, needle in zip(at, needles):                      # deepest first: earlier positions do not shift
            hay[pos:pos] = needle
        out = hay + tail
        assert len(out) == n
        # needle j ends up after the needles inserted later (at the same or a smaller position): shifted by them
        sources = [at[j] + sum(map(len, needles[j + 1:])) + i for j in range(len(needles))
                   for i in self._value_at(needles[j], values[j])]
        return out, [len(hay) + p for p in answers], NEEDLE if len(needles) == 1 else MULTIKEY, sources

    def _value_at(self, ids: list[int], value: str) -> range:
        """Positions in ``ids`` (a needle or a record) of ``value``'s tokens: its last occurrence."""
        v = self._enc(value)
        i = _find(ids, v)
        return range(i, i + len(v)) if i >= 0 else range(0)

    def _kv(self, gen: torch.Generator, n: int) -> tuple[list[int], list[int], int, list[int]]:
        lines: list[list[int]] = []
        pairs: list[tuple[str, str]] = []
        head = self._enc("Key-value records:\n")
        used = len(head)
        target = int((n - self.min_gap) * (0.5 + 0.4 * float(torch.rand((), generator=gen))))
        if self.min_gap:        # room for one lookup after the gap, at least (the default rows stay as pinned)
            target = min(target, n - self.min_gap - self._lookup)
        for k in self._keys(gen, 400):
            v = self._value(gen)
            ids = self._enc(f" {k}: {v}\n")     # the key's tokens as in "Lookup <key>:" (module docstring)
            if used + len(ids) > target:
                break
            lines.append(ids)
            pairs.append((k, v))
            used += len(ids)
        if not pairs:
            return self._needles(gen, n)
        out = head + [t for line in lines for t in line]
        answers: list[int] = []
        order = torch.randperm(len(pairs), generator=gen).tolist() if self.min_gap else None
        if self.min_gap:
            out += self._window(gen, self.min_gap)         # text between the records and the lookups
        while not self.min_gap or order:                   # min_gap: each record looked up at most once
            k, v = pairs[order.pop() if self.min_gap else int(torch.randint(0, len(pairs), (1,), generator=gen))]
            q, ans = self._enc(f"\nLookup {k}:"), self._enc(f" {v}")
            if len(out) + len(q) + len(ans) > n:
                break
            out += q
            answers += range(len(out), len(out) + len(ans))
            out += ans
        pad = self._window(gen, n - len(out))      # fill the rest with text, before the records
        sources, at = [], len(pad) + len(head)
        for line, (_, v) in zip(lines, pairs):
            sources += [at + i for i in self._value_at(line, v)]
            at += len(line)
        return pad + out, [len(pad) + p for p in answers], KV, sources

    def _copy(self, gen: torch.Generator, n: int) -> tuple[list[int], list[int], int, list[int]]:
        """A ``copy`` row (module docstring): text, the source span, a gap of text of at least ``min_gap``
        tokens, the copy (the answers: the row's last ``L`` tokens)."""
        length = int(torch.randint(COPY_SPAN[0], COPY_SPAN[1] + 1, (1,), generator=gen))
        span = self.stream[torch.randint(0, self.stream.numel(), (length,), generator=gen)].tolist()
        src, ask = self._copy_prompts
        room = n - len(src) - len(ask) - 2 * length          # text tokens, before the source and in the gap
        if room < self.min_gap:
            raise ValueError(f"seq {n - 1} is too short for copy rows with a gap of {self.min_gap}")
        gap = int(torch.randint(self.min_gap, room + 1, (1,), generator=gen))
        hay = self._window(gen, room)
        out = hay[:room - gap] + src + span + hay[room - gap:] + ask + span
        assert len(out) == n
        start = room - gap + len(src)                     # the source span: random stream tokens
        return out, list(range(n - length, n)), COPY, list(range(start, start + length))
