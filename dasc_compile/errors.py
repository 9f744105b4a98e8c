"""Errors raised for bad user input.

Every problem a user can cause (a bad file, tensor, config field or policy key) raises
:class:`DascInputError` with one line that names the offending thing and what was expected.
The CLI prints that line and exits with status 2; nothing is written.
"""

from __future__ import annotations


class DascInputError(ValueError):
    """Bad user input: one clear line naming the file / tensor / field and what was expected.

    Raised by the checkpoint reader, architecture detection, policy validation, the compiler
    and the plan loader. The CLI turns it into ``error: <message>`` and exit status 2.
    """

    exit_code = 2


#: Echoed input in error messages is cut to about this many characters.
ECHO_CHARS = 200


def _make_repr():
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset, r.maxfrozenset = 3, 6, 6, 6, 6, 6
    r.maxstring, r.maxother, r.maxlong = ECHO_CHARS, ECHO_CHARS, 60
    return r


_REPR = _make_repr()


def short_repr(value, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` for an error message, cut to about ``limit`` characters without ever building
    the full repr (a nested or alias-expanded input can be gigabytes long)."""
    s = _REPR.repr(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def short_text(text: str, limit: int = ECHO_CHARS) -> str:
    """``text`` cut to ``limit`` characters; ``...`` marks a cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def pydantic_message(error: dict) -> str:
    """The message of one pydantic error (``ValidationError.errors()`` item), without the "Value error, " pydantic
    puts before a validator's own words."""
    return str(error["msg"]).removeprefix("Value error, ")
