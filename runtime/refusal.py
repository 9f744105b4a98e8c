"""The start-up refusal: one line that names what differs, never a traceback (DESIGN.md "Runtime in SGLang").

Its own module so that :mod:`dasc_runtime.sglang_api` (the SGLang version check) and
:mod:`dasc_runtime.verify` (every other start-up check, which reads options through the version's
adapter) both raise it without importing each other.
"""

from __future__ import annotations

from dasc_compile.schema import DascInputError

__all__ = ["DascRefusal", "PREFIX"]

#: What every refusal line starts with.
PREFIX = "dasc: refusing to start: "


class DascRefusal(DascInputError):
    """The plan cannot serve this model / configuration; the message names what differs."""

    def __init__(self, what: str) -> None:
        super().__init__(PREFIX + what)
