"""benchmarks/ttft_account.py: the shift-share account of a TTFT ratio, against hand-computed cases, and its
command line on a run_chat work folder."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import chat_replay as cr
from benchmarks import ttft_account as ta
from benchmarks.turn_account import turn_class


def rec(turn, ttft, cached=0, bound=0, success=True):
    return {"conv": 0, "turn": turn, "ttft_s": ttft, "cached_tokens": cached, "reuse_bound": bound,
            "success": success}


# Dense: 2 first turns (0.4 s), 2 later hits (0.1 s), 2 later turns lost (0.5 s): T = 2.0 / 6
DENSE = [rec(0, 0.4), rec(0, 0.4), rec(1, 0.1, 50, 60), rec(1, 0.1, 50, 60), rec(2, 0.5, 0, 60), rec(2, 0.5, 0, 60)]
# the arm kept all four later turns at 0.12 s each: T = 1.28 / 6
ARM = [rec(0, 0.4), rec(0, 0.4)] + [rec(1, 0.12, 50, 60)] * 4


def test_classes_follow_turn_hit_and_bound():
    assert [turn_class(r) for r in (rec(0, 1, 9, 9), rec(1, 1, 5, 9), rec(1, 1, 0, 9), rec(1, 1, 0, 0))] == [
        "first", "hit", "lost", "fresh"]
    m = ta.class_means(DENSE + [rec(1, 9.0, 0, 60, success=False)])   # a failed request is no class
    assert m["n"] == 6 and m["lost"] == (2, pytest.approx(0.5)) and m["fresh"][0] == 0


def test_account_matches_the_hand_computed_pair():
    a = ta.account(ta.class_means(DENSE), ta.class_means(ARM), target=0.70)
    t_d, t_x = 2.0 / 6, 1.28 / 6
    assert a["t_base_s"] == pytest.approx(t_d) and a["t_arm_s"] == pytest.approx(t_x)
    assert a["ratio"] == pytest.approx(0.64)
    # capacity: hit share +1/3 at the mean hit cost 0.11 s, lost share -1/3 at Dense's 0.5 s (the arm has none)
    assert a["capacity"] == pytest.approx((1 / 3 * 0.11 - 1 / 3 * 0.5) / t_d)
    # cost: hits 0.02 s dearer at the mean hit share 1/2; first turns and lost turns cost the same
    assert a["cost_hit"] == pytest.approx(0.5 * 0.02 / t_d)
    assert a["cost_first"] == 0 and a["cost_lost"] == 0 and a["cost_fresh"] == 0
    # the terms add up to ratio - 1 exactly
    assert a["capacity"] + sum(a[f"cost_{c}"] for c in ta.CLASSES) == pytest.approx(a["ratio"] - 1)
    assert a["capacity_only"] == pytest.approx(1 - 0.39)
    assert (a["lost_base"], a["lost_arm"], a["later"]) == (2, 0, 4)
    # Dense losing 1.571 later turns at 0.4 s more than a hit each puts the pair at exactly 0.70x
    assert a["lost_needed"] == pytest.approx(2 + 6 * (t_x / 0.7 - t_d) / 0.4)
    t_d_needed = t_d + (a["lost_needed"] - 2) / 6 * 0.4
    assert t_x / t_d_needed == pytest.approx(0.70)


def test_the_account_is_not_symmetric_in_its_arms():
    """Swapping baseline and arm flips the capacity term's sign and prices lost turns from the arm that has none."""
    a = ta.account(ta.class_means(ARM), ta.class_means(DENSE))
    assert a["ratio"] == pytest.approx(1 / 0.64)
    assert a["capacity"] > 0 and a["lost_needed"] is None


def test_a_pair_without_successful_requests_is_refused():
    with pytest.raises(ta.DascInputError, match="no successful request"):
        ta.account(ta.class_means([rec(0, 1, success=False)]), ta.class_means(ARM))


