"""Trace seeds and chat-like turns for the serving protocols (issue 24 items 3 and 5).

A **trace seed** is an independent draw of conversations: one fixed permutation of the trace's
conversations (``random.Random(pool_seed)``) is cut into consecutive blocks of ``per_seed``
conversations, and seed ``s`` takes block ``s``. Two seeds therefore never share a conversation
(:func:`seed_conversations`); a run of one seed on a flushed cache is one sample, never a window
of a longer run.

A **context pad** of ``pad_tokens`` tokens places a conversation at a longer context without
changing its turns: a ChatML system block ``<|im_start|> ids <|im_end|> \\n`` whose ids are
drawn per conversation (seeded by the trace seed and the conversation's ShareGPT id), so no two
conversations share a prefix through it. With it the regime map moves along context length
(initial prompts around 4k, 8k, 16k tokens) on the same conversations. A **shared prefix** of
``shared_tokens`` makes the block's first tokens the same for every conversation of a seed (a
system prompt all sessions send): the radix tree then forks where the block stops being shared,
and a checkpoint inside the shared part can serve any conversation's first turn
(:func:`shared_prefixes` gives each conversation's bound; :func:`benchmarks.turn_account.turn_class`
counts a later turn that found only the shared part as lost).

The **replay** decides what turn ``k + 1`` carries of turn ``k``'s reply (:class:`ChatTurns`):

* ``served-reply``: the token ids the server generated for turn ``k`` (the recorded reply only
  sets how many are decoded), then the reply's closing ``<|im_end|> \\n``, as a chat client
  sends the conversation so far. The checkpoint stored at the end of a served reply is the one
  the next turn can reuse.
* ``recorded-reply``: the recorded assistant text (the trace's reply segment), whatever the
  server generated. Only the previous *prompt*'s checkpoints can match then.

The module imports only the standard library (plus the stdlib-only trace reader,
``benchmarks/trace_file.py``), so the client runs on the GPU machine isolated from its site
packages.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Sequence

from benchmarks.trace_file import TraceConversation
from dasc_compile.errors import DascInputError

REPLAYS = ("served-reply", "recorded-reply")
# ordinary BPE ids for the pad (below Qwen's 151,643 merges, above its byte tokens)
PAD_ID_RANGE = (1000, 100000)
# SGLang's mamba checkpoints land on multiples of this many tokens (DEVICE-SGLANG.md: 700 -> 640)
CHECKPOINT_ALIGN = 64


def seed_conversations(num_conversations: int, per_seed: int, seed: int, *, pool_seed: int = 0) -> list[int]:
    """Trace indices of trace seed ``seed``: block ``seed`` of one seeded permutation.

    Args:
        num_conversations: conversations in the trace (the pool).
        per_seed: conversations per seed (>= 1).
        seed: the trace seed, 0 <= seed < num_conversations // per_seed.
        pool_seed: seed of the permutation (the same for every seed of a study).
    Returns:
        ``per_seed`` distinct indices in [0, num_conversations), in permutation order.
    Raises:
        DascInputError: per_seed < 1, or seed outside the disjoint blocks the pool holds.
    """
    if per_seed < 1:
        raise DascInputError(f"--conversations-per-seed: expected >= 1, got {per_seed}")
    blocks = num_conversations // per_seed
    if not 0 <= seed < blocks:
        raise DascInputError(f"trace seed {seed}: a trace of {num_conversations} conversations holds "
                             f"{blocks} disjoint seeds of {per_seed} (0..{blocks - 1})")
    order = list(range(num_conversations))
    random.Random(pool_seed).shuffle(order)
    return order[seed * per_seed:(seed + 1) * per_seed]


def check_pad(pad_tokens: int) -> None:
    """Refuse a context pad with no room for its body: 0, or >= 4 tokens (:func:`context_pad`).

    Raises:
        DascInputError: naming ``--pad-tokens``.
    """
    if pad_tokens < 0 or 0 < pad_tokens < 4:
        raise DascInputError(f"--pad-tokens: expected 0 or >= 4 tokens, got {pad_tokens}")


def check_shared(shared_tokens: int, pad_tokens: int) -> None:
    """Refuse a shared prefix longer than the context pad it is part of (:func:`context_pad`).

    Raises:
        DascInputError: naming ``--shared-prefix-tokens``.
    """
    if not 0 <= shared_tokens <= pad_tokens:
        raise DascInputError(f"--shared-prefix-tokens: expected 0 to --pad-tokens ({pad_tokens}) tokens, the "
                             f"part of the context pad every conversation of a seed shares, got {shared_tokens}")


def check_replay(replay: str) -> None:
    """Refuse a replay not in :data:`REPLAYS`.

    Raises:
        DascInputError: naming ``--replay`` and the replays there are.
    """
    if replay not in REPLAYS:
        raise DascInputError(f"--replay: expected one of {', '.join(REPLAYS)}, got {replay!r}")


def clipped(decode_tokens: Sequence[int], decode_clip: int | None) -> list[int]:
    """The decode lengths a replay asks for: each recorded length, at most ``decode_clip`` tokens (None: no clip)."""
    return [d if decode_clip is None else min(d, decode_clip) for d in decode_tokens]


def reply_close(reply: Sequence[int]) -> list[int]:
    """The closing ``<|im_end|> \\n`` of a recorded reply segment (build_trace.encode_reply), which a served reply is
    followed by in the next turn's prompt."""
    return list(reply[-2:])


