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

    ``stack`` holds the frames it was raised through, so that their locals can be freed before
    the process ends (``release_frames``).
    """

    def __init__(self, code: int, stack: list[FrameType]) -> None:
        super().__init__(code)
        self.stack = stack

    def release_frames(self) -> None:
        """Free what the recorded frames still hold (a DataLoader iterator holds worker
        processes that the exit would otherwise wait for, forever: they ignore SIGTERM)."""
        for frame in self.stack:
            with contextlib.suppress(RuntimeError):  # a frame still running keeps its locals
                frame.clear()
        self.stack = []


_RETURN_OPS = frozenset(
    dis.opmap[name] for name in ("RETURN_VALUE", "RETURN_CONST") if name in dis.opmap
)


class ProgramEndWatch:
    """Sees which exception, if any, leaves the outermost frame of the main thread.

    That exception is the one the interpreter ends the program with. The watch traces that one
    frame (``frame.f_trace``, the mechanism ``pdb`` uses to follow frames already running):
    each ``exception`` event records the exception passing through it, and its ``return``
    event tells a normal return (the frame stopped at a return instruction) from an unwind.
    New frames are not traced (the global trace function returns ``None``), so the code that
    still runs after the emergency exit (``finally`` blocks, ``except`` blocks that log)
    pays one call per Python frame at most.

    Installed only when no other tracer is (a debugger, coverage on ``sys.settrace``): the
    watch would replace it. Without a watch the exit is the ordinary one.
    (Rejected: reading the instruction each frame stopped at, the previous way. It has to
    know every way to re-raise (a bare ``raise`` is ``RAISE_VARARGS 0`` on 3.11, ``RERAISE``
    elsewhere; a re-raise from a nested function leaves the catching frame at a call), and
    it cannot tell the code of a new ``SystemExit`` raised from the caught one.)
    """

    def __init__(self, outermost: FrameType) -> None:
        self.outermost = outermost
        self.passing: BaseException | None = None
        self.left_by: BaseException | None = None
        self.installed = False

    def install(self) -> bool:
        if sys.gettrace() is not None:
            return False
        self.outermost.f_trace_lines = False
        self.outermost.f_trace = self._trace
        sys.settrace(_trace_no_new_frames)
        self.installed = True
        return True

    def uninstall(self) -> None:
        if self.installed and sys.gettrace() is _trace_no_new_frames:
            sys.settrace(None)
        self.installed = False

    def _trace(self, frame: FrameType, event: str, arg: object) -> object:
        if event == "exception" and isinstance(arg, tuple):
            self.passing = arg[1]
        elif event == "return":
            returned = frame.f_code.co_code[frame.f_lasti] in _RETURN_OPS
            self.left_by = None if returned else self.passing
        return self._trace

    def exit_code(self, emergency: EmergencyExit) -> int | None:
        """The code the program ends with when the emergency exit ended it, else ``None``.

        It ended it when the exception that left the outermost frame is the emergency exit, or
        a ``SystemExit`` raised while handling it (``raise SystemExit(1) from exc``,
        ``sys.exit(5)`` in a ``finally``): that one's code counts.
        """
        ending = self.left_by
        if not isinstance(ending, SystemExit) or not _raised_while_handling(ending, emergency):
            return None
        if ending.code is None:
            return 0
        return ending.code if isinstance(ending.code, int) else None


def _trace_no_new_frames(frame: FrameType, event: str, arg: object) -> None:
    return None


def _raised_while_handling(exc: BaseException, emergency: EmergencyExit) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if current is emergency:
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def raise_emergency_exit(exit_code: int) -> NoReturn:
    """Raise ``SystemExit(exit_code)``, and end the process without tearing down its heap once
    that exit has run every ``finally`` block and ``atexit`` handler.

    Interpreter shutdown after the emergency save is mostly tearing down the heap: freeing the
    few hundred thousand objects torch and the trainer hold, by the cyclic collector while
    modules are cleared (about 1.2 s for a bare ``import torch`` and 1.8 s for a small trainer
    on a quiet 2-core VM; 7-10 s on a loaded one, past the deadline). Nothing in that teardown
    matters to a process whose checkpoint is committed and whose logs are flushed, so an
    ``atexit`` handler, registered now and therefore run first, runs every other handler
    itself and then ends the process with ``os._exit``.

    It does so only when this exception really ended the program: raised on the main thread,
    and it (or a ``SystemExit`` raised while handling it) left the outermost frame
    (``ProgramEndWatch``). So the common ``except SystemExit: log(...); raise``, a re-raise
    from a nested function and ``raise SystemExit(code) from exc`` all end fast, with the code
    the program ends with. A harness that caught it and went on (pytest, a notebook) exits
    later with its own code through the ordinary shutdown.
    (Rejected: ``gc.freeze()`` before the exit: it skips the teardown too, but extension
    modules that check for leaked objects at shutdown then print warnings into the job's log;
    reading the exception's traceback: CPython 3.11 attaches it only as far as the last
    ``except``/``finally``/``with`` it passed.)
    """
    stack = []
    frame = sys._getframe(1)
    while frame is not None:
        stack.append(frame)
        frame = frame.f_back
    exc = EmergencyExit(exit_code, stack)
    if threading.current_thread() is threading.main_thread():
        watch = ProgramEndWatch(stack[-1])
        if watch.install():
            atexit.register(_end_without_teardown, exc, watch)
    raise exc


def _end_without_teardown(exc: EmergencyExit, watch: ProgramEndWatch) -> None:
    atexit.unregister(_end_without_teardown)
    watch.uninstall()
    code = watch.exit_code(exc)
    exc.release_frames()
    run_others = getattr(atexit, "_run_exitfuncs", None)
    if run_others is None or code is None:
        return  # the ordinary shutdown: slower, still correct
    run_others()  # this handler ran first, so every other one runs exactly once
    exit_now(code)


def _flush_output() -> None:
    handlers = [*logging.getLogger().handlers, *log.handlers]
    for flushable in [*handlers, sys.stdout, sys.stderr]:
        with contextlib.suppress(Exception):  # best effort just before _exit
            flushable.flush()
