"""Start a gang of real training processes the way torchrun or the operator would."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gang:
    def __init__(
        self,
        script: Path,
        args: list[str],
        world_size: int,
        log_dir: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        port = free_port()
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
                **(env or {}),
            }
            out = open(log_dir / f"rank{rank}.log", "ab")  # noqa: SIM115 - owned by the child
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, str(script), *args],
                    env=penv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
            out.close()

    def signal(self, sig: int, ranks: list[int] | None = None) -> None:
        for rank, p in enumerate(self.procs):
            if (ranks is None or rank in ranks) and p.poll() is None:
                p.send_signal(sig)

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
