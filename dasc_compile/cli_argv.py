"""The ``dasc`` command line read before click parses it: the usage errors click would word badly or not raise.

click reads some command lines in ways a user does not mean, and this module names them in one line instead:

- an option that takes a value followed by another option (``--wmax --out X``): :func:`option_swallowed_option`;
- a number option given a value the parser reads but no one types as that number (``--wmax 1_6``, ``+16``,
  ``16.0``; ``--eps 1_0e-4``), or one click refuses without echoing it (no digit, a comma, too many digits):
  :func:`loose_number`;
- a one-value option given twice with different values (``--wmax 16 ... --wmax 64``), or a flag given both ways
  (``--int8 ... --no-int8``), of which click keeps the last without a word: :func:`repeated_option`;
- a size written as two words (``--budget 16 GiB``): :func:`size_split_in_two`;
- a list of w_max values given to ``dasc compile``: :func:`wmax_list_hint` names ``dasc sweep``.

Each takes the words after ``dasc`` (``argv``) and the click command (``typer.main.get_command(app)``), and
returns the message, or None (or "") when the command line is not such a case. :func:`dasc_compile.cli.run`
prints the message as ``error: ...`` with exit status 2.
"""

from __future__ import annotations

import math
import re
import sys
import types
import typing
from typing import Any, Optional

from dasc_compile.sweep import WHOLE_NUMBER as INTEGER_WORD   # one rule for how a whole number is written

FLOAT_WORD = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")

_NON_FINITE = re.compile(r"(?i)[-+]?(?:inf|infinity|nan)")   # float words click reads; the policy names them

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


def _value_options(command: Any) -> dict[str, Any]:
    """The option names of ``command`` that take a value (not flags), each mapped to its parameter."""
    out = {}
    for param in command.params:
        if getattr(param, "is_flag", False) or getattr(param, "count", False):
            continue
        out.update((o, param) for o in getattr(param, "opts", []) if o.startswith("-"))
    return out


def _scan(command: Any, rest: list[str]) -> tuple[list[tuple[str, Optional[str]]], list[str]]:
    """``rest`` (the words after the subcommand) read as click reads them: the ``(option, value)`` pairs of the
    options that take a value (``--opt VALUE`` or ``--opt=VALUE``; value None when ``--opt`` is the last word),
    and the free words, i.e. every word that is no such option or its value. Stops at ``--``."""
    takes = _value_options(command)
    pairs, free, i = [], [], 0
    while i < len(rest) and rest[i] != "--":
        word = rest[i]
        head, eq, tail = word.partition("=")
        if eq and head in takes:
            pairs.append((head, tail))
        elif word in takes:
            pairs.append((word, rest[i + 1] if i + 1 < len(rest) else None))
            i += 1                                      # the value word is no option, whatever it looks like
        else:
            free.append(word)
        i += 1
    return pairs, free


def _answered_first(argv: list[str], sub: str, command: Any) -> bool:
    """Whether click answers ``--help`` or ``--version`` before it reads any value: ``--help`` or ``--version``
    before the subcommand, or ``--help`` after it as a word of its own (not the value of an option)."""
    if {"--help", "--version"} & set(argv[:argv.index(sub)]):
        return True
    return "--help" in _scan(command, _words_after(argv, sub))[1]


