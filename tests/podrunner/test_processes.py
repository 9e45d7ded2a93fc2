"""Container processes die with the agent, grandchildren included (no cluster needed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tools.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]

FAKE_AGENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tools.podrunner.processes import ContainerProcess, Watchdog

    out = Path(sys.argv[1])
    dog = Watchdog(Path(sys.argv[2]))
    script = f"sleep 300 & echo $! > {out}/grandchild; exec sleep 300"
    proc = ContainerProcess(["sh", "-c", script], {"PATH": "/usr/bin:/bin"}, str(out),
                            out / "log", dog)
    (out / "child").write_text(str(proc.pid))
    time.sleep(300)
    """
)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.multiproc
def test_sigkill_of_agent_kills_child_and_grandchild(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    agent = subprocess.Popen([sys.executable, "-c", FAKE_AGENT, str(tmp_path), str(ROOT)], env=env)
    try:
        wait_for(
            "the child and grandchild pid files",
            lambda: (tmp_path / "grandchild").exists() and (tmp_path / "child").exists(),
            30,
            interval=0.05,
        )
        time.sleep(0.1)
        child = int((tmp_path / "child").read_text())
        grandchild = int((tmp_path / "grandchild").read_text())
        assert alive(child) and alive(grandchild)
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        wait_for(
            "child and grandchild to die with the agent",
            lambda: not alive(child) and not alive(grandchild),
            10,
            interval=0.05,
            on_timeout=lambda: f"child alive={alive(child)} grandchild alive={alive(grandchild)}",
        )
    finally:
        if agent.poll() is None:
            agent.kill()
