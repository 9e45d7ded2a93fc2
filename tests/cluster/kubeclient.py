"""Synchronous Kubernetes helpers for the cluster tests (and the latency benchmark), on the
client tools and tests share (``tools/kubeapi.py``, built on the operator's transport,
``rtj_operator.kube_transport``).

They drive the endings a real cluster produces: deleting a node (spot reclaim), the Eviction
API, taints, a NotReady node, scheduler preemption, and the kubelet's report of a container exit
(a status-subresource patch, which is what a kubelet writes). The verbs on nodes are in
``node_verbs.py``.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, TypeVar

import yaml

from rtj_operator import names
from rtj_operator.kube import KubeApi
from rtj_operator.timeutil import iso, utcnow
from tools.kubeapi import JSON, MERGE, ApiError
from tools.waiting import wait_for  # noqa: F401 - re-exported: tests import it from here

from .node_verbs import POOL_LABEL, NodeVerbs

T = TypeVar("T")


class Kube(NodeVerbs):
    """The shared client (``tools.kubeapi.Kube``) with the cluster tests' verbs on top (the
    node verbs in ``node_verbs.py``)."""

    def __init__(self, kubeconfig: str):
        super().__init__(kubeconfig)

    def req(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = JSON,
    ) -> dict[str, Any]:
        """One request; ``ApiError`` (``tools.kubeapi``) on a non-2xx answer."""
        return self.request(method, path, body=body, params=query, content_type=content_type)

    def apply_file(self, path: Path) -> None:
        """Create or replace every object of a YAML file (CRDs and peering objects)."""
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                self.apply(doc)

    def apply(self, doc: dict[str, Any]) -> None:
        """Create, or replace keeping the resourceVersion."""
        api_version, kind = doc["apiVersion"], doc["kind"]
        plural = {
            "CustomResourceDefinition": "customresourcedefinitions",
            "ClusterKopfPeering": "clusterkopfpeerings",
            "KopfPeering": "kopfpeerings",
            "PriorityClass": "priorityclasses",
            "ServiceAccount": "serviceaccounts",
            "Namespace": "namespaces",
            "ClusterRole": "clusterroles",
            "ClusterRoleBinding": "clusterrolebindings",
        }[kind]
        prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        ns = doc["metadata"].get("namespace")
        base = f"{prefix}/namespaces/{ns}/{plural}" if ns else f"{prefix}/{plural}"
        current = self.get(f"{base}/{doc['metadata']['name']}")
        if current is None:
            self.req("POST", base, body=doc)
        else:
            doc = {
                **doc,
                "metadata": {
                    **doc["metadata"],
                    "resourceVersion": current["metadata"]["resourceVersion"],
                },
            }
            self.req("PUT", f"{base}/{doc['metadata']['name']}", body=doc)

    # -- namespaces ---------------------------------------------------------------------------

    def create_namespace(self, name: str) -> None:
        """Create a namespace."""
        self.req(
            "POST",
            "/api/v1/namespaces",
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )

    def delete_namespace(self, name: str) -> None:
        """Delete a namespace (not waiting)."""
        try:
            self.req("DELETE", f"/api/v1/namespaces/{name}")
        except ApiError as err:
            if not err.not_found:
                raise

    # -- jobs and pods ---------------------------------------------------------------------

    def job_path(self, ns: str, name: str = "") -> str:
        """Path of a job."""
        return KubeApi.job_path(ns, name)

    def create_job(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a ResumableTrainingJob."""
        return self.req("POST", self.job_path(body["metadata"]["namespace"]), body=body)

    def job(self, ns: str, name: str) -> dict[str, Any] | None:
        """A job."""
        return self.get(self.job_path(ns, name))

    def status(self, ns: str, name: str) -> dict[str, Any]:
        """A job's status ({} when absent)."""
        return (self.job(ns, name) or {}).get("status") or {}

    def patch_job(self, ns: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch a job's spec."""
        return self.req("PATCH", self.job_path(ns, name), content_type=MERGE, body={"spec": spec})

    def delete_job(self, ns: str, name: str) -> None:
        """Delete a job (background cascade)."""
        self.req("DELETE", self.job_path(ns, name))

    def pods(self, ns: str, job: str, attempt: int | None = None) -> list[dict[str, Any]]:
        """A job's pods, optionally of one attempt, sorted by name."""
        selector = names.job_selector(job)
        if attempt is not None:
            selector += f",{names.LABEL_ATTEMPT}={attempt}"
        found = self.req("GET", f"/api/v1/namespaces/{ns}/pods", query={"labelSelector": selector})[
            "items"
        ]
        return sorted(found, key=lambda p: p["metadata"]["name"])

    def pod(self, ns: str, name: str) -> dict[str, Any] | None:
        """A pod."""
        return self.get(f"/api/v1/namespaces/{ns}/pods/{name}")

    def running(self, ns: str, job: str, attempt: int, replicas: int) -> list[dict[str, Any]]:
        """The attempt's pods when all ``replicas`` run (else an empty list)."""
        pods = [
            p
            for p in self.pods(ns, job, attempt)
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]
        return pods if len(pods) == replicas else []

    def evict(self, ns: str, pod: str) -> None:
        """The Eviction API (what kubectl drain uses)."""
        self.req(
            "POST",
            f"/api/v1/namespaces/{ns}/pods/{pod}/eviction",
            body={
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": pod, "namespace": ns},
            },
        )

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
        self.req(
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
        self.req(
            "PATCH",
            f"/api/v1/namespaces/{ns}/pods/{pod}",
            content_type=MERGE,
            body={"metadata": {"annotations": {"resumable.dev/progress": text}}},
        )
        return text

    def events(self, ns: str, involved: str) -> list[dict[str, Any]]:
        """Events about one object."""
        items = self.req("GET", f"/api/v1/namespaces/{ns}/events")["items"]
        return [e for e in items if e["involvedObject"].get("name") == involved]


def env_of(pod: dict[str, Any], container: int = 0) -> dict[str, str]:
    """A container's literal environment."""
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][container]["env"]}


def unique(prefix: str) -> str:
    """A short unique name."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def rtj(name: str, ns: str, pool: str, replicas: int = 2, **spec: Any) -> dict[str, Any]:
    """A ResumableTrainingJob pinned to one node pool (so tests never share nodes)."""
    template_spec: dict[str, Any] = {
        "nodeSelector": {POOL_LABEL: pool},
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "trainer", "image": "registry.local/train:1"}],
    }
    template_spec.update(spec.pop("template_spec", {}))
    body = {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "checkpoint": {"dir": "s3://ckpt"},
            "template": {"spec": template_spec},
        },
    }
    body["spec"].update(spec)
    return body
