"""Container processes die with the agent, grandchildren included (no cluster needed)."""

from __future__ import annotations

import contextlib
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
    # The second grandchild leaves the group in a session of its own, as torchrun's workers do.
    script = (
        f"sleep 300 & echo $! > {out}/grandchild; "
        f"setsid sleep 300 & echo $! > {out}/own_session; exec sleep 300"
    )
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
def test_sigkill_of_agent_kills_child_and_grandchildren(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    agent = subprocess.Popen([sys.executable, "-c", FAKE_AGENT, str(tmp_path), str(ROOT)], env=env)
    try:
        wait_for(
            "the child and grandchild pid files",
            lambda: all(
                (tmp_path / name).exists() for name in ("grandchild", "own_session", "child")
            ),
            30,
            interval=0.05,
        )
        time.sleep(0.1)
        child = int((tmp_path / "child").read_text())
        grandchild = int((tmp_path / "grandchild").read_text())
        own_session = int((tmp_path / "own_session").read_text())
        assert os.getsid(own_session) == own_session != os.getsid(child)
        assert alive(child) and alive(grandchild) and alive(own_session)
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        wait_for(
            "child and grandchildren to die with the agent",
            lambda: not any(alive(pid) for pid in (child, grandchild, own_session)),
            10,
            interval=0.05,
            on_timeout=lambda: (
                f"child alive={alive(child)} grandchild alive={alive(grandchild)} "
                f"own-session grandchild alive={alive(own_session)}"
            ),
        )
    finally:
        if agent.poll() is None:
            agent.kill()
        for name in ("grandchild", "own_session"):
            with contextlib.suppress(OSError, ValueError):
                os.kill(int((tmp_path / name).read_text()), signal.SIGKILL)


@pytest.mark.multiproc
def test_a_child_in_its_own_session_dies_when_the_main_process_ends(tmp_path: Path) -> None:
    """torchrun's workers leave the container's group; its end still takes them (cgroup-like)."""
    from tools.podrunner.processes import ContainerProcess, Watchdog

    dog = Watchdog(ROOT)
    script = f"setsid sleep 300 & echo $! > {tmp_path}/own_session; sleep 1"
    proc = ContainerProcess(
        ["sh", "-c", script], {"PATH": "/usr/bin:/bin"}, str(tmp_path), tmp_path / "log", dog
    )
    try:
        wait_for("the pid file", (tmp_path / "own_session").exists, 30, interval=0.05)
        time.sleep(0.1)
        own_session = int((tmp_path / "own_session").read_text())
        assert alive(own_session) and os.getsid(own_session) == own_session
        ended = wait_for("the main process to end", proc.poll, 30, interval=0.05)
        assert ended.exit_code == 0
        wait_for("the own-session child to die", lambda: not alive(own_session), 10, interval=0.05)
    finally:
        proc.kill()
        dog.close()
