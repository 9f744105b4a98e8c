"""Which SGLang release is installed, and the adapter that speaks its internals for the rest of the runtime.

dasc plugs into SGLang's cache internals, which change between releases. Every difference lives in
one adapter module per tested release; this module picks the one for the installed SGLang and is the
only place that compares version strings (``tests/architecture/test_sglang_adapter.py`` fails on a
version check anywhere else in ``runtime/``).

=========================  ==================================================================
release                    adapter
=========================  ==================================================================
0.5.17                     :mod:`dasc_runtime.sglang_0517`
0.5.23                     :mod:`dasc_runtime.sglang_0523`
=========================  ==================================================================

The releases between them (0.5.18 - 0.5.22) are not tested and are refused, like any other
version, with one line naming the tested ones. Each adapter module exposes the same names (checked by
the test above): constants, and functions whose SGLang imports happen inside them, so importing an
adapter costs nothing. What each name adapts, and the SGLang file it follows, is documented in the
adapter modules; ``docs/sglang-versions.md`` lists every difference found.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Optional

__all__ = ["TESTED", "ADAPTERS", "installed_version", "adapter_for", "check_version", "api", "tested_range"]

#: SGLang releases the runtime is tested with, oldest first, and the adapter module of each.
ADAPTERS: dict[str, str] = {"0.5.17": "dasc_runtime.sglang_0517", "0.5.23": "dasc_runtime.sglang_0523"}
TESTED: tuple[str, ...] = tuple(ADAPTERS)

_API: list = [None]


def tested_range() -> str:
    """The tested releases in words, for messages: ``"0.5.17 and 0.5.23"``."""
    return " and ".join(TESTED)


def installed_version() -> str:
    """``sglang.__version__`` of the installed SGLang, ``"unknown"`` without one, ``"not installed"``."""
    try:
        import sglang
    except ImportError:
        return "not installed"
    return str(getattr(sglang, "__version__", "unknown"))


def adapter_for(version: str) -> Optional[ModuleType]:
    """The adapter module of ``version`` (an exact tested release), or None for any other version."""
    name = ADAPTERS.get(str(version))
    return importlib.import_module(name) if name is not None else None


def check_version(version: str) -> None:
    """Raise the one-line start-up refusal unless ``version`` is a tested release.

    Raises:
        DascRefusal: ``"dasc: refusing to start: sglang X is installed; ..."`` naming the tested range.
    """
    if str(version) not in ADAPTERS:
        from dasc_runtime.refusal import DascRefusal

        raise DascRefusal(f"sglang {version} is installed; the dasc runtime is tested with sglang {tested_range()} "
                          f"(supported range {TESTED[0]}-{TESTED[-1]}; the releases between are not tested): "
                          f"install sglang=={TESTED[-1]} or sglang=={TESTED[0]}")


def api() -> ModuleType:
    """The adapter of the installed SGLang (looked up once per process).

    Raises:
        DascRefusal: the installed SGLang is not a tested release (:func:`check_version`).
    """
    if _API[0] is None:
        version = installed_version()
        check_version(version)
        _API[0] = adapter_for(version)
    return _API[0]
