"""``free_port``: an unused TCP port on 127.0.0.1, for servers a harness starts.

One place, so every caller binds the same address and returns an ``int``. The port is free
when this returns and may be taken by someone else before the caller binds it; callers that
cannot retry should pass port 0 to the server instead and read back what it bound.
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at ``host`` right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
