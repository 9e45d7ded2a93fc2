"""One cluster interface for the spot story, with an adapter for each kind of cluster it runs on.

The spot story (``tools/stories/spot.py``) submits a job, waits for commits, loses a node and
checks the resume. It does so through ``SpotCluster``, the few verbs it needs, so the same story
runs on:

* ``PodRunnerCluster``: the local stack (``tools/localstack``), whose spot Nodes are pod-runner
  agents: a lost node is its agent SIGKILLed and its Node deleted, a graceful end is the agent's
  SIGTERM (the node's graceful shutdown), then the Node deleted;
* ``RealNodeCluster``: kubelets and containerd joined to a local control plane
  (``tools/realnodes.py``), driven with kubectl: a lost node is its kubelet, containerd and
  containers SIGKILLed and its Node deleted; a graceful end is the pod's deletion (the kubelet's
  SIGTERM and grace period) on a cordoned, tainted node that comes back afterwards.

How each cluster words what it does is its own (``explain``), as is its narration: the local
stack's ``Narrator`` follows the job as it goes; on real nodes the story's own lines suffice.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from rtj_operator.api import names
from tools.localstack import LocalStack, Narrator
from tools.realnodes import RealCluster
from trainer_runtime.events import RuntimeEvent, read_events

Obj = dict[str, Any]
Say = Callable[[str], None]

NOTICE, SHUTDOWN, LOST = "notice", "shutdown", "lost"
"""The ways a spot node goes: with a notice (a termination taint, then a graceful end), a
graceful end without notice (SIGTERM and the grace period only), lost outright (SIGKILL)."""


class Narration(Protocol):
    """Where the story's lines go while it runs; ``poll`` says what the job did meanwhile."""

    def say(self, text: str) -> None: ...

    def poll(self) -> None: ...

    def __enter__(self) -> Narration: ...

    def __exit__(self, *exc: object) -> None: ...


class SpotCluster(Protocol):
    """What the spot story needs of a cluster: a job's objects and logs, and ways to lose a node.

    Pods are the operator's, named ``names.pod_name(job, attempt, rank)``; ``pod_log`` is the
    trainer container's log as ``kubectl logs`` shows it (``""`` when there is none).
    """

    poll_s: float
    """How often the story polls (the local stack answers in milliseconds, kubectl in ~0.1 s)."""

    def submit(self, manifest: Path | Obj, job: str) -> None:
        """Apply the job's manifest (a file, renamed to ``job``, or the job itself)."""
        ...

    def status(self, job: str) -> Obj:
        """The job's status (empty before the operator wrote one)."""
        ...

    def pods(self, job: str, attempt: int | None = None) -> list[Obj]:
        """The job's pods (of one attempt)."""
        ...

    def pod(self, job: str, attempt: int, rank: int) -> Obj | None:
        """The pod of rank ``rank`` in ``attempt``, or None."""
        ...

    def pod_log(self, pod: str) -> str:
        """The trainer container's log."""
        ...

    def events(self, job: str) -> list[Obj]:
        """Kubernetes Events about the job, oldest first."""
        ...

    def make_room(self, node: str) -> None:
        """Before ``node`` goes: let the next attempt be placed elsewhere."""
        ...

    def notice(self, node: str) -> None:
        """A termination notice for ``node`` (a taint the operator passes on to the ranks)."""
        ...

    def shut_down(self, job: str, node: str) -> None:
        """A graceful end of the job's pods on ``node``: SIGTERM, the grace period, SIGKILL."""
        ...

    def lose(self, node: str) -> None:
        """``node`` is lost without notice: its processes SIGKILLed, its Node deleted."""
        ...

    def restore(self, node: str) -> None:
        """After a graceful end: what the node still has of the notice is taken back (a node
        that is gone needs nothing)."""
        ...

    def weights(self, job: str) -> Path:
        """Where the job's final weights land on this machine."""
        ...

    def explain(self, kind: str, node: str) -> str:
        """What ``notice``, ``shutdown`` (the graceful end) or ``lost`` does to ``node`` (the
        node's name, or its name and what runs there), in words."""
        ...

    def narration(self, job: str, say: Say) -> Narration:
        """The narration of the job while the story runs."""
        ...

    def diagnostics(self, job: str) -> str:
        """What to look at when a wait timed out."""
        ...


