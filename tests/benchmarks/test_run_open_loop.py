"""The one-GPU open-loop driver (benchmarks/run_open_loop.py), rehearsed on CPU with the stand-in
server tests/support/fake_sglang_server.py in place of ``sglang.launch_server``."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pytest

from benchmarks import open_loop_load as ol_load
from benchmarks import run_open_loop as rol

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "benchmarks" / "traces" / "sharegpt_qwen_n256_d1024_earliest_s0.json.gz"
WARM = ROOT / "benchmarks" / "traces" / "sharegpt_qwen_n128_d512_s0.json.gz"


def _ns(**kw) -> argparse.Namespace:
    base = dict(rho=0.7, max_running_requests=8, live_per_running=8.0, live_waiting=None, think_dist="exp",
                think_spread=0.5, arm_overhead_s=4.0, windows=5, min_window_s=8.0, max_window_s=20.0,
                seeds=[0, 1, 2, 3, 4])
    return argparse.Namespace(**{**base, **kw})


def test_plan_load_by_hand():
    # S = 1 s, T = 4: rate = 0.7 * 8 / 4 = 1.4/s, Z = 8 * 4 / 3 s, 45 conversations live at t = 0,
    # warm-up 1.5 Z + 2 S; per arm warm-up + S + 4 s of overhead + 5 windows
    got = ol_load.plan_load(_ns(), 1.0, 4, 256, 4, 300.0)
    z = 32 / 3
    assert got["rate"] == pytest.approx(1.4) and got["think_s"] == pytest.approx(z)
    assert got["initial_live"] == 45 and got["warmup_s"] == pytest.approx(1.5 * z + 2)
    assert got["arms"] == 4
    assert got["window_s"] == pytest.approx(math.floor((300 / 4 - (1.5 * z + 2) - 1 - 4) / 5 * 10) / 10) == 10.4
    # less time: the last arms are dropped until a window is >= 8 s
    short = ol_load.plan_load(_ns(), 1.0, 4, 256, 4, 200.0)       # 3 arms: (66.7 - 23) / 5 = 8.7 s windows
    assert short["arms"] == 3 and short["window_s"] >= 8.0
    assert ol_load.plan_load(_ns(), 1.0, 4, 256, 5, 120.0)["arms"] == 1
    # a fast server needs more conversations than the trace holds: the windows shrink to fit it
    fast = ol_load.plan_load(_ns(max_window_s=60.0), 0.25, 4, 256, 1, 400.0)
    assert 45 + fast["rate"] * (fast["warmup_s"] + 5 * fast["window_s"]) <= 0.95 * 256
    assert (got["live_per_running"], got["live_waiting"], got["left_s"]) == (8.0, pytest.approx(44.8), 300.0)
    assert got["per_arm_s"] == pytest.approx(1.5 * z + 2 + 1 + 4 + 5 * 10.4)


def test_live_waiting_sets_live_per_running_by_hand():
    # N = 64 waiting, rho R = 5.6 running: live_per_running = 64 / 5.6 = 11.43; S = 1, T = 4:
    # Z = 11.43 * 4 / 3 = 15.24 s, 64 conversations live at t = 0, warm-up 1.5 Z + 2 = 24.86 s
    got = ol_load.plan_load(_ns(live_per_running=None, live_waiting=64.0), 1.0, 4, 256, 4, 300.0)
    lpr = 64 / 5.6
    assert got["live_per_running"] == pytest.approx(lpr) and got["live_waiting"] == pytest.approx(64.0)
    assert got["think_s"] == pytest.approx(lpr * 4 / 3) and got["initial_live"] == 64
    assert got["rate"] == pytest.approx(1.4) and got["warmup_s"] == pytest.approx(1.5 * lpr * 4 / 3 + 2)
    # Little's law: conversations thinking = rate of think periods (rate * (T - 1)) x Z = N
    assert got["rate"] * 3 * got["think_s"] == pytest.approx(64.0)
    # the same load as live_per_running = N / (rho R)
    same = ol_load.plan_load(_ns(live_per_running=lpr), 1.0, 4, 256, 4, 300.0)
    assert {k: v for k, v in same.items()} == pytest.approx(got)


@pytest.mark.parametrize("service_s", [0.2, 0.55, 1.0, 3.4])
@pytest.mark.parametrize("n_arms", [1, 3, 6])
@pytest.mark.parametrize("left_s", [40.0, 150.0, 330.0, 560.0])
@pytest.mark.parametrize("waiting", [None, 64.0])
def test_planned_arms_fit_the_time_left_and_the_trace(service_s, n_arms, left_s, waiting):
    a = _ns(live_per_running=None if waiting else 8.0, live_waiting=waiting, min_window_s=3.0)
    got = ol_load.plan_load(a, service_s, 4, 256, n_arms, left_s)
    assert 1 <= got["arms"] <= n_arms and got["window_s"] <= a.max_window_s
    assert got["per_arm_s"] == pytest.approx(got["warmup_s"] + service_s + 4.0 + 5 * got["window_s"])
    if got["window_s"] > 0:
        assert got["arms"] * got["per_arm_s"] <= left_s + 1e-9
        assert got["initial_live"] + got["rate"] * (got["warmup_s"] + 5 * got["window_s"]) <= 0.95 * 256 + 1e-9
    if got["arms"] < n_arms:         # an arm was dropped only because its window would be too short
        more = min((left_s / (got["arms"] + 1) - (got["warmup_s"] + service_s + 4.0)) / 5, a.max_window_s,
                   ((0.95 * 256 - got["initial_live"]) / got["rate"] - got["warmup_s"]) / 5)
        assert more < a.min_window_s


def test_check_load_args():
    a = _ns(live_per_running=None)
    assert ol_load.check_load_args(a) is None and a.live_per_running == 8.0          # the default filled in
    a = _ns(live_per_running=None, live_waiting=64.0)
    assert ol_load.check_load_args(a) is None and a.live_per_running is None
    assert ol_load.check_load_args(_ns(live_waiting=64.0)).startswith("--live-waiting and --live-per-running: give one")
    assert ol_load.check_load_args(_ns(live_per_running=None, live_waiting=-1.0)) == \
        "--live-waiting: expected a positive number, got -1.0"
    assert ol_load.check_load_args(_ns(rho=float("nan"))) == "--rho: expected a positive number, got nan"
    assert ol_load.check_load_args(_ns(seeds=[0, 1])) == "--seeds: expected at least --windows 5 seeds"


@pytest.mark.parametrize("extra,msg", [
    (["--live-waiting", "64", "--live-per-running", "8"], "error: --live-waiting and --live-per-running: give one"),
    (["--live-waiting", "0"], "error: --live-waiting: expected a positive number, got 0.0"),
    (["--ttft-probe-reps", "0"], "error: --ttft-probe-reps: expected >= 1, got 0"),
    (["--ttft-probe-lengths", "512", "0"], "error: --ttft-probe-lengths: expected token counts >= 1, got [512, 0]"),
])
def test_main_refuses_bad_load_and_probe_flags_before_starting(tmp_path, capsys, extra, msg):
    (tmp_path / "arms.json").write_text(json.dumps([{"arm": "dense", "kind": "dense", "capacity": 56, "flags": []}]))
    rc = rol.main(["--arms-json", str(tmp_path / "arms.json"), "--plans", str(tmp_path), "--model", str(tmp_path),
                   "--trace", str(TRACE), "--warm-trace", str(WARM), "--max-running-requests", "8",
                   "--work", str(tmp_path / "work"), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(msg) and err.count("\n") == 1 and not (tmp_path / "work").exists()


def test_server_command_names_the_shared_gpu_flags():
    a = argparse.Namespace(launcher="python3 -m sglang.launch_server", model=Path("/m"), plans=Path("/p"),
                           mem_fraction_static=0.88, max_total_tokens=400000, context_length=12288,
                           max_running_requests=8, server_flag=["--foo"])
    cmd = rol.server_command(a, {"arm": "w", "kind": "dasc", "flags": ["--dasc-plan", "{plans}/w16-tp1-off"]}, 30100)
    assert cmd[:3] == ["python3", "-m", "sglang.launch_server"]
    for flag in ("--sleep-on-idle", "--disable-prefill-cuda-graph", "--skip-tokenizer-init", "--dasc-dummy-decay-ok"):
        assert flag in cmd
    assert cmd[cmd.index("--max-total-tokens") + 1] == "400000" and cmd[cmd.index("--tp-size") + 1] == "1"
    assert cmd[cmd.index("--dasc-plan") + 1] == "/p/w16-tp1-off" and "--foo" in cmd


@pytest.mark.slow
def test_driver_end_to_end_on_the_fake_server(tmp_path, monkeypatch):
    arms = [{"arm": "dense", "kind": "dense", "capacity": 56, "flags": ["--max-mamba-cache-size", "56"]},
            {"arm": "broken", "kind": "dense", "capacity": 56, "flags": ["--max-mamba-cache-size", "56"],
             "env": {"FAKE_DIE": "1"}},
            {"arm": "bigger", "kind": "dense", "capacity": 96, "flags": ["--max-mamba-cache-size", "96"]}]
    (tmp_path / "arms.json").write_text(json.dumps(arms))
    monkeypatch.setenv("FAKE_STARTUP_S", "1")
    monkeypatch.setenv("FAKE_TOKEN_S", "0.001")
    work = tmp_path / "work"
    rc = rol.main(["--arms-json", str(tmp_path / "arms.json"), "--plans", str(tmp_path), "--model", str(tmp_path),
                   "--trace", str(TRACE), "--warm-trace", str(WARM), "--max-running-requests", "8",
                   "--launcher", f"{sys.executable} {ROOT / 'tests' / 'support' / 'fake_sglang_server.py'}",
                   "--live-per-running", "2", "--min-window-s", "0.5", "--max-window-s", "1.0",
                   "--ttft-probe-lengths", "512", "4096", "8192", "20000",
                   "--stagger-s", "0.2", "--startup-deadline-s", "20", "--solo-start-s", "5", "--deadline-s", "60",
                   "--base-port", "31350", "--repeat-first", "--work", str(work)])
    assert rc == 0
    m = json.loads((work / "manifest.json").read_text())
    cal = m["calibration"]
    assert cal["arm"] == "dense" and cal["requests"] == 6        # single requests, the first two dropped
    assert cal["service_s"] == pytest.approx(cal["e2e_single_s"] * 1.15)
    load = m["load"]
    assert load["window_s"] == 1.0 and load["rate"] > 0
    assert load["live_per_running"] == 2.0 and load["live_waiting"] == pytest.approx(2 * 0.7 * 8)
    # the TTFT probe ran on the calibration arm before the load divided the time left; 20000 tokens
    # was clipped to the context (12288 - 64); the stand-in's TTFT is 10 ms + 20 ms per 1,000 tokens
    probe = m["ttft_probe"]
    assert probe["arm"] == "dense" and probe["error"] is None and probe["lengths"] == [512, 4096, 8192, 12224]
    assert [p["requests"] for p in probe["per_length"]] == [2, 2, 2, 2]
    assert all(r["cached_tokens"] == 0 for r in probe["requests"])
    assert 5 < probe["fit"]["a_ms"] < 40 and 16 < probe["fit"]["b_ms_per_1k_tokens"] < 26
    assert load["left_s"] <= 60 - probe["wall_s"]
    assert any("exited" in f for f in m["arms"]["broken"]["failures"]) and "summary" not in m["arms"]["broken"]
    for name in ("dense", "bigger"):
        s = m["arms"][name]["summary"]
        assert s["failed"] == 0 and len(s["windows"]) == 5 and s["requests"] > 0
        assert s["turn_order_violations"] == []
        res = json.loads((work / name / "result.json").read_text())
        assert res["config"]["params"]["rate"] == pytest.approx(load["rate"], rel=1e-5)
    # the same schedule for every arm: the same first requests at the same due times
    due = [sorted((r["conv"], r["turn"], r["due_s"]) for r in json.loads((work / n / "result.json").read_text())
                  ["requests"] if r["think_s"] == 0.0) for n in ("dense", "bigger", "dense-repeat")]
    assert due[0] == due[1] == due[2]
    rep = m["arms"]["dense-repeat"]
    assert rep["repeat_of"] == "dense" and rep["summary"]["arm"] == "dense-repeat" and rep["port"] == m["arms"]["dense"]["port"]
