"""Static log-decay and retention horizons (paper Eq. 2 and Eq. 3) and refresh windows (Eq. 7)."""

from __future__ import annotations

import math

import torch

from dasc_compile.families import load_all
from dasc_compile.families.base import FAMILIES
# Eq. 7's windows live in the plan's schema package, whose reader checks them (the runtime imports only that package)
from dasc_compile.schema.cutoff import layer_refresh_window

__all__ = ["HORIZON_BIN_EDGES", "horizon_histogram", "horizon_quantiles", "replay_window", "retention_horizon",
           "static_log_decay"]

#: Histogram bin edges for horizons, tokens: [0, 1, 2, 4, ..., 2^20]; the last bin also holds inf.
HORIZON_BIN_EDGES: list[float] = [0.0] + [float(2**i) for i in range(0, 21)]


def static_log_decay(family: str, a_log: torch.Tensor, dt_bias: torch.Tensor, a_s: float,
                     lower_bound: float = -5.0) -> torch.Tensor:
    """g_s(u) of Eq. 2 for one layer.

    Args:
        family: ``gdn`` | ``kda`` | ``kda_safe_gate`` | ``mamba2``.
        a_log: ``[H]`` (any float dtype; any shape with H elements, e.g. KDA ``[1, 1, H, 1]``).
        dt_bias: ``[H * U]`` (U units per head).
        a_s: representative gate input.
        lower_bound: l of the safe gate (ignored by softplus families).
    Returns:
        float64 ``[H * U]``: natural-log decay per token of each unit (normally < 0).
    Raises:
        ValueError: ``dt_bias.numel()`` is not a multiple of ``a_log.numel()``.
    """
    a = a_log.detach().reshape(-1).to(torch.float64)
    d = dt_bias.detach().reshape(-1).to(torch.float64)
    if d.numel() % a.numel() != 0:
        raise ValueError(f"dt_bias has {d.numel()} elements, must be a multiple of A_log's {a.numel()}")
    load_all()
    return FAMILIES[family].static_log_decay(a, d, float(a_s), float(lower_bound))


def retention_horizon(g: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """H_s = ln(eps) / g_s (Eq. 3), tokens, float64, same shape as ``g``.

    A unit whose static decay is not negative (g_s >= 0: it never forgets) gets H_s = +inf, so it
    is always global (kept) whatever w_max is.
    """
    g = g.to(torch.float64)
    return torch.where(g < 0, math.log(eps) / g, torch.full_like(g, math.inf))


def replay_window(local_horizons: torch.Tensor, w_max: int, n_p: int | None = None) -> int:
    """W_replay = min(n_p, max_{u local} W_u) (Eq. 7); 0 when no unit is omitted.

    Args:
        local_horizons: float64 ``[n_local]`` horizons (tokens) of the omitted units.
        w_max: cutoff, tokens.
        n_p: cached prefix length in tokens (None: the cap before the prefix bound).
    """
    w = layer_refresh_window(float(local_horizons.max()) if local_horizons.numel() else None, w_max)
    return w if n_p is None else min(n_p, w)


def horizon_quantiles(h: torch.Tensor) -> dict[str, float]:
    """min / p10 / p50 / p90 / max of ``h`` (tokens; inf allowed), lower-interpolation quantiles."""
    s, _ = torch.sort(h.to(torch.float64))
    n = s.numel()

    def q(p: float) -> float:
        return float(s[min(n - 1, int(math.floor(p * (n - 1))))])

    return {"min": float(s[0]), "p10": q(0.10), "p50": q(0.50), "p90": q(0.90), "max": float(s[-1])}


def horizon_histogram(h: torch.Tensor, edges: list[float] = HORIZON_BIN_EDGES) -> list[int]:
    """Counts of ``h`` in bins [edge_i, edge_{i+1}); the last bin is [edge_-1, inf]."""
    e = torch.tensor(edges, dtype=torch.float64)
    idx = torch.bucketize(h.to(torch.float64), e, right=True) - 1
    idx = idx.clamp(0, len(edges) - 1)
    return torch.bincount(idx, minlength=len(edges)).tolist()
