"""The product end to end on real nodes: a spot node announces its end, another is lost outright.

The operator runs as the chart's Deployment pod (operator image); the job's rank runs from the
runtime image under a real kubelet, which delivers SIGTERM, waits out the grace period and
SIGKILLs; checkpoints go to a hostPath folder, which every node of this one-machine cluster sees
at the same place (a shared filesystem, as NFS or a ReadWriteMany volume would be).

The job may run on nodes 1 and 3 only, so the story decides where it lands by cordoning:

1. starts on node 1 (node 3 cordoned);
2. **graceful shutdown**: node 1 gets a termination taint (and a cordon, as a drain does); the
   operator writes the notice, the runtime checkpoints at once; then the kubelet stops the pod
   (SIGTERM, grace period: a last save at the step reached); the next attempt runs on node 3
   and resumes at exactly that step;
3. **node lost**: node 3's kubelet, containerd and containers are SIGKILLed and its Node
   deleted; the next attempt runs on node 1 and resumes from the last committed checkpoint.

The job Succeeds, status counts two preemptions and no failure, ``kubectl logs`` shows the
runtime's own lines, and the final weights are bitwise equal to an uninterrupted run of the same
script (same torch version: the image is built from the same ``uv.lock``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from .conftest import ROOT, RealCluster, operator_release, wait_for

JOB = "story"
NOTICE_TAINT = "karpenter.sh/disrupted=:NoSchedule"
TRAINING = [
    "--epochs=3",
    "--dataset-size=64",
    "--batch-size=4",
    "--interval=4ba",
    "--workers=0",
]
TOTAL_STEPS = 3 * 64 // 4
STEP_SLEEP = "--step-sleep=1.0"


@pytest.fixture
def shared(ns: str) -> Iterator[Path]:
    """A host folder every node mounts alike (hostPath); writable by the image's user 1000."""
    root = Path(os.environ.get("RTJ_NODES_DIR", "/var/lib/rtj-nodes")) / f"shared-{ns}"
    for sub in ("checkpoints", "results"):
        (root / sub).mkdir(parents=True, exist_ok=True)
        os.chown(root / sub, 1000, 1000)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def job_manifest(ns: str, image: str, shared: Path, nodes: list[str]) -> dict[str, Any]:
    host = {"type": "Directory"}
    return {
        "apiVersion": "resumable.dev/v1alpha1",
        "kind": "ResumableTrainingJob",
        "metadata": {"name": JOB, "namespace": ns},
        "spec": {
            "replicas": 1,
            "checkpoint": {
                "dir": "/checkpoints",
                "volumeSource": {"hostPath": {"path": str(shared / "checkpoints"), **host}},
            },
            "template": {
                "spec": {
                    "terminationGracePeriodSeconds": 20,
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "kubernetes.io/hostname",
                                                "operator": "In",
                                                "values": nodes,
                                            }
                                        ]
                                    }
                                ]
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


class Story:
    """Reads the job and its pods with kubectl, as a user would."""

    def __init__(self, cluster: RealCluster, ns: str) -> None:
        self.cluster = cluster
        self.ns = ns

    def status(self) -> dict[str, Any]:
        job = self.cluster.get("resumabletrainingjob", JOB, self.ns) or {}
        return job.get("status") or {}

    def committed_step(self) -> int:
        return (self.status().get("lastCommittedCheckpoint") or {}).get("step") or 0

    def running_pod(self, attempt: int) -> dict[str, Any] | None:
        """The job's pod of ``attempt`` once its trainer runs."""
        out = self.cluster.kubectl_run(
            "get", "pods", "-n", self.ns, "-l", f"resumable.dev/job-name={JOB}", "-o", "json"
        ).stdout
        for pod in json.loads(out)["items"]:
            labels = pod["metadata"].get("labels", {})
            attempt_label = labels.get("resumable.dev/attempt")
            if attempt_label is not None and int(attempt_label) != attempt:
                continue
            if pod["status"].get("phase") == "Running":
                return pod
        return None

    def wait_running(self, attempt: int, timeout: float = 240) -> dict[str, Any]:
        return wait_for(
            f"attempt {attempt} running",
            lambda: self.status().get("attempt", 0) == attempt and self.running_pod(attempt),
            timeout,
            interval=1,
        )

    def wait_committed(self, after: int, timeout: float = 180) -> int:
        return wait_for(
            f"a checkpoint committed after step {after}",
            lambda: (s := self.committed_step()) > after and s,
            timeout,
            interval=1,
        )

    def condition(self, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.status().get("conditions", []) if c["type"] == kind), None)


