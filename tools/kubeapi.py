"""The one Kubernetes HTTP client of the tools and tests: plain JSON over HTTPS.

Used by the pod runner (``tools/podrunner``), the local stack of ``make demo``
(``tools/localstack/``), the test suites and the latency benchmark, so there is one
``ApiError`` (``ApiError(method, path, status, body)``; ``.status``, ``.reason``, ``.message``,
and ``.not_found``/``.conflict``/``.invalid``/``.gone``) and one way to authenticate. The operator
keeps its own async client (``rtj_operator.kube``): the product must not depend on test tooling.

It speaks dicts in the wire format (camelCase, exactly what ``kubectl get -o json`` shows)
rather than the generated client's models: a kubelet stand-in must round-trip fields the
client's models may not know yet, and status patches need an explicit strategic-merge content
type. The ``kubernetes`` package is used only to read the kubeconfig.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

JSON = "application/json"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"

Obj = dict[str, Any]


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status = status
        self.body = body
        try:
            self.reason = str(json.loads(body).get("reason", ""))
            self.message = str(json.loads(body).get("message", body))
        except ValueError:
            self.reason, self.message = "", body
        super().__init__(f"{method} {path}: {status} {self.message}")

    @property
    def not_found(self) -> bool:
        """404: the object is gone."""
        return self.status == 404

    @property
    def conflict(self) -> bool:
        """409: it exists already, or a precondition (uid, resourceVersion) failed."""
        return self.status == 409

    @property
    def invalid(self) -> bool:
        """422: the object failed validation (the message names the field)."""
        return self.status == 422

    @property
    def gone(self) -> bool:
        """410: a watch's resourceVersion is too old; list again."""
        return self.status == 410


class Kube:
    """A thread-safe connection pool to one API server, authenticated from a kubeconfig."""

    def __init__(self, kubeconfig: str | None, *, timeout_s: float = 30.0) -> None:
        cfg = k8s_client.Configuration()
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        self.host = cfg.host.rstrip("/")
        self.timeout_s = timeout_s
        # The CA that verifies this server (kept as bytes: for certificate-authority-data the
        # client library writes a temporary file). Pods get it as their ca.crt.
        self.ca_pem: bytes | None = (
            Path(cfg.ssl_ca_cert).read_bytes() if cfg.ssl_ca_cert and cfg.verify_ssl else None
        )
        self._headers: dict[str, str] = {"Accept": JSON, "User-Agent": "rtj-tools/0"}
        token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
        if token:
            self._headers["Authorization"] = token if " " in token else f"Bearer {token}"
        self._pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=32,
            cert_reqs="CERT_REQUIRED" if cfg.verify_ssl else "CERT_NONE",
            ca_certs=cfg.ssl_ca_cert,
            cert_file=cfg.cert_file,
            key_file=cfg.key_file,
            retries=False,
        )

    @property
    def server_address(self) -> tuple[str, int]:
        """Host and port of the API server (for the in-pod KUBERNETES_SERVICE_* variables)."""
        parsed = urllib.parse.urlsplit(self.host)
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
        """One call; raises ApiError on a non-2xx answer."""
        url = self.host + path
        if params:
            url += "?" + urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        headers = dict(self._headers)
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        resp = self._pool.request(
            method,
            url,
            body=data,
            headers=headers,
            timeout=timeout_s or self.timeout_s,
            preload_content=True,
        )
        text = resp.data.decode("utf-8", errors="replace")
        if resp.status >= 300:
            raise ApiError(method, path, resp.status, text)
        if not text:
            return {}
        try:
            return dict(json.loads(text))
        except ValueError:  # a plain-text endpoint such as /readyz ("ok")
            return {"message": text}

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
        url = self.host + path + "?" + urllib.parse.urlencode(query)
        return self._pool.request(
            "GET",
            url,
            headers=self._headers,
            preload_content=False,
            timeout=urllib3.Timeout(connect=10.0, read=read_timeout_s),
        )

    def watch(self, path: str, params: dict[str, Any], *, timeout_s: int = 60) -> Iterator[Obj]:
        """Watch events (``{"type", "object"}``) until the server closes the stream.

        ``timeout_s`` bounds the server side; the client's read timeout is a little longer, so a
        dead connection is noticed instead of hanging the watcher forever.
        """
        resp = self.open_watch(path, params, timeout_s=timeout_s, read_timeout_s=timeout_s + 15.0)
        try:
            if resp.status >= 300:
                raise ApiError("WATCH", path, resp.status, resp.read().decode(errors="replace"))
            pending = b""
            for chunk in resp.stream(65536):
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            resp.release_conn()
