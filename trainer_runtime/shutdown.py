"""The emergency path after SIGTERM has to end inside the grace period, whatever hangs.

Kubernetes (and Slurm, and systemd) SIGKILL a process ``grace`` seconds after SIGTERM. What
the runtime does in between (the emergency save, then flushing uploads) must finish before
that, with a margin for the process's own exit, or the kill lands in the middle and the log
blames the wrong thing. So the emergency path works against one deadline:

    exit_by = SIGTERM time + grace period - margin,  margin = clamp(10% of grace, 2 s, 10 s)

The save runs first (it is what the next attempt resumes from); uploads then get whatever is
left, minus one second to close down. A watchdog thread ends the process with the preemption
exit code at ``exit_by`` if the runtime's part is still busy then (a save on a stuck disk). When
a transfer thread is still stuck after the flush (a socket read to a store that stopped
answering), the process ends with ``os._exit`` instead of ``SystemExit``: interpreter shutdown
would wait for that thread (``concurrent.futures`` joins its workers at exit). Local
checkpoints are already committed (fsynced) by then, so ending the process loses nothing; the
next attempt re-uploads what the store lacks. (Relying on the store client's timeouts instead
was rejected: boto3's read timeout times its retries can exceed any grace period.) Otherwise
the path raises ``EmergencyExit`` (a ``SystemExit``), and once that has run the program's
``finally`` blocks and ``atexit`` handlers, the process ends without the interpreter's heap
teardown, which alone could outlast the margin (``raise_emergency_exit``).
"""

from __future__ import annotations

import atexit
import contextlib
import dis
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import NoReturn

log = logging.getLogger(__name__)

MARGIN_FRACTION = 0.1
MARGIN_MIN_S = 2.0
MARGIN_MAX_S = 10.0
CLOSE_RESERVE_S = 1.0
"""Seconds kept back from the upload flush for stopping threads and logging."""


def exit_margin(grace_period_s: float) -> float:
    return min(MARGIN_MAX_S, max(MARGIN_MIN_S, MARGIN_FRACTION * grace_period_s))


@dataclass(frozen=True)
class ShutdownDeadline:
    """When the process must be gone, counted from the signal (``time.monotonic`` clock)."""

    signalled_at: float
    grace_period_s: float

    @property
    def margin_s(self) -> float:
        return exit_margin(self.grace_period_s)

    @property
    def exit_by(self) -> float:
        return self.signalled_at + max(0.0, self.grace_period_s - self.margin_s)

    def left(self) -> float:
        """Seconds until ``exit_by`` (never negative)."""
        return max(0.0, self.exit_by - time.monotonic())

    def upload_budget(self) -> float:
        """How long uploads may still be flushed."""
        return max(0.0, self.left() - CLOSE_RESERVE_S)

    def since_signal(self) -> float:
        return time.monotonic() - self.signalled_at


class ExitWatchdog:
    """Ends the process with ``exit_code`` at the deadline of a SIGTERM, unless cancelled first.

    Built with the manager, idle on a pipe. The SIGTERM handler starts the clock
    (``start_clock``: one ``os.write``, no lock, safe in a signal handler), so a step that
    outlasts the grace period still ends the process by the deadline, with the preemption exit
    code rather than the kubelet's SIGKILL; a step boundary reached in time runs the emergency
    path instead, and that path cancels the watchdog when it hands over to an ordinary
    ``SystemExit``. A process that catches that ``SystemExit`` (a test harness) is therefore
    never killed later. ``close()`` ends an idle watchdog; a running clock keeps running.
    """

    def __init__(self, grace_period_s: float, exit_code: int) -> None:
        self.grace_period_s = grace_period_s
        self.exit_code = exit_code
        self.deadline: ShutdownDeadline | None = None
        self._cancelled = threading.Event()
        self._wake_read, self._wake_write = os.pipe()
        self._thread = threading.Thread(target=self._watch, name="rtj-exit-deadline", daemon=True)
        self._thread.start()

    def start_clock(self, signalled_at: float) -> ShutdownDeadline:
        """The deadline of the signal received at ``signalled_at`` (the first one counts)."""
        if self.deadline is None:
            self.deadline = ShutdownDeadline(signalled_at, self.grace_period_s)
            self._wake()
        return self.deadline

    def _wake(self) -> None:
        if self._wake_write >= 0:
            with contextlib.suppress(OSError):  # the watchdog has ended already
                os.write(self._wake_write, b"x")

    def _watch(self) -> None:
        try:
            os.read(self._wake_read, 1)
        finally:
            os.close(self._wake_read)
        deadline = self.deadline
        if deadline is None or self._cancelled.wait(deadline.left()):
            return
        log.error(
            "still busy %.1fs after SIGTERM (grace period %.0fs): exiting now with %d; "
            "uploads not finished are resumed by the next attempt",
            deadline.since_signal(),
            deadline.grace_period_s,
            self.exit_code,
        )
        exit_now(self.exit_code)

    def cancel(self) -> None:
        self._cancelled.set()
        self._wake()

    def close(self) -> None:
        """End the watchdog if no signal started its clock (the manager is closing)."""
        if self.deadline is not None:
            return
        self.cancel()
        self._thread.join()
        fd, self._wake_write = self._wake_write, -1
        os.close(fd)


