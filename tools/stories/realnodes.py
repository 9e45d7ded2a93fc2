"""The spot story on real nodes: a node announces its end, or is lost outright, and the job goes on.

Shared by the real-node e2e test (``tests/realnodes/test_job_story.py``) and ``make demo
NODES=real`` (``examples/demo_cluster.py --nodes real``).

The operator runs as the chart's Deployment pod (operator image), pinned to the node without the
runtime image, which no story loses (as one runs it on on-demand capacity: an operator lost with
the rank's node comes back by itself, but never sees the rank pod's last state, so its record of
the interruption cannot name the node); the job's rank runs from the runtime image under a real
kubelet, which delivers SIGTERM, waits out the grace period and
SIGKILLs. Checkpoints go to a hostPath folder that every node of this one-machine cluster sees
at the same place (a shared filesystem, as NFS or a ReadWriteMany volume would be).

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
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.localstack import start_reference_run, weights_equal
from tools.realnodes import NODES_DIR, RealCluster, Say, operator_release
from tools.stories import Check
from tools.waiting import wait_for
from trainer_runtime.events import RuntimeEvent, read_events

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
INTERRUPTIONS = ("notice", "lost")
GRACE_PERIOD_S = 20


def _quiet(_line: str) -> None:
    return None


def check_interruptions(interruptions: Sequence[str]) -> None:
    """ValueError unless every item is ``notice`` or ``lost`` and ``lost`` comes last only."""
    unknown = [i for i in interruptions if i not in INTERRUPTIONS]
    if unknown:
        raise ValueError(f"interruptions: {unknown}: expected each of {list(INTERRUPTIONS)}")
    if "lost" in interruptions[:-1]:
        raise ValueError("interruptions: 'lost' must be the last one (a lost node is gone)")


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


@dataclass
class Attempt:
    """One gang of the job: where it ran and how its rank started (its ``resumed`` or ``fresh``
    event)."""

    number: int
    node: str
    pod: str
    start: RuntimeEvent | None = None

    @property
    def resumed_step(self) -> int | None:
        """The step it resumed at; None when it started fresh (or was not seen starting)."""
        return (
            self.start["step"] if self.start is not None and self.start.type == "resumed" else None
        )


def describe(attempt: Attempt) -> str:
    """How an attempt started, in words, from its event."""
    if attempt.start is None:
        return "not seen starting"
    if attempt.start.type == "fresh":
        return "started FRESH, from step 0"
    return f"resumed at step {attempt.start['step']} ({attempt.start['checkpoint']})"


@dataclass
class Interruption:
    """What one interruption did, as the story saw it."""

    kind: str
    node: str
    committed_before: int
    """The job's last committed step when the node went (``lost``) or the notice came."""
    notice_events: list[RuntimeEvent] = field(default_factory=list)
    """``notice``: the runtime's ``notice`` and ``committed`` events in the pod's log."""


@dataclass
class StoryResult:
    interruptions: list[Interruption]
    attempts: list[Attempt]
    status: dict[str, Any]
    weights: Path
    reference: Path
    seconds: float


