"""The in-process switch, with real processes (trainer_runtime/switch.py, docs/survivors.md).

Each "pod" is ``python -m trainer_runtime.agent -- python survivor_worker.py`` in its own session;
the test plays the operator's part of a warm join: the new pod starts in standby while the gang
trains, then every pod is told the new membership with ``stop: switch``. Shown: workers built
with ``in_process_switch=True`` take the new membership without ending (the same processes
train before and after), no step is lost or repeated and every sample is trained once, the new
rank gets the running gang's state (every rank ends with bitwise the same weights and optimizer
state), and a gang whose script did not opt in falls back to the restart in place (the kept
pods save and restart, the new rank resumes from that commit).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

from tests.multiproc.survivor_worker import SCRIPT_TIMEOUT
from tests.multiproc.test_survivors import assert_exactly_once
from tools.agentpods import Pods
from tools.ports import free_port
from trainer_runtime import events

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.skipif(sys.platform != "linux", reason="gloo multi-process on Linux"),
]

STEPS = 150


def start_standby(pods: Pods, tmp: Path, name: str, *, node_rank: int, port: int) -> None:
    """Start ``name`` in standby for membership epoch 2 (3 pods), and wait until it says so."""
    pods.start(name, node_rank=node_rank, nnodes=3, port=port, epoch=2, RTJ_STANDBY="1")
    end = time.monotonic() + 120
    while "standby for membership epoch 2" not in (tmp / f"{name}.log").read_text():
        assert time.monotonic() < end, pods.logs()
        time.sleep(0.1)


def grow_two_to_three(pods: Pods, tmp: Path) -> int:
    """A gang of 2 trains; a third pod starts in standby and says so; then every pod gets the
    membership of 3 with ``stop: switch``. Returns the step the gang of 2 had reached when the
    new pod was warm."""
    port = free_port()
    for r in range(2):
        pods.start(f"pod{r}", node_rank=r, nnodes=2, port=port, epoch=1)
    pods.wait_steps(1, 8)
    port2 = free_port()
    start_standby(pods, tmp, "pod2", node_rank=2, port=port2)
    warm_at = pods.steps_done(1)
    for r in range(2):
        pods.announce(f"pod{r}", epoch=2, nnodes=3, nodeRank=r, masterPort=port2, stop="switch")
    pods.announce("pod2", epoch=2, nnodes=3, nodeRank=2, masterPort=port2, stop="switch")
    codes = pods.wait_all()
    assert set(codes.values()) == {0}, pods.logs()
    return warm_at


def test_a_grow_switches_the_running_workers_in_process(tmp_path: Path) -> None:
    pods = Pods(tmp_path, steps=STEPS, extra=("--switch",))
    grow_two_to_three(pods, tmp_path)
    out = pods.out
    for rank in range(2):  # the same worker process trained in both memberships
        before = (out / f"pid-1-{rank}").read_text()
        assert (out / f"pid-2-{rank}").read_text() == before
        pid, _, timeout_s = (out / f"switched-2-{rank}").read_text().split()
        assert pid == before
        assert float(timeout_s) == SCRIPT_TIMEOUT.total_seconds()  # the script's, kept
    assert not (out / "switched-2-2").exists()  # the new rank started in the new membership
    assert_exactly_once(pods, STEPS)
    old, new = pods.steps(1, 0), pods.steps(2, 0)
    assert new[0] == old[-1] + 1, (old, new)  # nothing lost, nothing trained twice
    assert pods.steps(2, 2)[0] == new[0]  # the new rank starts where the gang is
    finals = [torch.load(out / f"final-{r}.pt", weights_only=True) for r in range(3)]
    for other in finals[1:]:
        for key, tensor in finals[0]["model"].items():
            assert torch.equal(tensor, other["model"][key]), key
        for index, state in finals[0]["optim"]["state"].items():
            buf = other["optim"]["state"][index]["momentum_buffer"]
            assert torch.equal(state["momentum_buffer"], buf), index
    joined = events.read_events((tmp_path / "pod2.log").read_text(), events.RESUMED)
    assert [(e["source"], e["step"], e["saved_world_size"]) for e in joined] == [
        ("peers", new[0], 2)
    ], joined
    switched = events.read_events((tmp_path / "pod0.log").read_text(), events.SWITCHED)
    assert [(e.fields["world_size"], e.fields["old_world_size"]) for e in switched] == [(3, 2)]
    assert "workers asked to switch in process" in (tmp_path / "pod0.log").read_text()


def test_workers_that_cannot_switch_restart_in_place_instead(tmp_path: Path) -> None:
    pods = Pods(tmp_path, steps=STEPS)  # no --switch: the script did not opt in
    grow_two_to_three(pods, tmp_path)
    out = pods.out
    for rank in range(2):
        assert (out / f"pid-2-{rank}").read_text() != (out / f"pid-1-{rank}").read_text()
    assert not list(out.glob("switched-*"))
    assert_exactly_once(pods, STEPS)
    old, new = pods.steps(1, 0), pods.steps(2, 0)
    assert new[0] == old[-1] + 1, (old, new)  # the save on the way out committed the last step
    joined = events.read_events((tmp_path / "pod2.log").read_text(), events.RESUMED)
    assert [e.fields["source"] for e in joined] == ["local"], joined


def leave_three_to_two(pods: Pods, tmp: Path, leaving: int = 1) -> dict[str, int]:
    """A gang of 3 trains; the node of ``pod<leaving>`` is announced for termination, so the
    operator tells it ``stop: leave`` and the two others a gang of 2 with ``stop: switch``, in
    their order. Returns the pods' exit codes."""
    port = free_port()
    pods.start_gang(3, port=port)
    pods.wait_steps(1, 8)
    port2 = free_port()
    told = {"epoch": 2, "nnodes": 2, "masterPort": port2}
    pods.announce(f"pod{leaving}", nodeRank=-1, stop="leave", **told)
    for rank, pod in enumerate(p for p in (0, 1, 2) if p != leaving):
        pods.announce(f"pod{pod}", nodeRank=rank, stop="switch", **told)
    return pods.wait_all()


