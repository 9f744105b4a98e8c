"""``--prompts`` files as a user writes them (user test of 2026-12): the fields of a line, a byte-order mark,
prompts given as prefix and suffix, and the options that act on no prompt of a run."""

from __future__ import annotations

import codecs
import json

import pytest

from dasc_compile.errors import DascInputError
from dasc_compile.eval.prompts import from_jsonl
from dasc_compile.eval.tokenizer import ByteTokenizer
from tests.support.json_messages import decode_error
from tests.support.cli_runner import cli as _cli, one_error_line as _one_error_line
from tests.support.tiny_models import compile_for

pytestmark = pytest.mark.transformers_range

TOK = ByteTokenizer()
FORMS = "expected a JSON object with 'text', or 'prefix' and 'suffix' (and optionally 'answer')"


TRAILING_COMMA = '{"text": "abc",}'


@pytest.fixture(scope="module")
def plan(gdn_dir, tmp_path_factory):
    return compile_for(gdn_dir, 16, tmp_path_factory.mktemp("pf") / "w16.dasc")


@pytest.mark.parametrize("line, said", [
    ({"text": "x" * 40, "prefix": "zz", "extra": 1}, f"unknown key 'extra'; {FORMS}"),
    ({"text": "x" * 40, "prefix": "zz"}, "'text' and 'prefix' together; give either 'text' (cut into --prefix-len and "
                                         "--suffix-len tokens) or 'prefix' and 'suffix' (and optionally 'answer')"),
    ({"text": "x" * 40, "answer": "5"}, "'text' and 'answer' together; give either 'text' (cut into --prefix-len and "
                                        "--suffix-len tokens) or 'prefix' and 'suffix' (and optionally 'answer')"),
    ({"prefix": "a" * 20, "suffix": "bcd", "answer": ""}, "'answer' is empty; give the answer's text (scored as "
                                                          "retrieval) or leave 'answer' out"),
    ({"prefix": "a" * 20}, f"'prefix' without 'suffix'; {FORMS}"),
    ({"suffix": "bcd", "answer": "x"}, f"'suffix' without 'prefix'; {FORMS}"),
    ({"answer": "x"}, f"'answer' without 'prefix' and 'suffix'; {FORMS}"),
    ({}, f"an empty object; {FORMS}"),
    ([1, 2], f"{FORMS}, got an array"),
    # the decoder's own words, which Python 3.13 changed ("Illegal trailing comma before end of object: ... column 15")
    (TRAILING_COMMA, f"invalid JSON ({decode_error(TRAILING_COMMA)}); {FORMS}"),
])
def test_a_line_with_unknown_conflicting_or_empty_fields_is_refused(tmp_path, line, said):
    """`{"text", "prefix": "zz", "extra": 1}` ran (prefix and the unknown key ignored), an empty answer was
    dropped in silence, and invalid JSON was called "expected a JSON object" like any other bad line."""
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"text": "y" * 40}) + "\n" + (line if isinstance(line, str) else json.dumps(line)) + "\n")
    with pytest.raises(DascInputError) as e:
        from_jsonl(TOK, f, 10, 5)
    assert str(e.value) == f"{f}:2: {said}"


def test_a_byte_order_mark_is_read_as_utf8(tmp_path):
    """A file saved with a UTF-8 BOM was refused on line 1 as 'expected a JSON object ...'."""
    f = tmp_path / "p.jsonl"
    f.write_bytes(codecs.BOM_UTF8 + json.dumps({"prefix": "abcdefghijkl", "suffix": "mn"}).encode() + b"\n")
    (p,) = from_jsonl(TOK, f, 10, 5)
    assert TOK.decode(p.prefix) == "cdefghijkl" and TOK.decode(p.suffix) == "mn"


