"""Run serving-benchmark arms on the GPU machine, several at once (one SGLang server per GPU group).

For each arm (from ``python -m benchmarks.serving_arms --out arms.json``) a worker that owns
``--gpus-per-arm`` GPUs starts ``sglang.launch_server`` with the common flags plus the arm's
matched-memory flags, waits for ``/health``, replays a short untimed warm-up (first Triton
compiles and autotuning happen there, not inside a timed run; the client flushes the cache before
every timed run), then replays the trace once per seed with ``benchmarks/serve_bench.py`` and stops
the server. Workers take arms from one queue, in the given order, so with 4 GPUs and 7 arms the
first four run side by side, then the rest.

Everything stays under a wall-clock deadline (``--deadline-s`` from the start): an arm is not
started, and a further seed is not begun, unless the time left covers it (a seed's estimate is
the slowest seed so far plus a margin). What ran is in ``WORK/manifest.json`` (per arm: flags,
launch settings, start-up time, seeds done, failures, GPU memory in use, the server's last dasc
counter line), each run's ``WORK/ARM/sSEED.json``/``.md`` (serve_bench results), and the server
logs ``WORK/ARM/server.log``. Every arm gets its own port (``--base-port`` + n); an arm whose port
is already taken is not started. A server that exits is noticed after start-up, the warm-up and
each seed, and recorded. Servers run in their own sessions, so SIGTERM / SIGINT / SIGHUP to this
script stop every live one (whole process group) before it exits.

Example (on the device, SGLang importable from /tmp/site)::

    python3 -m benchmarks.run_serving --arms-json /tmp/arms.json --plans /tmp/plans \\
        --model /tmp/kimi --gpus 0 1 2 3 --trace benchmarks/traces/sharegpt_qwen_n128_d512_s0.json.gz \\
        --num-conversations 64 --decode-clip 128 --concurrency 64 --max-running-requests 8 \\
        --seeds 0 1 --deadline-s 540 --work /tmp/serving
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The replay client runs isolated from this machine's site (stdlib only; no PYTHONPATH, no site
# packages): the repository root is its only import root, for ``benchmarks`` and ``dasc_compile.errors``.
SERVE_BENCH = [sys.executable, "-E", "-s", "-S", "-m", "benchmarks.serve_bench"]
SERVE_BENCH_CWD = REPO

COMMON_FLAGS = ["--attention-backend", "triton", "--sampling-backend", "pytorch", "--load-format", "dummy",
                "--skip-tokenizer-init", "--disable-prefill-cuda-graph", "--log-level", "info"]


def _now() -> float:
    return time.monotonic()


class Runner:
    """Shared state of one invocation: arguments, the wall-clock deadline (``time.monotonic`` s) and
    the manifest written to ``WORK/manifest.json`` (atomically: temporary file, then rename)."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.t0 = _now()
        self.deadline = self.t0 + a.deadline_s
        self.lock = threading.RLock()     # re-entered by the signal handler (main thread)
        self.manifest: dict = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
                               "arms": {}, "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
        self.max_seed_s = 0.0
        self.procs: set[subprocess.Popen] = set()   # live servers, stopped by a signal handler too
        self._ports = 0

    def next_port(self) -> int:
        """A port not handed to any earlier arm of this invocation (``--base-port`` + n)."""
        with self.lock:
            port = self.a.base_port + self._ports
            self._ports += 1
        return port

    def left(self) -> float:
        return self.deadline - _now()

    def log(self, msg: str) -> None:
        print(f"[{_now() - self.t0:6.0f}s] {msg}", flush=True)

    def save(self) -> None:
        # Workers update their arm's record without the lock; a dump that meets such an update
        # ("dictionary changed size during iteration") is simply retried. Write and rename stay
        # under the lock: the temporary file is shared by all workers.
        with self.lock:
            for attempt in range(5):
                try:
                    text = json.dumps(self.manifest, indent=1, default=str)
                    break
                except RuntimeError:
                    if attempt == 4:
                        raise
            tmp = self.a.work / "manifest.json.tmp"
            tmp.write_text(text)
            os.replace(tmp, self.a.work / "manifest.json")


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except Exception:
        return False


