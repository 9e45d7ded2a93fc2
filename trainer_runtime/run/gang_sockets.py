"""The old gang's TCP connections, shut down so that no rank waits on a lost one.

A rank lost without notice leaves its peers in a collective: those that talk to it directly fail
at once when its process dies ("Connection reset by peer"), but the others wait on *them*, and
gloo gives up only at the process group's timeout (30 minutes by default). A node that is cut
off rather than gone fails nobody. Destroying the group does not help: the script's
``DistributedDataParallel`` and the exception's frames keep it alive, and gloo has no abort.

So, at a rejoin (``run/rejoin.py``), a rank shuts down the sockets its old gang's groups use:
every peer blocked on it then fails at once, shuts down its own, and the failure reaches every
survivor within milliseconds, wherever the lost rank was.

Which sockets: those the process opened after ``trainer_runtime`` was imported and before its
``CheckpointManager`` was built (the script's ``init_process_group``), and those each group the
runtime forms opens (its coordination groups, a switch's new group), each taken as the difference
of two readings of ``/proc/self/fd``. Left alone: the rendezvous store's connections (the new
gang meets there), listening sockets, and anything that is not TCP. A script's own TCP
connections opened between the import and the manager (a metrics client, say) are shut down
too: open them after building the manager (docs/survivors.md). (Rejected: ``abort()`` on the
group: gloo's does not close its connections, measured. NCCL's transport is not reached by this;
its abort is not wired in, docs/survivors.md.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
from collections.abc import Iterable, Iterator

log = logging.getLogger("trainer_runtime")

_FD_DIR = "/proc/self/fd"


def socket_inodes() -> dict[int, int]:
    """This process's open sockets: inode -> a file descriptor of it ({} where /proc is
    missing)."""
    found: dict[int, int] = {}
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return found
    for name in names:
        with contextlib.suppress(OSError, ValueError):
            st = os.stat(f"{_FD_DIR}/{name}")
            if stat.S_ISSOCK(st.st_mode):
                found.setdefault(st.st_ino, int(name))
    return found


AT_IMPORT = frozenset(socket_inodes())
"""The sockets the process had when the runtime was imported (before the script's group); in
a worker forked from the agent, those it inherited (``from_fork``)."""


def from_fork() -> None:
    """A worker forked from the agent: the sockets it inherited are the agent's, not its
    gang's."""
    global AT_IMPORT  # noqa: PLW0603 - the one reading of the process's start
    AT_IMPORT = frozenset(socket_inodes())


class GangSockets:
    """The sockets of the gang's groups, collected as they are formed."""

    def __init__(self, inodes: Iterable[int] = ()) -> None:
        self.inodes: set[int] = set(inodes)

    @classmethod
    def since_import(cls) -> GangSockets:
        """The sockets opened since the runtime's import: the script's own group's."""
        return cls(set(socket_inodes()) - AT_IMPORT)  # read now: from_fork may have replaced it

    @contextlib.contextmanager
    def forming(self) -> Iterator[None]:
        """Add the sockets opened inside the ``with`` (a group being formed)."""
        before = set(socket_inodes())
        try:
            yield
        finally:
            self.inodes |= set(socket_inodes()) - before

    def cut(self, keep_port: int | None) -> int:
        """Shut down (both ways) every connected TCP socket of the gang still open, except
        those to or from ``keep_port`` (the rendezvous store); how many were shut down."""
        done = 0
        for inode, fd in socket_inodes().items():
            if inode in self.inodes and _shut_down(fd, keep_port):
                done += 1
        return done


def _shut_down(fd: int, keep_port: int | None) -> bool:
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return False
        try:
            peer, own = sock.getpeername(), sock.getsockname()
        except OSError:
            return False  # listening, or not connected
        if keep_port is not None and keep_port in (peer[1], own[1]):
            return False
        sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError as exc:
        log.debug("could not shut down socket %d: %s", fd, exc)
        return False
    finally:
        sock.close()  # the duplicate only; the group's descriptor stays (now shut down)
