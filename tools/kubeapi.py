"""The synchronous Kubernetes client of the tools and tests: plain JSON over HTTPS.

The one client of everything that is not the operator: the pod runner (``tools/podrunner``), the
local stack of ``make demo`` (``tools/localstack/``), the Kueue bed, the test suites and the
latency benchmarks. It is the product's transport (``rtj_operator.act.kube_transport``:
credentials, the connection pool, one request, one ``ApiError`` with ``.status``, ``.reason``,
``.message`` and ``.not_found``/``.conflict``/``.invalid``/``.forbidden``/``.gone``) with what
the tools need on top: a kubeconfig file named explicitly, watches, the server's CA for pods,
and the verbs the tests and benchmarks drive a cluster with (objects applied from manifests,
jobs, pods, Events). What a cloud, a kubelet or the runtime would write to the API server where
none runs (kwok's fake nodes) is in ``tools/kubestandins.py``, mixed in here. The operator's
async client (``rtj_operator.act.kube``) is the same transport with the operator's verbs.

It speaks dicts in the wire format (camelCase, exactly what ``kubectl get -o json`` shows):
a kubelet stand-in must round-trip fields the generated client's models may not know yet, and
status patches need an explicit strategic-merge content type.
"""

from __future__ import annotations

import json
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import urllib3
import yaml

from rtj_operator.act.kube import KubeApi
from rtj_operator.act.kube_transport import (
    JSON,
    MERGE,
    STRATEGIC,
    ApiError,
    Transport,
    load_configuration,
)
from rtj_operator.api import names
from tools.kubestandins import KWOK_ANNOTATION, POOL_LABEL, StandIns

__all__ = [
    "JSON",
    "KWOK_ANNOTATION",
    "MERGE",
    "POOL_LABEL",
    "STRATEGIC",
    "ApiError",
    "Kube",
    "Obj",
    "env_of",
    "rtj",
    "unique",
]

Obj = dict[str, Any]
USER_AGENT = "rtj-tools/0"

COLLECTIONS = {
    "CustomResourceDefinition": "customresourcedefinitions",
    "ClusterKopfPeering": "clusterkopfpeerings",
    "KopfPeering": "kopfpeerings",
    "PriorityClass": "priorityclasses",
    "ServiceAccount": "serviceaccounts",
    "Namespace": "namespaces",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    names.KIND: names.PLURAL,
}
"""The plural of each kind ``apply`` finds its collection for (other kinds name it)."""


