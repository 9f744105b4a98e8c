"""Decay-tensor fingerprint of the weights SGLang actually loaded (plan safety check, DESIGN.md).

The byte format is the plan contract's (``dasc_compile.schema.decay_sha256``, shared with the
compiler's ``dasc_compile.checkpoint.decay_fingerprint``): for each decay tensor in the
plan's ``Fingerprint.decay_tensors`` order, ``name``, ``str(dtype)``, the shape as a JSON list, the
byte count (8 bytes little-endian) and the raw little-endian bytes, each followed by NUL.

Served weights differ from the checkpoint in two ways that carry no information loss:

* TP sharding: each rank holds its heads' slice (GDN ``A_log``/``dt_bias`` ``[H/P]`` on dim 0, KDA
  ``A_log [1, 1, H/P, 1]`` on dim 2, ``dt_bias [H*d_k/P]`` on dim 0); slices are gathered over the
  attention-TP group in rank order.
* dtype: SGLang keeps ``A_log`` in FP32 and ``dt_bias`` in the model dtype whatever the file
  held. The hash is therefore tried with each tensor kind cast back to every dtype the cast
  reaches losslessly (at most 3 x 3 combinations); a lossy cast is never tried.

A family whose served form is not the checkpoint's (Mamba2: SGLang loads ``A_log`` into
``A = -exp(A_log)`` FP32 and keeps ``dt_bias`` in the model dtype) records that form in
``Fingerprint.served``; no cast undoes ``-exp`` bit for bit, so those tensors are compared by value
within the plan's per-tensor tolerance instead (:func:`match_served_values`).
"""

from __future__ import annotations

import itertools
import re
from typing import Callable, Optional, Sequence

import torch

from dasc_compile.schema import DascInputError
from dasc_compile.schema import decay_sha256 as _schema_decay_sha256

__all__ = ["decay_sha256", "fingerprint_names", "match_decay_fingerprint", "match_served_values",
           "served_decay_tensors", "parse_decay_name"]

# A_log / dt_bias as stored; ``A`` is Mamba2's served -exp(A_log) (SGLang ``MambaMixer2.A``)
_DECAY_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:.*\.)?(A_log|dt_bias|A)$")
_CAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def parse_decay_name(name: str) -> Optional[tuple[int, str]]:
    """``(layer id, 'A_log' | 'dt_bias' | 'A')`` of a decay tensor name, or None."""
    m = _DECAY_RE.search(name)
    return (int(m.group(1)), m.group(2)) if m else None


def decay_sha256(tensors: Sequence[tuple[str, torch.Tensor]]) -> str:
    """sha256 hex of ``[(name, tensor), ...]`` in the plan's byte format (:func:`dasc_compile.schema.decay_sha256`)."""
    return _schema_decay_sha256(tensors)


def _shard_dim(t: torch.Tensor) -> int:
    return 2 if t.dim() == 4 else 0


def served_decay_tensors(model: torch.nn.Module, names: Sequence[str],
                         gather: Optional[Callable[[torch.Tensor], list[torch.Tensor]]] = None) -> list[tuple[str, torch.Tensor]]:
    """The served model's decay tensors under the plan's names, full (TP = 1) size, on CPU.

    Args:
        model: the loaded SGLang model.
        names: ``plan.fingerprint.decay_tensors``.
        gather: returns every attention-TP rank's slice of this rank's tensor, in rank order (None at TP 1).
    Raises:
        DascInputError: a plan tensor with no counterpart in the served model (names it).
    """
    by_key: dict[tuple[int, str], torch.Tensor] = {}
    for pname, p in itertools.chain(model.named_parameters(), model.named_buffers()):
        key = parse_decay_name(pname)
        if key is not None and key not in by_key:
            by_key[key] = p
    out = []
    for name in names:
        key = parse_decay_name(name)
        if key is None or key not in by_key:
            raise DascInputError(
                f"dasc plan decay tensor '{name}' has no counterpart in the served model "
                f"(found {len(by_key)} A_log/dt_bias parameters)")
        shard = by_key[key].detach().to("cpu").contiguous()
        if gather is not None:
            parts = gather(shard)
            shard = torch.cat(parts, dim=_shard_dim(shard)) if len(parts) > 1 else parts[0]
        out.append((name, shard))
    return out


def _lossless_dtypes(ts: Sequence[torch.Tensor]) -> list[torch.dtype]:
    """The loaded dtype first, then every other dtype all ``ts`` round-trip through exactly."""
    first = ts[0].dtype
    out = [first]
    for d in _CAST_DTYPES:
        if d == first:
            continue
        if all(torch.equal(t.to(d).to(t.dtype), t) for t in ts):
            out.append(d)
    return out


def match_decay_fingerprint(expected_sha: str, tensors: Sequence[tuple[str, torch.Tensor]]) -> Optional[dict]:
    """Find dtypes under which the served tensors hash to ``expected_sha``.

    Returns:
        ``{'A_log': dtype, 'dt_bias': dtype, 'sha256': ...}`` on a match, None otherwise.
    """
    kinds: dict[str, list[int]] = {}
    for i, (name, _) in enumerate(tensors):
        kind = (parse_decay_name(name) or (0, "other"))[1]
        kinds.setdefault(kind, []).append(i)
    options = {k: _lossless_dtypes([tensors[i][1] for i in idx]) for k, idx in kinds.items()}
    keys = list(options)
    for combo in itertools.product(*(options[k] for k in keys)):
        cast = dict(zip(keys, combo))
        trial = []
        for name, t in tensors:
            kind = (parse_decay_name(name) or (0, "other"))[1]
            trial.append((name, t.to(cast[kind])))
        sha = decay_sha256(trial)
        if sha == expected_sha:
            return {**cast, "sha256": sha}
    return None


def fingerprint_names(fingerprint) -> list[str]:
    """The decay tensor names to look up in the served model: the served form's when the plan records
    one (``Fingerprint.served.names``, Mamba2's ``...mixer.A``), else ``Fingerprint.decay_tensors``."""
    return list(fingerprint.served.names if fingerprint.served is not None else fingerprint.decay_tensors)


def match_served_values(served_form, tensors: Sequence[tuple[str, torch.Tensor]]) -> Optional[dict]:
    """Compare the served tensors with the plan's served form value by value.

    Args:
        served_form: the plan's :class:`~dasc_compile.schema.ServedDecay` (names, float64 values, rtol).
        tensors: ``[(name, tensor), ...]`` gathered from the served model in ``served_form.names`` order.
    Returns:
        ``{'A': dtype, 'dt_bias': dtype, 'sha256': <served bytes>, 'max_rel': ...}`` when every element
        satisfies ``|served - plan| <= rtol * |plan|``; None on the first tensor that does not (or a
        shape that differs).
    """
    worst = 0.0
    dtypes: dict = {}
    for (name, t), want, rtol in zip(tensors, served_form.values, served_form.rtol):
        got = t.detach().reshape(-1).to(torch.float64).cpu()
        ref = torch.tensor(want, dtype=torch.float64)
        if got.shape != ref.shape:
            return None
        rel = ((got - ref).abs() / ref.abs().clamp_min(1e-300))
        err = float(rel.max()) if rel.numel() else 0.0
        if not err <= rtol:
            return None
        worst = max(worst, err)
        dtypes[(parse_decay_name(name) or (0, "other"))[1]] = t.dtype
    return {**dtypes, "sha256": decay_sha256(tensors), "max_rel": worst}
