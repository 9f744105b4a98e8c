"""Chunked Kimi Delta Attention in plain PyTorch, for training transformers' ``KimiLinearForCausalLM``
without flash-linear-attention.

Same contract and arithmetic as transformers' fallback ``chunk_kimi_delta_attention`` (fp32 inside,
l2-normalised q/k, scale d_k^-1/2, chunk 64), reorganised for speed and memory:

- the WY system ``(I + A)^-1`` is one ``torch.linalg.solve_triangular`` instead of a 63-step loop
  of in-place row updates (each of which autograd had to save);
- the intra-chunk products ``sum_k x_i[k] y_j[k] exp(G_i[k] - G_j[k])`` are formed per sub-chunk of
  16 positions: exactly (``[16, 16, d_k]`` elementwise) on the diagonal blocks, and as one matmul
  per block row off the diagonal, with both exponents taken against the cumulative decay at the
  block row's start, so both factors are <= 1 (no overflow; fla's ``chunk_kda`` does the same).
  transformers materialises ``[64, 64, d_k]`` per chunk for this; here it is 4x smaller.

``tests/benchmarks/test_train_kda_chunk.py`` checks outputs, final states and gradients against
transformers' function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SUB = 16


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _intra(xs: list[torch.Tensor], y: torch.Tensor, G: torch.Tensor) -> list[torch.Tensor]:
    """For each x in ``xs``: ``M[..., i, j] = sum_k x[..., i, k] y[..., j, k] exp(G[..., i, k] - G[..., j, k])``
    for j <= i, 0 above the diagonal.

    Args:
        xs: tensors of shape ``[..., C, K]`` fp32 (C a multiple of 16).
        y: ``[..., C, K]`` fp32.
        G: ``[..., C, K]`` fp32, inclusive cumulative log-decay within the chunk (non-increasing along C).
    Returns:
        one ``[..., C, C]`` fp32 tensor per x.
    """
    C = y.shape[-2]
    nb = C // SUB
    tril = torch.ones(SUB, SUB, dtype=torch.bool, device=y.device).tril()
    rows: list[list[torch.Tensor]] = [[] for _ in xs]
    for a in range(nb):
        sl = slice(a * SUB, (a + 1) * SUB)
        Ga, ya = G[..., sl, :], y[..., sl, :]
        d = (Ga.unsqueeze(-2) - Ga.unsqueeze(-3)).masked_fill(~tril[..., None], float("-inf")).exp()  # [.., S, S, K]
        yd = ya.unsqueeze(-3) * d
        if a:
            ref = G[..., a * SUB - 1:a * SUB, :]                                          # [.., 1, K]
            y_left = (y[..., :a * SUB, :] * (ref - G[..., :a * SUB, :]).exp()).transpose(-1, -2)  # [.., K, aS]
            up = (Ga - ref).exp()
        for r, x in zip(rows, xs):
            xa = x[..., sl, :]
            parts = [(xa * up) @ y_left] if a else []
            parts.append((xa.unsqueeze(-2) * yd).sum(-1))
            if a + 1 < nb:
                parts.append(xa.new_zeros(*xa.shape[:-1], C - (a + 1) * SUB))
            r.append(torch.cat(parts, dim=-1))
    return [torch.cat(r, dim=-2) for r in rows]


def chunk_kda(query, key, value, g, beta, chunk_size: int = 64, initial_state=None, output_final_state: bool = False,
              use_qk_l2norm_in_kernel: bool = False, **kwargs):
    """Kimi Delta Attention over a whole sequence (transformers' ``chunk_kimi_delta_attention`` contract).

    Args:
        query, key: ``[B, T, H, K]``; value: ``[B, T, H, V]``; any float dtype.
        g: ``[B, T, H, K]`` per-channel log decay (<= 0); beta: ``[B, T, H]``.
        chunk_size: a multiple of 16.
        initial_state: ``[B, H, K, V]`` or None.
    Returns:
        (output ``[B, T, H, V]`` in query's dtype, final state ``[B, H, K, V]`` fp32 or None).
    """
    assert chunk_size % SUB == 0, f"chunk_size must be a multiple of {SUB}, got {chunk_size}"
    out_dtype = query.dtype
    with torch.autocast(device_type=query.device.type, enabled=False):
        q, k, v, b, gg = (x.transpose(1, 2).contiguous().float() for x in (query, key, value, beta, g))
        if use_qk_l2norm_in_kernel:
            q, k = _l2norm(q), _l2norm(k)
        B, H, T, K = k.shape
        Vd = v.shape[-1]
        C = chunk_size
        pad = (C - T % C) % C
        q = F.pad(q, (0, 0, 0, pad)) * K ** -0.5
        k, v, gg = (F.pad(x, (0, 0, 0, pad)) for x in (k, v, gg))
        b = F.pad(b, (0, pad))
        n = (T + pad) // C
        q, k, v, gg = (x.reshape(B, H, n, C, x.shape[-1]) for x in (q, k, v, gg))
        b = b.reshape(B, H, n, C, 1)
        G = gg.cumsum(dim=-2)                                        # [B, H, n, C, K]
        k_beta = k * b
        A, Aqk = _intra([k_beta, q], k, G)                           # [B, H, n, C, C]
        eye = torch.eye(C, dtype=A.dtype, device=A.device)
        system = A.tril(-1) + eye
        u = torch.linalg.solve_triangular(system, v * b, upper=False, unitriangular=True)
        w = torch.linalg.solve_triangular(system, k_beta * G.exp(), upper=False, unitriangular=True)
        g_last = G[..., -1:, :]                                      # [B, H, n, 1, K]
        q_dec = q * G.exp()
        k_dec = (k * (g_last - G).exp()).transpose(-1, -2)           # [B, H, n, K, C]
        chunk_dec = g_last.squeeze(-2).exp().unsqueeze(-1)           # [B, H, n, K, 1]
        S = (q.new_zeros(B, H, K, Vd) if initial_state is None else initial_state.float())
        outs = []
        for i in range(n):
            v_new = u[:, :, i] - w[:, :, i] @ S
            outs.append(q_dec[:, :, i] @ S + Aqk[:, :, i] @ v_new)
            S = S * chunk_dec[:, :, i] + k_dec[:, :, i] @ v_new
        o = torch.stack(outs, dim=2).reshape(B, H, n * C, Vd)[:, :, :T]
        o = o.transpose(1, 2).contiguous().to(out_dtype)
    return o, (S if output_final_state else None)


def use_chunk_kda_in_transformers() -> None:
    """Make transformers' ``KimiLinearDeltaAttention`` call :func:`chunk_kda` for whole-sequence passes.

    Why a patch: transformers picks the chunk function at import (flash-linear-attention's
    ``chunk_kda`` if importable, else its own slow fallback) and offers no argument to choose one;
    the module looks the name up in its globals at call time. The model, its weights and its
    outputs are transformers' own; only the arithmetic's schedule differs (tested equal).
    """
    from transformers.models.kimi_linear import modeling_kimi_linear as mk

    mk.chunk_kimi_delta_attention = chunk_kda
