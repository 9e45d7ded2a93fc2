"""Noticing that the node is about to go: SIGTERM, and the operator's notice file.

The SIGTERM handler only sets a flag; the save happens at the next step boundary, on every rank
at the same step (heavy I/O inside a signal handler can deadlock, and a save needs all ranks).
The notice file (a downward-API projection of a pod annotation) is checked with a stat at most
once per ``check_interval_s``, so the per-step cost is a clock read.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from ..workers import keep_workers_through_sigterm, tolerate_worker_deaths

log = logging.getLogger(__name__)

DEFAULT_EXIT_CODE = 143
"""128 + SIGTERM: what a process killed by SIGTERM reports, so supervisors read it the same."""


class PreemptionWatcher:
    def __init__(
        self,
        *,
        notice_file: str | None,
        handle_sigterm: bool = True,
        check_interval_s: float = 1.0,
    ) -> None:
        self.notice_file = notice_file
        self.check_interval_s = check_interval_s
        self.sigterm_at: float | None = None
        self.on_sigterm: Callable[[float], object] | None = None
        """Called in the handler with the signal's time (``ExitWatchdog.start_clock``); it
        must be safe there: no lock, no logging."""
        self.notices_seen = 0
        self.last_notice: str | None = None
        self._next_check = 0.0
        self._file_sig: tuple[int, int, int] | None = None
        self._previous_handler: object = None
        if handle_sigterm:
            if threading.current_thread() is threading.main_thread():
                self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
                keep_workers_through_sigterm()
            else:
                log.warning("CheckpointManager built off the main thread: SIGTERM not handled")

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self.sigterm_at is None:
            self.sigterm_at = time.monotonic()
            if self.on_sigterm is not None:
                self.on_sigterm(self.sigterm_at)  # the exit deadline runs from now
            # DataLoader workers in our process group got the same signal; their deaths
            # must not raise before the step boundary where the emergency save runs.
            tolerate_worker_deaths()

    @property
    def terminating(self) -> bool:
        return self.sigterm_at is not None

    def poll_notice(self) -> int:
        """How many distinct non-empty notices have appeared so far (cheap between checks)."""
        if not self.notice_file:
            return self.notices_seen
        now = time.monotonic()
        if now < self._next_check:
            return self.notices_seen
        self._next_check = now + self.check_interval_s
        try:
            st = os.stat(self.notice_file)
        except OSError:
            return self.notices_seen
        sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        if sig == self._file_sig:
            return self.notices_seen
        self._file_sig = sig
        try:
            with open(self.notice_file, encoding="utf-8", errors="replace") as f:
                content = f.read().strip()
        except OSError:
            return self.notices_seen
        if content and content != self.last_notice:
            self.notices_seen += 1
            self.last_notice = content
            log.warning("preemption notice received: %s", content)
        return self.notices_seen

    def close(self) -> None:
        if self._previous_handler is not None and (
            threading.current_thread() is threading.main_thread()
        ):
            signal.signal(signal.SIGTERM, self._previous_handler)  # type: ignore[arg-type]
            self._previous_handler = None
