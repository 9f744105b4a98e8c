"""Run the open-loop serving arms on ONE GPU: every arm's SGLang server resident at once, measured in turn.

One device call has to hold every arm of a comparison, so that seeds pair within the call. A
server start costs far more than a measurement (first Triton compiles, CUDA graphs), so all arm
servers start together on the same GPU, staggered by ``--stagger-s`` (each takes a small, fixed
share: ``--max-total-tokens`` caps its KV pool, the arm's flags fix its state pools, and
``--sleep-on-idle`` keeps an idle server off the CPU). Once every server is up (or dead, or the
start-up deadline passed), nothing is started any more, and:

Steps 1-2 live in ``benchmarks/open_loop_prep.py``.

1. every server replays a short untimed warm-up at once (first compiles of prefill shapes), then
   one never-cached request at each probe length (the long-prompt paths);
2. the first healthy arm (Dense) calibrates the load: ``--calibration-requests`` first turns of the
   measured trace one at a time, replies clipped as in the run, the first two dropped (first-use
   costs); ``S`` = their median end-to-end latency (s) times ``--batch-margin`` (decode slows a
   little with the batch). A burst of R requests at once, the first version of this step, measured
   S = 3.36 s on the H200 where the run then saw 0.55 s; a mean over short warm-trace prompts, the
   second, took S = 1.16 s from one compile-bound sample and overloaded the server. Then, on the
   same server, a TTFT probe (``benchmarks/ttft_probe.py``): ``--ttft-probe-reps`` single requests
   of never-cached prompts at each of ``--ttft-probe-lengths`` tokens (clipped to the context
   length - 64), ``max_new_tokens`` 1, one in flight, cache flushed after; per length the mean
   TTFT and the fit ``ttft = a + b * tokens`` (a in ms, b in ms per 1,000 tokens), so the run
   records how much of TTFT a hit could remove. A failed probe is recorded, never fatal;
   ``--no-ttft-probe`` skips it. Its time is spent before the next step divides what is left;
3. the offered load follows for all arms (one schedule, paired; ``benchmarks/open_loop_load.py``):
   ``rate = rho * R / (T * S)``, think time ``Z = live_per_running * T * S / (T - 1)`` (so
   conversations waiting between turns are about ``live_per_running`` times the running requests,
   ``rho * R``, by Little's law: ``rate * (T - 1) * Z``; exponential by default); ``--live-waiting
   N`` sets that number directly: ``live_per_running = N / (rho * R)`` (the load record keeps
   both); ``initial_live = live_per_running * rho * R`` conversations at t = 0, a warm-up of
   ``1.5 Z + 2 S`` (uniform think times: ``Z * (1 + spread) + 2 S``) and the longest measured window
   (``<= --max-window-s``) that fits the arms left in the deadline, dropping the last arms (lowest
   priority) while the window would be shorter than ``--min-window-s``;
4. the arms run one after another (``benchmarks/open_loop.py`` in a separate process, cache
   flushed first); each server is stopped after its arm. An arm whose server failed to start
   together with the others is started alone afterwards if the time left covers it.

``--load-json MANIFEST`` replays a previous run's schedule instead (its ``load`` record, used as it is;
steps 2-3 skipped; the warm-up still runs: without it the 2026-12-01 replay's first arm, SGLang's INT8
pool, paid first-use compiles and never cleared the backlog), so a second device call measures more arms against the same windows and seeds.

Outputs ``WORK/manifest.json`` (per arm: command, start-up time and log lines, GPU memory, the
client's summary, failures; the calibration, the TTFT probe and the schedule parameters),
``WORK/ARM/result.json`` (``open_loop.py``'s result) and ``WORK/ARM/server.log``.

Example (on the device, SGLang importable from /tmp/site)::

    python3 -m benchmarks.run_open_loop --arms-json /tmp/arms.json --plans /tmp/plans --model /tmp/kimi16 \\
        --trace benchmarks/traces/sharegpt_qwen_n256_d1024_min4k_s0.json.gz \\
        --warm-trace benchmarks/traces/sharegpt_qwen_n128_d512_s0.json.gz --max-running-requests 8 \\
        --context-length 16640 --live-waiting 64 --deadline-s 560 --work /tmp/open-loop
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks import run_serving as rs
from benchmarks import open_loop_load as ol_load
from benchmarks import ttft_probe as tp
from benchmarks.open_loop_prep import calibrate, probe, warm_up
from benchmarks.build_trace import load_trace

REPO = Path(__file__).resolve().parent.parent
OPEN_LOOP = [sys.executable, "-E", "-s", "-S", "-m", "benchmarks.open_loop"]


class Driver:
    """Arguments, clock (``time.monotonic`` s from the start), live servers and the manifest."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.t0 = time.monotonic()
        self.lock = threading.RLock()
        self.manifest: dict = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
                               "arms": {}, "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
        self.procs: dict[str, subprocess.Popen] = {}

    def now(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.a.deadline_s - self.now()

    def log(self, msg: str) -> None:
        print(f"[{self.now():6.0f}s] {msg}", flush=True)

    def save(self) -> None:
        with self.lock:
            tmp = self.a.work / "manifest.json.tmp"
            tmp.write_text(json.dumps(self.manifest, indent=1, default=str))
            tmp.replace(self.a.work / "manifest.json")


def server_command(a: argparse.Namespace, arm: dict, port: int) -> list[str]:
    """``launch_server`` command of one arm: the common flags of the serving benchmark, one GPU,
    a capped KV pool, no busy idle loop, and the arm's own flags (``{plans}`` filled in)."""
    flags = [f.replace("{plans}", str(a.plans)) for f in arm["flags"]]
    if arm["kind"] == "dasc":
        flags.append("--dasc-dummy-decay-ok")
    return [*shlex.split(a.launcher), "--model-path", str(a.model), "--port", str(port), "--nccl-port",
            str(port + 1000), *rs.COMMON_FLAGS,
            "--mem-fraction-static", str(a.mem_fraction_static), "--max-total-tokens", str(a.max_total_tokens),
            "--context-length", str(a.context_length), "--cuda-graph-max-bs", str(a.max_running_requests),
            "--tp-size", "1", "--sleep-on-idle", *a.server_flag, *flags]


def start(d: Driver, arm: dict, port: int) -> None:
    """Launch one arm's server in its own session (``rs._stop`` stops the whole group)."""
    name = arm["arm"]
    (d.a.work / name).mkdir(parents=True, exist_ok=True)
    rec = d.manifest["arms"].setdefault(name, {"launch": arm, "failures": []})
    rec.update(port=port, command=" ".join(server_command(d.a, arm, port)), t_launch=round(d.now(), 1))
    if rs._port_busy(port):
        rec["failures"].append(f"not started: port {port} is already in use")
        return
    env = rs.server_env(arm, [d.a.gpu])
    rec["env"] = {k: env[k] for k in sorted(env) if k.startswith("DASC_")}
    with open(d.a.work / name / "server.log", "w") as fh:
        d.procs[name] = subprocess.Popen(server_command(d.a, arm, port), stdout=fh, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True, cwd=d.a.work)
    d.log(f"{name}: launched on port {port}")


def wait_up(d: Driver, names: list[str], deadline: float) -> list[str]:
    """Wait until each named server answers /health, exits, or ``deadline`` (driver seconds) passes;
    dead or late ones are stopped and recorded. Returns the healthy names, in the given order."""
    pending, up = [n for n in names if n in d.procs], []
    while pending and d.now() < deadline:
        for n in list(pending):
            rec, proc = d.manifest["arms"][n], d.procs[n]
            if proc.poll() is not None:
                rec["failures"].append(f"server exited ({proc.returncode}) during start-up")
                rec["log_tail"] = rs._tail(d.a.work / n / "server.log", n=40)
                d.log(f"{n}: died during start-up: " + " | ".join(rs._tail(d.a.work / n / "server.log", n=4)))
                pending.remove(n)
            elif rs._healthy(rec["port"]):
                rec["startup_s"] = round(d.now() - rec["t_launch"], 1)
                log = d.a.work / n / "server.log"
                rec["startup_lines"] = (rs._tail(log, "Mamba Cache is allocated", 2) + rs._tail(log, "dasc:", 4)
                                        + rs._tail(log, "int8 mamba checkpoint pool", 2)
                                        + rs._tail(log, "max_total_num_tokens", 1))
                d.log(f"{n}: up in {rec['startup_s']} s")
                pending.remove(n)
                up.append(n)
        time.sleep(1)
    for n in pending:
        d.manifest["arms"][n]["failures"].append(f"not up by {deadline:.0f} s: stopped")
        stop(d, n)
    return [n for n in names if n in up]


def stop(d: Driver, name: str) -> None:
    proc = d.procs.pop(name, None)
    if proc is not None:
        rs._stop(proc, grace_s=5.0)
        d.manifest["arms"][name]["dasc_last"] = rs._tail(d.a.work / name / "server.log", "dasc", 3)


def stop_all(d: Driver) -> None:
    """Stop every live server at once: SIGTERM to each group, up to 5 s, then SIGKILL (the deadline is near)."""
    import os
    import signal

    procs = list(d.procs.items())
    for _, p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except OSError:
            pass
    end = time.monotonic() + 5
    while time.monotonic() < end and any(p.poll() is None for _, p in procs):
        time.sleep(0.2)
    for name, p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        d.procs.pop(name, None)


def _bad_probe_args(a: argparse.Namespace) -> str | None:
    """One line naming a bad TTFT-probe argument, or None."""
    if a.ttft_probe_reps < 1:
        return f"--ttft-probe-reps: expected >= 1, got {a.ttft_probe_reps}"
    if any(n < 1 for n in a.ttft_probe_lengths):
        return f"--ttft-probe-lengths: expected token counts >= 1, got {a.ttft_probe_lengths}"
    return None


def run_arm(d: Driver, name: str, load: dict, *, tag: str | None = None, keep: bool = False) -> None:
    """One arm's open-loop run (``open_loop.py`` in a separate process); the server is stopped after
    unless ``keep``. ``tag``: record the run under this name (``WORK/TAG/``), e.g. a repeat of an arm."""
    a = d.a
    if tag is None:
        rec = d.manifest["arms"][name]
    else:
        base = d.manifest["arms"][name]
        rec = d.manifest["arms"].setdefault(tag, {"launch": base["launch"], "port": base["port"], "failures": [],
                                                  "repeat_of": name})
        (a.work / tag).mkdir(parents=True, exist_ok=True)
    out = a.work / (tag or name) / "result"
    cmd = [*OPEN_LOOP, "--trace", str(Path(a.trace).resolve()), "--url", f"http://127.0.0.1:{rec['port']}",
           "--arm", tag or name, "--checkpoint-capacity", str(rec["launch"]["capacity"]),
           "--rate", f"{load['rate']:.6f}",
           "--think-s", f"{load['think_s']:.6f}", "--think-dist", a.think_dist, "--think-spread", str(a.think_spread),
           "--warmup-s", f"{load['warmup_s']:.3f}", "--window-s", f"{load['window_s']:.3f}",
           "--seeds", *map(str, a.seeds[: a.windows]), "--initial-live", str(load["initial_live"]),
           "--decode-clip", str(a.decode_clip), "--vocab-size", str(a.vocab_size),
           "--max-running-requests", str(a.max_running_requests), "--out", str(out.resolve())]
    t = time.monotonic()
    d.log(f"{name}: open loop ({load['warmup_s'] + a.windows * load['window_s']:.0f} s of schedule)")
    last = "no result"
    try:
        p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                           timeout=max(30.0, d.left() + 5))
        rec["client_rc"], rec["client_out"] = p.returncode, (p.stdout[-2000:] + p.stderr[-2000:])
        last = (p.stdout.strip().splitlines() or ["(no output)"])[-1][:200]
        if p.returncode not in (0, 1):
            rec["failures"].append(f"open_loop rc={p.returncode}: {p.stderr[-300:]}")
    except subprocess.TimeoutExpired:
        rec["failures"].append("open loop cut by the deadline")
    rec["run_s"] = round(time.monotonic() - t, 1)
    res = out.with_name(out.name + ".json")
    if res.is_file():
        s = json.loads(res.read_text())["summary"]
        rec["summary"] = {k: v for k, v in s.items() if k != "per_turn"}
    rec["gpu_mem_mib"] = rs._gpu_mem_mib([a.gpu])
    if not keep:
        stop(d, name)
    d.log(f"{name}: done in {rec['run_s']} s: {last}")
    d.save()


