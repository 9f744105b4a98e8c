"""Drive the serving protocols on ONE GPU with every arm's server resident (issue 24).

Three steps, each one command, so that device calls can share servers (a server started here runs
in its own session and outlives the command, and so the device call, while the machine stays
warm):

* ``up``: start each arm's ``sglang.launch_server`` (flags of ``benchmarks/serving_arms.py``:
  equal ``--max-running-requests`` and equal state memory, App. C.1; ``--enable-metrics`` so the
  client gets SGLang's own queue and prefill times) on one GPU, wait for ``/health``, and warm
  each up (untimed; the first server alone, then the rest at once: ``benchmarks/chat_warm.py``): one
  never-cached prompt at each of ``--warm-lengths`` tokens and at each fused-MoE token-count key,
  a group of prompts sent at once (a prefill batch over 128 chunks of 64 tokens), then
  ``--max-running-requests`` multi-turn sessions at once with follow-ups of the trace's sizes, so the
  long-prompt, hit and small-extend paths are compiled and tuned before any timed run. The
  servers are recorded in ``WORK/servers.json``; a server already healthy there is kept.
* ``run``: for each trace seed (``benchmarks/chat_trace.py``: disjoint conversation samples) run
  every arm once on a flushed cache (``/flush_cache``), the arm order a row of a Williams design
  picked by the seed (:func:`benchmarks.run_order.schedule`); the baseline arm (Dense unless
  ``--baseline``) opens the call and, on its first seed, closes it again, so the drift of a call is a
  measured ratio. A seed is not begun unless the time left covers its runs and the
  closing baseline run (:class:`benchmarks.run_order.RunEstimates`: closed loop, each run at what its arm took
  in this call, else ``--expect-s``, else the longest run so far, x RUN_MARGIN; open loop, each seed's span
  expected from its arrival and think-time schedule, :func:`benchmarks.arrivals.open_loop_spans`), and
  a begun seed is finished whenever its own runs fit at the estimates it started with;
  a call in which no other arm ran closes with none (:func:`benchmarks.run_order.closing_run_due`). Each
  run is ``benchmarks/chat_replay.py`` in its own isolated process. A call in which no run began (the time
  left covered none) exits with :data:`NOTHING_RAN`, so a driver can keep the servers for the next call.
* ``down``: stop every server of ``WORK/servers.json``.

Outputs under ``WORK``: ``runs/ARM__sSEED__REPLAY__pPAD[shSHARED]__LOAD__kCALL[__drift].json.gz`` (chat_replay results;
:func:`benchmarks.run_order.run_name`),
``manifest.json`` (one entry per run: order, role, arm, seed, wall, rc, the server's last dasc
counter line and, for dasc arms, the run's checkpoint account (runtime/account.py; a flush after
the run logs it); the settings), ``ARM/server.log``.

    python3 -m benchmarks.run_chat up --arms-json /tmp/p/arms.json --plans /tmp/p --model /tmp/kimi16 \\
        --max-running-requests 8 --context-length 16640 --work /tmp/chat
    python3 -m benchmarks.run_chat run --work /tmp/chat --trace benchmarks/traces/sharegpt_qwen_n256_d1024_min4k_s0.json.gz \\
        --seeds 0 1 --conversations-per-seed 24 --clients 24 --decode-clip 256 --pad-tokens 6000 --deadline-s 500
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from benchmarks.card import gpu_name
from benchmarks.arrivals import open_loop_spans
from benchmarks.chat_replay import IM_END
from benchmarks.chat_trace import check_duplicates, check_seeds, check_shared
from benchmarks.chat_warm import warm_all
from benchmarks.cli_args import OneLineParser, int_at_least, number_above_zero
from benchmarks.run_order import (RUN_MARGIN, RunEstimates, closing_run_due, expect_map, parse_expect, run_name,
                                  schedule)
from benchmarks.arms_json import arm_records, check_arm_names, read_arms
from benchmarks.sglang_server import (COMMON_FLAGS, alive, flush, healthy, kill, log_tail, port_busy,
                                      server_account, server_env)
from benchmarks.trace_file import load_trace
from dasc_compile.errors import DascInputError

REPO = Path(__file__).resolve().parent.parent
CLIENT = [sys.executable, "-E", "-s", "-S", "-m", "benchmarks.chat_replay"]


def load_servers(work: Path) -> dict:
    p = work / "servers.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def save_json(path: Path, obj) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def server_command(a: argparse.Namespace, arm: dict, port: int) -> list[str]:
    """``launch_server`` command of one arm: the benchmark's common flags, one GPU, a capped KV
    pool, request metrics on, and the arm's matched-memory flags (``{plans}`` filled in)."""
    flags = [f.replace("{plans}", str(a.plans)) for f in arm["flags"]]
    if arm["kind"] == "dasc":
        flags.append("--dasc-dummy-decay-ok")
    return [*shlex.split(a.launcher), "--model-path", str(a.model), "--port", str(port), "--nccl-port",
            str(port + 1000), *COMMON_FLAGS, "--enable-metrics",
            "--mem-fraction-static", str(a.mem_fraction_static), "--max-total-tokens", str(a.max_total_tokens),
            "--context-length", str(a.context_length), "--max-running-requests", str(a.max_running_requests),
            "--cuda-graph-max-bs", str(a.max_running_requests), "--tp-size", "1", "--sleep-on-idle",
            *a.server_flag, *flags]


