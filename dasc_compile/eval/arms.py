"""The arms of the cached-prefix protocol: what a load policy does to a recurrent state checkpoint.

A plan's per-layer ``kept_units`` are the global units; every other unit is local (omitted). Units are
flat ids ``u = h * units_per_head + k`` (schema.py): a GDN unit is value head h's whole state, a KDA
unit is the paper's column ``S[h, :, k]``, which in the transformers cache's key-major state
temporal state ``[B, H, d_k, d_v]`` is the row ``[b, h, k, :]``. So a layer's mask is a bool
``[H, units_per_head]`` grid broadcast as ``[1, H, units_per_head, 1]`` over the state (for GDN,
``units_per_head = 1`` broadcasts over d_k). Conv states and full-attention KV are never touched.

Arms (paper §4.2, §5.2):
* ``dense``: the checkpoint unchanged.
* ``nr`` (dasc-nr): local units zeroed.
* ``wr`` (dasc-wr, Eq. 7): local units replaced by a scratch replay of the prefix's last
  ``W_replay = min(n_p, max W_u)`` tokens that starts from zero in every recurrent unit (global too,
  and a zero conv state) while the full-attention layers see the exact cached KV of the tokens before
  the window; global units keep their stored values.
* ``random``: dasc-nr with a count-matched random mask per seed (``dasc_compile.selection``).
* ``init``: dasc-nr with the init-horizon masks; ``untrained``: the initial model under the same masks
  (:mod:`dasc_compile.eval.controls`).
"""

from __future__ import annotations

import copy

import torch

from dasc_compile.eval.hf_compat import crop_attention, recurrent_state, reset_recurrent
from dasc_compile.selection import random_count_matched

#: The paper's five Random-mask seeds (§5.2, App. C).
RANDOM_SEEDS = (1234, 2027, 3407, 4519, 5683)
#: ``init`` and ``untrained`` are the controls of :mod:`dasc_compile.eval.controls`.
ARMS = ("dense", "nr", "wr", "random", "init", "untrained")


def keep_grids(kept_units: list[list[int]], num_heads: int, units_per_head: int) -> list[torch.Tensor]:
    """Per recurrent layer, bool ``[H, units_per_head]``: True for a kept (global) unit."""
    grids = []
    for kept in kept_units:
        g = torch.zeros(num_heads * units_per_head, dtype=torch.bool)
        g[torch.as_tensor(kept, dtype=torch.long)] = True
        grids.append(g.view(num_heads, units_per_head))
    return grids


def plan_kept_units(plan) -> list[list[int]]:
    """The plan's kept unit ids per recurrent layer, in ``recurrent_layer_ids`` order."""
    return [list(lp.kept_units) for lp in plan.layers]


def random_kept_units(plan, seed: int) -> list[list[int]]:
    """Count-matched Random masks: per layer ``n_kept`` of ``n_units`` drawn with ``seed`` (§5.2).

    Uses :func:`dasc_compile.selection.random_count_matched`, the draw ``dasc compile --random-seed``
    makes, so the masks equal those of a compiled Random plan.
    """
    return [random_count_matched(lp.n_units, lp.n_kept, seed, lp.layer_id).tolist() for lp in plan.layers]


def replay_window(plan, n_p: int) -> int:
    """W_replay = min(n_p, max over local units of W_u) (Eq. 7), 0 when the plan omits nothing; tokens."""
    if not plan.refresh.any_local:
        return 0
    return min(n_p, plan.refresh.w_replay_cap)


def replays_whole_prefix(w_replay_cap: int, n_p: int) -> bool:
    """Whether dasc-wr's replay (Eq. 7, ``min(n_p, W_replay)``) covers the whole ``n_p``-token cached prefix
    (``w_replay_cap``: the plan's ``refresh.w_replay_cap``, 0 when it omits nothing): the replay then rebuilds the
    state exactly, so dasc-wr equals dense by construction (``dasc sweep`` refuses such a run, ``dasc eval`` says so
    under its table)."""
    return 0 < w_replay_cap and n_p <= w_replay_cap


def _mask(state: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    return grid.to(state.device).view(1, grid.shape[0], grid.shape[1], 1)


def zero_local(cache, layer_ids: list[int], grids: list[torch.Tensor]) -> None:
    """dasc-nr in place: ``recurrent_states[:, local units] = 0`` in each recurrent layer."""
    for lid, grid in zip(layer_ids, grids):
        st = recurrent_state(cache.layers[lid])
        st.mul_(_mask(st, grid).to(st.dtype))


def copy_local_from(cache, scratch, layer_ids: list[int], grids: list[torch.Tensor]) -> None:
    """dasc-wr copy-back in place: local units of ``cache`` take ``scratch``'s values; global units stay."""
    for lid, grid in zip(layer_ids, grids):
        st = recurrent_state(cache.layers[lid])
        st.copy_(torch.where(_mask(st, grid), st, recurrent_state(scratch.layers[lid]).to(st.dtype)))


def scratch_replay(em, prefix_cache, prefix_ids: list[int] | torch.Tensor, window: int):
    """Replay the last ``window`` prefix tokens from a zero recurrent state (dasc-wr's scratch, §4.2).

    The scratch is a copy of the prefix cache whose full-attention KV is cropped to the first
    ``n_p - window`` tokens (exact, as cached) and whose linear-attention layers are reset (zero
    recurrent and conv state, no previous state, the token count kept at ``n_p - window`` so the window
    runs at its own positions: :func:`~dasc_compile.eval.hf_compat.reset_recurrent`); the window's tokens
    are then run through the model.
    ``prefix_ids``: one prompt's ids ``[n_p]``, or int64 ``[B, n_p]``, one row per row of the cache.

    Returns:
        the scratch cache after the replay (its ``recurrent_states`` hold the refreshed units).
    """
    ids = torch.as_tensor(prefix_ids, dtype=torch.long)
    ids = ids.reshape(1, -1) if ids.dim() == 1 else ids
    n_p = ids.shape[1]
    scratch = copy.deepcopy(prefix_cache)
    crop_attention(scratch, em.attention_layer_ids, n_p - window)
    for lid in em.layer_ids:
        reset_recurrent(scratch.layers[lid], n_p - window)      # the window runs at positions n_p - window ..
    em.forward_rows(ids[:, n_p - window:], scratch)
    return scratch


def arm_cache(em, prefix_cache, prefix_ids: list[int] | torch.Tensor, arm: str, grids: list[torch.Tensor] | None,
              window: int = 0):
    """A copy of the prefix cache with ``arm`` applied (``dense`` | ``nr`` | ``wr``; Random is ``nr``
    with a Random mask). ``window`` is W_replay for ``wr`` (0: no refresh, then wr equals nr);
    ``prefix_ids`` as :func:`scratch_replay` takes them."""
    cache = copy.deepcopy(prefix_cache)
    if arm == "dense":
        return cache
    if arm == "nr":
        zero_local(cache, em.layer_ids, grids)
        return cache
    if arm == "wr":
        if window <= 0:
            zero_local(cache, em.layer_ids, grids)
            return cache
        scratch = scratch_replay(em, prefix_cache, prefix_ids, window)
        copy_local_from(cache, scratch, em.layer_ids, grids)
        return cache
    raise ValueError(f"unknown arm {arm!r}")
