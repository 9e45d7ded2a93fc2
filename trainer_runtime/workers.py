"""DataLoader workers must outlive a SIGTERM sent to every process, so the emergency save runs.

``kill -- -PGID``, Slurm, systemd and a node shutdown send SIGTERM to the trainer *and* its
DataLoader worker processes at once. torch's workers exit on a SIGTERM that does not come from
their parent. The trainer then cannot get its next batch (even batches already prefetched are
lost: their tensors are handed over through the dead worker's file-descriptor sharer), torch
raises ``RuntimeError: DataLoader worker (pid N) is killed by signal: Terminated`` from its
SIGCHLD handler at whatever line is running, and the loop never reaches the step boundary where
the emergency save happens.

So, while a ``CheckpointManager`` handles SIGTERM, DataLoader workers ignore it: the runtime
wraps the hook torch's worker loop calls to set up its signal handlers
(``torch.utils.data._utils.signal_handling._set_worker_signal_handlers``, looked up at call
time) so that SIGTERM is ignored right after. Workers started by ``fork`` (the Linux default up
to Python 3.13) inherit the wrapper. They still end normally: the trainer stops them when
their iterator ends or the process exits, and torch's watchdog ends them when the trainer dies.
With ``spawn``/``forkserver`` workers pass ``worker_init_fn=ignore_sigterm_in_worker``.

As a second line, the runtime's SIGTERM handler (which Python runs before the SIGCHLD handler
when both are pending) wraps whatever SIGCHLD handler is installed, so a worker death during
the shutdown is logged instead of raised mid-step.

Rejected: moving workers into their own process group (systemd and Slurm signal each process,
not the group), and saving from inside the failed fetch (the ranks of a DDP gang are then
stuck in different collectives).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)
_WRAPPED = "_rtj_ignores_sigterm"


def ignore_sigterm_in_worker(worker_id: int) -> None:
    """A ``DataLoader(worker_init_fn=...)`` that makes workers ignore SIGTERM.

    Workers still end when the trainer stops them or exits (torch watches the parent).
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def keep_workers_through_sigterm() -> bool:
    """Make DataLoader workers forked from now on ignore SIGTERM; False when this torch has
    no such hook (then use ``ignore_sigterm_in_worker``). Idempotent."""
    try:
        from torch.utils.data._utils import signal_handling  # noqa: PLC0415
    except ImportError:
        return False
    original = getattr(signal_handling, "_set_worker_signal_handlers", None)
    if original is None:
        return False
    if getattr(original, _WRAPPED, False):
        return True

    def set_worker_signal_handlers(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        ignore_sigterm_in_worker(-1)
        return result

    setattr(set_worker_signal_handlers, _WRAPPED, True)
    signal_handling._set_worker_signal_handlers = set_worker_signal_handlers
    return True


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
                log.warning("during shutdown: %s (the emergency save goes on)", exc)


def tolerate_worker_deaths() -> None:
    """Called from the SIGTERM handler (main thread): wrap the current SIGCHLD handler once."""
    if not hasattr(signal, "SIGCHLD"):
        return
    current = signal.getsignal(signal.SIGCHLD)
    if isinstance(current, _ShutdownSigchld):
        return
    signal.signal(signal.SIGCHLD, _ShutdownSigchld(current))