def cmd_up(a: argparse.Namespace) -> int:
    try:
        arms, names = read_arms(a.arms_json, a.plans, a.model, a.arms)
    except DascInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    a.work.mkdir(parents=True, exist_ok=True)
    servers = load_servers(a.work)
    t0 = time.monotonic()
    log = lambda m: print(f"[{time.monotonic() - t0:6.0f}s] {m}", flush=True)  # noqa: E731
    started = []
    procs: dict[str, subprocess.Popen] = {}
    card = gpu_name(a.gpu)      # recorded per server: a report never pairs runs of two cards (benchmarks/card.py)
    log(f"GPU {a.gpu}: {card or 'card not recorded (nvidia-smi gave no name)'}")
    for i, n in enumerate(names):
        s = servers.get(n)
        if s and alive(s["pid"]) and healthy(s["port"]):
            want = " ".join(server_command(a, arms[n], s["port"]))
            if s.get("command") not in (None, want):
                print(f"error: {n}: the server already up on port {s['port']} was launched with other flags "
                      f"than this call asks for (e.g. --server-flag); stop the servers first "
                      f"(python -m benchmarks.run_chat down --work {a.work})", file=sys.stderr)
                return 2
            log(f"{n}: already up on port {s['port']}")
            continue
        port = a.base_port + 10 * i
        if port_busy(port):
            log(f"{n}: port {port} busy; not started")
            continue
        (a.work / n).mkdir(exist_ok=True)
        cmd = server_command(a, arms[n], port)
        env = server_env(arms[n], [a.gpu])
        with open(a.work / n / "server.log", "w") as fh:
            p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                 cwd=a.work)
        servers[n] = {"pid": p.pid, "port": port, "launch": arms[n], "command": " ".join(cmd), "up_s": None,
                      "gpu": card}
        procs[n] = p
        started.append(n)
        log(f"{n}: launched on port {port}")
        time.sleep(a.stagger_s)
    save_json(a.work / "servers.json", servers)
    pending = list(started)
    while pending and time.monotonic() - t0 < a.startup_deadline_s:
        for n in list(pending):
            s = servers[n]
            procs[n].poll()   # reap a leader that exited: a zombie still counts for alive()'s killpg
            if not alive(s["pid"]):
                s["failure"] = "exited during start-up: " + " | ".join(log_tail(a.work / n / "server.log", n=4))
                log(f"{n}: {s['failure']}")
                pending.remove(n)
            elif healthy(s["port"]):
                s["up_s"] = round(time.monotonic() - t0, 1)
                log(f"{n}: up at {s['up_s']} s")
                pending.remove(n)
        time.sleep(1)
    for n in pending:
        servers[n]["failure"] = f"not up by {a.startup_deadline_s:.0f} s"
        log(f"{n}: {servers[n]['failure']}; stopped")
        kill(servers[n]["pid"])
    up = [n for n in started if servers[n].get("up_s") is not None]
    res = {} if not a.warm_lengths else warm_all(        # `--warm-lengths` with no value: no warm-up
        servers, up, a.warm_lengths, a.vocab_size, a.warm_sessions or a.max_running_requests,
        first_alone=not a.warm_all_at_once)
    for n in up:
        servers[n]["warmup"] = res.get(n)
        servers[n]["startup_lines"] = (log_tail(a.work / n / "server.log", "Mamba Cache is allocated", 2)
                                       + log_tail(a.work / n / "server.log", "dasc:", 4)
                                       + log_tail(a.work / n / "server.log", "max_total_num_tokens", 1))
        log(f"{n}: warm-up {res.get(n)}")
    save_json(a.work / "servers.json", servers)
    return 0 if all(servers[n].get("up_s") is not None for n in names if n in servers) else 1


