"""The spot story on real nodes: its set-up, its job and its checks.

The story itself is the one every cluster runs (``tools/stories/spot.py``), here over kubelets
and containerd (``tools.spotcluster.RealNodeCluster``). ``run`` sets it up as the real-node e2e
test (``tests/realnodes/test_job_story.py``) and ``make demo NODES=real``
(``examples/demo_cluster.py --nodes real``) both run it.

The operator runs as the chart's Deployment pod (operator image), pinned to the node without the
runtime image, which no story loses (as one runs it on on-demand capacity: an operator lost with
the rank's node comes back by itself, but never sees the rank pod's last state, so its record of
the interruption cannot name the node); the job's rank runs from the runtime image under a real
kubelet, which delivers SIGTERM, waits out the grace period and SIGKILLs. Checkpoints go to a
hostPath folder that every node of this one-machine cluster sees at the same place (a shared
filesystem, as NFS or a ReadWriteMany volume would be).

The job may run on the nodes that hold the runtime image only (two of them), and the story picks
where it lands by cordoning the other one. Each interruption moves the job to the other node:

* ``notice`` (a graceful node shutdown): the node gets a termination taint and a cordon, as a
  drain does; the operator writes the notice and the runtime checkpoints at once; then the pod is
  stopped as the kubelet's graceful shutdown stops it (SIGTERM, grace period: a last save at the
  step reached); the next attempt resumes at exactly that step;
* ``lost``: the node's kubelet, containerd and containers are SIGKILLed and its Node deleted; the
  next attempt resumes from the last committed checkpoint. A lost node does not come back, so
  ``lost`` can only be the last interruption.

What the story reports comes from structured sources only: the job's status (the operator) and
the runtime's ``rtj-event`` lines as ``kubectl logs`` shows them (``trainer_runtime.events``),
never log wording. ``verdicts`` turns it into the checks both the test and the demo apply.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rtj_operator.api import names
from tools.localstack import start_reference_run, weights_equal
from tools.realnodes import NODES_DIR, RealCluster, Say, operator_release
from tools.spotcluster import LOST, NOTICE, RealNodeCluster
from tools.stories import Check
from tools.stories.spot import SpotStory, StoryResult, check_interruptions, describe

JOB = "story"
TRAINING = [
    "--epochs=3",
    "--dataset-size=64",
    "--batch-size=4",
    "--interval=4ba",
    "--workers=0",
]
TOTAL_STEPS = 3 * 64 // 4
STEP_SLEEP = "--step-sleep=1.0"
INTERRUPTIONS = (NOTICE, LOST)
GRACE_PERIOD_S = 20


def _quiet(_line: str) -> None:
    return None


@contextmanager
def shared_folder(ns: str) -> Iterator[Path]:
    """A host folder every node mounts alike (hostPath), writable by the image's user 1000."""
    root = NODES_DIR / f"shared-{ns}"
    for sub in ("checkpoints", "results"):
        (root / sub).mkdir(parents=True, exist_ok=True)
        os.chown(root / sub, 1000, 1000)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def job_manifest(ns: str, image: str, shared: Path, nodes: list[str]) -> dict[str, Any]:
    """The ResumableTrainingJob: one rank of the example trainer, pinned to ``nodes``."""
    host = {"type": "Directory"}
    node_term = {
        "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]
    }
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": JOB, "namespace": ns},
        "spec": {
            "replicas": 1,
            "checkpoint": {
                "dir": "/checkpoints",
                "volumeSource": {"hostPath": {"path": str(shared / "checkpoints"), **host}},
            },
            "template": {
                "spec": {
                    "terminationGracePeriodSeconds": GRACE_PERIOD_S,
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [node_term]
                            }
                        }
                    },
                    "containers": [
                        {
                            "name": "trainer",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "workingDir": "/app",
                            "command": [
                                "python",
                                "/app/examples/train_deterministic.py",
                                *TRAINING,
                                STEP_SLEEP,
                                "--out=/results/final.pt",
                            ],
                            "volumeMounts": [{"name": "results", "mountPath": "/results"}],
                        }
                    ],
                    "volumes": [
                        {
                            "name": "results",
                            "hostPath": {"path": str(shared / "results"), **host},
                        }
                    ],
                }
            },
        },
    }


