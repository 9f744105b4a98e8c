"""The controls of issue 20: init-horizon masks, the untrained model, decay drift; and the head-window /
free-running / beyond-w_max measures, on hand-computed cases and on tiny real models."""

from __future__ import annotations

import math

import pytest
import torch

from dasc_compile.eval.controls import count_matched_top, decay_drift, jaccard
from dasc_compile.eval.metrics import HEAD, prompt_scores
from dasc_compile.eval.protocol import _summary
from tests.support.tiny_models import compile_for, write_kda

pytestmark = pytest.mark.transformers_range


def test_count_matched_top_hand_case():
    h = [torch.tensor([5.0, 50.0, 7.0, 50.0, math.inf], dtype=torch.float64), torch.tensor([1.0, 2.0], dtype=torch.float64)]
    # layer 0 keeps 3: inf (4), then the tie 50 / 50 broken by unit id (1 before 3); layer 1 keeps none
    assert count_matched_top(h, [3, 0]) == [[1, 3, 4], []]
    assert count_matched_top(h, [5, 2]) == [[0, 1, 2, 3, 4], [0, 1]]


def test_decay_drift_hand_case():
    trained = [torch.tensor([10.0, 20.0, 300.0, 400.0], dtype=torch.float64)]
    init = [torch.tensor([20.0, 10.0, 400.0, 30.0], dtype=torch.float64)]
    d = decay_drift(trained, init, [15, 100])
    # ranks trained [1, 2, 3, 4], init [2, 1, 4, 3]: sum d^2 = 4, rho = 1 - 6*4 / (4*15) = 0.6
    assert d["spearman_per_layer"] == [pytest.approx(0.6)] and d["spearman_median"] == pytest.approx(0.6)
    # w 15: trained {1, 2, 3}, init {0, 2, 3} -> 2 / 4; w 100: trained {2, 3}, init {2} -> 1 / 2
    assert d["jaccard"]["15"]["all"] == pytest.approx(0.5) and d["jaccard"]["100"]["per_layer"] == [pytest.approx(0.5)]
    assert jaccard(set(), set()) == 1.0


def test_head_window_and_free_running_scores():
    V, ts, k = 5, HEAD + 4, 3
    suffix = [1] * ts
    tail = [2, 3, 4]
    dense = torch.zeros(ts + k - 1, V)
    arm = torch.zeros(ts + k - 1, V)
    arm[HEAD:, 1] = math.log(4.0)          # after the head window the arm puts 4x weight on the true token
    s = prompt_scores(arm, dense, suffix, tail, False, gen=[2, 0, 4])
    p_true = 4 / (4 + 4)                   # softmax of [0, ln 4, 0, 0, 0] at token 1
    n_tail = ts - 1 - HEAD                 # targets past the head window
    assert s["nll_head"] == pytest.approx(math.log(V))
    assert s["nll"] == pytest.approx((HEAD * math.log(V) + n_tail * -math.log(p_true)) / (ts - 1))
    assert s["kl_head"] == pytest.approx(0.0, abs=1e-7) and s["kl"] > 0
    assert s["gen_agreement"] == pytest.approx(2 / 3) and s["retrieval"] is None


def test_retrieval_beyond_w_max_counts_only_far_answers():
    row = dict(nll=1.0, dense_nll=1.0, nll_head=1.0, dense_nll_head=1.0, kl=0.0, kl_head=0.0, agreement=1.0,
               gen_agreement=None)
    rows = [dict(row, retrieval=1.0, distance=10), dict(row, retrieval=0.0, distance=100),
            dict(row, retrieval=1.0, distance=300), dict(row, retrieval=None, distance=None)]
    s = _summary(rows, 64)
    assert s["retrieval_acc"] == pytest.approx(2 / 3)
    assert s["retrieval_acc_far"] == pytest.approx(0.5) and s["n_retrieval_far"] == 2


@pytest.fixture(scope="module")
def trained_and_init(tmp_path_factory):
    """A tiny Kimi-Linear at its transformers initialisation (seed 3) and a 'trained' copy whose layer-0
    dt_bias is reversed: the same values, other units long-lived."""
    from tests.eval.conftest import skip_without_kimi_linear

    skip_without_kimi_linear()
    d = tmp_path_factory.mktemp("ctl")
    init = write_kda(d / "init", seed=3)
    from safetensors.torch import load_file

    st = load_file(str(init / "model.safetensors"))
    a0, b0 = st["model.layers.0.self_attn.A_log"], st["model.layers.0.self_attn.dt_bias"]
    trained = write_kda(d / "trained", seed=3, decays={0: (a0, b0.flip(0))})
    return trained, init


