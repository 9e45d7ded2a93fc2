"""Registering a Node and keeping it alive, the two things the control plane checks.

The node lifecycle controller in kube-controller-manager decides a node's health from its Lease
in ``kube-node-lease`` (renewed here every few seconds) and the Ready condition's heartbeat;
when both go quiet for ``--node-monitor-grace-period`` it marks the node Unknown and taints it,
which is the "node lost" signal the operator reacts to. So node loss needs no cooperation from
the agent: it is simply the agent no longer renewing.

The Node carries no ``kwok.x-k8s.io/node`` annotation: the local cluster's kwok controller only
manages annotated nodes, so it never heartbeats ours or plays kubelet for our pods.
"""

from __future__ import annotations

import logging
import platform
from dataclasses import dataclass, field

from tools.kubeapi import KWOK_ANNOTATION, MERGE, STRATEGIC, ApiError, Kube, Obj

from .status import now, now_micro

log = logging.getLogger("podrunner")

LEASE_DURATION_S = 40


@dataclass
class NodeConfig:
    """What a registered Node advertises."""

    name: str
    cpu: str = "32"
    memory: str = "256Gi"
    pods: str = "110"
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[Obj] = field(default_factory=list)
    address: str = "127.0.0.1"


def parse_taint(text: str) -> Obj:
    """``key[=value]:Effect`` → a taint."""
    head, sep, effect = text.rpartition(":")
    if not sep or effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute") or not head:
        raise ValueError(f"expected KEY[=VALUE]:EFFECT, got {text!r}")
    key, _, value = head.partition("=")
    return (
        {"key": key, "value": value, "effect": effect} if value else {"key": key, "effect": effect}
    )


def node_conditions(ready: bool, reason: str, message: str) -> list[Obj]:
    """The kubelet's four standard conditions."""
    stamp = now()
    pressure = [
        {
            "type": kind,
            "status": "False",
            "reason": f"KubeletHas{suffix}",
            "message": f"podrunner reports no {kind}",
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }
        for kind, suffix in (
            ("MemoryPressure", "SufficientMemory"),
            ("DiskPressure", "NoDiskPressure"),
            ("PIDPressure", "SufficientPID"),
        )
    ]
    return [
        *pressure,
        {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        },
    ]


def node_status(cfg: NodeConfig) -> Obj:
    """The full status of a healthy node."""
    resources = {"cpu": cfg.cpu, "memory": cfg.memory, "pods": cfg.pods, "ephemeral-storage": "1Ti"}
    return {
        "capacity": resources,
        "allocatable": resources,
        "conditions": node_conditions(True, "KubeletReady", "podrunner is posting ready status"),
        "addresses": [
            {"type": "InternalIP", "address": cfg.address},
            {"type": "Hostname", "address": cfg.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {
            "architecture": "amd64" if platform.machine() in ("x86_64", "AMD64") else "arm64",
            "operatingSystem": "linux",
            "kernelVersion": platform.release(),
            "osImage": "podrunner (local processes)",
            "containerRuntimeVersion": "podrunner://0",
            "kubeletVersion": "v0.0.0-podrunner",
            "kubeProxyVersion": "",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
    }


def node_labels(cfg: NodeConfig) -> dict[str, str]:
    """Labels a kubelet sets, plus ``type=podrunner`` and the user's."""
    return {
        "kubernetes.io/hostname": cfg.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64" if platform.machine() in ("x86_64", "AMD64") else "arm64",
        "type": "podrunner",
        **cfg.labels,
    }


def register(kube: Kube, cfg: NodeConfig) -> Obj:
    """Create the Node, or take over an existing non-kwok one; returns the Node."""
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": cfg.name, "labels": node_labels(cfg)},
        "spec": {"taints": cfg.taints} if cfg.taints else {},
        "status": node_status(cfg),
    }
    try:
        node = kube.request("POST", "/api/v1/nodes", body=body)
        log.info("node %s registered", cfg.name)
    except ApiError as err:
        if not err.conflict:
            raise
        existing = kube.request("GET", f"/api/v1/nodes/{cfg.name}")
        if KWOK_ANNOTATION in (existing["metadata"].get("annotations") or {}):
            raise SystemExit(f"node {cfg.name} is a kwok node; choose another name") from err
        # Ours replace ours; the node lifecycle controller's (node.kubernetes.io/*) stay.
        kept = [
            t
            for t in (existing.get("spec") or {}).get("taints") or []
            if t.get("key", "").startswith("node.kubernetes.io/")
        ]
        kube.request(
            "PATCH",
            f"/api/v1/nodes/{cfg.name}",
            content_type=MERGE,
            body={
                "metadata": {"labels": node_labels(cfg)},
                "spec": {"unschedulable": None, "taints": kept + cfg.taints or None},
            },
        )
        node = kube.request(
            "PATCH",
            f"/api/v1/nodes/{cfg.name}/status",
            content_type=STRATEGIC,
            body={"status": node_status(cfg)},
        )
        log.info("node %s re-registered (it existed)", cfg.name)
    return node


def set_ready(kube: Kube, name: str, ready: bool, reason: str, message: str) -> None:
    """Patch the node's conditions (the Ready heartbeat, or NotReady on a clean stop)."""
    kube.request(
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        content_type=STRATEGIC,
        body={"status": {"conditions": node_conditions(ready, reason, message)}},
    )


def renew_lease(kube: Kube, node: Obj) -> None:
    """Renew (or create) the node's Lease in ``kube-node-lease``."""
    name = node["metadata"]["name"]
    path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
    try:
        kube.request(
            "PATCH",
            path,
            content_type=MERGE,
            body={
                "spec": {
                    "renewTime": now_micro(),
                    "holderIdentity": name,
                    "leaseDurationSeconds": LEASE_DURATION_S,
                }
            },
        )
        return
    except ApiError as err:
        if not err.not_found:
            raise
    owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}
    kube.request(
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
        body={
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease", "ownerReferences": [owner]},
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": LEASE_DURATION_S,
                "renewTime": now_micro(),
            },
        },
    )
