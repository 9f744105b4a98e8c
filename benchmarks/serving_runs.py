"""Reading ``benchmarks/run_chat.py`` work folders: one record per run, with its statistics (issue 24 item 7).

:func:`collect` reads the folders' manifests and result files (leaving out the calls and runs a report
excludes, :mod:`benchmarks.run_exclusions`), :func:`run_stats` computes one run's statistics, :func:`runs_by_draw`
pairs runs by trace draw. :mod:`benchmarks.serving_report` summarises the records over seeds,
:mod:`benchmarks.ttft_account` decomposes their TTFT ratios.

Per run (``chat_replay`` records, successful requests):
* ``mean_ttft_s``, ``p95_ttft_s``, ``mean_e2e_s``; ``hit_rate`` = sum(cached) / sum(prompt tokens);
  ``reuse_bound`` = sum(reuse bound) / sum(prompt tokens) (what a cache holding every state could
  serve); ``prefill_tokens_saved`` = sum(cached);
* ``ttft_hit_s`` / ``ttft_miss_s``: mean TTFT of later turns (turn > 0) with / without a hit;
* the hit account of later turns (:func:`benchmarks.turn_account.turn_class`): ``reply_end`` (cached beyond
  the previous prompt: the checkpoint stored at the end of the served reply), ``prompt_end`` (a hit of its own
  no longer than the previous prompt), ``lost`` (nothing beyond the shared part of the prompt although the
  bound was beyond it: evicted before the turn came back); with a shared system prompt also
  ``first_shared_hits`` (first turns served from another conversation's checkpoint in the shared part: any
  hit of a first turn, which :func:`~benchmarks.turn_account.turn_class` classes as ``first``),
  ``first_turns_mid`` / ``first_shared_hits_mid`` (the same for the first turns a closed loop sends after its
  first ``clients`` conversations, by start time: sent while the cache is under pressure; 0 in the open loop),
  ``first_shared_whole`` / ``first_shared_whole_mid`` (of those, the first turns that hit the whole shared
  part: :func:`~benchmarks.turn_account.whole_shared_hit`)
  and ``lost_shared_hit`` (lost turns that still found the shared part);
* ``queue_s`` / ``prefill_s``: SGLang's request metrics (means), when the server sent them;
* ``inflight_mean`` and ``stable``: the open loop is *unstable* when the requests in flight over
  the last third of the run exceed those over the middle third by more than half and by more than
  ``max_running`` (a queue that grows without bound); a closed loop is stable by construction.
  ``inflight_arrivals_mean`` / ``inflight_max``: requests in flight while conversations still arrive, and
  the peak: the load a rate actually put on the server (rho is the rate over a closed-loop throughput,
  not a utilisation; session 14's rho 0.7 ran ~1 request of 8).
* ``live_conversations_mean`` / ``_max``: conversations between their first request and their last reply
  (:func:`benchmarks.turn_account.live_conversations`), the working set that an arm's cached states must cover.
* why each lost turn was lost (:func:`benchmarks.turn_account.lost_turns`): ``lost_reply_stored`` (the previous reply crossed a
  tracking boundary, so a reply-end checkpoint was stored, and it was evicted before the turn came back)
  and ``lost_prompt_only`` (the reply crossed none, or the previous turn failed: only the prompt-end
  checkpoint could be hit, and it was evicted too); ``away_lost_s`` / ``away_hit_s``: for each lost turn and each turn with a hit, the time
  from its previous turn's end to its own scheduling (think time plus SGLang's queue time), which the
  cached state had to outlive.
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path
from typing import Sequence

from benchmarks import ckpt_account
from benchmarks.chat_replay import read_json
from benchmarks.run_exclusions import exclusion_key, run_path
from benchmarks.serving_pool import pctl
from benchmarks.serving_tables import read_json_file
from benchmarks.turn_account import (SGLANG_TRACK_INTERVAL, live_conversations, lost_turns, track_interval, turn_class,
                                     whole_shared_hit)
from dasc_compile.errors import DascInputError


def nanmean(xs: Sequence[float]) -> float:
    v = [x for x in xs if not math.isnan(x)]
    return statistics.fmean(v) if v else math.nan


def stability(samples: Sequence[Sequence[float]], max_running: int) -> tuple[float, bool]:
    """(mean in-flight requests, stable) from ``[[t_s, n], ...]`` samples (module docstring rule)."""
    if not samples:
        return math.nan, True
    n = [s[1] for s in samples]
    third = max(1, len(n) // 3)
    mid, last = n[third:2 * third] or n, n[-third:]
    grow = nanmean(last) - nanmean(mid)
    return nanmean(n), not (grow > 0.5 * max(nanmean(mid), 1e-9) and grow > max_running)


def arrival_window_load(result: dict) -> tuple[float, int]:
    """(mean, max) requests in flight from the first conversation's start to the last one's, from a run's
    ``inflight`` samples and the first turns' ``start_s``: the load while the open loop offers its rate,
    before the run drains (the whole-run mean, ``inflight_mean``, counts the tail of the last
    conversations too). ``(nan, 0)`` without samples."""
    samples = result.get("inflight") or []
    starts = [r["start_s"] for r in result["records"] if r["turn"] == 0]
    if not samples:
        return math.nan, 0
    end = max(starts, default=math.inf)
    win = [n for t, n in samples if t <= end] or [n for _, n in samples]
    return nanmean(win), int(max(n for _, n in samples))


def run_stats(result: dict, *, max_running: int, track_interval: int = SGLANG_TRACK_INTERVAL) -> dict:
    """The statistics of one run (module docstring), from a ``chat_replay`` result; ``track_interval`` is the
    server's ``--mamba-track-interval`` (tokens, :func:`benchmarks.turn_account.lost_turns`)."""
    recs = [r for r in result["records"] if r["success"]]
    later = [r for r in recs if r["turn"] > 0]
    # the previous turn's prompt length, from its own record (chat_replay files of 2026-12-01 stored
    # prompt + reply - 1 in prev_prompt_tokens)
    prompt_of = {(r["conv"], r["turn"]): r["prompt_tokens"] for r in result["records"]}
    prev = {id(r): prompt_of.get((r["conv"], r["turn"] - 1), 0) for r in later}
    cls = {id(r): turn_class(r) for r in later}
    clients = result["config"].get("clients") or 0      # closed loop: the conversations sent at the start
    mid = sorted((r for r in recs if r["turn"] == 0), key=lambda r: r["start_s"])[clients:] if clients else []
    prompt = sum(r["prompt_tokens"] for r in recs)
    cached = sum(r["cached_tokens"] for r in recs)
    inflight, stable = stability(result.get("inflight") or [], max_running)
    arriving, peak = arrival_window_load(result)
    live_mean, live_peak = live_conversations(result["records"])
    if result["config"].get("protocol") == "closed-loop-paper":
        stable = True
    return {
        "requests": len(result["records"]), "failed": len(result["records"]) - len(recs),
        "mean_ttft_s": nanmean([r["ttft_s"] for r in recs]), "p95_ttft_s": pctl([r["ttft_s"] for r in recs], 95),
        "mean_e2e_s": nanmean([r["e2e_s"] for r in recs]),
        "hit_rate": cached / prompt if prompt else math.nan,
        "reuse_bound": sum(r["reuse_bound"] for r in recs) / prompt if prompt else math.nan,
        "prefill_tokens_saved": cached, "prompt_tokens": prompt,
        "ttft_hit_s": nanmean([r["ttft_s"] for r in later if cls[id(r)] == "hit"]),
        "ttft_miss_s": nanmean([r["ttft_s"] for r in later if cls[id(r)] != "hit"]),
        "later_turns": len(later),
        "reply_end": sum(cls[id(r)] == "hit" and r["cached_tokens"] > prev[id(r)] for r in later),
        "prompt_end": sum(cls[id(r)] == "hit" and r["cached_tokens"] <= prev[id(r)] for r in later),
        "lost": sum(cls[id(r)] == "lost" for r in later),
        "first_shared_hits": sum(r["turn"] == 0 and r["cached_tokens"] > 0 for r in recs),
        "first_turns_mid": len(mid), "first_shared_hits_mid": sum(r["cached_tokens"] > 0 for r in mid),
        "first_shared_whole": sum(r["turn"] == 0 and whole_shared_hit(r) for r in recs),
        "first_shared_whole_mid": sum(whole_shared_hit(r) for r in mid),
        "lost_shared_hit": sum(cls[id(r)] == "lost" and r["cached_tokens"] > 0 for r in later),
        "queue_s": nanmean([r["queue_s"] for r in recs]), "prefill_s": nanmean([r["prefill_s"] for r in recs]),
        "initial_prompt_mean": nanmean([r["prompt_tokens"] for r in recs if r["turn"] == 0]),
        "context_max": max((r["prompt_tokens"] + r["completion_tokens"] for r in recs), default=0),
        "inflight_mean": inflight, "stable": stable, "wall_s": result["wall_s"],
        "inflight_arrivals_mean": arriving, "inflight_max": peak,
        "live_conversations_mean": live_mean, "live_conversations_max": live_peak,
        **lost_turns(result["records"], track_interval),
    }


