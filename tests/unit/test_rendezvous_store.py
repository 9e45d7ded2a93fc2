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
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from torch.distributed import TCPStore

from tools.ports import free_port
from trainer_runtime.agent import rendezvous_store
from trainer_runtime.resume.warm_start import SettleWait, await_settled

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
    keeper = rendezvous_store.start(port, 0)
    assert keeper is not None
    try:
        client = TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=10))
        client.set("k", "v")
        assert client.get("k") == b"v"
        with caplog.at_level(logging.WARNING, logger="trainer_runtime.agent"):
            assert rendezvous_store.start(port, 0) is None  # the port is taken: said, not raised
        assert f"rendezvous store at port {port} did not start" in caplog.text
    finally:
        keeper.stop()
    again = rendezvous_store.start(port, 0)
    assert again is not None
    again.stop()


def test_with_the_agent_store_rank_0_is_a_client_of_it() -> None:
    """Both ranks of a gang join the keeper's store; without the flag rank 0 would try to serve
    the taken port itself and fail."""
    port = free_port()
    keeper = rendezvous_store.start(port, 0)
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


def test_a_keepers_store_says_its_epoch_and_a_newer_member_waits_for_the_next_one() -> None:
    """The keeper writes its membership epoch into its store; a member of a newer epoch waits
    while the store at the address is the older gang's, and goes on once the new one answers.
    Nothing listening at first, or a store that does not say (one a worker hosts), is no reason
    to wait; nothing listening after an older store answered is the swap, and it waits on."""
    port = free_port()
    assert rendezvous_store.served_epoch("127.0.0.1", port) is None  # nothing listens
    # A worker's store, on a port of its own: the keeper below must not wait for it to let go.
    hosted_port = free_port()
    hosted = TCPStore("127.0.0.1", hosted_port, None, True, wait_for_workers=False)
    assert rendezvous_store.served_epoch("127.0.0.1", hosted_port) is None  # a worker's store
    del hosted
    old = rendezvous_store.start(port, 3)
    assert old is not None
    try:
        assert rendezvous_store.served_epoch("127.0.0.1", port) == 3
        began = time.monotonic()
        assert rendezvous_store.wait_until_current(3, "127.0.0.1", port, 30, lambda: True) == 3
        assert rendezvous_store.wait_until_current(2, "127.0.0.1", port, 30, lambda: True) == 3
        assert time.monotonic() - began < 5  # the current or a newer store: no wait
        with ThreadPoolExecutor(1) as pool:
            waited = pool.submit(
                lambda: (
                    rendezvous_store.wait_until_current(4, "127.0.0.1", port, 60, lambda: True),
                    time.monotonic(),
                )
            )
            time.sleep(1.5)
            assert not waited.done()  # the old gang's store still answers: it waits
            switched = time.monotonic()
            old.stop()
            old = None
            time.sleep(1.0)  # nothing listens: node rank 0 between its two stores
            assert not waited.done()
            old = rendezvous_store.start(port, 4)
            seen, returned = waited.result(timeout=30)
        # It waits through the swap (the old store stopped, the new one not yet up: nothing
        # listens) and goes on only when the new store answers.
        assert seen == 4 and returned >= switched
        # Told to stop waiting (the agent is terminating), it goes on with what it saw.
        assert rendezvous_store.wait_until_current(9, "127.0.0.1", port, 60, lambda: False) == 4
    finally:
        if old is not None:
            old.stop()


