"""What ``dasc`` says of a command line before click parses it (``dasc_compile.cli_argv``) and of one with no
command: numbers not written as numbers, values click refuses without echoing them, one-value options given twice,
a bare ``dasc``, and error lines that must stay one line whatever a path holds."""

from __future__ import annotations

import json
from typing import Optional

import pytest

from tests.support.clihelp import assert_one_error, dasc, snapshot


@pytest.mark.parametrize("cmd, args, opt, value", [
    ("compile", ["--wmax", "1_6"], "--wmax", "1_6"),           # int() reads 1_6 as 16: a typo served as a plan
    ("compile", ["--wmax=+16"], "--wmax", "+16"),
    ("compile", ["--wmax", "16", "--random-seed", "3.0"], "--random-seed", "3.0"),
    ("compile", ["--wmax", "16", "--tp", "0_2"], "--tp", "0_2"),
    ("size", ["--max-running-requests", "0_8"], "--max-running-requests", "0_8"),
    ("reference", ["--seed", "1_0"], "--seed", "1_0"),
    ("compile", ["--wmax", "1_6.0"], "--wmax", "1_6.0"),      # the typer of the time reads 16.0 as an int via pydantic
    ("compile", ["--wmax=16.0"], "--wmax", "16.0"),
])
def test_an_integer_not_written_in_digits_is_named(tmp_path, gdn, cmd, args, opt, value):
    target = {"compile": [gdn, "--out", tmp_path / "p"], "size": [tmp_path / "plan"],
              "reference": ["kimi-linear-48b-a3b", "--out", tmp_path / "r"]}[cmd]
    before = snapshot(tmp_path)
    r = dasc(cmd, *target, *args, cwd=tmp_path)
    assert_one_error(r, f"option '{opt}': {value!r} is not written as a whole number in decimal digits",
                     f"'{opt} 16'", f"dasc {cmd} --help")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("wmax, code", [("016", 0), (" 16 ", 0), ("-5", 2)])
def test_digits_pass_and_other_bad_integers_keep_their_own_message(tmp_path, gdn, wmax, code):
    r = dasc("compile", gdn, "--wmax", wmax, "--out", tmp_path / "p")
    assert r.code == code, r.err
    assert "decimal digits" not in r.err    # 016 and ' 16 ' are 16 in digits (as sweep reads them); -5 is named by
    #                                         the w_max check


@pytest.mark.parametrize("opt, value, what, example", [
    ("--wmax", "abc", "a whole number in decimal digits", "16"),
    ("--wmax", "", "a whole number in decimal digits", "16"),
    ("--wmax", "-", "a whole number in decimal digits", "16"),
    ("--eps", "abc", "a decimal number (digits, an optional point and exponent)", "0.001"),
])
def test_a_value_with_no_digit_is_named_with_the_value(tmp_path, gdn, opt, value, what, example):
    """`--wmax abc` got click's 'Input should be a valid integer', which does not echo what was typed."""
    args = [opt, value] if opt == "--wmax" else ["--wmax", "16", opt, value]
    before = snapshot(tmp_path)
    r = dasc("compile", gdn, *args, "--out", tmp_path / "p")
    assert_one_error(r, f"option '{opt}': {value!r} is not {what}; expected e.g. '{opt} {example}' "
                        f"(see 'dasc compile --help')")
    assert snapshot(tmp_path) == before


def test_a_non_finite_float_is_left_to_the_policy_which_names_it(tmp_path, gdn):
    r = dasc("compile", gdn, "--wmax", "16", "--a-s", "-inf", "--out", tmp_path / "p")
    assert_one_error(r, "error: --a-s -inf: Input should be a finite number (policy field 'a_s')")


@pytest.mark.parametrize("value", ["1e400", "-1E+400", " 2e308 "])
def test_a_float_beyond_its_range_is_named_as_typed(tmp_path, gdn, value):
    """`--a-s 1e400` was refused as `--a-s inf`: a value the user never typed."""
    before = snapshot(tmp_path)
    r = dasc("compile", gdn, "--wmax", "16", "--a-s", value, "--out", tmp_path / "p")
    assert_one_error(r, f"option '--a-s': {value!r} is beyond the range of a float (it would read as infinity)")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("opt, value", [("--a-s", "1e-400"), ("--eps", "-2.5E-999"), ("--a-s", " .1e-330 ")])
def test_a_float_below_its_smallest_value_is_named_as_typed(tmp_path, gdn, opt, value):
    """`--a-s 1e-400` compiled silently with a_s = 0, and `--eps 1e-400` was refused as `--eps 0`."""
    before = snapshot(tmp_path)
    r = dasc("compile", gdn, "--wmax", "16", opt, value, "--out", tmp_path / "p")
    assert_one_error(r, f"option '{opt}': {value!r} is below the smallest float (it would read as 0)")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("value", ["0e-999", "-0", "0.000"])
