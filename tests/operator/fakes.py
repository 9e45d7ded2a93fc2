"""Builders of API objects and a tiny in-memory cluster for the operator's pure unit tests.

The fake cluster applies a reconcile plan the way the executor would (status, deletions, notices,
creations, the gang-created mark), so multi-step scenarios run the real state machine end to end
without an API server.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from rtj_operator.api import names
from rtj_operator.api.api_types import Job, parse_job
from rtj_operator.api.envvars import NOTICE_ANNOTATION, PROGRESS_ANNOTATION
from rtj_operator.api.timeutil import iso
from rtj_operator.decide.nodes import NodeView, node_view
from rtj_operator.decide.plan_types import Plan
from rtj_operator.decide.reconcile import reconcile

from .fake_api import merge_metadata

T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
UID = "uid-1234"


def job_body(name: str = "train", replicas: int = 2, **spec: Any) -> dict[str, Any]:
    """A ResumableTrainingJob object as the API server would return it (defaults applied)."""
    body: dict[str, Any] = {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": UID,
            "generation": 1,
            "resourceVersion": "1",
        },
        "spec": {
            "replicas": replicas,
            "checkpoint": {"dir": "s3://bucket/ckpt"},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "img"}]}},
        },
    }
    body["spec"].update(spec)
    return body


def make_job(status: dict[str, Any] | None = None, **kwargs: Any) -> Job:
    """A parsed job, optionally with a status."""
    body = job_body(**kwargs)
    if status:
        body["status"] = status
    return parse_job(body)


def make_pod(
    job: str = "train",
    attempt: int = 0,
    rank: int = 0,
    *,
    phase: str = "Running",
    node: str | None = "node-0",
    exit_code: int | None = None,
    reason: str | None = None,
    conditions: list[dict[str, Any]] | None = None,
    deleting: bool = False,
    annotations: dict[str, str] | None = None,
    status_reason: str | None = None,
    termination_message: str | None = None,
    uid: str = UID,
) -> dict[str, Any]:
    """A rank pod in the shape the API server returns."""
    state: dict[str, Any] = {"running": {}}
    if exit_code is not None:
        state = {"terminated": {"exitCode": exit_code, "reason": reason or "Error"}}
        if termination_message is not None:
            state["terminated"]["message"] = termination_message
    name = names.pod_name(job, attempt, rank)
    pod: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"pod-{name}",
            "labels": {
                names.LABEL_JOB: job,
                names.LABEL_ATTEMPT: str(attempt),
                names.LABEL_RANK: str(rank),
            },
            "annotations": dict(annotations or {}),
            "ownerReferences": [{"uid": uid, "controller": True, "kind": names.KIND}],
        },
        "spec": {"nodeName": node, "containers": [{"name": "trainer"}]},
        "status": {
            "phase": phase,
            "conditions": list(conditions or []),
            "containerStatuses": [{"name": "trainer", "state": state}],
        },
    }
    if status_reason:
        pod["status"]["reason"] = status_reason
    if deleting:
        pod["metadata"]["deletionTimestamp"] = iso(T0)
    return pod


def make_node(
    name: str = "node-0",
    *,
    ready: str = "True",
    since: datetime | None = None,
    taints: list[dict[str, Any]] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    """A Node object."""
    node: dict[str, Any] = {
        "metadata": {"name": name},
        "spec": {"taints": list(taints or [])},
        "status": {
            "conditions": [
                {"type": "Ready", "status": ready, "lastTransitionTime": iso(since or T0)}
            ]
        },
    }
    if deleting:
        node["metadata"]["deletionTimestamp"] = iso(T0)
    return node


def progress(name: str, step: int, current: int | None = None) -> str:
    """The runtime's progress JSON."""
    data: dict[str, Any] = {
        "checkpoint": name,
        "uri": f"s3://bucket/ckpt/train/{name}",
        "step": step,
        "epoch": 0,
        "sample": step * 8,
        "time": iso(T0),
    }
    if current is not None:
        data["current_step"] = current
    return json.dumps(data)


