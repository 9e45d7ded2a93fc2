"""DataLoader workers that die with the process group must not abort the emergency save.

``kill -- -PGID``, Slurm, an init that forwards signals and a node shutdown send SIGTERM to the
trainer *and* its DataLoader worker processes at once. torch's workers exit on it, and torch's
SIGCHLD handler in the trainer then raises ``RuntimeError: DataLoader worker (pid N) is killed
by signal: Terminated`` at whatever line the training thread is running, before the loop
reaches the step boundary where the emergency save happens.

Once SIGTERM has been seen, that error is expected: the trainer is shutting down too. The
runtime's SIGTERM handler (which Python runs before the SIGCHLD handler when both are pending)
wraps whatever SIGCHLD handler is installed so that worker deaths during the shutdown are
logged instead of raised. Batches the workers already produced (``prefetch_factor`` per worker)
carry the loop to its next ``batch_end()``, which saves and exits with 143. A loop that is
starved of data at that moment still fails when it asks a dead worker for its next batch; make
the workers outlive the trainer then with ``worker_init_fn=ignore_sigterm_in_worker``.

Patching torch's worker loop to ignore SIGTERM was rejected: it is private, and the user's
DataLoader is built before the manager exists.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)


def ignore_sigterm_in_worker(worker_id: int) -> None:
    """A ``DataLoader(worker_init_fn=...)`` that makes workers ignore SIGTERM.

    Workers still end when the trainer stops them or exits (torch watches the parent).
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class _ShutdownSigchld:
    """A SIGCHLD handler that calls the previous one and logs, not raises, its errors."""

    def __init__(self, previous: Callable[[int, FrameType | None], Any] | int | None) -> None:
        self.previous = previous
        self.swallowed = 0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if not callable(self.previous):
            return
        try:
            self.previous(signum, frame)
        except RuntimeError as exc:  # torch: "DataLoader worker (pid N) is killed by signal"
            self.swallowed += 1
            if self.swallowed == 1:
                log.warning("during shutdown: %s (expected; the emergency save goes on)", exc)


def tolerate_worker_deaths() -> None:
    """Called from the SIGTERM handler (main thread): wrap the current SIGCHLD handler once."""
    if not hasattr(signal, "SIGCHLD"):
        return
    current = signal.getsignal(signal.SIGCHLD)
    if isinstance(current, _ShutdownSigchld):
        return
    signal.signal(signal.SIGCHLD, _ShutdownSigchld(current))
