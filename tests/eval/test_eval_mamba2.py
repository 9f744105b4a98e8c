"""``dasc eval`` and ``--horizons`` on transformers' own Mamba2 hybrids (Nemotron-H, Granite-4.0-H, Falcon-H1;
tiny, random, CPU): each loads and continues a cached prefix exactly, the recorded log-decay is the one the
recurrence applies (also where ``dt`` falls below Nemotron-H's ``time_step_min``), and the CLI runs every arm
and the controls. The arms themselves, batched and alone, are tested with GDN's in test_eval_protocol.py."""

from __future__ import annotations

import copy
import importlib
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from dasc_compile.cli import app
from dasc_compile.eval.hf_compat import recurrent_state
from tests.eval.conftest import is_pure_torch
from tests.support.tiny_models import compile_for, write_falcon_h1, write_granite_h, write_nemotron_h

pytestmark = pytest.mark.transformers_range

runner = CliRunner()
IDS = list(b"the river runs to the sea and the towns grow by it")
#: (writer, class, recurrent layers, attention-KV layers)
CLASSES = {"nemotron_h": (write_nemotron_h, "NemotronHForCausalLM", [0, 2], [1]),
           "granitemoehybrid": (write_granite_h, "GraniteMoeHybridForCausalLM", [0, 2], [1]),
           "falcon_h1": (write_falcon_h1, "FalconH1ForCausalLM", [0, 1], [0, 1])}


@pytest.fixture(scope="module", params=sorted(CLASSES))
def each(request, tmp_path_factory):
    """Each Mamba2 class with dt_bias = -2 (dt well above any clamp: both of transformers' paths agree)."""
    from dasc_compile.eval.models import load_eval_model

    write, cls, rec, kv = CLASSES[request.param]
    return load_eval_model(write(tmp_path_factory.mktemp(request.param) / "m", dt_bias=(-2.0,) * 4)), cls, rec, kv


def test_loads_each_class_through_transformers(each):
    em, cls, rec, kv = each
    assert type(em.model).__name__ == cls and em.family == "mamba2"
    assert (em.layer_ids, em.attention_layer_ids, em.num_heads, em.units_per_head) == (rec, kv, 4, 1)
    # transformers 5.12's torch_forward cannot continue a cached state in a chunk (hf_compat.mamba2_max_chunk)
    assert em.max_chunk == (16 if hasattr(em.mixers[rec[0]], "torch_forward") else None)


def test_mixers_run_transformers_pytorch_path(each):
    """Pinned whatever optional kernel packages are installed (hf_compat.pin_torch_kernels): 5.12's mixers
    take torch_forward (the module flag that would pick mamba_ssm's CUDA path is off); later releases'
    module-global kernels are their pure-PyTorch functions."""
    em = each[0]
    mixer = em.mixers[em.layer_ids[0]]
    module = importlib.import_module(type(mixer).__module__)
    if hasattr(mixer, "torch_forward"):
        assert module.is_fast_path_available is False
    else:
        names = ("mamba2_chunk_scan", "mamba2_selective_state_update", "causal_conv1d_fn", "causal_conv1d_update")
        assert all(is_pure_torch(getattr(module, n)) for n in names)      # 5.25: not kernels' Func modules


def test_cached_prefix_continues_like_one_pass_and_like_the_recurrence(each):
    em = each[0]
    whole = em.forward(IDS, em.new_cache())
    cache = em.new_cache()
    split = torch.cat([em.forward(IDS[:30], cache), em.forward(IDS[30:], cache)])
    assert tuple(recurrent_state(cache.layers[em.layer_ids[0]]).shape) == (1, 4, 8, 8)
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-5)
    step = em.new_cache()
    one = torch.cat([em.forward(IDS[t:t + 1], step) for t in range(len(IDS))])
    torch.testing.assert_close(one, whole, rtol=1e-4, atol=2e-5)


def test_nemotron_h_multi_chunk_scan_leaves_the_recurrence_where_max_chunk_is_set(mamba2_model):
    """transformers 5.12's own multi-chunk scan leaves the recurrence after chunk_size = 16 tokens (the
    reason for max_chunk, :mod:`dasc_compile.eval.mamba2`); dasc eval's forward stays on it."""
    em = mamba2_model
    if em.max_chunk is None:
        pytest.skip("this transformers continues a cached state in its chunked scan (no max_chunk)")
    whole = em.forward(IDS, em.new_cache())
    raw = em.model(input_ids=torch.tensor([IDS]), use_cache=True, **{em.cache_arg: em.new_cache()}).logits[0]
    assert (raw[:16] - whole[:16]).abs().max() < 1e-4 and (raw[16:] - whole[16:]).abs().max() > 1e-2


@pytest.fixture(scope="module")
def clamped(tmp_path_factory):
    """Nemotron-H with dt_bias = -12: softplus(dt + dt_bias) far below time_step_min = 0.001, where transformers
    clamps it (5.12: always; later releases: in the chunked scan only, not in the one-token update)."""
    from dasc_compile.eval.models import load_eval_model

    return load_eval_model(write_nemotron_h(tmp_path_factory.mktemp("clamped") / "m", dt_bias=(-12.0,) * 4))


