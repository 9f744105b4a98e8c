"""Bad policy files and flags (issue 13, item 3): strict YAML types, unique keys, bounded aliases, short echoes.

Every case runs ``dasc compile MODEL --policy FILE`` through the real CLI entry and asserts exit 2, one
``error:`` line naming the file and the field, and that nothing was written.
"""

from __future__ import annotations

import os
import time

import pytest

from tests.support.clihelp import assert_one_error, dasc, deadline, snapshot

BOMB = """\
a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
w_max: *g
"""
# the same expansion reached through the error message: a value pydantic echoes back
BOMB_ECHO = BOMB.replace("w_max: *g", "w_max: 16\nfamily: *g")

# (case id, policy text, words the error line must hold)
CASES = [
    ("w_max_true", "w_max: true\n", ["'w_max'", "valid integer", "True"]),
    ("w_max_false", "w_max: false\n", ["'w_max'", "valid integer"]),
    ("w_max_string", 'w_max: "64"\n', ["'w_max'", "valid integer", "'64'"]),
    ("w_max_float", "w_max: 16.5\n", ["'w_max'", "valid integer"]),
    ("w_max_list", "w_max: [16]\n", ["'w_max'", "valid integer"]),
    ("w_max_negative", "w_max: -1\n", ["'w_max'", "greater than or equal to 0"]),
    ("w_max_huge", "w_max: 99999999999999999999\n", ["'w_max'", "less than or equal to"]),
    ("int8_quoted_yes", 'w_max: 16\nint8: "yes"\n', ["'int8'", "valid boolean", "'yes'"]),
    ("int8_bare_yes", "w_max: 16\nint8: yes\n", ["'int8'", "valid boolean"]),   # YAML 1.2: 'yes' is a string
    ("int8_one", "w_max: 16\nint8: 1\n", ["'int8'", "valid boolean"]),
    ("tp_string", 'w_max: 16\ntp_size: "2"\n', ["'tp_size'", "valid integer"]),
    ("tp_huge", "w_max: 16\ntp_size: 1000000000\n", ["'tp_size'", "less than or equal to 4096"]),
    ("seed_bool", "w_max: 16\nrandom_seed: true\n", ["'random_seed'", "valid integer"]),
    ("seed_2_70", f"w_max: 16\nrandom_seed: {2**70}\n", ["'random_seed'", "less than or equal to"]),
    ("eps_string", 'w_max: 16\neps: "0.001"\n', ["'eps'", "valid number"]),
    ("eps_nan", "w_max: 16\neps: .nan\n", ["'eps'"]),
    ("a_s_inf", "w_max: 16\na_s: .inf\n", ["'a_s'", "finite"]),
    ("a_s_bool", "w_max: 16\na_s: true\n", ["'a_s'", "valid number"]),
    ("bound_positive", "w_max: 16\nsafe_gate_lower_bound: 2.0\n", ["'safe_gate_lower_bound'", "less than 0"]),
    ("bound_nan", "w_max: 16\nsafe_gate_lower_bound: .nan\n", ["'safe_gate_lower_bound'"]),
    ("balance_bare_bool", "w_max: 16\nbalance: false\n", ["'balance'", "quote the value"]),
    ("balance_unknown", "w_max: 16\nbalance: sideways\n", ["'balance'", "'sideways'"]),
    ("family_int", "w_max: 16\nfamily: 3\n", ["'family'"]),
    ("dtype_unknown", "w_max: 16\ntemporal_dtype: float8\n", ["'temporal_dtype'"]),
    ("pool_zero", "w_max: 16\npool_budget_bytes: 0\n", ["'pool_budget_bytes'", "greater than 0"]),
    ("unknown_key", "w_max: 16\nwmax_typo: 3\n", ["unknown policy key 'wmax_typo'", "known keys"]),
    ("non_string_key", "w_max: 16\n7: 3\n", ["policy keys must be field names", "7"]),
    ("duplicate_key", "w_max: 16\nint8: false\nw_max: 4\n", ["'w_max' appears twice", "lines 1 and 3"]),
    ("duplicate_key_nested", "w_max: 16\ntp_size: {a: 1, a: 2}\n", ["'a' appears twice"]),
    ("not_a_mapping", "- 1\n- 2\n", ["must be a YAML mapping", "list"]),
    ("scalar_document", "16\n", ["must be a YAML mapping", "int"]),
    ("two_documents", "w_max: 16\n---\nw_max: 4\n", ["not valid YAML"]),
    ("bad_yaml", "w_max: [16\n", ["not valid YAML", "line"]),
    ("tab_indent", "w_max:\n\t16\n", ["not valid YAML"]),
    ("alias_bomb", BOMB, ["expands", "more than 10000 nodes"]),
    ("alias_bomb_echoed", BOMB_ECHO, ["expands", "more than 10000 nodes"]),
    ("recursive_alias", "w_max: &a [*a]\n", ["policy"]),
    ("deep_nesting", "w_max: " + "[" * 100_000 + "]" * 100_000 + "\n", ["nested too deeply"]),
    ("long_value_echo", "w_max: 16\nfamily: " + "x" * 100_000 + "\n", ["'family'", "..."]),
    ("long_key_echo", "w_max: 16\n" + "k" * 1000 + ": 1\n", ["unknown policy key", "..."]),
]


