"""TP data movement for state checkpoints (paper §4.3, App. B.1 Fig. 9 (b) "Runtime store / load").

Storage balancing is an exact reindexing of packed units across TP ranks. Rank r packs its kept
units of all recurrent layers in ragged order into ``packed [n_r, *unit]`` (``unit`` = ``[d_v, d_k]``
for GDN, ``[d_v]`` for KDA; any dtype, e.g. FP32 or the INT8 payload). Store moves them into
storage slots ``[slot_width, *unit]`` (``slot_width = ceil(N / P)``), load moves them back:

* :func:`store_all_ranks` / :func:`load_all_ranks`: all P ranks in one process, following the
  plan's destination map unit run by unit run (plain PyTorch; what the all-to-all is tested against).
* :func:`store_all_to_all` / :func:`load_all_to_all`: one rank of a ``torch.distributed`` group; a
  copy of the kept prefix in place plus one ``all_to_all_single`` with variable splits, skipped when
  ``M_remote == 0``. The same code runs on gloo (CPU) and NCCL (GPU).

To move many slots at once, put the unit axis first: ``[n_r, num_slots, *unit]`` (the splits count
rows of dim 0). Conv states never move: they stay on the rank that computes them.

:func:`permute_coupled_tensor` applies a compute-head permutation (Fig. 9 (a)) to one checkpoint
tensor as described by the plan's :class:`~dasc_compile.schema.CoupledTensor`.

Only the plan schema is imported from dasc; this module never imports the compiler.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist

from dasc_compile.schema import CoupledTensor, StorageMap

__all__ = [
    "load_all_ranks",
    "load_all_to_all",
    "permute_coupled_tensor",
    "store_all_ranks",
    "store_all_to_all",
]


def _check_packed(t: torch.Tensor, rows: int, what: str) -> None:
    if t.dim() < 1 or t.shape[0] < rows:
        raise ValueError(f"{what} must have at least {rows} rows on dim 0, got shape {tuple(t.shape)}")


def store_all_ranks(packed: Sequence[torch.Tensor], smap: StorageMap) -> list[torch.Tensor]:
    """Store mapping for all P ranks in one process (what :func:`store_all_to_all` must equal).

    Args:
        packed: P tensors, rank r's ``[n_r, *unit]`` (same trailing shape and dtype on every rank).
        smap: the plan's storage map.
    Returns:
        P tensors ``[slot_width, *unit]``: rank s's storage slot; positions ``[t_s, slot_width)`` are 0.
    Raises:
        ValueError: wrong number of ranks or rows.
    """
    p = smap.tp_size
    if len(packed) != p:
        raise ValueError(f"packed must hold {p} rank tensors, got {len(packed)}")
    for r in range(p):
        _check_packed(packed[r], smap.n_packed[r], f"packed[{r}]")
    trail, dtype, device = packed[0].shape[1:], packed[0].dtype, packed[0].device
    out = [torch.zeros((smap.slot_width, *trail), dtype=dtype, device=device) for _ in range(p)]
    for r in range(p):
        for start, count, dst, pos in smap.runs[r]:
            out[dst][pos:pos + count] = packed[r][start:start + count].to(out[dst].device)
    return out


def load_all_ranks(storage: Sequence[torch.Tensor], smap: StorageMap) -> list[torch.Tensor]:
    """Load mapping for all P ranks in one process: the inverse of :func:`store_all_ranks`.

    Args:
        storage: P tensors ``[>= t_s, *unit]`` (storage slots).
    Returns:
        P tensors ``[n_r, *unit]``: each rank's packed units in the compute layout.
    Raises:
        ValueError: wrong number of ranks or rows.
    """
    p = smap.tp_size
    if len(storage) != p:
        raise ValueError(f"storage must hold {p} rank tensors, got {len(storage)}")
    for s in range(p):
        _check_packed(storage[s], smap.targets[s], f"storage[{s}]")
    trail, dtype, device = storage[0].shape[1:], storage[0].dtype, storage[0].device
    out = [torch.empty((smap.n_packed[r], *trail), dtype=dtype, device=device) for r in range(p)]
    for r in range(p):
        for start, count, src, pos in smap.runs[r]:
            out[r][start:start + count] = storage[src][pos:pos + count].to(out[r].device)
    return out


def store_all_to_all(packed: torch.Tensor, smap: StorageMap, rank: int, *, group: Optional[dist.ProcessGroup] = None,
                     out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Runtime store on one rank (Fig. 9 (b)): keep the first ``keep[rank]`` units, send the excess.

    The excess units ``packed[keep_r:n_r]`` are already ordered by destination rank, and rank s
    receives into ``out[keep_s:t_s]`` in source-rank order, so one ``all_to_all_single`` with input
    splits ``send_splits[rank]`` and output splits ``recv_splits(rank)`` does the whole move. Every
    rank of ``group`` must call this together (unless ``smap.skip_all_to_all``).

    Args:
        packed: this rank's ``[n_r, *unit]``, contiguous.
        smap: the plan's storage map; ``rank`` is this process's TP rank.
        group: process group (default: the world group).
        out: optional ``[>= t_r, *unit]`` destination (e.g. a pool slot), contiguous; rows from
            ``t_r`` on are left untouched. Allocated with zeros at ``slot_width`` rows when ``None``.
    Returns:
        ``out``: this rank's storage slot.
    Raises:
        ValueError: shapes that do not match the map.
    """
    n, t, keep = smap.n_packed[rank], smap.targets[rank], smap.keep[rank]
    _check_packed(packed, n, "packed")
    if out is None:
        out = torch.zeros((smap.slot_width, *packed.shape[1:]), dtype=packed.dtype, device=packed.device)
    _check_packed(out, t, "out")
    out[:keep].copy_(packed[:keep])
    if smap.skip_all_to_all:
        return out
    dist.all_to_all_single(out[keep:t], packed[keep:n].contiguous(), output_split_sizes=smap.recv_splits(rank),
                           input_split_sizes=list(smap.send_splits[rank]), group=group)
    return out


