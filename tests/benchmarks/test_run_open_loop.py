"""The one-GPU open-loop driver (benchmarks/run_open_loop.py), rehearsed on CPU with the stand-in
server tests/support/fake_sglang_server.py in place of ``sglang.launch_server``."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pytest

from benchmarks import run_open_loop as rol

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "benchmarks" / "traces" / "sharegpt_qwen_n256_d1024_earliest_s0.json.gz"
WARM = ROOT / "benchmarks" / "traces" / "sharegpt_qwen_n128_d512_s0.json.gz"


def _ns(**kw) -> argparse.Namespace:
    base = dict(rho=0.7, max_running_requests=8, live_per_running=8.0, think_dist="exp", think_spread=0.5,
                arm_overhead_s=4.0, windows=5, min_window_s=8.0, max_window_s=20.0)
    return argparse.Namespace(**{**base, **kw})


def test_plan_load_by_hand():
    # S = 1 s, T = 4: rate = 0.7 * 8 / 4 = 1.4/s, Z = 8 * 4 / 3 s, 45 conversations live at t = 0,
    # warm-up 1.5 Z + 2 S; per arm warm-up + S + 4 s of overhead + 5 windows
    got = rol.plan_load(_ns(), 1.0, 4, 256, 4, 300.0)
    z = 32 / 3
    assert got["rate"] == pytest.approx(1.4) and got["think_s"] == pytest.approx(z)
    assert got["initial_live"] == 45 and got["warmup_s"] == pytest.approx(1.5 * z + 2)
    assert got["arms"] == 4
    assert got["window_s"] == pytest.approx(math.floor((300 / 4 - (1.5 * z + 2) - 1 - 4) / 5 * 10) / 10) == 10.4
    # less time: the last arms are dropped until a window is >= 8 s
    short = rol.plan_load(_ns(), 1.0, 4, 256, 4, 200.0)       # 3 arms: (66.7 - 23) / 5 = 8.7 s windows
    assert short["arms"] == 3 and short["window_s"] >= 8.0
    assert rol.plan_load(_ns(), 1.0, 4, 256, 5, 120.0)["arms"] == 1
    # a fast server needs more conversations than the trace holds: the windows shrink to fit it
    fast = rol.plan_load(_ns(max_window_s=60.0), 0.25, 4, 256, 1, 400.0)
    assert 45 + fast["rate"] * (fast["warmup_s"] + 5 * fast["window_s"]) <= 0.95 * 256


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
                   "--stagger-s", "0.2", "--startup-deadline-s", "20", "--solo-start-s", "5", "--deadline-s", "60",
                   "--base-port", "31350", "--repeat-first", "--work", str(work)])
    assert rc == 0
    m = json.loads((work / "manifest.json").read_text())
    cal = m["calibration"]
    assert cal["arm"] == "dense" and cal["requests"] == 6        # single requests, the first two dropped
    assert cal["service_s"] == pytest.approx(cal["e2e_single_s"] * 1.15)
    load = m["load"]
    assert load["window_s"] == 1.0 and load["rate"] > 0
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