def test_prefix_suffix_prompts_keep_their_suffix_and_say_what_was_cut(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prefix": "abcdefghijkl", "suffix": "mnopqrs"}) + "\n"
                 + json.dumps({"prefix": "0123456789", "suffix": "xy", "answer": "z"}) + "\n")
    a, b = from_jsonl(TOK, f, 10, 3)
    assert (a.kind, TOK.decode(a.prefix), TOK.decode(a.suffix), a.prefix_cut) == ("prefix-suffix", "cdefghijkl",
                                                                                  "mnopqrs", 2)
    assert (b.kind, b.prefix_cut, TOK.decode(b.answer)) == ("qa", 0, "z")


def test_a_prefix_suffix_run_records_what_it_used(gdn_dir, plan, tmp_path):
    """`--suffix-len` was ignored for prefix/suffix prompts while protocol.suffix_len recorded it, the prompt's kind
    read "text", and a longer prefix was cut without a word."""
    f = tmp_path / "p.jsonl"
    text = "User: tell me about rivers.\n\nAssistant: Rivers carry water from hills to the sea. "
    f.write_text(json.dumps({"prefix": text * 2, "suffix": "And towns grow by them."}) + "\n"
                 + json.dumps({"text": text * 2}) + "\n")
    out = tmp_path / "r.json"
    r = _cli("eval", gdn_dir, "--plan", plan, "--prompts", f, "--prefix-len", 80, "--suffix-len", 8,
             "--gen-tokens", 2, "--arms", "dense,nr", "--json", out)
    assert r.exit_code == 0, r.output
    assert (f"warning: {f}: 1 of 2 prefixes are longer than --prefix-len 80 and keep only their last 80 tokens; line "
            f"(tokens dropped): 1 ({2 * len(text) - 80})") in r.output
    pr = json.loads(out.read_text())["protocol"]
    assert (pr["suffix_len"], pr["gen_tokens"]) == (8, 2)
    recs = {p["source"]: p for p in pr["prompts"]}
    assert {k: recs[f"{f}:1"][k] for k in ("kind", "prefix_tokens", "suffix_tokens", "prefix_cut")} == \
        {"kind": "prefix-suffix", "prefix_tokens": 80, "suffix_tokens": 23, "prefix_cut": 2 * len(text) - 80}
    assert {k: recs[f"{f}:2"][k] for k in ("kind", "prefix_tokens", "suffix_tokens", "prefix_cut")} == \
        {"kind": "text", "prefix_tokens": 80, "suffix_tokens": 8, "prefix_cut": 0}
    # the head columns name the count they cover: the longest suffix is 23 tokens, so the first 16
    assert "ΔNLL 1st 16" in r.output
    # the same file without its text line: --suffix-len acts on no prompt
    f.write_text(json.dumps({"prefix": text * 2, "suffix": "And towns grow by them."}) + "\n")
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, "--prompts", f, "--prefix-len", 80,
                                "--suffix-len", 8))
    assert line == ("error: --suffix-len 8 acts only on prompts cut from a text (ShareGPT conversations, 'text' lines "
                    "of a prompts file) and this run has none: a retrieval prompt or one given as 'prefix' and "
                    "'suffix' is scored on its whole suffix; drop --suffix-len")


def test_head_columns_name_a_shorter_suffix(gdn_dir, plan, tmp_path):
    """With --suffix-len 4 the columns still said "ΔNLL 1st 16" / "KL 1st 16"."""
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"text": "User: tell me about rivers.\n\nAssistant: Rivers carry water " * 2}) + "\n")
    r = _cli("eval", gdn_dir, "--plan", plan, "--prompts", f, "--prefix-len", 80, "--suffix-len", 4,
             "--gen-tokens", 2, "--arms", "dense,nr,random")
    assert r.exit_code == 0, r.output
    assert "ΔNLL 1st 4" in r.output and "KL 1st 4" in r.output and "1st 16" not in r.output
    assert "paired over prompts, dasc-nr − Random (mean of the masks on each prompt): ΔNLL 1st 4 " in r.output


