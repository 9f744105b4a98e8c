"""Chunked Mamba2 (SSD) in plain PyTorch, for training transformers' ``NemotronHForCausalLM`` without
mamba_ssm.

Why not transformers' own PyTorch path: on 5.12.1 ``NemotronHMamba2Mixer.torch_forward`` passes states
between chunks wrongly (it sums ``decay_chunk * states`` over the target chunk, ``.sum(dim=2)``; see
dasc_compile/eval/mamba2.py), so past the first ``chunk_size`` tokens its outputs are not Mamba2's; 5.17
fixed that. Both releases also form the intra-chunk products as ``[B, n, L, L, H, N]`` and
``[B, n, L, L, H, P]`` elementwise tensors (here: matmuls), and clamp the step at ``time_step_min`` where
mamba_ssm and SGLang (what dasc compile describes) clamp to ``time_step_limit``, ``(0, inf)`` as released.

The recurrence (per head h with B/C group g(h) = h // (H / G), token t)::

    dt_t = clamp(softplus(dt_raw_t + dt_bias[h]), *time_step_limit),   a_t = dt_t * A[h],   A[h] = -exp(A_log[h])
    S_t  = exp(a_t) * S_{t-1} + dt_t * x_t B_t^T        (S: [P, N], x_t: [P], B_t, C_t: [N])
    y_t  = S_t C_t + D[h] * x_t

Chunked (chunks of L tokens, cumulative log decay c_i within a chunk): inside a chunk
``y_i = sum_{j<=i} (C_i . B_j) exp(c_i - c_j) dt_j x_j`` (one ``[L, L]`` matmul per head); each chunk's
own state ``sum_j exp(c_L - c_j) dt_j x_j B_j^T``; the states entering the chunks from one ``[n+1, n+1]``
decay matrix over chunks; and ``y_i += exp(c_i) C_i . S_in``. All exponents are <= 0 (no overflow).
``tests/benchmarks/test_train_mamba2_chunk.py`` checks outputs, final states and gradients against the
token-by-token recurrence, and the whole model against transformers' own one-token decoding.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F


def _segsum(a: torch.Tensor) -> torch.Tensor:
    """``out[..., i, j] = sum_{k=j+1..i} a[..., k]`` for j <= i, -inf above the diagonal; a: ``[..., n]``."""
    n = a.shape[-1]
    x = a[..., None].expand(*a.shape, n)                                   # x[..., k, j] = a[..., k]
    x = x.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=a.device).tril(-1), 0.0)
    out = x.cumsum(dim=-2)
    return out.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=a.device).tril(), float("-inf"))


def ssd_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
             D: torch.Tensor | None = None, chunk_size: int = 128,
             initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The Mamba2 recurrence of the module docstring over a whole sequence, fp32 inside (fp64 for fp64 x).

    Args:
        x: ``[Bt, T, H, P]``. dt: ``[Bt, T, H]``, the step after softplus and clamp (> 0). A: ``[H]`` (< 0).
        B, C: ``[Bt, T, G, N]``, G dividing H. D: ``[H]`` or None. chunk_size: L, any positive int.
        initial_state: ``[Bt, H, P, N]`` or None (zeros).
    Returns:
        (y ``[Bt, T, H, P]``, final state ``[Bt, H, P, N]``), both fp32 (fp64 for fp64 x).
    """
    Bt, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    assert H % G == 0, f"heads ({H}) must be a multiple of the B/C groups ({G})"
    L = chunk_size
    pad = (L - T % L) % L
    n = (T + pad) // L
    wide = torch.promote_types(x.dtype, torch.float32)                     # fp32, or fp64 when given (tests)
    x, dt, A, B, C = (t.to(wide) for t in (x, dt, A, B, C))
    # padded tokens have dt = 0: they neither decay the state nor add to it
    xs = F.pad(x, (0, 0, 0, 0, 0, pad)).reshape(Bt, n, L, G, H // G, P).permute(0, 1, 3, 4, 2, 5)   # [Bt,n,G,R,L,P]
    dts = F.pad(dt, (0, 0, 0, pad)).reshape(Bt, n, L, G, H // G).permute(0, 1, 3, 4, 2)            # [Bt,n,G,R,L]
    Bs, Cs = (F.pad(t, (0, 0, 0, 0, 0, pad)).reshape(Bt, n, L, G, N).transpose(2, 3) for t in (B, C))  # [Bt,n,G,L,N]
    a = dts * A.reshape(G, H // G, 1)                                     # [Bt,n,G,R,L] log decay per token
    c = a.cumsum(dim=-1)                                                   # inclusive, within the chunk
    c_last = c[..., -1:]                                                   # [Bt,n,G,R,1]
    # 1. within each chunk
    decay = (c[..., :, None] - c[..., None, :]).masked_fill(
        ~torch.ones(L, L, dtype=torch.bool, device=x.device).tril(), float("-inf")).exp()   # [Bt,n,G,R,L,L]
    scores = (Cs @ Bs.transpose(-1, -2))[:, :, :, None] * decay * dts[..., None, :]
    y = scores @ xs                                                        # [Bt,n,G,R,L,P]
    # 2. each chunk's own contribution to the state at its end: [Bt,n,G,R,P,N]
    xw = xs * ((c_last - c).exp() * dts)[..., None]
    own = xw.transpose(-1, -2) @ Bs[:, :, :, None]
    # 3. states entering chunk z = 0..n (z = n: the final state)
    s0 = (x.new_zeros(Bt, 1, G, H // G, P, N) if initial_state is None
          else initial_state.to(wide).reshape(Bt, 1, G, H // G, P, N))
    states = torch.cat([s0, own], dim=1)                                   # [Bt,n+1,G,R,P,N]
    chunk_decay = _segsum(F.pad(c_last[..., 0].permute(0, 2, 3, 1), (1, 0))).exp()   # [Bt,G,R,n+1,n+1]
    entering = torch.einsum("bgrzc,bcgrpn->bzgrpn", chunk_decay, states)
    # 4. the entering state read out inside each chunk
    y = y + (Cs[:, :, :, None] @ entering[:, :-1].transpose(-1, -2)) * c.exp()[..., None]
    y = y.permute(0, 1, 4, 2, 3, 5).reshape(Bt, n * L, H, P)[:, :T]
    if D is not None:
        y = y + x * D.to(wide)[:, None]
    return y, entering[:, -1].reshape(Bt, H, P, N)


def mixer_forward(mixer, hidden_states: torch.Tensor) -> torch.Tensor:
    """A transformers ``NemotronHMamba2Mixer`` on a whole sequence from a zero state (no cache, no padding
    mask): its own projections, conv, gated norm and parameters, with :func:`ssd_scan` as the scan.

    Args:
        hidden_states: ``[Bt, T, hidden]``.
    Returns:
        ``[Bt, T, hidden]`` in ``hidden_states``' dtype (the out projection's under autocast).
    """
    Bt, T, _ = hidden_states.shape
    H, P, G, N = mixer.num_heads, mixer.head_dim, mixer.n_groups, mixer.ssm_state_size
    inner = H * P
    proj = mixer.in_proj(hidden_states)
    assert proj.shape[-1] == inner + mixer.conv_dim + H, "unexpected in_proj width (an MLP share is not supported)"
    gate, xbc, dt = proj.split([inner, mixer.conv_dim, H], dim=-1)
    xbc = mixer.act(mixer.conv1d(xbc.transpose(1, 2))[..., :T].transpose(1, 2))
    x, B, C = xbc.split([inner, G * N, G * N], dim=-1)
    lo, hi = (float(v) for v in mixer.config.time_step_limit)
    with torch.autocast(device_type=hidden_states.device.type, enabled=False):
        step = F.softplus(dt.float() + mixer.dt_bias.float()).clamp(lo, hi)
        y, _ = ssd_scan(x.reshape(Bt, T, H, P), step, -torch.exp(mixer.A_log.float()), B.reshape(Bt, T, G, N),
                        C.reshape(Bt, T, G, N), mixer.D, mixer.chunk_size)
    y = mixer.norm(y.reshape(Bt, T, inner), gate)
    return mixer.out_proj(y.to(hidden_states.dtype))


def _forward(self, hidden_states, *args, **kwargs):
    cache = kwargs.get("cache_params", kwargs.get("cache", args[0] if args else None))
    mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
    if cache is None and mask is None:
        return mixer_forward(self, hidden_states)
    return type(self).forward(self, hidden_states, *args, **kwargs)


def use_chunk_scan(model) -> int:
    """Make every Mamba2 mixer of ``model`` (a transformers Nemotron-H) run :func:`mixer_forward` for
    whole-sequence passes without cache or padding mask; any other call goes to transformers' own forward.
    Returns the number of mixers changed.

    Why an instance attribute: transformers offers no argument to choose the scan (5.12 inlines it in
    ``torch_forward``, later releases pick kernels from the Hub or mamba_ssm at call time). Setting it
    on this model's mixers only leaves every other model of the process (dasc eval's) untouched; the
    weights, names and checkpoint format stay transformers' own.
    """
    n = 0
    for module in model.modules():
        if type(module).__name__ == "NemotronHMamba2Mixer":
            module.forward = types.MethodType(_forward, module)
            n += 1
    return n
