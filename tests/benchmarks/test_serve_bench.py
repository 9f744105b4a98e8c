"""Serving benchmark: trace builder (benchmarks/build_trace.py), replay client
(benchmarks/serve_bench.py) and arm combiner (benchmarks/plot_serving.py).

Trace cases use a one-token-per-character toy tokenizer (token id = code point), ChatML specials
im_start = 1000 and im_end = 1001, so every length is hand-countable:
  user segment  = 1 + len("user\\n" + text) + 1 + len("\\n") + 1 + len("assistant\\n") = L + 19
  reply segment = L + 1 (<|im_end|>) + 1 ("\\n") = L + 2;   decode = min(L + 1, clip).
Client cases run against a local stand-in for SGLang's /generate (http.server, HTTP/1.1 chunked
server-sent events in the --skip-tokenizer-init format: output_ids + meta_info) whose prefix cache
reports the longest common prefix with any earlier prompt, as SGLang's radix cache does when
generated tokens are never reused.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from benchmarks import build_trace as bt
from benchmarks import plot_serving as ps
from benchmarks import serve_bench as sb
from dasc_compile.errors import DascInputError

ROOT = Path(__file__).resolve().parents[2]

CHAT = bt.ChatFormat(im_start=1000, im_end=1001)


def enc(text: str) -> list[int]:
    return [ord(ch) for ch in text]


def record(rid: str, *pairs: tuple[str, str]) -> dict:
    msgs = []
    for u, a in pairs:
        msgs += [{"from": "human", "value": u}, {"from": "gpt", "value": a}]
    return {"id": rid, "conversations": msgs}


# ---------------------------------------------------------------- trace builder


def test_recover_records_drops_the_cut_record():
    full = [record("a_0", ("hi", "yo")), record("b_0", ("x", "y"))]
    text = json.dumps(full, indent=2)
    recs, dropped = bt.recover_records(text)
    assert recs == full and dropped == 0
    cut = text.rstrip()[:-1] + ', {"id": "c_0", "conversations": [{"from": "hu'
    recs, dropped = bt.recover_records(cut)
    assert recs == full
    assert dropped == len('{"id": "c_0", "conversations": [{"from": "hu')
    with pytest.raises(DascInputError, match="JSON array"):
        bt.recover_records('{"id": 1}')
    with pytest.raises(DascInputError, match="no complete record"):
        bt.recover_records('[{"id": "a_0", "conv')


def test_join_split_records_overlap_contiguous_and_mismatch():
    m = [{"from": "human" if i % 2 == 0 else "gpt", "value": f"m{i}"} for i in range(8)]
    recs = [
        {"id": "A_0", "conversations": m[0:4]},
        {"id": "A_3", "conversations": m[3:6]},          # repeats m3
        {"id": "A_6", "conversations": m[6:8]},          # continues
        {"id": "B_0", "conversations": m[0:2]},
        {"id": "B_1", "conversations": [{"from": "gpt", "value": "other"}] + m[2:4]},  # disagrees
        {"id": "C", "conversations": m[0:2]},            # no part suffix
    ]
    joined = bt.join_split_records(recs)
    assert [j["id"] for j in joined] == ["A", "B", "C"]
    assert joined[0]["conversations"] == m and joined[0]["parts"] == ["A_0", "A_3", "A_6"]
    assert joined[1]["conversations"] == m[0:2] and joined[1]["parts"] == ["B_0"]
    assert joined[2]["conversations"] == m[0:2]


def test_dialogue_pairs_stop_at_role_break():
    r = record("x", ("u1", "a1"), ("u2", "a2"))
    assert bt.dialogue_pairs(r) == [("u1", "a1"), ("u2", "a2")]
    r["conversations"].insert(2, {"from": "system", "value": "s"})
    assert bt.dialogue_pairs(r) == [("u1", "a1")]
    assert bt.dialogue_pairs({"conversations": [{"from": "gpt", "value": "a"}]}) == []


def test_encoding_lengths_follow_chatml():
    u = bt.encode_user("abc", enc, CHAT)
    assert len(u) == 3 + 19
    assert u[0] == 1000 and u[1:6] == enc("user\n") and u[6:9] == enc("abc")
    assert u[9:] == [1001, 10, 1000] + enc("assistant\n")
    assert bt.encode_reply("xy", enc, CHAT) == enc("xy") + [1001, 10]


PARAMS = bt.TraceParams(num_conversations=2, turns=2, min_initial_tokens=30,
                        max_initial_tokens=60, max_context_tokens=200, max_decode_tokens=15)


def test_window_shape_rules_hand_computed():
    ok = [("u" * 20, "a" * 30), ("v" * 5, "b" * 8)]
    start, segs, dec = bt.window_conversation(ok, enc, CHAT, PARAMS)
    assert start == 0
    assert [len(s) for s in segs] == [39, 32, 24, 10]
    assert dec == [15, 9]                       # min(30 + 1, 15), min(8 + 1, 15)
    # initial prompt 5 + 19 = 24 < 30
    assert bt.window_conversation([("u" * 5, "a"), ("v", "b")], enc, CHAT,
                                  PARAMS) == "initial_out_of_range"
    # initial 41 + 19 = 60 is in range; final 60 + 102 + 119 + min(31, 15) = 296 > 200
    big = [("u" * 41, "a" * 100), ("v" * 100, "b" * 30)]
    assert bt.window_conversation(big, enc, CHAT, PARAMS) == "context_over_cap"
    # the cap is inclusive: 39 + 32 + (x + 19) + 15 = 200 at x = 95
    edge = [("u" * 20, "a" * 30), ("v" * 95, "b" * 30)]
    assert not isinstance(bt.window_conversation(edge, enc, CHAT, PARAMS), str)
    edge[1] = ("v" * 96, "b" * 30)
    assert bt.window_conversation(edge, enc, CHAT, PARAMS) == "context_over_cap"


def test_window_earliest_carries_history():
    pairs = [("u" * 2, "a" * 3), ("v" * 2, "b" * 4), ("w", "c"), ("x", "d")]
    p = bt.TraceParams(turns=2, min_initial_tokens=30, max_initial_tokens=60,
                       max_context_tokens=500, max_decode_tokens=99, start="earliest")
    start, segs, dec = bt.window_conversation(pairs, enc, CHAT, p)
    # pair 0 prompt 21 < 30; pair 1 prompt 21 + 5 + 21 = 47
    assert start == 1
    assert segs[0] == (bt.encode_user("uu", enc, CHAT) + bt.encode_reply("aaa", enc, CHAT)
                       + bt.encode_user("vv", enc, CHAT))
    assert [len(s) for s in segs] == [47, 6, 20, 3] and dec == [5, 2]
    first = bt.TraceParams(**{**p.__dict__, "start": "first"})
    assert bt.window_conversation(pairs, enc, CHAT, first) == "initial_out_of_range"


def _records(n: int) -> list[dict]:
    rng = random.Random(7)
    out = []
    for i in range(n):
        lu = rng.randrange(5, 45)                 # about half meet 30 <= L + 19 <= 60
        out.append(record(f"r{i}", ("u" * lu, "a" * rng.randrange(1, 40)),
                          ("v" * rng.randrange(1, 20), "b" * rng.randrange(1, 40))))
    out.append(record("short", ("u" * 30, "a")))  # one pair only: never eligible
    return out


def test_selection_is_deterministic_and_obeys_rules():
    recs = _records(40)
    p = bt.TraceParams(**{**PARAMS.__dict__, "num_conversations": 6})
    a, stats = bt.select_conversations(recs, enc, CHAT, p)
    b, _ = bt.select_conversations(recs, enc, CHAT, p)
    assert a == b and len(a) == 6
    assert stats["records"] == 41 and stats["eligible"] == 40
    assert stats["tokenized"] == 6 + stats["initial_out_of_range"] + stats["context_over_cap"]
    other, _ = bt.select_conversations(recs, enc, CHAT, bt.TraceParams(**{**p.__dict__, "seed": 1}))
    assert [c.source_id for c in other] != [c.source_id for c in a]
    by_id = {r["id"]: r for r in recs}
    for c in a:
        assert 30 <= len(c.segments[0]) <= 60
        assert c.prompt_len(1) + c.decode_tokens[1] <= 200
        (u1, a1), (u2, a2) = bt.dialogue_pairs(by_id[c.source_id])
        assert c.segments == (tuple(bt.encode_user(u1, enc, CHAT)), tuple(bt.encode_reply(a1, enc, CHAT)),
                              tuple(bt.encode_user(u2, enc, CHAT)), tuple(bt.encode_reply(a2, enc, CHAT)))
        assert c.decode_tokens == (min(len(a1) + 1, 15), min(len(a2) + 1, 15))
    with pytest.raises(DascInputError, match="meet the shape rules"):
        bt.select_conversations(recs, enc, CHAT, bt.TraceParams(**{**p.__dict__, "num_conversations": 40}))
    with pytest.raises(DascInputError, match="max_decode_tokens"):
        bt.TraceParams(max_decode_tokens=0).check()


def test_turn_requests_prompts_and_vocab_mapping():
    conv = bt.TraceConversation(source_id="x", segments=((5, 6), (7,), (8, 9, 10), (11,)),
                                decode_tokens=(3, 4))
    r = bt.turn_requests(2, conv)
    assert [(q.conv, q.turn, q.input_ids, q.max_new_tokens) for q in r] == [
        (2, 0, (5, 6), 3), (2, 1, (5, 6, 7, 8, 9, 10), 4)]
    m = bt.turn_requests(0, conv, vocab_size=8)
    assert m[1].input_ids == (5, 6, 7, 0, 1, 2)
    assert [q.max_new_tokens for q in bt.turn_requests(0, conv, decode_clip=3)] == [3, 3]   # 3 and 4, clipped at 3


def test_trace_file_round_trip_and_rejects(tmp_path):
    convs, _ = bt.select_conversations(_records(40), enc, CHAT, PARAMS)
    obj = bt.trace_to_json(convs, PARAMS, source={"file": "toy"}, tokenizer={"name": "chars"})
    assert obj["stats"]["requests"] == 4
    p0, p1 = (sum(c.prompt_len(k) for c in convs) for k in (0, 1))
    assert obj["stats"]["prompt_reuse_bound"] == round(p0 / (p0 + p1), 4)
    assert obj["stats"]["stored_tokens"] == sum(len(s) for c in convs for s in c.segments)
    for name in ("t.json", "t.json.gz"):
        bt.write_trace(tmp_path / name, obj)
        header, back = bt.load_trace(tmp_path / name)
        assert back == convs and header["tokenizer"] == {"name": "chars"}
    assert gzip.decompress((tmp_path / "t.json.gz").read_bytes())[:1] == b"{"
    bt.write_trace(tmp_path / "other.json.gz", obj)          # byte-identical under any name
    assert (tmp_path / "other.json.gz").read_bytes() == (tmp_path / "t.json.gz").read_bytes()
    bad = json.loads(json.dumps(obj))
    bad["version"] = 99
    (tmp_path / "v.json").write_text(json.dumps(bad))
    with pytest.raises(DascInputError, match="version"):
        bt.load_trace(tmp_path / "v.json")
    bad["version"] = bt.TRACE_VERSION
    bad["conversations"][0]["decode_tokens"].append(1)
    (tmp_path / "s.json").write_text(json.dumps(bad))
    with pytest.raises(DascInputError, match=r"conversations\[0\]"):
        bt.load_trace(tmp_path / "s.json")


def test_shipped_traces_follow_the_shape_rules():
    paths = sorted((ROOT / "benchmarks" / "traces").glob("*.json.gz"))
    assert paths, "no trace under benchmarks/traces"
    for path in paths:
        header, convs = bt.load_trace(path)
        p = bt.TraceParams(**header["params"])
        assert len(convs) == p.num_conversations and path.stat().st_size < 10 * 2**20
        im_start, im_end = header["tokenizer"]["im_start"], header["tokenizer"]["im_end"]
        for c in convs:
            assert c.turns == p.turns
            assert bt.conversation_shape_ok(c.segments, c.decode_tokens, p)
            assert all(1 <= d <= p.max_decode_tokens for d in c.decode_tokens)
            assert all(s[0] == im_start for s in c.segments[2::2])        # later user turns
            assert all(im_end in s for s in c.segments[1::2])             # recorded replies
            assert max(max(s) for s in c.segments) < 151936               # Qwen3-Next vocab
        assert header["stats"] == bt.trace_stats(convs)


# ---------------------------------------------------------------- client vs a local /generate


class FakeSGLang:
    """Local stand-in for SGLang's /generate stream (see module docstring)."""

    def __init__(self, ttft_delay=0.03, token_delay=0.002, fail_first_token=None,
                 error_first_token=None):
        self.ttft_delay, self.token_delay = ttft_delay, token_delay
        self.fail_first_token, self.error_first_token = fail_first_token, error_first_token
        self.seen: list[tuple[int, ...]] = []
        self.log: list[dict] = []            # one entry per request, in arrival order
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = 0
        self.flushes = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                body = json.dumps({"max_running_requests": 32, "version": "fake"}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/flush_cache":
                    with fake.lock:
                        fake.seen.clear()
                        fake.flushes += 1
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                fake.generate(self, json.loads(body))

        class Server(ThreadingHTTPServer):
            request_queue_size = 512          # like uvicorn's large backlog

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def generate(self, h, payload):
        ids = tuple(payload["input_ids"])
        sp = payload["sampling_params"]
        entry = {"ids": ids, "payload": payload, "t_in": time.perf_counter()}
        if ids[0] == self.fail_first_token:
            h.send_response(500)
            h.send_header("Content-Length", "4")
            h.end_headers()
            h.wfile.write(b"boom")
            return
        with self.lock:
            cached = max((next((i for i, (a, b) in enumerate(zip(ids, s)) if a != b),
                               min(len(ids), len(s))) for s in self.seen), default=0)
            self.seen.append(ids)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.log.append(entry)
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

        def chunk(b: bytes):
            h.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")
            h.wfile.flush()

        time.sleep(self.ttft_delay)
        if ids[0] == self.error_first_token:
            chunk(b'data: {"error": {"message": "bad"}}\n\n')
        else:
            out = []
            for i in range(sp["max_new_tokens"]):
                if i:
                    time.sleep(self.token_delay)
                out.append(7)
                ev = {"output_ids": out, "meta_info": {"prompt_tokens": len(ids),
                                                       "completion_tokens": len(out),
                                                       "cached_tokens": cached}}
                chunk(b"data: " + json.dumps(ev).encode() + b"\n\n")
        # book the end before the client can see it: once [DONE] is written the client may send
        # the conversation's next turn, whose handler thread could otherwise run first
        with self.lock:
            self.in_flight -= 1
            entry["t_out"] = time.perf_counter()
        chunk(b"data: [DONE]\n\n")
        chunk(b"")

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    f = FakeSGLang()
    yield f
    f.close()


def toy_convs(n: int) -> list[bt.TraceConversation]:
    """n 3-turn conversations whose first token (100 + c) differs, so nothing is shared."""
    return [bt.TraceConversation(source_id=f"c{c}",
                                 segments=((100 + c,) + (1,) * (10 + c), (2,) * 4, (3,) * 5,
                                           (4,) * 6, (5,) * 2, (6,) * 3),
                                 decode_tokens=(3, 5, 2)) for c in range(n)]


def test_client_records_match_server(fake):
    convs = toy_convs(3)
    reqs = [bt.turn_requests(i, c) for i, c in enumerate(convs)]
    records, wall = sb.run_replay(fake.url, reqs, source_ids=[c.source_id for c in convs],
                                  concurrency=2)
    assert [(r.conv, r.turn) for r in records] == [(c, t) for c in range(3) for t in range(3)]
    assert all(r.success and r.error == "" for r in records)
    for r in records:
        c = convs[r.conv]
        assert r.source_id == f"c{r.conv}"
        assert r.prompt_tokens == r.server_prompt_tokens == c.prompt_len(r.turn)
        # the fake caches prompts only: turn k reuses exactly the previous turn's prompt
        assert r.cached_tokens == (0 if r.turn == 0 else c.prompt_len(r.turn - 1))
        assert r.completion_tokens == r.max_new_tokens == c.decode_tokens[r.turn]
        assert r.ttft_s >= fake.ttft_delay
        assert r.e2e_s >= max(r.ttft_s, fake.ttft_delay + (r.max_new_tokens - 1) * fake.token_delay)
        assert r.e2e_s <= wall
    assert fake.max_in_flight == 2
    # request body: the token ids, forced decode length, greedy, streaming
    p = fake.log[0]["payload"]
    assert p["stream"] is True and p["sampling_params"]["ignore_eos"] is True
    assert p["sampling_params"]["temperature"] == 0.0
    # turns of one conversation never overlap: turn k+1 arrives after turn k's stream ended
    by_prompt = {e["ids"]: e for e in fake.log}
    for c in range(3):
        t = [by_prompt[q.input_ids] for q in reqs[c]]
        assert all(a["t_out"] <= b["t_in"] for a, b in zip(t, t[1:]))


def test_client_records_failures():
    f = FakeSGLang(ttft_delay=0.0, fail_first_token=100, error_first_token=101)
    try:
        convs = toy_convs(3)
        reqs = [bt.turn_requests(i, c) for i, c in enumerate(convs)]
        records, _ = sb.run_replay(f.url, reqs, source_ids=["a", "b", "c"], concurrency=3)
    finally:
        f.close()
    assert [r.success for r in records] == [False] * 6 + [True] * 3
    assert all(r.error.startswith("HTTP 500") for r in records[:3])
    assert all(r.error.startswith("server error") for r in records[3:6])
    assert all(math.isnan(r.ttft_s) for r in records[:6])


def test_percentile_matches_numpy():
    rng = random.Random(3)
    for n in (1, 2, 5, 37):
        xs = [rng.random() for _ in range(n)]
        for q in (0, 50, 95, 100):
            assert sb.percentile(xs, q) == pytest.approx(np.percentile(xs, q), abs=1e-12)
    assert sb.percentile([1.0, 2.0, 3.0, 4.0], 95) == pytest.approx(3.85)
    assert math.isnan(sb.percentile([], 95))


def _rec(conv, turn, ttft, e2e, prompt, cached, ok=True, new=4, done=4):
    return sb.RequestRecord(conv=conv, turn=turn, source_id="s", prompt_tokens=prompt,
                            max_new_tokens=new, ttft_s=ttft, e2e_s=e2e, cached_tokens=cached,
                            completion_tokens=done, success=ok)


def test_summarize_hand_computed():
    recs = [_rec(0, 0, 1.0, 2.0, 100, 0), _rec(0, 1, 2.0, 4.0, 150, 100),
            _rec(1, 0, 3.0, 6.0, 50, 10, done=3), _rec(1, 1, 4.0, 8.0, 200, 50),
            _rec(2, 0, math.nan, math.nan, 999, 0, ok=False)]
    s = sb.summarize(recs, arm="dense", checkpoint_capacity=64, wall_s=10.0)
    assert (s["requests"], s["failed"], s["requests_total"]) == (4, 1, 5)
    assert s["ttft_mean_s"] == pytest.approx(2.5) and s["ttft_p95_s"] == pytest.approx(3.85)
    assert s["e2e_mean_s"] == pytest.approx(5.0) and s["e2e_p95_s"] == pytest.approx(7.7)
    assert s["cache_hit_token_rate"] == pytest.approx(160 / 500)
    assert s["decode_mismatch"] == 1
    t0, t1 = s["per_turn"]
    assert t0["ttft_mean_s"] == pytest.approx(2.0) and t0["cache_hit_token_rate"] == pytest.approx(10 / 150)
    assert t1["e2e_mean_s"] == pytest.approx(6.0) and t1["cache_hit_token_rate"] == pytest.approx(150 / 350)
    row = sb.table_row(s)
    assert row == "| dense | 64 | 4 | 1 | 2.500 | 3.850 | 5.000 | 7.700 | 0.320 |"


def test_main_end_to_end(fake, tmp_path):
    convs = toy_convs(4)
    obj = bt.trace_to_json(convs, bt.TraceParams(num_conversations=4, turns=3),
                           source={}, tokenizer={"name": "toy"})
    bt.write_trace(tmp_path / "t.json.gz", obj)
    rc = sb.main(["--trace", str(tmp_path / "t.json.gz"), "--url", fake.url, "--arm", "int8",
                  "--checkpoint-capacity", "96", "--concurrency", "8", "--max-running-requests",
                  "32", "--vocab-size", "101", "--seed", "5", "--out", str(tmp_path / "int8")])
    assert rc == 0
    res = json.loads((tmp_path / "int8.json").read_text())
    assert res["summary"]["requests"] == 12 and res["summary"]["failed"] == 0
    assert res["config"]["server_info"]["max_running_requests"] == 32
    assert res["config"]["warnings"] == [] and fake.flushes == 1
    # ids 101..103 (first tokens of conversations 1..3) map to 0..2; 100 stays
    assert res["config"]["ids_remapped"] == 3
    assert sorted({e["ids"][0] for e in fake.log[1:]}) == [0, 1, 2, 100]
    # the flush dropped the warm-up prompt: every turn-0 request is a full miss
    assert all(r["cached_tokens"] == 0 for r in res["requests"] if r["turn"] == 0)
    assert "| int8 | 96 | 12 | 0 |" in (tmp_path / "int8.md").read_text()
    assert sb.main(["--trace", str(tmp_path / "t.json.gz"), "--arm", "x", "--out",
                    str(tmp_path / "y"), "--checkpoint-capacity", "1",
                    "--num-conversations", "9"]) == 2
    # --decode-clip: decode lengths (3, 5, 2) clipped to 4 -> (3, 4, 2); prompts unchanged
    n_before = len(fake.log)
    assert sb.main(["--trace", str(tmp_path / "t.json.gz"), "--url", fake.url, "--arm", "clip",
                    "--checkpoint-capacity", "1", "--decode-clip", "4", "--warmup", "0",
                    "--out", str(tmp_path / "clip")]) == 0
    clip = json.loads((tmp_path / "clip.json").read_text())
    assert clip["config"]["decode_clip"] == 4
    assert sorted({(r["turn"], r["max_new_tokens"], r["completion_tokens"]) for r in clip["requests"]}) == \
        [(0, 3, 3), (1, 4, 4), (2, 2, 2)]
    sent = [e["payload"]["sampling_params"]["max_new_tokens"] for e in fake.log[n_before:]]
    assert sorted(sent) == sorted([3, 4, 2] * 4)
    assert [r["prompt_tokens"] for r in clip["requests"]] == [r["prompt_tokens"] for r in res["requests"]]
    assert sb.main(["--trace", str(tmp_path / "t.json.gz"), "--arm", "x", "--out", str(tmp_path / "y"),
                    "--checkpoint-capacity", "1", "--decode-clip", "0"]) == 2


def test_plot_combines_runs(tmp_path):
    def result(arm, cap, ttft, e2e, name):
        s = sb.summarize([_rec(0, 0, ttft, e2e, 100, 40), _rec(0, 1, ttft, e2e, 100, 60)],
                         arm=arm, checkpoint_capacity=cap, wall_s=1.0)
        sb.write_json(tmp_path / name, {"format": sb.RESULT_FORMAT, "summary": s})
        return str(tmp_path / name)

    files = [result("dense", 64, 1.0, 3.0, "a.json"), result("dense", 64, 2.0, 5.0, "b.json"),
             result("dasc", 128, 0.5, 2.0, "c.json")]
    rows = ps.combine_arms(ps.load_results(files))
    assert [r["arm"] for r in rows] == ["dense", "dasc"]
    assert rows[0]["ttft_mean_s"] == pytest.approx(1.5) and rows[0]["e2e_mean_s"] == pytest.approx(4.0)
    assert rows[0]["ttft_mean_range"] == (1.0, 2.0) and rows[0]["runs"] == 2
    assert rows[0]["requests"] == 4 and rows[0]["cache_hit_token_rate"] == pytest.approx(0.5)
    assert ps.main(files + ["--out", str(tmp_path / "fig")]) == 0
    assert (tmp_path / "fig.png").read_bytes()[:4] == b"\x89PNG"
    assert "| dasc | 128 | 2 | 0 | 0.500 |" in (tmp_path / "fig.md").read_text()
    with pytest.raises(DascInputError, match="checkpoint-capacity"):
        ps.combine_arms(ps.load_results(files + [result("dasc", 64, 1.0, 1.0, "d.json")]))


def test_paired_ratios_pair_by_seed(tmp_path):
    def result(arm, seed, ttft, e2e, name):
        s = sb.summarize([_rec(0, 0, ttft, e2e, 100, 40)], arm=arm, checkpoint_capacity=8, wall_s=1.0)
        sb.write_json(tmp_path / name, {"format": sb.RESULT_FORMAT, "summary": s, "config": {"seed": seed}})
        return str(tmp_path / name)

    files = [result("dense", 0, 2.0, 4.0, "d0.json"), result("dense", 1, 4.0, 8.0, "d1.json"),
             result("dasc", 0, 1.0, 3.0, "c0.json"), result("dasc", 1, 3.0, 6.0, "c1.json"),
             result("dasc", 2, 9.0, 9.0, "c2.json")]          # seed 2 has no dense run: not paired
    rat = ps.paired_ratios(ps.load_results(files), "dense")
    # TTFT: 1/2 and 3/4 -> mean 0.625; E2E: 3/4 and 6/8 -> 0.75
    assert rat["dasc"]["ttft_mean_s"] == pytest.approx((0.625, 0.5, 0.75, 2))
    assert rat["dasc"]["e2e_mean_s"] == pytest.approx((0.75, 0.75, 0.75, 2))
    assert rat["dense"]["ttft_mean_s"] == pytest.approx((1.0, 1.0, 1.0, 2))
    md = ps.ratio_markdown(ps.load_results(files), ["dense", "int8"])   # int8 absent: one baseline
    assert "| dasc | 0.625 (0.500-0.750, 2 seeds) | 0.750 (0.750-0.750, 2 seeds) |" in md
    assert ps.ratio_markdown(ps.load_results(files), ["int8"]) == ""
    assert ps.main(files + ["--out", str(tmp_path / "fig"), "--capacity", "dasc=3"]) == 0
    assert "| dasc | 3 | 3 | 0 |" in (tmp_path / "fig.md").read_text()
    assert ps.main(files + ["--out", str(tmp_path / "fig"), "--capacity", "int8=3"]) == 2
    with pytest.raises(DascInputError, match="two runs with seed 0"):
        ps.paired_ratios(ps.load_results(files + [result("dasc", 0, 1.0, 1.0, "c0b.json")]), "dense")
