"""The server's checkpoint account in the serving benchmark (issue 24 item 5): ``benchmarks/ckpt_account.py``
on hand-made accounts, and the whole path (server log line at a flush -> ``run_chat`` manifest ->
``serving_report``) with ``tests/support/fake_sglang_server.py`` as the launcher."""

from __future__ import annotations

import json
import math
import socket
import sys
from pathlib import Path

import pytest

from benchmarks import ckpt_account as ca
from benchmarks import run_chat
from benchmarks import serving_report as sr
from benchmarks import serving_runs as srun

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "benchmarks/traces/sharegpt_qwen_n8_d64_s0.json.gz"


def _acct(stored, reused, unused, after, hits=0):
    z = dict.fromkeys(ca.ORIGINS, 0)
    return {"origins": {"stored": {**z, **stored}, "reused": {**z, **reused}, "evicted_unused": {**z, **unused},
                        "evicted_reused": {**z, **after}}, "tiers": {"hits_compressed": hits, "hits_dense": 1}}


def test_aggregate_sums_runs_and_derives_shares():
    a = ca.aggregate([_acct({"prompt": 10, "reply": 10}, {"prompt": 1, "reply": 8}, {"prompt": 6}, {"reply": 2}, 9),
                      None,                                           # a run whose flush logged nothing
                      _acct({"prompt": 10, "reply": 10}, {"prompt": 3, "reply": 6}, {"prompt": 4, "reply": 1}, {}, 9)])
    assert a["runs"] == 2 and a["stored"]["prompt"] == 20 and a["reused"]["reply"] == 14
    assert a["reuse_frac"]["prompt"] == pytest.approx(0.2) and a["reuse_frac"]["reply"] == pytest.approx(0.7)
    assert a["wasted_frac"]["prompt"] == pytest.approx(0.5) and a["wasted_frac"]["reply"] == pytest.approx(0.05)
    assert math.isnan(a["reuse_frac"]["chunk"]) and (a["hits_compressed"], a["hits_dense"]) == (18, 2)
    assert ca.aggregate([None, {"no": "account"}]) is None
    rows = ca.markdown_rows([{"arm": "w16", "server_account": a}, {"arm": "dense", "server_account": None}])
    assert any(r.startswith("| w16 | 2 | 20 / 0.20 / 0.50 | 20 / 0.70 / 0.05 | 18 / 2 |") for r in rows), rows
    assert not any(r.startswith("| dense") for r in rows)
    assert ca.markdown_rows([{"arm": "dense", "server_account": None}]) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1] // 10 * 10 % 50000 + 10000


