"""The plan artifact's schema (DESIGN.md "Plan artifact"): the one contract between compiler and runtime.

The runtime imports only this package (and its submodules) and the generated kernels. Submodules:

* :mod:`~dasc_compile.schema.plan`: the pydantic models of ``plan.json`` and ``SCHEMA_VERSION`` rules;
* :mod:`~dasc_compile.schema.units`: :class:`UnitSpec` (unit shapes, INT8 scales, bytes, the dtype
  table) and :func:`usable_slots` (App. C.1);
* :mod:`~dasc_compile.schema.reader`: :func:`load_plan`, the one plan reader;
* :mod:`~dasc_compile.schema.canonical`: canonical JSON, content hash, JSON schema, decay fingerprint.

Everything is re-exported here, with :class:`DascInputError`. No torch import at module level.
"""

from __future__ import annotations

from dasc_compile.errors import DascInputError  # re-exported: the runtime imports it from this contract package
from dasc_compile.schema.canonical import (
    SCHEMA_PATH,
    canonical_json,
    compute_content_hash,
    decay_sha256,
    json_schema,
    schema_text,
    with_content_hash,
)
from dasc_compile.schema.plan import (
    PLAN_FILENAME,
    SCHEMA_VERSION,
    CoupledTensor,
    Fingerprint,
    HorizonQuantiles,
    KernelModule,
    LayerPermutation,
    LayerPlan,
    ModelInfo,
    Plan,
    RankPayload,
    RefreshPlan,
    ServedDecay,
    StorageMap,
    Totals,
    TPPlan,
    UnitKindName,
)
from dasc_compile.schema.reader import load_plan, plan_json_path
from dasc_compile.schema.units import DTYPE_ITEMSIZE, STATE_DTYPES, UNIT_KINDS, UnitKind, UnitSpec, usable_slots

__all__ = [
    "DTYPE_ITEMSIZE", "PLAN_FILENAME", "SCHEMA_PATH", "SCHEMA_VERSION", "STATE_DTYPES", "UNIT_KINDS", "CoupledTensor",
    "DascInputError", "Fingerprint", "HorizonQuantiles", "KernelModule", "LayerPermutation", "LayerPlan", "ModelInfo",
    "Plan", "RankPayload", "RefreshPlan", "ServedDecay", "StorageMap", "TPPlan", "Totals", "UnitKind", "UnitKindName", "UnitSpec",
    "canonical_json", "compute_content_hash", "decay_sha256", "json_schema", "load_plan", "plan_json_path",
    "schema_text", "usable_slots", "with_content_hash",
]