def context_pad(source_id: str, pad_tokens: int, *, seed: int, im_start: int, im_end: int,
                newline: int, shared_tokens: int = 0) -> tuple[int, ...]:
    """The conversation's system block of ``pad_tokens`` tokens (0: empty).

    ``pad_tokens`` counts the whole block, markers included (>= 4 when not 0); the body ids are
    uniform in :data:`PAD_ID_RANGE`. Block position ``i`` (0 is ``<|im_start|>``) takes its id from
    ``random.Random(f"{seed}:shared")`` when ``i < shared_tokens`` (the same in every conversation of
    the seed) and from ``random.Random(f"{seed}:{source_id}")`` otherwise, so ``shared_tokens`` 0 gives
    the unshared block of earlier runs unchanged, and ``pad_tokens - 2`` or more shares all of it (the closing
    markers are the same in every block).

    Raises:
        DascInputError: 0 < pad_tokens < 4 (no room for the body) or pad_tokens < 0; shared_tokens
            outside [0, pad_tokens].
    """
    check_pad(pad_tokens)
    check_shared(shared_tokens, pad_tokens)
    if pad_tokens == 0:
        return ()
    own, shared = random.Random(f"{seed}:{source_id}"), random.Random(f"{seed}:shared")
    n_shared = max(0, min(shared_tokens - 1, pad_tokens - 3))       # body positions 1 .. shared_tokens - 1
    body = [shared.randrange(*PAD_ID_RANGE) for _ in range(n_shared)]
    body += [own.randrange(*PAD_ID_RANGE) for _ in range(pad_tokens - 3 - n_shared)]
    return (im_start, *body, im_end, newline)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences (tokens)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def shared_prefixes(first_prompts: Sequence[Sequence[int]]) -> list[list[int]]:
    """``out[i][j]``: tokens conversation ``i``'s first prompt shares with conversation ``j``'s (0 on the diagonal).

    Every later prompt of a conversation starts with its first prompt, so a later turn of ``i`` shares
    ``min(out[i][j], its length)`` tokens with anything ``j`` sent (unless ``i``'s first prompt is a prefix of
    ``j``'s, which a seed of distinct ShareGPT conversations does not hold). Quadratic in the conversations of
    a seed (24-42) and linear in the shared part: well under a second at 16k-token pads.
    """
    n = len(first_prompts)
    out = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            out[i][j] = out[j][i] = common_prefix(first_prompts[i], first_prompts[j])
    return out


@dataclass
class ChatTurns:
    """The growing conversation of one client (one conversation of the trace).

    Attributes:
        conv: trace index; source_id: ShareGPT id.
        user: T user segments (token ids; turn 1's holds earlier history in ``earliest`` traces).
        recorded: T recorded reply segments, each ending ``<|im_end|> \\n``.
        decode: T decode lengths (tokens, the reply clip applied).
        pad: the context pad (see :func:`context_pad`).
        replay: one of :data:`REPLAYS`.
        vocab_size: ids >= it are sent as ``id % vocab_size`` (a served model with a smaller
            vocabulary); the served reply's ids are sent back as the server gave them.
        history: token ids sent before the next user segment (pad, then earlier turns).
    """

    conv: int
    source_id: str
    user: Sequence[Sequence[int]]
    recorded: Sequence[Sequence[int]]
    decode: Sequence[int]
    pad: Sequence[int] = ()
    replay: str = "served-reply"
    vocab_size: int | None = None
    history: list[int] = field(default_factory=list)
    turn: int = 0

    def __post_init__(self) -> None:
        check_replay(self.replay)
        self.history = self._map(self.pad)

    def _map(self, ids: Sequence[int]) -> list[int]:
        v = self.vocab_size
        return list(ids) if v is None else [t % v if t >= v else t for t in ids]

    @property
    def done(self) -> bool:
        return self.turn >= len(self.user)

    def prompt(self) -> list[int]:
        """Prompt of the current turn: history + this turn's user segment (ids, int)."""
        return self.history + self._map(self.user[self.turn])

    def advance(self, output_ids: Sequence[int]) -> None:
        """Close the current turn: append its user segment and the reply the replay carries.

        Args:
            output_ids: the ids the server generated for this turn (used by ``served-reply``).
        """
        reply = self.recorded[self.turn]
        carried = (list(output_ids) + reply_close(reply)) if self.replay == "served-reply" else list(reply)
        self.history = self.prompt() + self._map(carried)
        self.turn += 1


