"""The attention probe's bookkeeping (benchmarks/train/attention_probe.py): bucket masses of a hand-built attention
row, counted by hand (precedence sink > recent > key > value > needle_rest > distractor > question > other, and
nothing past the query counted), and the spans of a prompt built with a character tokenizer. No model, no bundle."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.train.attention_probe import BUCKETS, build_prompt, bucket_masses, position_labels, row_entropy

Q, N_SINK, RECENT = 12, 2, 3
# key 1 is in the sink, value 10 in the recent window, 13 past the query, 7 / 8 also in the question
SPANS = {"key": [1, 4, 5], "value": [6, 10, 13], "needle_rest": [7], "distractor": [8, 9], "question": [3, 7, 8]}
LABELS = ["sink", "sink", "other", "question", "key", "key", "value", "needle_rest", "distractor", "distractor",
          "recent", "recent", "recent"]                                              # positions 0..12, by hand


def test_position_labels_follow_the_precedence():
    lab = position_labels(Q, SPANS, N_SINK, RECENT)
    assert [BUCKETS[i] for i in lab.tolist()] == LABELS


def test_bucket_masses_exact():
    # head 0: 32nds at positions 0..12 (sum 32/32), then 0.5 on each of two positions past the query (ignored)
    h0 = torch.tensor([2, 2, 4, 2, 4, 2, 8, 1, 1, 2, 1, 1, 2], dtype=torch.float64) / 32
    h1 = torch.zeros(13, dtype=torch.float64)
    h1[10] = 1.0                                                   # on a value position inside the recent window
    probs = torch.stack([torch.cat([h0, torch.tensor([0.5, 0.5], dtype=torch.float64)]),
                         torch.cat([h1, torch.tensor([0.7, 0.0], dtype=torch.float64)])])
    m = bucket_masses(probs, Q, SPANS, N_SINK, RECENT)
    assert m.shape == (2, len(BUCKETS))
    want0 = {"sink": 4, "key": 6, "value": 8, "needle_rest": 1, "distractor": 3, "question": 2, "recent": 4,
             "other": 4}
    assert {b: float(m[0, i]) * 32 for i, b in enumerate(BUCKETS)} == want0
    assert {b: float(m[1, i]) for i, b in enumerate(BUCKETS)} == {b: float(b == "recent") for b in BUCKETS}
    assert float(m[0].sum()) == 1.0


def test_short_prefix_sink_and_recent_overlap():
    # query 2: sink takes 0-1, recent (3 positions) would reach back to 0 but only position 2 is left for it
    m = bucket_masses(torch.tensor([[0.25, 0.25, 0.5]]), 2, {"key": [0, 1, 2]}, n_sink=2, recent=3)
    assert m[0, BUCKETS.index("sink")] == 0.5 and m[0, BUCKETS.index("recent")] == 0.5 and m[0].sum() == 1.0


def test_row_entropy():
    e = row_entropy(torch.tensor([[0.25, 0.25, 0.25, 0.25, 0.0], [1.0, 0.0, 0.0, 0.0, 0.0]]))
    assert e[0] == pytest.approx(math.log(4)) and e[1] == 0.0


class _Enc:
    def __init__(self, text: str):
        self.ids = [ord(c) for c in text]
        self.offsets = [(i, i + 1) for i in range(len(text))]


class _CharTok:
    """A character 'tokenizer' with the ``tokenizers`` call the probe uses."""

    def encode(self, text: str, add_special_tokens: bool = False) -> _Enc:
        return _Enc(text)


@pytest.mark.parametrize("n_distract,template", [(0, 0), (2, 1)])
def test_build_prompt_spans(n_distract, template):
    from benchmarks.train.attention_probe import _helpers

    p = build_prompt(_helpers(_CharTok()), gap=200, seed=3, n_distract=n_distract, template=template)
    text = "".join(map(chr, p["ids"]))
    key = "".join(chr(p["ids"][i]) for i in p["spans"]["key"])
    value = "".join(chr(p["ids"][i]) for i in p["spans"]["value"])
    assert value[0] == " " and value[1:].isdigit()
    assert f"{key} is{value}" in text                               # the value follows the key's " is"
    answer = "".join(chr(p["ids"][a]) for a in p["answers"])
    assert answer == value and text.endswith(answer) and p["targets"] == p["spans"]["value"]
    needle_end = max(p["spans"]["key"] + p["spans"]["value"] + p["spans"]["needle_rest"]) + 1
    assert min(p["spans"]["question"]) - needle_end == 200                 # the gap, distractors included
    assert "".join(chr(p["ids"][i]) for i in p["spans"]["question"]).startswith("\nQuestion:")
    d = p["spans"]["distractor"]
    assert all(needle_end <= i < min(p["spans"]["question"]) for i in d)
    assert "".join(chr(p["ids"][i]) for i in d).count(" The ") == n_distract     # whole needles, other keys
    assert key not in "".join(chr(p["ids"][i]) for i in d)


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    """A folder that is not a trained reference, a bad --gaps and a --json in no folder: `error:`, exit 2, before any
    model loads (so this runs without transformers)."""
    from benchmarks.train.attention_probe import main

    (tmp_path / "config.json").write_text('{"layer_types": ["linear_attention"]}')
    assert main([str(tmp_path / "missing")]) == 2
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("error: ") and "not a folder" in err[0]
    assert err[1].startswith("error: ") and "tokenizer.json" in err[1] and "*.safetensors" in err[1]
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert main([str(tmp_path)]) == 2
    assert "no full_attention layer" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{")
    assert main([str(tmp_path)]) == 2
    assert "config.json: not JSON" in capsys.readouterr().err
    for bad in (["--gaps", "96,x"], ["--gaps", "0"], ["--n", "0"], ["--sink", "-1"], ["--recent", "0"]):
        with pytest.raises(SystemExit) as e:
            main([str(tmp_path), *bad])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and err[0].startswith(f"error: argument {bad[0]}"), (bad, err)