def _gpu_mem_mib(gpus: list[int]) -> list[int] | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except Exception:
        return None
    used = {int(i): int(m) for i, m in (ln.split(",") for ln in out.strip().splitlines() if "," in ln)}
    return [used.get(g) for g in gpus]


def _tail(path: Path, pattern: str | None = None, n: int = 1, limit: int = 600) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    if pattern:
        lines = [ln for ln in lines if pattern in ln]
    return [ln[:limit] for ln in lines[-n:]]


def _port_busy(port: int) -> bool:
    """True when something already listens on ``127.0.0.1:port`` (a stale server would answer
    ``/health`` in place of the one being started)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # TIME_WAIT is not "busy"
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _stop(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """Stop a server started with ``start_new_session=True``: SIGTERM its process group, wait up
    to ``grace_s`` for the leader, then SIGKILL the whole group, also when the leader had already
    exited (SGLang's scheduler / detokenizer children can outlive it and hold GPU memory the next
    arm on these GPUs needs), and wait up to 10 s for the group to empty."""
    pgid = proc.pid
    if proc.poll() is None:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except OSError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:             # group already empty
        return
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    end = _now() + 10
    while _now() < end:
        try:
            os.killpg(pgid, 0)
        except OSError:
            return
        time.sleep(0.2)


def server_env(arm: dict, gpus: list[int]) -> dict[str, str]:
    """Environment of an arm's server: this process's, the arm's ``env`` (``serving_arms``: e.g.
    ``DASC_RECLAIM_WAIT=host`` for a ``-hostwait`` arm), then ``CUDA_VISIBLE_DEVICES`` = ``gpus``
    and unbuffered Python output (these two always win)."""
    return {**os.environ, **arm.get("env", {}), "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)),
            "PYTHONUNBUFFERED": "1"}


def run_arm(r: Runner, arm: dict, gpus: list[int], port: int) -> None:
    """Start one arm's server on ``gpus`` (TP = len(gpus)), warm it up, replay every seed, stop it.

    Args:
        r: the shared runner (arguments, deadline, manifest).
        arm: one entry of ``serving_arms.py --out`` (``arm``, ``kind``, ``flags`` with ``{plans}``,
            ``capacity`` in slots).
        gpus: CUDA device indices for ``CUDA_VISIBLE_DEVICES``. port: the server's HTTP port.
    Never raises: a busy port, start-up deaths, a server that exits during the warm-up or a seed
    (checked after each; later seeds are then not run), replay failures and deadline cuts are
    recorded in the arm's manifest entry (``failures``); the server's process group is always
    stopped, children included.
    """
    a = r.a
    name = arm["arm"]
    d = a.work / name
    d.mkdir(parents=True, exist_ok=True)
    rec: dict = {"launch": arm, "gpus": gpus, "port": port, "seeds_done": [], "failures": []}
    with r.lock:
        r.manifest["arms"][name] = rec
    flags = [f.replace("{plans}", str(a.plans)) for f in arm["flags"]]
    if arm["kind"] == "dasc":
        flags.append("--dasc-dummy-decay-ok")
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(a.model), "--port", str(port),
           *COMMON_FLAGS, "--mem-fraction-static", str(a.mem_fraction_static),
           "--context-length", str(a.context_length), "--max-running-requests", str(a.max_running_requests),
           "--cuda-graph-max-bs", str(a.max_running_requests), "--tp-size", str(len(gpus)),
           *a.server_flag, *flags]
    rec["command"] = " ".join(cmd)
    env = server_env(arm, gpus)
    # what the runtime will read, whether it came from the arm (-hostwait) or the driver's own env
    rec["env"] = {k: env[k] for k in sorted(env) if k.startswith("DASC_")}
    log = d / "server.log"
    t_start = _now()
    if _port_busy(port):
        rec["failures"].append(f"not started: port {port} is already in use (a server left from an earlier run?)")
        r.log(f"{name}: port {port} busy, arm not started")
        r.save()
        return
    r.log(f"{name}: start on GPU {gpus}: {' '.join(flags)}"
          + "".join(f" ({k}={v})" for k, v in rec["env"].items()))
    proc = None

    def died(stage: str) -> bool:
        """Record a server that exited (``stage``: where it was noticed); True if it did."""
        if proc.poll() is None:
            return False
        rec["failures"].append(f"server exited ({proc.returncode}) {stage}")
        rec["log_tail"] = _tail(log, n=40)
        r.log(f"{name}: server died {stage}: " + " | ".join(_tail(log, n=6)))
        return True

    try:
        with open(log, "w") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        with r.lock:
            r.procs.add(proc)
        while not _healthy(port):
            if died("during start-up"):
                return
            if r.left() < 30:
                rec["failures"].append("deadline reached during start-up")
                return
            time.sleep(2)
        if died("during start-up, yet the port answered /health (another server holds it)"):
            return
        rec["startup_s"] = round(_now() - t_start, 1)
        rec["gpu_mem_mib_after_start"] = _gpu_mem_mib(gpus)
        rec["startup_lines"] = (_tail(log, "Mamba Cache is allocated", 2) + _tail(log, "dasc", 6)
                                + _tail(log, "int8", 2) + _tail(log, "max_total_num_tokens", 1))
        r.log(f"{name}: up in {rec['startup_s']} s")
        base = [*SERVE_BENCH, "--trace", str(Path(a.trace).resolve()),
                "--url", f"http://127.0.0.1:{port}", "--arm", name,
                "--checkpoint-capacity", str(arm["capacity"]), "--concurrency", str(a.concurrency),
                "--max-running-requests", str(a.max_running_requests), "--vocab-size", str(a.vocab_size)]
        if a.warmup_conversations:
            t = _now()
            w = subprocess.run(base + ["--num-conversations", str(a.warmup_conversations), "--decode-clip", "16",
                                       "--out", str((d / "warmup").resolve())], cwd=SERVE_BENCH_CWD,
                               capture_output=True, text=True, timeout=max(30, r.left() - 20))
            rec["warmup_s"] = round(_now() - t, 1)
            rec["warmup_rc"] = w.returncode
            r.log(f"{name}: warm-up rc={w.returncode} in {rec['warmup_s']} s")
            if died("during the warm-up"):
                return
        for seed in a.seeds:
            est = max(r.max_seed_s * 1.15 + 15, a.min_seed_s)
            if r.left() < est:
                rec["failures"].append(f"seed {seed} not run: {r.left():.0f} s left < estimate {est:.0f} s")
                r.log(f"{name}: skip seed {seed} ({r.left():.0f} s left)")
                break
            t = _now()
            cmd_b = base + ["--num-conversations", str(a.num_conversations), "--seed", str(seed),
                            "--out", str((d / f"s{seed}").resolve())]
            if a.decode_clip:
                cmd_b += ["--decode-clip", str(a.decode_clip)]
            try:
                b = subprocess.run(cmd_b, cwd=SERVE_BENCH_CWD, capture_output=True, text=True,
                                   timeout=max(10, r.left() - 10))
            except subprocess.TimeoutExpired:
                rec["failures"].append(f"seed {seed}: replay cut by the deadline")
                r.log(f"{name}: seed {seed} cut by the deadline")
                died(f"during seed {seed}")
                break
            dt = _now() - t
            with r.lock:
                r.max_seed_s = max(r.max_seed_s, dt)
            (d / f"s{seed}.client.log").write_text(b.stdout[-4000:] + "\n--- stderr\n" + b.stderr[-4000:])
            if b.returncode == 0:
                rec["seeds_done"].append(seed)
            else:
                rec["failures"].append(f"seed {seed}: serve_bench rc={b.returncode}: {b.stderr[-300:]}")
            rec.setdefault("seed_s", {})[str(seed)] = round(dt, 1)
            rec.setdefault("dasc_counters", {})[str(seed)] = _tail(log, "dasc", 1)
            r.log(f"{name}: seed {seed} rc={b.returncode} in {dt:.0f} s")
            r.save()
            if died(f"during seed {seed} (its requests failed)" if b.returncode else f"after seed {seed}"):
                break
    except Exception as e:  # record and go on with the next arm
        rec["failures"].append(f"{type(e).__name__}: {e}")
    finally:
        if proc is not None:
            _stop(proc)
            with r.lock:
                r.procs.discard(proc)
        rec["log_last"] = _tail(log, n=3)
        rec["dasc_last"] = _tail(log, "dasc", 3)
        r.save()


def main(argv=None) -> int:
    """CLI (see module docstring). Returns 0 when the queue is done (failed arms are in the
    manifest), 2 for bad arguments (an unknown ``--only`` arm, GPUs that do not split into groups)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms-json", type=Path, required=True)
    ap.add_argument("--only", nargs="*", default=None, help="run these arm names only, in this order")
    ap.add_argument("--plans", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True, help="model directory (config.json; dummy weights)")
    ap.add_argument("--gpus", type=int, nargs="+", default=[0])
    ap.add_argument("--gpus-per-arm", type=int, default=1, help="TP degree of every server")
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--num-conversations", type=int, required=True)
    ap.add_argument("--decode-clip", type=int, default=None)
    ap.add_argument("--concurrency", type=int, required=True)
    ap.add_argument("--max-running-requests", type=int, required=True)
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--warmup-conversations", type=int, default=8)
    ap.add_argument("--mem-fraction-static", type=float, default=0.85)
    ap.add_argument("--context-length", type=int, default=17408)
    ap.add_argument("--server-flag", action="append", default=[], help="extra launch_server flag (repeatable)")
    ap.add_argument("--deadline-s", type=float, default=540)
    ap.add_argument("--min-arm-s", type=float, default=200, help="do not start an arm with less time left")
    ap.add_argument("--min-seed-s", type=float, default=60, help="smallest seed estimate")
    ap.add_argument("--base-port", type=int, default=30100)
    ap.add_argument("--work", type=Path, required=True)
    a = ap.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    a.server_flag = [x for f in a.server_flag for x in f.split()]
    arms = json.loads(a.arms_json.read_text())
    if a.only:
        by = {x["arm"]: x for x in arms}
        missing = [n for n in a.only if n not in by]
        if missing:
            print(f"error: --only: no arm {missing} in {a.arms_json}", file=sys.stderr)
            return 2
        arms = [by[n] for n in a.only]
    if len(a.gpus) % a.gpus_per_arm:
        print("error: --gpus must split into groups of --gpus-per-arm", file=sys.stderr)
        return 2
    groups = [a.gpus[i:i + a.gpus_per_arm] for i in range(0, len(a.gpus), a.gpus_per_arm)]
    r = Runner(a)
    q: "queue.Queue[dict]" = queue.Queue()
    for x in arms:
        q.put(x)

    def worker(gpus: list[int]) -> None:
        while True:
            try:
                arm = q.get_nowait()
            except queue.Empty:
                return
            if r.left() < a.min_arm_s:
                with r.lock:
                    r.manifest["arms"][arm["arm"]] = {"launch": arm, "failures": [
                        f"not started: {r.left():.0f} s left < {a.min_arm_s:.0f} s"], "seeds_done": []}
                r.log(f"{arm['arm']}: not started ({r.left():.0f} s left)")
                continue
            run_arm(r, arm, gpus, r.next_port())

    def on_signal(signum, frame) -> None:
        # Servers run in their own sessions: a signal to this process group does not reach them.
        with r.lock:
            live = list(r.procs)
            r.manifest["interrupted"] = f"signal {signum} after {_now() - r.t0:.0f} s"
        r.log(f"signal {signum}: stopping {len(live)} server(s)")
        for p in live:
            _stop(p, grace_s=5)
        r.save()
        raise SystemExit(128 + signum)

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        threads = [threading.Thread(target=worker, args=(g,), daemon=True) for g in groups]
        for i, t in enumerate(threads):
            t.start()
            time.sleep(3 if i < len(threads) - 1 else 0)   # stagger the first imports a little
        for t in threads:
            t.join()
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
    r.manifest["wall_s"] = round(_now() - r.t0, 1)
    r.save()
    done = {n: v.get("seeds_done") for n, v in r.manifest["arms"].items()}
    r.log(f"done: {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
