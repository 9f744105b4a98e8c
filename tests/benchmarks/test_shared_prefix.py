"""A shared system prompt in the serving benchmark (issue 24): the pad's first tokens shared by a seed's
conversations, each request's shared bound, and the one rule by which every report counts a later turn that
found only the shared part as lost (benchmarks/turn_account.turn_class)."""

from __future__ import annotations

import random

import pytest

from benchmarks import chat_replay as cr
from benchmarks import serving_report as sr
from benchmarks import serving_runs as srun
from benchmarks.chat_trace import check_duplicates, common_prefix, context_pad, seed_conversations, shared_prefixes
from benchmarks.trace_file import load_trace
from benchmarks.run_order import run_name
from benchmarks.serving_pool import group_label
from benchmarks.turn_account import lost_turns, turn_class
from dasc_compile.errors import DascInputError
from tests.benchmarks.test_chat_protocol import REPO, TRACE, _run, fake_server  # noqa: F401 (a fixture)

IDS = dict(im_start=1, im_end=2, newline=3)


def test_context_pad_shares_exactly_its_first_tokens():
    a = context_pad("conv-a", 200, seed=4, shared_tokens=70, **IDS)
    b = context_pad("conv-b", 200, seed=4, shared_tokens=70, **IDS)
    assert len(a) == len(b) == 200 and a[0] == 1 and a[-2:] == (2, 3)
    assert common_prefix(a, b) == 70                       # positions 0..69 shared, 70 drawn per conversation
    # no shared prefix: the body is the conversation's own draw, as in every run before the option existed
    own = random.Random("4:conv-a")
    assert context_pad("conv-a", 200, seed=4, **IDS)[1:-2] == tuple(own.randrange(1000, 100000) for _ in range(197))
    assert common_prefix(context_pad("conv-a", 200, seed=4, **IDS), context_pad("conv-b", 200, seed=4, **IDS)) == 1
    # the whole block shared; another seed shares another block
    assert context_pad("conv-a", 200, seed=4, shared_tokens=200, **IDS) == \
        context_pad("conv-b", 200, seed=4, shared_tokens=200, **IDS)
    assert common_prefix(context_pad("conv-a", 200, seed=5, shared_tokens=200, **IDS), a) == 1


@pytest.mark.parametrize("shared", [-1, 201])
def test_a_shared_prefix_outside_the_pad_is_refused(shared):
    with pytest.raises(DascInputError, match=r"--shared-prefix-tokens: expected 0 to --pad-tokens \(200\)"):
        context_pad("c", 200, seed=0, shared_tokens=shared, **IDS)


def test_shared_prefixes_are_the_pairwise_common_prefixes():
    m = shared_prefixes([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 9], [7]])
    assert m == [[0, 2, 3, 0], [2, 0, 2, 0], [3, 2, 0, 0], [0, 0, 0, 0]]


@pytest.mark.parametrize("rec, cls", [
    (dict(turn=0, cached_tokens=640, reuse_bound=640, shared_tokens=640), "first"),
    (dict(turn=1, cached_tokens=640, reuse_bound=4096, shared_tokens=640), "lost"),    # only the shared block
    (dict(turn=1, cached_tokens=0, reuse_bound=4096, shared_tokens=640), "lost"),
    (dict(turn=1, cached_tokens=704, reuse_bound=4096, shared_tokens=640), "hit"),     # its own checkpoint
    (dict(turn=1, cached_tokens=640, reuse_bound=640, shared_tokens=640), "fresh"),    # nothing of its own
    (dict(turn=2, cached_tokens=64, reuse_bound=4096), "hit"),                         # records before the field
    (dict(turn=2, cached_tokens=0, reuse_bound=4096), "lost"),
    (dict(turn=2, cached_tokens=0, reuse_bound=0), "fresh"),
])
def test_turn_class_counts_a_shared_only_hit_as_lost(rec, cls):
    assert turn_class(rec) == cls


def _rec(conv, turn, prompt, cached, bound, shared, *, reply=64):
    return dict(conv=conv, turn=turn, source_id=str(conv), prompt_tokens=prompt, max_new_tokens=reply,
                reuse_bound=bound, shared_tokens=shared, prev_prompt_tokens=0, start_s=float(turn), end_s=turn + 0.5,
                ttft_s=1.0 + turn, e2e_s=2.0, cached_tokens=cached, completion_tokens=reply, queue_s=0.0,
                prefill_s=0.1, success=True, error="")