class Kube(StandIns):
    """A thread-safe connection pool to one API server, authenticated from a kubeconfig, with
    the verbs of the tools and tests (the stand-in verbs come from ``StandIns``)."""

    def __init__(self, kubeconfig: str | None, *, timeout_s: float = 30.0) -> None:
        cfg = load_configuration(kubeconfig, in_cluster=False)  # a kubeconfig, also in a pod
        self.transport = Transport(
            cfg,
            user_agent=USER_AGENT,
            max_connections=32,
            timeout=urllib3.Timeout(connect=min(timeout_s, 10.0), read=timeout_s),
        )
        # The CA that verifies this server (kept as bytes: for certificate-authority-data the
        # client library writes a temporary file). Pods get it as their ca.crt.
        self.ca_pem: bytes | None = (
            Path(cfg.ssl_ca_cert).read_bytes() if cfg.ssl_ca_cert and cfg.verify_ssl else None
        )

    @property
    def server_address(self) -> tuple[str, int]:
        """Host and port of the API server (for the in-pod KUBERNETES_SERVICE_* variables)."""
        parsed = urllib.parse.urlsplit(self.transport.host)
        return parsed.hostname or "127.0.0.1", parsed.port or 443

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        content_type: str = JSON,
        timeout_s: float | None = None,
    ) -> Obj:
        """One call; raises ApiError on a non-2xx answer. A plain-text answer (``/readyz``)
        comes back as ``{"message": text}``."""
        return self.transport.request(
            method,
            path,
            query=params,
            body=body,
            content_type=content_type,
            timeout=None if timeout_s is None else urllib3.Timeout(connect=10.0, read=timeout_s),
        )

    def get(self, path: str, params: dict[str, Any] | None = None) -> Obj | None:
        """GET, or None when the object does not exist."""
        try:
            return self.request("GET", path, params=params)
        except ApiError as err:
            if err.not_found:
                return None
            raise

    def open_watch(
        self,
        path: str,
        params: dict[str, Any],
        *,
        timeout_s: int = 60,
        read_timeout_s: float | None = None,
    ) -> urllib3.BaseHTTPResponse:
        """Open a watch stream and return the response once its headers arrived.

        For callers that must know the watch is established before they act (a benchmark
        timing pod creation); ``watch`` below is the usual way to follow one. The caller
        releases the connection (``release_conn``).
        """
        query = {
            **params,
            "watch": "true",
            "timeoutSeconds": timeout_s,
            "allowWatchBookmarks": "true",
        }
        return self.transport.stream(path, query, read_timeout_s=read_timeout_s)

    def watch(self, path: str, params: dict[str, Any], *, timeout_s: int = 60) -> Iterator[Obj]:
        """Watch events (``{"type", "object"}``) until the server closes the stream.

        ``timeout_s`` bounds the server side; the client's read timeout is a little longer, so a
        dead connection is noticed instead of hanging the watcher forever.
        """
        resp = self.open_watch(path, params, timeout_s=timeout_s, read_timeout_s=timeout_s + 15.0)
        try:
            if resp.status >= 300:
                raise Transport.error_of(resp, "WATCH", path)
            pending = b""
            for chunk in resp.stream(65536):
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            resp.release_conn()

    # -- objects -------------------------------------------------------------------------------

    def req(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = JSON,
    ) -> Obj:
        """``request`` with the query named ``query`` (the tests' spelling)."""
        return self.request(method, path, body=body, params=query, content_type=content_type)

    def apply(self, doc: Obj, collection: str | None = None) -> Obj:
        """Create, or replace keeping the resourceVersion; the object as stored.
        ``collection``: the path to create in, for a kind ``COLLECTIONS`` does not know."""
        meta = doc["metadata"]
        if collection is None:
            api_version = doc["apiVersion"]
            prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            ns = meta.get("namespace")
            plural = COLLECTIONS[doc["kind"]]
            collection = f"{prefix}/namespaces/{ns}/{plural}" if ns else f"{prefix}/{plural}"
        try:
            return self.request("POST", collection, body=doc)
        except ApiError as err:
            if not err.conflict:
                raise
        path = f"{collection}/{meta['name']}"
        current = self.request("GET", path)
        version = current["metadata"]["resourceVersion"]
        return self.request(
            "PUT", path, body={**doc, "metadata": {**meta, "resourceVersion": version}}
        )

    def apply_file(self, path: Path) -> None:
        """Create or replace every object of a YAML file (CRDs and peering objects)."""
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                self.apply(doc)

    def crd_established(self, name: str) -> bool:
        """Whether the CustomResourceDefinition ``name`` exists and is Established."""
        crd = self.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or {}
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    def delete(self, path: str) -> None:
        """Delete (not waiting), ignoring an object that is already gone."""
        try:
            self.request("DELETE", path)
        except ApiError as err:
            if not err.not_found:
                raise

    def create_namespace(self, name: str) -> None:
        """Create a namespace."""
        self.request(
            "POST",
            "/api/v1/namespaces",
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )

    def delete_namespace(self, name: str) -> None:
        """Delete a namespace (not waiting)."""
        self.delete(f"/api/v1/namespaces/{name}")

    def events(self, ns: str, involved: str) -> list[Obj]:
        """Events about one object."""
        items = self.request("GET", f"/api/v1/namespaces/{ns}/events")["items"]
        return [e for e in items if e["involvedObject"].get("name") == involved]

    # -- jobs and pods -------------------------------------------------------------------------

    job_path = staticmethod(KubeApi.job_path)
    """Path of a ResumableTrainingJob, ``(namespace, name="")``: the operator's own."""

    def create_job(self, body: Obj) -> Obj:
        """Create a ResumableTrainingJob."""
        return self.request("POST", self.job_path(body["metadata"]["namespace"]), body=body)

    def job(self, ns: str, name: str) -> Obj | None:
        """A job."""
        return self.get(self.job_path(ns, name))

    def status(self, ns: str, name: str) -> Obj:
        """A job's status ({} when absent)."""
        return (self.job(ns, name) or {}).get("status") or {}

    def patch_job(self, ns: str, name: str, spec: Obj) -> Obj:
        """Merge-patch a job's spec."""
        return self.request(
            "PATCH", self.job_path(ns, name), content_type=MERGE, body={"spec": spec}
        )

    def delete_job(self, ns: str, name: str) -> None:
        """Delete a job (background cascade)."""
        self.request("DELETE", self.job_path(ns, name))

    def pods(self, ns: str, job: str, attempt: int | None = None) -> list[Obj]:
        """A job's pods, optionally of one attempt, sorted by name."""
        selector = names.job_selector(job)
        if attempt is not None:
            selector += f",{names.LABEL_ATTEMPT}={attempt}"
        found = self.request(
            "GET", f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": selector}
        )["items"]
        return sorted(found, key=lambda p: p["metadata"]["name"])

    def pod(self, ns: str, name: str) -> Obj | None:
        """A pod."""
        return self.get(f"/api/v1/namespaces/{ns}/pods/{name}")

    def running(self, ns: str, job: str, attempt: int, replicas: int) -> list[Obj]:
        """The attempt's pods when all ``replicas`` run (else an empty list)."""
        pods = [
            p
            for p in self.pods(ns, job, attempt)
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]
        return pods if len(pods) == replicas else []

    def evict(self, ns: str, pod: str) -> None:
        """The Eviction API (what kubectl drain uses)."""
        self.request(
            "POST",
            f"/api/v1/namespaces/{ns}/pods/{pod}/eviction",
            body={
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": pod, "namespace": ns},
            },
        )


def env_of(pod: Obj, container: int = 0) -> dict[str, str]:
    """A container's literal environment."""
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][container]["env"]}


def unique(prefix: str) -> str:
    """A short unique name (DNS-safe when ``prefix`` is)."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def rtj(name: str, ns: str, pool: str, replicas: int = 2, **spec: Any) -> Obj:
    """A ResumableTrainingJob pinned to one pool of stand-in nodes (so tests never share
    nodes). ``spec`` adds or replaces spec fields; ``template_spec`` updates the pod spec."""
    template_spec: Obj = {
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
