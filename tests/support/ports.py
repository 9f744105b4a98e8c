"""A free TCP port on 127.0.0.1 for a test's servers (SGLang stand-ins, gloo rendezvous).

The port is free when returned; another process could still take it before the caller binds it (a small race every
such helper has).
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