def run(
    cluster: RealCluster,
    ns: str,
    shared: Path,
    workdir: Path,
    interruptions: Sequence[str] = INTERRUPTIONS,
    *,
    say: Say = _quiet,
) -> StoryResult:
    """The spot story (``tools/stories/spot.py``) on real nodes, with the operator installed by
    helm on the steady node and an uninterrupted run of the same script as a local process."""
    check_interruptions(interruptions)
    a, b = (cluster.node(i) for i in cluster.runtime_nodes[:2])
    manifest = job_manifest(ns, cluster.images["runtime"], shared, [a, b])
    workdir.mkdir(parents=True, exist_ok=True)
    job_file = workdir / "job.json"
    job_file.write_text(json.dumps(manifest))
    say("meanwhile: the same script runs uninterrupted as a plain local process")
    reference = start_reference_run(job_file, workdir / "reference")
    nodes = RealNodeCluster(cluster, ns, shared, (a, b))
    story = SpotStory(
        nodes, manifest, JOB, rank=0, say=say, lose_after_step=0, notice_delay_s=0, timeout=300
    )
    try:
        steady = cluster.steady_node
        with operator_release(cluster, ns, node=steady):
            say(
                f"operator installed by helm on {steady} (never lost); job {JOB} applied, "
                f"pinned to {a} and {b}"
            )
            result = story.run(interruptions)
    finally:
        nodes.clean_up(JOB)
    try:
        result.reference = reference.wait()
    finally:
        reference.kill()
    return result


def verdicts(result: StoryResult) -> list[Check]:
    """What the story must show; the test asserts every one, the demo prints them."""
    status = result.status
    records = status.get("interruptions") or []
    checks = [
        Check(
            "job succeeded",
            status.get("phase") == "Succeeded",
            f"phase {status.get('phase')}, last checkpoint at step "
            f"{(status.get('lastCommittedCheckpoint') or {}).get('step')} of {TOTAL_STEPS}",
        ),
        Check(
            "counted as preemptions",
            status.get("preemptions") == len(result.interruptions)
            and status.get("failures") == 0
            and len(records) == len(result.interruptions),
            f"preemptions {status.get('preemptions')}, failures {status.get('failures')}",
        ),
    ]
    for i, (seen, after) in enumerate(zip(result.interruptions, result.attempts[1:], strict=True)):
        record = records[i] if i < len(records) else {}
        step = after.resumed_step
        checks.append(
            Check(
                f"{seen.kind} of {seen.node}: operator's record",
                record.get("preemption") is True
                and record.get("node") == seen.node
                and (
                    seen.kind == LOST
                    or (record.get("stepsLost") == 0 and record.get("exitCode") in (None, 143))
                ),
                f"preemption {record.get('preemption')}, node {record.get('node')}, "
                f"steps lost {record.get('stepsLost')}, exit code {record.get('exitCode')}",
            )
        )
        if seen.kind == NOTICE:
            kinds = [e.type for e in seen.notice_events]
            checks.append(
                Check(
                    "notice: the runtime saved at once (kubectl logs)",
                    "notice" in kinds and "committed" in kinds,
                    f"events {kinds}",
                )
            )
        checks.append(
            Check(
                f"attempt {after.number} resumed on another node (kubectl logs)",
                after.node != seen.node and step is not None and step >= seen.committed_before,
                f"on {after.node}, {describe(after)}; "
                f"last committed before: {seen.committed_before}",
            )
        )
    equal, why = (
        weights_equal(result.weights, result.reference)
        if result.weights.exists() and result.reference is not None
        else (False, "no final weights written")
    )
    checks.append(Check("final weights equal an uninterrupted run", equal, why))
    return checks