def test_a_member_that_reads_the_new_membership_before_node_rank_0_waits_for_its_store(
    tmp_path,
) -> None:
    """A grow in which the new member's agent knows the new membership before node rank 0's
    agent does: the old store (epoch 0) still answers at the address. The member's workers
    must wait for the new store rather than join the old one (whose keys would send them to the
    old ranks and hang the new gang)."""
    port = free_port()
    membership = tmp_path / "membership"
    agent = [sys.executable, "-m", "trainer_runtime.agent", "--", sys.executable, "-c"]
    pod0 = subprocess.Popen(
        [*agent, SLOW_TO_STOP],
        env=rank_env(port, 0, 1, RTJ_MEMBERSHIP_FILE=str(membership), RTJ_MEMBERSHIP_EPOCH="0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pod1 = None
    try:
        deadline = time.monotonic() + 120
        while "formed 0 1" not in (line := pod0.stdout.readline()):
            assert line and time.monotonic() < deadline, pod0.stderr.read()
        pod1 = subprocess.Popen(
            [*agent, SLOW_TO_STOP],
            env=rank_env(port, 1, 2, RTJ_MEMBERSHIP_EPOCH="1", PET_NNODES="2", PET_NODE_RANK="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Node rank 0 reads the new membership only once the member met the old store and
        # waits (a fixed sleep here was too short when the member's import of torch was slow).
        met = ""
        while "waiting for 1" not in met:
            line = pod1.stderr.readline()
            assert line and time.monotonic() < deadline, f"{met}{pod1.stderr.read()}"[-3000:]
            met += line
        assert pod1.poll() is None
        grown = {"epoch": 1, "nnodes": 2, "nodeRank": 0, "masterAddr": "127.0.0.1"}
        membership.write_text(json.dumps({**grown, "masterPort": port, "stop": "save"}))
        out, err = pod1.communicate(timeout=90)
        assert pod1.returncode == 0 and "formed 1 2" in out, (met + err)[-3000:]
        assert "formed 1 2" in pod0.stdout.readline()
    finally:
        for proc in (pod0, pod1):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(10)


def test_a_restarted_worker_waits_until_node_rank_0_says_the_old_gangs_saves_are_over() -> None:
    """``await_settled`` (resume/warm_start.py) waits for ``SETTLED_KEY`` of its own epoch in
    the keeper's store: not the word of an older gang's store, not a store that is not up yet,
    and it gives up at once when told (its gang formed without the word)."""
    port = free_port()
    given_up = threading.Event()
    old = rendezvous_store.start(port, 1)
    assert old is not None
    old.settle()  # the older gang's word, for epoch 1
    result: list[bool] = []
    waiter = threading.Thread(
        target=lambda: result.append(await_settled(SettleWait("127.0.0.1", port, 2), given_up))
    )
    began = time.monotonic()
    waiter.start()
    time.sleep(0.5)
    old.stop()  # node rank 0 swaps its stores: nothing listens for a moment
    time.sleep(0.3)
    new = rendezvous_store.start(port, 2)
    assert new is not None
    try:
        time.sleep(0.5)
        assert waiter.is_alive()  # epoch 2's store has not said it yet
        new.settle()
        waiter.join(10)
        assert result == [True] and time.monotonic() - began < 10
        client = TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=5))
        assert client.get(rendezvous_store.SETTLED_KEY) == b"2"
    finally:
        new.stop()
    given_up.set()  # nothing listens now: a waiter that is told to stop returns at once
    began = time.monotonic()
    assert not await_settled(SettleWait("127.0.0.1", port, 3), given_up)
    assert time.monotonic() - began < 1


def test_a_store_reader_says_absent_unreachable_and_finds_a_store_started_again() -> None:
    """``StoreReader``, the one way a worker looks at its gang's store before joining it
    (``await_settled``, the savers' group): a key not there reads None, a store gone raises
    ``StoreUnreachableError`` naming its address, and the next read reaches a store started
    again at that port."""
    port = free_port()
    reader = rendezvous_store.StoreReader("127.0.0.1", port)
    with pytest.raises(rendezvous_store.StoreUnreachableError, match=f"127.0.0.1:{port}"):
        reader.read(rendezvous_store.EPOCH_KEY, connect_timeout_s=0.3)
    first = rendezvous_store.start(port, 4)
    assert first is not None
    try:
        assert reader.read(rendezvous_store.EPOCH_KEY, connect_timeout_s=5) == b"4"
        assert reader.read(rendezvous_store.SETTLED_KEY, connect_timeout_s=5) is None
    finally:
        first.stop()
    with pytest.raises(rendezvous_store.StoreUnreachableError):
        reader.read(rendezvous_store.EPOCH_KEY, connect_timeout_s=0.3)
    assert reader.client is None
    second = rendezvous_store.start(port, 5)
    assert second is not None
    try:
        assert reader.read(rendezvous_store.EPOCH_KEY, connect_timeout_s=5) == b"5"
    finally:
        second.stop()
