"""Every benchmark script refuses bad flags with one ``error:`` line and exit status 2 (benchmarks/cli_args.py).

argparse's own parser prints a usage block first; the scripts a serving engineer re-runs a claim with
(``run_chat``, ``prepare``, the benches) printed it until session 19.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.cli_args import OneLineParser

REPO = Path(__file__).resolve().parents[2]


def test_no_benchmark_script_builds_a_plain_argparse_parser():
    plain = [str(p.relative_to(REPO)) for p in sorted((REPO / "benchmarks").rglob("*.py"))
             if re.search(r"\bargparse\.ArgumentParser\(", p.read_text())]
    assert plain == [], f"use benchmarks.cli_args.OneLineParser in: {plain}"


def test_subcommands_inherit_the_one_line_refusal(capsys):
    ap = OneLineParser(prog="x")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{up}")
    sub.add_parser("up").add_argument("--n", type=int, required=True)
    for argv, expected in (([], "error: the following arguments are required: {up}"),
                           (["up"], "error: the following arguments are required: --n"),
                           (["up", "--n", "x"], "error: argument --n: invalid int value: 'x'")):
        with pytest.raises(SystemExit) as e:
            ap.parse_args(argv)
        assert e.value.code == 2
        assert capsys.readouterr().err.strip().splitlines() == [expected]


def test_no_parser_takes_an_abbreviated_flag(capsys):
    """``--over`` must not silently mean ``--overwrite`` (argparse's default): in both twins of the parser."""
    from dasc_runtime.one_line_parser import OneLineParser as RuntimeParser

    for cls in (OneLineParser, RuntimeParser):
        ap = cls(prog="x")
        ap.add_argument("--overwrite", action="store_true")
        with pytest.raises(SystemExit) as e:
            ap.parse_args(["--over"])
        assert e.value.code == 2
        assert capsys.readouterr().err.strip().splitlines() == ["error: unrecognized arguments: --over"]
        assert ap.parse_args(["--overwrite"]).overwrite


@pytest.mark.parametrize("argv, expected", [
    (["benchmarks.run_chat", "run", "--bogus"], "error: the following arguments are required: --trace, --seeds, --work"),
    (["benchmarks.run_chat", "nope"], "error: argument {up,run,down}: invalid choice: 'nope' (choose from "),
    (["benchmarks.train.prepare"], "error: the following arguments are required: {data,stage}"),
])
def test_scripts_refuse_in_one_line(argv, expected):
    r = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()    # (how argparse quotes the choices differs between Pythons)
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith(expected), (r.returncode, r.stderr)


def test_device_scripts_import_from_a_bare_checkout():
    """Device calls run the trainer and the chat client from a bare checkout (no dasc installed), where the runtime
    folder is not the ``dasc_runtime`` package: those scripts, and the compiler modules they use
    (``dasc_compile.refckpt`` draws a fresh start's decays), must import without it. An import of
    ``dasc_runtime.one_line_parser`` at the top of ``benchmarks/cli_args.py`` broke every chat run."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; sys.modules['dasc_runtime'] = None\n"       # any import of it fails, as on the device
            "import benchmarks.cli_args, benchmarks.run_chat, benchmarks.train.train, benchmarks.train.models\n"
            "import dasc_compile.refckpt, dasc_compile.calibrated\n"
            "print('ok')\n")
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
