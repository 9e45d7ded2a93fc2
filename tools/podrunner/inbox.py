"""What the agent's threads tell a pod worker: a newer pod, the pod gone, the node stopping.

The agent's watch threads learn about a pod's changes; only the pod's own worker thread may act
on them (it started the containers, and their parent-death signal follows that thread). This
box is the hand-over between the two: the watchers write under a lock and wake the worker, and
the worker reads one consistent snapshot at a time.

Rejected: a queue of every pod version. The worker only ever needs the newest one (labels,
annotations and the deletion are read from it whole); a backlog would replay stale versions.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from tools.kubeapi import Obj


class Snapshot(NamedTuple):
    """The pod as last seen, and what happened since the previous snapshot."""

    pod: Obj
    updated: bool
    """A newer version arrived since the last snapshot (labels, annotations, deletion)."""
    gone: bool
    """The pod object no longer exists (force-deleted, or PodGC)."""
    shutdown: bool
    """The node is shutting down gracefully."""


class PodInbox:
    """The newest pod object and the two one-way signals (gone, shutdown), thread-safe."""

    def __init__(self, pod: Obj) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pod = pod
        self._updated = False
        self._gone = False
        self._shutdown = False

    def update(self, pod: Obj) -> None:
        """A newer version of the pod (labels, annotations, deletionTimestamp)."""
        with self._lock:
            self._pod, self._updated = pod, True
        self._wake.set()

    def mark_gone(self) -> None:
        """The pod object no longer exists (force-deleted, or PodGC)."""
        with self._lock:
            self._gone = True
        self._wake.set()

    def mark_shutdown(self) -> None:
        """The node is shutting down gracefully."""
        with self._lock:
            self._shutdown = True
        self._wake.set()

    def snapshot(self) -> Snapshot:
        """The current state; clears ``updated``."""
        with self._lock:
            updated, self._updated = self._updated, False
            return Snapshot(self._pod, updated, self._gone, self._shutdown)

    def wait(self, timeout_s: float) -> None:
        """Sleep until something is posted or ``timeout_s`` passes."""
        self._wake.wait(timeout_s)
        self._wake.clear()
