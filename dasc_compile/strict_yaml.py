"""Reading small user YAML files (policies) strictly: YAML 1.2 core types, unique keys, bounded size.

PyYAML's ``safe_load`` follows YAML 1.1: ``yes`` / ``off`` become booleans, ``1e-3`` stays a string,
a repeated key silently keeps its last value, and aliases can expand a few hundred bytes into
billions of nodes. :func:`load_yaml_file` instead

* resolves plain scalars by the YAML 1.2 core schema: ``true`` / ``false`` are the only booleans,
  ``null`` / ``~`` / empty the only null, decimal / ``0o`` / ``0x`` integers, floats with or without a
  dot (``1e-3``, ``.inf``, ``.nan``); everything else (``yes``, ``off``, dates) is a string;
* refuses a key that appears twice in one mapping (naming the key and both lines);
* counts every node an alias re-uses, and refuses a document that expands past
  :data:`MAX_NODES` nodes;
* refuses files that are not regular files (a FIFO would block), larger than :data:`MAX_BYTES`,
  not UTF-8, or nested deeper than Python can parse.

Errors are one-line :class:`DascInputError` messages naming the file; echoed input is cut to
:data:`dasc_compile.errors.ECHO_CHARS` characters.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from dasc_compile.errors import DascInputError, short_repr, short_text
from dasc_compile.userfiles import read_user_bytes

__all__ = ["MAX_BYTES", "MAX_NODES", "load_yaml_file"]

#: Largest YAML file read, bytes (a policy is a few hundred bytes).
MAX_BYTES = 1 << 20
#: Largest number of nodes a document may expand to, aliases counted at every use.
MAX_NODES = 10_000
_CORE_RESOLVERS = [
    ("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")),
    ("tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")),
    ("tag:yaml.org,2002:float",
     re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+.0123456789")),
]


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core scalars, unique keys and a bound on alias expansion."""

    yaml_implicit_resolvers: dict = {}

    def __init__(self, stream):
        super().__init__(stream)
        self._expanded = 0
        self._sizes: dict[int, int] = {}

    def _size(self, node) -> int:
        """Nodes in ``node``'s subtree, aliases counted at every use (memoised by node)."""
        key = id(node)
        if key in self._sizes:
            return self._sizes[key]
        self._sizes[key] = 1   # a recursive alias counts once, then the bound below stops it
        if isinstance(node, yaml.SequenceNode):
            n = 1 + sum(self._size(c) for c in node.value)
        elif isinstance(node, yaml.MappingNode):
            n = 1 + sum(self._size(k) + self._size(v) for k, v in node.value)
        else:
            n = 1
        self._sizes[key] = n
        return n

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            anchor = self.peek_event().anchor
            if anchor in self.anchors:
                self._count(self._size(self.anchors[anchor]))
        else:
            self._count(1)
        return super().compose_node(parent, index)

    def _count(self, n: int) -> None:
        self._expanded += n
        if self._expanded > MAX_NODES:
            raise _TooLarge()

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue   # the base class reports unhashable keys
            line = key_node.start_mark.line + 1
            if key in seen:
                raise _DuplicateKey(key, seen[key], line)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


for _tag, _regexp, _first in _CORE_RESOLVERS:
    _StrictLoader.add_implicit_resolver(_tag, _regexp, _first)


def _construct_core_float(loader, node):
    text = loader.construct_scalar(node).lower()
    if text.endswith((".inf",)):
        return float("-inf") if text.startswith("-") else float("inf")
    if text == ".nan":
        return float("nan")
    return float(text)


_StrictLoader.add_constructor("tag:yaml.org,2002:float", _construct_core_float)


def _construct_core_int(loader, node):
    text = loader.construct_scalar(node)
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _construct_core_int)


class _TooLarge(Exception):
    pass


class _DuplicateKey(Exception):
    def __init__(self, key, first: int, again: int):
        super().__init__(key)
        self.key, self.first, self.again = key, first, again


def load_yaml_file(path: str | Path, what: str = "YAML file") -> Any:
    """Parse one YAML document from ``path`` strictly (see module docstring).

    Returns:
        the document (``None`` for an empty file).
    Raises:
        DascInputError: not a regular file, too large, not UTF-8, not valid YAML, a duplicate key,
            too many nodes after alias expansion, nested too deeply.
    """
    p = Path(path)
    raw = read_user_bytes(p, what, MAX_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DascInputError(f"{p}: {what} is not UTF-8 text (byte {exc.start} is 0x{raw[exc.start]:02x})") from None
    if "\x00" in text:
        raise DascInputError(f"{p}: {what} is not text (it holds NUL bytes)")
    loader = _StrictLoader(text)
    try:
        return loader.get_single_data()
    except _DuplicateKey as exc:
        raise DascInputError(f"{p}: key {short_repr(exc.key)} appears twice (lines {exc.first} and {exc.again}); "
                             f"expected each key once") from None
    except _TooLarge:
        raise DascInputError(f"{p}: {what} expands (YAML aliases counted at every use) to more than {MAX_NODES} "
                             f"nodes; expected a small mapping") from None
    except RecursionError:
        raise DascInputError(f"{p}: {what} is nested too deeply to parse; expected a flat mapping") from None
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise DascInputError(f"{p}: not valid YAML{where} ({short_text(first)})") from None
    finally:
        loader.dispose()