def _work(tmp_path: Path, runs, name: str = "w", **cfg_changes) -> Path:
    w = tmp_path / name
    (w / "runs").mkdir(parents=True)
    cfg = {"protocol": "open-loop", "replay": "served-reply", "pad_tokens": 0, "decode_clip": 4, "clients": None,
           "rate": 0.3, "conversations_per_seed": 2, "trace": "t.json.gz", **cfg_changes}
    man = []
    for i, (arm, seed, role, records) in enumerate(runs):
        f = f"{arm}_{seed}_{i}.json.gz"
        full = [{**r, "prompt_tokens": 100, "completion_tokens": 4, "e2e_s": 1.0, "queue_s": 0.0, "prefill_s": 0.1,
                 "start_s": 0.0, "prev_prompt_tokens": 0} for r in records]
        cr.write_json(w / "runs" / f, {"config": cfg, "records": full, "inflight": [], "wall_s": 1})
        man.append({"call": 0, "index": i, "arm": arm, "seed": seed, "role": role, "file": f, "rc": 0})
    (w / "manifest.json").write_text(json.dumps({"runs": man, "calls": [{}]}))
    (w / "servers.json").write_text(json.dumps({a: {"pid": 1, "port": 1, "up_s": 1.0} for a in {r[0] for r in runs}}))
    return w


def test_cli_pairs_by_seed_and_writes_the_table(tmp_path, capsys):
    w = _work(tmp_path, [("dense", 1, "arm", DENSE), ("w16", 1, "arm", ARM), ("dense", 1, "drift", ARM),
                         ("w16", 2, "arm", ARM)])     # seed 2 has no Dense run: not a pair
    out = tmp_path / "account.md"
    assert ta.main([str(w), "--arm", "w16", "--out", str(out)]) == 0
    text = out.read_text()
    assert text == capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.startswith("| t/")]
    assert len(rows) == 1 and "| 0.640 |" in rows[0] and "2 / 0 (of 4)" in rows[0]
    assert "| mean (n = 1) |" in text


def test_cli_gives_each_condition_its_own_table_and_mean(tmp_path, capsys):
    """Session 21 pooled a recorded-reply seed (ratio ~1) with served-reply ones (~0.6) into one mean: a mean
    over conditions answers no question. Each condition gets its heading, its rows and its own mean."""
    served = _work(tmp_path, [("dense", 1, "arm", DENSE), ("w16", 1, "arm", ARM)])
    recorded = _work(tmp_path, [("dense", 1, "arm", DENSE), ("w16", 1, "arm", DENSE)], name="r",
                     replay="recorded-reply")
    assert ta.main([str(served), str(recorded), "--arm", "w16"]) == 0
    text = capsys.readouterr().out
    parts = text.split("### ")[1:]
    assert [p.splitlines()[0] for p in parts] == ["open-loop, recorded-reply, pad 0, reply clip 4, rate 0.3/s",
                                                  "open-loop, served-reply, pad 0, reply clip 4, rate 0.3/s"]
    means = [line for line in text.splitlines() if line.startswith("| mean (n = ")]
    assert len(means) == 2 and all(line.startswith("| mean (n = 1) |") for line in means)
    assert "| 1.000 |" in means[0] and "| 0.640 |" in means[1]


def test_cli_leaves_out_a_seed_with_an_unstable_run(tmp_path, capsys):
    w = _work(tmp_path, [("dense", 1, "arm", DENSE), ("w16", 1, "arm", ARM), ("dense", 2, "arm", DENSE),
                         ("w16", 2, "arm", ARM)])
    f = next((w / "runs").glob("dense_2_*.json.gz"))       # seed 2's Dense queue grew without bound
    data = cr.read_json(f)
    cr.write_json(f, {**data, "inflight": [[t, 1 + 3 * t] for t in range(30)]})
    assert ta.main([str(w), "--arm", "w16"]) == 0
    text = capsys.readouterr().out
    assert [line.split(" |")[0] for line in text.splitlines() if line.startswith("| t/")] == ["| t/1"]
    assert "Left out, a run unstable (its queue grew; not averaged): t/2." in text