def chat_turns(index: int, conv: TraceConversation, *, replay: str, decode_clip: int | None,
               pad: Sequence[int] = (), vocab_size: int | None = None) -> ChatTurns:
    """A :class:`ChatTurns` for one trace conversation (replies clipped at ``decode_clip`` tokens)."""
    user = conv.segments[0::2]
    recorded = conv.segments[1::2]
    decode = clipped(conv.decode_tokens, decode_clip)
    return ChatTurns(conv=index, source_id=conv.source_id, user=user, recorded=recorded, decode=decode,
                     pad=pad, replay=replay, vocab_size=vocab_size)


def reusable_tokens(prompt: Sequence[int], previous: Sequence[int], *, align: int = CHECKPOINT_ALIGN) -> int:
    """Tokens of ``prompt`` a cache holding every state of ``previous`` could serve (a turn's
    reuse bound): the common prefix, rounded down to ``align`` (checkpoint granularity) and at
    most ``len(prompt) - 1`` (the last prompt token is always computed)."""
    return aligned(common_prefix(prompt, previous), len(prompt), align=align)


def aligned(common: int, prompt_tokens: int, *, align: int = CHECKPOINT_ALIGN) -> int:
    """A common prefix of ``common`` tokens as the tokens a checkpoint could serve of a ``prompt_tokens``-token
    prompt: at most ``prompt_tokens - 1``, rounded down to ``align``."""
    n = max(0, min(common, prompt_tokens - 1))
    return n - n % align


def turn_lengths(conv: TraceConversation, *, replay: str, decode_clip: int | None,
                 pad_tokens: int) -> list[tuple[int, int]]:
    """``[(prompt tokens, reply tokens)]``, one pair per turn, of ``conv`` as :class:`ChatTurns` sends it: the pad,
    then every earlier turn's user segment and carried reply, then this turn's user segment. A served reply is
    exactly its decode length (the client sends ``ignore_eos``) plus its closing ``<|im_end|> \\n``; a recorded
    one is the trace's reply segment. Known before any request, so a run's settings can be checked against a
    server's context length (:func:`check_seeds`).

    Raises:
        DascInputError: ``replay`` not one of :data:`REPLAYS`; ``pad_tokens`` not 0 or >= 4 (:func:`context_pad`).
    """
    check_replay(replay)
    check_pad(pad_tokens)
    user, recorded = conv.segments[0::2], conv.segments[1::2]
    decode = clipped(conv.decode_tokens, decode_clip)
    out, history = [], pad_tokens
    for t, seg in enumerate(user):
        prompt = history + len(seg)
        out.append((prompt, decode[t]))
        carried = decode[t] + len(reply_close(recorded[t])) if replay == "served-reply" else len(recorded[t])
        history = prompt + carried
    return out


