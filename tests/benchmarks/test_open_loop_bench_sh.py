"""benchmarks/h200/open_loop_bench.sh's settings reach the driver as the header says: the script runs with
a stand-in PYTHON that records the ``-m benchmarks.run_open_loop`` command line (and runs the real
interpreter for everything else), a stand-in LAUNCHER and OL_TMP in a temporary folder."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "h200" / "open_loop_bench.sh"
MIN4K = "benchmarks/traces/sharegpt_qwen_n256_d1024_min4k_s0.json.gz"


def _run(tmp_path: Path, **env) -> tuple[subprocess.CompletedProcess, list[str] | None]:
    carry = tmp_path / "carry"
    (carry / ".dev" / "ol").mkdir(parents=True, exist_ok=True)
    (carry / "benchmarks").mkdir(exist_ok=True)
    if not (carry / "benchmarks" / "traces").exists():
        (carry / "benchmarks" / "traces").symlink_to(ROOT / "benchmarks" / "traces")
    with tarfile.open(carry / ".dev" / "ol" / "plans.tar.xz", mode="w:xz") as t:
        info = tarfile.TarInfo("arms.json")
        info.size = 2
        t.addfile(info, io.BytesIO(b"[]"))
    argv_out = tmp_path / "argv.json"
    py = tmp_path / "py"
    py.write_text(f"#!/bin/sh\nif [ \"$1\" = -m ]; then {sys.executable} -c 'import json, sys; "
                  f"json.dump(sys.argv[1:], open(\"{argv_out}\", \"w\"))' \"$@\"; exit 0; fi\n"
                  f"exec {sys.executable} \"$@\"\n")
    py.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k not in ("PROBE", "LIVE_WAITING", "TRACE", "CONTEXT", "ARMS")}
    full = {**base, "CARRY": str(carry), "SRC": str(ROOT), "OUT": str(tmp_path / "out"), "OL_TMP": str(tmp_path / "w"),
            "PYTHON": str(py), "LAUNCHER": "unused", **env}
    p = subprocess.run(["bash", str(SCRIPT)], cwd=carry, env=full, capture_output=True, text=True, timeout=60)
    argv = json.loads(argv_out.read_text()) if argv_out.is_file() else None
    if argv_out.is_file():
        argv_out.unlink()
    return p, argv


def _opt(argv: list[str], flag: str, n: int = 1):
    i = argv.index(flag)
    return argv[i + 1] if n == 1 else argv[i + 1: i + 1 + n]


def test_defaults(tmp_path):
    p, argv = _run(tmp_path)
    assert p.returncode == 0, p.stderr
    assert argv[:2] == ["-m", "benchmarks.run_open_loop"]
    assert _opt(argv, "--trace") == str(tmp_path / "carry" / MIN4K)
    assert (_opt(argv, "--context-length"), _opt(argv, "--max-total-tokens")) == ("16640", "1000000")
    assert _opt(argv, "--live-per-running") == "8" and "--live-waiting" not in argv
    assert "--ttft-probe-lengths" not in argv and "--no-ttft-probe" not in argv      # the driver's default lengths
    assert _opt(argv, "--only", 5) == ["dense", "dasc-nr-w16", "int8", "dasc-nr-w16-int8", "dasc-nr-w64"]
    assert argv[-1] == "--repeat-first" and _opt(argv, "--work") == str(tmp_path / "w" / "ol")
    assert json.loads((tmp_path / "w" / "kimi16" / "config.json").read_text())["num_experts"] == 16


def test_live_waiting_probe_trace_and_context(tmp_path):
    p, argv = _run(tmp_path, LIVE_WAITING="64", PROBE="1024 8192", CONTEXT="8192", MAX_TOTAL_TOKENS="500000",
                   TRACE="benchmarks/traces/sharegpt_qwen_n128_d512_s0.json.gz", ARMS="dense dasc-wr-w16")
    assert p.returncode == 0, p.stderr
    assert _opt(argv, "--live-waiting") == "64" and "--live-per-running" not in argv
    assert _opt(argv, "--ttft-probe-lengths", 2) == ["1024", "8192"] and "--no-ttft-probe" not in argv
    assert (_opt(argv, "--context-length"), _opt(argv, "--max-total-tokens")) == ("8192", "500000")
    assert _opt(argv, "--trace").endswith("carry/benchmarks/traces/sharegpt_qwen_n128_d512_s0.json.gz")
    assert _opt(argv, "--only", 2) == ["dense", "dasc-wr-w16"]


@pytest.mark.parametrize("probe", ["", "off"])
def test_probe_off(tmp_path, probe):
    p, argv = _run(tmp_path, PROBE=probe)
    assert p.returncode == 0 and "--no-ttft-probe" in argv and "--ttft-probe-lengths" not in argv


def test_missing_trace_is_refused(tmp_path):
    p, argv = _run(tmp_path, TRACE="/nowhere/t.json.gz")
    assert p.returncode == 2 and argv is None
    assert p.stderr.strip().splitlines()[-1] == "error: TRACE /nowhere/t.json.gz: no such file"
