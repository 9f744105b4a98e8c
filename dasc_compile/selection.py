"""Unit selection: global (kept) units are those with H_s(u) > w_max (paper §4.1); the Random
baseline keeps the same count per layer, drawn uniformly from a seed (§5.2)."""

from __future__ import annotations

import torch


def select_global(h: torch.Tensor, w_max: int) -> torch.Tensor:
    """Flat indices of global units, sorted increasing.

    Args:
        h: float64 ``[n_units]`` retention horizons, tokens (inf allowed).
        w_max: cutoff in tokens, >= 0.
    Returns:
        int64 ``[r]`` unit indices with ``h > w_max`` (strict, as in §4.1).
    """
    return torch.nonzero(h > w_max, as_tuple=False).reshape(-1)


def random_count_matched(n_units: int, n_kept: int, seed: int, layer_id: int) -> torch.Tensor:
    """Count-matched random mask for one layer: ``n_kept`` of ``n_units`` drawn uniformly.

    The draw is a ``torch.Generator`` (CPU) seeded with ``seed * 1_000_003 + layer_id``, so masks
    are identical across runs and machines for the same (seed, layer).

    Returns:
        int64 ``[n_kept]`` sorted unit indices.
    """
    if not 0 <= n_kept <= n_units:
        raise ValueError(f"n_kept must be in [0, {n_units}], got {n_kept}")
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed) * 1_000_003 + int(layer_id))
    perm = torch.randperm(n_units, generator=gen)
    return torch.sort(perm[:n_kept]).values


def layer_kept_sets(spec, policy, horizons: list[torch.Tensor]) -> list[torch.Tensor]:
    """The global (kept) units of each recurrent layer: int64 ``[r_l]`` sorted unit ids, those with
    ``H_s > policy.w_max`` (§4.1), or for a Random plan (``policy.random_seed``) as many drawn uniformly (§5.2).

    Args:
        spec: the model's :class:`~dasc_compile.archspec.ArchSpec` (``recurrent_layer_ids``, ``n_units_per_layer``).
        policy: the resolved :class:`~dasc_compile.policy.Policy` (``w_max``, ``random_seed``).
        horizons: per recurrent layer, float64 ``[n_units]`` (``dasc_compile.compiler.layer_horizons``).
    """
    out = []
    for layer_id, h in zip(spec.recurrent_layer_ids, horizons):
        kept = select_global(h, policy.w_max)
        if policy.random_seed is not None:
            kept = random_count_matched(spec.n_units_per_layer, int(kept.numel()), policy.random_seed, layer_id)
        out.append(kept)
    return out
