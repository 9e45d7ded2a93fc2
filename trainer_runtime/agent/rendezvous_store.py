"""The gang's rendezvous store, hosted by the agent of node rank 0 from the moment it knows it.

``init_process_group`` with the environment's rendezvous makes rank 0's worker start a
``TCPStore`` server at ``MASTER_ADDR:MASTER_PORT`` and every other rank a client of it. A client
that arrives before the server is refused and retries with a growing back-off: measured with
torch 2.15, a server that came up 1.5 s after its client was found at 2.6 s, one that came up
after 7.5 s at 12.0 s. After a membership change the ranks do not arrive together: the worker
of node rank 0 may first save the last finished step from memory (``stop: kill``), and the kept
pods' workers start at once while a replacement cold-starts. Every rank that came early then
pays part of its wait again in back-off.

The agent of node rank 0 knows the rendezvous as soon as it reads the membership, so it starts
the store's server then, before anything else, and its workers are clients of it like every
other rank: ``TORCHELASTIC_USE_AGENT_STORE=True``, the contract torch keeps with torchrun's own
agent (``torch.distributed.rendezvous``: with it set and the endpoint the agent's own
``MASTER_ADDR:MASTER_PORT``, rank 0 does not start a server). A client that arrives early is
then accepted at once.

The server runs in a child forked for it (:class:`StoreKeeper`), not in the agent: the agent
forks its workers, and a fork beside the server's threads could hand a worker a lock one of them
held. Each membership gets a fresh store (a process group's keys must not meet the last one's).
At another port the old keeper is stopped after the old workers are; at the same port it is
replaced first (``supervisor.Supervisor._restart``), so an early new member never reads the old
keys. A keeper that cannot start (the port taken) is logged, and the workers then host the store
as without the agent.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import logging
import os
import select
import signal
import sys
import time
from dataclasses import dataclass

log = logging.getLogger("trainer_runtime.agent")

READY_TIMEOUT_S = 5.0
"""How long the agent waits for the keeper's server to listen before it gives up on it."""
STORE_TIMEOUT = datetime.timedelta(minutes=30)
"""The server's own timeout for a key a client waits on (clients pass their own)."""
_PR_SET_PDEATHSIG = 1


@dataclass
class StoreKeeper:
    """A forked child serving the rendezvous store of one membership at ``port``."""

    port: int
    pid: int

    def stop(self) -> None:
        """End the server (its clients are gone or going) and reap the child."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def start(port: int, ready_timeout_s: float = READY_TIMEOUT_S) -> StoreKeeper | None:
    """Fork a keeper serving a new store at ``port``; None (logged) when it did not come up."""
    began = time.monotonic()
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child never returns from here
        os.close(read_fd)
        _serve(port, write_fd)
    os.close(write_fd)
    try:
        readable, _, _ = select.select([read_fd], [], [], ready_timeout_s)
        ready = bool(readable) and os.read(read_fd, 1) == b"1"
    finally:
        os.close(read_fd)
    keeper = StoreKeeper(port, pid)
    if not ready:
        keeper.stop()
        log.warning(
            "agent: the rendezvous store at port %d did not start; the workers host it", port
        )
        return None
    log.info("agent: rendezvous store at port %d up in %.3f s", port, time.monotonic() - began)
    return keeper


def _serve(port: int, ready_fd: int) -> None:
    code = 0
    try:
        for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        _die_with_parent()
        from torch.distributed import TCPStore  # noqa: PLC0415 - the agent imported it

        store = TCPStore(
            "127.0.0.1", port, None, True, timeout=STORE_TIMEOUT, wait_for_workers=False
        )
        os.write(ready_fd, b"1")
        os.close(ready_fd)
        while store is not None:
            signal.pause()
    except BaseException as exc:  # the agent logs that it did not come up
        print(f"rtj: agent: rendezvous store at port {port}: {exc}", file=sys.stderr)
        code = 1
    finally:
        os._exit(code)


def _die_with_parent() -> None:
    """Linux: the keeper gets SIGKILL when the agent dies, even by SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