def reference_weights(workdir: Path) -> Path:
    """The same training, uninterrupted, as one local process (no sleep: it changes nothing)."""
    out = workdir / "reference.pt"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RTJ_", "KUBERNETES_")) and k not in ("RANK", "WORLD_SIZE")
    }
    env["PYTHONPATH"] = str(ROOT)
    script = str(ROOT / "examples" / "train_deterministic.py")
    where = ["--folder", str(workdir / "checkpoints"), "--run-name", "reference"]
    subprocess.run(
        [sys.executable, script, *TRAINING, *where, "--out", str(out)],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


def assert_bitwise_equal(got: Path, want: Path) -> None:
    left = torch.load(got, weights_only=True)
    right = torch.load(want, weights_only=True)
    assert left.keys() == right.keys()
    differ = [
        k
        for k in left
        if left[k].dtype != right[k].dtype
        or not torch.equal(left[k].view(-1).view(torch.uint8), right[k].view(-1).view(torch.uint8))
    ]
    assert not differ, f"tensors differ from the uninterrupted run: {differ}"


def test_a_job_survives_a_graceful_shutdown_and_a_lost_node_on_real_nodes(
    real_cluster: RealCluster, ns: str, shared: Path, tmp_path: Path
) -> None:
    node1, node3 = real_cluster.node(1), real_cluster.node(3)
    k = real_cluster.kubectl_run
    story = Story(real_cluster, ns)
    try:
        with operator_release(real_cluster, ns):
            k("cordon", node3)
            real_cluster.apply(
                job_manifest(ns, real_cluster.images["runtime"], shared, [node1, node3])
            )
            first = story.wait_running(0)
            assert first["spec"]["nodeName"] == node1

            # 2. Graceful shutdown of node 1: notice first, then the kubelet's SIGTERM.
            before_notice = story.wait_committed(after=0)
            k("uncordon", node3)
            k("cordon", node1)
            k("taint", "node", node1, NOTICE_TAINT)
            wait_for(
                "the PreemptionNotice condition",
                lambda: (c := story.condition("PreemptionNotice")) and c["status"] == "True",
                60,
            )
            noticed = story.wait_committed(after=before_notice, timeout=60)
            k("delete", "pod", first["metadata"]["name"], "-n", ns, "--wait=false")
            second = story.wait_running(1)
            assert second["spec"]["nodeName"] == node3
            status = story.status()
            (graceful,) = status["interruptions"]
            assert graceful["preemption"] is True, graceful
            # The operator may record the interruption when the pod starts terminating, before
            # its container exits (then no exit code yet); when it saw the exit, SIGTERM's 143.
            assert graceful["node"] == node1 and graceful.get("exitCode") in (None, 143), graceful
            assert graceful["stepsLost"] == 0, graceful
            assert status["lastCommittedCheckpoint"]["step"] >= noticed

            # 3. Node 3 is lost: no notice, no grace.
            k("taint", "node", node1, "karpenter.sh/disrupted-", check=False)
            k("uncordon", node1)
            resumed_at = story.committed_step()
            story.wait_committed(after=resumed_at)
            real_cluster.kill_node(3)
            third = story.wait_running(2, timeout=300)
            assert third["spec"]["nodeName"] == node1
            # The runtime's own lines, as `kubectl logs` shows them (the kubelet's log files).
            wait_for(
                "the resumed rank's log line in kubectl logs",
                lambda: "resumed run" in real_cluster.logs(third["metadata"]["name"], ns),
                120,
                interval=2,
            )

            wait_for(
                "the job to succeed",
                lambda: story.status().get("phase") in ("Succeeded", "Failed"),
                300,
                interval=2,
            )
            status = story.status()
            assert status["phase"] == "Succeeded", status.get("conditions")
            assert status["preemptions"] == 2 and status["failures"] == 0, status
            hard = status["interruptions"][-1]
            assert hard["preemption"] is True and hard["node"] == node3, hard
            assert status["lastCommittedCheckpoint"]["step"] == TOTAL_STEPS
    finally:
        k("taint", "node", node1, "karpenter.sh/disrupted-", check=False)
        k("uncordon", node1, check=False)
        k("delete", "resumabletrainingjob", JOB, "-n", ns, "--wait=false", check=False)
    assert_bitwise_equal(shared / "results" / "final.pt", reference_weights(tmp_path))
