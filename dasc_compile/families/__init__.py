"""Decay families. Each module registers its family and the model types it parses (see base.py).

To add an architecture, write one module here and list it in :data:`FAMILY_MODULES`.
"""

import importlib

from dasc_compile.families.base import FAMILIES, MODEL_PARSERS

__all__ = ["FAMILIES", "FAMILY_MODULES", "MODEL_PARSERS", "load_all"]

FAMILY_MODULES = ("gdn", "kda", "mamba2")


def load_all() -> None:
    """Import every family module so that its registrations run (idempotent)."""
    for name in FAMILY_MODULES:
        importlib.import_module(f"dasc_compile.families.{name}")