@pytest.mark.parametrize("case, text, needles", CASES, ids=[c[0] for c in CASES])
def test_bad_policy_file_one_line_and_nothing_written(tmp_path, gdn, case, text, needles):
    pol = tmp_path / "p.yaml"
    pol.write_text(text)
    before = snapshot(tmp_path)
    t0 = time.monotonic()
    with deadline(30):
        r = dasc("compile", gdn, "--policy", pol, "--out", tmp_path / "plan")
    line = assert_one_error(r, "p.yaml", *needles)
    assert time.monotonic() - t0 < 10, f"{case} took {time.monotonic() - t0:.1f} s"
    assert len(line) < 400, line
    assert snapshot(tmp_path) == before


def test_recursive_alias_is_refused_not_followed(tmp_path, gdn):
    # a self-referencing anchor must neither hang nor recurse without bound
    pol = tmp_path / "p.yaml"
    pol.write_text("w_max: 16\nfamily: &a [*a, *a]\n")
    with deadline(30):
        r = dasc("compile", gdn, "--policy", pol, "--out", tmp_path / "plan")
    assert_one_error(r, "p.yaml")


@pytest.mark.parametrize("kind", ["binary", "nul_bytes", "latin1", "too_large", "directory", "fifo", "missing",
                                  "unreadable_symlink_loop"])
def test_policy_file_that_is_not_a_small_text_file(tmp_path, gdn, kind):
    pol = tmp_path / "p.yaml"
    needles = {"binary": "not UTF-8", "nul_bytes": "NUL", "latin1": "not UTF-8", "too_large": "bytes; expected at most",
               "directory": "is a directory", "fifo": "FIFO", "missing": "not found",
               "unreadable_symlink_loop": "cannot read"}[kind]
    if kind == "binary":
        pol.write_bytes(bytes(range(256)) * 4)
    elif kind == "nul_bytes":
        pol.write_bytes(b"w_max: 16\n\x00\x00\n")
    elif kind == "latin1":
        pol.write_bytes("w_max: 16\nfamily: caf\u00e9\n".encode("latin-1"))
    elif kind == "too_large":
        pol.write_text("w_max: 16\n" + "#" * (2 << 20) + "\n")
    elif kind == "directory":
        pol.mkdir()
    elif kind == "fifo":
        os.mkfifo(pol)
    elif kind == "unreadable_symlink_loop":
        os.symlink(pol, pol)
    before = snapshot(tmp_path)
    with deadline(20):
        r = dasc("compile", gdn, "--policy", pol, "--out", tmp_path / "plan")
    assert_one_error(r, "p.yaml", needles)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("text, field, value", [
    ("w_max: 16\neps: 1e-3\n", "eps", 1e-3),                       # YAML 1.2 float without a dot
    ("w_max: 16\nbalance: off\n", "balance", "off"),               # YAML 1.2: 'off' is a string
    ("w_max: 16\na_s: -1\n", "a_s", -1.0),                         # an integer for a float field
    ("w_max: 0x10\n", "w_max", 16),
    ("w_max: 016\n", "w_max", 16),                                 # decimal, not YAML 1.1 octal
    ("w_max: 16\nrandom_seed: ~\n", "random_seed", None),
])
def test_strict_policy_still_reads_ordinary_yaml(tmp_path, gdn, text, field, value):
    from dasc_compile.policy import resolve_policy

    pol = tmp_path / "p.yaml"
    pol.write_text(text)
    assert getattr(resolve_policy(pol), field) == value


@pytest.mark.parametrize("args, needles", [
    (["--wmax", "true"], ["option '--wmax': 'true' is not a whole number in decimal digits"]),
    (["--wmax", "16", "--random-seed", str(2**70)], [f"--random-seed {2**70}: ", "'random_seed'"]),
    (["--wmax", "16", "--tp", "0"], ["--tp 0: Input should be greater than or equal to 1", "'tp_size'"]),
    (["--wmax", "16", "--eps", "nan"], ["--eps nan: ", "'eps'"]),
    (["--wmax", "16", "--eps", "0"], ["error: --eps 0: Input should be greater than 0"]),     # it echoed 0.0
    (["--wmax", "16", "--eps", "1"], ["error: --eps 1: Input should be less than 1"]),
    (["--wmax", "16", "--balance", "x" * 5000], ["--balance xxx", "'balance'", "..."]),
    (["--wmax", "16", "--pool-budget", "-5"], ["--pool-budget: expected a positive size in bytes", "'-5'"]),
    (["--wmax", "16", "--pool-budget", "1.5B"], ["--pool-budget: '1.5B' is 1.5 bytes, not a whole number; give whole bytes such as 2"]),
    (["--wmax", "-1"], ["error: --wmax -1: Input should be greater than or equal to 0 (policy field 'w_max')"]),
])
def test_bad_flags(tmp_path, gdn, args, needles):
    before = snapshot(tmp_path)
    r = dasc("compile", gdn, *args, "--out", tmp_path / "plan")
    line = assert_one_error(r, *needles)
    assert len(line) < 400
    assert snapshot(tmp_path) == before


def test_pool_budget_takes_the_units_budget_takes(tmp_path):
    """``--pool-budget 1GiB`` is 2**30 bytes, as ``dasc size --budget`` reads it."""
    import json

    from tests.support.clihelp import ROOT, dasc
    r = dasc("compile", ROOT / "plans" / "reference" / "kimi-linear-48b-a3b-calibrated", "--wmax", "16",
             "--pool-budget", "1GiB", "--out", tmp_path / "p.dasc", "--no-kernels", "-q")
    assert r.code == 0, r.err
    assert json.loads((tmp_path / "p.dasc" / "plan.json").read_text())["policy"]["pool_budget_bytes"] == 2 ** 30