def test_init_seed_rebuilds_the_initialisation(trained_and_init):
    from dasc_compile.eval.controls import init_decay_tensors
    from dasc_compile.eval.run import checkpoint_decays

    trained, init = trained_and_init
    spec, init_t, _ = checkpoint_decays(init)
    rebuilt, source = init_decay_tensors(trained, spec, None, 3)
    assert "manual_seed(3)" in source
    assert [n for n, _ in rebuilt] == [n for n, _ in init_t]
    assert all(torch.equal(a.float(), b.float()) for (_, a), (_, b) in zip(rebuilt, init_t))
    other, _ = init_decay_tensors(trained, spec, None, 4)
    assert not torch.equal(other[1][1], init_t[1][1])


def test_init_seed_is_refused_when_the_model_records_another_initialisation(trained_and_init, tmp_path):
    """The bundled references record their initial decays (train_log.json) and were not initialised by
    transformers' from_config: a seed then rebuilt other dt_bias values (by up to 7.1 on the GDN bundle) and
    the controls ran on them without a word (s19 audit)."""
    import json
    import shutil

    from dasc_compile.errors import DascInputError
    from dasc_compile.eval.controls import init_decay_tensors
    from dasc_compile.eval.run import checkpoint_decays

    trained, init = trained_and_init
    spec, init_t, _ = checkpoint_decays(init)
    model = tmp_path / "m"
    shutil.copytree(trained, model)
    record = {f"live:{n}": t.reshape(-1).tolist() for n, t in init_t}
    (model / "train_log.json").write_text(json.dumps({"init_decays": record}))
    rebuilt, _ = init_decay_tensors(model, spec, None, 3)          # the record agrees with seed 3: accepted
    assert all(torch.equal(a.float(), b.float()) for (_, a), (_, b) in zip(rebuilt, init_t))
    name = init_t[1][0]                                                 # layer 0's dt_bias, recorded shifted
    record[f"live:{name}"] = (init_t[1][1].reshape(-1) - 2.5).tolist()
    (model / "train_log.json").write_text(json.dumps({"init_decays": record}))
    with pytest.raises(DascInputError) as e:
        init_decay_tensors(model, spec, None, 3)
    msg = str(e.value)
    assert msg.startswith(f"--init-seed 3: transformers' initialisation differs from the initial decays {model / 'train_log.json'} "
                          f"records ({name} by up to 2.5")
    assert f"python -m benchmarks.train.init_model {model} --out DIR and give --init-from DIR" in msg


def test_init_arm_masks_and_drift_on_a_real_model(trained_and_init, tmp_path):
    from dasc_compile.compiler import layer_horizons, resolve_family_policy
    from dasc_compile.eval.run import checkpoint_decays, run_eval
    from dasc_compile.schema import load_plan

    trained, init = trained_and_init
    path = compile_for(trained, 64, tmp_path / "w64.dasc")
    plan = load_plan(path, verify_kernels=False)
    doc = run_eval(trained, [path], retrieval=1, arms="dense,nr,init,untrained", prefix_len=96,
                   init_from=init, progress=False)
    spec, t_t, _ = checkpoint_decays(trained)
    _, i_t, _ = checkpoint_decays(init)
    pol = resolve_family_policy(spec, plan.policy)
    th, ih = layer_horizons(spec, pol, t_t), layer_horizons(spec, pol, i_t)
    drift = doc["init"]["drift"]
    # layer 1 was not touched: identical horizons; layer 0's were reversed within the layer
    assert drift["spearman_per_layer"][1] == pytest.approx(1.0)
    assert drift["spearman_per_layer"][0] < 0.99
    keep_t = {u for u in range(th[0].numel()) if th[0][u] > 64}
    keep_i = {u for u in range(ih[0].numel()) if ih[0][u] > 64}
    assert drift["jaccard"]["64"]["per_layer"][0] == pytest.approx(len(keep_t & keep_i) / len(keep_t | keep_i))
    # the init arm ran with masks that differ from the plan's in layer 0 only -> its KL differs from nr's
    arms = doc["arms"]
    assert set(arms) == {"dense", "nr", "init"} and arms["init"]["kl"] != arms["nr"]["kl"]
    u = doc["plans"][0]["untrained"]
    assert set(u) == {"dense", "nr"} and u["dense"]["kl"] == 0.0
    assert u["dense"]["nll"] != pytest.approx(arms["dense"]["nll"])       # a different model ran


def test_init_arm_equals_nr_when_nothing_moved(trained_and_init, tmp_path):
    from dasc_compile.eval.run import run_eval

    _, init = trained_and_init
    path = compile_for(init, 64, tmp_path / "w64.dasc")
    doc = run_eval(init, [path], retrieval=1, arms="nr,init", prefix_len=96, init_seed=3, progress=False)
    assert doc["arms"]["init"] == doc["arms"]["nr"]
    assert all(j["all"] == 1.0 for j in doc["init"]["drift"]["jaccard"].values())
