"""What one pool slot costs on one TP rank, in bytes, for :mod:`dasc_runtime.sizing`: ``b_int8`` (a slot of
SGLang's INT8 checkpoint pool), ``b_c`` / ``b_c8`` (a dasc compressed slot in the plan's temporal dtype / INT8),
and the pool and scratch bytes :func:`~dasc_runtime.sizing.size_arms` charges each pool arm (dasc-wr's B refresh
scratch slots among them). Split from ``sizing.py``, which sizes the arms from these figures (App. C.1).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Optional

from dasc_compile.schema import DascInputError, UnitSpec
from dasc_runtime.serving_rules import refresh_active

__all__ = ["int8_bytes_per_slot", "compressed_bytes_per_slot", "pool_arm_bytes"]


def int8_bytes_per_slot(plan) -> int:
    """Bytes of one slot of SGLang's INT8 checkpoint pool on one TP rank, for the plan's model.

    One slot of ``MambaCheckpointPool.estimate_mem_usage_bytes`` (sglang/srt/mem_cache/
    mamba_checkpoint_pool.py, 0.5.17): ``L * (H/P) * d_v * d_k`` int8 bytes, ``L * (H/P) * d_k``
    scales in the temporal dtype, and the conv windows ``L * (conv_dim/P) * (K-1)`` in the conv
    dtype. Every unit INT8, none omitted: ``L * (H/P) * U * unit_bytes(int8) + L * conv`` with the
    plan's :class:`~dasc_compile.schema.UnitSpec`.

    Args:
        plan: a loaded :class:`dasc_compile.schema.Plan`.
    Returns:
        bytes (int).
    Raises:
        DascInputError: a state dtype the unit spec does not know.
    """
    spec = UnitSpec.from_plan(plan)
    spec8 = UnitSpec(**{**asdict(spec), "int8": True})
    layers = len(plan.model.recurrent_layer_ids)
    temporal = layers * plan.tp.heads_per_rank * spec8.units_per_head * spec8.unit_bytes
    return temporal + layers * spec.conv_bytes_per_layer(plan.tp.tp_size)


def compressed_bytes_per_slot(plan, *, int8: Optional[bool] = None) -> int:
    """Bytes of one dasc compressed slot on the bottleneck TP rank (App. C.1: the same C on every rank).

    ``int8=None`` (or the plan's own setting): the plan's ``tp.bottleneck_bytes_per_slot``. The other
    setting: the plan's kept units (``payload_storage[r].n_alloc``) at that setting's unit bytes plus
    the rank's conv bytes, maximised over ranks: what the same selection compiled with ``--int8`` /
    ``--no-int8`` allocates.
    """
    if int8 is None or bool(int8) == bool(plan.policy.int8):
        return int(plan.tp.bottleneck_bytes_per_slot)
    spec = UnitSpec(**{**asdict(UnitSpec.from_plan(plan)), "int8": bool(int8)})
    return max(p.n_alloc * spec.unit_bytes + p.bytes_conv for p in plan.tp.payload_storage)


def pool_arm_bytes(plan, name: str, *, b_dense: int, scratch_slots: int,
                   refresh_slots: int) -> tuple[str, int, int]:
    """``(what, bytes per pool slot, scratch bytes)`` of a pool arm: SGLang's INT8 pool, or the plan's compressed
    pool in the plan's temporal dtype (``dasc``) or INT8 (``dasc-int8``), charged dasc-wr's native scratch slots.

    Args:
        refresh_slots: B as the server runs it (:func:`dasc_runtime.serving_rules.served_refresh_slots`), each
            charged ``b_dense`` bytes on a dasc-wr plan; ignored for a plan that runs no refresh.
    Raises:
        DascInputError: an unknown arm name.
    """
    if name == "int8":
        return "SGLang INT8", int8_bytes_per_slot(plan), 0
    if name not in ("dasc", "dasc-int8"):
        raise DascInputError(f"arm {name!r}: expected dense, int8, dasc or dasc-int8")
    i8 = name == "dasc-int8"
    b_c = compressed_bytes_per_slot(plan, int8=i8)
    wr = refresh_active(plan)                     # dasc-wr: B hidden native scratch slots (wr_scratch.py)
    n_wr = int(refresh_slots) if wr else 0
    return f"dasc-{'wr' if wr else 'nr'}{'+INT8' if i8 else ''}", b_c, scratch_slots * b_c + n_wr * b_dense