class RealNodeStory:
    """Runs the job through ``interruptions``; reads it with kubectl, as a user would."""

    def __init__(
        self, cluster: RealCluster, ns: str, shared: Path, workdir: Path, say: Say = _quiet
    ) -> None:
        self.cluster = cluster
        self.ns = ns
        self.shared = shared
        self.workdir = workdir
        self.say = say
        self.k = cluster.kubectl_run

    def status(self) -> dict[str, Any]:
        job = self.cluster.get("resumabletrainingjob", JOB, self.ns) or {}
        return job.get("status") or {}

    def committed_step(self) -> int:
        return (self.status().get("lastCommittedCheckpoint") or {}).get("step") or 0

    def running_pod(self, attempt: int) -> dict[str, Any] | None:
        """The job's pod of ``attempt`` once its trainer runs."""
        out = self.k(
            "get", "pods", "-n", self.ns, "-l", f"resumable.dev/job-name={JOB}", "-o", "json"
        ).stdout
        for pod in json.loads(out)["items"]:
            label = pod["metadata"].get("labels", {}).get("resumable.dev/attempt")
            if label is not None and int(label) != attempt:
                continue
            if pod["status"].get("phase") == "Running":
                return pod
        return None

    def wait_running(self, attempt: int, timeout: float = 300) -> Attempt:
        pod = wait_for(
            f"attempt {attempt} running",
            lambda: self.status().get("attempt", 0) == attempt and self.running_pod(attempt),
            timeout,
            interval=1,
        )
        return Attempt(attempt, pod["spec"]["nodeName"], pod["metadata"]["name"])

    def wait_committed(self, after: int, timeout: float = 180) -> int:
        return wait_for(
            f"a checkpoint committed after step {after}",
            lambda: (s := self.committed_step()) > after and s,
            timeout,
            interval=1,
        )

    def events(self, pod: str, kind: str | None) -> list[RuntimeEvent]:
        """The runtime's events (of ``kind``, or all) in ``kubectl logs`` of ``pod``."""
        proc = self.k("logs", pod, "-n", self.ns, check=False)
        return read_events(proc.stdout + proc.stderr, kind) if proc.returncode == 0 else []

    def condition(self, kind: str) -> dict[str, Any] | None:
        return next((c for c in self.status().get("conditions", []) if c["type"] == kind), None)

    def _notice(self, current: Attempt) -> Interruption:
        self.k("cordon", current.node)
        self.k("taint", "node", current.node, NOTICE_TAINT)
        before = self.committed_step()
        self.say(f"node {current.node}: termination taint + cordon (a notice of its end)")
        wait_for(
            "the PreemptionNotice condition",
            lambda: (c := self.condition("PreemptionNotice")) and c["status"] == "True",
            60,
        )
        saved = self.wait_committed(after=before, timeout=60)
        self.say(f"the runtime checkpointed at once: step {saved} committed")
        events = self.events(current.pod, "notice") + self.events(current.pod, "committed")
        self.say(
            f"then the graceful shutdown: SIGTERM to {current.pod}, {GRACE_PERIOD_S} s grace period"
        )
        self.k("delete", "pod", current.pod, "-n", self.ns, "--wait=false")
        return Interruption("notice", current.node, saved, events)

    def _lose(self, current: Attempt) -> Interruption:
        before = self.committed_step()
        index = next(i for i in self.cluster.runtime_nodes if self.cluster.node(i) == current.node)
        self.say(
            f"node {current.node} is lost: kubelet, containerd and containers SIGKILLed, "
            f"Node deleted (last committed step {before})"
        )
        self.cluster.kill_node(index)
        return Interruption("lost", current.node, before)

    def _started(self, attempt: Attempt) -> RuntimeEvent:
        """How the new attempt's rank started, ``resumed`` or ``fresh``: its first such event
        as ``kubectl logs`` shows it."""

        def first_start() -> RuntimeEvent | None:
            found = self.events(attempt.pod, None)
            return next((e for e in found if e.type in ("resumed", "fresh")), None)

        return wait_for(
            f"attempt {attempt.number}'s resumed (or fresh) event in kubectl logs",
            first_start,
            120,
            interval=2,
        )

    def run(self, interruptions: Sequence[str]) -> StoryResult:
        check_interruptions(interruptions)
        started = time.monotonic()
        a, b = (self.cluster.node(i) for i in self.cluster.runtime_nodes[:2])
        other = {a: b, b: a}
        manifest = job_manifest(self.ns, self.cluster.images["runtime"], self.shared, [a, b])
        self.workdir.mkdir(parents=True, exist_ok=True)
        job_file = self.workdir / "job.json"
        job_file.write_text(json.dumps(manifest))
        self.say("meanwhile: the same script runs uninterrupted as a plain local process")
        reference = start_reference_run(job_file, self.workdir / "reference")
        done: list[Interruption] = []
        try:
            steady = self.cluster.steady_node
            with operator_release(self.cluster, self.ns, node=steady):
                self.say(
                    f"operator installed by helm on {steady} (never lost); job {JOB} applied, "
                    f"pinned to {a} and {b}"
                )
                self.k("cordon", b)
                self.cluster.apply(manifest)
                current = self.wait_running(0)
                attempts = [current]
                self.say(f"attempt 0 runs on {current.node}")
                for kind in interruptions:
                    self.wait_committed(after=self.committed_step())
                    self.k("uncordon", other[current.node])
                    done.append(self._notice(current) if kind == "notice" else self._lose(current))
                    current = self.wait_running(current.number + 1)
                    current.start = self._started(current)
                    attempts.append(current)
                    self.say(
                        f"attempt {current.number} runs on {current.node}: {describe(current)}"
                    )
                    if kind == "notice":
                        self.k(
                            "taint", "node", done[-1].node, "karpenter.sh/disrupted-", check=False
                        )
                        self.k("uncordon", done[-1].node)
                    if current.resumed_step is None:
                        break  # a fresh start: the verdicts say so; interrupting on shows nothing
                wait_for(
                    "the job to end",
                    lambda: self.status().get("phase") in ("Succeeded", "Failed"),
                    300,
                    interval=2,
                )
                status = self.status()
                self.say(f"job {JOB}: {status.get('phase')}")
        finally:
            self.k(
                "delete", "resumabletrainingjob", JOB, "-n", self.ns, "--wait=false", check=False
            )
            for node in (a, b):
                self.k("taint", "node", node, "karpenter.sh/disrupted-", check=False)
                self.k("uncordon", node, check=False)
        try:
            ref = reference.wait()
        finally:
            reference.kill()
        return StoryResult(
            done,
            attempts,
            status,
            self.shared / "results" / "final.pt",
            ref,
            time.monotonic() - started,
        )


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
                    seen.kind == "lost"
                    or (record.get("stepsLost") == 0 and record.get("exitCode") in (None, 143))
                ),
                f"preemption {record.get('preemption')}, node {record.get('node')}, "
                f"steps lost {record.get('stepsLost')}, exit code {record.get('exitCode')}",
            )
        )
        if seen.kind == "notice":
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
        if result.weights.exists()
        else (False, "no final weights written")
    )
    checks.append(Check("final weights equal an uninterrupted run", equal, why))
    return checks
