"""A loss taken in process: who takes it, the old gang's connections, the agent's watch
(trainer_runtime/run/rejoin.py, save/rejoin_claim.py, run/gang_sockets.py, agent/rejoin_watch.py).
The rejoin itself, with real processes: tests/multiproc/test_rejoin.py."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tools.ports import free_port
from trainer_runtime.agent import command, rendezvous_store
from trainer_runtime.agent.rejoin_watch import SLACK_S, PendingRejoin, next_step
from trainer_runtime.agent.supervisor import AgentSettings, Supervisor
from trainer_runtime.agent.worker import Worker
from trainer_runtime.errors import ConfigError
from trainer_runtime.pod.membership import Membership
from trainer_runtime.run.gang_sockets import GangSockets
from trainer_runtime.save.rejoin_claim import CLAIM_S, RejoinClaim
from trainer_runtime.switch import SwitchRequest, claim, claimed


def test_a_claim_before_the_watch_waits_keeps_the_loss_in_process():
    cuts: list[int] = []
    rejoin = RejoinClaim(lambda: cuts.append(1))
    assert rejoin.take()
    assert rejoin.awaited(timeout_s=5.0)  # at once: claimed already
    assert cuts == [1]  # the watch cut the old gang's connections all the same


def test_a_late_claim_is_refused_once_the_watch_chose_the_save():
    rejoin = RejoinClaim()
    began = time.monotonic()
    assert not rejoin.awaited(timeout_s=0.2)
    assert time.monotonic() - began >= 0.2
    assert not rejoin.take()


def test_the_watch_wakes_at_a_claim_made_while_it_waits():
    rejoin = RejoinClaim()
    threading.Timer(0.1, rejoin.take).start()
    began = time.monotonic()
    assert rejoin.awaited(timeout_s=CLAIM_S)
    assert time.monotonic() - began < CLAIM_S


def test_a_loop_that_ended_refuses_at_once():
    rejoin = RejoinClaim()
    assert not rejoin.refuse()  # the script let the failure end its loop (hold)
    began = time.monotonic()
    assert not rejoin.awaited(timeout_s=5.0)
    assert time.monotonic() - began < 1.0
    assert not rejoin.take()


def _connected_pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    return listener, client, accepted


def test_the_gang_sockets_are_shut_down_and_the_peer_sees_it_at_once():
    kept_listener, kept_client, kept_accepted = _connected_pair()  # not the gang's
    sockets = GangSockets()
    with sockets.forming():
        listener, client, accepted = _connected_pair()
        store_listener, store_client, store_accepted = _connected_pair()  # its port is kept
    store_port = store_listener.getsockname()[1]
    try:
        cut = sockets.cut(store_port)
        assert cut == 2  # the gang's two ends; not its listener, not the store's connection
        accepted.settimeout(5.0)
        assert accepted.recv(1) == b""  # shut down: end of stream, no wait
        kept_client.sendall(b"x")
        assert kept_accepted.recv(1) == b"x"  # a socket opened before the group: untouched
        store_client.sendall(b"y")
        assert store_accepted.recv(1) == b"y"  # the rendezvous store's: kept
    finally:
        for s in (kept_listener, kept_client, kept_accepted, listener, client, accepted):
            s.close()
        for s in (store_listener, store_client, store_accepted):
            s.close()


def test_the_agent_restarts_the_workers_unless_every_one_claims_in_time(tmp_path: Path):
    new = Membership(epoch=3, nnodes=2, node_rank=0, master_addr="a", master_port=1, stop="rejoin")
    files = [tmp_path / "switch-0", tmp_path / "switch-1"]
    pending = PendingRejoin(new, since=100.0, lost_epochs=(2, 2))
    claim(files[1], 1)  # a claim of an earlier loss, from the same worker
    assert next_step(pending, [None, None], files, 100.5) == (pending, None)  # waiting
    claim(files[0], 2)
    assert claimed(files[0]) == 2 and claimed(files[1]) == 1
    late = 100.0 + CLAIM_S + SLACK_S
    assert next_step(pending, [None, None], files, late) == (None, new)  # one never claimed
    assert next_step(pending, [None, 1], files, 100.5) == (None, new)  # one ended first
    claim(files[1], 2)
    assert next_step(pending, [None, None], files, late) == (None, None)  # theirs
    first_gang = PendingRejoin(new, since=100.0, lost_epochs=(0, 0))  # the pods' first gang
    claim(files[0], 0)
    claim(files[1], 0)
    assert next_step(first_gang, [None, None], files, 100.5) == (None, None)
    assert next_step(None, [None, None], files, late) == (None, None)


def test_a_request_after_a_loss_says_so_and_a_bad_flag_is_named():
    request = SwitchRequest(4, {"RANK": "0"}, after_loss=True)
    assert SwitchRequest.parse(request.to_json(), "f") == request
    assert not SwitchRequest.parse('{"epoch": 4, "environment": {}}', "f").after_loss
    with pytest.raises(ConfigError, match="after_loss='yes': expected true or false"):
        SwitchRequest.parse('{"epoch": 4, "environment": {}, "after_loss": "yes"}', "f")


def one_worker_settings() -> AgentSettings:
    """An agent of one worker, no membership file (the test hands memberships over)."""
    return AgentSettings(
        command=command.parse(["python", "train.py"]),
        nproc_per_node=1,
        base_env={},
        membership_file=None,
        rejoin_s=30.0,
    )


def test_a_rejoin_is_handed_over_only_once_the_new_gangs_store_answers(tmp_path: Path):
    """A rejoin forms its group at once (no step agreed first). When this pod's agent reads
    the new membership before node rank 0's agent does, the old gang's store still answers at
    the rendezvous: the request must wait for the new store, or this pod's workers would form
    at the old one while rank 0 waits at the new one (a 30-minute hang, seen in CI)."""
    port = free_port()
    old = rendezvous_store.start(port, 1)
    assert old is not None
    settings = one_worker_settings()
    agent = Supervisor(settings, Membership(1, 3, 1, "127.0.0.1", port), markers=tmp_path)
    agent.workers = [Worker(0, 0, None)]  # _switch only counts them
    new = Membership(2, 2, 1, "127.0.0.1", port, stop="rejoin")
    handing = threading.Thread(target=agent._switch, args=(new,), daemon=True)
    handing.start()
    request = agent._switch_file(0)
    keeper = None
    try:
        time.sleep(1.0)
        assert not request.exists(), "asked to rejoin while the old gang's store answered"
        old.stop()
        keeper = rendezvous_store.start(port, 2)
        handing.join(timeout=15)
        assert not handing.is_alive()
        asked = SwitchRequest.parse(request.read_text(), str(request))
        assert (asked.epoch, asked.after_loss) == (2, True)
        assert agent.rejoining is not None and agent.rejoining.lost_epochs[1] == 1
    finally:
        old.stop()
        if keeper is not None:
            keeper.stop()


REJOIN_THAT_HANGS = """
import time
from trainer_runtime.run.switch_in_place import bounded
with bounded(0.3):
    time.sleep(0.05)
