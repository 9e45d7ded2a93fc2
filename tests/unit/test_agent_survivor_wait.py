"""The agent waits for a survivor's save as long as the save moves bytes (agent/supervisor.py).

The saving worker is a real child process that speaks the marker's protocol (``<pid> <bytes>``,
rewritten as the count grows, as ``save/survivor.py``'s heartbeat does). A save that keeps
moving bytes is waited for past ``RTJ_SURVIVOR_SAVE_SECONDS``; one whose count stands still is
given up after it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer_runtime import io_progress
from trainer_runtime.agent import command
from trainer_runtime.agent.supervisor import AgentSettings, Supervisor, saver_bytes
from trainer_runtime.agent.worker import Worker
from trainer_runtime.pod.membership import Membership
from trainer_runtime.save.survivor import heartbeat

BOUND_S = 1.0

SAVER = """
import os, sys, time
marker, beats, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
for n in range(1, beats + 1):
    with open(marker + ".beat", "w") as f:
        f.write(f"{os.getpid()} {n * 1000}\\n")
    os.replace(marker + ".beat", marker)
    time.sleep(pause)
"""


def agent_with_saver(tmp_path: Path, beats: int, pause: float) -> tuple[Supervisor, Worker]:
    settings = AgentSettings(
        command=command.parse(["python", "train.py"]),
        nproc_per_node=1,
        base_env={},
        membership_file=None,
        poll_s=0.02,
        survivor_save_s=BOUND_S,
    )
    agent = Supervisor(settings, Membership(2, 2, 0, "127.0.0.1", 1), markers=tmp_path)
    marker = tmp_path / "survivor-0"
    marker.write_text("1\n")  # the worker said it can save
    popen = subprocess.Popen([sys.executable, "-c", SAVER, str(marker), str(beats), str(pause)])
    agent.workers = [Worker(0, popen.pid, popen)]
    return agent, agent.workers[0]


@pytest.fixture
def saver_children():
    made: list[Worker] = []
    yield made
    for w in made:
        w.popen.kill()  # type: ignore[union-attr]
        w.popen.wait()  # type: ignore[union-attr]


def test_a_save_that_keeps_moving_bytes_is_waited_for_past_the_bound(
    tmp_path, saver_children, capsys, caplog
):
    agent, saver = agent_with_saver(tmp_path, beats=12, pause=0.25)  # about 3 s, 3x the bound
    saver_children.append(saver)
    began = time.monotonic()
    agent._let_survivor_save()
    assert saver.poll() == 0  # it ended by itself: the agent did not give up on it
    assert time.monotonic() - began >= 2.5
    said = capsys.readouterr()
    assert "the survivor's save ended" in said.out + said.err + caplog.text


def test_a_save_whose_count_stands_still_is_given_up_after_the_bound(tmp_path, saver_children):
    agent, saver = agent_with_saver(tmp_path, beats=1, pause=30.0)  # one beat, then nothing
    saver_children.append(saver)
    began = time.monotonic()
    agent._let_survivor_save()
    waited = time.monotonic() - began
    assert saver.poll() is None  # still running: the agent's stop kills it next
    assert BOUND_S <= waited < BOUND_S + 3.0


NOT_SAVING = """
import os, sys, time
os.unlink(sys.argv[1])  # the membership does not name it (a small state: node rank 0 saves)
time.sleep(30)
"""


def test_a_worker_that_does_not_save_is_not_waited_for(tmp_path, saver_children, capsys, caplog):
    """A kept pod's worker that the membership does not name removes its marker and trains on
    until it is stopped: its agent goes on at once, and says no save ended."""
    agent, _ = agent_with_saver(tmp_path, beats=0, pause=0.0)
    marker = tmp_path / "survivor-0"
    marker.write_text("1\n")
    popen = subprocess.Popen([sys.executable, "-c", NOT_SAVING, str(marker)])
    agent.workers = [Worker(0, popen.pid, popen)]
    saver_children.append(agent.workers[0])
    began = time.monotonic()
    agent._let_survivor_save()
    assert time.monotonic() - began < BOUND_S  # not the stall bound: it went on at once
    assert agent.workers[0].poll() is None  # still running: the agent's stop ends it
    said = capsys.readouterr()
    assert "save ended" not in said.out + said.err + caplog.text


def test_the_count_is_read_from_the_marker(tmp_path):
    marker = tmp_path / "survivor-0"
    assert saver_bytes(marker) == 0  # gone
    marker.write_text("123\n")
    assert saver_bytes(marker) == 0  # armed, nothing said yet
    marker.write_text("123 4096\n")
    assert saver_bytes(marker) == 4096


def test_the_savers_heartbeat_reports_the_bytes_it_moves(tmp_path):
    """Both ends of the marker: the count ``heartbeat`` writes is the one the agent reads."""
    marker = tmp_path / "survivor-0"
    marker.write_text("1\n")
    io_progress.moved(1)
    with heartbeat(marker):
        first = wait_for_count(marker, lambda n: n >= io_progress.total() > 0)
        io_progress.moved(5 << 20)
        wait_for_count(marker, lambda n: n >= first + (5 << 20))


def wait_for_count(marker: Path, wanted, timeout_s: float = 5.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        count = saver_bytes(marker)
        if wanted(count):
            return count
        time.sleep(0.05)
    raise AssertionError(f"the marker says {marker.read_text()!r}")
