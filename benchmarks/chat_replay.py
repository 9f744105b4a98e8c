"""Replay one trace seed against a running SGLang server as chat clients do (issue 24, protocols A and B).

Each conversation is one chat session: turn ``k + 1`` is sent when turn ``k``'s stream has ended
(after a think time in the open loop) and carries what :class:`benchmarks.chat_trace.ChatTurns`
says of turn ``k``'s reply (``served-reply``: the ids the server generated). Two ways to start
conversations:

* **closed loop** (protocol A, paper App. C.3): ``--clients C`` sessions at once; a client that
  finishes a conversation starts the next one of the seed, so C requests are in flight until the
  seed runs dry. With C above the server's ``--max-running-requests`` the rest wait in SGLang's
  queue, as in the paper (256 clients on 32 running).
* **open loop** (protocol B): conversations start at Poisson times of rate ``--rate`` (per s)
  for as long as the seed lasts; between turns a session thinks for an exponential time of mean
  ``--think-s`` (the schedule: :mod:`benchmarks.arrivals`).

Requests are ``/generate`` with ``input_ids``, ``max_new_tokens`` (the recorded reply length,
clipped) and ``ignore_eos``, streamed (SGLang 0.5.17 ``http_server.py``; ``--skip-tokenizer-init``
servers send cumulative ``output_ids``). Per request the record holds TTFT and E2E (client
clock, s), ``cached_tokens``, the turn's reuse bound (:func:`benchmarks.chat_trace.reusable_tokens`
against the previous request of the session, and the part of the prompt the seed's other conversations
started before it ended share: a shared system prompt, ``--shared-prefix-tokens``), and, when the server runs ``--enable-metrics``,
SGLang's own ``queue_time`` (s in the waiting queue) and prefill time (``prefill_finished_time -
forward_entry_time``, s) from the last event's ``meta_info``
(``observability/req_time_stats.py``). A sampler records the requests in flight every
``--sample-s``.

Output: one JSON (``--out``, gzip when it ends in ``.gz``): ``config``, ``records``, ``inflight``
``[[t_s, n], ...]`` and ``wall_s``. ``benchmarks/serving_report.py`` turns runs into tables.
Standard library only (the GPU machine runs it isolated from its site packages).

    python -m benchmarks.chat_replay --trace benchmarks/traces/sharegpt_qwen_n256_d1024_min4k_s0.json.gz \\
        --url http://127.0.0.1:30000 --arm dense --seed 0 --conversations-per-seed 24 --clients 24 \\
        --decode-clip 256 --vocab-size 163840 --out /tmp/dense_s0.json.gz
"""

from __future__ import annotations

import gzip
import http.client
import json
import math
import os
import queue
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence
from urllib.parse import urlsplit

from benchmarks.trace_file import load_trace
from benchmarks.chat_trace import (REPLAYS, ChatTurns, aligned, chat_turns, check_duplicates, context_pad,
                                   reusable_tokens, seed_conversations, shared_prefixes)
from benchmarks.arrivals import (OPEN_LOOP_TURN_S, arrival_offsets, open_loop_span_s,  # noqa: F401 (re-exported)
                                 open_loop_spans, think_times)
from benchmarks.turn_account import turn_class
from dasc_compile.errors import DascInputError
from benchmarks.cli_args import OneLineParser, path_named

RESULT_FORMAT = "dasc-chat-replay"
RESULT_VERSION = 1
IM_START, IM_END, NEWLINE = 151644, 151645, 198   # Qwen ChatML ids (benchmarks/traces/README.md)


