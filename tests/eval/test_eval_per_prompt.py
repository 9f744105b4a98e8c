"""Per-prompt values and paired summaries of ``dasc eval --json``: hand-built cases for the statistics,
and one tiny real run whose per-prompt values must average to the means it reports."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from dasc_compile.eval.metrics import mean_or_none
from dasc_compile.eval.protocol import (PAIRED_METRICS, PER_PROMPT, PlanCase, paired_difference, paired_summaries,
                                        per_prompt_values, rounded)
from tests.support.tiny_models import compile_for

pytestmark = pytest.mark.transformers_range

ROOT = Path(__file__).resolve().parents[2]


def _tol(values) -> float:
    """Absolute tolerance for a statistic of per-prompt values written to 6 significant digits (each off by
    at most 5e-6 of its size)."""
    return 1e-5 * max([abs(x) for x in values if x is not None] or [1.0])


def test_paired_difference_hand_case():
    # differences a - b: -0.1, 0.2, 0.0, 0.4 (the fifth prompt is not measured on b and is left out)
    d = paired_difference([0.1, 0.3, 0.2, 0.5, 0.9], [0.2, 0.1, 0.2, 0.1, None])
    assert d["n"] == 4 and d["mean"] == pytest.approx(0.125)
    # deviations -0.225, 0.075, -0.125, 0.275: squares sum 0.1475, over n - 1 = 3
    assert d["sd"] == pytest.approx(math.sqrt(0.1475 / 3))
    assert d["se"] == pytest.approx(math.sqrt(0.1475 / 3) / 2)
    assert d["frac_nr_lower"] == 0.25 and d["frac_tied"] == 0.25
    one = paired_difference([1.0], [3.0])
    assert (one["n"], one["mean"], one["sd"], one["se"], one["frac_nr_lower"]) == (1, -2.0, None, None, 1.0)
    assert paired_difference([None], [1.0]) == {"mean": None, "sd": None, "se": None, "n": 0, "frac_nr_lower": None,
                                                "frac_tied": None}


def _row(nll, nll_head, kl, retrieval=None, gen=0.5):
    """A score row as run_prompt appends it: dense NLL 1.0 (whole suffix) and 2.0 (first 16 tokens)."""
    return dict(nll=nll, dense_nll=1.0, nll_head=nll_head, dense_nll_head=2.0, kl=kl, kl_head=kl / 2, agreement=1.0,
                gen_agreement=None if retrieval is not None else gen, retrieval=retrieval, distance=None)


def test_paired_summaries_hand_case():
    case = PlanCase(plan=None, label="hand", grids=[], random_grids={})
    case.scores = {"nr": [_row(1.1, 2.1, 0.2), _row(1.0, 2.5, 0.4), _row(1.3, 2.0, 0.0, retrieval=1.0)],
                   "init": [_row(1.2, 2.4, 0.1), _row(1.0, 2.2, 0.4), _row(1.5, 2.3, 0.3, retrieval=0.0)]}
    case.random_scores = {1: [_row(1.2, 2.2, 0.3), _row(1.4, 2.6, 0.5), _row(1.5, 2.4, 0.2, retrieval=0.0)],
                          2: [_row(1.4, 2.4, 0.5), _row(1.2, 2.2, 0.7), _row(1.7, 2.2, 0.4, retrieval=1.0)]}
    v = per_prompt_values(case)
    assert v["nr"]["nll_delta_head"] == pytest.approx([0.1, 0.5, 0.0])
    assert v["nr"]["retrieval_acc"] == [None, None, 1.0] and v["nr"]["gen_agreement"] == [0.5, 0.5, None]
    # Random per prompt: the mean of the two masks
    assert v["random"]["mean"]["nll_delta_head"] == pytest.approx([0.3, 0.4, 0.3])
    assert v["random"]["mean"]["retrieval_acc"] == [None, None, 0.5]
    assert set(v["random"]["per_seed"]) == {"1", "2"}
    p = paired_summaries(v)
    assert set(p) == {"nr_minus_init", "nr_minus_random"} and set(p["nr_minus_init"]) == set(PAIRED_METRICS)
    # nr - init, first 16 tokens: -0.3, 0.3, -0.3 -> mean -0.1, SD sqrt((0.04 + 0.16 + 0.04) / 2)
    d = p["nr_minus_init"]["nll_delta_head"]
    assert d["mean"] == pytest.approx(-0.1) and d["sd"] == pytest.approx(math.sqrt(0.12))
    assert d["n"] == 3 and d["frac_nr_lower"] == pytest.approx(2 / 3) and d["frac_tied"] == 0.0
    # nr - Random, KL: 0.2 - 0.4, 0.4 - 0.6, 0.0 - 0.3 -> every prompt lower
    d = p["nr_minus_random"]["kl"]
    assert d["mean"] == pytest.approx(-0.7 / 3) and d["frac_nr_lower"] == 1.0
    # nr - init, KL: 0.1, 0.0, -0.3: one tie
    d = p["nr_minus_init"]["kl"]
    assert d["frac_tied"] == pytest.approx(1 / 3) and d["frac_nr_lower"] == pytest.approx(1 / 3)
    # only the arms that ran are compared
    assert set(paired_summaries({"nr": v["nr"], "init": v["init"]})) == {"nr_minus_init"}
    assert paired_summaries({"init": v["init"]}) == {}
    assert rounded({"a": [1 / 3, None, 123456789.0]}) == {"a": [0.333333, None, 123457000.0]}



def test_paired_line_counts_lower_and_tied_prompts():
    from dasc_compile.eval.command import paired_lines

    d = paired_difference([0.1, 0.3, 0.2, 0.5], [0.2, 0.1, 0.2, 0.1])
    lines = paired_lines({"nr_minus_init": {"nll_delta_head": d, "kl_head": paired_difference([1.0], [1.0])}}, {})
    assert lines == [f"paired over prompts, dasc-nr − init-horizon masks: ΔNLL 1st 16 +0.1250 (SD {d['sd']:.4f}, n 4, "
                     "nr lower on 1, tied on 1); KL 1st 16 +0.0000 (SD -, n 1, nr lower on 0, tied on 1)"]


@pytest.fixture(scope="module")
def run(gdn_dir, tmp_path_factory):
    """One plan, one text and one retrieval prompt, every arm and both controls, through the CLI's JSON."""
    from dasc_compile.eval.run import run_eval, write_json

    d = tmp_path_factory.mktemp("pp")
    prompts = d / "p.jsonl"
    prompts.write_text(json.dumps({"text": "User: tell me about rivers.\n\nAssistant: Rivers carry water " * 3}) + "\n")
    doc = run_eval(gdn_dir, [compile_for(gdn_dir, 4, d / "w4.dasc")], prompts_file=prompts, retrieval=1,
                   arms="dense,nr,wr,random,init,untrained", init_seed=0, prefix_len=80, suffix_len=8, gen_tokens=3,
                   progress=False)
    write_json(doc, d / "r.json")
    return json.loads((d / "r.json").read_text())


