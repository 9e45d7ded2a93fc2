"""An in-memory stand-in for ``KubeApi`` with the API server semantics the operator relies on:
resourceVersion compare-and-swap on status, 409 on existing names, 404 on missing objects, and
uid preconditions on delete."""

from __future__ import annotations

import copy
import itertools
from typing import Any

from rtj_operator.act.kube import ApiError, KubeApi


def merge_metadata(
    meta: dict[str, Any], labels: dict[str, str | None], annotations: dict[str, str | None]
) -> None:
    """What a JSON merge patch of labels and annotations does (None removes a key)."""
    for field, changes in (("labels", labels), ("annotations", annotations)):
        found = meta.setdefault(field, {})
        for key, value in changes.items():
            if value is None:
                found.pop(key, None)
            else:
                found[key] = value


def _apply_merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _apply_merge_patch(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class FakeApi:
    """Objects keyed by API path."""

    core_path = staticmethod(KubeApi.core_path)
    rbac_path = staticmethod(KubeApi.rbac_path)

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.leases: dict[str, dict[str, Any]] = {}
        """Node name -> its Lease in kube-node-lease."""
        self.events: list[tuple[str, str, str]] = []
        self.calls: list[str] = []
        self.versions = itertools.count(100)
        self.fail_creates_with: ApiError | None = None
        self.fail_kind_once: dict[str, ApiError] = {}
        """Kind -> error raised by its next create (then removed), like a transient refusal."""

    def close(self) -> None:
        """Nothing to release."""

    def _bump(self, obj: dict[str, Any]) -> None:
        obj.setdefault("metadata", {})["resourceVersion"] = str(next(self.versions))

    def put_job(self, body: dict[str, Any]) -> None:
        """Store a job as the API server would."""
        meta = body["metadata"]
        self._bump(body)
        self.objects[KubeApi.job_path(meta["namespace"], meta["name"])] = body

    def job(self, namespace: str = "ns", name: str = "train") -> dict[str, Any]:
        """The stored job."""
        return self.objects[KubeApi.job_path(namespace, name)]

    def pods(self) -> dict[str, dict[str, Any]]:
        """Stored pods by name."""
        return {o["metadata"]["name"]: o for p, o in self.objects.items() if "/pods/" in p}

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append("get_job")
        found = self.objects.get(KubeApi.job_path(namespace, name))
        return copy.deepcopy(found) if found else None

    async def patch_job_status(
        self, namespace: str, name: str, patch: dict[str, Any], resource_version: str
    ) -> dict[str, Any]:
        self.calls.append("patch_status")
        job = self.objects[KubeApi.job_path(namespace, name)]
        if job["metadata"]["resourceVersion"] != resource_version:
            raise ApiError(409, {"reason": "Conflict"}, "PATCH", "status")
        job["status"] = _apply_merge_patch(job.get("status") or {}, patch)
        self._bump(job)
        return copy.deepcopy(job)

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.calls.append("list_pods")
        key, value = selector.split("=")
        return [
            copy.deepcopy(p)
            for p in self.pods().values()
            if p["metadata"]["labels"].get(key) == value
        ]

    async def create(self, path: str, body: dict[str, Any], *, exist_ok: bool = True) -> bool:
        self.calls.append(f"create {body['kind']}")
        if self.fail_creates_with is not None and body["kind"] == "Pod":
            raise self.fail_creates_with
        if body["kind"] in self.fail_kind_once:
            raise self.fail_kind_once.pop(body["kind"])
        full = f"{path}/{body['metadata']['name']}"
        if full in self.objects:
            if exist_ok:
                return False
            raise ApiError(409, {"reason": "AlreadyExists"}, "POST", path)
        obj = copy.deepcopy(body)
        obj["metadata"]["uid"] = f"uid-{body['metadata']['name']}"
        if body["kind"] == "Pod":
            obj["status"] = {"phase": "Pending"}
        self._bump(obj)
        self.objects[full] = obj
        return True

    async def delete_pod(self, namespace: str, name: str, uid: str | None) -> None:
        self.calls.append("delete_pod")
        path = KubeApi.core_path(namespace, "pods", name)
        pod = self.objects.get(path)
        if pod is not None and (uid is None or pod["metadata"]["uid"] == uid):
            del self.objects[path]

    async def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.calls.append("annotate_pod")
        pod = self.objects.get(KubeApi.core_path(namespace, "pods", name))
        if pod is not None:
            pod["metadata"].setdefault("annotations", {}).update(annotations)

    async def relabel_pod(
        self,
        namespace: str,
        name: str,
        labels: dict[str, str | None],
        annotations: dict[str, str | None],
    ) -> None:
        self.calls.append("relabel_pod")
        pod = self.objects.get(KubeApi.core_path(namespace, "pods", name))
        if pod is not None:
            merge_metadata(pod["metadata"], labels, annotations)

    async def get_node(self, name: str) -> dict[str, Any] | None:
        self.calls.append("get_node")
        return copy.deepcopy(self.nodes.get(name))

    async def get_node_lease(self, name: str) -> dict[str, Any] | None:
        self.calls.append("get_node_lease")
        return copy.deepcopy(self.leases.get(name))

    pod_group_path = staticmethod(KubeApi.pod_group_path)
    serves_pod_group_api = False
    """What API discovery answers about scheduling.k8s.io/v1alpha2 podgroups."""

    async def serves_pod_groups(self) -> bool:
        self.calls.append("discovery")
        return self.serves_pod_group_api

    serves_kueue_api = False
    """What API discovery answers about the kueue.x-k8s.io group."""

    async def serves_kueue(self) -> bool:
        self.calls.append("discovery")
        return self.serves_kueue_api

    async def delete_object(self, path: str, *, uid: str | None = None) -> None:
        self.calls.append("delete_object")
        found = self.objects.get(path)
        if found is not None and (uid is None or found["metadata"]["uid"] == uid):
            del self.objects[path]

    support_path = KubeApi.support_path
    _SUPPORT_PATHS = KubeApi._SUPPORT_PATHS

    async def get_object(self, path: str) -> dict[str, Any] | None:
        self.calls.append("get_object")
        found = self.objects.get(path)
        return copy.deepcopy(found) if found else None

    async def get_support(self, namespace: str, wanted: dict[str, str]) -> dict[str, Any]:
        return {
            k: await self.get_object(self.support_path(namespace, k, n)) for k, n in wanted.items()
        }

    async def merge_patch(self, path: str, name: str, patch: dict[str, Any]) -> None:
        self.calls.append("merge_patch")
        kind = "Service" if "/services" in path else "Role"
        if kind in self.fail_kind_once:
            raise self.fail_kind_once.pop(kind)
        found = self.objects[f"{path}/{name}"]
        for key, value in patch.items():
            if isinstance(value, dict):
                found.setdefault(key, {}).update(copy.deepcopy(value))
            else:
                found[key] = copy.deepcopy(value)

    async def post_event(
        self, involved: dict[str, Any], type_: str, reason: str, message: str, now_iso: str
    ) -> None:
        self.events.append((type_, reason, message))

    def run_pods(self, node: str = "node-0") -> None:
        """Schedule every pending pod onto ``node`` and mark it Running."""
        for pod in self.pods().values():
            if pod["status"].get("phase") == "Pending":
                pod["spec"]["nodeName"] = node
                pod["status"] = {"phase": "Running"}