def cmd_down(a: argparse.Namespace) -> int:
    for n, s in load_servers(a.work).items():
        kill(s["pid"])
        print(f"{n}: stopped", flush=True)
    return 0


#: ``run``'s exit status when no run began in the call (the time left covered none): not an error, but the call
#: measured nothing, and chat_bench.sh then keeps the servers up even with DOWN=1 (a restart costs ~60-200 s).
NOTHING_RAN = 4


def cmd_run(a: argparse.Namespace) -> int:
    t0 = time.monotonic()
    log = lambda m: print(f"[{time.monotonic() - t0:6.0f}s] {m}", flush=True)  # noqa: E731
    servers = {} if a.check else load_servers(a.work)
    names = a.arms or [n for n, s in servers.items() if s.get("up_s") is not None]
    if not names:
        print("error: --arms: expected the arms to check (--check reads no servers.json)" if a.check else
              f"error: --work {a.work}: no server came up there (servers.json); nothing to run", file=sys.stderr)
        return 2
    try:
        if a.arms_json is not None:     # the arms `up` would start: refused here, before a fresh machine's ~200 s start
            check_arm_names(names, arm_records(a.arms_json), a.arms_json)
        expect = expect_map(a.expect_s, names, open_loop=a.rate is not None)
        order = schedule(names, a.seeds, baseline=a.baseline)
        span = (open_loop_spans(a.trace, a.seeds, a.conversations_per_seed, a.pool_seed, a.rate, a.think_s)
                if a.rate is not None else {})
        check_shared(a.shared_prefix_tokens, a.pad_tokens)
        convs = load_trace(a.trace)[1]
        check_duplicates(convs, a.seeds, per_seed=a.conversations_per_seed, pool_seed=a.pool_seed,
                         pad_tokens=a.pad_tokens, shared_tokens=a.shared_prefix_tokens)
        check_seeds(convs, a.seeds, per_seed=a.conversations_per_seed, pool_seed=a.pool_seed,
                    replay=a.replay, decode_clip=a.decode_clip, pad_tokens=a.pad_tokens,
                    context_length=a.context_length)     # refused before any run, not by each run in turn
    except DascInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.check:
        print(f"run settings accepted: {len(order)} runs, " + ", ".join(
            f"{arm} seed {seed}" + (" (closing)" if role == "drift" else "") for arm, seed, role in order))
        return 0
    runs_dir = a.work / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    man_path = a.work / "manifest.json"
    manifest = json.loads(man_path.read_text()) if man_path.is_file() else {"runs": [], "calls": []}
    call = {"started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "order": order,
            "expected_run_s": {str(k): round(v, 1) for k, v in span.items()} or None,
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items() if k != "func"}}
    manifest["calls"].append(call)
    # ran / others_ran: runs in this call, and those of arms other than the baseline
    state = {"ran": 0, "others_ran": 0}
    est = RunEstimates(a.first_run_s, expect, span)
    if span:
        log("open-loop runs expected from their seeds' schedules: " + ", ".join(
            f"seed {k} {v:.0f} s" for k, v in span.items()))

    def do_run(idx: int, arm: str, seed: int, role: str) -> None:
        s = servers.get(arm)
        if not s or not (alive(s["pid"]) and healthy(s["port"])) or not flush(s["port"]):
            log(f"{arm}: server not up or /flush_cache refused; run skipped")
            manifest["runs"].append({"call": len(manifest["calls"]) - 1, "index": idx, "arm": arm, "seed": seed,
                                     "role": role, "skipped": "server not up or flush refused"})
            return
        server_log = a.work / arm / "server.log"
        offset = server_log.stat().st_size if server_log.is_file() else 0
        load = f"c{a.clients}" if a.rate is None else f"r{a.rate:g}"
        stem = run_name(arm, seed, a.replay, a.pad_tokens, role, load, len(manifest["calls"]) - 1,
                        shared=a.shared_prefix_tokens)
        out = runs_dir / f"{stem}.json.gz"
        cmd = [*CLIENT, "--trace", str(a.trace.resolve()), "--url", f"http://127.0.0.1:{s['port']}", "--arm", arm,
               "--seed", str(seed), "--conversations-per-seed", str(a.conversations_per_seed),
               "--pool-seed", str(a.pool_seed), "--replay", a.replay, "--decode-clip", str(a.decode_clip),
               "--pad-tokens", str(a.pad_tokens), "--shared-prefix-tokens", str(a.shared_prefix_tokens),
               "--vocab-size", str(a.vocab_size), "--out", str(out.resolve())]
        cmd += ["--clients", str(a.clients)] if a.rate is None else ["--rate", str(a.rate), "--think-s", str(a.think_s)]
        t = time.monotonic()
        try:
            p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                               timeout=max(10.0, a.deadline_s - (time.monotonic() - t0)))
            rc, tail = p.returncode, (p.stdout + p.stderr)[-600:]
        except subprocess.TimeoutExpired:
            rc, tail = -9, "cut by the deadline"
        dt = time.monotonic() - t
        account = server_account(s, server_log, offset) if rc in (0, 1) else None
        if rc in (0, 1):   # the estimates follow what the runs took
            est.record(arm, seed, dt)
            state["ran"] += 1
            state["others_ran"] += arm != order[-1][0]
        manifest["runs"].append({"call": len(manifest["calls"]) - 1, "index": idx, "arm": arm, "seed": seed,
                                 "role": role, "replay": a.replay, "pad_tokens": a.pad_tokens,
                                 "shared_prefix_tokens": a.shared_prefix_tokens, "file": out.name,
                                 "gpu": s.get("gpu"),    # per run: a later call may relaunch the server elsewhere
                                 "wall_s": round(dt, 1), "rc": rc, "client": tail.strip(),
                                 "dasc_counters": log_tail(server_log, "dasc", 1), "dasc_account": account})
        save_json(man_path, manifest)
        log(f"{arm} seed {seed} ({role}): rc {rc} in {dt:.0f} s: {tail.strip()[-200:]}")

    left = lambda: a.deadline_s - (time.monotonic() - t0)  # noqa: E731
    for idx, (arm, seed, role) in enumerate(order[:-1]):
        need = est.need_s(order, idx)
        if left() < need:
            log(f"stop before {arm} seed {seed}: {left():.0f} s left, {need:.0f} s to reserve (a seed starts only "
                f"when its runs and the closing {order[-1][0]} run fit at their estimates, x {RUN_MARGIN} in the "
                f"closed loop; a begun seed needs its own runs at the estimates it started with: "
                f"run_order.RunEstimates)")
            break
        do_run(idx, arm, seed, role)
    if closing_run_due(state["others_ran"], left(), est.run_s(*order[-1][:2])):
        do_run(len(order) - 1, *order[-1])
    elif not state["others_ran"]:
        log(f"closing {order[-1][0]} run skipped: no other arm ran in this call, so it would bracket nothing")
    else:
        log(f"closing {order[-1][0]} run skipped: {left():.0f} s left, "
            f"{est.run_s(*order[-1][:2]):.0f} s to reserve (the call has no drift figure)")
    save_json(man_path, manifest)
    began = any(r["call"] == len(manifest["calls"]) - 1 and "rc" in r for r in manifest["runs"])
    return 0 if began else NOTHING_RAN


