"""benchmarks/train/mamba2_chunk.py: the chunked scan against the token-by-token Mamba2 recurrence (outputs,
final state, gradients), and a whole Nemotron-H model with it against transformers' own one-token decoding."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from benchmarks.train.mamba2_chunk import ssd_scan, use_chunk_scan  # noqa: E402
from benchmarks.train.models import build_model  # noqa: E402


def recurrence(x, dt, A, B, C, D, s0):
    """S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T, y_t = S_t C_t + D x_t, one token at a time (float64)."""
    Bt, T, H, P = x.shape
    rep = H // B.shape[2]
    Bh, Ch = B.repeat_interleave(rep, dim=2), C.repeat_interleave(rep, dim=2)       # [Bt, T, H, N]
    S, ys = s0, []
    for t in range(T):
        S = torch.exp(dt[:, t] * A)[..., None, None] * S + dt[:, t, :, None, None] * x[:, t, ..., None] * Bh[:, t, :, None]
        ys.append((S @ Ch[:, t, ..., None])[..., 0] + D[:, None] * x[:, t])
    return torch.stack(ys, dim=1), S


def _inputs(T, strong, seed):
    gen = torch.Generator().manual_seed(seed)
    Bt, H, P, G, N = 2, 4, 3, 2, 5
    x = torch.randn(Bt, T, H, P, generator=gen)
    dt = torch.rand(Bt, T, H, generator=gen) * (2.0 if strong else 0.1) + 1e-3   # strong: exp(dt A) down to e^-16
    A = -torch.tensor([0.5, 1.0, 4.0, 8.0])
    B, C = (torch.randn(Bt, T, G, N, generator=gen) for _ in range(2))
    D = torch.randn(H, generator=gen)
    s0 = torch.randn(Bt, H, P, N, generator=gen) * 0.5
    return [t.double().requires_grad_(True) for t in (x, dt, A, B, C, D, s0)]


@pytest.mark.parametrize("T,chunk,strong", [(16, 16, False), (50, 16, False), (70, 32, True), (9, 64, True)],
                         ids=["one-chunk", "4-chunks-padded", "3-chunks-strong", "shorter-than-a-chunk"])
def test_chunked_scan_is_the_recurrence(T, chunk, strong):
    ins = _inputs(T, strong, seed=T)
    results = []
    for fn in (lambda *a: recurrence(*a), lambda x, dt, A, B, C, D, s0: ssd_scan(x, dt, A, B, C, D, chunk, s0)):
        xs = [t.detach().clone().requires_grad_(True) for t in ins]
        y, s = fn(*xs)
        (y.square().sum() + 0.5 * s.square().sum()).backward()
        results.append((y.detach().double(), s.detach().double(), [t.grad for t in xs]))
    (y1, s1, g1), (y2, s2, g2) = results
    assert y2.shape == y1.shape == (2, T, 4, 3) and s2.shape == (2, 4, 3, 5)
    torch.testing.assert_close(y2, y1, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(s2, s1, rtol=1e-9, atol=1e-9)
    for name, a, b in zip(("x", "dt", "A", "B", "C", "D", "s0"), g2, g1):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=lambda m: f"grad {name}: {m}")


def _mixer_outputs(model, ids, step_by_step: bool) -> list[torch.Tensor]:
    """Each Mamba2 mixer's output ``[B, T, hidden]`` for ``ids``: one whole-sequence pass without cache, or
    transformers' cached one-token steps."""
    mixers = [m for m in model.modules() if type(m).__name__ == "NemotronHMamba2Mixer"]
    rec = {i: [] for i in range(len(mixers))}
    hooks = [m.register_forward_hook(lambda _m, _a, out, i=i: rec[i].append(out.detach())) for i, m in enumerate(mixers)]
    with torch.no_grad():
        if step_by_step:
            cache = None
            for t in range(ids.shape[1]):
                cache = model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).past_key_values
        else:
            model(input_ids=ids, use_cache=False)
    for h in hooks:
        h.remove()
    return [torch.cat(rec[i], dim=1) for i in range(len(mixers))]


def test_model_with_the_scan_matches_transformers_one_token_decoding():
    """The patched whole-sequence pass over 3 chunks against transformers' own cached one-token steps (the
    plain recurrence, on 5.12 too), mixer by mixer. D = 0, so each output is the state's read-out alone;
    head steps ~0.05, 0.02, 3e-4 and 0.1: the third below time_step_min (1e-3), where the trained scan must
    not clamp (time_step_limit (0, inf)); the reference's own clamp is switched off. (transformers 5.12's
    own whole-sequence pass fails this from the second chunk on.)"""
    model = build_model("mamba2", "smoke", 300, 299, seed=1).eval()
    inv_softplus = torch.tensor([0.05, 0.02, 3e-4, 0.1]).expm1().log()
    for mod in model.modules():
        if type(mod).__name__ == "NemotronHMamba2Mixer":
            with torch.no_grad():
                mod.D.zero_()
                mod.in_proj.weight[mod.num_heads * mod.head_dim:-mod.num_heads].mul_(10.0)   # x, B, C of order 1
                mod.dt_bias.copy_(inv_softplus)
                mod.A_log.copy_(torch.tensor([0.05, 0.5, 2.0, 8.0]).log())
            mod.time_step_min, mod.time_step_limit = 0.0, (0.0, float("inf"))     # 5.12's / later names
    ids = torch.randint(0, 300, (2, 150), generator=torch.Generator().manual_seed(0))   # chunk_size 64: 3 chunks
    want = _mixer_outputs(model, ids, step_by_step=True)
    assert use_chunk_scan(model) == 3
    got = _mixer_outputs(model, ids, step_by_step=False)
    for w, g in zip(want, got):
        assert g.shape == w.shape == (2, 150, 32)
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * float(w.std()))
