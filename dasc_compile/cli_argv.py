"""The ``dasc`` command line read before click parses it: the usage errors click would word badly or not raise.

click reads some command lines in ways a user does not mean, and this module names them in one line instead:

- an option that takes a value followed by another option (``--wmax --out X``): :func:`option_swallowed_option`;
- an integer option given a number click's ``int()`` reads but no one types as one (``--wmax 1_6``, ``+16``,
  `` 16``): :func:`loose_integer`;
- a one-value option given twice (``--wmax 16 ... --wmax 64``), of which click keeps the last without a word:
  :func:`repeated_option`;
- a size written as two words (``--budget 16 GiB``): :func:`size_split_in_two`;
- a list of w_max values given to ``dasc compile``: :func:`wmax_list_hint` names ``dasc sweep``.

Each takes the words after ``dasc`` (``argv``) and the click command (``typer.main.get_command(app)``), and
returns the message, or None (or "") when the command line is not such a case. :func:`dasc_compile.cli.run`
prints the message as ``error: ...`` with exit status 2.
"""

from __future__ import annotations

import re
import typing
from typing import Any, Optional

#: How an integer option's value must be written: decimal digits, an optional leading minus (a negative value is
#: left to the option's own range check, which names what it expects).
INTEGER_WORD = re.compile(r"-?[0-9]+")

_SIZE_UNIT = re.compile(r"(?i)^[kmgtp]?i?b$")
_SIZE_OPTIONS = ("--budget", "--pool-budget")          # the options that take a size in bytes (size_report.parse_bytes)


def _subcommand(group: Any, argv: list[str]) -> tuple[Optional[str], Any]:
    """The subcommand's name in ``argv`` (its first word that is no option) and its click command, or
    ``(name or None, None)`` when there is none or it is unknown."""
    sub = next((a for a in argv if not a.startswith("-")), None)
    command = getattr(group, "commands", {}).get(sub) if sub is not None else None
    return sub, command


def _words_after(argv: list[str], sub: str) -> list[str]:
    """The words after the subcommand, up to and including a ``--`` separator (after it every word is an
    argument)."""
    rest = argv[argv.index(sub) + 1:]
    return rest[:rest.index("--") + 1] if "--" in rest else rest


def _option_names(param: Any) -> list[str]:
    return [o for o in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])] if o.startswith("-")]


def option_swallowed_option(group: Any, argv: list[str]) -> str | None:
    """The usage error for an option that takes a value but is followed by another option of the same command
    (``dasc compile M --wmax --out X``: click would take ``--out`` as the w_max and report a bad integer, or,
    for a text option, silently use the next word as the path: ``--out -q`` wrote the plan to a folder named
    ``-q``), or None. "Another option" is one of the command's own option names, ``--help``, either of those in
    the ``--name=value`` form, or the ``--`` separator; any other word (a negative number, a file named ``-x``)
    is left to the parser. A command line asking for ``--help`` or ``--version`` is left to click, which
    answers those first.
    """
    sub, command = _subcommand(group, argv)
    if command is None:
        return None
    takes_value, names = set(), {"--help"}
    for param in command.params:
        opts = _option_names(param)
        if not opts:
            continue                                          # a positional argument
        names.update(opts)
        if not getattr(param, "is_flag", False) and not getattr(param, "count", False):
            takes_value.update(o for o in getattr(param, "opts", []) if o.startswith("-"))
    rest = _words_after(argv, sub)
    swallowed = [(a, b) for a, b in zip(rest, rest[1:])
                 if a in takes_value and (b == "--" or b.split("=", 1)[0] in names)]
    if not swallowed:
        return None
    if all(b != "--help" for _, b in swallowed) and {"--help", "--version"} & set(argv[:argv.index(sub)] + rest):
        return None                     # click answers a --help / --version before it reads any value
    a, b = swallowed[0]
    return (f"option '{a}' needs a value, but the next word is "
            + ("the '--' separator" if b == "--" else f"the option '{b}'")
            + f" (write '{a} VALUE ...'; see 'dasc {sub} --help')")


def _integer_options(command: Any) -> set[str]:
    """The option names of ``command`` whose value is an ``int`` (annotated ``int`` or ``Optional[int]`` on the
    typer function), read from the annotations because typer releases differ in what type object they give
    click's parameters."""
    try:
        hints = typing.get_type_hints(command.callback)
    except Exception:      # noqa: BLE001 - an unresolvable annotation: no integer option is checked
        return set()
    out = set()
    for param in command.params:
        hint = hints.get(getattr(param, "name", None))
        if hint is int or (typing.get_origin(hint) is typing.Union and set(typing.get_args(hint)) == {int, type(None)}):
            out.update(o for o in getattr(param, "opts", []) if o.startswith("--"))
    return out