def load_all_to_all(storage: torch.Tensor, smap: StorageMap, rank: int, *, group: Optional[dist.ProcessGroup] = None,
                    out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Runtime load on one rank: the inverse all-to-all of :func:`store_all_to_all`.

    Args:
        storage: this rank's storage slot ``[>= t_r, *unit]``, contiguous.
        out: optional ``[>= n_r, *unit]`` destination (packed units in the compute layout), contiguous.
    Returns:
        ``out`` with rows ``[0, n_r)`` restored exactly.
    Raises:
        ValueError: shapes that do not match the map.
    """
    n, t, keep = smap.n_packed[rank], smap.targets[rank], smap.keep[rank]
    _check_packed(storage, t, "storage")
    if out is None:
        out = torch.empty((n, *storage.shape[1:]), dtype=storage.dtype, device=storage.device)
    _check_packed(out, n, "out")
    out[:keep].copy_(storage[:keep])
    if smap.skip_all_to_all:
        return out
    dist.all_to_all_single(out[keep:n], storage[keep:t].contiguous(), output_split_sizes=list(smap.send_splits[rank]),
                           input_split_sizes=smap.recv_splits(rank), group=group)
    return out


def permute_coupled_tensor(tensor: torch.Tensor, coupled: CoupledTensor, bundle_order: Sequence[int]) -> torch.Tensor:
    """Reorder one head-coupled checkpoint tensor by a layer's bundle order (Fig. 9 (a) step 7).

    For every ``[start, length]`` segment on ``coupled.axis``, the segment is split into
    ``len(bundle_order)`` equal blocks and new block i is old block ``bundle_order[i]``. Apply to the
    full (TP = 1) tensor before SGLang's contiguous TP sharding.

    Args:
        tensor: the checkpoint tensor, any dtype (unquantized), with ``tensor.shape[axis] == axis_size``.
        bundle_order: ``LayerPermutation.bundle_order``.
    Returns:
        a new tensor of the same shape and dtype.
    Raises:
        ValueError: axis size or segment lengths that do not fit.
    """
    axis, nb = coupled.axis, len(bundle_order)
    if tensor.dim() <= axis or tensor.shape[axis] != coupled.axis_size:
        raise ValueError(f"{coupled.name}: expected size {coupled.axis_size} on axis {axis}, got shape {tuple(tensor.shape)}")
    index = torch.arange(coupled.axis_size)
    order = torch.as_tensor(list(bundle_order), dtype=torch.long)
    for start, length in coupled.segments:
        if length % nb != 0:
            raise ValueError(f"{coupled.name}: segment [{start}, {start + length}) is not {nb} equal blocks")
        blk = length // nb
        index[start:start + length] = (start + order[:, None] * blk + torch.arange(blk)[None, :]).reshape(-1)
    return tensor.index_select(axis, index.to(tensor.device))

