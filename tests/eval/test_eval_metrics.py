"""Spearman, summaries, per-prompt scores, horizon validation (Eq. 4, 5) and the KDA recurrence."""

from __future__ import annotations

import math

import pytest
import torch

from dasc_compile.eval.horizons import DecayRecorder, empirical_horizon, state_magnitude, validate_prefix
from dasc_compile.eval.kda_ops import kda_chunked, kda_recurrent
from dasc_compile.eval.metrics import mean_sd, median_iqr, prompt_scores, ranks, spearman


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


@pytest.mark.parametrize("which", ["gdn", "kda"])
def test_horizon_validation_observes_the_real_gate(which, gdn_model, kda_model):
    em = gdn_model if which == "gdn" else kda_model
    prefix = [(5 * i + 1) % 251 for i in range(40)]
    n = em.num_heads * em.units_per_head
    with DecayRecorder(em) as rec:
        em.forward(prefix, em.new_cache())
    for lid in em.layer_ids:
        g = torch.cat(rec.g[lid], dim=1)
        assert g.shape[:2] == (1, len(prefix)) and g[0].numel() == len(prefix) * n and bool((g <= 0).all())
    for lid, mixer in em.mixers.items():      # kernels restored
        assert getattr(mixer, em.kernel_attrs[0]).__name__ != "wrapped"
    hs = [torch.arange(1, n + 1, dtype=torch.float64) for _ in em.layer_ids]
    rows = validate_prefix(em, prefix, hs, 1e-3)
    assert [r["layer_id"] for r in rows] == em.layer_ids
    assert all(-1.0 <= r["rho_hs_he"] <= 1.0 and -1.0 <= r["rho_hs_ms"] <= 1.0 for r in rows)


def test_kda_chunked_equals_recurrent():
    torch.manual_seed(0)
    B, T, H, K, V = 2, 45, 3, 8, 6
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K), dim=-1)
    v, g, beta, s0 = torch.randn(B, T, H, V), -torch.rand(B, T, H, K) * 4, torch.rand(B, T, H), torch.randn(B, H, K, V)
    o1, s1 = kda_recurrent(q, k, v, g, beta, s0)
    o2, s2 = kda_chunked(q, k, v, g, beta, s0, chunk_size=16)
    assert torch.allclose(o1, o2, atol=1e-5) and torch.allclose(s1, s2, atol=1e-5)
    # one hand step from zero: S = beta k v^T, o = S^T q / sqrt(K)
    o, s = kda_recurrent(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1])
    want = beta[:, 0, :, None, None] * k[:, 0, :, :, None] * v[:, 0, :, None, :]
    assert torch.allclose(s, want, atol=1e-6)
    assert torch.allclose(o[:, 0], (want * q[:, 0, :, :, None]).sum(-2) / math.sqrt(K), atol=1e-6)