def test_a_zero_written_as_zero_passes_the_prepass(tmp_path, gdn, value):
    r = dasc("compile", gdn, "--wmax", "16", "--eps", value, "--out", tmp_path / "p")
    assert "smallest float" not in r.err and "Input should be greater than 0" in r.err, r.err   # the policy's range


def test_the_largest_float_still_passes_the_prepass(tmp_path, gdn):
    r = dasc("compile", gdn, "--wmax", "16", "--eps", "1.7e308", "--out", tmp_path / "p")
    assert "range of a float" not in r.err and "Input should be less than 1" in r.err, r.err   # the policy's range


@pytest.mark.parametrize("cmd, args, opt, first, second", [
    ("compile", ["--wmax", "16", "--wmax=64"], "--wmax", "16", "64"),
    ("compile", ["--wmax", "16", "--out", "A", "--out", "B"], "--out", "A", "B"),
    ("compile", ["--wmax", "abc", "--wmax", "16,64"], "--wmax", "abc", "16,64"),
    ("sweep", ["--wmax", "4,16", "--tp", "1", "--tp", "2"], "--tp", "1", "2"),
    ("eval", ["--plan", "P", "--prefix-len", "8", "--prefix-len", "16"], "--prefix-len", "8", "16"),
])
def test_a_one_value_option_given_twice_is_named(tmp_path, gdn, cmd, args, opt, first, second):
    before = snapshot(tmp_path)
    r = dasc(cmd, gdn, *args, cwd=tmp_path)
    assert_one_error(r, f"option '{opt}' given twice ({first!r}, then {second!r})", f"dasc {cmd} --help")
    assert snapshot(tmp_path) == before


def test_options_that_take_several_values_and_flags_may_repeat(tmp_path, gdn):
    r = dasc("compile", gdn, "--wmax", "16", "--out", tmp_path / "p", "--quiet", "--quiet")
    assert r.code == 0, r.err
    r = dasc("eval", gdn, "--plan", tmp_path / "p", "--plan", tmp_path / "p", "--horizons", "--json", tmp_path / "h")
    assert "given twice" not in r.err


def test_a_float_written_with_an_underscore_is_named(tmp_path, gdn):
    r = dasc("compile", gdn, "--wmax", "16", "--eps", "1_0e-4", "--out", tmp_path / "p")
    assert_one_error(r, "option '--eps': '1_0e-4' is not written as a decimal number", "'--eps 0.001'")
    assert not (tmp_path / "p").exists()
    assert dasc("compile", gdn, "--wmax", "16", "--eps", "1e-4", "--a-s", "-.5", "--out", tmp_path / "q").code == 0


@pytest.mark.parametrize("args", [["--wmax", "16", "--out", "P", "--wmax"], ["--wmax=16", "--wmax="]])
def test_a_repeat_without_a_value_is_left_to_click(tmp_path, gdn, args):
    r = dasc("compile", gdn, *[str(tmp_path / a) if a == "P" else a for a in args])
    line = assert_one_error(r)
    assert "given twice" not in line


@pytest.mark.parametrize("args", [["--wmax", "1_6", "--help"], ["--wmax", "16", "--wmax", "64", "--help"],
                                  ["--help", "--int8", "--no-int8"]])
def test_help_is_answered_before_the_number_and_repeat_checks(tmp_path, gdn, args):
    r = dasc("compile", gdn, *args, "--out", tmp_path / "p")
    assert r.code == 0 and "Usage" in r.out and not r.err
    assert not (tmp_path / "p").exists()


def test_words_after_the_separator_are_arguments_not_repeats(tmp_path, gdn):
    r = dasc("compile", gdn, "--wmax", "16", "--out", tmp_path / "p", "--", "--wmax", "64")
    line = assert_one_error(r)
    assert "given twice" not in line and "extra argument" in line


def test_a_value_repeated_as_it_was_is_no_conflict(tmp_path, gdn):
    r = dasc("compile", gdn, "--wmax", "16", "--wmax=16", "--out", tmp_path / "p", "-q")
    assert r.code == 0, r.err
    assert json.loads((tmp_path / "p" / "plan.json").read_text())["policy"]["w_max"] == 16


@pytest.mark.parametrize("flags", [["--int8", "--no-int8"], ["--no-int8", "--int8"]])
def test_a_flag_given_both_ways_is_named(tmp_path, gdn, flags):
    before = snapshot(tmp_path)
    r = dasc("compile", gdn, "--wmax", "16", *flags, "--out", tmp_path / "p", cwd=tmp_path)
    assert_one_error(r, f"options '{flags[0]}' and '{flags[1]}' both given", "dasc compile --help")
    assert snapshot(tmp_path) == before


def test_number_options_are_found_in_either_optional_spelling():
    """A new option annotated ``int | None`` rather than ``Optional[int]`` must be checked too."""
    import typer
    from typer.main import get_command

    from dasc_compile.cli_argv import _number_options

    demo = typer.Typer()

    @demo.command()
    def one(a: Optional[int] = typer.Option(None, "--a"), b: "int | None" = typer.Option(None, "--b"),
            c: float = typer.Option(0.0, "--c"), d: Optional[str] = typer.Option(None, "--d")) -> None:
        """one"""

    @demo.command()
    def two() -> None:
        """two"""

    found = _number_options(get_command(demo).commands["one"])
    assert found == {"--a": int, "--b": int, "--c": float}


