"""The untimed warm-up of the serving benchmark's servers (``benchmarks/run_chat.py up``).

A server's first requests of a new shape pay one-time costs that must not land in a timed run: Triton
compiles and autotuning of SGLang's kernels, the fused-MoE block configs picked by a batch's token count,
the restore and extend-with-prefix paths. :func:`warm_chats` builds requests of the shapes a timed run
sends, :func:`warm` replays them on one server, :func:`warm_all` orders the servers.
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

from benchmarks.chat_replay import IM_END, IM_START, NEWLINE
from benchmarks.sglang_server import flush


# Tokens of a later user turn in the warm-up chats. The min4k traces' follow-ups are 12-210 tokens (10th-90th
# percentile; median 27-29), and a batch's token count picks SGLang's fused-MoE block config: the 200-token
# follow-ups the warm-up used before left the small-extend configs to compile inside the first timed runs
# (a 90-token prefill took 1.3 s in the first INT8 run of 2026-12-01, 0.1 s later).
FOLLOW_UPS = (12, 24, 48, 96, 200, 600)

# The fused-MoE sweep: the token-count keys of SGLang's tuned fused-MoE config files
# (sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py picks the config of the key
# nearest a forward's token count M; keys 1-8 are decode batches, compiled by the CUDA-graph capture at
# start-up). Each key k is sent as a fresh prompt of k and of k + 1 tokens: Triton also specializes an
# integer argument on its divisibility by 16, and the kernel's num_valid_tokens is M x top-k, so an odd M
# is a second compile of the same config. Without it
# the first arm of a call paid those compiles inside its timed run: 16 fused-MoE variants compiled during
# seed 3's three runs of 2026-12-03 session 17 (the Triton cache grew 66 -> 75 MiB), and the opening Dense
# run's prefills stalled 1-2 s where the closing one took 0.3-0.6 s (drift 0.59); the second arm loaded
# them from the shared disk cache.
MOE_SWEEP = (16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)

# Odd token counts for the decode-size keys 4 and 8: the CUDA-graph capture compiles their configs only at
# the padded, even batch sizes 2, 4 and 8, but a prefill batch can be a later turn of a few new tokens. Two such
# variants compiled inside timed Dense runs of session 40 (H100): the odd-count twins of key 4's and key 8's
# configs, whose even twins the capture had compiled at start-up. Each is sent as a fresh prompt of that many
# tokens, which SGLang's nearest-key rule maps to key 4 (5) or key 8 (7, 9, 11). Key 2 (3 tokens) stays uncovered:
# a warm-up prompt needs at least 4 (the ChatML markers and one token).
SMALL_ODD = (5, 7, 9, 11)

# Fresh prompts of NT_BUCKET_PROMPT tokens, NT_BUCKET_GROUP of them sent at once, so that some prefill batch
# holds two of them: 4,100 + 4,092 tokens of an 8,192-token batch (SGLang's --chunked-prefill-size default on
# H100 / H200) in 65 + 64 = 129 chunks of 64. SGLang's GDN / KDA state kernel
# (sglang/kernels/ops/attention/fla/chunk_delta_h.py) keys its compile on NT_BUCKET: the batch's total chunk
# count <= 32, <= 128 or more. One sequence never exceeds 128 chunks in a batch, the singles run one at a time,
# and the chats' openings (run_chat's default --warm-lengths) are multiples of 64 tokens, so their cuts fall on
# chunk boundaries: no other warm-up batch reaches the third bucket. SGLang admits whatever is queued when a
# batch forms, first come, first served, a cut prompt continuing first, so this needs two of the group queued
# at once when some batch forms. The first prompt goes alone (the scheduler wakes on it), the next batch forms
# right after that one is launched, and the one after once its prefill is done; sessions 18-38 sent two, and
# session 38's scheduler took each alone (the compile then came inside a timed run:
# benchmarks/notes/2026-12-05-h200-s38-rho05-seed-4.md). Eight leave six queued behind the first two batches.
# Nothing forces the timing: prompts that each arrive after the previous batch formed would still miss it.
NT_BUCKET_PROMPT = 4100
NT_BUCKET_GROUP = 8


def warm_chats(lengths: Sequence[int], vocab: int, sessions: int, seed: int) -> tuple[list, list, list]:
    """The warm-up's requests: ``(singles, group, chats)``, lists of ``ChatTurns`` with random token ids.

    singles: one never-cached prompt per ``lengths`` entry (tokens), then one per :data:`MOE_SWEEP` key
    ``k`` at ``k`` and ``k + 1`` tokens (28 prompts, 25,918 tokens in all) and one per :data:`SMALL_ODD` count,
    each decoding 4 tokens.
    group: :data:`NT_BUCKET_GROUP` never-cached prompts of :data:`NT_BUCKET_PROMPT` tokens, to be sent at once,
    decoding 4.
    chats: ``sessions`` four-turn sessions run at once (give at least ``--max-running-requests``, so
    decode runs at every CUDA-graph batch size and prefills meet running decodes as in a timed run):
    session i opens with ``lengths[i % len(lengths)]`` tokens, then three later turns of
    :data:`FOLLOW_UPS` tokens (cycled from i), each hitting the previous turn's checkpoint (restore,
    extend-with-prefix), decoding 64 / 16 / 48 / 8 tokens.

    vocab: the served model's vocabulary; random ids are drawn from [1000, min(vocab, 100000)), the turn
    markers are Qwen's ChatML ids (up to 151,645, which ``run_chat --vocab-size`` must exceed).
    seed: the random ids' seed (``warm`` passes the server's port, so no two servers share a prompt).
    """
    import random

    from benchmarks.chat_trace import ChatTurns

    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(1000, min(vocab, 100000)) for _ in range(max(1, n))]  # noqa: E731
    close = [IM_END, NEWLINE]
    sweep = list(SMALL_ODD) + [k + odd for k in MOE_SWEEP for odd in (0, 1)]
    singles = [ChatTurns(conv=i, source_id="warm", user=[[IM_START] + ids(n - 3) + close], recorded=[close],
                         decode=[4]) for i, n in enumerate(list(lengths) + sweep)]
    group = [ChatTurns(conv=len(singles) + i, source_id="warm", user=[[IM_START] + ids(NT_BUCKET_PROMPT - 3) + close],
                       recorded=[close], decode=[4]) for i in range(NT_BUCKET_GROUP)]
    chats = [ChatTurns(conv=i, source_id="warm",
                       user=[[IM_START] + ids(lengths[i % len(lengths)] - 3) + close]
                       + [ids(FOLLOW_UPS[(i + j) % len(FOLLOW_UPS)]) for j in range(3)],
                       recorded=[close] * 4, decode=[64, 16, 48, 8]) for i in range(sessions)]
    return singles, group, chats


def warm(port: int, lengths: Sequence[int], vocab: int, sessions: int = 8) -> dict:
    """Untimed warm-up of one server (requests: :func:`warm_chats`), then a flush. Returns {s, failed}.

    The singles run one at a time (the long-prompt paths), the group at once (a prefill of two prompts
    over 128 chunks: :data:`NT_BUCKET_GROUP` x :data:`NT_BUCKET_PROMPT`), then the chats all at once (the restore,
    extend-with-prefix, mixed prefill / decode and batched-decode paths). The 2026-12-01 calls showed
    why the chats are needed: with only single prompts, the first timed run of the first two arms
    after a start ran 18-19 % slower than the same seed later (first-use compiles on the hit path)."""
    from benchmarks.chat_replay import Replay, run_closed

    t = time.monotonic()
    singles, group, chats = warm_chats(lengths, vocab, sessions, seed=port)
    url = f"http://127.0.0.1:{port}"
    failed = 0
    for requests, clients in ((singles, 1), (group, len(group)), (chats, len(chats))):
        r = Replay(url, requests, timeout_s=300)
        run_closed(r, clients)
        failed += sum(not x.success for x in r.records)
    flush(port)
    return {"s": round(time.monotonic() - t, 1), "failed": failed}


def warm_all(servers: dict, names: Sequence[str], lengths: Sequence[int], vocab: int, sessions: int,
             first_alone: bool) -> dict:
    """Warm ``names`` (arms of ``servers``); returns {arm: warm()'s result}.

    With ``first_alone`` the first arm warms by itself before the others start, all at once. SGLang's
    linear-attention Triton kernels autotune on first use and keep the winner in the Triton cache that
    every server on the machine shares (``FLA_CACHE_RESULTS``, on by default): tuned on an otherwise
    idle GPU, the configs every arm then reads are the same, rather than whichever of six servers'
    timings, taken while all six competed for the GPU, was written last."""
    res: dict = {}

    def one(n):
        res[n] = warm(servers[n]["port"], lengths, vocab, sessions)

    rest = list(names)
    if first_alone and rest:
        one(rest.pop(0))
    ts = [threading.Thread(target=one, args=(n,)) for n in rest]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    return res