def _run_arms(d: Driver, a: argparse.Namespace, arms: list, names: list, up: list, load: dict) -> None:
    """Steps 4-5 of the module docstring: the arms in priority order, late starters alone, the repeat."""
    per_arm = load["per_arm_s"]
    for n in names:
        if n not in up:
            continue
        if d.left() < per_arm or load["window_s"] <= 0:
            d.manifest["arms"][n]["failures"].append(
                f"not run: {d.left():.0f} s left < {per_arm:.0f} s" if load["window_s"] > 0 else
                f"not run: no measured window fits ({load['left_s']:.0f} s left after the calibration)")
            stop(d, n)
            continue
        run_arm(d, n, load, keep=a.repeat_first and n == up[0])
    for n in names:     # arms whose server did not come up together with the others
        if n in up or d.left() < a.solo_start_s + per_arm:
            continue
        d.log(f"{n}: starting alone")
        start(d, next(x for x in arms if x["arm"] == n), a.base_port + len(arms) + names.index(n))
        if wait_up(d, [n], d.now() + a.solo_start_s) and d.left() >= per_arm:
            run_arm(d, n, load)
        stop(d, n)
    if a.repeat_first and up[0] in d.procs:     # drift check: the first arm again, same schedule
        if d.left() >= per_arm:
            run_arm(d, up[0], load, tag=f"{up[0]}-repeat")
        else:
            d.manifest["repeat"] = f"not run: {d.left():.0f} s left < {per_arm:.0f} s"


