"""The TTFT probe (benchmarks/ttft_probe.py): lengths, never-cached prompts, the least-squares line by
hand, and a probe of the stand-in server tests/support/fake_sglang_server.py, whose TTFT is
``FAKE_BASE_S + uncached tokens * FAKE_PREFILL_S_PER_TOKEN`` by construction, so the fitted line must
give those two figures back."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import serve_bench as sb
from benchmarks import ttft_probe as tp

FAKE = Path(__file__).resolve().parents[2] / "tests" / "support" / "fake_sglang_server.py"


def test_probe_lengths_clipped_to_the_context_and_kept_once():
    assert tp.probe_lengths(tp.DEFAULT_LENGTHS, 16640) == [512, 2048, 4096, 8192, 16000]
    assert tp.probe_lengths(tp.DEFAULT_LENGTHS, 12288) == [512, 2048, 4096, 8192, 12224]
    assert tp.probe_lengths(tp.DEFAULT_LENGTHS, 8192) == [512, 2048, 4096, 8128]        # 8192 and 16000 -> 8128
    assert tp.probe_lengths(tp.DEFAULT_LENGTHS, 600) == [512, 536]
    assert tp.probe_lengths(tp.DEFAULT_LENGTHS, 64) == []                              # none left


def test_probe_requests_share_no_token_and_stay_below_the_vocab():
    reqs = tp.probe_requests([512, 2048, 100], 2, 5320)
    assert [len(r.input_ids) for r in reqs] == [512, 2048, 100] * 2
    assert [r.turn for r in reqs] == list(range(6)) and {r.max_new_tokens for r in reqs} == {1}
    seen = [t for r in reqs for t in r.input_ids]
    assert len(set(seen)) == len(seen) == 5320 and max(seen) == 5319 and min(seen) == 0
    with pytest.raises(ValueError, match=r"needs 5322 distinct token ids \(2 x \[512, 2048, 101\]\), "
                                         r"the vocabulary holds 5320"):
        tp.probe_requests([512, 2048, 101], 2, 5320)


def test_fit_line_by_hand():
    assert tp.fit_line([0.5, 2.0, 4.0], [82.5, 90.0, 100.0]) == pytest.approx((80.0, 5.0))
    # x 1 2 3, y 1 3 2: mean (2, 2), Sxy = 1, Sxx = 2 -> b = 0.5, a = 1
    assert tp.fit_line([1, 2, 3], [1, 3, 2]) == pytest.approx((1.0, 0.5))
    with pytest.raises(ValueError, match="two distinct lengths"):
        tp.fit_line([4.0, 4.0], [90.0, 91.0])
    with pytest.raises(ValueError, match="two distinct lengths"):
        tp.fit_line([], [])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake_server():
    port = _free_port()
    env = {**os.environ, "FAKE_BASE_S": "0.04", "FAKE_PREFILL_S_PER_TOKEN": "0.00001"}
    p = subprocess.Popen([sys.executable, str(FAKE), "--port", str(port), "--max-running-requests", "8"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                if sb._http(url, "GET", "/health", timeout_s=1)[0] == 200:
                    break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        p.kill()
        p.wait()


def test_probe_recovers_the_fake_servers_line_and_flushes(fake_server):
    res = tp.run_probe(fake_server, [512, 4096, 8192], reps=2, vocab_size=163840)
    assert res["error"] is None and len(res["requests"]) == 6
    assert [r["tokens"] for r in res["requests"]] == [512, 4096, 8192] * 2
    assert all(r["ok"] and r["cached_tokens"] == 0 for r in res["requests"])      # never cached
    assert [(p["tokens"], p["requests"]) for p in res["per_length"]] == [(512, 2), (4096, 2), (8192, 2)]
    # the stand-in's TTFT is 40 ms + 10 ms per 1,000 uncached tokens (plus its own HTTP/JSON time)
    fit = res["fit"]
    assert fit["points"] == 6 and 35 < fit["a_ms"] < 60 and 8.5 < fit["b_ms_per_1k_tokens"] < 13
    slow, fast = res["per_length"][2]["ttft_ms_mean"], res["per_length"][0]["ttft_ms_mean"]
    assert slow - fast == pytest.approx(fit["b_ms_per_1k_tokens"] * (8192 - 512) / 1000, rel=0.25)
    # the probe flushed the cache: its first prompt misses again, and hits when sent twice
    first = tp.probe_requests([512], 1, 163840)[0]
    host, port = fake_server.rsplit(":", 1)
    again = [sb.send_generate(host[7:], int(port), first, timeout_s=10) for _ in range(2)]
    assert [r.cached_tokens for r in again] == [0, 512]
    line = tp.probe_line(res)
    assert line.startswith("TTFT ms by uncached prompt tokens {512: ") and " ms per 1k tokens (6 requests, " in line


def test_probe_of_a_dead_server_records_the_error_and_stops():
    res = tp.run_probe(f"http://127.0.0.1:{_free_port()}", [512, 4096], reps=2, vocab_size=163840, timeout_s=2)
    assert len(res["requests"]) == 1 and not res["requests"][0]["ok"]          # stopped at the first failure
    assert res["error"].startswith("request 0 (512 tokens) failed: ") and res["fit"] is None
    assert res["per_length"] == [] and "(no fit" in tp.probe_line(res) and "; error: request 0" in tp.probe_line(res)


def test_probe_budget_and_vocab_errors_are_recorded(fake_server):
    res = tp.run_probe(fake_server, [512, 4096], reps=2, vocab_size=163840, budget_s=0.0)
    assert res["requests"] == [] and res["error"] == "time budget 0 s spent: 4 of 4 requests not sent"
    res = tp.run_probe(fake_server, [512, 4096], reps=2, vocab_size=1000)
    assert res["requests"] == [] and res["error"].startswith("the probe needs 9216 distinct token ids")
