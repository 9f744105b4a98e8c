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
