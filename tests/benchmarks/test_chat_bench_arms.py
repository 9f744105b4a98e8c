"""benchmarks/h200/chat_bench.sh's arms and servers: UP_ARMS (the servers a call brings up) must hold every arm the
call measures (ARMS), and a call that would measure an arm with no server is refused before anything starts; DOWN=1
stops the servers only after a call that ran, and run settings the trace cannot serve are refused before any server
starts (a CPU rehearsal with tests/support/fake_sglang_server.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]


#: chat_bench.sh's settings (its header): none leaks in from the caller's shell
SETTINGS = ("ARMS UP_ARMS BASELINE SEEDS PER_SEED CLIENTS MRR CLIP PAD SHARED REPLAY RATE THINK TRACE CONTEXT DEADLINE "
            "FIRST_RUN_S EXPECT_S LAUNCHER PYTHON CHAT_WORK BASE_PORT OUT NUM_EXPERTS MAX_TOTAL_TOKENS DOWN "
            "SERVER_FLAGS").split()


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    out = tmp_path / "out"
    full = {**{k: v for k, v in os.environ.items() if k not in SETTINGS}, "OUT": str(out), **env}
    return subprocess.run(["bash", "benchmarks/h200/chat_bench.sh"], cwd=REPO, env=full, capture_output=True,
                          text=True, timeout=120)


def test_up_arms_without_a_measured_arm_is_refused_in_one_line(tmp_path):
    p = run(tmp_path, ARMS="dense dasc-nr-w16", UP_ARMS="dense dasc-wr-w16")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert lines == ["error: UP_ARMS 'dense dasc-wr-w16' lacks 'dasc-nr-w16' of ARMS: expected every measured arm "
                     "among the servers to start"]
    assert not (tmp_path / "out").exists()      # refused before $OUT is made: no run.log, nothing started
    assert not p.stdout


def test_an_arm_name_that_only_contains_another_is_not_taken_for_it(tmp_path):
    # "dasc-nr-w16" is a prefix of "dasc-nr-w16-int8": a substring match would let the call through
    p = run(tmp_path, ARMS="dasc-nr-w16", UP_ARMS="dense dasc-nr-w16-int8")
    assert p.returncode == 2 and "lacks 'dasc-nr-w16' of ARMS" in p.stderr


def test_up_arms_split_by_tabs_and_newlines_like_arms(tmp_path):
    # words, whatever the white space: the tab-separated UP_ARMS holds 'dense', and only the arm it lacks is named
    p = run(tmp_path, ARMS="dense bogus", UP_ARMS="dense\tdasc-nr-w16\n")
    assert p.returncode == 2
    assert p.stderr.strip() == ("error: UP_ARMS 'dense dasc-nr-w16' lacks 'bogus' of ARMS: expected every measured "
                                "arm among the servers to start")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"   # a zombie has stopped


@pytest.mark.slow
def test_bad_run_settings_are_refused_before_servers_start_and_down_needs_a_run(tmp_path):
    """A seed the trace lacks is refused (exit 2) before any server starts, and later with servers up it leaves
    them up (session 44 lost three warm servers this way; the refusal used to come after a fresh machine's ~200 s
    start). DOWN=1 keeps them after a call with no time for its seed too (exit 0: a start-only call is no error);
    the corrected call runs and stops them."""
    work = tmp_path / "chat"
    (work / "plans").mkdir(parents=True)
    (work / "plans/arms.json").write_text(json.dumps([{"arm": "dense", "kind": "dense", "capacity": 4,
                                                        "flags": ["--max-running-requests", "2"]},
                                                       {"arm": "noplan", "kind": "dasc", "capacity": 4,
                                                        "flags": ["--dasc-plan", "{plans}/absent"]}]))
    env = dict(CHAT_WORK=str(work), BASE_PORT=str(free_port()), ARMS="dense", MRR="2", CLIENTS="2", PER_SEED="2",
               TRACE="benchmarks/traces/sharegpt_qwen_n8_d64_s0.json.gz", CONTEXT="4096", DEADLINE="90",
               FIRST_RUN_S="1", LAUNCHER=f"{sys.executable} {REPO / 'tests/support/fake_sglang_server.py'}",
               PYTHON=sys.executable, DOWN="1")
    log = tmp_path / "out/run.log"
    try:
        first = run(tmp_path, SEEDS="9", **env)          # 8 conversations hold seeds 0..3 of 2
        assert first.returncode == 2, log.read_text()
        assert "holds 4 disjoint seeds of 2 (0..3)" in log.read_text()
        assert "refused (above) before any server starts" in log.read_text() and not (work / "servers.json").exists()
        no_time = run(tmp_path, SEEDS="0", **{**env, "FIRST_RUN_S": "100000"})
        assert no_time.returncode == 0 and "DOWN=1 not applied: no run began" in log.read_text()
        pid = json.loads((work / "servers.json").read_text())["dense"]["pid"]
        assert _alive(pid)
        assert run(tmp_path, SEEDS="9", **env).returncode == 2
        assert _alive(pid)                                # resident servers are left as they were
        assert run(tmp_path, SEEDS="0", **{**env, "ARMS": "dense int9"}).returncode == 2     # an arm arms.json lacks
        tail = log.read_text().splitlines()[-2:]
        assert tail[0] == f"error: --arms int9: not in {work}/plans/arms.json (dense, noplan)" and _alive(pid)
        assert "run settings refused (above) before any server starts; servers already up are left up (the flags " \
            "named are these settings: --work CHAT_WORK, --trace TRACE, --arms ARMS, " in tail[1]
        assert run(tmp_path, SEEDS="0", **{**env, "ARMS": "dense noplan"}).returncode == 2   # its plan is missing
        assert "run_chat up refused its settings" in log.read_text() and _alive(pid)
        ran = run(tmp_path, SEEDS="0", **env)
        assert ran.returncode == 0, log.read_text()
        assert "dense seed 0 (arm): rc 0" in log.read_text() and "dense: stopped" in log.read_text()
        assert not _alive(pid)
        names = subprocess.run(["tar", "-tzf", str(tmp_path / "out/chat.tar.gz")], capture_output=True,
                               text=True).stdout
        assert "chat/runs/dense__s0__" in names and "plans" not in names     # the work folder, without its plans
    finally:
        subprocess.run([sys.executable, "-m", "benchmarks.run_chat", "down", "--work", str(work)], cwd=REPO,
                       capture_output=True, timeout=60)


def test_a_missing_plans_tarball_is_named_with_the_script_that_builds_it(tmp_path):
    """A device call without the carried plans (``.dev/ol/plans.tar.xz`` in the folder the script runs in, and no
    unpacked arms.json in the work folder) stops at once, exit 2, naming the file and prepare_serving.sh, where
    it used to fail inside ``tar`` (session 46). Run from a folder with no ``.dev/``: the repository's own may
    hold a tarball."""
    here = tmp_path / "checkout"
    here.mkdir()
    work = tmp_path / "chat"
    env = {**{k: v for k, v in os.environ.items() if k not in SETTINGS}, "OUT": str(tmp_path / "out"),
           "CHAT_WORK": str(work), "LAUNCHER": f"{sys.executable} {REPO / 'tests/support/fake_sglang_server.py'}"}
    p = subprocess.run(["bash", str(REPO / "benchmarks/h200/chat_bench.sh")], cwd=here, env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    errors = [line for line in p.stdout.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {here}/.dev/ol/plans.tar.xz: no such file (the plans and arms.json; build it with "
                      "bash benchmarks/h200/prepare_serving.sh)"]
    assert not (work / "plans/arms.json").exists() and not p.stderr     # nothing unpacked, no tar error