def option_swallowed_option(group: Any, argv: list[str]) -> str | None:
    """The usage error for an option that takes a value but is followed by another option of the same command
    (``dasc compile M --wmax --out X``: click would take ``--out`` as the w_max and report a bad integer, or,
    for a text option, silently use the next word as the path: ``--out -q`` wrote the plan to a folder named
    ``-q``), or None. "Another option" is one of the command's own option names, ``--help``, ``--version``
    (the root command's, which click would take as the value here), any of those in the ``--name=value`` form,
    or the ``--`` separator; any other word (a negative number, a file named ``-x``) is left to the parser. A
    command line asking for ``--help`` or ``--version`` (:func:`_answered_first`) is left to click.
    """
    sub, command = _subcommand(group, argv)
    if command is None or _answered_first(argv, sub, command):
        return None
    names = {"--help", "--version"}.union(*(_option_names(p) for p in command.params))
    takes_value = set(_value_options(command))
    rest = _words_after(argv, sub)
    swallowed = [(a, b) for a, b in zip(rest, rest[1:])
                 if a in takes_value and (b == "--" or b.split("=", 1)[0] in names)]
    if not swallowed:
        return None
    a, b = swallowed[0]
    return (f"option '{a}' needs a value, but the next word is "
            + ("the '--' separator" if b == "--" else f"the option '{b}'")
            + f" (write '{a} VALUE ...'; see 'dasc {sub} --help')")


def _number_options(command: Any) -> dict[str, type]:
    """The option names of ``command`` whose value is an ``int`` or a ``float`` (annotated so, or ``Optional`` of
    it, in either spelling, on the typer function), mapped to that type. Read from the annotations because typer
    releases differ in what type object they give click's parameters (and in whether ``16.0`` passes as an int).

    Raises:
        NameError: an annotation of the command that cannot be resolved (a defect of dasc, caught by the tests).
    """
    hints = typing.get_type_hints(command.callback)
    out = {}
    for param in command.params:
        hint = hints.get(getattr(param, "name", None))
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            hint = args[0] if len(args) == 1 else None
        if hint in (int, float):
            out.update((o, hint) for o in getattr(param, "opts", []) if o.startswith("--"))
    return out


#: How a number option's value must be written (decimal digits, an optional leading minus: a negative value is
#: left to the option's own range check, which names what it expects), with an example for the message.
_NUMBER_WORDS = {int: (INTEGER_WORD, "a whole number in decimal digits", "16"),
                 float: (FLOAT_WORD, "a decimal number (digits, an optional point and exponent)", "0.001")}


#: An option whose values look unlike the generic example (a_s is a gate input; -0.3 is the GDN / KDA default).
_EXAMPLES = {"--a-s": "-0.3"}


def loose_number(group: Any, argv: list[str]) -> str | None:
    """The usage error for a number option given a value not written as that number is, or None. Refused, with
    the value (cut to :data:`~dasc_compile.errors.ECHO_CHARS`):

    - digits the parser would read silently: ``--wmax 1_6``, ``+16``, ``16.0`` or ``1_6.0`` for an integer,
      ``1_0e-4`` for a float (``1_6`` read as 16 is a typo served as a plan);
    - a value with no digit, an empty one, or one holding a comma (``--wmax abc``, ``--eps 1,5``, ``--tp 1,2``),
      which click refuses without echoing it;
    - a whole number longer than Python's ``int()`` reads (``sys.get_int_max_str_digits``), which it refuses
      without the option's name; a float written in digits beyond the float range (``--a-s 1e400``), which
      would be read, and then refused, as infinity, or below its smallest value (``--a-s 1e-400``), which would
      be read as 0.

    Allowed: spaces around the value, as ``dasc sweep``'s lists allow them. Left to click: ``inf`` or ``nan`` for
    a float (the policy names them: not finite), a ``--wmax`` list that :func:`wmax_list_hint` turns into a
    ``dasc sweep`` command (``--wmax 16,64``, ``--wmax 16, 64``), and a command line asking for ``--help`` or
    ``--version``.
    """
    from dasc_compile.errors import short_repr

    sub, command = _subcommand(group, argv)
    if command is None or _answered_first(argv, sub, command):
        return None
    numbers = _number_options(command)
    limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0   # 0: no limit
    for opt, value in _scan(command, _words_after(argv, sub))[0]:
        if opt not in numbers or value is None:
            continue
        word, what, example = _NUMBER_WORDS[numbers[opt]]
        example = _EXAMPLES.get(opt, example)
        expected = f"expected e.g. '{opt} {example}' (see 'dasc {sub} --help')"
        text = value.strip()
        if word.fullmatch(text):
            digits = len(text.lstrip("-"))
            if numbers[opt] is int and limit and digits > limit:       # click: "exceeded maximum size"
                return f"option '{opt}': a whole number written with {digits:,} digits, more than Python reads " \
                       f"({limit:,}); {expected}"
            read = float(text) if numbers[opt] is float else None
            if read is not None and math.isinf(read):                         # 1e400 would read as inf
                return f"option '{opt}': {short_repr(value)} is beyond the range of a float (it would read as " \
                       f"infinity); {expected}"
            if read == 0 and any(d in "123456789" for d in re.split("[eE]", text)[0]):
                return f"option '{opt}': {short_repr(value)} is below the smallest float (it would read as 0); " \
                       f"{expected}"                                      # 1e-400
            continue
        if numbers[opt] is float and _NON_FINITE.fullmatch(text):
            continue
        if "," in value and opt == "--wmax" and wmax_list_hint(argv, "Invalid value for '--wmax'"):
            continue               # a list of w_max values: click's line with the sweep hint
        parts = [x.strip() for x in value.split(",")]
        if numbers[opt] is int and len(parts) > 1 and all(word.fullmatch(x) for x in parts):
            return f"option '{opt}': {short_repr(value)} is a list, not one whole number; {expected}"
        written = "written as " if any(ch.isdigit() for ch in value) else ""
        return f"option '{opt}': {short_repr(value)} is not {written}{what}; {expected}"
    return None


