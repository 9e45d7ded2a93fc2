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

The pods do not read a new membership at the same moment (each one's downward-API file is
refreshed on its own), so a member can learn of the new gang before node rank 0 does, while the
old store still answers at the address. Each keeper therefore writes its membership epoch into
its store (``EPOCH_KEY``), and the agent of every other pod, before it starts workers or hands
the running ones a new membership (a switch or a rejoin in process), waits until the store at
the rendezvous address is not an older gang's (:func:`wait_until_current`). A rejoin after a
loss forms its group at once, with no step agreed first, so without that wait a member could
form at the old store and the new rank 0 at the new one, each waiting for the other.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import logging
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed import TCPStore

    from ..pod.membership import Membership

log = logging.getLogger("trainer_runtime.agent")

READY_TIMEOUT_S = 5.0
"""How long the agent waits for the keeper's server to listen before it gives up on it."""
STORE_TIMEOUT = datetime.timedelta(minutes=30)
"""The server's own timeout for a key a client waits on (clients pass their own)."""
EPOCH_KEY = "rtj/agent/membership-epoch"
"""The key under which a keeper's store says the membership epoch it serves."""
SETTLED_KEY = "rtj/agent/saves-settled"
"""Set (to the epoch) once node rank 0's agent has seen the old gang's saves on its pod end
(the survivor's save from memory, or the collective save of ``stop: save``), right before it
starts its workers: from then on the newest committed checkpoint is the one the new gang
resumes from, and the new workers' download at import may fetch it (resume/warm_start.py)."""
PROBE_TIMEOUT_S = 2.0
"""How long one look at the store at the rendezvous address may take."""
_PR_SET_PDEATHSIG = 1


@dataclass
class StoreKeeper:
    """A forked child serving the rendezvous store of one membership at ``port``."""

    port: int
    pid: int

    def stop(self) -> None:
        """End the server (its clients are gone or going) and reap the child."""
        _end_child(self.pid)

    def settle(self) -> None:
        """Have the store say ``SETTLED_KEY`` (the keeper sets it on SIGUSR1)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGUSR1)


class StoreUnreachableError(Exception):
    """Nothing answered at the store's address in time, or the store went away."""


class StoreReader:
    """Reads keys of the store at ``addr:port`` as one of its clients, the way a worker looks
    at its gang's store before it joins it. The connection is made at the first read, and made
    again at the read after the store was not up yet or went away (node rank 0 swapping its
    stores), so a loop of reads needs no connection handling of its own."""

    def __init__(self, addr: str, port: int) -> None:
        self.addr = addr
        self.port = port
        self.client: TCPStore | None = None
        """The connected client (None before the first read that reached the store, and after
        one that lost it)."""

    def read(self, key: str, connect_timeout_s: float) -> bytes | None:
        """The value of ``key`` (None: the store does not have it); a connection is waited for
        up to ``connect_timeout_s``. Raises ``StoreUnreachableError``."""
        from torch.distributed import TCPStore  # noqa: PLC0415 - its callers import torch

        try:
            if self.client is None:
                self.client = TCPStore(
                    self.addr,
                    self.port,
                    None,
                    False,
                    timeout=datetime.timedelta(seconds=connect_timeout_s),
                )
            return self.client.get(key) if self.client.check([key]) else None
        except (RuntimeError, ValueError, OSError) as exc:  # torch's network errors included
            self.client = None
            raise StoreUnreachableError(f"{self.addr}:{self.port}: {exc}") from exc


def start(port: int, epoch: int, ready_timeout_s: float = READY_TIMEOUT_S) -> StoreKeeper | None:
    """Fork a keeper serving a new store of membership ``epoch`` at ``port``; None (logged)
    when it did not come up."""
    began = time.monotonic()
    pid, said = _fork_child(lambda answer_fd: _serve(port, epoch, answer_fd), ready_timeout_s)
    keeper = StoreKeeper(port, pid)
    if said != b"1":
        keeper.stop()
        log.warning(
            "agent: the rendezvous store at port %d did not start; the workers host it", port
        )
        return None
    log.info("agent: rendezvous store at port %d up in %.3f s", port, time.monotonic() - began)
    return keeper


def _serve(port: int, epoch: int, ready_fd: int) -> None:
    code = 0
    try:
        _become_child()
        from torch.distributed import TCPStore  # noqa: PLC0415 - the agent imported it

        store = TCPStore(
            "127.0.0.1", port, None, True, timeout=STORE_TIMEOUT, wait_for_workers=False
        )
        store.set(EPOCH_KEY, str(epoch))
        signal.signal(signal.SIGUSR1, lambda *_: store.set(SETTLED_KEY, str(epoch)))
        os.write(ready_fd, b"1")
        os.close(ready_fd)
        while store is not None:
            signal.pause()
    except BaseException as exc:  # the agent logs that it did not come up
        print(f"rtj: agent: rendezvous store at port {port}: {exc}", file=sys.stderr)
        code = 1
    finally:
        os._exit(code)