def collect(works: Sequence[Path], *, exclude_calls: Sequence[int] = (), exclude_runs: Sequence[str] = (),
            baseline_run: str = "opening") -> list[dict]:
    """Every successful run of the given ``run_chat`` work folders: one dict per run with its
    condition, arm, seed, role, call (folder-qualified), its ``chat_replay`` records and :func:`run_stats`.

    Args:
        exclude_calls: call indices (``manifest.json`` ``calls``) whose runs are left out, e.g. a call
            that started its servers, whose first runs paid first-use compiles (the drift check
            shows it).
        exclude_runs: result files left out, each a bare name under ``runs/`` (only when one work folder
            holds a run of that name) or a path ``WORK/runs/NAME`` (that folder's run: two sessions' folders
            can hold runs of one name). When an opening baseline run is left out, the
            closing (``drift``) run of the same call and seed takes its place as that seed's
            baseline (and the call then has no drift figure).
        baseline_run: ``opening`` or ``closing``: with ``closing`` every opening run of an arm that has a
            closing (``drift``) run of the same call and seed is left out, so that run becomes the seed's
            baseline (as if each opening run were named in ``exclude_runs``).

    A folder whose ``servers.json`` is missing, or lacks an arm with counted runs, is read with a one-line
    warning on stderr: those arms' running limit (8), tracking interval (SGLang's default), capacity and card
    come from no launch record.

    Raises:
        DascInputError: a folder given twice, or one none of whose runs is counted; an unreadable folder, manifest
            or result; an exclusion that matches nothing, or a bare name that matches runs in more than one folder; with
            ``baseline_run="closing"``, a counted run of the baseline arm (an arm with closing runs) that has
            no closing run in its call (its seed would silently keep the opening baseline); two counted
            runs of one manifest that name one result file (the later wrote over the earlier).
    """
    if baseline_run not in ("opening", "closing"):
        raise DascInputError(f"--baseline-run {baseline_run}: expected opening or closing")
    seen: dict = {}
    for w in works:                 # one folder twice (or by two spellings) would count each run twice
        key = w.resolve()
        if key in seen:
            same = f"{w} and {seen[key]} are" if str(w) != str(seen[key]) else f"{w} is"
            raise DascInputError(f"{same} the same work folder, given twice: give each folder once")
        seen[key] = w
    out = []
    manifests = []
    for w in works:
        man_p, srv_p = w / "manifest.json", w / "servers.json"
        if not man_p.is_file():
            if not w.exists():
                raise DascInputError(f"{w}: does not exist (give an unpacked run_chat work folder)")
            if w.name.endswith((".tar.gz", ".tgz")):
                raise DascInputError(f"{w}: a packed work folder; unpack it first (tar -xzf {w} -C DIR) and give "
                                     f"DIR/chat")
            raise DascInputError(f"{w}: no manifest.json (not a run_chat work folder)")
        man = read_json_file(man_p, "run_chat manifest")
        if not isinstance(man, dict) or not isinstance(man.get("runs"), list):
            raise DascInputError(f"{man_p}: expected a run_chat manifest (an object with a 'runs' list)")
        manifests.append((w, man))
    # an exclusion that matches nothing is a typo: the report would silently keep what it should leave out
    calls = {i for _, man in manifests for i in range(len(man.get("calls") or ()))} \
        | {e.get("call") for _, man in manifests for e in man["runs"]}
    files = {e.get("file") for _, man in manifests for e in man["runs"]} \
        | {run_path(w, e.get("file")) for w, man in manifests for e in man["runs"]}
    given = {exclusion_key(f, works): f for f in exclude_runs}
    exclude_runs = list(given)
    for c in exclude_calls:
        if c not in calls:
            raise DascInputError(f"--exclude-call {c}: no such call in {', '.join(map(str, works))} "
                                 f"(calls {', '.join(map(str, sorted(x for x in calls if x is not None)))})")
    for w, man in manifests:
        _refuse_overwritten(w, man, exclude_calls)
    for f in exclude_runs:
        if f not in files:
            raise DascInputError(f"--exclude-run {given[f]}: no run of that file name in the manifests of "
                                 f"{', '.join(map(str, works))} (names as under runs/, or WORK/runs/NAME)")
        holders = [w for w, man in manifests if "/" not in f and any(e.get("file") == f for e in man["runs"])]
        if len(holders) > 1:   # pooled sessions reuse names: leaving out all of them changed a headline silently
            raise DascInputError(f"--exclude-run {f}: runs of that name are in {len(holders)} of the work folders "
                                 f"given; name the one to leave out as WORK/runs/NAME ("
                                 f"{', '.join(str(Path(w) / 'runs' / f) for w in holders)})")
    named = {str(w): {e.get("file") for e in man["runs"]        # each folder's runs --exclude-run names
                      if e.get("file") in exclude_runs or run_path(w, e.get("file")) in exclude_runs}
             for w, man in manifests}
    baseline_arms = set()      # --baseline-run closing: the arms with a counted closing run in any folder
    if baseline_run == "closing":
        baseline_arms = {e["arm"] for w, man in manifests for e in man["runs"]
                         if e["role"] == "drift" and _counted(e, exclude_calls, named[str(w)])}
        if not baseline_arms:
            raise DascInputError(f"--baseline-run closing: no counted closing (drift) run in "
                                 f"{', '.join(map(str, works))}; use --baseline-run opening")
    for w, man in manifests:
        srv_p = w / "servers.json"
        servers = read_json_file(srv_p, "run_chat servers file") if srv_p.is_file() else {}
        # each arm's first timed run in this work folder (its server's first full load after the warm-up)
        first = {}
        for e in sorted((e for e in man["runs"] if not e.get("skipped") and e.get("rc") in (0, 1)),
                        key=lambda e: (e["call"], e.get("index", 0))):
            first.setdefault(e["arm"], e.get("file"))
        left_out = set(named[str(w)])
        if baseline_run == "closing":
            left_out |= _opening_runs_with_a_closing_run(w, man, exclude_calls, left_out, baseline_arms)
        gone = {(e["call"], e["arm"], e["seed"]) for e in man["runs"]
                if e.get("file") in left_out and e["role"] == "arm"}
        for e in man["runs"]:
            f = w / "runs" / e.get("file", "")
            if not _counted(e, exclude_calls, left_out):
                continue
            if not f.is_file():      # a finished run whose result is gone: leaving it out would bias the pairs
                raise DascInputError(f"{w / 'manifest.json'}: run {e['arm']} seed {e['seed']} finished "
                                     f"(rc {e.get('rc')}) but its result {f} is missing; unpack the whole chat.tar.gz, "
                                     f"or leave the run out with --exclude-run {e.get('file')}")
            if e["role"] == "drift" and (e["call"], e["arm"], e["seed"]) in gone:
                e = {**e, "role": "arm"}
            try:
                res = read_json(f)
                cfg = res["config"]
            except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
                raise DascInputError(f"{f}: not a readable chat_replay result ({type(exc).__name__}: {exc})") from None
            _refuse_other_load(w, man, e, f, cfg)
            launch = (servers.get(e["arm"]) or {}).get("launch")
            bad = ckpt_account.problem(e.get("dasc_account"))
            if bad:
                raise DascInputError(f"{w / 'manifest.json'}: run {e['arm']} seed {e['seed']} ({e.get('file')}): "
                                     f"dasc_account {bad}")
            # a dasc run that has the key but no account: its flush logged none (manifests from before
            # the account have no key at all)
            no_account = ("dasc_account" in e and e["dasc_account"] is None
                          and (launch or {}).get("kind") == "dasc")
            mr = int(launch["flags"][launch["flags"].index("--max-running-requests") + 1]) \
                if launch and "--max-running-requests" in launch["flags"] else 8
            trace = Path(str(cfg.get("trace") or "")).name
            out.append({"work": str(w), "call": f"{w}#{e['call']}", "arm": e["arm"], "seed": e["seed"],
                        # a trace seed is a draw of one trace file: seed 3 of another trace is another draw
                        "trace": trace, "draw": f"{trace.removesuffix('.json.gz')}/{e['seed']}",
                        "file": str(w / "runs" / e.get("file", "")),
                        "role": e["role"],
                        "cond": (cfg["protocol"], cfg["replay"], cfg["pad_tokens"], cfg["decode_clip"],
                                 cfg.get("clients"), cfg.get("rate"), cfg["conversations_per_seed"],
                                 cfg.get("shared_prefix_tokens") or 0),     # runs before 2026-12-07: none shared
                        "launch": launch,       # the card: the run's own record, else its server's
                        "gpu": e["gpu"] if "gpu" in e else (servers.get(e["arm"]) or {}).get("gpu"),
                        "max_running": mr, "account": e.get("dasc_account"),
                        "account_missing": no_account, "first_timed": first.get(e["arm"]) == e.get("file"),
                        "records": res["records"],     # per request, for accounts that need more than run_stats
                        **run_stats(res, max_running=mr, track_interval=track_interval(servers.get(e["arm"])))})
        unknown = sorted({r["arm"] for r in out if r["work"] == str(w)} - set(servers))
        if unknown:     # a partial copy: the runs still pair, but what the servers' launch said is not known
            where = f"{w}: no servers.json (run_chat up writes it)" if not srv_p.is_file() else \
                f"{srv_p}: no entry for {', '.join(unknown)}"
            print(f"warning: {where}: {', '.join(unknown)} taken as 8 running requests and SGLang's default "
                  f"tracking interval; capacity unknown (—); the card only from the manifest's runs or --gpu-name",
                  file=sys.stderr)
        if not any(r["work"] == str(w) for r in out):   # a folder given and then left out whole: say so, never drop it
            why = f" (--exclude-call {', '.join(map(str, exclude_calls))} applies to every folder given)" \
                if exclude_calls else ""
            raise DascInputError(f"{w}: no finished run of this work folder is counted{why}; give the folder only "
                                 f"where its runs count")
    return out