def repeated_option(group: Any, argv: list[str]) -> str | None:
    """The usage error for an option that takes one value given twice with different values (``dasc compile M
    --wmax 16 --out P --wmax 64``), or a flag given both ways (``--int8 ... --no-int8``), of which click keeps the
    last without a word, so an edited command line can compile another plan than its first flag says; or None.
    Options that take several values (``dasc eval --plan A --plan B``), a value repeated as it was, an occurrence
    with no value or an empty one (click names that), and a command line asking for ``--help`` or ``--version``
    are left alone.
    """
    sub, command = _subcommand(group, argv)
    if command is None or _answered_first(argv, sub, command):
        return None
    takes = _value_options(command)
    pairs, free = _scan(command, _words_after(argv, sub))
    seen: dict[str, str] = {}
    for opt, value in pairs:
        param = takes[opt]
        if getattr(param, "multiple", False) or not value:
            continue
        if seen.get(param.name, value) != value:
            return (f"option '{opt}' given twice ({seen[param.name]!r}, then {value!r}); only the last would count: "
                    f"give it once (see 'dasc {sub} --help')")
        seen[param.name] = value
    for param in command.params:          # a boolean flag pair such as --int8/--no-int8, given both ways
        on, off = list(getattr(param, "opts", [])), list(getattr(param, "secondary_opts", []))
        if off and any(w in on for w in free) and any(w in off for w in free):
            first = next(w for w in free if w in on + off)
            last = next(w for w in reversed(free) if w in on + off)
            return (f"options '{first}' and '{last}' both given; only the last would count: give one "
                    f"(see 'dasc {sub} --help')")
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


def help_hint(group: Any, argv: list[str], ctx: Any) -> str:
    """`` (see 'dasc CMD --help')`` for a usage error: CMD from click's context ``ctx`` when it names a
    subcommand, else the subcommand word in ``argv`` (click gives an option's parse errors, such as ``--wmax``
    without its value, no context); `` (see 'dasc --help')`` when neither names a known command."""
    if ctx is not None:
        return f" (see 'dasc {ctx.info_name} --help')" if ctx.parent is not None else " (see 'dasc --help')"
    sub, command = _subcommand(group, argv)
    return f" (see 'dasc {sub} --help')" if command is not None else " (see 'dasc --help')"


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
