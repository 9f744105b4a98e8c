"""The serving report tools' input contract (session 21's fresh-user pass): bad input is one ``error:`` line and
exit status 2, ``--out`` is written all or none, a file or folder given twice is refused, ``rates`` never pools
two conditions, and Ctrl-C or a closed pipe never prints a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import serving_report as sr
from tests.benchmarks.test_chat_protocol import _run, _work
from tests.benchmarks.test_serving_pool import _arm

REPO = Path(__file__).resolve().parents[2]


def _one_error(capsys, *needles) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for n in needles:
        assert n in err, err
    return err


def _summary(tmp_path: Path, objs, name="summary.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(objs))
    return p


def test_report_keeps_the_earlier_pair_when_one_file_cannot_be_written(tmp_path, capsys):
    w = _work(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("old summary")
    (out / "tables.md").mkdir()                      # tables.md cannot be written: nothing may change
    argv = [str(w), "--out", str(out), "--model", "m", "--decays", "init", "--exclude-call", "1", "--overwrite"]
    assert sr.main(argv) == 2
    _one_error(capsys, "tables.md")
    assert (out / "summary.json").read_text() == "old summary"
    assert sorted(p.name for p in out.iterdir()) == ["summary.json", "tables.md"]      # no temporary left
    (out / "tables.md").rmdir()
    assert sr.main(argv) == 0
    assert json.loads((out / "summary.json").read_text())[0]["model"] == "m"


def test_report_replaces_an_earlier_report_only_with_overwrite(tmp_path, capsys):
    w = _work(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("committed summary")
    argv = [str(w), "--out", str(out), "--model", "m", "--decays", "init", "--exclude-call", "1"]
    assert sr.main(argv) == 2
    _one_error(capsys, f"--out {out}", "already holds summary.json", "--overwrite")
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]
    assert (out / "summary.json").read_text() == "committed summary"
    assert sr.main(argv + ["--overwrite"]) == 0
    assert json.loads((out / "summary.json").read_text())[0]["model"] == "m"
    capsys.readouterr()
    assert sr.main(argv) == 2                         # now both files are there
    _one_error(capsys, "summary.json and tables.md", "replace them")
    with pytest.raises(SystemExit) as e:              # an abbreviation is not the flag (argparse would take it)
        sr.main(argv + ["--over"])
    assert e.value.code == 2
    _one_error(capsys, "--over")
    png = tmp_path / "map.png"
    png.write_bytes(b"committed figure")
    assert sr.main(["map", str(out / "summary.json"), "--out", str(png)]) == 2
    _one_error(capsys, f"--out {png}: the file exists", "--overwrite")
    assert png.read_bytes() == b"committed figure"


@pytest.mark.parametrize("flag", ["--model", "--decays"])
def test_report_refuses_an_empty_name(tmp_path, capsys, flag):
    argv = [str(_work(tmp_path)), "--out", str(tmp_path / "o"), "--model", "m", "--decays", "init"]
    argv[argv.index(flag) + 1] = " "
    with pytest.raises(SystemExit) as e:              # the parser's refusal (run_guarded makes it the status)
        sr.main(argv)
    assert e.value.code == 2
    _one_error(capsys, flag)
    assert not (tmp_path / "o").exists()


def test_report_refuses_x_sat_without_open_loop_runs(tmp_path, capsys):
    assert sr.main([str(_work(tmp_path)), "--out", str(tmp_path / "o"), "--model", "m", "--decays", "init",
                    "--exclude-call", "1", "--x-sat", "0.45"]) == 2
    _one_error(capsys, "--x-sat", "no open-loop run")


def test_pooled_names_the_arm_and_field_of_a_malformed_summary(tmp_path, capsys):
    good = _arm("w16", dense={"t/1": 0.6})
    no_protocol = {k: v for k, v in good.items() if k != "protocol"}
    assert sr.main(["pooled", str(_summary(tmp_path, [no_protocol]))]) == 2
    _one_error(capsys, "arm w16", "'protocol'", "missing")
    assert sr.main(["pooled", str(_summary(tmp_path, [{**good, "ttft_ratio_vs_dense_by_seed": "0.6"}]))]) == 2
    _one_error(capsys, "arm w16", "ttft_ratio_vs_dense_by_seed", "per-seed ratios")
    assert sr.main(["map", str(_summary(tmp_path, [{**good, "pad_tokens": "6000"}])),
                    "--out", str(tmp_path / "m.png")]) == 2
    _one_error(capsys, "'pad_tokens'")


def test_pooled_refuses_one_summary_given_twice(tmp_path, capsys):
    s = _summary(tmp_path, [_arm("w16", dense={"t/1": 0.6})])
    assert sr.main(["pooled", str(s), str(tmp_path / "." / "summary.json")]) == 2
    _one_error(capsys, "given twice")
    assert sr.main(["pooled", str(s)]) == 0


def test_map_refuses_an_out_it_cannot_write(tmp_path, capsys):
    s = _summary(tmp_path, [_arm("w16", dense={"t/1": 0.6})])
    (tmp_path / "d.png").mkdir()
    assert sr.main(["map", str(s), "--out", str(tmp_path / "d.png")]) == 2
    _one_error(capsys, "cannot write the plot")


def test_rates_never_pools_two_conditions():
    pad0 = ("closed-loop-paper", "served-reply", 0, 256, 24, None, 24, 0)
    pad6k = ("closed-loop-paper", "served-reply", 6000, 256, 24, None, 24, 0)
    runs = [_run("dense", 0, 2.0, wall=48.0, cond=pad0), _run("dense", 1, 2.0, wall=60.0, cond=pad6k)]
    with pytest.raises(sr.DascInputError, match=r"2 conditions .*pad 0.*pad 6000.*--pad"):
        sr.open_loop_rates(runs, [0.5])
    assert sr.open_loop_rates(runs[:1], [0.5])["x_sat"]["mean"] == pytest.approx(0.5)


def test_rates_refuses_a_folder_given_twice_and_picks_a_pad(tmp_path, capsys):
    w = _work(tmp_path)
    assert sr.main(["rates", str(w), str(w), "--exclude-call", "1"]) == 2
    _one_error(capsys, f"{w} is the same work folder, given twice")
    other = w.parent / ".." / w.parent.name / w.name               # another spelling of the same folder
    assert sr.main(["rates", str(w), str(other), "--exclude-call", "1"]) == 2
    _one_error(capsys, f"{other} and {w} are the same work folder, given twice")
    assert sr.main(["rates", str(w), "--pad", "6000"]) == 2
    _one_error(capsys, "no run at --pad 6000", "present: pad 0, served-reply")
    assert sr.main(["rates", str(w), "--pad", "0", "--rho", "0.5"]) == 0
    assert json.loads(capsys.readouterr().out)["x_sat"]["n"] == 1
    for rho in ("0", "1", "1.5"):          # one range, said once: (0, 1) ([0, 1] at parse time said otherwise)
        with pytest.raises(SystemExit) as info:
            sr.main(["rates", str(w), "--rho", rho])
        err = _one_error(capsys, "--rho", "expected a fraction in (0, 1)")
        assert info.value.code == 2 and str(w) not in err


def _script(args, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "benchmarks.serving_report", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_a_closed_pipe_prints_no_traceback(tmp_path):
    objs = [_arm(f"w{i}", dense={"t/1": 0.6}) for i in range(400)]     # a long table, more than a pipe buffer
    p = _script(["pooled", str(_summary(tmp_path, objs))])
    p.stdout.readline()
    p.stdout.close()                                                 # `| head -1`
    err = p.stderr.read()
    assert p.wait(timeout=120) == 0 and "Traceback" not in err, err


def test_ctrl_c_is_one_line(tmp_path):
    fifo = tmp_path / "summary.json"
    os.mkfifo(fifo)                          # opening it blocks until a writer comes: the signal lands in the body
    p = _script(["pooled", str(fifo)])
    time.sleep(3.0)                          # past the imports (run_guarded's handlers are in place)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "Traceback" not in err and err.strip().count("\n") == 0, err
    assert err.startswith("error: interrupted (SIGINT)"), err



def _two_summaries(tmp_path, gpu_a="NVIDIA H200", gpu_b="NVIDIA H200"):
    """Two sessions' summary.json files of one arm: seed t/1 at 0.6 and seed t/2 at 0.8 (pooled: 0.700, SD 0.141)."""
    paths = []
    for name, seed, ratio, gpu in (("a", "t/1", 0.6, gpu_a), ("b", "t/2", 0.8, gpu_b)):
        (tmp_path / name).mkdir()
        paths.append(str(_summary(tmp_path / name, [_arm("w16", dense={seed: ratio}, gpu=gpu)])))
    return paths


