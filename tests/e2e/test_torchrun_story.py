"""The spot story with 2 pods x 2 processes, each pod's processes started by a flagless torchrun.

The job (``manifests/torchrun-job.yaml``, ``processesPerPod: 2``) runs through the operator
(installed from the Helm chart, as in ``test_full_story.py``) on pod-runner nodes; the container
command is ``torchrun examples/train_deterministic.py ...`` with no rendezvous flags, so the
gang of 4 ranks meets only through the ``PET_*`` variables the operator injects. Midway, the node
of pod 1 (global ranks 2 and 3) goes:

* **notice**: a termination taint first. The operator writes the notice, all 4 ranks save at
  the step reached; then the node shuts down: SIGTERM to torchrun, which forwards it to its
  workers, a last save inside the grace period. torchrun exits 1, yet the operator counts a
  preemption, not a failure, and the new gang resumes at the exact step: no step lost.
* **shutdown**: the node shuts down without notice: the SIGTERM torchrun forwards is the only
  warning; the workers make the emergency save and the new gang resumes.

Either way the job Succeeds with one preemption and no failure, on other nodes, from S3, and the
final weights are compared bit for bit with an uninterrupted run of the same script at world
size 4 (``check_weights``: equal at that size too, see there).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tools.localstack import (
    LocalStack,
    ReferenceRun,
    committed_steps,
    fetched_from,
    interval_steps,
    resumed_step,
    training_command,
    weights_equal,
)
from tools.spotcluster import NOTICE, SHUTDOWN, PodRunnerCluster
from tools.stories.spot import SpotStory, StoryResult
from tools.stories.torchrun import container_exit, start_reference_run, world_size
from trainer_runtime import events

from .conftest import say

pytestmark = pytest.mark.cluster

Obj = dict[str, Any]
MANIFEST = Path(__file__).parent / "manifests" / "torchrun-job.yaml"
INTERVAL = interval_steps(MANIFEST)
WORLD = world_size(MANIFEST)
TORCHRUN_AFTER_SIGTERM = 1
"""torchrun's exit after its workers saved on SIGTERM: it re-raises the signal as
``SignalException`` and exits 1 (docs/operator.md, "SIGTERM and the grace period")."""


@pytest.fixture(scope="module")
def reference(
    prerequisites: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ReferenceRun]:
    """The same training uninterrupted at world size 4 (overrides the conftest's 2-rank one,
    which the ``stack`` fixture starts first)."""
    run = start_reference_run(MANIFEST, tmp_path_factory.mktemp("reference"))
    yield run
    run.kill()


def total_steps() -> int:
    """Steps of the whole run: epochs x (dataset size / (batch size x world size))."""
    args = dict(
        a.removeprefix("--").split("=", 1)
        for a in training_command(MANIFEST)
        if a.startswith("--") and "=" in a
    )
    return int(args["epochs"]) * (int(args["dataset-size"]) // (int(args["batch-size"]) * WORLD))


def run_story(stack: LocalStack, job: str, lose: str) -> StoryResult:
    """One job, one lost node; narrated to stdout with its wall time."""
    stack.ensure_nodes(3)
    started = time.monotonic()
    result = SpotStory(PodRunnerCluster(stack), MANIFEST, job, say=say).run([lose])
    say(f"{job}: {lose} story done in {time.monotonic() - started:.1f}s")
    return result


def check_common(stack: LocalStack, result: StoryResult, reference: ReferenceRun) -> Obj:
    """What both stories end with: one preemption of pod 1, a resume from S3 on other nodes,
    torchrun's exits, the weights of the uninterrupted run."""
    status = result.status
    assert status["phase"] == "Succeeded", (status, result.diagnostics)
    assert status["attempt"] == 1, "exactly one resubmission"
    assert status["preemptions"] == 1 and status["failures"] == 0, status
    assert status["lastCommittedCheckpoint"]["step"] == total_steps()
    assert status["lastCommittedCheckpoint"]["worldSize"] == WORLD
    (interruption,) = status["interruptions"]
    assert interruption["preemption"] is True and interruption["rank"] == 1, interruption
    assert interruption["node"] == result.lost_node and interruption["attempt"] == 0
    assert interruption["cause"] == "NodeShutdown", interruption
    assert interruption["lastCommittedStep"] is not None
    assert interruption["stepsLost"] is not None and interruption["stepsLost"] >= 0

    # torchrun in the lost pod forwarded SIGTERM: both its workers (global ranks 2 and 3) made
    # the emergency save and exited; torchrun itself exited 1, which the operator did not count
    # as a failure (above).
    lost_pod = f"{result.job}-a0-r1"
    old_pod1 = stack.pod_log(lost_pod)
    assert len(events.read_events(old_pod1, events.EMERGENCY_SAVED)) >= 2, old_pod1[-3000:]
    assert "SignalException" in old_pod1 or "Received 15 death signal" in old_pod1, old_pod1[-3000:]
    assert container_exit(stack, result.lost_node, lost_pod) == TORCHRUN_AFTER_SIGTERM

    # The new gang ran elsewhere and fetched its checkpoint from the object store.
    new_pods = stack.pods(result.job, 1)
    new_nodes = {p["spec"]["nodeName"] for p in new_pods}
    assert len(new_pods) == 2 and result.lost_node not in new_nodes, new_nodes
    resumed = resumed_step(result.logs[1])
    source = fetched_from(result.logs[1]) or ""
    assert resumed is not None, result.logs[1][-2000:]
    assert source.startswith(f"s3://{stack.cfg.bucket}/runs/{result.job}/"), source
    assert source.endswith(f"-ba{resumed}")
    # Both local ranks of each new pod resumed at the same step as rank 0.
    for pod in (f"{result.job}-a1-r0", f"{result.job}-a1-r1"):
        log = stack.pod_log(pod)
        steps = [int(e["step"]) for e in events.read_events(log, events.RESUMED)]
        assert steps == [resumed, resumed], (pod, steps, log[-2000:])
    objects = stack.s3.client().list_objects_v2(
        Bucket=stack.cfg.bucket, Prefix=f"runs/{result.job}/{source.rsplit('/', 1)[1]}/"
    )
    names = {o["Key"].rsplit("/", 1)[1] for o in objects.get("Contents", [])}
    # Format version 2, saved by 4 ranks: one data file per rank, .metadata, the manifest.
    expected = {f"__{r}_0.distcp" for r in range(WORLD)} | {".metadata", "manifest.json"}
    assert expected <= names, names

    say(
        f"{result.job}: interruption: {interruption['cause']}, last committed step "
        f"{interruption['lastCommittedStep']}, steps lost {interruption['stepsLost']}, "
        f"resumed at step {resumed}"
    )
    return interruption