def _counted(e: dict, exclude_calls: Sequence[int], left_out: set) -> bool:
    """Whether manifest entry ``e`` is a finished run (rc 0 or 1) that no exclusion leaves out; ``left_out``:
    its folder's file names left out."""
    return (not e.get("skipped") and e.get("rc") in (0, 1) and e["call"] not in exclude_calls
            and e.get("file") not in left_out)


def _opening_runs_with_a_closing_run(w: Path, man: dict, exclude_calls: Sequence[int], left_out: set,
                                     baseline_arms: set) -> set:
    """The files of ``man``'s opening runs that a closing (``drift``) run of the same call, arm and seed
    replaces under ``--baseline-run closing``; ``baseline_arms``: the arms with closing runs in any folder.

    Raises:
        DascInputError: a counted run of a baseline arm with no closing run in its own call."""
    closing = {(e["call"], e["arm"], e["seed"]) for e in man["runs"]
               if e["role"] == "drift" and _counted(e, exclude_calls, left_out)}
    out = set()
    for e in man["runs"]:
        if e["role"] != "arm" or e["arm"] not in baseline_arms or not _counted(e, exclude_calls, left_out):
            continue
        if (e["call"], e["arm"], e["seed"]) not in closing:
            raise DascInputError(f"--baseline-run closing: {e['arm']} (the arm that bracketed its calls, chat_bench's "
                                 f"BASELINE) seed {e['seed']} ({w / 'runs' / e.get('file', '')}) "
                                 f"has no closing run in its call {e['call']}; leave it out with --exclude-run, or "
                                 f"use --baseline-run opening")
        out.add(e.get("file"))
    return out