def test_run_stats_count_hits_beyond_the_shared_part():
    recs = [_rec(0, 0, 1000, 0, 0, 0), _rec(0, 1, 1200, 1088, 1088, 640),           # reply end (> prompt 1000)
            _rec(0, 2, 1400, 640, 1280, 640),                                     # shared part only: lost
            _rec(1, 0, 1000, 640, 640, 640), _rec(1, 1, 1200, 960, 1088, 640),    # first turn on the shared part;
            _rec(2, 0, 900, 0, 640, 640), _rec(2, 1, 1100, 0, 960, 640)]          # a prompt-end hit; a lost turn
    st = srun.run_stats({"records": recs, "config": {"protocol": "closed-loop-paper", "clients": 1}, "inflight": [],
                         "wall_s": 9.0}, max_running=8)
    assert (st["reply_end"], st["prompt_end"], st["lost"]) == (1, 1, 2)
    assert st["first_shared_hits"] == 1 and st["lost_shared_hit"] == 1
    # one client: conversations 1 and 2 start after the first (start_s 0 for every first turn here: by order)
    assert st["first_turns_mid"] == 2 and st["first_shared_hits_mid"] == 1
    # 640 shared tokens are 640 on the 64-token grid: conversation 1's first turn hit all of them
    assert st["first_shared_whole"] == 1 and st["first_shared_whole_mid"] == 1
    assert st["ttft_hit_s"] == pytest.approx(2.0) and st["ttft_miss_s"] == pytest.approx(2.5)   # turns 1 / 2 and 1
    lt = lost_turns(recs)
    assert lt["lost_reply_stored"] + lt["lost_prompt_only"] == 2 and len(lt["away_hit_s"]) == 2


def test_the_run_name_and_the_series_carry_the_shared_prefix():
    assert run_name("dense", 3, "served-reply", 3600, "arm", "c24", 0) == "dense__s3__served-reply__p3600__c24__k0"
    assert run_name("dense", 3, "served-reply", 3600, "drift", "c24", 1, shared=2048) == \
        "dense__s3__served-reply__p3600sh2048__c24__k1__drift"
    o = {"arm": "w16", "protocol": "closed-loop-paper", "replay": "served-reply", "clients": 24, "gpu": "NVIDIA H100"}
    assert "shared" not in group_label(o) and "2048 shared" in group_label({**o, "shared_prefix_tokens": 2048})


def test_the_report_keeps_shared_runs_apart_and_says_what_they_hit():
    plain, shared = ("closed-loop-paper", "served-reply", 3600, 256, 24, None, 24, 0), \
        ("closed-loop-paper", "served-reply", 3600, 256, 24, None, 24, 2048)
    runs = [_run("dense", 0, 2.0, cond=plain), _run("w16", 0, 1.0, cond=plain),
            {**_run("dense", 0, 3.0, cond=shared), "first_shared_hits": 20, "first_turns_mid": 12,
             "first_shared_hits_mid": 7, "first_shared_whole": 18, "first_shared_whole_mid": 5, "lost_shared_hit": 5},
            {**_run("w16", 0, 1.5, cond=shared), "first_shared_hits": 21, "first_turns_mid": 12,
             "first_shared_hits_mid": 12, "first_shared_whole": 21, "first_shared_whole_mid": 12, "lost_shared_hit": 0}]
    objs = sr.summarize(runs, model="m", decays="d")
    assert sorted((o["arm"], o["shared_prefix_tokens"], o["regime"]) for o in objs) == [
        ("dense", 0, "pad3600"), ("dense", 2048, "pad3600-shared2048"), ("w16", 0, "pad3600"),
        ("w16", 2048, "pad3600-shared2048")]
    assert {o["mean_ttft_ratio_vs_dense"] for o in objs if o["arm"] == "w16"} == {0.5}     # paired within each
    text = sr.markdown(objs)
    assert "pad 3600 (first 2048 shared), reply clip 256" in text
    assert ("first turns served from the shared part (of those a closed loop sends after its first clients' "
            "conversations) [of them, served the whole shared part, to SGLang's 64-token cache chunk] / lost later "
            "turns that found only the shared part: dense 20 (sent mid-run 7 of 12) [the whole part 18, mid-run 5] / 5; "
            "w16 21 (sent mid-run 12 of 12) [the whole part 21, mid-run 12] / 0.") in text


