"""The one plan reader of compiler and runtime (DESIGN.md "Plan artifact"): read, validate, verify.

:func:`load_plan` is what ``dasc inspect`` and the runtime (``dasc_runtime.plan_io``) use. After the
pydantic validation it checks what the types cannot: the content hash, the plan's internal
consistency (:func:`check_plan`: ragged offsets against kept counts, unit ids in range, totals and
per-rank counts, unit bytes against :class:`~dasc_compile.schema.units.UnitSpec`) and, when the plan
records a kernel module, that the file is beside ``plan.json`` with the recorded sha256
(:func:`check_kernel_file`). Every problem is one :class:`DascInputError` line naming the file and
the field.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import ValidationError

from dasc_compile.errors import DascInputError
from dasc_compile.schema.canonical import compute_content_hash
from dasc_compile.schema.plan import PLAN_FILENAME, SCHEMA_VERSION, Plan
from dasc_compile.schema.units import UnitSpec

__all__ = ["check_kernel_file", "check_plan", "load_plan", "plan_json_path"]


def plan_json_path(path: str | Path) -> Path:
    """``path/plan.json`` when ``path`` is a directory, else ``path`` itself."""
    p = Path(path)
    return p / PLAN_FILENAME if p.is_dir() else p


def load_plan(path: str | Path, *, verify_kernels: bool = True) -> Plan:
    """Read and verify a plan (``plan.json`` or its directory): the one plan reader of compiler and runtime.

    Checks, in order: the file exists; it parses as a JSON object with ``schema_version`` and
    ``content_hash`` fields; ``schema_version`` equals :data:`SCHEMA_VERSION`; the content validates
    against :class:`Plan`; the stored ``content_hash`` equals :func:`compute_content_hash` (always
    checked: an empty hash is refused too); :func:`check_plan`; with ``verify_kernels``,
    :func:`check_kernel_file`.

    Args:
        path: plan directory or its ``plan.json``.
        verify_kernels: also require the kernel module the plan records (``Plan.kernels``) beside
            ``plan.json`` with its recorded sha256 (a plan compiled with ``--no-kernels`` has none).
    Returns:
        the validated :class:`Plan`.
    Raises:
        DascInputError: one line naming the file (``plan.json`` or the kernel module) and what is wrong.
    """
    p = plan_json_path(path)
    if not p.is_file():
        raise DascInputError(f"{p}: dasc plan not found (pass the plan directory or its {PLAN_FILENAME})")
    try:
        raw = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise DascInputError(f"{p}: not a readable JSON plan ({exc})") from None
    if not isinstance(raw, dict):
        raise DascInputError(f"{p}: a plan must be a JSON object")
    if "schema_version" not in raw or "content_hash" not in raw:
        raise DascInputError(f"{p}: not a dasc plan (no 'schema_version' / 'content_hash' field); pass a plan.json "
                             f"written by 'dasc compile'")
    ver = raw.get("schema_version")
    if ver != SCHEMA_VERSION:
        raise DascInputError(
            f"{p}: plan schema_version {ver!r} is not {SCHEMA_VERSION}, the version this dasc reads; "
            f"recompile the plan with this dasc version")
    try:
        plan = Plan.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise DascInputError(f"{p}: plan field '{loc}': {first['msg']}") from None
    want = compute_content_hash(plan)
    if plan.content_hash != want:
        raise DascInputError(
            f"{p}: content_hash does not match the plan's content (stored {plan.content_hash[:12] or 'empty'}..., "
            f"computed {want[:12]}...): the plan was edited or corrupted; recompile it")
    check_plan(plan, p)
    if verify_kernels:
        check_kernel_file(plan, p.parent)
    return plan


def _expect(source, field: str, got, want, why: str) -> None:
    if got != want:
        raise DascInputError(f"{source}: plan field '{field}' = {got!r}, expected {want!r} ({why})")


def check_plan(plan: Plan, source: str | Path = PLAN_FILENAME) -> None:
    """Check that a validated plan agrees with itself (what pydantic types cannot express).

    Per recurrent layer i: ``layer_id`` / ``recurrent_index`` match ``model.recurrent_layer_ids``;
    ``num_heads`` = H_v; ``units_per_head`` and ``n_units`` = H_v * U follow the unit kind;
    ``kept_units`` are sorted, distinct and in ``[0, n_units)`` with ``n_kept`` of them; ragged
    ``offset`` o_{i-1} = r_0 + ... + r_{i-1} (App. B Scheme 2). Totals: L, sum n, sum r, R_max, and
    ``unit_bytes`` = :attr:`UnitSpec.unit_bytes`. TP: ``tp_size`` is the policy's, H_v / P heads per
    rank, ``kept_per_rank_layer`` is ``[P][L]`` with column sums r_l, one payload per rank per stage,
    a permutation of every layer's heads, and a storage map over the ranks' packed counts.

    Raises:
        DascInputError: ``<source>: plan field '<path>' = <got>, expected <want> (<why>)``.
    """
    m, t, tp = plan.model, plan.totals, plan.tp
    try:
        unit = UnitSpec.from_plan(plan)
    except DascInputError as exc:
        raise DascInputError(f"{source}: plan fields 'model' / 'policy' do not describe a state unit: {exc}") from None
    n_layers = len(plan.layers)
    _expect(source, "model.recurrent_layer_ids", len(m.recurrent_layer_ids), n_layers, "one per entry of 'layers'")
    upl = m.num_value_heads * unit.units_per_head
    offset = 0
    for i, lp in enumerate(plan.layers):
        f = f"layers[{i}]"
        _expect(source, f"{f}.layer_id", lp.layer_id, m.recurrent_layer_ids[i], "model.recurrent_layer_ids order")
        _expect(source, f"{f}.recurrent_index", lp.recurrent_index, i, "position among recurrent layers")
        _expect(source, f"{f}.num_heads", lp.num_heads, m.num_value_heads, "model.num_value_heads")
        _expect(source, f"{f}.units_per_head", lp.units_per_head, unit.units_per_head, f"{m.unit_kind} units")
        _expect(source, f"{f}.n_units", lp.n_units, upl, "num_heads * units_per_head")
        _expect(source, f"{f}.n_kept", lp.n_kept, len(lp.kept_units), "the number of kept_units")
        ids = lp.kept_units
        bad = [u for u in ids if not 0 <= u < upl]
        if bad:
            raise DascInputError(f"{source}: plan field '{f}.kept_units' holds unit id {bad[0]} outside "
                                 f"[0, {upl}) (n_units)")
        if any(a >= b for a, b in zip(ids, ids[1:])):
            raise DascInputError(f"{source}: plan field '{f}.kept_units' must be sorted and without repeats")
        _expect(source, f"{f}.offset", lp.offset, offset, "ragged offset: sum of n_kept of the layers before it")
        offset += lp.n_kept
    kept = [lp.n_kept for lp in plan.layers]
    _expect(source, "totals.num_recurrent_layers", t.num_recurrent_layers, n_layers, "len(layers)")
    _expect(source, "totals.n_units", t.n_units, upl * n_layers, "sum of layers' n_units")
    _expect(source, "totals.n_kept", t.n_kept, sum(kept), "sum of layers' n_kept")
    _expect(source, "totals.r_max", t.r_max, max(kept, default=0), "max of layers' n_kept")
    _expect(source, "totals.unit_bytes", t.unit_bytes, unit.unit_bytes, "bytes of one kept unit (UnitSpec)")
    _check_tp(plan, source, kept)


def _check_tp(plan: Plan, source, kept: list[int]) -> None:
    tp, m = plan.tp, plan.model
    p = tp.tp_size
    _expect(source, "tp.tp_size", p, plan.policy.tp_size, "policy.tp_size")
    _expect(source, "tp.heads_per_rank", tp.heads_per_rank * p, m.num_value_heads, "heads_per_rank * tp_size = H_v")
    _expect(source, "tp.units_per_head", tp.units_per_head, plan.layers[0].units_per_head if plan.layers
            else tp.units_per_head, "layers' units_per_head")
    _expect(source, "tp.bytes_per_unit", tp.bytes_per_unit, plan.totals.unit_bytes, "totals.unit_bytes")
    rows = tp.kept_per_rank_layer
    _expect(source, "tp.kept_per_rank_layer", [len(r) for r in rows], [len(kept)] * p, "[tp_size][L] counts")
    _expect(source, "tp.kept_per_rank_layer", [sum(c) for c in zip(*rows)] if rows else [], kept if p else [],
            "per-layer sums equal to layers' n_kept")
    for stage in ("payload_contiguous", "payload_compute", "payload_storage"):
        _expect(source, f"tp.{stage}", [x.rank for x in getattr(tp, stage)], list(range(p)), "one entry per rank")
    if tp.permutation is not None:
        _expect(source, "tp.permutation", len(tp.permutation), len(kept), "one per recurrent layer")
        for i, perm in enumerate(tp.permutation):
            _expect(source, f"tp.permutation[{i}].head_order", sorted(perm.head_order),
                    list(range(m.num_value_heads)), "a permutation of the value heads")
    if tp.storage is not None:
        s = tp.storage
        packed = [sum(r) for r in rows]
        _expect(source, "tp.storage.n_local", list(s.n_packed), packed, "units each rank packs (kept_per_rank_layer)")
        for name in ("targets", "keep", "send_splits", "runs"):
            _expect(source, f"tp.storage.{name}", len(getattr(s, name)), p, "one entry per rank")
        _expect(source, "tp.storage.targets", sum(s.targets), sum(packed), "all packed units stored once")


def check_kernel_file(plan: Plan, plan_dir: str | Path) -> None:
    """The kernel module ``plan.kernels`` records is in ``plan_dir`` with the recorded sha256.

    Nothing to check when the plan has no kernels (compiled with ``--no-kernels``).

    Raises:
        DascInputError: the file is missing or unreadable, or its bytes' sha256 is not
            ``kernels.source_sha256`` (the module was edited).
    """
    k = plan.kernels
    if k is None:
        return
    path = Path(plan_dir) / k.file
    if Path(k.file).name != k.file:
        raise DascInputError(f"{Path(plan_dir) / PLAN_FILENAME}: plan field 'kernels.file' = {k.file!r} must be a "
                             f"file name inside the plan directory")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DascInputError(f"{path}: kernel module recorded in {PLAN_FILENAME} (kernels.file) cannot be read "
                             f"({exc.strerror or exc}); copy the whole plan directory or recompile the plan") from None
    got = hashlib.sha256(data).hexdigest()
    if got != k.source_sha256:
        raise DascInputError(f"{path}: kernel module content (sha256 {got[:16]}...) differs from the one "
                             f"{PLAN_FILENAME} records in kernels.source_sha256 ({k.source_sha256[:16]}...): "
                             f"it was edited; recompile the plan")
