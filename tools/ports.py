"""``free_port``: an unused TCP port on 127.0.0.1, for servers a harness starts.

One place, so every caller binds the same address and returns an ``int``. The port is free
when this returns and may be taken by someone else before the caller binds it; callers that
cannot retry should pass port 0 to the server instead and read back what it bound.

The port is drawn below the kernel's ephemeral range (``ip_local_port_range``), where the
kernel never puts the local end of an outgoing connection or a listener bound to port 0.
A port drawn from that range could be taken meanwhile by any of the many connections a gang
opens (gloo's pairs, the rendezvous store's clients) and the server would then fail with
EADDRINUSE, which no retry of the test's own making would fix.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 15000  # above the kubelet's and the control plane's fixed ports (10250-10259)
HIGHEST = 30000  # below a Service's NodePorts (30000-32767)
MIN_ROOM = 1000  # fewer ports than that below the ephemeral range: let the kernel pick
AVOID = range(29400, 29600)  # torch.distributed's and torchrun's defaults
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(PORT_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at ``host`` right now, outside the ephemeral range and
    not handed out before by this process."""
    high = min(_ephemeral_low(), HIGHEST)
    if high - LOWEST >= MIN_ROOM:
        for _ in range(200):
            port = random.randrange(LOWEST, high)
            if port in AVOID or port in _handed_out:
                continue
            if _bindable(host, port):
                _handed_out.add(port)
                return port
    with socket.socket() as sock:  # a machine with no room below its ephemeral range
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