def assert_trained_on_in_place(pods: Pods, kept: tuple[tuple[int, int], ...]) -> list[int]:
    """The kept workers (rank in membership 1, rank in 2) trained on in the same processes,
    every sample was trained once, and the gang of membership 2 began at the step after the
    last of membership 1 (nothing lost, nothing trained twice). The steps of membership 1."""
    out = pods.out
    for old, new in kept:
        assert (out / f"pid-2-{new}").read_text() == (out / f"pid-1-{old}").read_text()
    assert_exactly_once(pods, STEPS)
    old, new = pods.steps(1, 0), pods.steps(2, 0)
    assert new[0] == old[-1] + 1, (old, new)
    return old


def test_a_noticed_pod_leaves_and_the_others_switch_in_process(tmp_path: Path) -> None:
    pods = Pods(tmp_path, steps=STEPS, extra=("--switch",))
    codes = leave_three_to_two(pods, tmp_path)
    assert set(codes.values()) == {0}, pods.logs()
    out = pods.out
    old = assert_trained_on_in_place(pods, ((0, 0), (2, 1)))
    for pid_at, new in ((0, 0), (2, 1)):  # the switch happened in those processes
        before = (out / f"pid-1-{pid_at}").read_text()
        assert (out / f"switched-2-{new}").read_text().split()[0] == before
    assert pods.steps(1, 1)[-1] == old[-1]  # the leaving rank trained up to the boundary
    left = events.read_events((tmp_path / "pod1.log").read_text(), events.LEFT)
    assert [(e.fields["epoch"], e.fields["step"]) for e in left] == [(2, old[-1] + 1)], left
    assert not (out / "final-2.pt").exists()  # it ended at the boundary
    finals = [torch.load(out / f"final-{r}.pt", weights_only=True) for r in range(2)]
    for key, tensor in finals[0]["model"].items():
        assert torch.equal(tensor, finals[1]["model"][key]), key
    for log in ("pod0.log", "pod2.log"):
        text = (tmp_path / log).read_text()
        assert not events.read_events(text, events.RESUMED)[1:], text  # no restart
    assert "its workers leave in process" in (tmp_path / "pod1.log").read_text()


