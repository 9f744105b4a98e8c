"""Import a plan's rendered kernel module from its plan directory (DESIGN.md "Kernels").

The compiler writes ``dasc_kernels_<key16>.py`` beside ``plan.json`` and records a
:class:`~dasc_compile.schema.KernelModule` (file, key, ops, constants) in ``Plan.kernels``.
This loader imports that file with importlib under a module name unique to its key, so two
plans (or two ranks with different specialisations) never share a module, and checks that
the file is the one the plan names (its ``KEY`` and ``OPS``).

Running the kernels on CPU tensors uses Triton's interpreter: ``interpret=True`` sets
``TRITON_INTERPRET=1`` while the module is executed (Triton decides at decoration time) and
registers it under a separate name, so a compiled and an interpreted copy can coexist in one
process. The rendered kernels call only builtins of ``triton.language`` (not its own ``@jit``
helpers such as ``tl.max``), so this works even when triton was imported earlier without the
variable; callers should still keep ``TRITON_INTERPRET=1`` set while launching interpreted kernels.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Optional

from dasc_compile.schema import PLAN_FILENAME, DascInputError, KernelModule, load_plan

MODULE_PREFIX = "dasc_plan_kernels_"


def module_name(key: str, *, interpret: bool = False) -> str:
    """``sys.modules`` name of the module with cache key ``key``."""
    return f"{MODULE_PREFIX}{key[:32]}{'_interp' if interpret else ''}"


def load_kernel_module(plan_dir: str | Path, file_name: str, *, key: Optional[str] = None,
                       ops: Optional[list[str]] = None, interpret: bool = False,
                       source_sha256: Optional[str] = None) -> ModuleType:
    """Import ``plan_dir / file_name`` once per (key, interpret) and return the module.

    Args:
        plan_dir: the plan directory. file_name: the rendered module's file name.
        key: expected cache key (``KernelModule.key``); the module's ``KEY`` must match.
        ops: host wrappers the module must define (``KernelModule.ops``).
        interpret: import with ``TRITON_INTERPRET=1`` (kernels then run on CPU tensors).
        source_sha256: expected sha256 of the file's bytes (``KernelModule.source_sha256``).

    Raises:
        DascInputError: the file is missing, is not a dasc kernel module, or its key / ops
            differ from the plan's record (a stale or foreign file).
    """
    path = Path(plan_dir) / file_name
    if not path.is_file():
        raise DascInputError(f"{path}: kernel module named by plan.json not found")
    if Path(file_name).name != file_name or not file_name.endswith(".py"):
        raise DascInputError(f"{path}: kernel module file must be a bare '*.py' name, got {file_name!r}")
    head = path.read_text(errors="replace")
    file_key = _read_key(head)
    if file_key is None:
        raise DascInputError(f"{path}: not a dasc kernel module (no KEY line)")
    if key is not None and file_key != key:
        raise DascInputError(f"{path}: kernel key {file_key[:16]}... does not match plan.json's {key[:16]}...")
    if source_sha256 is not None:
        got = hashlib.sha256(path.read_bytes()).hexdigest()
        if got != source_sha256:
            raise DascInputError(f"{path}: kernel module content (sha256 {got[:16]}...) differs from the one "
                                 f"plan.json records ({source_sha256[:16]}...): it was edited; recompile the plan")
    name = module_name(file_key, interpret=interpret)
    module = sys.modules.get(name)
    if module is None:
        module = _import(path, name, interpret=interpret)
    missing = [op for op in (ops or []) if not callable(getattr(module, op, None))]
    if missing:
        raise DascInputError(f"{path}: kernel module lacks op(s) {missing} listed in plan.json")
    return module


def load_plan_kernels(plan_dir: str | Path, entry: Optional[KernelModule] = None, *,
                      interpret: bool = False) -> ModuleType:
    """Import the module that ``Plan.kernels`` names, checking its key and ops.

    Args:
        plan_dir: the plan directory. entry: the plan's ``kernels`` record; when omitted the plan
            is read with the one plan reader (:func:`dasc_compile.schema.load_plan`).
        interpret: see :func:`load_kernel_module`.

    Raises:
        DascInputError: plan.json does not load (see :func:`dasc_compile.schema.load_plan`), has no
            kernels entry, or the module does not match it (see :func:`load_kernel_module`).
    """
    if entry is None:
        entry = load_plan(plan_dir, verify_kernels=False).kernels
        if entry is None:
            raise DascInputError(f"{Path(plan_dir) / PLAN_FILENAME}: the plan has no 'kernels' entry "
                                 "(compiled without kernels)")
    return load_kernel_module(plan_dir, entry.file, key=entry.key, ops=list(entry.ops), interpret=interpret,
                              source_sha256=entry.source_sha256)


def _read_key(source: str) -> Optional[str]:
    for line in source.splitlines():
        if line.startswith("KEY = "):
            return line.split("=", 1)[1].strip().strip("\"'")
    return None


def _import(path: Path, name: str, *, interpret: bool) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:  # pragma: no cover - defensive
        raise DascInputError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    previous = os.environ.get("TRITON_INTERPRET")
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    elif previous is not None:
        os.environ.pop("TRITON_INTERPRET")
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous
    return module
