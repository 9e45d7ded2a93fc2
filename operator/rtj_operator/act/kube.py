"""The operator's async Kubernetes API client: the paths and verbs the operator uses.

Requests go through ``kube_transport.Transport`` (credentials, one pooled urllib3 connection
manager, ``ApiError``), shared with the synchronous client of the tools and tests, and run on a
thread pool so the gang's pods are created in parallel. Why not the generated ``kubernetes``
client methods: they deserialise every response into model objects (slow on the resubmission
path, and a different shape from the dictionaries kopf and the pure modules use), their
signatures change between releases, and JSON merge patches on custom resources need care.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar
from urllib.parse import quote

import urllib3
from kubernetes import client as k8s_client

from ..api import names
from ..decide import gang
from .kube_transport import ApiError, Transport, load_configuration

__all__ = ["ApiError", "KubeApi", "load_configuration"]

REQUEST_TIMEOUT = urllib3.Timeout(connect=5.0, read=30.0)

REQUESTS_PER_PASS = 8
"""Requests one reconcile may have in flight at once: a gang's pods are created together, beside
the previous gang's deletion. The client gets that many threads and connections per worker, so
a raised ``--workers`` is not held back by the pool (at the default 8 workers, 16 or 64 threads
made no difference in a mass reclaim: the API server's machine was the limit)."""


def connections_for(workers: int) -> int:
    """Threads and pooled connections of the client of an operator with ``workers`` workers."""
    return max(16, REQUESTS_PER_PASS * workers)


class KubeApi:
    """Async JSON access to the API server paths the operator uses."""

    def __init__(self, cfg: k8s_client.Configuration | None = None, workers: int = 16):
        self.transport = Transport(
            cfg or load_configuration(),
            user_agent=names.COMPONENT,
            max_connections=workers,
            timeout=REQUEST_TIMEOUT,
        )
        self.threads = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube")

    def close(self) -> None:
        """Release connections and threads."""
        self.threads.shutdown(wait=False, cancel_futures=True)
        self.transport.close()

    # -- transport -------------------------------------------------------------------------

    def request_sync(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """One request (``Transport.request``); raises ApiError on a non-2xx answer."""
        return self.transport.request(method, path, **kwargs)

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """Async form of ``request_sync`` (runs on the client's thread pool)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.threads, lambda: self.request_sync(method, path, **kwargs)
        )

    # -- paths -----------------------------------------------------------------------------

    @staticmethod
    def job_path(namespace: str, name: str = "") -> str:
        """Path of a ResumableTrainingJob (or the collection)."""
        base = f"/apis/{names.GROUP}/{names.VERSION}/namespaces/{quote(namespace)}/{names.PLURAL}"
        return f"{base}/{quote(name)}" if name else base

    @staticmethod
    def core_path(namespace: str, plural: str, name: str = "") -> str:
        """Path of a namespaced core/v1 object (or collection)."""
        base = f"/api/v1/namespaces/{quote(namespace)}/{plural}"
        return f"{base}/{quote(name)}" if name else base

    @staticmethod
    def rbac_path(namespace: str, plural: str, name: str = "") -> str:
        """Path of a namespaced rbac.authorization.k8s.io/v1 object (or collection)."""
        base = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{quote(namespace)}/{plural}"
        return f"{base}/{quote(name)}" if name else base

    # -- jobs ------------------------------------------------------------------------------

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job, or None when it is gone."""
        try:
            return await self.request("GET", self.job_path(namespace, name))
        except ApiError as err:
            if err.not_found:
                return None
            raise

    async def patch_job_status(
        self, namespace: str, name: str, patch: dict[str, Any], resource_version: str
    ) -> dict[str, Any]:
        """Merge-patch the status subresource, conditional on ``resource_version``.

        Putting the resourceVersion in the patch turns it into a compare-and-swap: a write based
        on a stale read fails with 409 instead of silently overwriting a newer decision.
        """
        body = {"metadata": {"resourceVersion": resource_version}, "status": patch}
        return await self.request(
            "PATCH",
            self.job_path(namespace, name) + "/status",
            body=body,
            content_type="application/merge-patch+json",
        )

    # -- pods ------------------------------------------------------------------------------

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Pods matching a label selector (a consistent read)."""
        found = await self.request(
            "GET", self.core_path(namespace, "pods"), query={"labelSelector": selector}
        )
        return list(found.get("items") or [])

    async def create(self, path: str, body: dict[str, Any], *, exist_ok: bool = True) -> bool:
        """POST an object; False when it already existed (409) and ``exist_ok``."""
        try:
            await self.request("POST", path, body=body)
        except ApiError as err:
            if err.conflict and exist_ok:
                return False
            raise
        return True

    async def delete_pod(self, namespace: str, name: str, uid: str | None) -> None:
        """Delete with the pod's own grace period; preconditioned on uid so a pod of the same
        name created meanwhile is never hit. Gone already is fine."""
        body: dict[str, Any] = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", self.core_path(namespace, "pods", name), body=body)
        except ApiError as err:
            if err.not_found or err.conflict:
                return
            raise

    async def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Merge-patch pod annotations (the preemption notice). Gone already is fine."""
        await self._patch_pod_metadata(namespace, name, {"annotations": annotations})

    async def relabel_pod(
        self,
        namespace: str,
        name: str,
        labels: dict[str, str | None],
        annotations: dict[str, str | None],
    ) -> None:
        """Merge-patch a pod's labels and annotations (a None value removes one): a kept pod
        adopted into a new attempt (survivors.py). Gone already is fine: the next pass sees a
        lost rank."""
        await self._patch_pod_metadata(
            namespace, name, {"labels": labels, "annotations": annotations}
        )

    async def _patch_pod_metadata(
        self, namespace: str, name: str, metadata: dict[str, Any]
    ) -> None:
        try:
            await self.request(
                "PATCH",
                self.core_path(namespace, "pods", name),
                body={"metadata": metadata},
                content_type="application/merge-patch+json",
            )
        except ApiError as err:
            if not err.not_found:
                raise

    # -- gang scheduling -------------------------------------------------------------------

    @staticmethod
    def pod_group_path(namespace: str, name: str = "") -> str:
        """Path of a scheduling.k8s.io PodGroup (or the collection)."""
        base = f"/apis/{gang.GROUP_VERSION}/namespaces/{quote(namespace)}/{gang.PODGROUP_RESOURCE}"
        return f"{base}/{quote(name)}" if name else base

    async def serves_pod_groups(self) -> bool:
        """API discovery: does the server serve the PodGroup API (native gang scheduling)?"""
        try:
            found = await self.request("GET", f"/apis/{gang.GROUP_VERSION}")
        except ApiError as err:
            if err.not_found:
                return False
            raise
        return gang.serves_pod_groups(found)

    async def serves_kueue(self) -> bool:
        """API discovery: is Kueue installed (does the server serve its API group)?"""
        try:
            found = await self.request("GET", f"/apis/{gang.KUEUE_GROUP}")
        except ApiError as err:
            if err.not_found:
                return False
            raise
        return gang.serves_group(found)

    async def delete_object(self, path: str, *, uid: str | None = None) -> None:
        """Delete any object by path; gone already is fine. With ``uid``, only that object: one
        of the same name created meanwhile is left alone (409, also fine)."""
        body: dict[str, Any] | None = None
        if uid:
            body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
        try:
            await self.request("DELETE", path, body=body)
        except ApiError as err:
            if not (err.not_found or (uid and err.conflict)):
                raise

    # -- nodes -----------------------------------------------------------------------------

    async def get_node(self, name: str) -> dict[str, Any] | None:
        """The node, or None when it was deleted."""
        return await self.get_object(f"/api/v1/nodes/{quote(name)}")

    async def get_node_lease(self, name: str) -> dict[str, Any] | None:
        """The node's Lease in ``kube-node-lease`` (its kubelet's heartbeat), or None."""
        namespace = names.NODE_LEASE_NAMESPACE
        return await self.get_object(
            f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{quote(name)}"
        )

    # -- trainer identity and service -------------------------------------------------------

    _SUPPORT_PATHS: ClassVar[dict[str, tuple[str, str]]] = {
        "ServiceAccount": ("core", "serviceaccounts"),
        "Role": ("rbac", "roles"),
        "RoleBinding": ("rbac", "rolebindings"),
        "Service": ("core", "services"),
    }

    def support_path(self, namespace: str, kind: str, name: str = "") -> str:
        """Path of a support object kind (ServiceAccount, Role, RoleBinding, Service)."""
        group, plural = self._SUPPORT_PATHS[kind]
        if group == "core":
            return self.core_path(namespace, plural, name)
        return self.rbac_path(namespace, plural, name)

    async def get_object(self, path: str) -> dict[str, Any] | None:
        """Any object by path, or None when it does not exist."""
        try:
            return await self.request("GET", path)
        except ApiError as err:
            if err.not_found:
                return None
            raise

    async def get_support(
        self, namespace: str, wanted: Mapping[str, str]
    ) -> dict[str, dict[str, Any] | None]:
        """The support objects named in ``wanted`` (kind -> name), read concurrently."""
        kinds = list(wanted)
        found = await asyncio.gather(
            *(self.get_object(self.support_path(namespace, k, wanted[k])) for k in kinds)
        )
        return dict(zip(kinds, found, strict=True))

    async def merge_patch(self, path: str, name: str, patch: dict[str, Any]) -> None:
        """Merge-patch an object (a Role's rules, a Service's ports: lists are replaced)."""
        await self.request(
            "PATCH",
            f"{path}/{quote(name)}",
            body=patch,
            content_type="application/merge-patch+json",
        )

    # -- events ----------------------------------------------------------------------------

    async def post_event(
        self, involved: dict[str, Any], type_: str, reason: str, message: str, now_iso: str
    ) -> None:
        """A core/v1 Event about ``involved`` (apiVersion, kind, name, namespace, uid)."""
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{involved['name']}.",
                "namespace": involved["namespace"],
            },
            "involvedObject": involved,
            "type": type_,
            "reason": reason,
            "message": message[:1000],
            "source": {"component": names.COMPONENT},
            "firstTimestamp": now_iso,
            "lastTimestamp": now_iso,
            "count": 1,
        }
        await self.request("POST", self.core_path(involved["namespace"], "events"), body=event)
