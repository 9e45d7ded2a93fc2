"""A loss without notice loses at most the running step: a survivor saves the last finished one
from its memory (trainer_runtime/save/survivor.py, docs/survivors.md), with real processes and
real signals.

Each "pod" is ``python -m trainer_runtime.agent -- python survivor_worker.py`` in its own
session; the test plays the operator's part (each kept pod's membership file, the replacement
pod). The run commits nothing on its own (``--interval 1000ba``), so whatever the new gang
resumes from was saved from a survivor's memory; with ``RTJ_SURVIVOR_SAVE=0`` the same loss
sends it back to step 0. Shown: the new gang goes on from the step after the last one every rank
finished, its weights are bitwise those of an uninterrupted run, every step's samples are trained
exactly once; and the same when the lost pod is cut off rather than killed (its connections stay
open, the survivors' collective hangs instead of failing, and the save is made while the
training thread is stuck in it).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

from tests.multiproc.test_survivors import assert_exactly_once
from tools.agentpods import Pods
from tools.ports import free_port
from trainer_runtime import Manifest

pytestmark = [
    pytest.mark.multiproc,
    pytest.mark.skipif(sys.platform != "linux", reason="gloo multi-process on Linux"),
]
STEPS = 30


def gang(tmp: Path, **env: str) -> Pods:
    """Three pods of a run that never commits by itself."""
    pods = Pods(tmp, steps=STEPS)
    pods.args += ["--interval", "1000ba"]
    port = free_port()
    for r in range(3):
        pods.start(f"pod{r}", node_rank=r, nnodes=3, port=port, epoch=1, **env)
    return pods


def replace_lost_pod(pods: Pods, *, writer_first: bool = False, **told: object) -> None:
    """The operator's part: the two kept pods are told the new gang (stop: kill, the default)
    and a new pod takes the lost one's place.

    ``told``: more fields of the membership (``savers``).
    ``writer_first``: pod1 hears of the new gang only once pod0 (the writer) has saved. The
    operator tells both at once; then pod1's agent may stop its workers before pod0's save
    begins, and pod0's stuck all-reduce fails on the closed connection instead of hanging (the
    save is still made, by the failed-collective path). A test of the hanging path orders them.
    """
    port = free_port()
    for r in range(2):
        if r == 1 and writer_first:
            wait_for_line(pods.tmp / "pod0.log", '"type":"survivor_saved"')
        pods.announce(f"pod{r}", epoch=2, nnodes=3, nodeRank=r, masterPort=port, **told)
    pods.start("pod2-new", node_rank=2, nnodes=3, port=port, epoch=2, RTJ_SURVIVOR_SAVE="0")


def wait_for_line(log: Path, text: str, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        assert time.monotonic() < end, log.read_text(errors="replace")[-2500:]
        time.sleep(0.1)


def reference_weights(tmp: Path) -> dict:
    ref = Pods(tmp / "reference", steps=STEPS)
    port = free_port()
    for r in range(3):
        ref.start(f"pod{r}", node_rank=r, nnodes=3, port=port, epoch=1)
    assert set(ref.wait_all().values()) == {0}, ref.logs()
    return torch.load(ref.out / "final.pt", weights_only=True)


def assert_same_weights(pods: Pods, tmp: Path) -> None:
    final = torch.load(pods.out / "final.pt", weights_only=True)
    expected = reference_weights(tmp)
    for key, value in expected["model"].items():
        assert torch.equal(final["model"][key], value), key
    for idx, st in expected["optim"]["state"].items():
        assert torch.equal(final["optim"]["state"][idx]["momentum_buffer"], st["momentum_buffer"])


def survivor_checkpoints(pods: Pods, world_size: int = 1) -> list[Manifest]:
    """The checkpoints written for the new gang (epoch 2) from the survivors' memory."""
    return [
        m
        for m in (Manifest.from_json(p.read_text()) for p in pods.folder.glob("*/manifest.json"))
        if m.world_size == world_size and m.extra.get("membershipEpoch") == 2
    ]


