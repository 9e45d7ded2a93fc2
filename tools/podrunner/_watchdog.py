"""Kills every container's processes once the agent is gone, however it went.

The agent feeds this process ``+<pgid> <token>`` / ``-<pgid>`` lines on a pipe whose only writer
is the agent. When the agent dies (SIGKILL included: that is how the tests simulate losing a
node) the kernel closes the pipe, this process reads EOF and SIGKILLs every group still listed,
which takes the training processes' own children with them, and then every process that still
carries a listed container's token in its environment (``CONTAINER_TOKEN``): children that left
the group for a session of their own, as torchrun's workers do (``start_new_session``), and that
a container's cgroup would still hold. ``PR_SET_PDEATHSIG`` alone would reach only the direct
child of the agent, and only while the thread that forked it lives.

Why an environment token and not cgroups: creating cgroups needs privileges this runner does not
have; the environment is inherited by every descendant that does not clear it, and torchrun,
multiprocessing and DataLoader workers all pass it on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterable

CONTAINER_TOKEN = "RTJ_PODRUNNER_CONTAINER"  # noqa: S105 - a variable name
"""Environment variable the pod runner puts in every container process: a token unique to it."""


def processes_with_token(token: str) -> list[int]:
    """Pids (other than this process) whose environment has ``CONTAINER_TOKEN=<token>``."""
    wanted = f"{CONTAINER_TOKEN}={token}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:  # gone, a zombie, or not ours
            continue
        if wanted in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def kill_tokens(tokens: Iterable[str], rounds: int = 5) -> None:
    """SIGKILL every process carrying one of ``tokens``, again until none is left (a process may
    fork between the scan and the kill); at most ``rounds`` scans."""
    tokens = [t for t in tokens if t]
    for _ in range(rounds):
        pids = {pid for token in tokens for pid in processes_with_token(token)}
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def main() -> int:
    """Track containers until EOF, then kill them all."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # outlive a Ctrl-C aimed at the agent
    containers: dict[int, str] = {}
    for raw in sys.stdin:
        head, _, token = raw.strip().partition(" ")
        if head[:1] == "+" and head[1:].isdigit():
            containers[int(head[1:])] = token
        elif head[:1] == "-" and head[1:].isdigit():
            containers.pop(int(head[1:]), None)
    for pgid in containers:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    kill_tokens(containers.values())
    return 0


if __name__ == "__main__":
    sys.exit(main())
