"""benchmarks/train/kda_chunk.py against transformers' own chunked KDA (outputs, final state, gradients)."""

from __future__ import annotations

import pytest
import torch

mk = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")

from benchmarks.train.kda_chunk import chunk_kda  # noqa: E402

REFERENCE = mk.chunk_kimi_delta_attention   # transformers' fallback (no flash-linear-attention here)


def _inputs(B, T, H, K, V, seed, strong_decay):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=gen) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=gen)
    scale = 4.0 if strong_decay else 0.3       # strong: per-token log decay down to about -4 (overflow test)
    g = -torch.rand(B, T, H, K, generator=gen) * scale
    beta = torch.rand(B, T, H, generator=gen)
    s0 = torch.randn(B, H, K, V, generator=gen) * 0.1
    return [x.double().requires_grad_(True) for x in (q, k, v, g, beta, s0)]


@pytest.mark.parametrize("T,strong", [(64, False), (100, False), (130, True)], ids=["T64", "T100-padded", "T130-strong"])
def test_matches_transformers(T, strong):
    ins = _inputs(2, T, 2, 16, 8, seed=T, strong_decay=strong)
    outs = []
    for fn in (REFERENCE, chunk_kda):
        xs = [x.detach().clone().requires_grad_(True) for x in ins]
        o, s = fn(*xs[:5], initial_state=xs[5], output_final_state=True, use_qk_l2norm_in_kernel=True)
        (o.square().sum() + s.square().sum() * 0.5).backward()
        outs.append((o.detach(), s.detach(), [x.grad for x in xs]))
    (o1, s1, g1), (o2, s2, g2) = outs
    assert o2.dtype == o1.dtype
    torch.testing.assert_close(o2.double(), o1.double(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s2.double(), s1.double(), rtol=1e-5, atol=1e-6)
    for a, b in zip(g2, g1):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