@pytest.mark.parametrize("args, said", [
    (["--retrieval", 1, "--suffix-len", 8],
     "--suffix-len 8 acts only on prompts cut from a text (ShareGPT conversations, 'text' lines of a prompts file) "
     "and this run has none: a retrieval prompt or one given as 'prefix' and 'suffix' is scored on its whole suffix; "
     "drop --suffix-len"),
    (["--retrieval", 1, "--gen-tokens", 3],
     "--gen-tokens 3 acts only on prompts without an answer (ShareGPT conversations, prompts-file lines without "
     "'answer') and this run has none: each of its prompts is scored on its answer's tokens; drop --gen-tokens"),
    (["--prompts", "P", "--seed", 3],
     "--seed 3 acts only with built-in retrieval prompts (it draws their needles, keys and depths): give --retrieval "
     "N, or drop --seed (--sharegpt-offset draws other ShareGPT conversations)"),
    (["--sharegpt", 1, "--seed", 0],
     "--seed 0 acts only with built-in retrieval prompts (it draws their needles, keys and depths): give --retrieval "
     "N, or drop --seed (--sharegpt-offset draws other ShareGPT conversations)"),
    (["--horizons", "--prompts", "P", "--seed", 3],
     "--seed 3 acts only with built-in retrieval prompts (it draws their needles, keys and depths): give --retrieval "
     "N, or drop --seed (--sharegpt-offset draws other ShareGPT conversations)"),
])
def test_options_that_act_on_no_prompt_are_refused(gdn_dir, plan, tmp_path, args, said):
    """`--seed` was accepted with --sharegpt / --prompts alone (it seeds only the built-in retrieval prompts), and
    `--suffix-len` / `--gen-tokens` on a retrieval-only run were recorded in protocol but acted on nothing."""
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"text": "y" * 120}) + "\n")
    args = [f if a == "P" else a for a in args]
    line = _one_error_line(_cli("eval", gdn_dir, *([] if "--horizons" in args else ["--plan", plan]), *args,
                                "--prefix-len", 80))
    assert line == f"error: {said}"


def test_a_retrieval_only_run_records_no_suffix_len_or_k(gdn_dir, plan, tmp_path):
    out = tmp_path / "r.json"
    r = _cli("eval", gdn_dir, "--plan", plan, "--retrieval", 1, "--prefix-len", 80, "--seed", 2, "--arms", "nr",
             "--json", out)
    assert r.exit_code == 0, r.output
    pr = json.loads(out.read_text())["protocol"]
    assert (pr["suffix_len"], pr["gen_tokens"], pr["prompt_source"]) == (None, None, "builtin-retrieval:1:seed=2")
    assert "k = " not in r.output


def test_a_long_retrieval_prefix_is_not_blamed_on_suffix_len(gdn_dir, plan):
    """`--retrieval 1 --prefix-len 8190` was refused as "--prefix-len + --suffix-len = 8254" though --suffix-len
    does not apply to retrieval prompts (tiny model: context 2048)."""
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, "--retrieval", 1, "--prefix-len", 2040))
    assert line.startswith("error: the longest prompt (prefix + suffix + answer or --gen-tokens) = ")
    assert "is longer than the model's context: max_position_embeddings 2048" in line
    line = _one_error_line(_cli("eval", gdn_dir, "--plan", plan, "--retrieval", 1, "--prefix-len", 2049))
    assert line.startswith("error: --prefix-len = 2049 tokens is longer than the model's context")


def test_sweep_refuses_a_suffix_len_its_retrieval_prompts_ignore(gdn_dir):
    from tests.support.clihelp import assert_one_error, dasc

    r = dasc("sweep", gdn_dir, "--wmax", 16, "--eval", "retrieval:1", "--prefix-len", 80, "--suffix-len", 8)
    assert_one_error(r, "--suffix-len 8 acts only on prompts cut from a text (ShareGPT conversations, 'text' lines of "
                        "a prompts file) and this run has none")
