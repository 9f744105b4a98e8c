"""Tensor-parallel placement of state checkpoints (paper §4.3, App. B.1, Fig. 9; accounting App. C.1).

Under TP degree P, SGLang shards the value heads of every recurrent layer contiguously: rank r
computes heads ``[r*H/P, (r+1)*H/P)``. A state checkpoint's capacity is set by the rank that stores the
most kept units (the bottleneck rank). Two independent, exact reindexings even this out:

(a) compute-head permutation (:func:`assign_bundles`, Fig. 9 (a)): reorder head *bundles* per layer
    (one KDA head, or the ``B = H_v / H_k`` adjacent GDN value heads that share a key head) so that
    cumulative kept-unit loads are balanced; every head-coupled weight is reordered the same way at
    model load (:func:`coupled_tensors`, tables in :mod:`dasc_compile.tp_coupled`), so compute stays
    rank-local. Needs unquantized weights.
(b) storage balancing (:func:`balance_storage`, Fig. 9 (b)): leave compute ownership alone and move
    only the excess packed units to ranks below the target ``t_r`` with a variable-split all-to-all at
    store time; load inverts it (``dasc_runtime.tp_transfer``).

``balance`` modes: ``off`` (neither), ``storage`` (b only), ``hybrid`` (a then b).
:func:`build_tp_plan` is the compiler's entry point; it returns the plan's :class:`TPPlan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import numpy as np

from dasc_compile.archspec import ArchSpec
from dasc_compile.errors import DascInputError
from dasc_compile.policy import Policy
from dasc_compile.schema import LayerPermutation, RankPayload, StorageMap, TPPlan, usable_slots
from dasc_compile.tp_coupled import coupled_tensors

__all__ = [
    "BundleAssignment",
    "assign_bundles",
    "balance_storage",
    "build_tp_plan",
    "bundle_costs",
    "bundle_order_from_owner",
    "check_tp_config",
    "coupled_tensors",
    "head_costs",
    "phi",
]


# --------------------------------------------------------------------------------------------------
# validation


def check_tp_config(spec: ArchSpec, tp_size: int, balance: str, quantization_config: Optional[Mapping] = None) -> None:
    """Reject a TP degree / balance mode the architecture cannot serve (App. B.1 constraints).

    Raises:
        DascInputError: ``tp_size`` does not divide H_v (or H_k, which SGLang also shards); for
            ``hybrid``: ``H_v mod B != 0`` or ``(H_v / B) mod P != 0`` (B = H_v / H_k), or the
            checkpoint's weights are quantized (``quantization_config`` present: permuting packed
            quantized rows is not supported, use ``storage``).
    """
    hv_field, hk_field = spec.head_fields
    hv, hk = spec.num_value_heads, spec.num_key_heads
    if hv % tp_size != 0:
        raise DascInputError(
            f"tp_size {tp_size} (--tp, or the policy field 'tp_size') does not divide config field '{hv_field}' = {hv}: "
            f"SGLang shards heads contiguously, H/P per rank")
    if hk % tp_size != 0:
        raise DascInputError(
            f"tp_size {tp_size} (--tp, or the policy field 'tp_size') does not divide config field '{hk_field}' = {hk}: "
            f"SGLang shards key heads contiguously, H_k/P per rank")
    if balance != "hybrid":
        return
    if quantization_config is not None:
        method = quantization_config.get("quant_method", "?") if isinstance(quantization_config, Mapping) else "?"
        raise DascInputError(
            f"config field 'quantization_config' (quant_method={method!r}): policy balance='hybrid' permutes "
            f"weight rows and needs unquantized weights; use balance='storage'")
    if hv % hk != 0:
        raise DascInputError(
            f"config field '{hv_field}' = {hv} is not a multiple of '{hk_field}' = {hk}: "
            f"balance='hybrid' needs H_v mod B == 0 for bundles of B = H_v/H_k heads")
    b = hv // hk
    if (hv // b) % tp_size != 0:
        raise DascInputError(
            f"policy field 'tp_size' = {tp_size} does not divide the {hv // b} head bundles of config field "
            f"'{hv_field}' = {hv} (B = {b}): balance='hybrid' needs (H_v/B) mod P == 0")


def _check_kept(spec: ArchSpec, kept_units: Sequence[Sequence[int]]) -> None:
    n_layers, n = len(spec.recurrent_layer_ids), spec.n_units_per_layer
    if len(kept_units) != n_layers:
        raise ValueError(f"kept_units must list {n_layers} recurrent layers, got {len(kept_units)}")
    for i, kept in enumerate(kept_units):
        if any(not 0 <= u < n for u in kept) or any(a >= b for a, b in zip(kept, kept[1:])):
            raise ValueError(f"kept_units[{i}] must be sorted unique unit ids in [0, {n})")


# --------------------------------------------------------------------------------------------------
# costs


def head_costs(kept_units: Sequence[Sequence[int]], num_heads: int, units_per_head: int) -> np.ndarray:
    """c_{l,h}: kept units of each head (App. B.1): KDA kept-channel count, GDN kept indicator.

    Args:
        kept_units: per layer, sorted flat unit ids ``u = h * units_per_head + k``.
    Returns:
        int64 ``[L, H]``.
    """
    out = np.zeros((len(kept_units), num_heads), dtype=np.int64)
    for i, kept in enumerate(kept_units):
        if len(kept):
            np.add.at(out[i], np.asarray(kept, dtype=np.int64) // units_per_head, 1)
    return out


def bundle_costs(costs: np.ndarray, bundle_size: int) -> np.ndarray:
    """C_{l,b} = sum of c_{l,h} over the B adjacent heads of bundle b: int64 ``[L, H/B]`` (App. B.1)."""
    n_layers, h = costs.shape
    return costs.reshape(n_layers, h // bundle_size, bundle_size).sum(axis=2)


# --------------------------------------------------------------------------------------------------
# (a) compute-head permutation


def phi(loads: Sequence[int]) -> tuple[int, int]:
    """Load objective of Fig. 9 (a) step 3: ``(max_r L_r, sum_r L_r^2)``, compared lexicographically."""
    return int(max(loads)), int(sum(int(x) * int(x) for x in loads))


@dataclass(frozen=True)
class BundleAssignment:
    """Result of :func:`assign_bundles`.

    Attributes:
        owner: int ``[L][NB]``: rank of every bundle (per layer, exactly K = NB/P per rank).
        loads: int ``[P]``: cumulative kept units per rank over all layers (L_r).
        greedy_owner / greedy_loads: the same after the greedy phase, before local search.
        swaps: the applied swaps ``(layer, b1, b2)`` in order.
    """

    owner: list[list[int]]
    loads: list[int]
    greedy_owner: list[list[int]]
    greedy_loads: list[int]
    swaps: list[tuple[int, int, int]]


def _greedy(costs: np.ndarray, tp_size: int) -> tuple[np.ndarray, np.ndarray]:
    n_layers, nb = costs.shape
    quota = nb // tp_size
    loads = [0] * tp_size
    owner = np.full((n_layers, nb), -1, dtype=np.int64)
    for layer in range(n_layers):
        used = [0] * tp_size
        for b in sorted(range(nb), key=lambda b: (-int(costs[layer, b]), b)):
            c = int(costs[layer, b])
            r = min((r for r in range(tp_size) if used[r] < quota), key=lambda r: (loads[r] + c, loads[r], used[r], r))
            owner[layer, b] = r
            used[r] += 1
            loads[r] += c
    return owner, np.asarray(loads, dtype=np.int64)


def _max_excluding_pair(loads: np.ndarray) -> np.ndarray:
    """``[P, P]``: max load over ranks other than r1 and r2 (-1 when none are left; loads >= 0)."""
    p = loads.shape[0]
    out = np.full((p, p), -1, dtype=np.int64)
    for r1 in range(p):
        for r2 in range(p):
            rest = [loads[r] for r in range(p) if r != r1 and r != r2]
            if rest:
                out[r1, r2] = max(rest)
    return out


def _best_swap(costs: np.ndarray, owner: np.ndarray, loads: np.ndarray):
    """Best strictly improving within-layer swap under Phi (Fig. 9 (a) steps 4-5), or None.

    Scans layers, then pairs b1 < b2 in increasing (b1, b2) order, over bundles on different ranks;
    keeps the lexicographically smallest Phi and, on equal Phi, the first candidate in scan order.
    """
    cur_max, cur_sq = phi(loads)
    excl = _max_excluding_pair(loads)
    sq_total = int((loads * loads).sum())
    nb = costs.shape[1]
    upper = np.triu(np.ones((nb, nb), dtype=bool), k=1)
    best = None
    for layer in range(costs.shape[0]):
        c, o = costs[layer], owner[layer]
        d = c[None, :] - c[:, None]                     # [b1, b2]: rank of b1 gains d, rank of b2 loses d
        l1 = loads[o][:, None] + d
        l2 = loads[o][None, :] - d
        new_max = np.maximum(np.maximum(l1, l2), excl[o[:, None], o[None, :]])
        new_sq = sq_total - (loads[o] ** 2)[:, None] - (loads[o] ** 2)[None, :] + l1 * l1 + l2 * l2
        ok = upper & (o[:, None] != o[None, :]) & ((new_max < cur_max) | ((new_max == cur_max) & (new_sq < cur_sq)))
        if not ok.any():
            continue
        m = int(new_max[ok].min())
        ok &= new_max == m
        s = int(new_sq[ok].min())
        ok &= new_sq == s
        flat = int(np.argmax(ok))                       # first True in row-major (b1, b2) order
        cand = ((m, s), layer, flat // nb, flat % nb)
        if best is None or cand[0] < best[0]:
            best = cand
    return best


def assign_bundles(costs: Sequence[Sequence[int]] | np.ndarray, tp_size: int) -> BundleAssignment:
    """Compute-head permutation of Fig. 9 (a): greedy in layer order, then single-pair swap local search.

    Greedy: ranks start at load 0; per layer, bundles in ``(-C_{l,b}, b)`` order each go to the rank
    with the lexicographically smallest ``(L_r + C_{l,b}, L_r, u_r, r)`` among ranks with
    ``u_r < K`` (K = NB / P bundles per rank per layer). Local search: repeatedly apply the best
    strictly Phi-improving swap of two bundles of one layer on different ranks (first in
    (layer, b1, b2) order on equal Phi) until none improves. The result keeps every quota and is
    locally optimal for single within-layer swaps (not globally optimal).

    Args:
        costs: int ``[L, NB]`` bundle costs C_{l,b} (kept units per bundle), non-negative.
        tp_size: P; must divide NB.
    Returns:
        :class:`BundleAssignment`.
    Raises:
        ValueError: NB not divisible by P, or negative costs.
    """
    c = np.asarray(costs, dtype=np.int64)
    if c.ndim != 2:
        raise ValueError(f"costs must be [L, NB], got shape {tuple(c.shape)}")
    if c.shape[1] % tp_size != 0:
        raise ValueError(f"number of bundles ({c.shape[1]}) must be divisible by tp_size ({tp_size})")
    if (c < 0).any():
        raise ValueError("bundle costs must be non-negative")
    owner, loads = _greedy(c, tp_size)
    g_owner, g_loads = owner.copy(), loads.copy()
    swaps: list[tuple[int, int, int]] = []
    while True:
        best = _best_swap(c, owner, loads)
        if best is None:
            break
        _, layer, b1, b2 = best
        r1, r2 = int(owner[layer, b1]), int(owner[layer, b2])
        d = int(c[layer, b2] - c[layer, b1])
        loads[r1] += d
        loads[r2] -= d
        owner[layer, b1], owner[layer, b2] = r2, r1
        swaps.append((layer, b1, b2))
    return BundleAssignment(
        owner=owner.tolist(), loads=loads.tolist(), greedy_owner=g_owner.tolist(),
        greedy_loads=g_loads.tolist(), swaps=swaps)


def bundle_order_from_owner(owner: Sequence[int], tp_size: int) -> list[int]:
    """New bundle order: rank 0's bundles, then rank 1's, ..., each rank's in increasing original id,
    so SGLang's contiguous sharding hands rank r exactly the bundles it owns."""
    return [b for r in range(tp_size) for b in range(len(owner)) if owner[b] == r]


