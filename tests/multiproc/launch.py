"""Start a gang of real training processes the way torchrun or the operator would."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tools.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


class Gang:
    def __init__(
        self,
        script: Path,
        args: list[str],
        world_size: int,
        log_dir: Path,
        env: dict[str, str] | None = None,
        *,
        own_process_group: bool = False,
    ) -> None:
        """``own_process_group``: every rank (and its DataLoader workers) joins one new process
        group, ``self.pgid``, like the processes torchrun starts inside one container."""
        port = free_port()
        self.log_dir = log_dir
        self.pgid: int | None = None
        self.procs: list[subprocess.Popen] = []
        log_dir.mkdir(parents=True, exist_ok=True)
        for rank in range(world_size):
            penv = {
                **os.environ,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
                # The runtime of this checkout, whether or not it is installed.
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
                ),
                # A rank that aborts (SIGABRT, SIGSEGV) leaves every thread's Python stack in
                # its log, which names the thread still running at exit.
                "PYTHONFAULTHANDLER": "1",
                **(env or {}),
            }
            out = open(log_dir / f"rank{rank}.log", "ab")  # noqa: SIM115 - owned by the child
            group = {}
            if own_process_group:
                group = {"process_group": self.pgid or 0}
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, str(script), *args],
                    env=penv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    **group,
                )
            )
            out.close()
            if own_process_group and self.pgid is None:
                self.pgid = self.procs[0].pid

    def log_tails(self, chars: int = 2500) -> str:
        """The end of every rank's log, each under a header with the rank's exit code."""
        parts = []
        for rank, p in enumerate(self.procs):
            path = self.log_dir / f"rank{rank}.log"
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            parts.append(f"--- rank {rank} (exit code {p.poll()}) ---\n{text[-chars:]}")
        return "\n".join(parts)

    def stacks_and_log_tails(self) -> str:
        """For a gang that hangs: SIGABRT every live rank and its children (DataLoader workers)
        first, so that their fault handler (``PYTHONFAULTHANDLER``, inherited by a fork) writes
        every thread's Python stack into the rank's log."""
        for p in self.procs:
            for pid in reversed(_descendants(p.pid)):  # children first: the rank reaps them
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGABRT)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.1)
        return self.log_tails(6000)

    def signal(self, sig: int, ranks: list[int] | None = None) -> None:
        for rank, p in enumerate(self.procs):
            if (ranks is None or rank in ranks) and p.poll() is None:
                p.send_signal(sig)

    def signal_group(self, sig: int) -> None:
        """Signal the whole process group: every rank and every DataLoader worker at once."""
        assert self.pgid is not None, "start the gang with own_process_group=True"
        os.killpg(self.pgid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.wait(30)

    def wait(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        return codes


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process under it, parents before children (from /proc)."""
    found = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                found += _descendants(int(child))
    return found
