"""A loss without notice taken in the running processes (trainer_runtime/run/rejoin.py,
docs/survivors.md), with real processes and real signals.

Each "pod" is ``python -m trainer_runtime.agent -- python survivor_worker.py --switch --rejoin``
in its own session; the test plays the operator: a gang of 3 trains, one pod is lost (SIGKILL to
its session) or cut off (SIGSTOP: its connections stay open, so its peers' collectives hang), and
the two others are told a gang of 2 with ``stop: rejoin``. Shown: the kept workers go on in the
same processes, every sample is trained once, at most the running step is trained again, and the
two ranks end bitwise equal; a script that does not hand the failure to ``rejoin`` is restarted
in place from the last finished step that a survivor saved, as before.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

from tests.multiproc.survivor_worker import SCRIPT_TIMEOUT
from tests.multiproc.test_inprocess_switch import start_standby
from tests.multiproc.test_survivors import assert_exactly_once
from tools.agentpods import Pods
from tools.ports import free_port
from trainer_runtime import events

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.skipif(sys.platform != "linux", reason="gloo multi-process on Linux"),
]

STEPS = 120


def lose_one_of_three(
    pods: Pods, how: str, *, seen_after: float = 0.0, **env: str
) -> tuple[float, list[int]]:
    """A gang of 3 trains; ``pod1`` is lost (``how``: "lose" or "cut_off"); ``seen_after``
    seconds later the two others get a gang of 2 with ``stop: rejoin``. Returns when it was
    lost and the steps of membership 1."""
    port = free_port()
    pods.start_gang(3, port=port, **env)
    pods.wait_steps(1, 10)
    lost_at = getattr(pods, how)("pod1")
    time.sleep(seen_after)
    port2 = free_port()
    for rank, pod in enumerate(("pod0", "pod2")):
        pods.announce(pod, epoch=2, nnodes=2, nodeRank=rank, masterPort=port2, stop="rejoin")
    codes = pods.wait_all()
    assert set(codes.values()) == {0}, pods.logs()
    return lost_at, pods.steps(1, 0)


def assert_rejoined_in_place(pods: Pods, lost_at: float, old: list[int]) -> None:
    out = pods.out
    for old_rank, new_rank in ((0, 0), (2, 1)):  # the same processes trained before and after
        pid = (out / f"pid-1-{old_rank}").read_text()
        assert (out / f"pid-2-{new_rank}").read_text() == pid
        rejoined_pid, timeout_s = (out / f"rejoined-2-{new_rank}").read_text().split()
        assert rejoined_pid == pid
        assert float(timeout_s) == SCRIPT_TIMEOUT.total_seconds()  # the script's, kept
    assert_exactly_once(pods, STEPS)
    new = pods.steps(2, 0)
    assert old[-1] <= new[0] <= old[-1] + 1, (old[-5:], new[:5])  # at most the running step
    finals = [torch.load(out / f"final-{r}.pt", weights_only=True) for r in range(2)]
    for key, tensor in finals[0]["model"].items():
        assert torch.equal(tensor, finals[1]["model"][key]), key
    for index, state in finals[0]["optim"]["state"].items():
        buf = finals[1]["optim"]["state"][index]["momentum_buffer"]
        assert torch.equal(state["momentum_buffer"], buf), index
    text = (pods.tmp / "pod0.log").read_text()
    switched = events.read_events(text, events.SWITCHED)
    assert [(e.fields["world_size"], e.fields["after_loss"]) for e in switched] == [(2, True)]
    assert not events.read_events(text, events.RESUMED)[1:], text  # no restart
    assert not events.read_events(text, events.SURVIVOR_SAVED), text  # nothing saved for it
    assert "workers asked to rejoin in process" in text
    recovery = max(pods.first_step(2, r) for r in range(2)) - lost_at
    print(f"\nloss -> both survivors trained a step again, in process: {recovery:.2f} s")


def test_a_lost_pods_peers_rejoin_in_process(tmp_path: Path) -> None:
    pods = Pods(tmp_path, steps=STEPS, extra=("--switch", "--rejoin"))
    lost_at, old = lose_one_of_three(pods, "lose")
    assert_rejoined_in_place(pods, lost_at, old)


def test_a_cut_off_pods_peers_rejoin_in_process(tmp_path: Path) -> None:
    """The lost pod's processes are stopped, not dead: nobody's collective fails by itself.
    The rejoin membership makes the survivors shut down their old gang's connections, which
    fails the hung collectives, and they rejoin as above."""
    pods = Pods(tmp_path, steps=STEPS, extra=("--switch", "--rejoin"))
    try:
        began = time.monotonic()
        lost_at, old = lose_one_of_three(pods, "cut_off")
        assert time.monotonic() - began < 240
        assert_rejoined_in_place(pods, lost_at, old)
    finally:
        Pods.kill_leftovers()


SLOW_DETECTION = {"RTJ_REJOIN_SECONDS": "2", "RTJ_LOSS_HOLD_SECONDS": "40"}
"""The operator sees the loss 8 s after it (a node that died silently: NotReady first), long
after the agents' own wait of 2 s but within the workers' hold after their failed collective."""


def test_survivors_wait_out_a_slow_detection_and_rejoin_in_process(tmp_path: Path) -> None:
    pods = Pods(tmp_path, steps=STEPS, extra=("--switch", "--rejoin"))
    lost_at, old = lose_one_of_three(pods, "lose", seen_after=8.0, **SLOW_DETECTION)
    assert_rejoined_in_place(pods, lost_at, old)
    assert "waits up to 40 s for the new membership" in (pods.tmp / "pod0.log").read_text()


def test_a_switch_handed_over_after_the_loss_does_not_make_the_agent_break_the_rejoin(
    tmp_path: Path,
) -> None:
    """Replayed spot trace: a grow's switch (epoch 2) reached the agents around the loss of a
    peer; the workers, whose gang of epoch 1 broke, claimed that loss and rejoined the gang of
    epoch 3. The agent waited for a claim naming epoch 2, took the rejoin for failed, and
    restarted the rejoined workers a minute later, which broke the new gang."""
    pods = Pods(tmp_path, steps=STEPS, extra=("--switch", "--rejoin"))
    pods.start_gang(3, port=free_port())
    pods.wait_steps(1, 10)
    pods.lose("pod1")
    grow_port = free_port()
    for rank, pod in enumerate(("pod0", "pod2")):  # the grow written before the loss was seen
        pods.announce(pod, epoch=2, nnodes=3, nodeRank=rank, masterPort=grow_port, stop="switch")
    time.sleep(2.0)  # both agents hand it over to workers that wait to rejoin
    port3 = free_port()
    for rank, pod in enumerate(("pod0", "pod2")):
        pods.announce(pod, epoch=3, nnodes=2, nodeRank=rank, masterPort=port3, stop="rejoin")
    codes = pods.wait_all()
    assert set(codes.values()) == {0}, pods.logs()
    out = pods.out
    for old_rank, new_rank in ((0, 0), (2, 1)):  # the same processes, never restarted
        pid = (out / f"pid-1-{old_rank}").read_text()
        assert (out / f"rejoined-3-{new_rank}").read_text().split()[0] == pid
        assert (out / f"pid-3-{new_rank}").read_text() == pid
    assert_exactly_once(pods, STEPS)
    for pod in ("pod0", "pod2"):
        text = (pods.tmp / f"{pod}.log").read_text()
        assert "did not rejoin in process" not in text, text
        assert not events.read_events(text, events.RESUMED)[1:], text  # no restart


def test_a_warm_spare_takes_the_lost_place_with_the_state_of_the_rejoined_gang(
    tmp_path: Path,
) -> None:
    """A fixed-size gang of 3 with a warm spare (``pod3``, in standby) loses ``pod1`` without
    notice: the two kept workers rejoin in process and the spare, started by the same
    membership, gets rank 0's state; the gang trains on at 3 from the last finished step."""
    pods = Pods(tmp_path, steps=STEPS, extra=("--switch", "--rejoin"))
    pods.start_gang(3, port=free_port())
    pods.wait_steps(1, 10)
    port2 = free_port()
    start_standby(pods, tmp_path, "pod3", node_rank=2, port=port2)
    pods.lose("pod1")
    for pod, rank in (("pod0", 0), ("pod2", 1), ("pod3", 2)):
        pods.announce(pod, epoch=2, nnodes=3, nodeRank=rank, masterPort=port2, stop="rejoin")
    codes = pods.wait_all()
    assert set(codes.values()) == {0}, pods.logs()
    out = pods.out
    for old_rank, new_rank in ((0, 0), (2, 1)):
        rejoined_pid = (out / f"rejoined-2-{new_rank}").read_text().split()[0]
        assert rejoined_pid == (out / f"pid-1-{old_rank}").read_text()
    assert_exactly_once(pods, STEPS)
    old, new = pods.steps(1, 0), pods.steps(2, 0)
    assert old[-1] <= new[0] <= old[-1] + 1, (old[-5:], new[:5])
    assert pods.steps(2, 2)[0] == new[0]  # the spare starts where the gang goes on
    joined = events.read_events((tmp_path / "pod3.log").read_text(), events.RESUMED)
    assert [(e["source"], e["step"]) for e in joined] == [("peers", new[0])], joined
    finals = [torch.load(out / f"final-{r}.pt", weights_only=True) for r in range(3)]
    for other in finals[1:]:
        for key, tensor in finals[0]["model"].items():
            assert torch.equal(tensor, other["model"][key]), key


@pytest.mark.parametrize("seen_after", [0.0, 8.0], ids=["seen-at-once", "seen-late"])
def test_a_script_that_does_not_rejoin_restarts_from_the_survivors_save(
    tmp_path: Path, seen_after: float
) -> None:
    """Seen late: the workers' failed collectives wait out the operator's detection, so the
    survivor still holds the last finished step when the membership names it."""
    pods = Pods(tmp_path, steps=STEPS, extra=("--switch",))  # MembershipSwitched only
    env = SLOW_DETECTION if seen_after else {}
    _, old = lose_one_of_three(pods, "lose", seen_after=seen_after, **env)
    out = pods.out
    for old_rank, new_rank in ((0, 0), (2, 1)):
        assert (out / f"pid-2-{new_rank}").read_text() != (out / f"pid-1-{old_rank}").read_text()
    assert not list(out.glob("rejoined-*"))
    assert_exactly_once(pods, STEPS)
    new = pods.steps(2, 0)
    assert new[0] == old[-1] + 1, (old[-5:], new[:5])  # the survivor saved the last step
    saved = events.read_events((pods.tmp / "pod0.log").read_text(), events.SURVIVOR_SAVED)
    assert [e.fields["step"] for e in saved] == [old[-1] + 1], saved
