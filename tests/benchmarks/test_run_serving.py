"""Process and port handling of the serving-benchmark runner (benchmarks/run_serving.py); CPU only."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import time
from pathlib import Path

from benchmarks import run_serving as rs

ROOT = Path(__file__).resolve().parents[2]


def _state(pid: int) -> str:
    """Process state letter from /proc (``""`` when the process is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def test_stop_kills_children_left_after_the_leader_exited():
    """A leader that already exited must not leave its group's children running (GPU memory)."""
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; exit 0"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    child = int(proc.stdout.readline())
    proc.wait(timeout=10)
    assert proc.returncode == 0 and _state(child) not in ("", "Z")      # orphan alive, leader gone
    rs._stop(proc, grace_s=1)
    deadline = time.monotonic() + 10
    while _state(child) not in ("", "Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _state(child) in ("", "Z")


def test_stop_terminates_a_live_group():
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60"], start_new_session=True)
    rs._stop(proc, grace_s=5)
    assert proc.returncode is not None and proc.returncode < 0          # killed by a signal


def test_port_busy_only_while_someone_listens():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.listen()
        assert rs._port_busy(port)
    assert not rs._port_busy(port)


def _args(tmp_path: Path, port: int) -> argparse.Namespace:
    return argparse.Namespace(work=tmp_path, plans=tmp_path / "plans", model=tmp_path / "model", deadline_s=600,
                              mem_fraction_static=0.85, context_length=4096, max_running_requests=8, server_flag=[],
                              base_port=port)


def test_arm_not_started_on_a_busy_port(tmp_path, monkeypatch):
    """A server left on the port would answer /health for the new one: the arm is refused, nothing launched."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.listen()
        for k in [k for k in os.environ if k.startswith("DASC_")]:
            monkeypatch.delenv(k)
        monkeypatch.setenv("DASC_RECLAIM_WAIT", "host")      # e.g. the driver's GPUTEST fallback
        monkeypatch.setenv("DASC_POOL_SLOTS", "9")
        r = rs.Runner(_args(tmp_path, port))
        arm = {"arm": "dense", "kind": "dense", "flags": ["--max-mamba-cache-size", "48"], "capacity": 48}
        rs.run_arm(r, arm, [0], port)
    rec = json.loads((tmp_path / "manifest.json").read_text())["arms"]["dense"]
    assert rec["seeds_done"] == [] and rec["port"] == port
    assert rec["env"] == {"DASC_POOL_SLOTS": "9", "DASC_RECLAIM_WAIT": "host"}
    assert rec["failures"] == [f"not started: port {port} is already in use (a server left from an earlier run?)"]
    assert "startup_s" not in rec and not r.procs and not (tmp_path / "dense" / "server.log").exists()


def test_ports_are_unique_per_invocation(tmp_path):
    r = rs.Runner(_args(tmp_path, 30100))
    assert [r.next_port() for _ in range(12)] == list(range(30100, 30112))


def test_server_env_carries_the_arms_env_and_pins_the_gpus(monkeypatch):
    monkeypatch.setenv("DASC_RECLAIM_WAIT", "stream")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    arm = {"arm": "dasc-nr-w512-hostwait", "env": {"DASC_RECLAIM_WAIT": "host", "CUDA_VISIBLE_DEVICES": "9"}}
    env = rs.server_env(arm, [0, 1])
    assert env["DASC_RECLAIM_WAIT"] == "host" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["PYTHONUNBUFFERED"] == "1" and env["PATH"] == os.environ["PATH"]
    plain = rs.server_env({"arm": "dense"}, [3])      # arms JSON written before the env field existed
    assert plain["DASC_RECLAIM_WAIT"] == "stream" and plain["CUDA_VISIBLE_DEVICES"] == "3"