print("in time", flush=True)
with bounded(0.5):
    time.sleep(30)
print("never", flush=True)
"""


def test_a_rejoin_that_does_not_form_in_time_ends_the_process_and_says_where_it_waited():
    """The bound on re-forming: a body within it goes on (the watchdog is cancelled), one past
    it ends the process with 1 and every thread's stack, so the agent falls back to the
    restart instead of the process group's 30-minute timeout."""
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", REJOIN_THAT_HANGS],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc
    assert "in time" in proc.stdout and "never" not in proc.stdout
    assert "Timeout" in proc.stderr, proc.stderr
    assert '<string>", line 8' in proc.stderr, proc.stderr
    assert time.monotonic() - began < 30


def test_a_loss_before_the_workers_took_a_switch_is_theirs_to_rejoin(tmp_path: Path):
    """Replayed spot trace: a grow's switch (epoch 3) was handed to the workers, a peer was lost
    before they took it, and the rejoin (epoch 4) came. The workers rejoined from the gang they
    were in (epoch 2) and claimed that loss, but the agent waited for a claim of epoch 3, took
    the rejoin for failed after 59 s and restarted them, which broke the gang it had formed."""
    settings = one_worker_settings()
    port = free_port()
    formed = Membership(2, 2, 0, "127.0.0.1", port)
    agent = Supervisor(settings, formed, markers=tmp_path, current=formed, formed_epoch=2)
    agent.workers = [Worker(0, 0, None)]
    try:
        agent._switch(Membership(3, 3, 0, "127.0.0.1", port, stop="switch"))
        agent._switch(Membership(4, 2, 0, "127.0.0.1", port, stop="rejoin"))
        pending = agent.rejoining
        assert pending is not None and pending.lost_epochs == (2, 3)
        files = [agent._switch_file(0)]
        claim(files[0], 1)  # an earlier loss's claim
        assert next_step(pending, [None], files, pending.since + 1) == (pending, None)
        claim(files[0], 2)  # the gang the workers were in when the peer went
        assert next_step(pending, [None], files, pending.since + 1) == (None, None)
        assert agent.formed_epoch == 4
    finally:
        if agent.store is not None:
            agent.store.stop()