def _refuse_overwritten(work: Path, man: dict, exclude_calls: Sequence[int]) -> None:
    """Refuse a work folder in which two runs of manifest.json name one result file: the later run wrote
    over the earlier one's results (run_chat named runs without their load and call until session 36, so
    a closed-loop run of a seed replaced an open-loop run of that seed from an earlier call). Only finished
    runs (rc 0 or 1, as :func:`_counted` counts them) wrote a result: a run cut by the deadline or refused by
    ``chat_replay`` left the file as it was."""
    seen: dict = {}
    for e in man["runs"]:
        f = e.get("file")
        if not f or e.get("skipped") or e.get("rc") not in (0, 1) or e.get("call") in exclude_calls:
            continue
        if f in seen:
            first = seen[f]
            raise DascInputError(
                f"{work / 'runs' / f}: named by two runs in {work / 'manifest.json'} ({first['arm']} seed "
                f"{first['seed']} of call {first['call']} and {e['arm']} seed {e['seed']} of call {e['call']}): "
                f"the later run wrote over the earlier one's results, so the file holds call {e['call']}'s run; "
                f"leave call {first['call']} out with --exclude-call {first['call']} (its own result is only in a "
                f"copy of the work folder taken before call {e['call']}, e.g. the chat.tar.gz that call returned)")
        seen[f] = e