@pytest.mark.parametrize("model", ["mamba2_model", "clamped"])
@pytest.mark.parametrize("n_tokens", [1, 2])
def test_recorded_log_decay_is_the_decay_the_recurrence_applies(model, n_tokens, request):
    """S_t = S_{t-1} * exp(g_t) + (input term): runs of the same tokens from states S and S + D differ by
    D * exp(sum_t g_t) in layer 0, so log((S1 - S1') / -D) is the decay applied; it must equal the recorded
    g summed over the tokens (one token: the one-step update; two: the chunked scan where transformers
    continues a cached state in it, two steps where it does not)."""
    from dasc_compile.eval.horizons import DecayRecorder

    em = request.getfixturevalue(model)
    cache = em.new_cache()
    em.forward(list(b"hello rivers"), cache)
    other = copy.deepcopy(cache)
    recurrent_state(other.layers[0]).add_(1.0)
    with DecayRecorder(em) as rec:
        em.forward(list(b"xy")[:n_tokens], cache)
    em.forward(list(b"xy")[:n_tokens], other)
    decay = (recurrent_state(cache.layers[0]) - recurrent_state(other.layers[0])) / -1.0    # [1, H, P, N]
    g = torch.cat([x.reshape(-1, 4) for x in rec.g[0]]).sum(0).double()                      # [H]
    assert decay.shape == (1, 4, 8, 8) and sum(x.shape[1] for x in rec.g[0]) == n_tokens
    torch.testing.assert_close(decay[0].log().double(), g[:, None, None].expand(4, 8, 8), rtol=1e-5, atol=1e-6)
    assert bool((g < 0).all())


def _cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_horizons_eval_and_controls_run_on_nemotron_h(mamba2_dir, tmp_path):
    out = tmp_path / "h.json"
    r = _cli("eval", mamba2_dir, "--horizons", "--retrieval", 2, "--prefix-len", 80, "--json", out)
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    t = doc["table_1b"]
    assert t["n_pairs"] == 4 and set(t["per_layer"]) == {"0", "2"}          # 2 prompts x 2 Mamba2 layers
    # A_log = log(0.05 .. 8) spreads the static decay over 160x; the observed one follows it (same dt_bias scale)
    assert t["hs_he"]["median"] > 0.5
    plans = [compile_for(mamba2_dir, w, tmp_path / f"w{w}.dasc") for w in (0, 64)]
    kept = [json.loads((p / "plan.json").read_text())["totals"]["n_kept"] for p in plans]
    assert kept[0] == 8 and 0 < kept[1] < 8
    ev = tmp_path / "e.json"
    r = _cli("eval", mamba2_dir, "--plan", plans[0], "--plan", plans[1], "--retrieval", 1, "--prefix-len", 80,
             "--arms", "dense,nr,wr,random,init,untrained", "--init-seed", 0,
             "--json", ev)
    assert r.exit_code == 0, r.output
    doc = json.loads(ev.read_text())
    assert doc["model"]["family"] == "mamba2"
    keep_all, w64 = (p["arms"] for p in doc["plans"])
    # nothing omitted: nr = dense (up to the rounding of a batch of arm rows against dense run alone)
    assert keep_all["nr"]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert keep_all["nr"]["nll_delta"] == pytest.approx(0.0, abs=1e-6)
    assert w64["nr"]["kl"] > 0.0 and math.isfinite(w64["wr"]["kl"])
    assert {"init", "random"} <= set(w64) and "untrained" in doc["plans"][1]
    assert len(doc["init"]["drift"]["spearman_per_layer"]) == 2


@pytest.mark.parametrize("model", ["gdn_model", "kda_model"])
def test_the_mamba2_observer_leaves_other_mixers_alone(model, request):
    """load_eval_model calls observe_mamba2 on every model (the mixer type decides, not the family name): a
    GDN or KDA mixer must get no observer and no max_chunk, and a Mamba2 model's every mixer one."""
    from dasc_compile.eval.mamba2 import is_mamba2_mixer, observe_mamba2

    em = request.getfixturevalue(model)
    assert em.max_chunk is None
    assert not any(is_mamba2_mixer(m) for m in em.mixers.values())
    assert observe_mamba2(em.mixers) is None
    assert not any(_has_observer(m) for m in em.mixers.values())


def test_the_mamba2_observer_is_on_every_mamba2_mixer(mamba2_model):
    from dasc_compile.eval.mamba2 import is_mamba2_mixer

    assert mamba2_model.mixers and all(is_mamba2_mixer(m) and _has_observer(m) for m in mamba2_model.mixers.values())


def _has_observer(mixer) -> bool:
    """The observer's pre-hook (mamba2._install_observer's closure) is among the mixer's pre-hooks."""
    return any(h.__qualname__.startswith("_install_observer.") for h in mixer._forward_pre_hooks.values())