def check_weights(result: StoryResult, reference: ReferenceRun) -> None:
    """The final weights against the uninterrupted run's, bit for bit, checked last.

    At world size 4 this holds because the example keeps DDP's first gradient-bucket layout for
    the whole run (``find_unused_parameters=True``); with DDP's default re-layout after the first
    step, the first step after a resume sums in another order and the weights differ in the last
    bits (docs/runtime.md, "Exact resume at more than two ranks").
    """
    equal, why = weights_equal(reference.wait(), result.weights)
    assert equal, f"final weights differ from the uninterrupted run at world size 4: {why}"
    say(f"{result.job}: final weights equal to the uninterrupted run's ({why})")


def test_notice_then_shutdown_through_torchrun_loses_no_steps(
    stack: LocalStack, reference: ReferenceRun
) -> None:
    result = run_story(stack, "tr-notice", NOTICE)
    (loss,) = result.interruptions
    assert loss.notice is not None
    name, step = loss.notice
    reasons = {e.get("reason") for e in stack.events(result.job)}
    assert "PreemptionNotice" in reasons, reasons
    before = loss.status_before
    assert name in {k["name"] for k in before["knownCheckpoints"]}, before
    # All four ranks saved on the notice: the notice checkpoint holds a data file of each.
    objects = stack.s3.client().list_objects_v2(
        Bucket=stack.cfg.bucket, Prefix=f"runs/{result.job}/{name}/"
    )
    files = {o["Key"].rsplit("/", 1)[1] for o in objects.get("Contents", [])}
    assert {f"__{r}_0.distcp" for r in range(WORLD)} <= files, files
    say(f"notice checkpoint {name} at step {step} (interval {INTERVAL})")

    interruption = check_common(stack, result, reference)
    assert interruption["stepsLost"] == 0
    # No step lost in fact: the old gang saved on SIGTERM at the step it had reached; the new
    # gang resumed at exactly that step.
    old = committed_steps(result.logs[0])
    assert events.read_events(result.logs[0], events.EMERGENCY_SAVED), result.logs[0][-2000:]
    assert resumed_step(result.logs[1]) == old[-1][1] >= step, (old, result.logs[1][-1500:])
    check_weights(result, reference)


def test_shutdown_without_notice_saves_through_torchrun_and_resumes(
    stack: LocalStack, reference: ReferenceRun
) -> None:
    result = run_story(stack, "tr-shutdown", SHUTDOWN)
    assert result.interruptions[0].notice is None
    interruption = check_common(stack, result, reference)
    # Without a notice the operator restarts the gang from the newest checkpoint it knew of when
    # the node began to shut down; the emergency save may land after that choice.
    assert interruption["stepsLost"] < INTERVAL
    resumed = resumed_step(result.logs[1])
    assert resumed is not None and resumed >= interruption["lastCommittedStep"], interruption
    old = [s for _, s in committed_steps(result.logs[0])]
    assert resumed in old, (resumed, old)
    check_weights(result, reference)
