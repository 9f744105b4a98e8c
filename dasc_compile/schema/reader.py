"""The one plan reader of compiler and runtime (DESIGN.md "Plan artifact"): read, validate, verify.

:func:`load_plan` is what ``dasc inspect`` and the runtime (``dasc_runtime.pool_install``, ``dasc_runtime.sizing``)
use. After the pydantic validation it checks what the types cannot: the content hash, the plan's internal
consistency (:func:`check_plan`: ragged offsets against kept counts, unit ids in range, totals and
per-rank counts, unit bytes against :class:`~dasc_compile.schema.units.UnitSpec`, each layer's selection
against ``policy.w_max``: :mod:`~dasc_compile.schema.cutoff`) and, when the plan
records a kernel module, that the file is beside ``plan.json`` with the recorded sha256
(:func:`check_kernel_file`). Key order and indentation are not content; a key given twice in one object is
refused (:func:`loads_plan_json`). Every problem is one :class:`DascInputError` line naming the file and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import stat
from pathlib import Path

from pydantic import ValidationError

from dasc_compile.errors import DascInputError
from dasc_compile.schema.canonical import MISSING, canonical_difference, compute_content_hash
from dasc_compile.schema.cutoff import check_layer_cutoff, check_w_max
from dasc_compile.schema.plan import PLAN_FILENAME, SCHEMA_VERSION, Plan
from dasc_compile.schema.units import UnitSpec, usable_slots

__all__ = ["DuplicateKeyError", "OverLongIntegerError", "check_kernel_file", "check_plan", "load_plan", "loads_plan_json",
           "plan_json_path"]


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
        if Path(path).is_dir() and (Path(path) / "config.json").is_file():
            raise DascInputError(f"{p.parent}: a model checkpoint, not a dasc plan; compile one first: "
                                 f"dasc compile {shlex.quote(str(p.parent))} --wmax W --out PLAN")
        if p.exists():
            raise DascInputError(f"{p}: not a regular file (a dasc plan is the file {PLAN_FILENAME})")
        raise DascInputError(f"{p}: dasc plan not found (pass the plan directory or its {PLAN_FILENAME})")
    try:
        raw = loads_plan_json(p.read_text())
    except DuplicateKeyError as exc:
        raise DascInputError(f"{p}: key '{exc.key}' appears twice in one JSON object; dasc writes each key once and "
                             f"the content hash sees only the last: the plan was edited or corrupted; "
                             f"recompile it") from None
    except (OSError, ValueError) as exc:
        raise DascInputError(f"{p}: not a readable JSON plan ({str(exc)[:160]})") from None
    except RecursionError:
        raise DascInputError(f"{p}: not a dasc plan (JSON nested too deeply)") from None
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
    if (diff := canonical_difference(plan, raw)) is not None:
        where, got, wrote = diff
        got = "missing" if got is MISSING else f"= {json.dumps(got)}"
        wrote = "no such field" if wrote is MISSING else json.dumps(wrote)
        raise DascInputError(f"{p}: plan field '{where}' {got}, expected {wrote} as dasc writes it (validation reads "
                             f"both alike, the content hash cannot tell them apart): the plan was edited or corrupted; "
                             f"recompile it")
    check_plan(plan, p)
    if verify_kernels:
        check_kernel_file(plan, p.parent)
    return plan


def _expect(source, field: str, got, want, why: str) -> None:
    if got != want:
        raise DascInputError(f"{source}: plan field '{field}' = {got!r}, expected {want!r} ({why})")


class DuplicateKeyError(ValueError):
    """A JSON object of a plan file names one key twice (:func:`loads_plan_json`)."""

    def __init__(self, key: str):
        super().__init__(f"key {key!r} appears twice in one JSON object")
        self.key = key


class OverLongIntegerError(ValueError):
    """An integer literal of a plan file has more digits than any plan field holds (:func:`loads_plan_json`)."""

    def __init__(self, digits: int):
        super().__init__(f"an integer of {digits} digits; no plan field holds more than {MAX_INT_DIGITS}")
        self.digits = digits


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKeyError(k)
        out[k] = v
    return out


def loads_plan_json(text: str | bytes) -> object:
    """``json.loads`` that refuses a key given twice in one object: Python keeps the last value, so an edit written
    before it (``"w_max": 999, "w_max": 16``) would pass the content hash unseen.

    An integer literal longer than :data:`MAX_INT_DIGITS` digits is refused before Python converts it (past 4,300
    digits Python's own message names ``sys.set_int_max_str_digits``, which is no advice for a plan file).

    Raises:
        DuplicateKeyError: (a ``ValueError``) naming the key.
        OverLongIntegerError: (a ``ValueError``) naming the integer's digit count.
        ValueError, RecursionError: as ``json.loads``.
    """
    return json.loads(text, object_pairs_hook=_unique_keys, parse_int=_plan_int)


#: The most digits (sign aside) an integer of a plan may have: every field fits 64 bits (at most 20 digits).
MAX_INT_DIGITS = 20


def _plan_int(literal: str) -> int:
    digits = len(literal.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise OverLongIntegerError(digits)
    return int(literal)


def check_plan(plan: Plan, source: str | Path = PLAN_FILENAME) -> None:
    """Check that a validated plan agrees with itself (what pydantic types cannot express).

    ``fingerprint.served`` (when present) has one name, value list and tolerance per decay tensor.
    Per recurrent layer i: ``layer_id`` / ``recurrent_index`` match ``model.recurrent_layer_ids``;
    ``num_heads`` = H_v; ``units_per_head`` and ``n_units`` = H_v * U follow the unit kind;
    ``kept_units`` are sorted, distinct and in ``[0, n_units)`` with ``n_kept`` of them; ragged
    ``offset`` o_{i-1} = r_0 + ... + r_{i-1} (App. B Scheme 2); ``n_kept``, the horizon bounds and
    ``refresh_window`` agree with the layer's horizon record and ``policy.w_max``
    (:func:`~dasc_compile.schema.cutoff.check_layer_cutoff`; :func:`~dasc_compile.schema.cutoff.check_w_max`: a
    horizon selection has ``horizon_local_max <= w_max < horizon_global_min`` in every layer, §4.1), so an edit of
    w_max that changes what it selects is refused even when the hash was redone (not for a Random plan, whose
    units are drawn at random: only its kept count is checked against the histogram); ``w_max`` and ``a_s`` are
    set (compile always resolves them); ``selection`` is ``random`` iff ``policy.random_seed`` is set. Totals: L,
    sum n, sum r, R_max, and ``unit_bytes`` = :attr:`UnitSpec.unit_bytes`. TP: ``tp_size`` is the policy's,
    H_v / P heads per rank, ``kept_per_rank_layer`` is ``[P][L]`` with column sums r_l, one payload per rank per
    stage, a permutation of every layer's heads, and a storage map over the ranks' packed counts. Kernels: the
    ``kernels.constants`` the model and policy decide are :func:`~dasc_compile.kernels.kernel_constants`' (tile
    choices aside), and ``kernels.ops`` the host wrappers of those constants.

    Raises:
        DascInputError: ``<source>: plan field '<path>' = <got>, expected <want> (<why>)``.
    """
    m, t, tp = plan.model, plan.totals, plan.tp
    for name, what in (("w_max", "the cutoff in tokens, §4.1"), ("a_s", "the gate input of Eq. 2")):
        if getattr(plan.policy, name) is None:
            raise DascInputError(f"{source}: plan field 'policy.{name}' = None, expected {what} (every compiled plan "
                                 f"records it); the plan was edited or corrupted; recompile it")
    _expect(source, "selection", plan.selection, plan.policy.selection,
            "'random' iff policy.random_seed is set, §5.2")
    try:
        unit = UnitSpec.from_plan(plan)
    except DascInputError as exc:
        raise DascInputError(f"{source}: plan fields 'model' / 'policy' do not describe a state unit: {exc}") from None
    n_layers = len(plan.layers)
    _expect(source, "model.recurrent_layer_ids", len(m.recurrent_layer_ids), n_layers, "one per entry of 'layers'")
    served, n_decay = plan.fingerprint.served, len(plan.fingerprint.decay_tensors)
    if served is not None:
        for name in ("names", "values", "rtol"):
            _expect(source, f"fingerprint.served.{name}", len(getattr(served, name)), n_decay,
                    "one per fingerprint.decay_tensors entry")
        if not all(0 < r < 1 for r in served.rtol):
            raise DascInputError(f"{source}: plan field 'fingerprint.served.rtol' must hold tolerances in (0, 1)")
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
    _check_figures(plan, source, unit)
    _check_kernels(plan, source)


def _check_kernels(plan: Plan, source) -> None:
    """``kernels.constants`` that follow from the model and policy equal what the compiler renders the kernels with
    (:func:`dasc_compile.kernels.kernel_constants`; the tile choices, ``TILE_CONSTANTS``, may differ between dasc
    versions), and ``kernels.ops`` are the module's host wrappers for those constants."""
    if plan.kernels is None:
        return
    from dasc_compile.kernels import TILE_CONSTANTS, kernel_constants, kernel_ops

    got = plan.kernels.constants
    for name, want in kernel_constants(plan).items():
        if name not in TILE_CONSTANTS:
            _expect(source, f"kernels.constants.{name}", got.get(name), want,
                    "what the plan's model and policy give its kernels; the plan was edited or corrupted")
    _expect(source, "kernels.ops", plan.kernels.ops, kernel_ops(got), "the host wrappers of these constants")


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


