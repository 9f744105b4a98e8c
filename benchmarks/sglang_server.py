"""A resident SGLang server on this machine, as ``benchmarks/run_chat.py`` starts, checks and stops it.

Servers run in their own sessions (``start_new_session=True``), so the server's pid is also its
process group: :func:`alive` and :func:`kill` act on the whole group (SGLang's scheduler and
detokenizer children included). Every server listens on ``127.0.0.1``.
"""

from __future__ import annotations

import os
import signal
import socket
import time
import urllib.request
from pathlib import Path
from typing import Sequence

#: flags of every arm's server: dummy weights, and the only backends the carried SGLang site has
#: (benchmarks/h200/README.md)
COMMON_FLAGS = ["--attention-backend", "triton", "--sampling-backend", "pytorch", "--load-format", "dummy",
                "--skip-tokenizer-init", "--disable-prefill-cuda-graph", "--log-level", "info"]


def server_env(arm: dict, gpus: Sequence[int]) -> dict[str, str]:
    """Environment of an arm's server: this process's without any ``DASC_*`` variable, the arm's ``env``
    (``serving_arms``: e.g. ``DASC_RECLAIM_WAIT=host`` for a ``-hostwait`` arm,
    ``DASC_EVICT_SHADOWED_FIRST=1`` for a ``-shadowfirst`` one, ``=0`` for other dasc arms), then
    ``CUDA_VISIBLE_DEVICES`` = ``gpus`` and unbuffered Python output (these two always win).

    The launching shell's ``DASC_*`` settings never reach a server: an A/B knob exported there would
    otherwise turn on in the control arm too (and ``DASC_PLAN`` would put a plan into Dense), so the
    comparison would silently compare the knob with itself.

    A dasc arm whose ``env`` lacks ``DASC_EVICT_SHADOWED_FIRST`` (an arms JSON written before the runtime made
    the rule its default, session 53, when a plain arm meant App. B.2's LRU) gets ``0``: a newer wheel would
    otherwise run the rule under the plain arm's name."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("DASC_")}
    env = dict(arm.get("env", {}))
    if (arm.get("kind") == "dasc" or str(arm.get("arm", "")).startswith("dasc-")) \
            and "DASC_EVICT_SHADOWED_FIRST" not in env:
        env["DASC_EVICT_SHADOWED_FIRST"] = "0"
    return {**inherited, **env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)), "PYTHONUNBUFFERED": "1"}


def healthy(port: int) -> bool:
    """True when the server answers ``/health`` with 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except Exception:
        return False


def port_busy(port: int) -> bool:
    """True when something already listens on ``port`` (a stale server would answer ``/health`` in
    place of the one being started)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # TIME_WAIT is not "busy"
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _post(port: int, path: str, timeout_s: float = 30.0) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status
    except Exception:
        return 0


def flush(port: int, tries: int = 20) -> bool:
    """``/flush_cache`` until the server accepts it (it refuses while requests run)."""
    for _ in range(tries):
        if _post(port, "/flush_cache") == 200:
            return True
        time.sleep(0.5)
    return False


def alive(pid: int) -> bool:
    """True while any process of the server's group ``pid`` is left."""
    try:
        os.killpg(pid, 0)
        return True
    except OSError:
        return False


def kill(pid: int) -> None:
    """SIGTERM the server's group, then SIGKILL what is left 3 s later."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except OSError:
            return
        time.sleep(3)


def log_tail(path: Path, pattern: str | None = None, n: int = 1, limit: int = 600) -> list[str]:
    """The last ``n`` lines of a server log (those containing ``pattern``), each cut at ``limit``
    characters; [] when the log cannot be read."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    if pattern:
        lines = [ln for ln in lines if pattern in ln]
    return [ln[:limit] for ln in lines[-n:]]


def server_account(s: dict, log: Path, offset: int, wait_s: float = 5.0):
    """Flush ``s``'s cache after a run and return the checkpoint account that flush logged
    (``dasc account: {...}``, runtime/account.py: checkpoints stored / reused / evicted by origin and
    the tier counters' changes since the flush before the run), or None: not a dasc arm, the flush was
    refused, or no account line came within ``wait_s``. ``offset``: the log's size before the run, bytes
    (only what was logged after it is read)."""
    from dasc_runtime.account import ACCOUNT_TAG, parse_account_line

    if s.get("launch", {}).get("kind") != "dasc" or not flush(s["port"]):
        return None
    end = time.monotonic() + wait_s
    while True:
        try:
            with open(log, "rb") as fh:
                fh.seek(offset)
                lines = [ln for ln in fh.read().decode(errors="replace").splitlines() if ACCOUNT_TAG in ln]
        except OSError:
            lines = []
        if lines:
            return parse_account_line(lines[-1])
        if time.monotonic() > end:
            return None
        time.sleep(0.2)
