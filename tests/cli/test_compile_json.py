"""``dasc compile --json`` (issue 22 item 3): the summary as one strict JSON document for tools."""

from __future__ import annotations

import json

from tests.support.clihelp import ROOT, assert_one_error, dasc, snapshot


def _strict(text: str) -> dict:
    def no_constant(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=no_constant)


def test_json_summary_is_the_written_plan(tmp_path, kda):
    r = dasc("compile", kda, "--wmax", 4, "--tp", 2, "--balance", "storage", "--out", tmp_path / "p", "--json")
    assert r.code == 0 and r.err == ""
    doc = _strict(r.out)
    plan = json.loads((tmp_path / "p" / "plan.json").read_text())
    assert doc["compile_format"] == 1 and doc["plan"] == str(tmp_path / "p" / "plan.json")
    assert doc["content_hash"] == plan["content_hash"] and doc["schema_version"] == plan["schema_version"]
    assert doc["totals"] == plan["totals"] and doc["policy"] == plan["policy"]
    assert doc["tp"]["tp_size"] == 2 and doc["tp"]["c_ckpt_tp"] == plan["tp"]["c_ckpt_tp"]
    assert doc["tp"]["bottleneck_bytes_per_slot"] == plan["tp"]["bottleneck_bytes_per_slot"]
    assert doc["model"] == {"model_type": "kimi_linear", "family": "kda", "num_recurrent_layers": 1}
    assert doc["kernels"] == plan["kernels"]["file"] and doc["warnings"] == []
    assert doc["provenance"] == {"kind": "trained", "line": "provenance: trained weights: hand-made test values"}


def test_json_summary_carries_the_warnings_and_infinity_as_plan_json_writes_it(tmp_path, gdn):
    r = dasc("compile", gdn, "--wmax", 10**6, "--out", tmp_path / "p", "--json", "--no-kernels")
    assert r.code == 0
    doc = _strict(r.out)
    (w,) = r.err_lines
    assert doc["warnings"] == [w.removeprefix("warning: ")] and "nothing is kept" in w
    assert doc["totals"]["c_temp_ragged"] == "Infinity" and doc["totals"]["n_kept"] == 0 and doc["kernels"] is None


def test_json_and_quiet_are_alternatives(tmp_path, gdn):
    before = snapshot(tmp_path)
    r = dasc("compile", gdn, "--wmax", 4, "--out", tmp_path / "p", "--json", "--quiet")
    assert_one_error(r, "--quiet and --json are alternatives")
    assert snapshot(tmp_path) == before


def test_json_keys_are_documented(tmp_path, kda):
    text = (ROOT / "docs" / "cli.md").read_text()
    doc = _strict(dasc("compile", kda, "--wmax", 4, "--out", tmp_path / "p", "--json").out)
    keys = set(doc) | set(doc["model"]) | set(doc["tp"]) | set(doc["refresh"]) | set(doc["provenance"])
    assert not sorted(k for k in keys if f"`{k}`" not in text), "undocumented dasc compile --json keys"


def test_a_two_way_flag_left_out_keeps_the_policy_files_value(tmp_path, gdn):
    """click 8.2.2 (yanked for it) under typer < 0.26 handed `--int8/--no-int8`'s unset default (None) to dasc as False, so a policy
    file's `int8: true` was dropped without a word (found at the dependency floors); a flag given still wins."""
    policy = tmp_path / "p.yaml"
    policy.write_text("w_max: 16\nint8: true\n")
    for i, (flags, int8) in enumerate([([], True), (["--no-int8"], False), (["--int8"], True)]):
        r = dasc("compile", gdn, "--policy", policy, *flags, "--out", tmp_path / f"p{i}", "--json")
        assert r.code == 0 and _strict(r.out)["policy"]["int8"] is int8, (flags, r.err)