def _same(a: float, b: float) -> bool:
    return a == b or (math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=1e-9))


def _ratio(num: int, den: int) -> float:
    return (1.0 if num == 0 else math.inf) if den == 0 else num / den


def _check_figures(plan: Plan, source, unit: UnitSpec) -> None:
    """Bytes, ratios, slots, refresh windows and histograms agree with the counts they derive from
    (the formulas of ``dasc_compile.compiler.build_plan`` / ``tp.build_tp_plan``; App. B, C.1, Eq. 6, 7)."""
    m, t, tp, pol = plan.model, plan.totals, plan.tp, plan.policy
    n_l, p = len(plan.layers), tp.tp_size
    for i, lp in enumerate(plan.layers):
        f = f"layers[{i}]"
        _expect(source, f"{f}.bytes_temporal_kept", lp.bytes_temporal_kept, lp.n_kept * unit.unit_bytes,
                "n_kept * unit bytes")
        _expect(source, f"{f}.bytes_temporal_dense", lp.bytes_temporal_dense,
                unit.temporal_layer_bytes(m.num_value_heads), "dense temporal state bytes (UnitSpec)")
        _expect(source, f"{f}.bytes_conv", lp.bytes_conv, unit.conv_bytes_per_layer(1), "conv state bytes (UnitSpec)")
        _expect(source, f"{f}.horizon_histogram", (len(lp.horizon_histogram), sum(lp.horizon_histogram)),
                (len(plan.horizon_bin_edges), lp.n_units), "one count per bin edge, n_units in all")
        check_layer_cutoff(plan, source, f, lp)     # n_kept, horizon bounds and refresh_window against w_max
    check_w_max(plan, source)                       # w_max between every layer's horizon bounds
    dense_t = sum(lp.bytes_temporal_dense for lp in plan.layers)
    kept_t = sum(lp.bytes_temporal_kept for lp in plan.layers)
    conv = sum(lp.bytes_conv for lp in plan.layers)
    for name, got, want in (("bytes_temporal_dense", t.bytes_temporal_dense, dense_t),
                            ("bytes_temporal_kept", t.bytes_temporal_kept, kept_t), ("bytes_conv", t.bytes_conv, conv),
                            ("bytes_dense_checkpoint", t.bytes_dense_checkpoint, dense_t + conv),
                            ("bytes_compressed_checkpoint", t.bytes_compressed_checkpoint, kept_t + conv)):
        _expect(source, f"totals.{name}", got, want, "sum over layers")
    for name, got, want in (("c_temp_ragged", t.c_temp_ragged, _ratio(t.n_units, t.n_kept)),
                            ("c_temp_padded", t.c_temp_padded, _ratio(t.n_units, n_l * t.r_max)),
                            ("c_ckpt", t.c_ckpt, _ratio(dense_t + conv, kept_t + conv))):
        if not _same(got, want):
            raise DascInputError(f"{source}: plan field 'totals.{name}' = {got!r}, expected {want!r} (from the counts "
                                 f"and bytes)")
    budget = pol.pool_budget_bytes
    for name, got, per_slot in (("usable_slots", t.usable_slots, kept_t + conv),
                                ("usable_slots_dense", t.usable_slots_dense, dense_t + conv)):
        if got is not None and per_slot > 0:   # the whole-model figure, when given, follows the budget
            _expect(source, f"totals.{name}", got, usable_slots(budget, per_slot), "floor(pool budget / bytes) - 1")
    conv_r = n_l * unit.conv_bytes_per_layer(p)
    for stage in ("payload_contiguous", "payload_compute", "payload_storage"):
        for x in getattr(tp, stage):
            f = f"tp.{stage}[{x.rank}]"
            _expect(source, f"{f}.bytes_conv", x.bytes_conv, conv_r, "L * conv bytes of one rank")
            _expect(source, f"{f}.bytes_temporal", x.bytes_temporal, x.n_alloc * tp.bytes_per_unit,
                    "n_alloc * bytes_per_unit")
            _expect(source, f"{f}.bytes_per_slot", x.bytes_per_slot, x.bytes_temporal + x.bytes_conv,
                    "bytes_temporal + bytes_conv")
            if not 0 <= x.n_kept <= x.n_alloc:
                raise DascInputError(f"{source}: plan field '{f}.n_kept' = {x.n_kept} must be in [0, n_alloc = "
                                     f"{x.n_alloc}]")
    _expect(source, "tp.payload_compute", [x.n_kept for x in tp.payload_compute],
            [sum(r) for r in tp.kept_per_rank_layer], "kept_per_rank_layer row sums")
    slots = [x.bytes_per_slot for x in tp.payload_storage]
    if slots:
        _expect(source, "tp.bottleneck_bytes_per_slot", tp.bottleneck_bytes_per_slot, max(slots),
                "largest payload_storage bytes_per_slot")
        _expect(source, "tp.bottleneck_rank", tp.bottleneck_rank, slots.index(max(slots)), "first rank with the most")
    dense_r = n_l * (unit.temporal_layer_bytes(m.num_value_heads // p) + unit.conv_bytes_per_layer(p))
    _expect(source, "tp.bytes_dense_per_slot", tp.bytes_dense_per_slot, dense_r, "L * (dense temporal + conv) per rank")
    if tp.bottleneck_bytes_per_slot > 0:
        if not _same(tp.c_ckpt_tp, dense_r / tp.bottleneck_bytes_per_slot):
            raise DascInputError(f"{source}: plan field 'tp.c_ckpt_tp' = {tp.c_ckpt_tp!r}, expected "
                                 f"{dense_r / tp.bottleneck_bytes_per_slot!r} (bytes_dense_per_slot / bottleneck)")
        _expect(source, "tp.usable_slots", tp.usable_slots, usable_slots(budget, tp.bottleneck_bytes_per_slot),
                "floor(pool budget / bottleneck bytes) - 1")
    windows = [lp.refresh_window for lp in plan.layers]
    _expect(source, "refresh.w_replay_cap", plan.refresh.w_replay_cap, max(windows, default=0),
            "the largest layer refresh_window (Eq. 7)")
    _expect(source, "refresh.any_local", plan.refresh.any_local, t.n_kept < t.n_units, "totals.n_kept < n_units")


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
        if not stat.S_ISREG(os.stat(path).st_mode):   # a FIFO or device would block or never end
            raise IsADirectoryError(0, "not a regular file")
        data = path.read_bytes()
    except OSError as exc:
        raise DascInputError(f"{path}: kernel module recorded in {PLAN_FILENAME} (kernels.file) cannot be read "
                             f"({exc.strerror or exc}); copy the whole plan directory or recompile the plan") from None
    got = hashlib.sha256(data).hexdigest()
    if got != k.source_sha256:
        raise DascInputError(f"{path}: kernel module content (sha256 {got[:16]}...) differs from the one "
                             f"{PLAN_FILENAME} records in kernels.source_sha256 ({k.source_sha256[:16]}...): "
                             f"it was edited; recompile the plan")