@pytest.mark.parametrize("save", ["on", "off"])
def test_a_loss_without_notice_loses_at_most_the_running_step(tmp_path: Path, save: str) -> None:
    env = {} if save == "on" else {"RTJ_SURVIVOR_SAVE": "0"}
    pods = gang(tmp_path / "run", **env)
    pods.wait_steps(1, 10)
    pods.lose("pod2")
    replace_lost_pod(pods)
    codes = pods.wait_all()
    assert set(codes.values()) == {0}, (codes, pods.logs())
    finished = pods.steps(1)[-1]  # the last step rank 0 took part in before the loss
    resumed_at = pods.steps(2)[0]
    log = (pods.tmp / "pod0.log").read_text()
    if save == "off":
        assert resumed_at == 0, pods.logs()  # nothing was committed: everything is lost
        assert "saved step" not in log
        return
    print(f"\nlast step before the loss: {finished}; the new gang's first step: {resumed_at}")
    # at most the running step is trained again
    assert resumed_at >= finished, (finished, resumed_at, pods.logs())
    assert f"saved step {resumed_at} from this survivor's memory" in log, log
    assert "saved step" not in (pods.tmp / "pod1.log").read_text()  # one writer
    (manifest,) = survivor_checkpoints(pods)
    assert manifest.timestamp.batch == resumed_at
    assert manifest.extra["membershipEpoch"] == 2  # written for the new gang
    assert_exactly_once(pods, STEPS)
    assert_same_weights(pods, tmp_path)


def test_a_survivor_saves_while_its_collective_hangs_on_a_pod_cut_off(tmp_path: Path) -> None:
    pods = gang(tmp_path / "run")
    pods.wait_steps(1, 10)
    pods.cut_off("pod2")  # stopped, not dead: the others' all-reduce waits for it
    before = pods.steps_done(1)
    replace_lost_pod(pods, writer_first=True)
    assert set(pods.wait_all().values()) == {0}, pods.logs()
    log = (pods.tmp / "pod0.log").read_text()
    resumed_at = pods.steps(2)[0]
    assert "a collective failed" not in log  # nothing failed: the training thread was stuck
    assert f"saved step {resumed_at} from this survivor's memory" in log, log
    assert resumed_at >= before - 1, (before, resumed_at)
    assert_exactly_once(pods, STEPS)
    assert_same_weights(pods, tmp_path)


@pytest.mark.parametrize("how", ["killed", "cut off"])
def test_a_large_state_is_saved_in_shares_by_every_kept_pod(tmp_path: Path, how: str) -> None:
    """``savers: 2`` and a replica over RTJ_SURVIVOR_SPLIT_MIB (0 here): both kept pods write a
    share of the last finished step, one checkpoint at world size 2, and the new gang resumes
    from it as from any commit. Also when the lost pod is cut off: the savers leave a process
    group whose all-reduce still hangs in their training threads."""
    pods = gang(tmp_path / "run", RTJ_SURVIVOR_SPLIT_MIB="0")
    pods.wait_steps(1, 10)
    if how == "killed":
        pods.lose("pod2")
    else:
        pods.cut_off("pod2")
    replace_lost_pod(pods, savers=2)
    assert set(pods.wait_all().values()) == {0}, pods.logs()
    finished, resumed_at = pods.steps(1)[-1], pods.steps(2)[0]
    assert resumed_at >= finished, (finished, resumed_at, pods.logs())
    (manifest,) = survivor_checkpoints(pods, world_size=2)
    assert manifest.timestamp.batch == resumed_at
    data = {e.rank for e in manifest.files if e.path.endswith(".distcp")}
    assert data == {0, 1}, manifest.files  # each saver wrote a share
    for r in range(2):
        log = (pods.tmp / f"pod{r}.log").read_text()
        assert f"saved step {resumed_at} from this survivor's memory as {manifest.name}" in log
    assert not survivor_checkpoints(pods, world_size=1)
    assert_exactly_once(pods, STEPS)
    assert_same_weights(pods, tmp_path)


def test_savers_that_do_not_meet_leave_the_save_to_node_rank_0(tmp_path: Path) -> None:
    """pod1 hears of the new gang only after pod0 gave up waiting for it (RTJ_REJOIN_SECONDS
    of 3 s there): pod0 saves alone, pod1 saves nothing, and nothing is lost."""
    pods = Pods(tmp_path / "run", steps=STEPS)
    pods.args += ["--interval", "1000ba"]
    rejoin = ["3", "20", "20"]
    pods.start_gang(
        3,
        port=free_port(),
        each=lambda r: {"RTJ_REJOIN_SECONDS": rejoin[r]},
        RTJ_SURVIVOR_SPLIT_MIB="0",
    )
    pods.wait_steps(1, 10)
    pods.lose("pod2")
    replace_lost_pod(pods, writer_first=True, savers=2)
    assert set(pods.wait_all().values()) == {0}, pods.logs()
    resumed_at = pods.steps(2)[0]
    (manifest,) = survivor_checkpoints(pods, world_size=1)
    assert manifest.timestamp.batch == resumed_at
    assert "the 2 savers do not save together" in (pods.tmp / "pod0.log").read_text()
    pod1 = (pods.tmp / "pod1.log").read_text()
    assert "node rank 0 saves alone" in pod1 and "saved step" not in pod1
    assert_exactly_once(pods, STEPS)
    assert_same_weights(pods, tmp_path)
