"""The shipped serving traces (benchmarks/traces/) against their README table: every file has a row,
and every figure of the row is the trace's own (start mode, sizes, token statistics, file size);
``build_trace --exclude-trace`` (a trace disjoint from earlier ones) on a tiny synthetic source."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from benchmarks import build_trace as bt
from benchmarks.trace_file import load_trace

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
    header, convs = load_trace(TRACES / name)
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
    header, convs = load_trace(TRACES / name)
    p = header["params"]
    assert (p["num_conversations"], p["max_decode_tokens"], p["start"], p["min_initial_tokens"],
            p["seed"], p["turns"]) == (256, 1024, "earliest", 4096, 0, 4)
    assert min(c.prompt_len(0) for c in convs) == 4096 and max(c.prompt_len(0) for c in convs) == 6738
    assert header["stats"]["mean_prompt_tokens_per_turn"] == [4387.6, 4876.7, 5323.6, 5755.5]
    readme = " ".join((TRACES / "README.md").read_text().split())
    assert (f"--out benchmarks/traces/{name} \\ --num-conversations 256 --max-decode-tokens 1024 --start earliest "
            "--min-initial-tokens 4096") in readme


def test_disjoint_long_prompt_trace_shares_no_conversation_with_the_first():
    """The x1 trace: built as the min4k one, excluding its conversations (fresh trace seeds once
    seeds 0-9 of the min4k trace are spent). Every conversation id differs from the min4k trace's,
    the header names the excluded file by its current sha256, and the README's rebuild command
    says so."""
    first, second = "sharegpt_qwen_n256_d1024_min4k_s0.json.gz", "sharegpt_qwen_n256_d1024_min4k_x1.json.gz"
    _, convs0 = load_trace(TRACES / first)
    header, convs1 = load_trace(TRACES / second)
    ids0, ids1 = {c.source_id for c in convs0}, {c.source_id for c in convs1}
    assert len(ids0) == len(convs0) == 256 and len(ids1) == len(convs1) == 256
    assert not ids0 & ids1
    p = header["params"]
    assert (p["num_conversations"], p["max_decode_tokens"], p["start"], p["min_initial_tokens"],
            p["seed"], p["turns"]) == (256, 1024, "earliest", 4096, 0, 4)
    assert all(c.prompt_len(0) >= 4096 for c in convs1)
    (excluded,) = header["source"]["excluded_traces"]
    assert excluded == {"file": first, "conversations": 256,
                        "sha256": hashlib.sha256((TRACES / first).read_bytes()).hexdigest()}
    assert header["source"]["selection"]["excluded"] == 256
    readme = " ".join((TRACES / "README.md").read_text().split())
    assert (f"--out benchmarks/traces/{second} \\ --num-conversations 256 --max-decode-tokens 1024 --start earliest "
            f"--min-initial-tokens 4096 \\ --exclude-trace benchmarks/traces/{first}") in readme


# ---------------------------------------------------------------- --exclude-trace, synthetic source

def _fake_qwen():
    """A character-level stand-in for the Qwen BPE (build_trace.qwen_encoder's return shape)."""
    return (lambda text: [ord(ch) for ch in text], bt.ChatFormat(im_start=1, im_end=2),
            {"name": "chars (test)"})


def _sharegpt(path: Path) -> Path:
    """24 two-pair conversations; every third one's first user turn is too short for the rules."""
    records = []
    for i in range(24):
        q = "q" * (5 if i % 3 == 0 else 40 + i)
        records.append({"id": f"conv{i:02d}", "conversations": [
            {"from": "human", "value": q}, {"from": "gpt", "value": f"answer {i}"},
            {"from": "human", "value": f"more {i}"}, {"from": "gpt", "value": f"reply {i}"}]})
    path.write_text(json.dumps(records))
    return path


_ARGS = ["--turns", "2", "--num-conversations", "4", "--min-initial-tokens", "30",
         "--max-initial-tokens", "1000", "--max-context-tokens", "5000", "--max-decode-tokens", "8"]


def test_exclude_trace_skips_its_conversations_and_keeps_the_permutation(tmp_path, monkeypatch):
    monkeypatch.setattr(bt, "qwen_encoder", _fake_qwen)
    src = _sharegpt(tmp_path / "sharegpt.json")
    first, second = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    assert bt.main(["--out", str(first), "--sharegpt", str(src)] + _ARGS) == 0
    assert bt.main(["--out", str(second), "--sharegpt", str(src), "--exclude-trace", str(first)] + _ARGS) == 0
    head_a, a = load_trace(first)
    head_b, b = load_trace(second)
    ids_a, ids_b = [c.source_id for c in a], [c.source_id for c in b]
    assert len(ids_b) == 4 and not set(ids_a) & set(ids_b)
    # same seed, same permutation: the second trace holds the next four that meet the rules
    encode, chat, _ = _fake_qwen()
    params = bt.TraceParams(turns=2, num_conversations=8, min_initial_tokens=30, max_initial_tokens=1000,
                            max_context_tokens=5000, max_decode_tokens=8)
    both, _ = bt.select_conversations(json.loads(src.read_text()), encode, chat, params)
    assert [c.source_id for c in both] == ids_a + ids_b
    assert head_b["source"]["excluded_traces"] == [
        {"file": "a.json.gz", "sha256": hashlib.sha256(first.read_bytes()).hexdigest(), "conversations": 4}]
    assert head_b["source"]["selection"]["excluded"] == 4
    # without the option the header is as before (the shipped traces rebuild byte for byte)
    assert "excluded_traces" not in head_a["source"] and "excluded" not in head_a["source"]["selection"]


def test_dedupe_content_skips_a_conversation_repeated_under_another_id(tmp_path, monkeypatch):
    # ShareGPT repeats some conversations under other ids: x1 held 13 token-identical to s0's (audit 2026-12-02)
    monkeypatch.setattr(bt, "qwen_encoder", _fake_qwen)
    src = _sharegpt(tmp_path / "sharegpt.json")
    recs = json.loads(src.read_text())
    first = tmp_path / "a.json.gz"
    assert bt.main(["--out", str(first), "--sharegpt", str(src)] + _ARGS) == 0
    _, a = load_trace(first)
    by_id = {r["id"]: r for r in recs}
    copies = [dict(by_id[c.source_id], id=f"copy-{c.source_id}") for c in a]        # same text, new ids
    inner = [dict(recs[i], id=f"twin-{recs[i]['id']}") for i in range(len(recs)) if i % 3]   # within the file
    src2 = tmp_path / "sharegpt2.json"
    src2.write_text(json.dumps(recs + copies + inner))
    plain, dedup = tmp_path / "b.json.gz", tmp_path / "c.json.gz"
    args = ["--sharegpt", str(src2), "--exclude-trace", str(first)] + _ARGS + ["--num-conversations", "12"]
    assert bt.main(["--out", str(plain)] + args) == 0
    assert bt.main(["--out", str(dedup), "--dedupe-content"] + args) == 0
    seen_a = {tuple(c.segments) for c in a}
    _, b = load_trace(plain)
    head_c, c = load_trace(dedup)
    segs_c = [tuple(x.segments) for x in c]
    assert not seen_a & set(segs_c) and len(set(segs_c)) == len(segs_c) == 12    # all 12 other texts, once each
    assert head_c["source"]["selection"]["duplicate_content"] >= 1
    # without the flag the ids rule alone lets repeats in (and the header has no duplicate count)
    segs_b = [tuple(x.segments) for x in b]
    assert seen_a & set(segs_b) or len(set(segs_b)) < len(segs_b)
    assert "duplicate_content" not in load_trace(plain)[0]["source"]["selection"]


def test_exclude_trace_that_leaves_too_few_conversations_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bt, "qwen_encoder", _fake_qwen)
    src = _sharegpt(tmp_path / "sharegpt.json")
    big = ["--num-conversations", "16"]
    assert bt.main(["--out", str(tmp_path / "a.json"), "--sharegpt", str(src)] + _ARGS + big) == 0
    capsys.readouterr()
    out = tmp_path / "b.json"
    assert bt.main(["--out", str(out), "--sharegpt", str(src), "--exclude-trace", str(tmp_path / "a.json")]
                   + _ARGS + ["--num-conversations", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "16 of them excluded" in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("content, needle", [
    (None, "cannot read trace JSON"),              # no such file
    ('{"format": "other"}', "expected format"),    # not a trace
    ("[1, 2", "cannot read trace JSON"),           # not JSON
])
def test_exclude_trace_refuses_an_unreadable_file_with_one_line(tmp_path, monkeypatch, capsys, content, needle):
    monkeypatch.setattr(bt, "qwen_encoder", _fake_qwen)
    src = _sharegpt(tmp_path / "sharegpt.json")
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    out = tmp_path / "b.json.gz"
    assert bt.main(["--out", str(out), "--sharegpt", str(src), "--exclude-trace", str(bad)] + _ARGS) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --exclude-trace {bad}: ") and needle in err[0], err
    assert not out.exists()
