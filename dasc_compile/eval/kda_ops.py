"""Kimi Delta Attention recurrence in plain PyTorch: a token-by-token form and a chunked form.

Paper Eq. 1 with the state stored key-major, as flash-linear-attention and transformers store it:
``S [B, H, d_k, d_v]`` (the paper's ``[d_v, d_k]`` state transposed), so the paper's KDA unit, the
column ``S[h, :, k]``, is the row ``S[b, h, k, :]`` here. One step, per head::

    S <- Diag(exp(g_t)) S                      (channel-wise decay, g_t <= 0, [d_k])
    S <- S + beta_t * k_t (v_t - S^T k_t)^T    (delta rule)
    o_t = S^T (q_t / sqrt(d_k))

Both functions take q, k ``[B, T, H, d_k]`` (already L2-normalised), v ``[B, T, H, d_v]``, g
``[B, T, H, d_k]`` (natural-log decay per token), beta ``[B, T, H]``, an optional initial state
``[B, H, d_k, d_v]``, and return ``(o [B, T, H, d_v] in v's dtype, S_final [B, H, d_k, d_v] float32)``.
All arithmetic is float32 whatever the autocast context. Written for dasc (transformers 5.12 has no
KDA model and flash-linear-attention's kernels need a GPU); checked against each other in tests and
against fla's ``chunk_kda`` on the H200 (benchmarks/train_hybrid.py).
"""

from __future__ import annotations

import torch


def _f32(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.float() for x in xs]


def kda_recurrent(q, k, v, g, beta, initial_state=None):
    """Token-by-token KDA (the definition); O(T) Python steps, for decoding and as the test oracle.

    Shapes and return value: see the module docstring.
    """
    out_dtype = v.dtype
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v, g, beta = _f32(q, k, v, g, beta)
        B, T, H, K = k.shape
        V = v.shape[-1]
        q = q * K ** -0.5
        S = torch.zeros(B, H, K, V, device=q.device) if initial_state is None else initial_state.float().clone()
        outs = []
        for t in range(T):
            S = S * g[:, t].exp()[..., None]
            pred = (S * k[:, t, :, :, None]).sum(-2)                           # S^T k  [B, H, V]
            S = S + k[:, t, :, :, None] * (beta[:, t, :, None] * (v[:, t] - pred))[:, :, None, :]
            outs.append((S * q[:, t, :, :, None]).sum(-2))
        o = torch.stack(outs, dim=1) if outs else v.new_zeros(B, 0, H, V)
    return o.to(out_dtype), S


def kda_chunked(q, k, v, g, beta, initial_state=None, chunk_size: int = 32):
    """Chunked KDA: exact reformulation of :func:`kda_recurrent` (up to float rounding), differentiable.

    Within a chunk of C tokens with cumulative log-decay G_t = sum_{s<=t} g_s ([d_k] per token), the
    delta-rule writes u_s solve the unit lower-triangular system (I + A) U = beta*V - beta*(K e^G) S_0
    with A[s, r] = beta_s sum_k k_s[k] k_r[k] e^{G_s[k] - G_r[k]} (r < s); then
    o_t = (q_t e^{G_t}) S_0 + sum_{s<=t} (sum_k q_t[k] k_s[k] e^{G_t[k]-G_s[k]}) u_s and
    S_C = e^{G_C} S_0 + sum_s (k_s e^{G_C - G_s}) u_s^T. The pairwise decays e^{G_t - G_s} are formed
    only for t >= s (never overflow). Chunks are solved in parallel; the state passes between chunks
    in a loop of T / C steps. Memory: ``B*H*(T/C)*C*C*d_k`` floats for the pairwise decays.

    Shapes and return value: see the module docstring. ``T`` need not be a multiple of ``chunk_size``.
    """
    out_dtype = v.dtype
    B, T, H, K = k.shape
    V = v.shape[-1]
    C = chunk_size
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v, g, beta = _f32(q, k, v, g, beta)
        pad = (-T) % C
        if pad:
            q, k, v, g = (torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v, g))
            beta = torch.nn.functional.pad(beta, (0, 0, 0, pad))
        N = (T + pad) // C
        # [B, H, N, C, *]
        q, k, v, g = (x.reshape(B, N, C, H, x.shape[-1]).permute(0, 3, 1, 2, 4) for x in (q, k, v, g))
        beta = beta.reshape(B, N, C, H).permute(0, 3, 1, 2)
        q = q * K ** -0.5
        G = g.cumsum(dim=-2)                                                    # [B, H, N, C, K]
        diff = G[..., :, None, :] - G[..., None, :, :]                          # [.., t, s, K] = G_t - G_s
        lower_incl = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device))
        decay = torch.where(lower_incl[..., None], diff, torch.full_like(diff, float("-inf"))).exp()
        kk = torch.einsum("bhntk,bhnsk,bhntsk->bhnts", k, k, decay)
        strict = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device), diagonal=-1)
        A = torch.where(strict, kk * beta[..., :, None], torch.zeros_like(kk))
        eye = torch.eye(C, device=q.device)
        L = eye + A                                                             # unit lower triangular
        rhs_v = v * beta[..., None]                                             # [B, H, N, C, V]
        rhs_k = k * G.exp() * beta[..., None]                                   # [B, H, N, C, K]
        sol = torch.linalg.solve_triangular(L, torch.cat([rhs_v, rhs_k], dim=-1), upper=False, unitriangular=True)
        U_v, W = sol[..., :V], sol[..., V:]
        qk = torch.einsum("bhntk,bhnsk,bhntsk->bhnts", q, k, decay)              # includes s == t
        q_dec = q * G.exp()                                                     # [B, H, N, C, K]
        k_tail = k * (G[..., -1:, :] - G).exp()                                 # e^{G_C - G_s} k_s
        g_tot = G[..., -1, :].exp()                                             # [B, H, N, K]
        S = torch.zeros(B, H, K, V, device=q.device) if initial_state is None else initial_state.float()
        outs = []
        for n in range(N):
            U = U_v[:, :, n] - W[:, :, n] @ S                                   # [B, H, C, V]
            outs.append(q_dec[:, :, n] @ S + qk[:, :, n] @ U)
            S = g_tot[:, :, n, :, None] * S + k_tail[:, :, n].transpose(-1, -2) @ U
        o = torch.stack(outs, dim=2).reshape(B, H, N * C, V)[:, :, :T].transpose(1, 2)
    return o.contiguous().to(out_dtype), S