def test_run_chat_records_each_dasc_runs_account_and_the_report_reads_it(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_TOKEN_S", "0")
    monkeypatch.setenv("FAKE_PREFILL_S_PER_TOKEN", "0")
    arms = [{"arm": "dense", "kind": "dense", "capacity": 4, "flags": ["--max-running-requests", "4", "--max-mamba-cache-size", "16"]},
            {"arm": "dasc-nr-w16", "kind": "dasc", "capacity": 12,
             "flags": ["--max-running-requests", "4", "--max-mamba-cache-size", "12", "--dasc-pool-slots", "4"]}]
    (tmp_path / "arms.json").write_text(json.dumps(arms))
    (tmp_path / "config.json").write_text("{}")         # --model is checked for one before any launch
    work = tmp_path / "w"
    launcher = f"{sys.executable} {REPO / 'tests/support/fake_sglang_server.py'}"
    assert run_chat.main(["up", "--arms-json", str(tmp_path / "arms.json"), "--plans", str(tmp_path),
                          "--model", str(tmp_path), "--launcher", launcher, "--max-running-requests", "4",
                          "--warm-lengths", "64", "--stagger-s", "0", "--startup-deadline-s", "60",
                          "--base-port", str(_free_port()), "--work", str(work)]) == 0
    try:
        assert run_chat.main(["run", "--work", str(work), "--trace", str(TRACE), "--seeds", "0", "1",
                              "--conversations-per-seed", "4", "--clients", "4", "--decode-clip", "16",
                              "--first-run-s", "5", "--deadline-s", "300"]) == 0
    finally:
        run_chat.main(["down", "--work", str(work)])
    man = json.loads((work / "manifest.json").read_text())
    runs = [e for e in man["runs"] if e.get("rc") == 0]
    assert {(e["arm"], e["seed"]) for e in runs} >= {("dense", 0), ("dasc-nr-w16", 0), ("dense", 1), ("dasc-nr-w16", 1)}
    for e in runs:
        if e["arm"] == "dense":
            assert e["dasc_account"] is None                 # no dasc plan, no account
            continue
        a = e["dasc_account"]
        # four conversations of four turns: every request stores its prompt and its reply end (the
        # stand-in's cache), each run on a flushed cache, so the account is that run's alone
        st = a["origins"]["stored"]
        assert st["prompt"] + st["reply"] == 2 * 16 and st["reply"] == 16, a
        assert a["tiers"]["hits_compressed"] >= sum(a["origins"]["reused"].values()) > 0
    objs = sr.summarize(srun.collect([work]), model="m", decays="d")
    w16 = next(o for o in objs if o["arm"] == "dasc-nr-w16")
    assert w16["server_account"]["runs"] == 2 and w16["server_account"]["stored"]["reply"] == 32
    assert next(o for o in objs if o["arm"] == "dense")["server_account"] is None
    assert "Server-side checkpoint account" in sr.markdown(objs)


def _account_work(tmp_path, accounts) -> Path:
    """A run_chat work folder: one Dense run and one dasc run per entry of ``accounts`` (its
    ``dasc_account``; the string "absent" leaves the key out, as manifests before 2026-12-02 do)."""
    from benchmarks import chat_replay as cr

    w = tmp_path / "w"
    (w / "runs").mkdir(parents=True)
    rec = {"conv": 0, "turn": 0, "source_id": "a", "prompt_tokens": 100, "max_new_tokens": 4, "reuse_bound": 0,
           "prev_prompt_tokens": 0, "start_s": 0, "end_s": 1, "ttft_s": 1.0, "e2e_s": 2.0, "cached_tokens": 0,
           "completion_tokens": 4, "queue_s": 0.1, "prefill_s": 0.2, "success": True, "error": ""}
    cfg = {"protocol": "closed-loop-paper", "replay": "served-reply", "pad_tokens": 0, "decode_clip": 4,
           "clients": 2, "rate": None, "conversations_per_seed": 2}
    runs = []
    for seed, acct in enumerate(accounts):
        for arm in ("dense", "dasc-nr-w16"):
            f = f"{arm}_{seed}.json.gz"
            cr.write_json(w / "runs" / f, {"config": cfg, "records": [rec], "inflight": [], "wall_s": 1})
            e = {"call": 0, "index": len(runs), "arm": arm, "seed": seed, "role": "arm", "file": f, "rc": 0}
            if arm == "dense":
                e["dasc_account"] = None
            elif acct != "absent":
                e["dasc_account"] = acct
            runs.append(e)
    (w / "manifest.json").write_text(json.dumps({"runs": runs, "calls": [{}]}))
    launch = {"dense": {"kind": "dense", "capacity": 4, "flags": ["--max-running-requests", "4"]},
              "dasc-nr-w16": {"kind": "dasc", "capacity": 12, "flags": ["--max-running-requests", "4"]}}
    (w / "servers.json").write_text(json.dumps({a: {"launch": x} for a, x in launch.items()}))
    return w


GOOD = _acct({"prompt": 4, "reply": 4}, {"reply": 2}, {"prompt": 4}, {"reply": 1}, 2)


@pytest.mark.parametrize("bad, where", [
    ("garbage", "dasc_account"),                                              # was silently no account
    (5, "dasc_account"),
    ({}, "dasc_account"),
    ({"origins": "abc", "tiers": {}}, "origins"),
    ({"origins": {"stored": {"prompt": "x"}}, "tiers": {}}, "stored.prompt"),  # was ValueError traceback
    ({"origins": {"stored": {"prompt": None}}, "tiers": {}}, "stored.prompt"),  # was TypeError traceback
    ({"origins": {"stored": {"prompt": 2.7}}, "tiers": {}}, "stored.prompt"),   # was counted as 2
    ({"origins": {"stored": {"prompt": -3}}, "tiers": {}}, "stored.prompt"),
    ({"origins": {"stored": {"prompt": True}}, "tiers": {}}, "stored.prompt"),
    ({"origins": {"stored": [1, 2]}, "tiers": {}}, "stored"),                  # was AttributeError traceback
    ({"origins": {"stored": {"prefix": 9}}, "tiers": {}}, "prefix"),           # was dropped silently
    ({"origins": {"kept": {"prompt": 1}}, "tiers": {}}, "kept"),
    ({"origins": {"stored": {"prompt": 1}}, "tiers": [1]}, "tiers"),           # was AttributeError traceback
    ({"origins": {"stored": {"prompt": 1}}, "tiers": {"hits_compressed": "lots"}}, "hits_compressed"),
])
def test_report_refuses_a_malformed_account_with_one_line(tmp_path, capsys, bad, where):
    w = _account_work(tmp_path, [GOOD, bad])
    out = tmp_path / "rep"
    assert sr.main([str(w), "--out", str(out), "--model", "m", "--decays", "init"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {w / 'manifest.json'}: ") and "dasc-nr-w16 seed 1" in err[0], err
    assert where in err[0] and "expected" in err[0], err
    assert not out.exists()


def test_report_says_how_many_dasc_runs_logged_no_account(tmp_path):
    """A dasc run whose flush was refused or whose account line was cut has ``dasc_account: null``:
    the table says 'runs 1 of 2' instead of summing one run as if it were the arm's all."""
    objs = sr.summarize(srun.collect([_account_work(tmp_path, [GOOD, None])]), model="m", decays="d")
    a = next(o for o in objs if o["arm"] == "dasc-nr-w16")["server_account"]
    assert (a["runs"], a["runs_without_account"]) == (1, 1)
    md = sr.markdown(objs)
    assert "| dasc-nr-w16 | 1 of 2 | 4 / 0.00 / 1.00 | 4 / 0.50 / 0.00 |" in md, md
    assert "logged no account" in md
    # every dasc run without one: the arm still has a row, not a silent absence
    objs = sr.summarize(srun.collect([_account_work(tmp_path / "b", [None, None])]), model="m", decays="d")
    assert "| dasc-nr-w16 | 0 of 2 |" in sr.markdown(objs)
    # manifests from before the account (no key at all) report as before: no table
    objs = sr.summarize(srun.collect([_account_work(tmp_path / "c", ["absent", "absent"])]), model="m", decays="d")
    assert next(o for o in objs if o["arm"] == "dasc-nr-w16")["server_account"] is None
    assert "Server-side checkpoint account" not in sr.markdown(objs)