def _expect_arg(text: str) -> tuple[str, float]:
    try:
        return parse_expect(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv=None) -> int:
    from benchmarks.chat_trace import REPLAYS

    ap = OneLineParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{up,run,down}")
    up = sub.add_parser("up", help="start and warm the arms' servers")
    up.add_argument("--arms-json", type=Path, required=True,
                    help="the arms' launch flags at matched memory (benchmarks/serving_arms.py --out)")
    up.add_argument("--arms", nargs="*", default=None, help="these arms of arms.json (default: all)")
    up.add_argument("--plans", type=Path, required=True, help="folder of the compiled plans ({plans} in arms.json)")
    up.add_argument("--model", type=Path, required=True, help="the served model's folder (config.json)")
    up.add_argument("--launcher", default=f"{sys.executable} -m sglang.launch_server",
                    help="the server command (a CPU rehearsal: tests/support/fake_sglang_server.py)")
    up.add_argument("--gpu", type=int, default=0, help="the GPU every server runs on")
    up.add_argument("--max-running-requests", type=int, required=True, help="each server's running limit R")
    up.add_argument("--mem-fraction-static", type=float, default=0.88, help="SGLang's flag, for every server")
    up.add_argument("--max-total-tokens", type=int, default=1000000,
                    help="each server's KV cap in tokens (keeps six servers' KV pools within one GPU)")
    up.add_argument("--context-length", type=int, default=16640, help="SGLang's flag, for every server")
    up.add_argument("--server-flag", action="append", default=[],
                    help="one more launch flag for every server (repeatable; quote a flag with its value)")
    up.add_argument("--warm-lengths", type=int, nargs="*", default=[2048, 8192, 16000],
                    help="warm-up prompt lengths in tokens (benchmarks/chat_warm.py; none given: no warm-up)")
    up.add_argument("--warm-sessions", type=int, default=0,
                    help="chat sessions of the warm-up, run at once (default: --max-running-requests)")
    up.add_argument("--warm-all-at-once", action="store_true",
                    help="warm every server at once (default: the first alone, then the rest; chat_warm.warm_all says why)")
    up.add_argument("--stagger-s", type=float, default=3.0, help="seconds between server launches")
    up.add_argument("--startup-deadline-s", type=float, default=330.0,
                    help="a server not healthy by then is stopped and reported")
    up.add_argument("--base-port", type=int, default=30100, help="arm i listens on base + 10 i")
    run = sub.add_parser("run", help="run trace seeds x arms on the resident servers")
    run.add_argument("--arms", nargs="*", default=None,
                     help="the arms; each seed runs them in its row of a Williams design over this list "
                          "(default: every server up)")
    run.add_argument("--baseline", default="dense", help="the arm that opens and closes the call (drift)")
    run.add_argument("--trace", type=Path, required=True, help="a chat trace (benchmarks/trace_file.py)")
    run.add_argument("--seeds", type=int, nargs="+", required=True,
                     help="trace seeds: disjoint conversation samples of the trace (chat_trace.seed_conversations)")
    run.add_argument("--conversations-per-seed", type=int_at_least(1), default=24,
                     help="conversations in one seed's sample")
    run.add_argument("--pool-seed", type=int_at_least(0), default=0,
                     help="the permutation the seeds' samples are cut from")
    run.add_argument("--replay", default="served-reply", choices=REPLAYS,
                     help="what the next turn carries as the last reply (benchmarks/chat_replay.py)")
    run.add_argument("--decode-clip", type=int_at_least(1), default=256,
                     help="reply lengths clipped at this many tokens")
    run.add_argument("--pad-tokens", type=int_at_least(0), default=0,
                     help="tokens put before each conversation (the context-length axis): unique to it unless "
                          "--shared-prefix-tokens")
    run.add_argument("--shared-prefix-tokens", type=int_at_least(0), default=0,
                     help="the first tokens of that pad, the same in every conversation of a seed (a shared system "
                          "prompt: at most --pad-tokens; from --pad-tokens - 2 on the whole pad is shared, and seeds "
                          "holding near-duplicate conversations are then refused; default 0, none shared)")
    run.add_argument("--clients", type=int_at_least(1), default=None,
                     help="closed loop: concurrent clients (default 24)")
    run.add_argument("--rate", type=number_above_zero("conversations/s"), default=None,
                     help="open loop instead: conversation starts per s")
    run.add_argument("--think-s", type=number_above_zero("seconds", zero=True), default=None,
                     help="open loop: mean think time between turns, s")
    run.add_argument("--first-run-s", type=number_above_zero("seconds"), default=60.0,
                     help="closed loop: estimate of a run (s) before one has run (open-loop runs use their seed schedules)")
    run.add_argument("--expect-s", type=_expect_arg, action="append", default=[], metavar="ARM=S",
                     help="closed loop: estimate of ARM's run (s) until it has run in this call, e.g. from an earlier "
                          "call at the same pad (repeatable; other arms use the longest run so far, or --first-run-s)")
    run.add_argument("--deadline-s", type=number_above_zero("seconds"), default=500.0,
                     help="no run is begun that would end after this")
    run.add_argument("--context-length", type=int_at_least(1), default=None,
                     help="the servers' --context-length (tokens): a seed with a turn SGLang would refuse or cut "
                          "(prompt + reply + 2 or prompt + 7 tokens over it) is refused before any run")
    run.add_argument("--arms-json", type=Path, default=None,
                     help="arms.json of the plans (benchmarks.serving_arms --out): the arms must be among its arms")
    run.add_argument("--check", action="store_true", help="only check these settings against the trace and print "
                     "the run order (exit 2 if refused): no server is needed and nothing is written")
    down = sub.add_parser("down", help="stop the servers")
    for p in (up, run, down):
        p.add_argument("--work", type=Path, required=True, help="the work folder (servers.json, runs/, manifest.json)")
    for p in (up, run):
        p.add_argument("--vocab-size", type=int, default=163840,
                       help="the served model's vocabulary: pad and warm-up token ids are drawn below it "
                            "(default Kimi-Linear's 163,840)")
    a = ap.parse_args(argv)
    if a.cmd in ("up", "run") and a.vocab_size <= IM_END:
        # the traces' token ids and the warm-up's turn markers are Qwen's ChatML ids (chat_replay.IM_END)
        ap.error(f"--vocab-size: expected more than {IM_END} (the traces and the warm-up send Qwen's ChatML ids "
                 f"up to {IM_END}), got {a.vocab_size}")
    if a.cmd == "run":
        if a.rate is None and a.think_s is not None:
            ap.error("--think-s: only with --rate (the closed loop has no think time)")
        if a.rate is not None and a.clients is not None:
            ap.error("--clients: only without --rate (the open loop's load is its rate)")
        a.clients = 24 if a.clients is None and a.rate is None else a.clients
        a.think_s = 0.0 if a.think_s is None else a.think_s
        if not a.trace.is_file():
            ap.error(f"--trace {a.trace}: no such file")
    if a.cmd in ("run", "down") and not getattr(a, "check", False) and not (a.work / "servers.json").is_file():
        print(f"error: --work {a.work}: no servers.json (start the servers with `run_chat up` first)", file=sys.stderr)
        return 2
    return {"up": cmd_up, "run": cmd_run, "down": cmd_down}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
