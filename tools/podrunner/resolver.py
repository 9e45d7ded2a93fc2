"""Whether a host name resolves on this machine, asked once per name and never for long.

The networking stand-in (``translate.rewrite_rendezvous``) turns a ``MASTER_ADDR`` that cannot
resolve here into loopback. A lookup of a cluster name can hang for seconds on some resolvers,
and every container of every pod asks, so the answer is cached and the lookup runs in a daemon
thread with a time limit: no answer in time counts as "does not resolve".

Rejected: ``socket.setdefaulttimeout``, which does not bound ``getaddrinfo``.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def make_resolver(timeout_s: float = 1.0) -> Callable[[str], bool]:
    """``resolves(name)``: whether a host name resolves here, cached, never blocking long."""
    cache: dict[str, bool] = {}
    lock = threading.Lock()

    def resolves(name: str) -> bool:
        with lock:
            if name in cache:
                return cache[name]
        answer: list[bool] = []

        def look() -> None:
            try:
                socket.getaddrinfo(name, None)
                answer.append(True)
            except OSError:
                answer.append(False)

        thread = threading.Thread(target=look, daemon=True)
        thread.start()
        thread.join(timeout_s)
        result = bool(answer and answer[0])
        with lock:
            cache[name] = result
        return result

    return resolves
