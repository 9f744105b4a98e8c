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


#: The characters ``str.splitlines`` breaks a line at (so does a terminal or a script reading the ``error:`` line).
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_ESCAPED_BREAKS = str.maketrans({c: c.encode("unicode_escape").decode("ascii") for c in _LINE_BREAKS})


def one_line(text: str) -> str:
    """``text`` with every line break written as its escape (``\\n``, ``\\r``, ``\\x0b``, ``\\u2028``, ...),
    so that a message naming a path that holds one (``$'notes\\nv2'``) stays one line. A backslash already in the
    text is left as it is."""
    return text.translate(_ESCAPED_BREAKS)


def error_line(message: str) -> str:
    """``error: <message>`` as one line (:func:`one_line`): what every ``dasc`` command prints for bad input."""
    return "error: " + one_line(message)


def pydantic_message(error: dict) -> str:
    """The message of one pydantic error (``ValidationError.errors()`` item), without the "Value error, " pydantic
    puts before a validator's own words."""
    return str(error["msg"]).removeprefix("Value error, ")


#: Largest seed a command takes (``--seed``, ``--init-seed``): torch.Generator.manual_seed takes 64-bit seeds.
MAX_SEED = 2**63 - 1


def check_seed(flag: str, value: int | None) -> None:
    """Refuse a seed outside ``[0, MAX_SEED]``, naming ``flag``; ``None`` (not given) passes.

    Raises:
        DascInputError: ``value`` is negative or above ``MAX_SEED`` (torch would refuse it later with an overflow
            that reads as a model problem, or take a negative seed as a different 64-bit one).
    """
    if value is not None and not 0 <= value <= MAX_SEED:
        raise DascInputError(f"{flag} {value}: expected an integer in [0, {MAX_SEED}] "
                             f"(torch.Generator seeds are 64-bit)")
