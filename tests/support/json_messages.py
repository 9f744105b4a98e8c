"""The standard library JSON decoder's own error messages, which dasc passes through and which Python releases word
differently (3.13: "Illegal trailing comma before end of object" where 3.11 says "Expecting property name ...")."""

from __future__ import annotations

import json


def decode_error(text: str) -> str:
    """``str(json.JSONDecodeError)`` for ``text``, e.g. ``Expecting value: line 1 column 1 (char 0)`` for "".

    Raises:
        AssertionError: ``text`` decodes.
    """
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return str(exc)
    raise AssertionError(f"{text!r} decodes")
