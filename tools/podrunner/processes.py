"""Container processes: started in their own session, tied to the agent's life, stopped in order.

Each container runs as the leader of a new session (so its process group holds everything it
starts, the way a container's cgroup does) with ``PR_SET_PDEATHSIG=SIGKILL``, and its group is
registered with the watchdog process (``_watchdog``), which SIGKILLs every registered group when
the agent dies. Together they make "SIGKILL the agent" behave like a node losing power: nothing
the pods started survives it.

A process group is not a cgroup: a child may start a session of its own (torchrun starts each
worker with ``start_new_session``) and leave the group. Every container process therefore also
carries a token in its environment (``CONTAINER_TOKEN``), inherited by its descendants; every
SIGKILL of a container (its main process ended, the grace period ran out, the agent died) also
reaches the processes carrying its token, as the teardown of a container's cgroup would.
A SIGTERM goes to the group only: a container runtime signals the container's first process,
and it is up to that process (torchrun) to pass the signal on to its workers.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from ._watchdog import CONTAINER_TOKEN, kill_tokens

log = logging.getLogger("podrunner")

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:  # pragma: no cover (runs in the forked child)
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Watchdog:
    """The agent's side of the watchdog pipe (thread-safe)."""

    def __init__(self, package_root: Path) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(package_root), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tools.podrunner._watchdog"],
            stdin=subprocess.PIPE,
            env=env,
            cwd=str(package_root),
            start_new_session=True,
        )
        self._lock = threading.Lock()

    def _send(self, line: str) -> None:
        with self._lock:
            stdin = self._proc.stdin
            if stdin is None or stdin.closed:
                return
            try:
                stdin.write(line.encode() + b"\n")
                stdin.flush()
            except OSError as err:
                log.error("watchdog pipe broken (%s): children may outlive a crash", err)

    def add(self, pgid: int, token: str = "") -> None:
        """Kill this group, and the processes carrying ``token``, when the agent dies."""
        self._send(f"+{pgid} {token}".rstrip())

    def remove(self, pgid: int) -> None:
        """The group has ended; forget it."""
        self._send(f"-{pgid}")

    def close(self) -> None:
        """Let the watchdog exit (it kills whatever is still registered)."""
        with self._lock:
            if self._proc.stdin and not self._proc.stdin.closed:
                self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()


@dataclass
class Exit:
    """How a container process ended."""

    exit_code: int
    signal: int | None

    @classmethod
    def from_returncode(cls, code: int) -> Exit:
        """Popen's negative return code for a signal becomes 128+signal, as a runtime reports."""
        if code < 0:
            return cls(128 - code, -code)
        return cls(code, None)


class ContainerProcess:
    """One running container command.

    Must be started and waited for by the same long-lived thread: the kernel sends the
    parent-death signal when the *thread* that forked the child exits.
    """

    def __init__(
        self, argv: list[str], env: dict[str, str], cwd: str, log_path: Path, watchdog: Watchdog
    ) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._watchdog = watchdog
        self.token = uuid.uuid4().hex
        with open(log_path, "ab") as out:
            self.proc = subprocess.Popen(
                argv,
                env={**env, CONTAINER_TOKEN: self.token},
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # Only a prctl runs between fork and exec: no lock a thread could hold.
                preexec_fn=_die_with_parent,  # noqa: PLW1509
            )
        self.pid = self.proc.pid
        watchdog.add(self.pid, self.token)
        self.exit: Exit | None = None

    def poll(self) -> Exit | None:
        """The exit once the process has ended (its leftover group members are killed then)."""
        if self.exit is not None:
            return self.exit
        code = self.proc.poll()
        if code is None:
            return None
        self._reap_group()
        self.exit = Exit.from_returncode(code)
        return self.exit

    def _reap_group(self) -> None:
        # Like a container's cgroup being torn down: nothing outlives the main process.
        self.kill()
        self._watchdog.remove(self.pid)

    def kill(self) -> None:
        """SIGKILL the group and every process carrying this container's token."""
        signal_group(self.pid, signal.SIGKILL)
        kill_tokens([self.token])


def signal_group(pgid: int, sig: int) -> None:
    """Signal a process group, ignoring one that has already ended."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    except PermissionError as err:  # pragma: no cover
        log.warning("cannot signal group %d: %s", pgid, err)


def stop_all(procs: list[ContainerProcess], grace_s: float) -> None:
    """SIGTERM every group at once, wait up to ``grace_s`` for all, then SIGKILL the rest."""
    running = [p for p in procs if p.poll() is None]
    for proc in running:
        signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + max(grace_s, 0.0)
    while running and time.monotonic() < deadline:
        running = [p for p in running if p.poll() is None]
        if running:
            time.sleep(0.05)
    for proc in running:
        proc.kill()
    for proc in running:
        proc.proc.wait()
        proc.poll()
