"""The rendezvous store the agent of node rank 0 serves (trainer_runtime/agent/rendezvous_store.py).

Real processes: the keeper is a forked child serving a real ``TCPStore``; the workers are real
interpreters that form a gloo process group through the environment's rendezvous.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import subprocess
import sys
import time

import pytest
from torch.distributed import TCPStore

from tools.ports import free_port
from trainer_runtime.agent import rendezvous_store

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork and prctl on Linux")

FORM_GROUP = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print("formed", os.environ.get("TORCHELASTIC_USE_AGENT_STORE"), int(t.item()))
dist.destroy_process_group()
"""


def rank_env(port: int, rank: int, world: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_USE_AGENT_STORE"}
    return env | {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        **extra,
    }


def test_the_keeper_serves_clients_and_gives_its_port_back(caplog) -> None:
    port = free_port()
    keeper = rendezvous_store.start(port)
    assert keeper is not None
    try:
        client = TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=10))
        client.set("k", "v")
        assert client.get("k") == b"v"
        with caplog.at_level(logging.WARNING, logger="trainer_runtime.agent"):
            assert rendezvous_store.start(port) is None  # the port is taken: said, not raised
        assert f"rendezvous store at port {port} did not start" in caplog.text
    finally:
        keeper.stop()
    again = rendezvous_store.start(port)
    assert again is not None
    again.stop()


def test_with_the_agent_store_rank_0_is_a_client_of_it() -> None:
    """Both ranks of a gang join the keeper's store; without the flag rank 0 would try to serve
    the taken port itself and fail."""
    port = free_port()
    keeper = rendezvous_store.start(port)
    assert keeper is not None
    try:
        flag = {"TORCHELASTIC_USE_AGENT_STORE": "True"}
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", FORM_GROUP],
                env=rank_env(port, rank, 2, **flag),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank in (1, 0)
        ]
        outputs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outputs
        assert all("formed True 2" in out for out, _ in outputs)

        alone = subprocess.run(
            [sys.executable, "-c", FORM_GROUP],
            check=False,
            env=rank_env(port, 0, 1),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert alone.returncode != 0
        assert "address already in use" in alone.stderr.lower()
    finally:
        keeper.stop()


def test_the_agent_of_node_rank_0_serves_the_store_its_workers_use() -> None:
    port = free_port()
    agent = [sys.executable, "-m", "trainer_runtime.agent", "--"]
    done = subprocess.run(
        [*agent, sys.executable, "-c", FORM_GROUP],
        check=False,
        env=rank_env(port, 0, 1),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "formed True 1" in done.stdout


SLOW_TO_STOP = """
import os, signal, sys, time, torch, torch.distributed as dist
epoch = os.environ.get("RTJ_MEMBERSHIP_EPOCH", "0")
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(time.monotonic()))
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
print("formed", epoch, int(t.item()), flush=True)
if epoch == "0":  # the old gang trains until told to stop, then saves for a while
    while not stopping:
        time.sleep(0.05)
    time.sleep(3.0)
dist.destroy_process_group()
"""


def test_a_new_member_that_arrives_early_never_meets_the_old_gangs_store(tmp_path) -> None:
    """A grow at the same rendezvous address: the old gang (node rank 0's agent, 1 rank) takes
    3 s to stop, and the new member's worker starts at once. It must join the new gang's store,
    not the old one still answering at that port (whose keys would send it to the old ranks)."""
    port = free_port()
    membership = tmp_path / "membership"
    pod0 = subprocess.Popen(
        [sys.executable, "-m", "trainer_runtime.agent", "--", sys.executable, "-c", SLOW_TO_STOP],
        env=rank_env(port, 0, 1, RTJ_MEMBERSHIP_FILE=str(membership), RTJ_MEMBERSHIP_EPOCH="0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    joiner = None
    try:
        deadline = time.monotonic() + 120
        while "formed 0 1" not in (line := pod0.stdout.readline()):
            assert line and time.monotonic() < deadline, pod0.stderr.read()
        grown = {"epoch": 1, "nnodes": 2, "nodeRank": 0, "masterAddr": "127.0.0.1"}
        membership.write_text(json.dumps({**grown, "masterPort": port, "stop": "save"}))
        joiner = subprocess.Popen(
            [sys.executable, "-c", SLOW_TO_STOP],
            env=rank_env(port, 1, 2, TORCHELASTIC_USE_AGENT_STORE="True", RTJ_MEMBERSHIP_EPOCH="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = joiner.communicate(timeout=90)
        assert joiner.returncode == 0 and "formed 1 2" in out, err[-2000:]
        assert "formed 1 2" in pod0.stdout.readline()
    finally:
        for proc in (pod0, joiner):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)