@dataclass(kw_only=True)
class TurnRecord:
    """One request; times in s (``start_s``/``end_s`` from the replay's start), lengths in tokens.

    ``reuse_bound``: tokens of this prompt a cache holding every state of the session's previous request
    and of the first prompts of the seed's other conversations started before this request ended could serve
    (on turn 0 only ``shared_tokens``; seeds whose conversations begin alike beyond an equal pad are refused,
    :func:`benchmarks.chat_trace.check_duplicates`, so no other conversation holds more of it).
    ``shared_tokens``: the part of it another conversation of the seed, started before this request ended,
    shares (:func:`benchmarks.chat_trace.shared_prefixes`, aligned as the bound): a hit no longer than it
    did not need this conversation's own checkpoint. ``prev_prompt_tokens``: the previous request's prompt
    length.
    ``queue_s`` / ``prefill_s``: SGLang's request metrics (NaN without ``--enable-metrics``).
    """

    conv: int
    turn: int
    source_id: str
    prompt_tokens: int
    max_new_tokens: int
    reuse_bound: int = 0
    shared_tokens: int = 0
    prev_prompt_tokens: int = 0
    start_s: float = math.nan
    end_s: float = math.nan
    ttft_s: float = math.nan
    e2e_s: float = math.nan
    cached_tokens: int = 0
    completion_tokens: int = 0
    queue_s: float = math.nan
    prefill_s: float = math.nan
    success: bool = False
    error: str = ""