def test_rank_0_leaves_and_the_next_pod_serves_the_gang_of_two(tmp_path: Path) -> None:
    """The noticed pod is node rank 0's, whose agent serves the gang's rendezvous store: the
    two others switch in process to a gang of 2 whose node rank 0 is ``pod1``."""
    pods = Pods(tmp_path, steps=STEPS, extra=("--switch",))
    codes = leave_three_to_two(pods, tmp_path, leaving=0)
    assert set(codes.values()) == {0}, pods.logs()
    old = assert_trained_on_in_place(pods, ((1, 0), (2, 1)))
    left = events.read_events((tmp_path / "pod0.log").read_text(), events.LEFT)
    assert [e.fields["step"] for e in left] == [old[-1] + 1], left


def test_a_leave_where_workers_cannot_switch_saves_and_restarts_the_kept_ones(
    tmp_path: Path,
) -> None:
    pods = Pods(tmp_path, steps=STEPS)  # no --switch: the script did not opt in
    codes = leave_three_to_two(pods, tmp_path)
    assert set(codes.values()) == {0}, pods.logs()
    out = pods.out
    for old, new in ((0, 0), (2, 1)):
        assert (out / f"pid-2-{new}").read_text() != (out / f"pid-1-{old}").read_text()
    assert not list(out.glob("switched-*"))
    assert_exactly_once(pods, STEPS)
    old, new = pods.steps(1, 0), pods.steps(2, 0)
    assert new[0] == old[-1] + 1, (old, new)  # the save on the way out committed the last step
    assert "save with the others and end" in (tmp_path / "pod1.log").read_text()


def test_a_warm_spare_takes_a_leaving_pods_place_in_the_same_switch(tmp_path: Path) -> None:
    """A fixed-size gang at a notice: ``pod1`` leaves and a warm spare (``pod3``, started in
    standby) takes its place; the kept workers switch in process, the spare gets the state from
    rank 0, and the gang trains on at 3 from the step it reached."""
    pods = Pods(tmp_path, steps=STEPS, extra=("--switch",))
    port = free_port()
    pods.start_gang(3, port=port)
    pods.wait_steps(1, 8)
    port2 = free_port()
    start_standby(pods, tmp_path, "pod3", node_rank=2, port=port2)
    pods.announce("pod1", epoch=2, nnodes=3, nodeRank=-1, masterPort=port2, stop="leave")
    for pod, rank in (("pod0", 0), ("pod2", 1), ("pod3", 2)):
        pods.announce(pod, epoch=2, nnodes=3, nodeRank=rank, masterPort=port2, stop="switch")
    codes = pods.wait_all()
    assert set(codes.values()) == {0}, pods.logs()
    out = pods.out
    assert_trained_on_in_place(pods, ((0, 0), (2, 1)))
    new = pods.steps(2, 0)
    assert pods.steps(2, 2)[0] == new[0]  # the spare starts where the gang is
    left = events.read_events((tmp_path / "pod1.log").read_text(), events.LEFT)
    assert [e.fields["step"] for e in left] == [new[0]], left
    joined = events.read_events((tmp_path / "pod3.log").read_text(), events.RESUMED)
    assert [(e.fields["source"], e.fields["step"]) for e in joined] == [("peers", new[0])]
    finals = [torch.load(out / f"final-{r}.pt", weights_only=True) for r in range(3)]
    for other in finals[1:]:
        for key, tensor in finals[0]["model"].items():
            assert torch.equal(tensor, other["model"][key]), key
