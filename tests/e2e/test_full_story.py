"""The full story on the local control plane: a spot node goes, the job carries on by itself.

Installed as a user would (the Helm chart; the operator on the chart's ServiceAccount and
arguments), a 2-rank ``ResumableTrainingJob`` (``manifests/spot-job.yaml``) checkpoints to S3
(MinIO) from pods that the pod runner runs as real processes. Midway, the node of rank 1 goes:

* **reclaim**: without notice (Node deleted, its processes SIGKILLed). The operator resubmits the
  gang at once; the new gang, on other nodes with empty local disks, resumes from S3 at the last
  committed checkpoint.
* **notice**: a termination taint first. The operator writes the notice, the runtime saves at
  once; then the node shuts down (SIGTERM, grace period: a last save) and its Node is deleted.
  The new gang resumes at the exact step the old one reached: no step is lost.

Either way the job Succeeds, status shows one preemption, the step resumed from and the steps
lost, and the final weights are bitwise equal to an uninterrupted run of the same script.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tools.localstack import (
    LocalStack,
    ReferenceRun,
    committed_steps,
    emergency_save,
    fetched_from,
    interval_steps,
    resumed_step,
    training_command,
    weights_equal,
)
from tools.spotcluster import LOST, NOTICE, PodRunnerCluster
from tools.stories.spot import SpotStory, StoryResult

from .conftest import MANIFEST, say

pytestmark = pytest.mark.cluster

Obj = dict[str, Any]
INTERVAL = interval_steps(MANIFEST)


def total_steps() -> int:
    """Steps of the whole run, from the manifest's arguments (epochs x steps per epoch)."""
    args = dict(
        a.removeprefix("--").split("=", 1)
        for a in training_command(MANIFEST)
        if a.startswith("--") and "=" in a
    )
    per_step = int(args["batch-size"]) * 2  # 2 ranks
    return int(args["epochs"]) * (int(args["dataset-size"]) // per_step)


def run_story(stack: LocalStack, job: str, lose: str) -> StoryResult:
    """One job, the node of rank 1 lost (``lost`` or ``notice``); narrated to stdout."""
    stack.ensure_nodes(3)
    started = time.monotonic()
    result = SpotStory(PodRunnerCluster(stack), MANIFEST, job, say=say).run([lose])
    say(f"{job}: {lose} story done in {time.monotonic() - started:.1f}s")
    return result


def check_common(stack: LocalStack, result: StoryResult, reference: ReferenceRun) -> Obj:
    """What both stories end with; the single interruption."""
    status = result.status
    assert status["phase"] == "Succeeded", result.diagnostics
    assert status["attempt"] == 1, "exactly one resubmission"
    assert status["preemptions"] == 1 and status["failures"] == 0, status
    assert status["lastCommittedCheckpoint"]["step"] == total_steps()
    (interruption,) = status["interruptions"]
    assert interruption["preemption"] is True and interruption["rank"] == 1
    assert interruption["node"] == result.lost_node and interruption["attempt"] == 0
    assert interruption["lastCommittedStep"] is not None
    assert interruption["stepsLost"] is not None and interruption["stepsLost"] >= 0

    # The new gang ran elsewhere and fetched its checkpoint from the object store (its local
    # staging folder is a fresh emptyDir on another node: there was nothing else to resume from).
    new_nodes = {p["spec"]["nodeName"] for p in stack.pods(result.job, 1)}
    assert result.lost_node not in new_nodes, new_nodes
    resumed = resumed_step(result.logs[1])
    source = fetched_from(result.logs[1]) or ""
    assert resumed is not None, result.logs[1][-2000:]
    assert source.startswith(f"s3://{stack.cfg.bucket}/runs/{result.job}/"), source
    assert source.endswith(f"-ba{resumed}")
    objects = stack.s3.client().list_objects_v2(
        Bucket=stack.cfg.bucket, Prefix=f"runs/{result.job}/{source.rsplit('/', 1)[1]}/"
    )
    names = {o["Key"].rsplit("/", 1)[1] for o in objects.get("Contents", [])}
    # Format version 2: one data file per rank, DCP's .metadata, the manifest committed last.
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "manifest.json"} <= names, names

    # What kubectl get rtj shows of the finished job: all of its steps (the example trainer
    # passes its epochs, the job's total work) and, with no gang training, its state as the ETA.
    table = stack.kubectl("get", "rtj", result.job, "-n", stack.cfg.namespace)
    header, row = table.splitlines()[:2]
    columns = dict(zip(header.split(), row.split(), strict=False))
    assert columns["PROGRESS"] == "100%" and columns["ETA"] == "Succeeded", table

    equal, why = weights_equal(reference.wait(), result.weights)
    assert equal, f"final weights differ from the uninterrupted run: {why}"
    say(
        f"{result.job}: final weights equal to the uninterrupted run's ({why}); interruption: "
        f"{interruption['cause']}, last committed step {interruption['lastCommittedStep']}, "
        f"steps lost {interruption['stepsLost']}, resumed at step {resumed}"
    )
    return interruption


def test_spot_reclaim_resumes_from_s3_with_identical_weights(
    stack: LocalStack, reference: ReferenceRun
) -> None:
    result = run_story(stack, "reclaim", LOST)
    interruption = check_common(stack, result, reference)
    assert interruption["cause"] == "NodeDeleted"
    # Killed right after a commit seen in status: that commit is the interruption's and the
    # resume point, and the operator's count of lost steps stays under one interval.
    (loss,) = result.interruptions
    assert interruption["lastCommittedStep"] == loss.committed_before
    assert resumed_step(result.logs[1]) == loss.committed_before
    assert result.attempts[1].resumed_step == loss.committed_before
    assert interruption["stepsLost"] < INTERVAL
    assert loss.committed_before % INTERVAL == 0


def test_termination_notice_saves_at_once_and_loses_no_steps(
    stack: LocalStack, reference: ReferenceRun
) -> None:
    result = run_story(stack, "notice", NOTICE)
    (loss,) = result.interruptions
    assert loss.notice is not None
    name, step = loss.notice
    # The operator passed the taint on (event and condition history), the runtime saved at
    # once, and the operator learned of that checkpoint before the node went.
    reasons = {e.get("reason") for e in stack.events(result.job)}
    assert "PreemptionNotice" in reasons, reasons
    before = loss.status_before
    assert name in {k["name"] for k in before["knownCheckpoints"]}, before
    assert any(
        c["type"] == "PreemptionNotice" and c["status"] == "True" for c in before["conditions"]
    ), before["conditions"]
    off_interval = step % INTERVAL != 0
    say(
        f"notice checkpoint {name} at step {step}: "
        f"{'not ' if off_interval else ''}a multiple of the {INTERVAL}-step interval"
    )

    interruption = check_common(stack, result, reference)
    assert interruption["cause"] == "NodeShutdown"
    assert interruption["stepsLost"] == 0
    # No step lost, in fact and not only in status: the old gang saved on SIGTERM at the step it
    # had reached and exited; the new gang resumed at exactly that step.
    # All of it read from the runtime's events (rtj-event lines), not from its log wording.
    old = committed_steps(result.logs[0])
    saved = emergency_save(result.logs[0])
    assert saved is not None, result.logs[0][-2000:]
    assert saved[0] in (old[-1][0], None), (saved, old)  # None: the step was saved already
    assert resumed_step(result.logs[1]) == old[-1][1] >= step, (old, result.logs[1][-1500:])