def served_epoch(addr: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> int | None:
    """The membership epoch of the store answering at ``addr:port``; None when nothing listens
    there or the store does not say (one a worker hosts)."""
    if not _listening(addr, port, timeout_s):
        return None
    return _asked_epoch(addr, port, timeout_s)


def _listening(addr: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether anything accepts connections at ``addr:port`` (no store client needed)."""
    try:
        with socket.create_connection((addr, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _asked_epoch(addr: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> int | None:
    """The epoch the store at ``addr:port`` says; None when it says none. A forked child asks,
    as the keeper serves: a store client's threads must not be in the process that forks the
    workers."""
    pid, said = _fork_child(
        lambda answer_fd: _probe(addr, port, timeout_s, answer_fd), timeout_s + 1.0
    )
    _end_child(pid)
    answer = said.decode(errors="replace")
    return int(answer) if answer.isdigit() else None


def _end_child(pid: int) -> None:
    """SIGKILL a forked helper (a keeper, a probe) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _fork_child(child: Callable[[int], None], wait_s: float) -> tuple[int, bytes]:
    """Fork a child that runs ``child(answer_fd)`` and never returns; its pid and what it wrote
    to the pipe within ``wait_s`` (empty when nothing)."""
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child never returns from here
        os.close(read_fd)
        child(write_fd)
    os.close(write_fd)
    try:
        readable, _, _ = select.select([read_fd], [], [], wait_s)
        return pid, os.read(read_fd, 32) if readable else b""
    finally:
        os.close(read_fd)


def meet_gang_store(chosen: Membership, limit_s: float, keep_waiting: Callable[[], bool]) -> None:
    """Before a pod's workers form ``chosen``'s group (started, or asked to switch or rejoin in
    process): node rank 0's agent may not have read it yet, so wait until the store at the
    rendezvous is no longer the old gang's, whose keys would send them to dead ranks."""
    if chosen.node_rank != 0:
        wait_until_current(
            chosen.epoch, chosen.master_addr, chosen.master_port, limit_s, keep_waiting
        )


def wait_until_current(
    epoch: int, addr: str, port: int, limit_s: float, keep_waiting: Callable[[], bool]
) -> int | None:
    """Wait while the store at ``addr:port`` is an older membership's (node rank 0 has not
    read the new one yet), up to ``limit_s`` or until ``keep_waiting`` says no; the epoch last
    seen there (None: no store, or one that does not say).

    Nothing listening is no reason to wait at a gang's first start. Once an older store has
    answered, though, silence is node rank 0 between stopping that store and starting the new
    one at the same port, and the wait goes on until a store answers again."""
    began = time.monotonic()
    older_seen = False
    while True:
        listening = _listening(addr, port)
        if listening:  # go on unless an older gang's store answers
            seen = _asked_epoch(addr, port)
            current = seen is None or seen >= epoch
        else:  # go on unless an older store answered before: node rank 0 is swapping them
            seen, current = None, not older_seen
        if current:
            if older_seen:
                log.warning(
                    "agent: the store of epoch %d answered after %.2f s", epoch, _since(began)
                )
            return seen
        if _since(began) >= limit_s or not keep_waiting():
            log.warning(
                "agent: the store at %s:%d %s after %.0f s; starting the workers of epoch %d "
                "anyway",
                addr,
                port,
                f"still serves epoch {seen}" if listening else "is still silent",
                _since(began),
                epoch,
            )
            return seen
        if not older_seen:
            log.warning(
                "agent: the store at %s:%d serves epoch %d; waiting for %d", addr, port, seen, epoch
            )
            older_seen = True
        time.sleep(0.05)


def _since(began: float) -> float:
    return time.monotonic() - began


def _probe(addr: str, port: int, timeout_s: float, answer_fd: int) -> None:
    try:
        _become_child()
        from torch.distributed import TCPStore  # noqa: PLC0415 - the agent imported it

        store = TCPStore(addr, port, None, False, timeout=datetime.timedelta(seconds=timeout_s))
        if store.check([EPOCH_KEY]):
            os.write(answer_fd, store.get(EPOCH_KEY))
    except BaseException:  # noqa: S110 - no answer is the answer: the agent goes on
        pass
    finally:
        os._exit(0)


def _become_child() -> None:
    """A forked helper keeps none of the agent's signal handlers and dies with it."""
    for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)
    _die_with_parent()


def _die_with_parent() -> None:
    """Linux: a forked helper (keeper, probe) gets SIGKILL when the agent dies, even by
    SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