# --------------------------------------------------------------------------------------------------
# (b) storage balancing


def balance_storage(n_packed: Sequence[int], tp_size: Optional[int] = None) -> StorageMap:
    """Storage balancing of Fig. 9 (b): targets, keep-first, excess/deficit pairing, splits.

    N = sum n_r, (q, m) = divmod(N, P); ranks sorted by ``(-n_r, r)``, the first m get
    ``t_r = q + 1``, the rest ``q``. Each rank keeps its first ``min(n_r, t_r)`` packed units; excess
    units (by source rank, then local index) are paired in order with deficit positions (by
    destination rank, then position). Each excess unit moves exactly once, so the transfer
    ``M_remote = sum_r max(0, n_r - t_r)`` is the minimum for these targets.

    Args:
        n_packed: units each rank packs (compute layout), ``[P]``, non-negative.
    Returns:
        :class:`~dasc_compile.schema.StorageMap`.
    Raises:
        ValueError: negative counts or ``tp_size`` not matching ``len(n_packed)``.
    """
    n = [int(x) for x in n_packed]
    p = len(n)
    if tp_size is not None and tp_size != p:
        raise ValueError(f"n_packed must have tp_size = {tp_size} entries, got {p}")
    if p == 0 or any(x < 0 for x in n):
        raise ValueError(f"n_packed must be non-empty and non-negative, got {n}")
    total = sum(n)
    q, m = divmod(total, p)
    targets = [q] * p
    for r in sorted(range(p), key=lambda r: (-n[r], r))[:m]:
        targets[r] = q + 1
    keep = [min(a, t) for a, t in zip(n, targets)]
    excess = [(r, j) for r in range(p) for j in range(keep[r], n[r])]
    deficit = [(s, pos) for s in range(p) for pos in range(keep[s], targets[s])]
    assert len(excess) == len(deficit)
    send = [[0] * p for _ in range(p)]
    runs: list[list[list[int]]] = [[[0, keep[r], r, 0]] if keep[r] else [] for r in range(p)]
    for (r, j), (s, pos) in zip(excess, deficit):
        send[r][s] += 1
        last = runs[r][-1] if runs[r] else None
        if last is not None and last[2] == s and last[3] + last[1] == pos and last[0] + last[1] == j:
            last[1] += 1
        else:
            runs[r].append([j, 1, s, pos])
    return StorageMap(
        n_packed=n, targets=targets, keep=keep, slot_width=-(-total // p), runs=runs,
        send_splits=send, m_remote=sum(max(0, a - t) for a, t in zip(n, targets)))


# --------------------------------------------------------------------------------------------------
# plan


def _payloads(counts: Sequence[int], alloc: Sequence[int], bytes_per_unit: int, conv: int) -> list[RankPayload]:
    return [RankPayload(rank=r, n_kept=int(c), n_alloc=int(a), bytes_temporal=int(a) * bytes_per_unit,
                        bytes_conv=conv, bytes_per_slot=int(a) * bytes_per_unit + conv)
            for r, (c, a) in enumerate(zip(counts, alloc))]


def build_tp_plan(spec: ArchSpec, kept_units: Sequence[Sequence[int]], policy: Policy, *, bytes_per_unit: int,
                  conv_bytes_per_layer_rank: int, dense_temporal_bytes_per_layer_rank: int,
                  quantization_config: Optional[Mapping] = None) -> TPPlan:
    """TP placement maps and per-rank accounting for ``policy.tp_size`` and ``policy.balance``
    (App. B.1, Fig. 9; App. C.1).

    Args:
        spec: the architecture (heads, units per head, recurrent layers, decay tensor names).
        kept_units: per recurrent layer (``[L]``), sorted flat kept unit ids ``u = h * U + k`` in the
            checkpoint's head numbering (value head ``h = u // U``, U = ``spec.units_per_head``).
        policy: ``tp_size`` (P), ``balance`` (off | storage | hybrid), ``pool_budget_bytes`` (per rank).
        bytes_per_unit: bytes of one stored temporal unit (GDN ``d_v*d_k``, KDA ``d_v`` elements at
            the temporal dtype, or INT8 payload plus its scale bytes).
        conv_bytes_per_layer_rank: one layer's conv-state bytes on one rank at P.
        dense_temporal_bytes_per_layer_rank: one layer's dense temporal-state bytes on one rank at P.
        quantization_config: the config's ``quantization_config`` (``None`` when weights are
            unquantized); ``hybrid`` is refused when present.
    Returns:
        :class:`TPPlan`. Rank bytes per slot = units reserved * bytes_per_unit + L * conv bytes; dense
        bytes per slot = L * (dense temporal + conv); ``c_ckpt_tp`` = dense / bottleneck;
        ``usable_slots`` = floor(pool_budget_bytes / bottleneck) - 1 (slot 0 reserved) when a budget
        is set.
    Raises:
        DascInputError: see :func:`check_tp_config` and :func:`coupled_tensors`.
        ValueError: ``kept_units`` does not match ``spec`` (a compiler bug, not user input).
    """
    p, mode = policy.tp_size, policy.balance
    check_tp_config(spec, p, mode, quantization_config)
    _check_kept(spec, kept_units)
    hv, u_h = spec.num_value_heads, spec.units_per_head
    hl = hv // p
    n_layers = len(kept_units)
    costs = head_costs(kept_units, hv, u_h)                               # [L, H_v]
    contiguous = costs.reshape(n_layers, p, hl).sum(axis=2).T             # [P, L]
    compute = contiguous
    permutation = None
    if mode == "hybrid":
        b = hv // spec.num_key_heads
        assignment = assign_bundles(bundle_costs(costs, b), p)
        permutation = []
        per_rank = np.zeros((p, n_layers), dtype=np.int64)
        for i, (layer_id, owner) in enumerate(zip(spec.recurrent_layer_ids, assignment.owner)):
            order = bundle_order_from_owner(owner, p)
            permutation.append(LayerPermutation(
                layer_id=layer_id, bundle_size=b, bundle_owner=list(owner), bundle_order=order,
                head_order=[bb * b + j for bb in order for j in range(b)],
                coupled_tensors=coupled_tensors(spec, i)))
            for bb, r in enumerate(owner):
                per_rank[r, i] += int(costs[i, bb * b:(bb + 1) * b].sum())
        compute = per_rank
    conv = n_layers * conv_bytes_per_layer_rank
    n_contig = contiguous.sum(axis=1).tolist()
    n_compute = compute.sum(axis=1).tolist()
    storage = None
    if mode == "off":
        stored, alloc = n_compute, n_compute
    else:
        storage = balance_storage(n_compute, p)
        stored, alloc = storage.targets, [storage.slot_width] * p
    payload_storage = _payloads(stored, alloc, bytes_per_unit, conv)
    bottleneck = max(range(p), key=lambda r: (payload_storage[r].bytes_per_slot, -r))
    bn_bytes = payload_storage[bottleneck].bytes_per_slot
    dense = n_layers * (dense_temporal_bytes_per_layer_rank + conv_bytes_per_layer_rank)
    usable = usable_slots(policy.pool_budget_bytes, bn_bytes) if bn_bytes > 0 else None
    return TPPlan(
        tp_size=p, balance=mode, heads_per_rank=hl, units_per_head=u_h, bytes_per_unit=bytes_per_unit,
        kept_per_rank_layer=compute.tolist(),
        payload_contiguous=_payloads(n_contig, n_contig, bytes_per_unit, conv),
        payload_compute=_payloads(n_compute, n_compute, bytes_per_unit, conv),
        payload_storage=payload_storage, bottleneck_rank=bottleneck, bottleneck_bytes_per_slot=bn_bytes,
        bytes_dense_per_slot=dense, c_ckpt_tp=(dense / bn_bytes) if bn_bytes > 0 else float("inf"),
        m_remote=storage.m_remote if storage is not None else 0, usable_slots=usable,
        permutation=permutation, storage=storage)

