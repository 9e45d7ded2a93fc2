"""The cluster tests' verbs on nodes: a fake node made, made ready or NotReady, tainted and
deleted, the way a cloud and a kubelet change nodes under a job (spot reclaim, a lost kubelet).

Split from ``kubeclient.Kube``, which adds them to the shared client, so that each part stays
small. Nothing here depends on kwok except ``make_node``'s annotation, which asks kwok to play
the node's kubelet.
"""

from __future__ import annotations

import time
from typing import Any

from rtj_operator.timeutil import iso, utcnow
from tools.kubeapi import MERGE, ApiError
from tools.kubeapi import Kube as HttpKube

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
POOL_LABEL = "rtj-e2e/pool"


class NodeVerbs(HttpKube):
    """Node verbs on the shared client (``tools.kubeapi.Kube``)."""

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

    def node(self, name: str) -> dict[str, Any] | None:
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
        try:
            self.request("DELETE", f"/api/v1/nodes/{name}")
        except ApiError as err:
            if not err.not_found:
                raise

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
