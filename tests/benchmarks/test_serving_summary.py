"""summary.json and the regime map (benchmarks/serving_summary.py): hand-made runs, and the committed
H200 runs against the figures their notes publish."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from benchmarks import serving_summary as ss
from dasc_compile.errors import DascInputError

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def _result(arm: str, seed: int, ttft: float, e2e: float, hit: float, *, wall: float = 10.0, conc: int = 24,
            clip: int = 8, conv: int = 80, p95: float | None = None) -> dict:
    return {"format": "dasc-serving-result", "version": 1,
            "config": {"concurrency": conc, "decode_clip": clip, "conversations": conv, "seed": seed},
            "summary": {"arm": arm, "checkpoint_capacity": 99, "ttft_mean_s": ttft, "ttft_p95_s": p95 or 2 * ttft,
                        "e2e_mean_s": e2e, "cache_hit_token_rate": hit, "wall_s": wall}}


def _write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(obj).encode()))


def test_closed_loop_by_hand(tmp_path):
    run = tmp_path / "run"
    a, b = run / "a", run / "b"
    _write(a / "dense_s0.json.gz", _result("dense", 0, 2.0, 3.0, 0.2, wall=16.0))
    _write(a / "dense_s1.json.gz", _result("dense", 1, 1.0, 2.0, 0.4, wall=20.0))
    _write(a / "int8_s0.json.gz", _result("int8", 0, 1.0, 1.5, 0.5))
    _write(a / "dasc-nr-w64_s0.json.gz", _result("dasc-nr-w64", 0, 1.5, 3.0, 0.6))
    _write(b / "dasc-nr-w64_s0.json.gz", _result("dasc-nr-w64", 0, 9.9, 9.9, 0.0))     # duplicate: first kept
    _write(b / "dasc-nr-w64_s1.json.gz", _result("dasc-nr-w64", 1, 0.5, 1.0, 0.8))
    (a / "arms.json").write_text(json.dumps([{"arm": "dense", "kind": "dense", "capacity": 52, "ckpt_slots": 0},
                                             {"arm": "int8", "kind": "int8", "capacity": 81, "ckpt_slots": 41}]))
    objs, rows = ss.closed_loop(run, decays="init", model="m")
    by = {o["arm"]: o for o in objs}
    assert all(tuple(o) == ss.KEYS for o in objs) and set(by) == {"dense", "int8", "dasc-nr-w64"}
    w = by["dasc-nr-w64"]
    assert w["seeds"] == [0, 1] and w["w_max"] == 64 and w["regime"] == "closed-loop" and w["decode_clip"] == 8
    assert w["mean_ttft_s"] == pytest.approx(1.0)                       # (1.5 + 0.5) / 2, not the duplicate
    assert w["mean_ttft_ratio_vs_dense"] == pytest.approx((1.5 / 2.0 + 0.5 / 1.0) / 2)
    assert w["mean_e2e_ratio_vs_dense"] == pytest.approx((3.0 / 3.0 + 1.0 / 2.0) / 2)
    assert w["mean_ttft_ratio_vs_int8"] == pytest.approx(1.5)             # seed 0 only
    assert w["p95_ttft_s"] == pytest.approx(2.0) and w["hit_rate"] == pytest.approx(0.7)
    assert w["capacity"] == 99                                            # no arms.json entry: the recorded one
    assert by["int8"]["capacity"] == 41                                   # INT8: its pool slots only
    assert by["dense"]["capacity"] == 52 and by["dense"]["mean_ttft_ratio_vs_dense"] == 1.0
    assert by["dense"]["rate"] == pytest.approx((80 / 16 + 80 / 20) / 2)  # conversations / Dense's wall
    path = ss.write_summary(run, objs)
    assert json.loads(path.read_text()) == objs
    assert "| dasc-nr-w64 | 2 |" in ss.spread_markdown(rows)


def test_open_loop_by_hand(tmp_path):
    run = tmp_path / "ol"
    (run).mkdir()
    (run / "manifest.json").write_text(json.dumps({"arms": {
        "dense": {"launch": {"kind": "dense", "capacity": 56}},
        "dasc-nr-w16": {"launch": {"kind": "dasc", "capacity": 81}},
        "int8": {"launch": {"kind": "int8", "capacity": 55, "ckpt_slots": 55}, "failures": ["not run"]}}}))

    def res(ttfts):
        return {"config": {"decode_clip": 128, "params": {"rate": 0.5}},
                "summary": {"windows": [{"window": i, "seed": 10 + i, "ttft_mean_s": t, "ttft_p95_s": t,
                                         "e2e_mean_s": 4 * t, "cache_hit_token_rate": 0.1} for i, t in enumerate(ttfts)]}}

    _write(run / "dense" / "result.json.gz", res([1.0, 2.0]))
    (run / "dasc-nr-w16").mkdir()
    (run / "dasc-nr-w16" / "result.json").write_text(json.dumps(res([0.5, 2.0])))
    objs, _ = ss.open_loop(run, decays="paper-calibrated", model="m")
    by = {o["arm"]: o for o in objs}
    assert set(by) == {"dense", "dasc-nr-w16"}                          # int8 has no result
    w = by["dasc-nr-w16"]
    assert w["seeds"] == [10, 11] and w["rate"] == 0.5 and w["regime"] == "open-loop" and w["capacity"] == 81
    assert w["mean_ttft_ratio_vs_dense"] == pytest.approx(0.75) and w["mean_ttft_ratio_vs_int8"] is None
    assert w["decays"] == "paper-calibrated"
    _write(run / "int8" / "result.json.gz", res([0.25, 1.0]))
    assert by["dense"]["mean_ttft_ratio_vs_int8"] is None
    with_int8 = {o["arm"]: o for o in ss.open_loop(run, decays="x", model="m")[0]}
    assert with_int8["dasc-nr-w16"]["mean_ttft_ratio_vs_int8"] == pytest.approx((2.0 + 2.0) / 2)
    left_out = {o["arm"]: o for o in ss.open_loop(run, decays="x", model="m", exclude=["int8"])[0]}
    assert set(left_out) == {"dense", "dasc-nr-w16"} and left_out["dasc-nr-w16"]["mean_ttft_ratio_vs_int8"] is None
    with pytest.raises(DascInputError, match="no arm"):
        ss.open_loop(run, decays="x", model="m", exclude=["int4"])
    (run / "int8" / "result.json.gz").unlink()
    out = tmp_path / "map.png"
    ss.write_summary(run, objs)
    ss.regime_map([run / "summary.json"], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (tmp_path / "eval.json").write_text(json.dumps({"arms": []}))          # e.g. a dasc eval summary.json
    with pytest.raises(DascInputError, match="not a serving summary"):
        ss.regime_map([tmp_path / "eval.json"], out)
    (tmp_path / "empty.json").write_text(json.dumps([by["dense"]]))
    with pytest.raises(DascInputError, match="no dasc arm"):
        ss.regime_map([tmp_path / "empty.json"], out)


@pytest.mark.parametrize("call,arm,ratio,hit,cap", [
    # benchmarks/notes/2026-12-01-h200-open-loop-min4k.md (int8 of call 2 left out: not a valid run)
    ("call1", "dasc-nr-w16", 0.587, 0.138, 81),
    ("call2", "dasc-nr-w64", 1.048, 0.350, 152),
])
def test_committed_open_loop_min4k_runs_match_their_note(call, arm, ratio, hit, cap):
    run = RESULTS / "2026-12-01-h200-kimi-linear-48b-calibrated-open-loop-min4k" / call
    committed = json.loads((run / "summary.json").read_text())
    objs, _ = ss.open_loop(run, decays="paper-calibrated", model=committed[0]["model"],
                           exclude=["int8"] if call == "call2" else [])
    assert objs == committed
    o = next(o for o in objs if o["arm"] == arm)
    assert o["mean_ttft_ratio_vs_dense"] == pytest.approx(ratio, abs=6e-4)
    assert o["hit_rate"] == pytest.approx(hit, abs=6e-4) and o["capacity"] == cap


@pytest.mark.parametrize("run,arm,clip,ratio,hit,cap", [
    # benchmarks/notes/2026-11-29-h200x2-serving-prefill-bound.md: seed-paired ratios vs Dense
    ("2026-11-29-h200x2-kimi-linear-48b-c24-clip8", "dasc-nr-w512", 8, 0.642, 0.656, 92),
    ("2026-11-29-h200x2-kimi-linear-48b-c24-clip8", "int8", 8, 0.771, 0.543, 41),
    ("2026-11-29-h200x2-kimi-linear-48b-c24-clip8", "dasc-nr-w128-int8", 8, 0.705, 0.656, 114),
    # benchmarks/notes/2026-11-29-h200x4-serving-first-runs.md, regime A: w64 0.95, INT8 capacity 27
    ("2026-11-29-h200-kimi-linear-48b", "dasc-nr-w64", 128, 0.946, 0.005, 51),
    ("2026-11-29-h200-kimi-linear-48b", "int8", 128, 0.997, 0.005, 27),
])
def test_committed_closed_loop_runs_match_their_notes(run, arm, clip, ratio, hit, cap):
    objs, _ = ss.closed_loop(RESULTS / run, decays="init", model=ss.DEFAULT_MODEL)
    o = next(o for o in objs if o["arm"] == arm and o["decode_clip"] == clip and o["rate"] > 1.38)
    assert o["mean_ttft_ratio_vs_dense"] == pytest.approx(ratio, abs=6e-4)
    assert o["hit_rate"] == pytest.approx(hit, abs=6e-4) and o["capacity"] == cap
    committed = json.loads((RESULTS / run / "summary.json").read_text())
    assert objs == committed


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    assert ss.main(["closed", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
    assert ss.main(["map", str(tmp_path / "x.json")]) == 2
    assert "--out" in capsys.readouterr().err


def test_cli_refuses_what_would_write_a_wrong_summary(tmp_path, capsys):
    """One ``error:`` line, exit 2 and nothing written: an open-loop folder given to ``closed`` (it wrote
    ``[]`` over the committed summary), no ``--decays``, ``--exclude dense``, a map into a missing
    folder or from a file that is not JSON."""
    run = tmp_path / "ol"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"arms": {"dense": {"launch": {"kind": "dense", "capacity": 56}}}}))
    (run / "summary.json").write_text("KEEP")
    (tmp_path / "bad.json").write_text("{not json")
    cases = [
        (["closed", str(run), "--decays", "init"], "no closed-loop results"),
        (["open", str(run)], "--decays is required"),
        (["open", str(run), "--decays", "paper-calibrated", "--exclude", "dense"], "--exclude dense"),
        (["map", str(tmp_path / "bad.json"), "--out", str(tmp_path / "m.png")], "bad.json: not JSON"),
        (["map", str(run / "summary.json"), "--out", str(tmp_path / "no" / "m.png")], "does not exist"),
    ]
    for args, match in cases:
        assert ss.main(args) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and match in err[0], (args, err)
    assert (run / "summary.json").read_text() == "KEEP" and not (tmp_path / "no").exists()
