"""``dasc sweep`` (issue 22 item 2): every row is what ``dasc compile`` + ``dasc size`` print one by one, it runs
on every bundled reference, its quality column is ``dasc eval``'s, and the recommendation's commands
reproduce the row. Timing is a benchmark (``python -m benchmarks.sweep_bench``), not a test."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from dasc_compile.errors import DascInputError
from tests.support.clihelp import ROOT, assert_one_error, dasc, snapshot

REFS = ROOT / "plans" / "reference"
KIMI = REFS / "kimi-linear-48b-a3b-calibrated"
TRAINED = REFS / "kda-hybrid-3m-sharegpt"
BUDGET, R = str(6 * 2**30), 8


def _json(r) -> dict:
    assert r.code == 0, r.err
    return json.loads(r.out)


@pytest.fixture(scope="module")
def kimi_sweep():
    return _json(dasc("sweep", KIMI, "--wmax", "4,16,128", "--tp", "1,4", "--balance", "storage", "--int8", "both",
                      "--budget", BUDGET, "--max-running-requests", R, "--json"))


def test_rows_are_dasc_compile_and_dasc_size_one_by_one(tmp_path, kimi_sweep):
    rows = kimi_sweep["rows"]
    assert [(r["tp_size"], r["w_max"], r["int8"]) for r in rows] == [
        (p, w, i) for p in (1, 4) for w in (4, 16, 128) for i in (False, True)]
    for row in rows:
        out = tmp_path / row["name"]
        args = ["--wmax", row["w_max"], "--tp", row["tp_size"], "--balance", "storage", "--out", out, "--no-kernels"]
        plan = json.loads(dasc("compile", KIMI, *args, *(["--int8"] if row["int8"] else []), "--json").out)
        t = plan["totals"]
        assert (row["n_kept"], row["n_units"]) == (t["n_kept"], t["n_units"])
        for key in ("c_temp_ragged", "c_temp_padded", "layout_gain"):
            assert row[key] == t[key], key
        assert row["c_ckpt"] == plan["tp"]["c_ckpt_tp"]
        assert row["bytes_compressed_per_slot"] == plan["tp"]["bottleneck_bytes_per_slot"]
        arms = _json(dasc("size", out, "--budget", BUDGET, "--max-running-requests", R, "--json"))
        mine = next(a for a in arms if a["arm"] == row["arm"]["arm"])
        assert {**mine, "plan": None, "flags": None} == {**row["arm"], "plan": None, "flags": None}
        flags = [str(out) if f == row["name"] else f for f in row["arm"]["flags"]]
        assert flags == mine["flags"]
        base = kimi_sweep["baselines"][str(row["tp_size"])]
        assert base["dense"] == arms[0] and base["int8"] == arms[1]


def test_storage_at_tp_gets_the_flag_the_runtime_needs(kimi_sweep):
    tp4 = [r for r in kimi_sweep["rows"] if r["tp_size"] == 4]
    assert all("--disable-overlap-schedule" in r["arm"]["flags"] for r in tp4)
    assert any("added --disable-overlap-schedule" in n for n in kimi_sweep["notes"])
    assert kimi_sweep["sizing"] == {"budget_bytes": 6 * 2**30, "max_running_requests": 8, "strategy": "extra_buffer",
                                    "overlap_schedule": True, "refresh_slots": None}
    assert kimi_sweep["recommendation"] is None and kimi_sweep["eval"] is None


def test_json_keys_are_documented(kimi_sweep):
    text = (ROOT / "docs" / "cli.md").read_text()
    keys = set(kimi_sweep) | set(kimi_sweep["model"]) | set(kimi_sweep["rows"][0]) | set(kimi_sweep["grid"])
    keys |= set(kimi_sweep["sizing"]) | set(kimi_sweep["model"]["provenance"])
    assert not sorted(k for k in keys if f"`{k}`" not in text), "undocumented dasc sweep --json keys"


def test_calibrated_figures_come_out_of_the_sweep():
    # the paper's Kimi-Linear C_ckpt at TP8 with storage balancing (BENCHMARKS / calibrated targets)
    doc = _json(dasc("sweep", KIMI, "--wmax", "16,64,128,512", "--tp", "8", "--balance", "storage", "--json"))
    assert [round(r["c_ckpt"], 2) for r in doc["rows"]] == [2.64, 7.06, 14.72, 28.27]
    assert doc["model"]["provenance"]["kind"] == "paper-calibrated" and doc["sizing"] is None


@pytest.mark.parametrize("ref", sorted(p.name for p in REFS.iterdir() if (p / "config.json").is_file()))
def test_every_bundled_reference_sweeps(ref):
    r = dasc("sweep", REFS / ref, "--wmax", "4,16,64,128,512", "--budget", "64GiB", "--max-running-requests", 8)
    assert r.code == 0, r.err
    assert r.out.count("provenance:") == 1 and all(f"\n│ {w:>5} " in r.out or f"│ {w:>5} │" in r.out
                                                   for w in (4, 16, 64, 128, 512)), r.out
    assert "Traceback" not in r.err


def test_text_table_matches_the_json(kimi_sweep):
    r = dasc("sweep", KIMI, "--wmax", "16", "--budget", BUDGET, "--max-running-requests", R)
    row = next(x for x in kimi_sweep["rows"] if (x["tp_size"], x["w_max"], x["int8"]) == (1, 16, False))
    line = next(ln for ln in r.out.splitlines() if ln.startswith("│    16 "))
    assert f"{row['n_kept']:,}/{row['n_units']:,}" in line and f"{row['c_ckpt']:.2f}x" in line
    assert f"{row['arm']['capacity']:,} (" in line
    dense = kimi_sweep["baselines"]["1"]["dense"]
    # under load the M' = 40 native slots run the 8 requests: the dasc arm keeps its pool, Dense M - 40
    assert row["arm"]["capacity_under_load"] == row["arm"]["ckpt_slots"]
    assert dense["capacity_under_load"] == dense["capacity"] - 40
    ratio = row["arm"]["capacity_under_load"] / dense["capacity_under_load"]
    assert f"{row['arm']['capacity_under_load']:,} ({ratio:.2f}x)" in line
    int8 = kimi_sweep["baselines"]["1"]["int8"]
    assert (f"Dense capacity {dense['capacity']:,} ({dense['capacity_under_load']:,} under load), SGLang INT8 "
            f"{int8['capacity']:,} ({int8['capacity_under_load']:,} under load)") in r.out


def test_counts_above_a_thousand_read_alike_in_sweep_compile_and_inspect(tmp_path):
    """README's sweep example (8 GiB a rank, TP 8): the title's counts carry separators as the table's cells do
    ("Dense capacity 1581" sat beside "2,155" before), and compile and inspect print the kept units alike."""
    r = dasc("sweep", KIMI, "--wmax", "16", "--tp", "8", "--balance", "storage", "--budget", "8GiB",
             "--max-running-requests", R)
    assert r.code == 0, r.err
    assert "20 kda layers, 81,920 units;" in r.out
    assert ("(Dense's 1,581 + 1 slots use 8,585,830,400 B), R = 8: Dense capacity 1,581 (1,549 under load), "
            "SGLang INT8 5,472 (5,472 under load)") in r.out
    c = dasc("compile", KIMI, "--wmax", "16", "--out", tmp_path / "k.dasc", "--no-kernels")
    assert c.code == 0 and "kept 29,233/81,920 units" in c.out, c.err
    i = dasc("inspect", tmp_path / "k.dasc")
    assert i.code == 0 and "kept 29,233 of 81,920 over L = 20 layers (R_max 2,286," in i.out, i.err
    c = dasc("compile", KIMI, "--wmax", "16", "--tp", "8", "--balance", "storage", "--out", tmp_path / "k8.dasc",
             "--no-kernels")
    assert c.code == 0, c.err
    i = dasc("inspect", tmp_path / "k8.dasc")
    assert "storage balancing: M_remote = 1,096 (units stored off their compute rank); slot width 3,655 units; " \
           "targets 3,654 / 3,655 / 3,654" in i.out
    assert "3,654 (alloc 3,655)" in i.out


def test_recommendation_notes_fewer_states_under_load_than_int8():
    """At M = 56, R = 8 (the H200 chat runs of 2026-12-01) w16 keeps 41 cached states under load, INT8 55:
    the recommendation says so; w64 keeps more and gets no note."""
    import io

    from rich.console import Console

    from dasc_compile import sweep as sw
    from dasc_compile.policy import Policy
    from dasc_compile.sweep_report import render

    sizing = sw.Sizing(budget_bytes=57 * 43_417_600, max_running_requests=8)
    result = sw.run_sweep(KIMI, sw.SweepGrid(w_max=(16, 64), tp=(1,), int8=(False,), base=Policy()), sizing=sizing)
    assert [r.arm.capacity_under_load for r in result.rows] == [41, 112]
    assert [b.capacity_under_load for b in result.baselines[1]] == [16, 55]
    for kl, want in ((0.02, True), (0.0, False)):          # w16 recommended, then w64
        for row in result.rows:
            row.quality = {"nr": {"kl": kl if row.plan.policy.w_max == 64 else 0.0, "nll_delta": 0.0}}
        sw.recommend(result, "kl", 0.01)
        out = io.StringIO()
        render(result, Console(file=out, width=250), user_flags=[], plan_dir=None)
        note = "note: under load this arm keeps 41 cached states, fewer than SGLang INT8's 55 at the same budget"
        assert (note in out.getvalue()) == want, out.getvalue()
        assert "under load (x Dense)" in out.getvalue() and "41 (2.56x) < INT8" in out.getvalue()
        assert "112 (7.00x) < INT8" not in out.getvalue() and "112 (7.00x)" in out.getvalue()
    # the row mark needs no --eval: without a recommendation w16's row still says it keeps fewer than INT8
    for row in result.rows:
        row.quality = None
    result.recommended = None
    out = io.StringIO()
    render(result, Console(file=out, width=250), user_flags=[], plan_dir=None)
    assert "41 (2.56x) < INT8" in out.getvalue()


def test_out_writes_the_plans_dasc_compile_writes(tmp_path):
    out = tmp_path / "plans"
    r = dasc("sweep", KIMI, "--wmax", "16,64", "--out", out)
    assert r.code == 0 and f"wrote 2 plans into {out}" in r.out
    names = sorted(p.name for p in out.iterdir())
    assert names == ["kimi-linear-48b-a3b-calibrated-w16.dasc", "kimi-linear-48b-a3b-calibrated-w64.dasc"]
    for w, name in zip((16, 64), names):
        assert dasc("compile", KIMI, "--wmax", w, "--out", tmp_path / f"c{w}").code == 0
        assert (out / name / "plan.json").read_bytes() == (tmp_path / f"c{w}" / "plan.json").read_bytes()
        assert dasc("inspect", out / name).code == 0
    again = dasc("sweep", KIMI, "--wmax", "16", "--out", out)          # never over an existing directory
    assert_one_error(again, str(out), "--out must be a new or empty directory")


def test_plot(tmp_path):
    png = tmp_path / "s.png"
    r = dasc("sweep", KIMI, "--wmax", "16,64", "--tp", "1,2", "--budget", BUDGET, "--max-running-requests", R,
             "--plot", png)
    assert r.code == 0 and png.stat().st_size > 10_000 and f"wrote {png}" in r.out and not r.err
    png.unlink()
    r = dasc("sweep", KIMI, "--wmax", "16", "--budget", BUDGET, "--max-running-requests", R, "--plot", png, "--json")
    assert r.code == 0 and png.exists() and f"wrote {png}" in r.err     # stdout holds only the JSON document
    assert json.loads(r.out)["rows"]


@pytest.mark.parametrize("args, needles", [
    (["--wmax", "4,x"], ["--wmax 4,x: 'x' is not a whole number in decimal digits", "expected comma-separated values"]),
    (["--wmax", "-1"], ["--wmax -1: expected whole numbers >= 0"]),
    (["--wmax", "16", "--tp", "0"], ["--tp 0: expected whole numbers >= 1"]),
    (["--wmax", "16", "--tp", "3"], ["tp_size", "3"]),
    (["--wmax", "16", "--int8", "maybe"], ["--int8 maybe: expected off, on or both"]),
    (["--wmax", "16", "--max-kl", "0.1"], ["--max-kl needs --eval PROMPTS"]),
    (["--wmax", "16", "--eval", "/"], ["--eval /: expected a JSON-lines prompt file", "it is a folder"]),
    (["--wmax", "16", "--eval", "retrieval:1", "--max-kl", "0.1", "--max-nll-delta", "0.1"], ["alternatives"]),
    (["--wmax", "16", "--budget", "8GiB"], ["--budget and --max-running-requests go together"]),
    (["--wmax", "16", "--budget", "lots", "--max-running-requests", "8"], ["--budget: expected a positive size"]),
    (["--wmax", "16", "--budget", "1GiB", "--max-running-requests", "8"], ["--budget 1.00 GiB (1,073,741,824 bytes) holds Dense M=23",
                                                                          "a --budget of at least"]),
    (["--wmax", "16", "--tp", "2", "--balance", "hybrid", "--budget", "8GiB", "--max-running-requests", "8"],
     ["the dasc runtime would refuse to start: the plan uses balance=hybrid"]),
    (["--wmax", "16", "--budget", "8GiB", "--max-running-requests", "8", "--mamba-radix-cache-strategy",
      "extra_buffer_lazy"], ["the dasc runtime would refuse to start: --mamba-radix-cache-strategy extra_buffer_lazy"]),
    (["--wmax", "16", "--refresh-slots", "2"], ["--refresh-slots", "with --budget"]),
    # an nr grid with --refresh-slots: sweep's own fix (--load-policy wr), not dasc size's advice to compile one
    (["--wmax", "16", "--budget", "8GiB", "--max-running-requests", "8", "--refresh-slots", "2"],
     ["--refresh-slots 2: the swept plans run no dasc-wr refresh (load policy nr); give --load-policy wr"]),
    # a sizing refusal names the point of the grid it came from
    (["--wmax", "4,16", "--budget", "1", "--max-running-requests", "8"], ["error: w_max 4 (", ".dasc): --budget 1 byte"]),
    # flags that act only with --eval / --budget are refused without it, never silently ignored
    (["--wmax", "16", "--prefix-len", "2048"], ["--prefix-len acts only with --eval PROMPTS"]),
    (["--wmax", "16", "--suffix-len", "8"], ["--suffix-len acts only with --eval PROMPTS"]),
    (["--wmax", "16", "--device", "cuda"], ["--device acts only with --eval PROMPTS"]),
    (["--wmax", "16", "--mamba-radix-cache-strategy", "no_buffer"], ["--mamba-radix-cache-strategy acts only with "
                                                                     "--budget"]),
    (["--wmax", "16", "--disable-overlap-schedule"], ["--disable-overlap-schedule acts only with --budget"]),
    (["--wmax", "16", "--eval", "nope.jsonl"], ["--eval nope.jsonl: expected a JSON-lines prompt file"]),
    # a value holding ':name:' is echoed as typed (rich would print retrieval:abc: as an emoji)
    (["--wmax", "16", "--eval", "retrieval:abc"], ["--eval retrieval:abc: retrieval:N takes a whole number of prompts "
                                                   "N (1 or more), got 'abc'"]),
    # sharegpt:-1 / sharegpt:abc were "no such file", an empty value "it is a folder": the expected form is named
    (["--wmax", "16", "--eval", "sharegpt:-1"], ["--eval sharegpt:-1: sharegpt:N takes a whole number of prompts N "
                                                 "(1 or more), got '-1'"]),
    (["--wmax", "16", "--eval", ""], ["--eval '': empty; expected a JSON-lines prompt file (dasc eval --prompts), "
                                      "sharegpt:N or retrieval:N"]),
    (["--wmax", "16", "--eval", "retrieval:1"], ["kimi"]),   # decay-only (or transformers < 5.17): eval cannot run it
    (["--wmax", "16", "--plot", "s.jpg"], ["--plot writes a PNG"]),
    # a value given twice was dropped without a word (the grid shrank); 1_6 and +16 were read as 16 by int()
    (["--wmax", "4,16,16"], ["--wmax 4,16,16: 16 given more than once; expected each value once"]),
    (["--wmax", "16", "--tp", "1,2,1"], ["--tp 1,2,1: 1 given more than once"]),
    (["--wmax", "1_6"], ["--wmax 1_6: '1_6' is not a whole number in decimal digits"]),
    (["--wmax", ""], ["--wmax is empty; expected comma-separated whole numbers"]),    # was "--wmax : ''"
    (["--wmax", "16", "--tp", " "], ["--tp is empty"]),
    (["--wmax", "4,+16"], ["--wmax 4,+16: '+16' is not a whole number"]),
    (["--wmax", "4,16.0"], ["--wmax 4,16.0: '16.0' is not a whole number"]),
    (["--wmax", "9" * 5000], ["--wmax 9999", "(5000 characters): '9999", "is too large (more than 19 characters)"]),
    (["--wmax", "4," + "1" * 20], ["'11111111111111111111' is too large (more than 19 characters)"]),
])
def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path, args, needles):
    before = snapshot(tmp_path)
    r = dasc("sweep", KIMI, *args, "--out", tmp_path / "plans", cwd=tmp_path)
    assert_one_error(r, *needles)
    assert snapshot(tmp_path) == before


def test_a_listed_value_of_19_digits_is_read_and_one_of_20_is_not():
    from dasc_compile.sweep import parse_int_list

    assert parse_int_list("4," + "9" * 19, "--wmax") == (4, 10**19 - 1)       # range checks name it later
    with pytest.raises(DascInputError, match=r"'9{20}' is too large \(more than 19 characters\)"):
        parse_int_list("4," + "9" * 20, "--wmax")


def test_recommendation_needs_every_smaller_w_max_within_the_budget(tmp_path):
    from dasc_compile import sweep as sw
    from dasc_compile.policy import Policy

    result = sw.run_sweep(KIMI, sw.SweepGrid(w_max=(4, 16, 64, 128), tp=(1,), int8=(False,), base=Policy()))
    for row, kl in zip(result.rows, (0.001, 0.004, 0.02, 0.003)):   # w128 passes alone: a lucky measurement
        row.quality = {"nr": {"kl": kl, "nll_delta": kl}}
    assert sw.recommend(result, "kl", 0.01) == 16
    assert sw.recommend(result, "kl", 0.0005) is None
    assert sw.recommend(result, "nll_delta", 1.0) == 128
    assert result.quality_budget == {"metric": "nll_delta", "max": 1.0, "arm": "nr"}


@pytest.mark.slow
@pytest.mark.transformers_range
def test_eval_on_the_trained_model_and_the_recommended_commands(tmp_path):
    from tests.eval.conftest import skip_without_kimi_linear

    skip_without_kimi_linear()     # the bundled trained model is a KDA hybrid: dasc eval needs transformers >= 5.17
    """The quality column is dasc eval's on the plan dasc compile writes, and the recommended commands
    compile that plan and serve it with the flags of its row."""
    from dasc_compile.eval.command import run_eval

    args = ["--wmax", "16,512", "--eval", "retrieval:1", "--prefix-len", 128, "--budget", "64MiB",
            "--max-running-requests", 4]
    doc = _json(dasc("sweep", TRAINED, *args, "--json"))
    kl = [r["quality"]["nr"]["kl"] for r in doc["rows"]]
    assert kl[0] < kl[1] and all(r["quality"]["random"]["kl"]["sd"] is not None for r in doc["rows"])
    assert doc["eval"]["protocol"]["prefix_len"] == 128 and doc["recommendation"] is None
    limit = (kl[0] + kl[1]) / 2
    text = dasc("sweep", TRAINED, *args, "--max-kl", limit)
    assert text.code == 0 and "* recommended: w_max 16," in text.out and "Random KL" in text.out
    lines = text.out.splitlines()
    compile_argv = shlex.split(next(ln for ln in lines if ln.strip().startswith("dasc compile ")))
    sglang = shlex.split(next(ln for ln in lines if ln.strip().startswith("python -m sglang.launch_server")))
    assert compile_argv[:3] == ["dasc", "compile", str(TRAINED)] and compile_argv[3:5] == ["--wmax", "16"]
    assert dasc(*compile_argv[1:], cwd=tmp_path).code == 0
    plan_dir = tmp_path / compile_argv[compile_argv.index("--out") + 1]
    assert sglang[:5] == ["python", "-m", "sglang.launch_server", "--model-path", str(TRAINED)]
    assert sglang[5:] == list(doc["rows"][0]["arm"]["flags"])
    size = _json(dasc("size", plan_dir.name, "--budget", "64MiB", "--max-running-requests", 4, "--json", cwd=tmp_path))
    assert size[2]["flags"] == doc["rows"][0]["arm"]["flags"]     # the plan path is the one compile wrote
    ref = run_eval(TRAINED, [plan_dir], retrieval=1, prefix_len=128, progress=False)
    assert ref["arms"] == doc["rows"][0]["quality"]


@pytest.mark.parametrize("signum, code", [(2, 130), (15, 143)])
def test_an_interrupted_eval_is_one_line_with_the_signals_status(tmp_path, monkeypatch, signum, code):
    """Ctrl-C / SIGTERM during ``--eval`` (``dasc eval``'s EvalInterrupted): the signal's exit status and one
    line, never 'internal error'; the plans are written after the evaluation, so none are."""
    from dasc_compile import sweep as sw
    from dasc_compile.eval.run import EvalInterrupted

    def interrupted(result, **kw):
        raise EvalInterrupted(3, 6, None, signum)

    monkeypatch.setattr(sw, "evaluate", interrupted)
    before = snapshot(tmp_path)
    r = dasc("sweep", KIMI, "--wmax", "16,64", "--eval", "retrieval:6", "--max-kl", "0.01", "--out",
             tmp_path / "plans", cwd=tmp_path)
    line = assert_one_error(r, "after 3 of 6 prompts; nothing written", code=code)
    assert "internal error" not in line and ("SIGINT" if signum == 2 else "SIGTERM") in line
    assert snapshot(tmp_path) == before


def test_a_wr_sweep_whose_replay_covers_the_whole_prefix_is_refused_before_the_model_runs():
    """A fresh user's `sweep --load-policy wr --prefix-len 64 --max-kl 0.001` recommended w_max 4096: dasc-wr
    replayed the whole 64-token prefix there (W_replay 64), so its KL was 0 by construction."""
    from dasc_compile import sweep as sw
    from dasc_compile.errors import DascInputError
    from dasc_compile.policy import Policy

    result = sw.run_sweep(KIMI, sw.SweepGrid(w_max=(16, 512), tp=(1,), int8=(False,), base=Policy(load_policy="wr")))
    caps = {r.plan.policy.w_max: r.plan.refresh.w_replay_cap for r in result.rows}
    assert caps[16] < caps[512]
    with pytest.raises(DascInputError) as exc:
        sw.evaluate(result, prefix_len=caps[512])
    msg = str(exc.value)
    assert msg.startswith(f"--prefix-len {caps[512]}: dasc-wr replays the whole cached prefix at w_max 512")
    assert "w_max 16 " not in msg
    nr = sw.run_sweep(KIMI, sw.SweepGrid(w_max=(512,), tp=(1,), int8=(False,), base=Policy()))
    sw._refuse_whole_prefix_replay([r.plan for r in nr.rows], 8)            # dasc-nr replays nothing: passes
    sw._refuse_whole_prefix_replay([r.plan for r in result.rows], caps[512] + 1)   # a longer prefix passes