def test_a_bare_dasc_prints_the_help_and_says_why_it_exits_2(tmp_path):
    """A bare `dasc` printed its help and exited 2 with nothing on stderr: a script saw a failure with no line."""
    r = dasc(cwd=tmp_path)
    assert "compile" in r.out and "Usage" in r.out
    assert_one_error(r, "error: no command given; choose one of compile, eval, inspect, reference, size, sweep "
                        "(see 'dasc --help')")


@pytest.mark.parametrize("cmd, args, opt, value, what", [
    ("compile", ["--wmax", "16,x"], "--wmax", "16,x", "is not written as a whole number in decimal digits"),
    ("compile", ["--wmax", "16,"], "--wmax", "16,", "is not written as a whole number in decimal digits"),
    ("compile", ["--wmax", "abc,def"], "--wmax", "abc,def", "is not a whole number in decimal digits"),
    ("compile", ["--wmax", "16,16"], "--wmax", "16,16", "is a list, not one whole number"),   # no sweep hint
    ("compile", ["--wmax", "16", "--tp", "1,2"], "--tp", "1,2", "is a list, not one whole number"),
    ("compile", ["--wmax", "16", "--eps", "1,5"], "--eps", "1,5",                          # a decimal comma
     "is not written as a decimal number (digits, an optional point and exponent)"),
])
def test_a_comma_click_would_refuse_without_the_value_is_named(tmp_path, gdn, cmd, args, opt, value, what):
    """Only a --wmax list that `dasc sweep` could take (`16,64`, or a shell-split `16, 64`) is left to click and its
    sweep hint; `16,x`, `16,16`, `--tp 1,2` and a decimal comma got click's line without the value."""
    r = dasc(cmd, gdn, *args, "--out", tmp_path / "p")
    assert_one_error(r, f"option '{opt}': {value!r} {what}; expected e.g. '{opt} ")


@pytest.mark.parametrize("wmax", [["--wmax", "16,64"], ["--wmax", "16,", "64"]])
def test_a_wmax_list_sweep_could_take_keeps_the_sweep_hint(tmp_path, gdn, wmax):
    assert_one_error(dasc("compile", gdn, *wmax, "--out", tmp_path / "p"), "run 'dasc sweep MODEL --wmax 16,64'")


def test_a_long_value_is_echoed_cut(tmp_path, gdn):
    line = assert_one_error(dasc("compile", gdn, "--wmax", "x" * 3000, "--out", tmp_path / "p"),
                            "option '--wmax': 'xxx", "...", "is not a whole number")
    assert len(line) < 400, len(line)


@pytest.mark.parametrize("value, digits", [("9" * 5000, "5,000"), ("0" * 4400 + "16", "4,402")])
def test_a_whole_number_longer_than_python_reads_is_named_by_its_option(tmp_path, gdn, value, digits):
    """click's own line ("exceeded maximum size") named neither the option nor the value; leading zeros count, as
    they do for int()."""
    r = dasc("compile", gdn, "--wmax", value, "--out", tmp_path / "p")
    assert_one_error(r, f"error: option '--wmax': a whole number written with {digits} digits, more than Python "
                        f"reads (4,300); expected e.g. '--wmax 16' (see 'dasc compile --help')")


def test_dasc_double_dash_alone_is_a_missing_command(tmp_path):
    assert_one_error(dasc("--", cwd=tmp_path), "error: no command given; choose one of compile, eval, inspect, "
                                                 "reference, size, sweep (see 'dasc --help')")


def test_a_path_holding_a_line_break_stays_one_error_line(tmp_path, gdn):
    """A path with a newline gave a two- or three-line error (the path was printed as it is)."""
    odd = tmp_path / "nl\nfile"
    odd.write_text("x")
    shown = str(odd).replace("\n", "\\n")
    assert_one_error(dasc("reference", "qwen3.5-27b", "--out", odd / "x"),
                     f"error: {shown}/x: cannot create the directory ({shown} is a file, not a directory)")
    assert_one_error(dasc("inspect", tmp_path / "no\nplan"), f"error: {tmp_path}/no\\nplan: dasc plan not found")
    assert_one_error(dasc("compile", gdn, "--wmax", "16", "--out", odd / "x"), f"error: {shown}/x: ")


def test_every_line_break_splitlines_knows_is_escaped():
    from dasc_compile.errors import error_line

    line = error_line("a\nb\rc\x0bd\x0ce\x1cf\x85g\u2028h\u2029i")
    assert line == "error: a\\nb\\rc\\x0bd\\x0ce\\x1cf\\x85g\\u2028h\\u2029i"
    assert len(line.splitlines()) == 1