def check_duplicates(convs: Sequence[TraceConversation], seeds: Sequence[int], *, per_seed: int, pool_seed: int,
                     pad_tokens: int, shared_tokens: int = 0, align: int = CHECKPOINT_ALIGN) -> None:
    """Refuse a seed holding two conversations that begin alike when every conversation's pad is the same
    (``pad_tokens`` 0, or a shared prefix covering the whole pad): ShareGPT holds near-duplicates (trace x1:
    conversations 150 and 152 are the same, 45 and 106 share three turns), and with equal pads one would hit the
    other's checkpoints, beyond its own reuse bound, as if they were its own. Two first user segments that agree
    on ``align`` tokens or more count as alike. Distinct pads keep them apart, so nothing is checked then.

    Raises:
        DascInputError: naming each such seed and its pairs of conversations (trace indices).
    """
    check_pad(pad_tokens)
    body = pad_tokens - 3                       # the pad's body, markers aside (context_pad)
    if pad_tokens and shared_tokens - 1 < body:
        return
    bad = []
    for seed in seeds:
        idx = seed_conversations(len(convs), per_seed, seed, pool_seed=pool_seed)
        pairs = [f"{a} and {b}" for i, a in enumerate(idx) for b in idx[i + 1:]
                 if common_prefix(convs[a].segments[0], convs[b].segments[0]) >= align]
        if pairs:
            bad.append(f"{seed} ({'; '.join(pairs)})")
    if bad:
        if not pad_tokens:
            why, fix = "--pad-tokens 0", "a --pad-tokens of 4 or more"
        else:
            why = (f"--shared-prefix-tokens {shared_tokens} shares the whole pad: from --pad-tokens - 2 "
                   f"({pad_tokens - 2}) on, the closing markers are shared too")
            fix = f"--shared-prefix-tokens {pad_tokens - 3} or less"
        raise DascInputError(
            f"--seeds: trace {'seeds' if len(bad) > 1 else 'seed'} {', '.join(bad)}: conversations that begin with "
            f"the same {align}+ tokens (duplicates in the trace); with every pad the same ({why}) one would hit the "
            f"other's checkpoints as its own: use other seeds, or {fix}")


#: SGLang 0.5.17 (and 0.5.23) serves a turn whole only with ``prompt + reply + 2 <= context`` and ``prompt + 7 <=
#: context``. The tokenizer refuses a request (HTTP 400) whose prompt + reply exceed the context
#: (managers/tokenizer_manager.py ``_validate_one_request``: session 46's failed turns); the scheduler aborts inputs
#: of context - 6 tokens or more (managers/tp_worker.py ``get_worker_info``, managers/utils.py
#: ``validate_input_length``) and cuts a reply to ``context - prompt - 2`` tokens without an error
#: (managers/scheduler.py, ``max_new_tokens`` clipping). Assumed: no speculative decoding (no reserved tokens) and
#: a KV pool larger than the context (the benchmark's 600k-900k tokens).
REPLY_MARGIN, PROMPT_MARGIN = 2, 7


def check_seeds(convs: Sequence[TraceConversation], seeds: Sequence[int], *, per_seed: int, pool_seed: int,
                replay: str, decode_clip: int | None, pad_tokens: int, context_length: int | None) -> None:
    """Refuse trace seeds a run cannot serve as designed, before any run: a seed the trace does not hold
    (:func:`seed_conversations`), and with ``context_length`` (the servers' ``--context-length``, tokens) a seed
    with a turn SGLang would refuse or cut in every arm (:data:`REPLY_MARGIN`; session 46 lost two turns of trace
    x2 seed 2 at pad 11600 so).

    Raises:
        DascInputError: one line naming every refused seed, its turns over the context and the longest (its
            conversation and turn counted from 0, as the run records count them), then the context and the pad
            that would serve them all.
    """
    check_pad(pad_tokens)
    over: dict[int, list[tuple[int, int, int, int, int]]] = {}
    for seed in seeds:
        idx = seed_conversations(len(convs), per_seed, seed, pool_seed=pool_seed)
        if context_length is None:
            continue
        for i in idx:
            for t, (p, d) in enumerate(turn_lengths(convs[i], replay=replay, decode_clip=decode_clip,
                                                    pad_tokens=pad_tokens)):
                need = max(p + d + REPLY_MARGIN, p + PROMPT_MARGIN)
                if need > context_length:
                    over.setdefault(seed, []).append((need, p, d, i, t))
    if not over:
        return
    parts = []
    for seed, turns in over.items():
        _, p, d, i, t = max(turns)
        parts.append(f"seed {seed}: {len(turns)} turn{'s' if len(turns) > 1 else ''}, the longest conversation {i} "
                     f"turn {t} with {p:,} prompt + {d:,} reply tokens")
    need = max(n for turns in over.values() for n, *_ in turns)
    fits = pad_tokens - (need - context_length)
    pad = (f", or --pad-tokens {'0' if fits < 4 else f'{fits} or less'}" if fits >= 0 else "")
    raise DascInputError(
        f"--context-length {context_length}: trace {'seeds' if len(over) > 1 else 'seed'} "
        f"{', '.join(map(str, over))} would lose turns SGLang refuses or cuts in every arm ({'; '.join(parts)}; "
        f"turns counted from 0; SGLang needs prompt + reply + 2 and prompt + 7 tokens); serve --context-length {need} "
        f"or more{pad}, or use other seeds")
