"""Transitional import path: the one plan reader is :func:`dasc_compile.schema.load_plan`.

``runtime/sizing.py`` and ``benchmarks/`` (owned by other passes) still import
``dasc_runtime.plan_io.load_plan``; this module re-exports the schema's reader (the same function,
no second reader) and is to be deleted once ``grep -rn plan_io runtime benchmarks tests`` finds only
this file. Runtime code imports the reader from :mod:`dasc_compile.schema`.
"""

from dasc_compile.schema import load_plan

__all__ = ["load_plan"]
