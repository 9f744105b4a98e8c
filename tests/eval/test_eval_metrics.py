"""Spearman, summaries, per-prompt scores, horizon validation (Eq. 4, 5) and the KDA recurrence."""

from __future__ import annotations

import math

import pytest
import torch

from dasc_compile.eval.horizons import DecayRecorder, empirical_horizon, state_magnitude, validate_prefix
from dasc_compile.eval.hf_compat import kernel_slots
from dasc_compile.eval.metrics import mean_sd, median_iqr, prompt_scores, ranks, spearman

pytestmark = pytest.mark.transformers_range


def test_spearman_constructed_case():
    # a = [1..5], b has a tie: ranks(b) = [1, 2, 3.5, 5, 3.5]
    a = torch.tensor([1.0, 2, 3, 4, 5])
    b = torch.tensor([5.0, 6, 7, 8, 7])
    assert ranks(b).tolist() == [1.0, 2.0, 3.5, 5.0, 3.5]
    # by hand: centred ranks a: [-2,-1,0,1,2]; b: [-2,-1,0.5,2,0.5]; cov = 4+1+0+2+1 = 8
    # |a|^2 = 10, |b|^2 = 4+1+0.25+4+0.25 = 9.5 -> rho = 8 / sqrt(95)
    assert spearman(a, b) == pytest.approx(8 / math.sqrt(95), abs=1e-12)
    assert spearman(a, -a) == pytest.approx(-1.0)
    assert spearman(a, a ** 3) == pytest.approx(1.0)             # rank-based: any monotone map gives 1
    assert spearman(a, torch.tensor([1.0, 2, 3, 4, math.inf])) == pytest.approx(1.0)   # inf ranks last
    assert math.isnan(spearman(a, torch.ones(5)))                  # constant side: undefined


def test_mean_sd_and_median_iqr():
    r = mean_sd([1.0, 2.0, 3.0, 4.0, 5.0])
    assert r["mean"] == 3.0 and r["sd"] == pytest.approx(math.sqrt(2.5))      # sample SD (n - 1)
    q = median_iqr([4.0, 1.0, 3.0, 2.0, float("nan")])
    assert (q["median"], q["q25"], q["q75"], q["n"]) == (2.5, 1.75, 3.25, 4)


def test_prompt_scores_hand_case():
    V = 4
    dense = torch.zeros(3, V)
    dense[:, 2] = 5.0                       # dense argmax 2 everywhere
    arm = dense.clone()
    arm[2] = torch.tensor([0.0, 6.0, 5.0, 0.0])   # tail position disagrees
    s = prompt_scores(arm, dense, suffix=[0, 2], tail=[2, 2], answer=True)
    lp = torch.log_softmax(dense[0], -1)
    assert s["nll"] == pytest.approx(float(-lp[2]))          # suffix[1] = 2 predicted by row 0
    assert s["kl"] == pytest.approx(0.0, abs=1e-7)            # rows 0, 1 equal dense
    assert s["agreement"] == 0.5 and s["retrieval"] == 0.0
    same = prompt_scores(dense, dense, suffix=[0, 2], tail=[2, 2], answer=True)
    assert same["agreement"] == 1.0 and same["retrieval"] == 1.0 and same["kl"] == 0.0


def test_empirical_horizon_and_state_magnitude():
    g = torch.tensor([-0.1, -2.0, 0.0], dtype=torch.float64)
    h = empirical_horizon(g, 1e-3)
    assert h[0] == pytest.approx(math.log(1e-3) / -0.1) and h[1] == pytest.approx(math.log(1e-3) / -2.0)
    assert math.isinf(h[2])
    s = torch.zeros(1, 2, 3, 4)
    s[0, 1, 2] = torch.tensor([3.0, 4.0, 0.0, 0.0])          # KDA column (h=1, k=2), norm 5
    assert state_magnitude(s, 1).tolist() == [0.0, 5.0]
    assert state_magnitude(s, 3).tolist() == [0, 0, 0, 0, 0, 5.0]


@pytest.mark.parametrize("which", ["gdn", "kda", "mamba2", "falcon"])
def test_horizon_validation_observes_the_real_gate(which, request):
    em = request.getfixturevalue(f"{which}_model")
    prefix = [(5 * i + 1) % 251 for i in range(40)]
    n = em.num_heads * em.units_per_head
    before = {(id(o), a): getattr(o, a) for m in em.mixers.values() for o, a in kernel_slots(m)}
    with DecayRecorder(em) as rec:
        assert all(getattr(o, a) is not before[(id(o), a)] for m in em.mixers.values() for o, a in kernel_slots(m))
        em.forward(prefix, em.new_cache())
    for lid in em.layer_ids:
        g = torch.cat(rec.g[lid], dim=1)
        assert g.shape[:2] == (1, len(prefix)) and g[0].numel() == len(prefix) * n and bool((g <= 0).all())
    for mixer in em.mixers.values():          # the very kernels the model had are back
        assert all(getattr(o, a) is before[(id(o), a)] for o, a in kernel_slots(mixer))
    hs = [torch.arange(1, n + 1, dtype=torch.float64) for _ in em.layer_ids]
    rows = validate_prefix(em, prefix, hs, 1e-3)
    assert [r["layer_id"] for r in rows] == em.layer_ids
    assert all(-1.0 <= r["rho_hs_he"] <= 1.0 and -1.0 <= r["rho_hs_ms"] <= 1.0 for r in rows)


def test_recorded_decay_is_each_layers_own_gate(kda_model):
    """The kernels are shared module globals: each layer's recorded g must be that layer's forget gate output
    (captured independently by a hook on the gate module), not another layer's."""
    em = kda_model
    seen = {}
    hooks = [em.mixers[lid].forget_gate.register_forward_hook(
        lambda _m, _i, out, lid=lid: seen.setdefault(lid, out.detach().clone())) for lid in em.layer_ids]
    prefix = [(5 * i + 1) % 251 for i in range(40)]
    try:
        with DecayRecorder(em) as rec:
            em.forward(prefix, em.new_cache())
    finally:
        for h in hooks:
            h.remove()
    a, b = em.layer_ids
    assert not torch.allclose(seen[a], seen[b])                      # the layers' gates differ
    for lid in em.layer_ids:
        assert torch.equal(torch.cat(rec.g[lid], dim=1), seen[lid].float())