def generate(host: str, port: int, ids: Sequence[int], max_new_tokens: int, *, timeout_s: float,
             rec: TurnRecord, t0: float) -> list[int]:
    """POST one streaming ``/generate`` and fill ``rec``; returns the generated ids ([] on failure).
    Network and server errors are recorded in ``rec.error``, never raised."""
    body = json.dumps({"input_ids": list(ids), "stream": True, "sampling_params": {
        "max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0.0}}).encode()
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    sent = time.perf_counter()
    rec.start_s = sent - t0
    last = None
    try:
        conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            rec.error = f"HTTP {resp.status}: {resp.read(300).decode(errors='replace')}"
            return []
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                now = time.perf_counter()
                rec.e2e_s, rec.end_s = now - sent, now - t0
                break
            last = json.loads(data)
            if "error" in last:
                rec.error = f"server error: {json.dumps(last['error'])[:300]}"
                return []
            if math.isnan(rec.ttft_s) and last.get("output_ids"):
                rec.ttft_s = time.perf_counter() - sent
        if last is None or math.isnan(rec.e2e_s) or math.isnan(rec.ttft_s):
            rec.error = "stream ended without a token and data: [DONE]"
            return []
        meta = last.get("meta_info") or {}
        out = [int(t) for t in last.get("output_ids") or ()]
        rec.cached_tokens = int(meta.get("cached_tokens") or 0)
        rec.completion_tokens = len(out)
        if meta.get("queue_time") is not None:
            rec.queue_s = float(meta["queue_time"])
        if meta.get("prefill_finished_time") and meta.get("forward_entry_time"):
            rec.prefill_s = float(meta["prefill_finished_time"]) - float(meta["forward_entry_time"])
        rec.success = True
        return out
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec.error = f"{type(e).__name__}: {e}"
        return []
    finally:
        conn.close()


class Replay:
    """Shared state of one run: sessions, records, the in-flight counter."""

    def __init__(self, url: str, sessions: Sequence[ChatTurns], *, timeout_s: float, think_s: float = 0.0,
                 seed: int = 0) -> None:
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.sessions, self.timeout_s, self.think_s, self.seed = sessions, timeout_s, think_s, seed
        # tokens each conversation's first prompt shares with each other's, before any turn advances
        self.shared = shared_prefixes([x.prompt() for x in sessions])
        self.position = {x.conv: i for i, x in enumerate(sessions)}
        self.started: list[int] = []      # positions of the conversations whose first request was sent
        self.records: list[TurnRecord] = []
        self.inflight = 0
        self.samples: list[list[float]] = []
        self.lock = threading.Lock()
        self.t0 = time.perf_counter()

    def run_session(self, s: ChatTurns) -> None:
        """All turns of one conversation, in order (a failed turn ends the session)."""
        previous: list[int] = []          # the previous request's prompt + reply, as the server holds it
        prev_prompt = 0
        pauses = iter(think_times(self.seed, s.conv, self.think_s))
        me = self.position[s.conv]
        while not s.done:
            ids = s.prompt()
            with self.lock:
                if s.turn == 0:
                    self.started.append(me)
                self.inflight += 1
            rec = TurnRecord(conv=s.conv, turn=s.turn, source_id=s.source_id, prompt_tokens=len(ids),
                             max_new_tokens=s.decode[s.turn], prev_prompt_tokens=prev_prompt)
            out = generate(self.host, self.port, ids, s.decode[s.turn], timeout_s=self.timeout_s, rec=rec, t0=self.t0)
            with self.lock:
                # against every conversation started before this request ended: requests reach the server in
                # their own order, so one sent later may still have been cached first
                rec.shared_tokens = aligned(max((self.shared[me][j] for j in self.started if j != me), default=0),
                                            len(ids))
                rec.reuse_bound = max(reusable_tokens(ids, previous) if previous else 0, rec.shared_tokens)
                self.inflight -= 1
                self.records.append(rec)
            if not rec.success:
                return
            previous = ids + out[:-1]          # the last generated token never enters the state
            prev_prompt = len(ids)
            s.advance(out)
            if not s.done and self.think_s > 0:
                time.sleep(next(pauses))

    def sample(self, every_s: float, stop: threading.Event) -> None:
        while not stop.wait(every_s):
            with self.lock:
                self.samples.append([round(time.perf_counter() - self.t0, 3), self.inflight])


def run_closed(r: Replay, clients: int) -> None:
    """Protocol A: ``clients`` sessions at once, each taking the next conversation when one ends."""
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for s in r.sessions:
        todo.put(s)

    def client() -> None:
        while True:
            try:
                s = todo.get_nowait()
            except queue.Empty:
                return
            r.run_session(s)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(max(1, min(clients, len(r.sessions))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run_open(r: Replay, rate: float) -> None:
    """Protocol B: session starts at the Poisson times of :func:`arrival_offsets`, one thread per session."""
    threads = []
    for s, t in zip(r.sessions, arrival_offsets(len(r.sessions), rate, r.seed)):
        wait = r.t0 + t - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        th = threading.Thread(target=r.run_session, args=(s,), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join()


def build_sessions(convs, indices: Sequence[int], *, seed: int, replay: str, decode_clip: int | None,
                   pad_tokens: int, vocab_size: int | None, shared_tokens: int = 0) -> list[ChatTurns]:
    """The seed's sessions, in the seed's order (see :mod:`benchmarks.chat_trace`; ``shared_tokens`` of each
    pad the same in every conversation)."""
    return [chat_turns(i, convs[i], replay=replay, decode_clip=decode_clip, vocab_size=vocab_size,
                       pad=context_pad(convs[i].source_id, pad_tokens, seed=seed, im_start=IM_START,
                                       im_end=IM_END, newline=NEWLINE, shared_tokens=shared_tokens))
            for i in indices]


def write_json(path: Path, obj: dict) -> None:
    """Write ``obj`` (gzip when ``path`` ends in .gz) through a temporary file and a rename."""
    data = json.dumps(obj, separators=(",", ":")).encode()
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    os.replace(tmp, path)


def read_json(path: Path) -> dict:
    """Read a result written by :func:`write_json` (plain or gzip)."""
    raw = Path(path).read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def main(argv: Iterable[str] | None = None) -> int:
    """CLI (module docstring). Returns 0 when every request succeeded, 1 when some failed (the
    result is written either way), 2 with one ``error:`` line for bad input."""
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--arm", required=True)
    ap.add_argument("--seed", type=int, required=True, help="trace seed: a disjoint block of conversations")
    ap.add_argument("--conversations-per-seed", type=int, required=True)
    ap.add_argument("--pool-seed", type=int, default=0, help="seed of the permutation the blocks are cut from")
    ap.add_argument("--replay", default="served-reply", help=f"one of {', '.join(REPLAYS)}")
    ap.add_argument("--decode-clip", type=int, default=None, help="reply clip in tokens (paper: 1024)")
    ap.add_argument("--pad-tokens", type=int, default=0, help="context pad per conversation (tokens)")
    ap.add_argument("--shared-prefix-tokens", type=int, default=0,
                    help="tokens at the start of the pad that every conversation of the seed shares (a system "
                         "prompt; 0 to --pad-tokens; from --pad-tokens - 2 on, the whole pad)")
    ap.add_argument("--vocab-size", type=int, default=None, help="served model's vocab (ids >= it wrap)")
    ap.add_argument("--clients", type=int, default=None, help="closed loop: sessions at once")
    ap.add_argument("--rate", type=float, default=None, help="open loop: conversation starts per s")
    ap.add_argument("--think-s", type=float, default=0.0, help="open loop: mean think time between turns (s)")
    ap.add_argument("--sample-s", type=float, default=0.25, help="in-flight sampling period (s)")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="per-request socket timeout (s)")
    ap.add_argument("--out", type=path_named("an output path"), required=True)
    a = ap.parse_args(argv)
    try:
        if (a.clients is None) == (a.rate is None):
            raise DascInputError("give exactly one of --clients (closed loop) or --rate (open loop)")
        if a.clients is not None and a.clients < 1:
            raise DascInputError(f"--clients: expected >= 1, got {a.clients}")
        if a.rate is not None and not (a.rate > 0 and math.isfinite(a.rate)):
            raise DascInputError(f"--rate: expected a positive number of conversations per s, got {a.rate}")
        if not (math.isfinite(a.think_s) and a.think_s >= 0) or (a.clients is not None and a.think_s):
            raise DascInputError(f"--think-s: expected >= 0 and only with --rate, got {a.think_s}")
        if a.decode_clip is not None and a.decode_clip < 1:
            raise DascInputError(f"--decode-clip: expected >= 1 token, got {a.decode_clip}")
        if a.vocab_size is not None and a.vocab_size < 1:
            raise DascInputError(f"--vocab-size: expected the served model's vocabulary size (>= 1), got {a.vocab_size}")
        for flag, v in (("--sample-s", a.sample_s), ("--timeout-s", a.timeout_s)):
            if not (math.isfinite(v) and v > 0):
                raise DascInputError(f"{flag}: expected a positive number of seconds, got {v}")
        u = urlsplit(a.url)
        try:
            u.port
        except ValueError:
            u = None
        if u is None or u.scheme != "http" or not u.hostname or u.path not in ("", "/"):
            raise DascInputError(f"--url {a.url}: expected the server's http://HOST:PORT, e.g. http://127.0.0.1:30000")
        if not a.out.parent.is_dir():
            raise DascInputError(f"--out {a.out}: folder {a.out.parent} does not exist")
        if a.out.is_dir():
            raise DascInputError(f"--out {a.out}: is a folder; give the result file's name (.json or .json.gz)")
        header, convs = load_trace(a.trace)
        indices = seed_conversations(len(convs), a.conversations_per_seed, a.seed, pool_seed=a.pool_seed)
        check_duplicates(convs, [a.seed], per_seed=a.conversations_per_seed, pool_seed=a.pool_seed,
                         pad_tokens=a.pad_tokens, shared_tokens=a.shared_prefix_tokens)
        sessions = build_sessions(convs, indices, seed=a.seed, replay=a.replay, decode_clip=a.decode_clip,
                                  pad_tokens=a.pad_tokens, vocab_size=a.vocab_size,
                                  shared_tokens=a.shared_prefix_tokens)
    except DascInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    r = Replay(a.url, sessions, timeout_s=a.timeout_s, think_s=a.think_s, seed=a.seed)
    stop = threading.Event()
    sampler = threading.Thread(target=r.sample, args=(a.sample_s, stop), daemon=True)
    sampler.start()
    if a.clients is not None:
        run_closed(r, a.clients)
    else:
        run_open(r, a.rate)
    stop.set()
    wall = time.perf_counter() - r.t0
    r.records.sort(key=lambda x: (x.conv, x.turn))
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
    config.update(protocol="closed-loop-paper" if a.clients is not None else "open-loop",
                  conversations=indices, trace_params=header.get("params"))
    write_json(a.out, {"format": RESULT_FORMAT, "version": RESULT_VERSION, "config": config,
                       "records": [asdict(x) for x in r.records], "inflight": r.samples, "wall_s": wall})
    failed = sum(not x.success for x in r.records)
    hits = sum(turn_class(asdict(x)) == "hit" for x in r.records if x.success)
    later = sum(x.turn > 0 for x in r.records)
    print(f"{a.arm} seed {a.seed}: {len(r.records)} requests ({failed} failed) in {wall:.1f} s; "
          f"later turns hit {hits}/{later}", flush=True)
    return 1 if failed or not r.records else 0      # no record at all: the clients never ran a request


if __name__ == "__main__":
    sys.exit(main())