def test_per_prompt_values_average_to_the_means(run):
    entry = run["plans"][0]
    prompts = run["protocol"]["prompts"]
    assert [p["index"] for p in prompts] == [0, 1] and [p["kind"] for p in prompts] == ["text", "niah_single"]
    assert prompts[0]["distance"] is None and prompts[1]["distance"] > 0
    assert all(re.fullmatch(r"[0-9a-f]{64}", p["sha256"]) for p in prompts) and prompts[0]["sha256"] != prompts[1]["sha256"]
    for pp_key, mean_key in (("per_prompt", "arms"), ("untrained_per_prompt", "untrained")):
        pp, means = entry[pp_key], entry[mean_key]
        assert set(pp) == set(means)
        for arm in means:
            vals = pp[arm]["mean"] if arm == "random" else pp[arm]
            assert set(vals) == set(PER_PROMPT) and all(len(v) == 2 for v in vals.values())
            for m in PER_PROMPT:
                want = means[arm][m]["mean"] if arm == "random" else means[arm][m]
                assert mean_or_none(vals[m]) == pytest.approx(want, abs=_tol(vals[m])), (pp_key, arm, m)
        for seed, vals in pp["random"]["per_seed"].items():
            for m in PER_PROMPT:
                assert mean_or_none(vals[m]) == pytest.approx(means["random"]["per_seed"][seed][m], abs=_tol(vals[m]))
    a = entry["per_prompt"]
    assert a["nr"]["retrieval_acc"][0] is None and a["nr"]["retrieval_acc"][1] in (0.0, 1.0)
    assert a["nr"]["gen_agreement"][1] is None and a["dense"]["nll_delta"] == [0.0, 0.0]
    # retrieval beyond w_max follows from the flags and the prompts' distances
    w_max = entry["plan"]["w_max"]
    far = [f for f, p in zip(a["nr"]["retrieval_acc"], prompts) if f is not None and p["distance"] > w_max]
    assert entry["arms"]["nr"]["n_retrieval_far"] == len(far) == 1
    assert entry["arms"]["nr"]["retrieval_acc_far"] == far[0]


def test_paired_summaries_follow_from_the_per_prompt_values(run):
    entry = run["plans"][0]
    a = entry["per_prompt"]
    assert set(entry["paired"]) == {"nr_minus_init", "nr_minus_random"}
    for name, other in (("nr_minus_init", a["init"]), ("nr_minus_random", a["random"]["mean"])):
        for m in PAIRED_METRICS:
            want = paired_difference(a["nr"][m], other[m])
            got = entry["paired"][name][m]
            assert got["n"] == 2 and got["frac_nr_lower"] == want["frac_nr_lower"]
            tol = 2 * _tol(a["nr"][m] + other[m])
            assert got["mean"] == pytest.approx(want["mean"], abs=tol) and got["sd"] == pytest.approx(want["sd"], abs=2 * tol)
    assert set(entry["untrained_paired"]) == {"nr_minus_random"}      # the untrained control has no init arm


def test_eval_json_keys_are_documented(run):
    """Every key of the JSON's protocol, plan entries, prompt records and paired summaries is named in
    docs/eval.md."""
    entry = run["plans"][0]
    keys = (set(run) | set(run["protocol"]) | set(entry) | set(run["protocol"]["prompts"][0]) | set(entry["paired"])
            | set(entry["paired"]["nr_minus_init"]["kl"]) | set(entry["per_prompt"]["random"])
            | set(entry["arms"]["nr"]) | set(entry["arms"]["wr"]) | set(entry["arms"]["random"]))
    text = (ROOT / "docs" / "eval.md").read_text()
    assert not sorted(k for k in keys if f"`{k}`" not in text), "undocumented dasc eval --json keys"
