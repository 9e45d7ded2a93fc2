"""Kills every container process group once the agent is gone, however it went.

The agent feeds this process ``+<pgid>`` / ``-<pgid>`` lines on a pipe whose only writer is the
agent. When the agent dies (SIGKILL included: that is how the tests simulate losing a node) the
kernel closes the pipe, this process reads EOF and SIGKILLs every group still listed, which takes
the training processes' own children with them. ``PR_SET_PDEATHSIG`` alone would reach only the
direct child of the agent, and only while the thread that forked it lives.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys


def main() -> int:
    """Track groups until EOF, then kill them all."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # outlive a Ctrl-C aimed at the agent
    groups: set[int] = set()
    for raw in sys.stdin:
        line = raw.strip()
        if line[:1] == "+" and line[1:].isdigit():
            groups.add(int(line[1:]))
        elif line[:1] == "-" and line[1:].isdigit():
            groups.discard(int(line[1:]))
    for pgid in groups:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
