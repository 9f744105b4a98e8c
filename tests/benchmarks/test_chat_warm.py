"""The serving benchmark's untimed warm-up (``benchmarks/chat_warm.py``): the request shapes it sends and
the order in which it warms the servers."""

from __future__ import annotations

import time

import pytest


def _prefill_chunk_counts(sizes: list[int], arrived: list[int], budget: int = 8192, chunk: int = 64) -> list[int]:
    """Chunks of ``chunk`` tokens in each prefill batch of prompts of ``sizes`` tokens sent at once, as SGLang's
    scheduler forms them (``schedule_policy.PrefillAdder``): a batch admits, first come, first served, the
    prompts queued when it forms, up to ``budget`` new tokens (``--chunked-prefill-size``); the prompt the budget
    cuts continues first in the next batch. ``arrived[i]``: how many of the prompts have reached the scheduler
    when batch i forms (cumulative; all of them after the list ends)."""
    left, counts, started, i = list(sizes), [], 0, 0
    while any(left):
        ready = arrived[i] if i < len(arrived) else len(sizes)
        room, n = budget, 0
        for j in range(len(sizes)):
            if room == 0 or j >= ready:
                break
            if left[j] == 0:
                continue
            t = min(left[j], room)
            room, left[j], n = room - t, left[j] - t, n + -(-t // chunk)
        counts.append(n)
        i += 1
    return counts


def test_the_chunk_simulation_cuts_and_continues_as_sglang_does():
    # one prompt per batch: 4,100 tokens are 65 chunks; two queued share 8,192 tokens (65 + 64) and the cut one
    # continues first (8 tokens, 1 chunk) beside the next
    assert _prefill_chunk_counts([4100, 4100], [1, 2]) == [65, 65]
    assert _prefill_chunk_counts([4100] * 4, [2]) == [129, 130, 1]
    assert _prefill_chunk_counts([4100] * 3, [1, 3]) == [65, 129, 1]
    assert _prefill_chunk_counts([10000], [1]) == [128, 29]                  # one prompt never exceeds 128


@pytest.mark.parametrize("arrived", [[1], [1, 2], [1, 2, 3], [1, 2, 3, 4, 5, 6], [2], [1, 3]])
def test_the_group_reaches_the_third_nt_bucket_once_two_of_it_wait_together(arrived):
    """SGLang's GDN / KDA state kernel compiles once per NT_BUCKET (a batch's chunks of 64 tokens: <= 32,
    <= 128, more); only a batch holding two prompts exceeds 128. The first prompt goes alone when the scheduler
    wakes on it (session 38 saw both prompts of the old pair go alone): the group must reach the third bucket
    as soon as any batch finds two of it queued, and a pair that arrives one batch at a time must not."""
    from benchmarks.chat_warm import NT_BUCKET_GROUP, NT_BUCKET_PROMPT

    sizes = [NT_BUCKET_PROMPT] * NT_BUCKET_GROUP
    assert max(_prefill_chunk_counts(sizes, arrived)) > 128, arrived
    assert max(_prefill_chunk_counts(sizes[:2], [1, 2])) <= 128                   # the old pair, split in two
    # three sent at once miss it when each of the first three batches finds only one more
    assert max(_prefill_chunk_counts(sizes[:3], [1, 2, 3])) <= 128
    assert NT_BUCKET_GROUP > 3 and NT_BUCKET_PROMPT % 64 and NT_BUCKET_PROMPT < 8192 < 2 * NT_BUCKET_PROMPT


def test_warm_up_sessions_cover_the_trace_follow_up_sizes_at_full_concurrency():
    from benchmarks.chat_warm import FOLLOW_UPS, MOE_SWEEP, SMALL_ODD, warm_chats

    singles, group, chats = warm_chats([2048, 8192, 16000], 163840, sessions=8, seed=1)
    assert [len(t.user[0]) for t in singles][:3] == [2048, 8192, 16000]
    # every fused-MoE config key once at an even and once at an odd token count (Triton's divisibility
    # specialization of num_valid_tokens = M x top-k); each a fresh prompt, so M is the whole prompt
    small = [len(t.user[0]) for t in singles][3:3 + len(SMALL_ODD)]
    sweep = [len(t.user[0]) for t in singles][3 + len(SMALL_ODD):]
    assert sweep[:4] == [16, 17, 24, 25] and sweep[-2:] == [4096, 4097] and len(sweep) == 2 * len(MOE_SWEEP)
    assert {n % 2 for n in sweep} == {0, 1} and all(n % 16 == 0 for n in sweep[::2] if n != 24)
    # the decode-size keys at an odd count: SGLang's nearest key (ties to the smaller, as min() over sorted keys)
    keys = (1, 2, 4, 8, *MOE_SWEEP)
    assert small == list(SMALL_ODD) and all(n % 2 for n in small)
    assert {min(keys, key=lambda k: abs(k - n)) for n in small} == {4, 8}
    # the group: fresh prompts of one length, sent at once (its batching: the test above)
    from benchmarks.chat_warm import NT_BUCKET_GROUP, NT_BUCKET_PROMPT

    assert [len(t.user[0]) for t in group] == [NT_BUCKET_PROMPT] * NT_BUCKET_GROUP
    assert len({tuple(t.user[0][1:9]) for t in singles + group}) == len(singles) + len(group)   # no shared prefix
    assert len({t.conv for t in singles + group}) == len(singles) + len(group)
    assert len(chats) == 8 and all(len(t.user) == 4 and len(t.decode) == 4 for t in chats)
    assert sorted({len(t.user[0]) for t in chats}) == [2048, 8192, 16000]
    follow = {len(seg) for t in chats for seg in t.user[1:]}
    assert follow == set(FOLLOW_UPS) and min(follow) <= 27 < max(follow)   # the trace's median follow-up: 27


def test_first_server_warms_alone_then_the_rest_at_once(monkeypatch):
    """The first arm's warm-up (it tunes the shared Triton autotune cache) must end before any other
    starts, and the others must overlap; with --warm-all-at-once all overlap."""
    import threading

    from benchmarks import chat_warm

    spans, lock = {}, threading.Lock()

    def fake_warm(port, lengths, vocab, sessions):
        t0 = time.monotonic()
        time.sleep(0.2)
        with lock:
            spans[port] = (t0, time.monotonic())
        return {"s": 0.2, "failed": 0}

    monkeypatch.setattr(chat_warm, "warm", fake_warm)
    servers = {n: {"port": p} for n, p in (("dense", 1), ("int8", 2), ("w16", 3))}
    res = chat_warm.warm_all(servers, ["dense", "int8", "w16"], [64], 1000, 8, first_alone=True)
    assert set(res) == {"dense", "int8", "w16"}
    assert spans[1][1] <= min(spans[2][0], spans[3][0])                      # dense alone first
    assert spans[2][0] < spans[3][1] and spans[3][0] < spans[2][1]            # the rest together
    spans.clear()
    chat_warm.warm_all(servers, ["dense", "int8", "w16"], [64], 1000, 8, first_alone=False)
    assert spans[1][0] < spans[2][1] and spans[2][0] < spans[1][1]