def exit_now(exit_code: int) -> None:
    """Flush logs and end the process at once, without waiting for any thread.

    Used when a transfer thread is stuck on a store that does not answer: interpreter
    shutdown would wait for it (``concurrent.futures`` joins its workers at exit).
    """
    _flush_output()
    os._exit(exit_code)


class EmergencyExit(SystemExit):
    """The ``SystemExit`` the emergency path raises: ``code`` is the preemption exit code.

    ``stack`` is where it was raised from: each calling frame and the instruction it was at,
    so that the exit can tell later whether anything caught it (``propagated_to_the_top``).
    """

    def __init__(self, code: int, stack: list[tuple[FrameType, int]]) -> None:
        super().__init__(code)
        self.stack = stack

    def propagated_to_the_top(self) -> bool:
        """True when every frame it was raised through ended right there (or re-raised it at
        the end of a ``finally``/``with``, or with a bare ``raise``): nothing caught it and
        went on. A frame that caught it and carried on ended at another instruction."""
        return all(
            frame.f_lasti == at or frame.f_code.co_code[frame.f_lasti] == _RERAISE
            for frame, at in self.stack
        )

    def release_frames(self) -> None:
        """Free what the recorded frames still hold (a DataLoader iterator holds worker
        processes that the exit would otherwise wait for, forever: they ignore SIGTERM)."""
        for frame, _ in self.stack:
            with contextlib.suppress(RuntimeError):  # a frame still running keeps its locals
                frame.clear()
        self.stack = []


_RERAISE = dis.opmap.get("RERAISE", -1)


def raise_emergency_exit(exit_code: int) -> NoReturn:
    """Raise ``SystemExit(exit_code)``, and end the process without tearing down its heap once
    that exit has run every ``finally`` block and ``atexit`` handler.

    Interpreter shutdown after the emergency save is mostly tearing down the heap: freeing the
    few hundred thousand objects torch and the trainer hold, by the cyclic collector while
    modules are cleared (about 1.2 s for a bare ``import torch`` and 1.8 s for a small trainer
    on a quiet 2-core VM; 7-10 s on a loaded one, past the deadline). Nothing in that teardown
    matters to a process whose checkpoint is committed and whose logs are flushed, so an
    ``atexit`` handler, registered now and therefore run first, runs every other handler
    itself and then ends the process with ``os._exit(exit_code)``.

    It does so only when this exception really ended the program: raised on the main thread,
    and nothing caught it (``EmergencyExit.propagated_to_the_top``). A harness that caught it
    (pytest, a notebook) exits later with its own code through the ordinary shutdown.
    (Rejected: ``gc.freeze()`` before the exit: it skips the teardown too, but extension
    modules that check for leaked objects at shutdown then print warnings into the job's log;
    reading the exception's traceback: CPython 3.11 attaches it only as far as the last
    ``except``/``finally``/``with`` it passed.)
    """
    stack = []
    frame = sys._getframe(1)
    while frame is not None:
        stack.append((frame, frame.f_lasti))
        frame = frame.f_back
    exc = EmergencyExit(exit_code, stack)
    if threading.current_thread() is threading.main_thread():
        atexit.register(_end_without_teardown, exc)
    raise exc


def _end_without_teardown(exc: EmergencyExit) -> None:
    atexit.unregister(_end_without_teardown)
    uncaught = exc.propagated_to_the_top()
    exc.release_frames()
    run_others = getattr(atexit, "_run_exitfuncs", None)
    if run_others is None or not uncaught or not isinstance(exc.code, int):
        return  # the ordinary shutdown: slower, still correct
    run_others()  # this handler ran first, so every other one runs exactly once
    exit_now(exc.code)


def _flush_output() -> None:
    handlers = [*logging.getLogger().handlers, *log.handlers]
    for flushable in [*handlers, sys.stdout, sys.stderr]:
        with contextlib.suppress(Exception):  # best effort just before _exit
            flushable.flush()
