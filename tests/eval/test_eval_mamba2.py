"""``dasc eval`` and ``--horizons`` on transformers' own Nemotron-H (tiny, random, CPU): the model continues a
cached prefix exactly, the recorded log-decay is the one the recurrence applies, and the CLI runs every arm."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from dasc_compile.cli import app
from tests.support.tiny_models import compile_for, write_nemotron_h

runner = CliRunner()


@pytest.fixture(scope="module")
def nem_dir(tmp_path_factory):
    return write_nemotron_h(tmp_path_factory.mktemp("nemotron") / "model")


@pytest.fixture(scope="module")
def nem(nem_dir):
    from dasc_compile.eval.models import load_eval_model

    return load_eval_model(nem_dir)


def test_loads_transformers_nemotron_h(nem):
    assert nem.family == "mamba2" and nem.max_chunk == 16
    assert (nem.layer_ids, nem.num_heads, nem.units_per_head) == ([0, 2], 4, 1)
    assert type(nem.model).__name__ == "NemotronHForCausalLM"


def test_cached_prefix_continues_like_one_pass(nem):
    """A prefix cached then continued gives the logits of one pass; both equal the one-token recurrence."""
    ids = list(b"the river runs to the sea and the towns grow by it")
    whole = nem.forward(ids, nem.new_cache())                    # one chunk (16 tokens), then steps
    cache = nem.new_cache()
    first = nem.forward(ids[:30], cache)
    rest = nem.forward(ids[30:], cache)                          # stepped from the cached state
    assert cache.layers[0].recurrent_states.shape == (1, 4, 8, 8)
    torch.testing.assert_close(torch.cat([first, rest]), whole, rtol=1e-5, atol=1e-5)
    step = nem.new_cache()
    one = torch.cat([nem.forward(ids[:1], step)] + [nem.forward(ids[t:t + 1], step) for t in range(1, len(ids))])
    torch.testing.assert_close(one, whole, rtol=1e-5, atol=1e-5)
    # transformers' own multi-chunk scan leaves that recurrence after chunk_size = 16 tokens (module docstring)
    raw = nem.model(input_ids=torch.tensor([ids]), past_key_values=nem.new_cache(), use_cache=True).logits[0]
    assert (raw[:16] - whole[:16]).abs().max() < 1e-4 and (raw[16:] - whole[16:]).abs().max() > 1e-2


def test_recorded_log_decay_is_the_decay_the_recurrence_applies(nem):
    """S_t = S_{t-1} * exp(g_t) + (input term): two runs of one token from states S and S + D differ by
    D * exp(g_t) in layer 0, so log((S1 - S1') / -D) is the decay applied; it must equal the recorded g."""
    from dasc_compile.eval.horizons import DecayRecorder

    cache = nem.new_cache()
    nem.forward(list(b"hello rivers"), cache)
    other = copy.deepcopy(cache)
    other.layers[0].recurrent_states.add_(1.0)
    with DecayRecorder(nem) as rec:
        nem.forward([ord("x")], cache)
    nem.forward([ord("x")], other)
    decay = (cache.layers[0].recurrent_states - other.layers[0].recurrent_states) / -1.0   # [1, H, P, N]
    g = rec.g[0][-1].reshape(-1).double()                                                 # [H]
    assert decay.shape == (1, 4, 8, 8)
    torch.testing.assert_close(decay[0].log().double(), g[:, None, None].expand(4, 8, 8), rtol=1e-5, atol=1e-6)
    assert bool((g < 0).all())


def _cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_horizons_and_eval_run_on_nemotron_h(nem_dir, tmp_path):
    out = tmp_path / "h.json"
    r = _cli("eval", nem_dir, "--horizons", "--retrieval", 2, "--prefix-len", 80, "--json", out)
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    t = doc["table_1b"]
    assert t["n_pairs"] == 4 and set(t["per_layer"]) == {"0", "2"}          # 2 prompts x 2 Mamba2 layers
    # A_log = log(0.05 .. 8) spreads the static decay over 160x; the observed one follows it (same dt_bias scale)
    assert t["hs_he"]["median"] > 0.5
    plans = [compile_for(nem_dir, w, tmp_path / f"w{w}.dasc") for w in (0, 64)]
    kept = [json.loads((p / "plan.json").read_text())["totals"]["n_kept"] for p in plans]
    assert kept[0] == 8 and 0 < kept[1] < 8
    ev = tmp_path / "e.json"
    r = _cli("eval", nem_dir, "--plan", plans[0], "--plan", plans[1], "--retrieval", 1, "--prefix-len", 80,
             "--suffix-len", 6, "--gen-tokens", 2, "--json", ev)
    assert r.exit_code == 0, r.output
    doc = json.loads(ev.read_text())
    assert doc["model"]["family"] == "mamba2"
    keep_all, w64 = (p["arms"] for p in doc["plans"])
    assert keep_all["nr"]["kl"] == 0.0 and keep_all["nr"]["nll_delta"] == 0.0        # nothing omitted: nr = dense
    assert w64["nr"]["kl"] > 0.0 and math.isfinite(w64["wr"]["kl"])
