"""What ``dasc compile`` says about the plan it wrote: the one-line text summary and, with ``--json``, the
same facts as one JSON document for tools (issue 22 item 3).

JSON keys (``compile_format`` 1; adding a key keeps the version, removing or changing one bumps it):
``compile_format``, ``plan`` (path of plan.json), ``plan_dir``, ``content_hash``, ``schema_version``,
``dasc_version``, ``model`` (``model_type``, ``family``, ``num_recurrent_layers``), ``policy`` (the
resolved policy, as in plan.json), ``totals`` (plan.json's ``totals``: units, kept, C_temp, C_ckpt (Eq. 6),
bytes per checkpoint, ...), ``tp`` (``tp_size``, ``balance``, ``c_ckpt_tp``, ``bottleneck_bytes_per_slot``,
``bytes_dense_per_slot``, ``usable_slots``), ``refresh`` (``load_policy``, ``w_replay_cap`` in tokens,
Eq. 7), ``kernels`` (file name or null), ``provenance`` (``kind`` and the one short ``line``) and
``warnings`` (the ``warning:`` lines, without the prefix). Infinite ratios are the string ``"Infinity"``,
as in plan.json, so the document is strict JSON.
"""

from __future__ import annotations

import math
from pathlib import Path

from dasc_compile.inspect import _json_safe
from dasc_compile.provenance import provenance_kind, short_line
from dasc_compile.schema import SCHEMA_VERSION, Plan

__all__ = ["COMPILE_FORMAT", "summary_json", "summary_line"]

COMPILE_FORMAT = 1


def summary_line(plan: Plan, path: Path) -> str:
    """``wrote <dir>/plan.json  (<model>, <L> <family> layers, kept r/n units, C_temp .., C_ckpt ..[, TP.. C_ckpt ..])``."""
    t = plan.totals
    c_temp = f"{t.c_temp_ragged:.2f}x" if math.isfinite(t.c_temp_ragged) else "inf (nothing kept)"
    return (f"wrote {Path(path) / 'plan.json'}  ({plan.model.model_type}, {t.num_recurrent_layers} {plan.model.family} "
            f"layers, kept {t.n_kept:,}/{t.n_units:,} units, C_temp {c_temp}, C_ckpt {t.c_ckpt:.2f}x"
            + (f", TP{plan.tp.tp_size} C_ckpt {plan.tp.c_ckpt_tp:.2f}x" if plan.tp.tp_size > 1 else "") + ")")


def summary_json(plan: Plan, path: Path, warnings: list[str]) -> dict:
    """The ``dasc compile --json`` document (module docstring) of ``plan`` written at ``path`` (its directory)."""
    tp = plan.tp
    return _json_safe({
        "compile_format": COMPILE_FORMAT,
        "plan": str(Path(path) / "plan.json"),
        "plan_dir": str(path),
        "content_hash": plan.content_hash,
        "schema_version": SCHEMA_VERSION,
        "dasc_version": plan.dasc_version,
        "model": {"model_type": plan.model.model_type, "family": plan.model.family,
                  "num_recurrent_layers": len(plan.model.recurrent_layer_ids)},
        "policy": plan.policy.model_dump(mode="python"),
        "totals": plan.totals.model_dump(mode="python"),
        "tp": {"tp_size": tp.tp_size, "balance": tp.balance, "c_ckpt_tp": tp.c_ckpt_tp,
               "bottleneck_bytes_per_slot": tp.bottleneck_bytes_per_slot,
               "bytes_dense_per_slot": tp.bytes_dense_per_slot, "usable_slots": tp.usable_slots},
        "refresh": {"load_policy": plan.policy.load_policy, "w_replay_cap": plan.refresh.w_replay_cap},
        "kernels": plan.kernels.file if plan.kernels is not None else None,
        "provenance": {"kind": provenance_kind(plan.model.provenance), "line": short_line(plan.model.provenance)},
        "warnings": list(warnings),
    })
