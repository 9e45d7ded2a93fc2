"""What a cloud, a kubelet and the training runtime write to the API server, for clusters that
have none of them (kwok's fake nodes): a node made, made ready or NotReady, tainted and deleted
(spot reclaim, a lost kubelet), a container's exit reported, a progress report annotated.

The cluster tests and the latency benchmarks drive the operator with these; they are verbs of the
one client (``tools.kubeapi.Kube`` mixes them in), kept in a module of their own so that each part
stays small. Nothing here depends on kwok except ``make_node``'s annotation, which asks kwok to
play the node's kubelet.
"""

from __future__ import annotations

import json
import time
from typing import Any

from rtj_operator.act.kube_transport import MERGE
from rtj_operator.api.envvars import PROGRESS_ANNOTATION
from rtj_operator.api.timeutil import iso, utcnow

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
POOL_LABEL = "rtj-e2e/pool"
"""The label that puts a stand-in node in a pool (jobs pin their pods to one pool, so tests that
run side by side never share nodes)."""

Obj = dict[str, Any]


class StandIns:
    """The stand-in verbs; a mixin of ``tools.kubeapi.Kube``, whose ``request``, ``get``,
    ``delete`` and ``pod`` they call."""

    # -- nodes: what a cloud and a kubelet do ---------------------------------------------------

    def make_node(self, name: str, pool: str, *, cpu: str = "32", kwok: bool = True) -> None:
        """A fake node in a pool; kwok runs its 'kubelet' when ``kwok`` (else nobody does)."""
        annotations = {"node.alpha.kubernetes.io/ttl": "0"}
        if kwok:
            annotations[KWOK_ANNOTATION] = "fake"
        capacity = {"cpu": cpu, "memory": "256Gi", "pods": "110"}
        self.request(
            "POST",
            "/api/v1/nodes",
            body={
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": annotations,
                    "labels": {POOL_LABEL: pool, "kubernetes.io/hostname": name, "type": "kwok"},
                },
                "spec": {},
                "status": {"capacity": capacity, "allocatable": capacity},
            },
        )
        if not kwok:
            self.set_node_ready(name, True)

    def node(self, name: str) -> Obj | None:
        """The node."""
        return self.get(f"/api/v1/nodes/{name}")

    def node_ready(self, name: str) -> bool:
        """Whether the node reports Ready=True and has no not-ready taint."""
        node = self.node(name)
        if not node:
            return False
        conds = (node.get("status") or {}).get("conditions") or []
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
        taints = {t["key"] for t in (node.get("spec") or {}).get("taints") or []}
        return ready and not taints & {
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
        }

    def delete_node(self, name: str) -> None:
        """Delete a node at once (what a cloud does to a reclaimed spot VM)."""
        self.delete(f"/api/v1/nodes/{name}")

    def taint(self, node: str, key: str, effect: str, value: str = "") -> None:
        """Add a taint."""
        current = (self.node(node) or {}).get("spec", {}).get("taints") or []
        taint = {"key": key, "effect": effect}
        if value:
            taint["value"] = value
        self.request(
            "PATCH",
            f"/api/v1/nodes/{node}",
            content_type=MERGE,
            body={"spec": {"taints": [*current, taint]}},
        )

    def set_node_ready(self, node: str, ready: bool) -> None:
        """Report the node's readiness the way its kubelet would (status subresource)."""
        now = iso(utcnow())
        status = "True" if ready else "False"
        self.request(
            "PATCH",
            f"/api/v1/nodes/{node}/status",
            content_type=MERGE,
            body={
                "status": {
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": status,
                            "reason": "KubeletReady" if ready else "KubeletNotReady",
                            "message": "set by the e2e test",
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    ]
                }
            },
        )

    def stop_kubelet(self, node: str) -> None:
        """Detach kwok from the node (its heartbeats stop), then report NotReady."""
        self.request(
            "PATCH",
            f"/api/v1/nodes/{node}",
            content_type=MERGE,
            body={"metadata": {"annotations": {KWOK_ANNOTATION: None}}},
        )
        time.sleep(0.5)
        self.set_node_ready(node, False)

    # -- pods: what a kubelet and the runtime do ------------------------------------------------

    def end_container(
        self,
        ns: str,
        pod: str,
        exit_code: int,
        *,
        reason: str = "Error",
        message: str | None = None,
    ) -> None:
        """Report the training container's exit as its kubelet would (status subresource)."""
        self.end_containers(ns, pod, {}, default=exit_code, reason=reason, message=message)

    def end_containers(
        self,
        ns: str,
        pod: str,
        codes: dict[str, int],
        *,
        default: int = 0,
        reason: str = "Error",
        message: str | None = None,
    ) -> None:
        """Report every container's exit (``codes`` by name, else ``default``) as the kubelet
        would; the pod is Failed when any of them exited non-zero."""
        current = self.pod(ns, pod)
        assert current is not None, pod
        now = iso(utcnow())
        statuses = []
        for container in current["spec"]["containers"]:
            code = codes.get(container["name"], default)
            terminated = {
                "exitCode": code,
                "reason": reason
                if container["name"] not in codes
                else ("Completed" if code == 0 else "Error"),
                "startedAt": now,
                "finishedAt": now,
            }
            if message is not None:
                terminated["message"] = message
            statuses.append(
                {
                    "name": container["name"],
                    "image": container.get("image", ""),
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"terminated": terminated},
                }
            )
        ended = [codes.get(c["name"], default) for c in current["spec"]["containers"]]
        phase = "Succeeded" if not any(ended) else "Failed"
        self.request(
            "PATCH",
            f"/api/v1/namespaces/{ns}/pods/{pod}/status",
            content_type=MERGE,
            body={"status": {"phase": phase, "containerStatuses": statuses}},
        )

    def report_progress(
        self, ns: str, pod: str, checkpoint: str, step: int, current_step: int | None = None
    ) -> str:
        """Do what the runtime does after a commit: annotate its own pod."""
        report = {
            "checkpoint": checkpoint,
            "uri": f"s3://ckpt/run/{checkpoint}",
            "step": step,
            "epoch": 0,
            "sample": step * 8,
            "time": iso(utcnow()),
            "current_step": current_step if current_step is not None else step,
        }
        text = json.dumps(report)
        self.request(
            "PATCH",
            f"/api/v1/namespaces/{ns}/pods/{pod}",
            content_type=MERGE,
            body={"metadata": {"annotations": {PROGRESS_ANNOTATION: text}}},
        )
        return text