def _refuse_other_load(work: Path, man: dict, e: dict, f: Path, cfg: dict) -> None:
    """Refuse a result file whose run was made at another load than its call's (``manifest.json`` ``calls[i]
    ["settings"]``: ``rate`` or ``clients``): another call's run wrote over it (:func:`_refuse_overwritten`
    catches it while both calls are counted; this, when the wrong one was left out)."""
    calls = man.get("calls") or []
    c = e.get("call")
    settings = calls[c].get("settings") if isinstance(c, int) and 0 <= c < len(calls) else None
    if not isinstance(settings, dict) or "rate" not in settings:
        return                                      # manifests from before the settings were recorded
    want = ("open-loop", settings.get("rate")) if settings.get("rate") is not None else \
        ("closed-loop", settings.get("clients"))
    got = ("open-loop", cfg.get("rate")) if cfg.get("rate") is not None else ("closed-loop", cfg.get("clients"))
    if want != got:
        raise DascInputError(
            f"{f}: {_a(got[0])} run ({'rate' if got[0] == 'open-loop' else 'clients'} {got[1]}), but manifest.json "
            f"lists it as {e['arm']} seed {e['seed']} of call {c}, {_a(want[0])} call "
            f"({'rate' if want[0] == 'open-loop' else 'clients'} {want[1]}): another call's run wrote over it; "
            f"leave call {c} out with --exclude-call {c}")


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def runs_by_draw(runs: Sequence[dict]) -> dict:
    """``{(arm, draw): run}`` over the counted runs (role ``arm``) of one condition, the map every pairing by
    seed reads (:func:`summarize`, :mod:`benchmarks.ttft_account`).

    Raises:
        DascInputError: an arm has two runs of one trace draw. A seed is one draw: a second run of it (another
            call or work folder) is not a second seed, and pairing would silently take whichever came last.
    """
    by: dict = {}
    for r in runs:
        if (r["arm"], r["draw"]) in by:
            raise DascInputError(
                f"{r['arm']} seed {r['seed']} is counted twice ({by[(r['arm'], r['draw'])].get('file')} and "
                f"{r.get('file')}): a seed is one trace draw; leave one run out with --exclude-run and its path (e.g. "
                f"--exclude-run {r.get('file')}; a bare file name leaves out the runs of that name in every folder) "
                f"or with --exclude-call")
        by[(r["arm"], r["draw"])] = r
    return by