def _w16_rows(capsys) -> list:
    return [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| w16")]


def test_summaries_may_follow_an_option(tmp_path, capsys):
    """`pooled a.json --pad 6000 b.json`: the summary after the option is read, not refused as unrecognised
    (argparse's plain parse stops a `+` positional at the first option)."""
    sa, sb = _two_summaries(tmp_path)
    assert sr.main(["pooled", sa, "--pad", "6000", sb]) == 0
    row = _w16_rows(capsys)
    assert len(row) == 1 and "0.700 (0.141), n = 2" in row[0]


def test_map_and_report_take_inputs_after_an_option(tmp_path, capsys):
    sa, sb = _two_summaries(tmp_path)
    png = tmp_path / "m.png"
    assert sr.main(["map", sa, "--out", str(png), sb]) == 0 and png.stat().st_size > 0
    w = _work(tmp_path)                     # the main command: a work folder after --out and the other options
    assert sr.main(["--out", str(tmp_path / "o"), "--model", "m", "--decays", "init", "--exclude-call", "1",
                    str(w)]) == 0
    assert json.loads((tmp_path / "o" / "summary.json").read_text())[0]["model"] == "m"


def test_pooled_writes_out_only_where_told(tmp_path, capsys):
    s = _summary(tmp_path, [_arm("w16", dense={"t/1": 0.6, "t/2": 0.8})])
    out = tmp_path / "pooled.md"
    assert sr.main(["pooled", str(s), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == printed and "0.700 (0.141), n = 2" in printed
    assert sr.main(["pooled", str(s), "--out", str(out)]) == 2          # no silent replacement
    _one_error(capsys, f"--out {out}: the file exists", "--overwrite")
    assert sr.main(["pooled", str(tmp_path / "sumary.json"), "--out", str(out), "--overwrite"]) == 2
    _one_error(capsys, "sumary.json: does not exist")
    assert out.read_text() == printed                                    # a failed run leaves it as it was
    assert sr.main(["pooled", str(tmp_path)]) == 2
    _one_error(capsys, f"{tmp_path}: is a folder, not the serving_report summary.json")
    with pytest.raises(SystemExit):
        sr.main(["pooled", ""])
    _one_error(capsys, "expected a summary.json file, got ''")


def test_pooled_joins_a_card_named_in_another_case(tmp_path, capsys):
    """A hand-typed lower-case --gpu-name (on a folder that recorded no card) and the recorded name are one card."""
    sa, sb = _two_summaries(tmp_path, gpu_a="NVIDIA H100 80GB HBM3", gpu_b="nvidia h100 80gb hbm3")
    assert sr.main(["pooled", sa, sb]) == 0
    rows = _w16_rows(capsys)
    assert len(rows) == 1 and "H100 80GB HBM3" in rows[0] and "n = 2" in rows[0]