def runtime_events(cluster: SpotCluster, pod: str, kind: str | None = None) -> list[RuntimeEvent]:
    """The runtime's structured events in a pod's trainer log (of one ``kind``), in order."""
    return read_events(cluster.pod_log(pod), kind)


def node_of(pod: Obj | None) -> str | None:
    """The node a pod was placed on (None: not placed, or no pod)."""
    return ((pod or {}).get("spec") or {}).get("nodeName") or None


class PlainNarration(AbstractContextManager["PlainNarration"]):
    """A narration that only says the story's own lines."""

    def __init__(self, say: Say) -> None:
        self.say = say

    def poll(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class PodRunnerCluster:
    """``SpotCluster`` over the local stack: Nodes are pod-runner agents on this machine."""

    TAINT = "cloud.google.com/impending-node-termination"
    """The termination taint GKE's node termination handler sets ~30 s before a spot VM goes."""
    poll_s = 0.2

    def __init__(self, stack: LocalStack) -> None:
        self.stack = stack

    def submit(self, manifest: Path | Obj, job: str) -> None:
        if isinstance(manifest, Path):
            self.stack.apply(manifest, name=job)
        else:
            self.stack.kubectl(
                "apply", "-n", self.stack.cfg.namespace, "-f", "-", stdin=json.dumps(manifest)
            )

    def status(self, job: str) -> Obj:
        return self.stack.job(job).get("status") or {}

    def pods(self, job: str, attempt: int | None = None) -> list[Obj]:
        return self.stack.pods(job, attempt)

    def pod(self, job: str, attempt: int, rank: int) -> Obj | None:
        return self.stack.pod(names.pod_name(job, attempt, rank))

    def pod_log(self, pod: str) -> str:
        return self.stack.pod_log(pod)

    def events(self, job: str) -> list[Obj]:
        return self.stack.events(job)

    def make_room(self, node: str) -> None:
        return None  # the stack's spare nodes take the next attempt

    def notice(self, node: str) -> None:
        self.stack.taint_node(node, self.TAINT, "NoSchedule", "true")

    def shut_down(self, job: str, node: str) -> None:
        self.stack.shut_down_node(node)

    def lose(self, node: str) -> None:
        self.stack.reclaim_node(node)

    def restore(self, node: str) -> None:
        return None  # a node that shut down is gone

    def weights(self, job: str) -> Path:
        return self.stack.results_dir / f"{job}.pt"

    def explain(self, kind: str, node: str) -> str:
        return {
            NOTICE: f"termination notice: node {node} is tainted {self.TAINT}:NoSchedule "
            "(what GKE's node termination handler does ~30 s before a spot VM goes)",
            SHUTDOWN: f"node {node} shuts down: its pods get SIGTERM and their grace period, "
            "then the machine is gone and its Node deleted",
            LOST: f"spot reclaim of {node}: its Node is deleted and every process on it "
            "SIGKILLed, without notice",
        }[kind]

    def narration(self, job: str, say: Say) -> Narration:
        return Narrator(self.stack, job, say)

    def diagnostics(self, job: str) -> str:
        return self.stack.diagnostics(job)


class RealNodeCluster:
    """``SpotCluster`` over real nodes in namespace ``ns``, driven with kubectl as a user would.

    ``pool``: the two nodes the job may run on (its affinity); the story's first attempt runs on
    the first (the other is cordoned until a node is about to go), each interruption moves the
    job to the other one. ``shared``: the hostPath folder every node sees, with ``results/``.
    """

    TAINT = "karpenter.sh/disrupted"
    """The taint Karpenter sets on a node it is about to take away (``:NoSchedule``)."""
    poll_s = 1.0

    def __init__(self, cluster: RealCluster, ns: str, shared: Path, pool: Sequence[str]) -> None:
        self.cluster, self.ns, self.shared = cluster, ns, shared
        self.pool = tuple(pool)
        self.k = cluster.kubectl_run

    def submit(self, manifest: Path | Obj, job: str) -> None:
        self.k("cordon", self.pool[1])  # the first attempt runs on pool[0]
        if isinstance(manifest, Path):
            self.k("apply", "-n", self.ns, "-f", str(manifest))
        else:
            self.cluster.apply(manifest)

    def status(self, job: str) -> Obj:
        return (self.cluster.get(names.SINGULAR, job, self.ns) or {}).get("status") or {}

    def pods(self, job: str, attempt: int | None = None) -> list[Obj]:
        selector = names.job_selector(job)
        if attempt is not None:
            selector += f",{names.LABEL_ATTEMPT}={attempt}"
        out = self.k("get", "pods", "-n", self.ns, "-l", selector, "-o", "json").stdout
        return list(json.loads(out)["items"])

    def pod(self, job: str, attempt: int, rank: int) -> Obj | None:
        return self.cluster.get("pod", names.pod_name(job, attempt, rank), self.ns)

    def pod_log(self, pod: str) -> str:
        proc = self.k("logs", pod, "-n", self.ns, check=False)
        return proc.stdout + proc.stderr if proc.returncode == 0 else ""

    def events(self, job: str) -> list[Obj]:
        out = self.k(
            "get",
            "events",
            "-n",
            self.ns,
            "--field-selector",
            f"involvedObject.name={job}",
            "-o",
            "json",
        ).stdout
        items = json.loads(out)["items"]
        return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    def make_room(self, node: str) -> None:
        for other in self.pool:
            if other != node:
                self.k("uncordon", other)

    def notice(self, node: str) -> None:
        self.k("cordon", node)
        self.k("taint", "node", node, f"{self.TAINT}=:NoSchedule")

    def shut_down(self, job: str, node: str) -> None:
        for pod in self.pods(job):
            if node_of(pod) == node and pod["status"].get("phase") in ("Pending", "Running"):
                self.k("delete", "pod", pod["metadata"]["name"], "-n", self.ns, "--wait=false")

    def lose(self, node: str) -> None:
        index = next(i for i in self.cluster.runtime_nodes if self.cluster.node(i) == node)
        self.cluster.kill_node(index)

    def restore(self, node: str) -> None:
        self.k("taint", "node", node, f"{self.TAINT}-", check=False)
        self.k("uncordon", node, check=False)

    def weights(self, job: str) -> Path:
        return self.shared / "results" / "final.pt"

    def explain(self, kind: str, node: str) -> str:
        return {
            NOTICE: f"node {node}: termination taint + cordon (a notice of its end)",
            SHUTDOWN: f"then the graceful shutdown: SIGTERM to the job's pod on {node}, its "
            "grace period",
            LOST: f"node {node} is lost: kubelet, containerd and containers SIGKILLed, Node "
            "deleted",
        }[kind]

    def narration(self, job: str, say: Say) -> Narration:
        return PlainNarration(say)

    def diagnostics(self, job: str) -> str:
        pods = self.k("get", "pods", "-n", self.ns, "-o", "wide", check=False).stdout
        return f"job status: {json.dumps(self.status(job), indent=1)}\n{pods}"

    def clean_up(self, job: str) -> None:
        """Delete the job; the pool's nodes lose the notice's taint and cordon."""
        self.k("delete", names.SINGULAR, job, "-n", self.ns, "--wait=false", check=False)
        for node in self.pool:
            self.restore(node)


__all__ = [
    "LOST",
    "NOTICE",
    "SHUTDOWN",
    "Narration",
    "PlainNarration",
    "PodRunnerCluster",
    "RealNodeCluster",
    "SpotCluster",
    "node_of",
    "runtime_events",
]