def loose_integer(group: Any, argv: list[str]) -> str | None:
    """The usage error for an integer option given a number written other than in decimal digits
    (``--wmax 1_6``, ``--wmax +16``, ``--tp ' 2'``), which click's ``int()`` would read silently (``1_6`` as 16:
    a typo served as a plan), or None. A value that is no number at all is left to click, which names it;
    ``--help`` or ``--version`` on the command line is left to click too.
    """
    sub, command = _subcommand(group, argv)
    if command is None:
        return None
    rest = _words_after(argv, sub)
    if {"--help", "--version"} & set(argv[:argv.index(sub)] + rest):
        return None
    ints = _integer_options(command)
    for i, word in enumerate(rest):
        if "=" in word and word.split("=", 1)[0] in ints:
            opt, value = word.split("=", 1)
        elif word in ints and i + 1 < len(rest):
            opt, value = word, rest[i + 1]
        else:
            continue
        if INTEGER_WORD.fullmatch(value):
            continue
        try:
            int(value)
        except ValueError:
            continue                   # no number at all: click's own message names the option and the value
        return (f"option '{opt}': {value!r} is not written as a whole number in decimal digits; expected e.g. "
                f"'{opt} 16' (see 'dasc {sub} --help')")
    return None


def repeated_option(group: Any, argv: list[str]) -> str | None:
    """The usage error for an option that takes one value given more than once (``dasc compile M --wmax 16 --out P
    --wmax 64``: click keeps the last value without a word, so an edited command line can compile another plan
    than the one its first flag names), or None. Options that take several values (``dasc eval --plan A --plan
    B``) and flags are left alone; so is a command line asking for ``--help`` or ``--version``.
    """
    sub, command = _subcommand(group, argv)
    if command is None:
        return None
    rest = _words_after(argv, sub)
    if {"--help", "--version"} & set(argv[:argv.index(sub)] + rest):
        return None
    one_value = {}
    for param in command.params:
        if getattr(param, "is_flag", False) or getattr(param, "count", False) or getattr(param, "multiple", False):
            continue
        for o in getattr(param, "opts", []):
            if o.startswith("-"):
                one_value[o] = param.name
    seen: dict[str, tuple[str, str]] = {}
    i = 0
    while i < len(rest) and rest[i] != "--":
        word = rest[i]
        opt, value = (word.split("=", 1) if "=" in word and word.split("=", 1)[0] in one_value else (word, None))
        if opt in one_value:
            if value is None:
                value = rest[i + 1] if i + 1 < len(rest) else ""
                i += 1                                              # the value word is no option
            first = seen.get(one_value[opt])
            if first is not None:
                return (f"option '{opt}' given twice ({first[1]!r}, then {value!r}); click would keep the last "
                        f"without a word: give it once (see 'dasc {sub} --help')")
            seen[one_value[opt]] = (opt, value)
        i += 1
    return None


def size_split_in_two(argv: list[str]) -> str | None:
    """For a click "unexpected extra argument" error: the option whose size was written as two words
    (``--budget 16 GiB``: the shell passes ``GiB`` as a word of its own, which click then reports without naming
    ``--budget``), as a message naming the option and the spelling it takes, or None when no word after a
    ``--option NUMBER`` pair is a byte unit (B, KB, KiB, ..., PiB).
    """
    for opt, num, unit in zip(argv, argv[1:], argv[2:]):
        if opt in _SIZE_OPTIONS and re.fullmatch(r"[0-9.eE+]+", num) and _SIZE_UNIT.match(unit):
            return (f"option '{opt}' got '{num}' and '{unit}' as two words: write '{opt} {num}{unit}' "
                    f"(or quote it: {opt} '{num} {unit}')")
    return None


def wmax_list_hint(argv: list[str], msg: str) -> str:
    """For click's message ``msg`` rejecting a one-value ``--wmax`` that was given a list of w_max values
    (``dasc compile M --wmax 16,64``, also written ``--wmax 16, 64``): a hint naming ``dasc sweep``, the command
    that compares several, with the list as sweep takes it (:func:`dasc_compile.sweep.parse_int_list`: sorted,
    each value once); else "". Only the last ``--wmax`` before ``--`` counts, the one click rejected.
    """
    if "Invalid value for '--wmax'" not in msg:
        return ""
    words = argv[:argv.index("--")] if "--" in argv else argv
    value, k = None, -1
    for i, w in enumerate(words):
        if w == "--wmax" and i + 1 < len(words):
            value, k = words[i + 1], i + 1
        elif w.startswith("--wmax="):
            value, k = w.split("=", 1)[1], i
    if value is None or "," not in value:
        return ""
    while value.rstrip().endswith(",") and k + 1 < len(words):   # the shell split "16, 64" into two words
        k += 1
        value += words[k]
    from dasc_compile.errors import DascInputError
    from dasc_compile.sweep import parse_int_list
    try:
        values = parse_int_list(",".join(dict.fromkeys(p.strip() for p in value.split(","))), "--wmax", lo=1)
    except DascInputError:
        return ""
    if len(values) < 2:
        return ""
    return ("; one w_max per plan: to compare several, run 'dasc sweep MODEL --wmax "
            + ",".join(str(v) for v in values) + "'")
