"""Membership changes in place, with real processes and real signals (docs/survivors.md).

Each "pod" is ``python -m trainer_runtime.agent -- python survivor_worker.py`` in its own
session; a node loss is SIGKILL to a pod's whole process group; the test plays the operator's
part by writing each staying pod's membership file and starting the replacement pod. Shown:
the surviving pods' agents stay (the same processes from start to end) through a loss, a
shrink and a grow; the final weights of a fixed-size gang that lost a pod are bitwise those of
an uninterrupted run and every step's samples are trained exactly once in the kept line; a grow
announced with ``stop: save`` loses no step, and its new pod waits warm in standby while the
gang trains on; a survivor with no new membership gives up after
``RTJ_REJOIN_SECONDS`` with its worker's exit code; a gang of an older epoch cannot commit once
a newer one claimed the run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from tools.agentpods import STEPS, Pods
from tools.ports import free_port
from trainer_runtime import Manifest

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.skipif(sys.platform != "linux", reason="gloo multi-process on Linux"),
]


def assert_exactly_once(pods: Pods, steps: int) -> None:
    kept = pods.kept_lines()
    assert sorted(kept) == list(range(steps))
    for step, entries in kept.items():
        ids = sorted(i for _, _, batch in entries for i in batch)
        assert ids == list(range(step * 12, (step + 1) * 12)), (step, entries)


def reference_weights(tmp: Path, nnodes: int) -> dict:
    ref = Pods(tmp / "reference")
    port = free_port()
    for r in range(nnodes):
        ref.start(f"pod{r}", node_rank=r, nnodes=nnodes, port=port, epoch=1)
    assert set(ref.wait_all().values()) == {0}, ref.logs()
    return torch.load(ref.out / "final.pt", weights_only=True)


def test_a_lost_pod_is_replaced_and_the_survivors_stay(tmp_path: Path) -> None:
    pods = Pods(tmp_path / "run")
    port = free_port()
    for r in range(4):
        pods.start(f"pod{r}", node_rank=r, nnodes=4, port=port, epoch=1)
    survivors = {f"pod{r}": pods.pods[f"pod{r}"] for r in range(3)}
    pods.wait_steps(1, 12)
    lost_at = pods.lose("pod3")
    new_port = free_port()
    for r in range(3):
        pods.announce(f"pod{r}", epoch=2, nnodes=4, nodeRank=r, masterPort=new_port)
    pods.start("pod3-new", node_rank=3, nnodes=4, port=new_port, epoch=2)
    codes = pods.wait_all()
    assert set(codes.values()) == {0}, pods.logs()
    for name, proc in survivors.items():  # the same agent processes, from start to end
        assert pods.pods[name] is proc and proc.returncode == 0
        assert "restarted in place" in (pods.tmp / f"{name}.log").read_text()
    recovery = max(pods.first_step(2, r) for r in range(3)) - lost_at
    print(f"\nloss -> every surviving rank trained a step again: {recovery:.2f} s")
    assert_exactly_once(pods, STEPS)
    final = torch.load(pods.out / "final.pt", weights_only=True)
    expected = reference_weights(tmp_path, 4)
    for part in ("model",):
        for key, value in expected[part].items():
            assert torch.equal(final[part][key], value), key
    assert final["optim"]["state"].keys() == expected["optim"]["state"].keys()
    for idx, st in expected["optim"]["state"].items():
        assert torch.equal(final["optim"]["state"][idx]["momentum_buffer"], st["momentum_buffer"])


def test_a_shrink_then_a_grow_keep_the_survivors(tmp_path: Path) -> None:
    steps = 150  # the new pod's standby start must fit inside the run
    pods = Pods(tmp_path, steps=steps)
    port = free_port()
    for r in range(3):
        pods.start(f"pod{r}", node_rank=r, nnodes=3, port=port, epoch=1)
    staying = {f"pod{r}": pods.pods[f"pod{r}"] for r in range(2)}
    pods.wait_steps(1, 8)
    pods.lose("pod2")  # shrink: no replacement, the two others go on as a gang of 2
    port2 = free_port()
    for r in range(2):
        pods.announce(f"pod{r}", epoch=2, nnodes=2, nodeRank=r, masterPort=port2)
    pods.wait_steps(2, pods.steps_done(2) + 6)
    # grow as the operator does it (a warm join): the new pod starts in standby and says so;
    # the gang of 2 trains on meanwhile; then every pod is told, the old ones with stop: save
    port3 = free_port()
    pods.start("pod2-new", node_rank=2, nnodes=3, port=port3, epoch=3, RTJ_STANDBY="1")
    standby_log = tmp_path / "pod2-new.log"
    end = time.monotonic() + 120
    while "standby for membership epoch 3" not in standby_log.read_text():
        assert time.monotonic() < end, pods.logs()
        time.sleep(0.1)
    warm_at = pods.steps_done(2)
    pods.wait_steps(2, warm_at + 3)  # training goes on while the new pod waits, warm
    assert pods.steps_done(3) == 0 and not (pods.out / "steps-3-2.txt").exists()
    grown_from = pods.steps_done(2)
    for r in range(2):
        pods.announce(f"pod{r}", epoch=3, nnodes=3, nodeRank=r, masterPort=port3, stop="save")
    pods.announce("pod2-new", epoch=3, nnodes=3, nodeRank=2, masterPort=port3)
    codes = pods.wait_all()
    assert set(codes.values()) == {0}, pods.logs()
    for name, proc in staying.items():
        assert pods.pods[name] is proc and proc.returncode == 0
    assert_exactly_once(pods, steps)
    # The agents preload torch._inductor after their first fork: the first workers start
    # without it, every worker restarted in place and the warm spare's worker have it.
    inherited = {p.name: p.read_text() for p in pods.out.glob("inherited-*")}
    assert inherited["inherited-1-0"] == "" and inherited["inherited-1-1"] == "", inherited
    for name in ("inherited-2-0", "inherited-2-1", "inherited-3-0", "inherited-3-2"):
        assert inherited[name] == "torch._inductor", inherited
    epoch2 = [int(x.split()[1]) for x in (pods.out / "steps-2-0.txt").read_text().splitlines()]
    epoch3 = [int(x.split()[1]) for x in (pods.out / "steps-3-0.txt").read_text().splitlines()]
    assert len(epoch2) >= grown_from
    # the save on the way out committed the last step: the grown gang goes on from the next one
    assert epoch3[0] == epoch2[-1] + 1, (epoch2, epoch3)


def test_a_survivor_without_a_new_membership_gives_up_with_the_worker_code(
    tmp_path: Path,
) -> None:
    pods = Pods(tmp_path, steps=400)
    port = free_port()
    for r in range(2):
        pods.start(f"pod{r}", node_rank=r, nnodes=2, port=port, epoch=1, RTJ_REJOIN_SECONDS="3")
    pods.wait_steps(1, 3)
    lost_at = pods.lose("pod1")
    code = pods.pods["pod0"].wait(120)
    waited = time.time() - lost_at
    assert code != 0, pods.logs()
    assert 3 <= waited < 60, waited
    assert "waiting up to 3 s for a new membership" in (tmp_path / "pod0.log").read_text()


def test_an_older_gang_cannot_commit_once_a_newer_one_claimed_the_run(tmp_path: Path) -> None:
    pods = Pods(tmp_path, steps=2000, step_s=0.05)
    old_port = free_port()
    for r in range(2):
        pods.start(f"old{r}", node_rank=r, nnodes=2, port=old_port, epoch=1)
    pods.wait_steps(1, 12)  # the old gang has committed
    # A new gang (epoch 2) starts on the same run while the old one is still training: the old
    # one is partitioned from the operator and did not get its kill.
    new = Pods(tmp_path / "new", steps=2000, step_s=0.05)
    new.folder, new.args[1] = pods.folder, str(pods.folder)
    new_port = free_port()
    for r in range(2):
        new.start(f"new{r}", node_rank=r, nnodes=2, port=new_port, epoch=2)
    new.wait_steps(2, 12)
    claimed = (pods.folder / "fence.json").stat().st_mtime
    old_codes = [pods.pods[f"old{r}"].wait(120) for r in range(2)]
    assert all(c != 0 for c in old_codes), pods.logs()
    assert "StaleMembershipError" in pods.logs()
    for proc in new.pods.values():
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    run = pods.folder
    for manifest_path in run.glob("*/manifest.json"):
        manifest = Manifest.from_json(manifest_path.read_text())
        if manifest.extra.get("membershipEpoch") == 1:
            assert manifest_path.stat().st_mtime < claimed, manifest.name
    pointer = json.loads((run / "latest.json").read_text())["checkpoint"]
    newest = Manifest.from_json((run / pointer / "manifest.json").read_text())
    assert newest.extra["membershipEpoch"] == 2
