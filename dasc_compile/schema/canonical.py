"""Byte-exact forms of a plan: canonical JSON, its content hash, the published JSON schema, and the
decay-tensor fingerprint (DESIGN.md "Plan artifact").

The compiler writes ``plan.json`` as :func:`canonical_json`; :func:`compute_content_hash` hashes it
with ``content_hash`` blanked, and the reader (:mod:`dasc_compile.schema.reader`) refuses a plan whose
stored hash differs. :func:`decay_sha256` is the byte format of ``Fingerprint.decay_sha256`` that the
compiler (from the checkpoint) and the runtime (from the weights SGLang loaded) both reproduce.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from dasc_compile.schema.plan import SCHEMA_VERSION, Plan

__all__ = ["MISSING", "SCHEMA_PATH", "canonical_difference", "canonical_json", "compute_content_hash", "decay_sha256",
           "json_schema", "schema_text", "with_content_hash"]

#: The committed JSON schema of :class:`Plan` (``python -m dasc_compile.schema --write`` regenerates it).
SCHEMA_PATH = Path(__file__).with_name("plan.schema.json")


def canonical_json(plan: Plan) -> str:
    """Deterministic JSON of ``plan``: field order fixed by the schema, JSON keys (aliases), compact
    separators, one trailing newline. Infinite horizons are written as the string ``"Infinity"``."""
    return plan.model_dump_json(by_alias=True) + "\n"  # compact; inf -> "Infinity" (ser_json_inf_nan="strings")


def compute_content_hash(plan: Plan) -> str:
    """sha256 hex of the canonical JSON of ``plan`` with ``content_hash`` blanked."""
    blank = plan.model_copy(update={"content_hash": ""})
    return hashlib.sha256(canonical_json(blank).encode()).hexdigest()


#: :func:`canonical_difference`'s stand-in for a key the file lacks (or holds and dasc never writes)
MISSING = object()


def canonical_difference(plan: Plan, raw: object) -> tuple[str, object, object] | None:
    """Where ``raw`` (the parsed ``plan.json``) differs from the plan as dasc writes it, or None.

    :func:`compute_content_hash` hashes the validated plan, and validation converts types (``"16"`` and ``16.0``
    read as the integer 16, ``0`` as false), so a plan edited only in a value's JSON type would pass the hash; this
    compares the JSON values and their types, layout aside (a plan re-indented by a JSON tool is the same plan;
    a whole number where dasc wrote a float, as jq writes ``-5.0``, is the same value too). Returns ``(path, raw
    value, written value)`` of the first difference, path as the reader names fields (``policy.w_max``,
    ``layers[0].n_kept``), :data:`MISSING` for a key one side lacks.
    """
    def walk(a, b):             # (keys innermost first, a, b) of the first difference; paths built only then
        if isinstance(b, dict):
            if not isinstance(a, dict):
                return [], a, b
            for k in [*b, *(k for k in a if k not in b)]:        # the written order, then keys dasc never writes
                if k not in a or k not in b:
                    return [k], a.get(k, MISSING), b.get(k, MISSING)
                if d := walk(a[k], b[k]):
                    d[0].append(k)
                    return d
            return None
        if isinstance(b, list):
            if not isinstance(a, list) or len(a) != len(b):
                return [], a, b
            for i, (x, y) in enumerate(zip(a, b)):
                if d := walk(x, y):
                    d[0].append(i)
                    return d
            return None
        same = type(a) is type(b) or (type(b) is float and type(a) is int)
        return None if same and a == b else ([], a, b)

    d = walk(raw, json.loads(canonical_json(plan)))
    if d is None:
        return None
    keys, a, b = d
    path = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in reversed(keys)).lstrip(".")
    return path, a, b


def with_content_hash(plan: Plan) -> Plan:
    """``plan`` with its ``content_hash`` set (see :func:`compute_content_hash`)."""
    return plan.model_copy(update={"content_hash": compute_content_hash(plan)})


def decay_sha256(tensors) -> str:
    """``Fingerprint.decay_sha256``: sha256 (hex) over decay tensors.

    Args:
        tensors: sequence of ``(name, tensor)`` in ``Fingerprint.decay_tensors`` order; torch tensors of
            any dtype and device (bfloat16 is hashed as its raw bytes, never converted).
    Per tensor the hash takes ``name``, ``str(dtype)`` (e.g. ``torch.bfloat16``), the shape as a JSON
    list, the byte count (8 bytes, little-endian) and the raw little-endian bytes, each field followed
    by a NUL separator. torch is imported only here, when tensors are hashed.
    """
    import torch  # the schema itself does not need torch; only the fingerprint of tensors does

    h = hashlib.sha256()
    for name, t in tensors:
        t = t.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        h.update(name.encode("utf-8") + b"\0")
        h.update(str(t.dtype).encode("ascii") + b"\0")
        h.update(json.dumps(list(t.shape)).encode("ascii") + b"\0")
        h.update(len(raw).to_bytes(8, "little"))
        h.update(raw + b"\0")
    return h.hexdigest()


def json_schema() -> dict:
    """The published JSON schema of :class:`Plan` (committed as ``plan.schema.json``)."""
    schema = Plan.model_json_schema()
    schema["x-dasc-schema-version"] = SCHEMA_VERSION
    return schema


def schema_text() -> str:
    """:func:`json_schema` as the committed text (indent 1, sorted keys, trailing newline)."""
    return json.dumps(json_schema(), indent=1, sort_keys=True) + "\n"