def test_the_client_records_each_request_s_shared_bound(fake_server, tmp_path):  # noqa: F811
    out = tmp_path / "shared.json.gz"
    assert cr.main(["--trace", str(TRACE), "--url", f"http://127.0.0.1:{fake_server}", "--arm", "dense", "--seed", "1",
                    "--conversations-per-seed", "4", "--clients", "2", "--decode-clip", "16", "--pad-tokens", "300",
                    "--shared-prefix-tokens", "200", "--out", str(out)]) == 0
    recs = cr.read_json(out)["records"]
    # 200 shared tokens are 192 on the 64 grid; the bound is taken when a request ends, against every conversation
    # started by then (the first conversations' early turns may end before another starts: 0 then). Two clients
    # take the seed's conversations in order, so the third and fourth start after one of the first two ended.
    later_started = seed_conversations(8, 4, 1)[2:]
    assert {r["shared_tokens"] for r in recs} <= {0, 192}
    assert all(r["shared_tokens"] == 192 for r in recs if r["conv"] in later_started)
    assert all(r["reuse_bound"] == r["shared_tokens"] for r in recs if r["turn"] == 0)
    assert all(r["reuse_bound"] >= r["shared_tokens"] for r in recs)
    assert all(r["cached_tokens"] <= r["reuse_bound"] for r in recs)       # an upper bound, whatever the order
    # two clients: the two conversations started second wait for a slot, and the stand-in cache holds the shared
    # block by then
    assert sum(r["cached_tokens"] > 0 for r in recs if r["turn"] == 0) >= 2
    assert cr.main(["--trace", str(TRACE), "--url", "http://127.0.0.1:9", "--arm", "x", "--seed", "1",
                    "--conversations-per-seed", "4", "--clients", "2", "--pad-tokens", "300",
                    "--shared-prefix-tokens", "301", "--out", str(tmp_path / "o.json")]) == 2
    assert not (tmp_path / "o.json").exists()


def test_run_chat_refuses_a_shared_prefix_longer_than_the_pad(tmp_path, capsys):
    import benchmarks.run_chat as rc
    argv = ["run", "--check", "--work", str(tmp_path / "absent"), "--trace", str(TRACE), "--arms", "dense",
            "--seeds", "1", "--conversations-per-seed", "2", "--pad-tokens", "300"]
    assert rc.main([*argv, "--shared-prefix-tokens", "300"]) == 0
    capsys.readouterr()
    assert rc.main([*argv, "--shared-prefix-tokens", "301"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --shared-prefix-tokens: expected 0 to --pad-tokens (300)"), err


def test_seeds_with_duplicate_conversations_are_refused_when_every_pad_is_the_same(tmp_path, capsys):
    """Trace x1 holds near-duplicates (150 and 152 the same, 45 and 106 three turns alike): with equal pads one
    would hit the other's checkpoints as its own. Seeds 1 and 6 of 24 hold them; seed 2 does not."""
    x1 = REPO / "benchmarks/traces/sharegpt_qwen_n256_d1024_min4k_x1.json.gz"
    _, convs = load_trace(x1)
    kw = dict(per_seed=24, pool_seed=0)
    with pytest.raises(DascInputError) as e:
        check_duplicates(convs, [1, 2, 6], pad_tokens=11600, shared_tokens=11600, **kw)
    assert str(e.value) == (
        "--seeds: trace seeds 1 (106 and 45), 6 (152 and 150): conversations that begin with the same 64+ tokens "
        "(duplicates in the trace); with every pad the same (--shared-prefix-tokens 11600 shares the whole pad: from "
        "--pad-tokens - 2 (11598) on, the closing markers are shared too) one would hit the other's checkpoints as "
        "its own: use other seeds, or --shared-prefix-tokens 11597 or less")
    with pytest.raises(DascInputError, match="--shared-prefix-tokens 11598 shares the whole pad"):
        check_duplicates(convs, [1], pad_tokens=11600, shared_tokens=11598, **kw)
    with pytest.raises(DascInputError, match=r"seed 6 \(152 and 150\).*\(--pad-tokens 0\).*a --pad-tokens of 4 or more"):
        check_duplicates(convs, [6], pad_tokens=0, **kw)
    check_duplicates(convs, [2], pad_tokens=11600, shared_tokens=11600, **kw)     # no duplicate there
    check_duplicates(convs, [1, 6], pad_tokens=11600, shared_tokens=11597, **kw)  # one body token its own
    check_duplicates(convs, [1, 6], pad_tokens=11600, **kw)                       # pads drawn per conversation
    import benchmarks.run_chat as rc
    argv = ["run", "--check", "--work", str(tmp_path / "absent"), "--trace", str(x1), "--arms", "dense", "--seeds",
            "6", "--conversations-per-seed", "24", "--pad-tokens", "11600"]
    assert rc.main([*argv, "--shared-prefix-tokens", "11600"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --seeds: trace seed 6 (152 and 150)"), err
    assert rc.main([*argv, "--shared-prefix-tokens", "8192"]) == 0


@pytest.mark.parametrize("shared, cached, want", [
    (11584, 11584, True), (11600, 11584, True),      # 11,600 shared tokens are 11,584 on the 64-token grid
    (11584, 8192, False), (11584, 0, False),          # a chunk-end state inside the part; nothing
    (40, 0, False), (40, 40, False), (0, 0, False)])  # under one cache chunk nothing is cacheable as "whole"
def test_whole_shared_hit_rounds_the_part_down_to_the_cache_chunk(shared, cached, want):
    from benchmarks.turn_account import whole_shared_hit

    assert whole_shared_hit({"turn": 0, "shared_tokens": shared, "cached_tokens": cached}) is want