@dataclass
class FakeCluster:
    """One job, its pods and the nodes, mutated by applying plans like the executor does."""

    body: dict[str, Any]
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    now: datetime = T0
    plans: list[Plan] = field(default_factory=list)
    node_cycle: int = 0
    support: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Support objects by kind (ServiceAccount, Role, RoleBinding, Service)."""
    native_gang: bool = False
    """Whether the API server serves the PodGroup API (gang.py)."""

    @classmethod
    def start(cls, replicas: int = 2, **spec: Any) -> FakeCluster:
        """A fresh job and one ready node per rank."""
        cluster = cls(body=job_body(replicas=replicas, **spec))
        for rank in range(replicas):
            cluster.nodes[f"node-{rank}"] = make_node(f"node-{rank}")
        return cluster

    @property
    def job(self) -> Job:
        """The parsed job."""
        return parse_job(self.body)

    @property
    def status(self) -> dict[str, Any]:
        """The job's status as stored."""
        return self.body.get("status") or {}

    def node_views(self) -> dict[str, NodeView]:
        """Views of every node any pod is bound to (absent nodes as deleted)."""
        wanted = {p["spec"].get("nodeName") for p in self.pods.values()} - {None}
        return {n: node_view(n, self.nodes.get(n)) for n in wanted}

    def step(self, advance: float = 0.0) -> Plan:
        """Advance the clock, reconcile once and apply the plan."""
        self.now += timedelta(seconds=advance)
        plan = reconcile(
            self.job,
            list(self.pods.values()),
            self.node_views(),
            self.now,
            observed_support=dict(self.support),
            native_gang=self.native_gang,
        )
        self.apply(plan)
        self.plans.append(plan)
        return plan

    def apply(self, plan: Plan, *, crash_after_creations: int | None = None) -> None:
        """Apply a plan; ``crash_after_creations`` stops midway like a killed operator."""
        if plan.status is not None:
            self.body["status"] = plan.status.model_dump(
                mode="json", by_alias=True, exclude_none=True
            )
        for deletion in plan.deletions:
            if deletion.name in self.pods:
                # kwok-like: a deleted pod disappears at once.
                del self.pods[deletion.name]
        for notice in plan.notices:
            self.pods[notice.pod]["metadata"]["annotations"][NOTICE_ANNOTATION] = notice.payload
        for member in plan.memberships:
            if member.pod in self.pods:
                merge_metadata(self.pods[member.pod]["metadata"], member.labels, member.annotations)
        for write in plan.support:
            if write.update:
                self.support[write.kind] = copy.deepcopy(write.body)
            else:
                self.support.setdefault(write.kind, copy.deepcopy(write.body))
        for pod in plan.spares:
            self.create(pod)
        for index, pod in enumerate(plan.creations):
            if crash_after_creations is not None and index >= crash_after_creations:
                return
            self.create(pod)
        if plan.after_creation is not None:
            self.body["status"] = plan.after_creation.model_dump(
                mode="json", by_alias=True, exclude_none=True
            )

    def create(self, pod: dict[str, Any]) -> None:
        """Create a pod (409-like no-op if it exists); it lands Pending, unscheduled."""
        pod = copy.deepcopy(pod)
        name = pod["metadata"]["name"]
        if name in self.pods:
            return
        pod["metadata"]["uid"] = f"pod-{name}"
        pod["metadata"].setdefault("annotations", {})
        pod["status"] = {"phase": "Pending"}
        self.pods[name] = pod

    def schedule_and_run(self) -> None:
        """Bind every pending pod to the node of its rank and mark it Running."""
        for pod in self.pods.values():
            if pod["status"].get("phase") == "Pending":
                rank = pod["metadata"]["labels"].get(names.LABEL_RANK)
                node = f"node-{rank}" if rank is not None else f"node-{pod['metadata']['name']}"
                if node not in self.nodes:
                    self.nodes[node] = make_node(node)
                pod["spec"]["nodeName"] = node
                pod["status"] = {
                    "phase": "Running",
                    "containerStatuses": [{"name": "trainer", "state": {"running": {}}}],
                }

    def current_pods(self) -> list[dict[str, Any]]:
        """Pods of the attempt recorded in status."""
        attempt = str(self.status.get("attempt", 0))
        return [
            p
            for p in self.pods.values()
            if p["metadata"]["labels"].get(names.LABEL_ATTEMPT) == attempt
        ]

    def pod(self, rank: int, attempt: int | None = None) -> dict[str, Any]:
        """One rank's pod of an attempt (default: the current one)."""
        attempt = self.status.get("attempt", 0) if attempt is None else attempt
        labels = {names.LABEL_ATTEMPT: str(attempt), names.LABEL_RANK: str(rank)}
        for pod in self.pods.values():  # a kept pod keeps its first name (survivors.py)
            if labels.items() <= pod["metadata"].get("labels", {}).items():
                return pod
        return self.pods[names.pod_name(self.body["metadata"]["name"], attempt, rank)]

    def terminate(
        self, rank: int, exit_code: int, reason: str = "Error", message: str | None = None
    ) -> None:
        """The training container of a rank exits (kubelet report)."""
        pod = self.pod(rank)
        terminated: dict[str, Any] = {"exitCode": exit_code, "reason": reason}
        if message is not None:
            terminated["message"] = message
        pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        pod["status"]["containerStatuses"] = [
            {"name": "trainer", "state": {"terminated": terminated}}
        ]

    def report(
        self,
        rank: int,
        name: str,
        step: int,
        current: int | None = None,
        *,
        attempt: int | None = None,
    ) -> None:
        """The runtime on a rank annotates its pod after a commit (``attempt``: its workers'
        ``RTJ_ATTEMPT``, said in the report)."""
        data = json.loads(progress(name, step, current))
        if attempt is not None:
            data["attempt"] = attempt
        self.pod(rank)["metadata"]["annotations"][PROGRESS_ANNOTATION] = json.dumps(data)

    def report_step(self, rank: int, current: int, *, attempt: int | None = None) -> None:
        """The runtime on a rank annotates its pod with its step, before the attempt's first
        commit (no checkpoint in the JSON yet)."""
        data: dict[str, Any] = {"current_step": current, "reported_at": iso(self.now)}
        if attempt is not None:
            data["attempt"] = attempt
        self.pod(rank)["metadata"]["annotations"][PROGRESS_ANNOTATION] = json.dumps(data)

    def env(self, rank: int, attempt: int | None = None) -> dict[str, str]:
        """The environment injected into a rank's training container."""
        container = self.pod(rank, attempt)["spec"]["containers"][0]
        return {e["name"]: e.get("value", "") for e in container["env"]}
