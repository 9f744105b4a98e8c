"""The shipped serving traces (benchmarks/traces/) against their README table: every file has a row,
and every figure of the row is the trace's own (start mode, sizes, token statistics, file size)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import build_trace as bt

TRACES = Path(__file__).resolve().parents[2] / "benchmarks" / "traces"


def _rows() -> dict[str, list[str]]:
    rows = {}
    for line in (TRACES / "README.md").read_text().splitlines():
        m = re.match(r"\| `([^`]+\.json\.gz)`", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in line.strip().strip("|").split("|")]
    return rows


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _same(shown: str, value: float) -> bool:
    """``shown`` (as the table prints it) is ``value`` rounded to the decimals shown (a half may go
    either way: the stats' means are themselves rounded to 0.1, 356.5 is shown as 357)."""
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return abs(_num(shown) - value) <= 0.5 * 10 ** -decimals + 1e-9


def test_every_trace_has_a_row_and_only_those():
    assert sorted(_rows()) == sorted(p.name for p in TRACES.glob("*.json.gz"))


@pytest.mark.parametrize("name", sorted(p.name for p in TRACES.glob("*.json.gz")))
def test_readme_row_is_the_trace(name):
    row = _rows()[name]
    header, convs = bt.load_trace(TRACES / name)
    p, s = header["params"], header["stats"]
    start, n, requests, clip, initial, final, decode, prompt, reuse, size = row[1:]
    assert (start, int(n), int(requests), int(clip)) == (p["start"], len(convs), s["requests"],
                                                         p["max_decode_tokens"])
    for shown, key in ((initial, "initial_prompt_tokens"), (final, "final_context_tokens")):
        lo, mean, hi = (x.strip() for x in shown.split("/"))
        assert (int(lo), int(hi)) == (s[key]["min"], s[key]["max"]) and _same(mean, s[key]["mean"])
    total, mean = re.fullmatch(r"([\d,]+) \(([\d.]+)\)", decode).groups()
    assert _num(total) == s["decode_tokens"]["total"] and _same(mean, s["decode_tokens"]["mean"])
    assert _num(prompt) == s["prompt_tokens_total"] and _same(reuse, s["prompt_reuse_bound"])
    value, unit = size.split()
    assert _same(value, (TRACES / name).stat().st_size / {"MB": 1e6, "KB": 1e3}[unit])


def test_long_prompt_trace_is_built_as_the_readme_says():
    """The min4k trace: --start earliest --min-initial-tokens 4096, 256 conversations, clip 1024;
    every turn-1 prompt is at least 4,096 tokens (the prompts of the 2026-12-01 run were 2.1k on
    average) and the rebuild command in the README names exactly these options."""
    name = "sharegpt_qwen_n256_d1024_min4k_s0.json.gz"
    header, convs = bt.load_trace(TRACES / name)
    p = header["params"]
    assert (p["num_conversations"], p["max_decode_tokens"], p["start"], p["min_initial_tokens"],
            p["seed"], p["turns"]) == (256, 1024, "earliest", 4096, 0, 4)
    assert min(c.prompt_len(0) for c in convs) == 4096 and max(c.prompt_len(0) for c in convs) == 6738
    assert header["stats"]["mean_prompt_tokens_per_turn"] == [4387.6, 4876.7, 5323.6, 5755.5]
    readme = " ".join((TRACES / "README.md").read_text().split())
    assert (f"--out benchmarks/traces/{name} \\ --num-conversations 256 --max-decode-tokens 1024 --start earliest "
            "--min-initial-tokens 4096") in readme