def _exit_code(argv) -> int:
    try:
        return ta.main(argv)
    except SystemExit as e:        # argparse's refusals (OneLineParser) exit 2 themselves
        return e.code


@pytest.mark.parametrize("argv, needle", [
    (["--arm", "w64"], "--arm w64: no run of that arm here (arms with runs here: dense, w16)"),
    (["--arm", "w16", "--target", "0"], "--target"),
    (["--arm", "w16", "--target", "1.5"], "expected a fraction in (0, 1)"),    # 'lost needed' would go negative
    (["--arm", "w16", "--out", "/nonexistent-folder/x.md"], "--out"),
    (["--arm", "dense"], "--arm dense is also the baseline"),
])
def test_cli_refuses_with_one_line(tmp_path, capsys, argv, needle):
    w = _work(tmp_path, [("dense", 1, "arm", DENSE), ("w16", 1, "arm", ARM)])
    assert _exit_code([str(w), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and needle in err and "\n" not in err


def test_cli_refuses_an_arm_with_no_seed_in_common_with_the_baseline(tmp_path, capsys):
    w = _work(tmp_path, [("dense", 1, "arm", DENSE), ("w16", 2, "arm", ARM)])
    assert _exit_code([str(w), "--arm", "w16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: no trace seed has both a stable dense run and a stable w16 run (arms with runs here: dense, w16)"


def test_cli_refuses_a_seed_counted_twice(tmp_path, capsys):
    w = _work(tmp_path, [("dense", 1, "arm", DENSE), ("w16", 1, "arm", ARM), ("w16", 1, "arm", ARM)])
    assert _exit_code([str(w), "--arm", "w16"]) == 2
    assert "counted twice" in capsys.readouterr().err


def test_components_split_the_difference_by_sglangs_metrics():
    dense = [{**r, "queue_s": 0.2, "prefill_s": 0.1} for r in DENSE]
    arm = [{**r, "queue_s": 0.1, "prefill_s": 0.05} for r in ARM]
    a = ta.account(ta.class_means(dense), ta.class_means(arm))
    t_d = 2.0 / 6
    assert a["component_queue"] == pytest.approx(-0.1 / t_d)
    assert a["component_prefill"] == pytest.approx(-0.05 / t_d)
    assert a["component_queue"] + a["component_prefill"] + a["component_other"] == pytest.approx(a["ratio"] - 1)
    # a run whose server sent no metrics (or not for every request) has no split
    partial = dense[:-1] + [DENSE[-1]]
    assert math.isnan(ta.account(ta.class_means(partial), ta.class_means(arm))["component_queue"])


def test_cli_names_a_missing_or_packed_folder(tmp_path, capsys):
    assert _exit_code([str(tmp_path / "nope"), "--arm", "w16"]) == 2
    assert "does not exist" in capsys.readouterr().err
    packed = tmp_path / "chat.tar.gz"
    packed.write_bytes(b"")
    assert _exit_code([str(packed), "--arm", "w16"]) == 2
    assert "unpack it first" in capsys.readouterr().err


def test_cli_replaces_an_earlier_table_only_with_overwrite(tmp_path, capsys):
    w = _work(tmp_path, [("dense", 1, "arm", DENSE), ("w16", 1, "arm", ARM)])
    out = tmp_path / "account.md"
    out.write_text("committed table")
    assert _exit_code([str(w), "--arm", "w16", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {out}: the file exists") and "--overwrite" in err and err.count("\n") == 1
    assert out.read_text() == "committed table"
    assert ta.main([str(w), "--arm", "w16", "--out", str(out), "--overwrite"]) == 0
    assert "| mean (n = 1) |" in out.read_text()
