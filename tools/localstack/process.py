"""A child process of the stack with its own log file and session.

Every component the stack starts (the operator, each pod-runner agent) is one of these, so
stopping, signalling and reading the end of a log work the same way for all of them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .common import REPO


@dataclass
class Proc:
    """A child process in its own session (so a terminal's Ctrl-C reaches only us), with a log."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(
        cls,
        name: str,
        argv: list[str],
        log: Path,
        *,
        env: dict[str, str] | None = None,
        cwd: Path = REPO,
    ) -> Proc:
        """Start ``argv`` with stdout and stderr appended to ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            popen = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
            )
        return cls(name, popen, log)

    @property
    def pid(self) -> int:
        """The process id."""
        return self.popen.pid

    def alive(self) -> bool:
        """Whether it still runs."""
        return self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        """The end of its log."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def signal(self, signum: int) -> None:
        """Send a signal to the process (not its group: an agent stops its pods itself)."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signum)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL of its whole process group after ``timeout``."""
        if self.alive():
            self.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)