def main(argv=None) -> int:
    """CLI (module docstring). Returns 0 when the arms are done (failures are in the manifest), 2 for bad arguments."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms-json", type=Path, required=True, help="from python -m benchmarks.serving_arms --out")
    ap.add_argument("--only", nargs="*", default=None, help="these arms, in this priority order")
    ap.add_argument("--plans", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--trace", type=Path, required=True, help="the measured conversations")
    ap.add_argument("--warm-trace", type=Path, required=True, help="warm-up and calibration prompts (flushed after)")
    ap.add_argument("--launcher", default=f"{sys.executable} -m sglang.launch_server")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--max-running-requests", type=int, required=True)
    ap.add_argument("--vocab-size", type=int, default=163840)
    ap.add_argument("--decode-clip", type=int, default=128)
    ap.add_argument("--calibration-requests", type=int, default=6, help="single requests timed (after 2 dropped)")
    ap.add_argument("--batch-margin", type=float, default=1.15, help="S = single-request E2E times this")
    ap.add_argument("--ttft-probe-lengths", type=int, nargs="*", default=list(tp.DEFAULT_LENGTHS),
                    help="uncached prompt lengths (tokens) of the TTFT probe, clipped to the context length - 64; "
                         "none: no probe")
    ap.add_argument("--ttft-probe-reps", type=int, default=2, help="requests per probe length")
    ap.add_argument("--ttft-probe-max-s", type=float, default=60.0, help="no probe request starts after this")
    ap.add_argument("--no-ttft-probe", action="store_true", help="skip the TTFT probe")
    ol_load.add_load_args(ap)
    ap.add_argument("--load-json", type=Path, default=None,
                    help="replay a previous run's schedule: its manifest.json (or a JSON of its 'load' record); "
                         "calibration and probe are skipped and windows pair with that run's")
    ap.add_argument("--warmup-conversations", type=int, default=8)
    ap.add_argument("--mem-fraction-static", type=float, default=0.88)
    ap.add_argument("--max-total-tokens", type=int, default=400000)
    ap.add_argument("--context-length", type=int, default=12288)
    ap.add_argument("--server-flag", action="append", default=[], help="extra launch_server flag (repeatable)")
    ap.add_argument("--stagger-s", type=float, default=3.0)
    ap.add_argument("--startup-deadline-s", type=float, default=330.0, help="driver time by which servers must be up")
    ap.add_argument("--solo-start-s", type=float, default=90.0, help="time a lone restart is expected to take")
    ap.add_argument("--repeat-first", action="store_true",
                    help="when time is left at the end, run the first arm again (a drift check)")
    ap.add_argument("--deadline-s", type=float, default=560.0)
    ap.add_argument("--base-port", type=int, default=30100)
    ap.add_argument("--work", type=Path, required=True)
    a = ap.parse_args(argv)
    a.server_flag = [x for f in a.server_flag for x in shlex.split(f)]
    arms = json.loads(a.arms_json.read_text())
    if a.only:
        by = {x["arm"]: x for x in arms}
        if any(n not in by for n in a.only):
            print(f"error: --only: no arm {[n for n in a.only if n not in by]} in {a.arms_json}", file=sys.stderr)
            return 2
        arms = [by[n] for n in a.only]
    bad = ol_load.check_load_args(a) or _bad_probe_args(a)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    given = None
    if a.load_json is not None:
        try:
            doc = json.loads(a.load_json.read_text())
            given = doc.get("load", doc)
            missing = [k for k in ("rate", "think_s", "initial_live", "warmup_s", "window_s", "service_s", "per_arm_s")
                       if not isinstance(given.get(k), (int, float))]
        except (OSError, ValueError, AttributeError) as e:
            print(f"error: --load-json {a.load_json}: cannot read a load record ({e})", file=sys.stderr)
            return 2
        if missing:
            print(f"error: --load-json {a.load_json}: the load record lacks {missing}", file=sys.stderr)
            return 2
    a.work.mkdir(parents=True, exist_ok=True)
    d = Driver(a)
    names = [x["arm"] for x in arms]
    try:
        for i, arm in enumerate(arms):
            start(d, arm, a.base_port + i)
            time.sleep(a.stagger_s if i < len(arms) - 1 else 0)
        up = wait_up(d, names, a.startup_deadline_s)
        d.manifest["gpu_mem_mib_all_up"] = rs._gpu_mem_mib([a.gpu])
        d.save()
        if not up:
            d.log("no server came up")
            return 0
        warm_up(d, up)      # also before a replayed schedule: the first arm must not pay first-use compiles
        if given is not None:
            load = dict(given, source=str(a.load_json))
            d.manifest["load"] = load
            d.log(f"load from {a.load_json} (no calibration or probe): "
                  f"{json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in load.items()})}")
            d.save()
            _run_arms(d, a, arms, names, up, load)
            return 0
        cal = None
        for n in up:            # Dense first; the next healthy arm if its requests fail
            try:
                cal = calibrate(d, n)
                break
            except (RuntimeError, OSError) as e:
                d.manifest["arms"][n]["failures"].append(f"calibration: {e}")
        if cal is None:
            d.log("calibration failed on every server")
            return 0
        d.manifest["calibration"] = cal
        d.log(f"calibration: S = {cal['service_s']:.3f} s on {cal['arm']} (single-request E2E "
              f"{cal['e2e_single_s']:.3f} s x {cal['batch_margin']}, TTFT {cal['ttft_s'] * 1e3:.1f} ms, "
              f"{cal['requests']} requests)")
        d.manifest["ttft_probe"] = probe(d, cal["arm"])
        d.save()
        _, convs = load_trace(a.trace)
        turns = min(c.turns for c in convs)
        load = ol_load.plan_load(a, cal["service_s"], turns, len(convs), len(up), d.left())
        d.manifest["load"] = load
        d.log(f"load: {json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in load.items()})}")
        d.save()
        _run_arms(d, a, arms, names, up, load)
    finally:
        stop_all(d)
        d.manifest["wall_s"] = round(d.now(), 1)
        d.save()
    d.log("done: " + ", ".join(f"{n}: {'ok' if 'summary' in v else 'no result'}" for n, v in d.manifest["arms"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
