"""The synchronous Kubernetes client of the tools and tests: plain JSON over HTTPS.

Used by the pod runner (``tools/podrunner``), the local stack of ``make demo``
(``tools/localstack/``), the test suites and the latency benchmarks. It is the product's
transport (``rtj_operator.kube_transport``: credentials, the connection pool, one request, one
``ApiError`` with ``.status``, ``.reason``, ``.message`` and ``.not_found``/``.conflict``/
``.invalid``/``.forbidden``/``.gone``) with what the tools need on top: a kubeconfig file named
explicitly, watches, and the server's CA for pods. The operator's async client
(``rtj_operator.kube``) is the same transport with the operator's verbs.

It speaks dicts in the wire format (camelCase, exactly what ``kubectl get -o json`` shows):
a kubelet stand-in must round-trip fields the generated client's models may not know yet, and
status patches need an explicit strategic-merge content type.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import urllib3

from rtj_operator.kube_transport import (
    JSON,
    MERGE,
    STRATEGIC,
    ApiError,
    Transport,
    load_configuration,
)

__all__ = ["JSON", "MERGE", "STRATEGIC", "ApiError", "Kube", "Obj"]

Obj = dict[str, Any]
USER_AGENT = "rtj-tools/0"


class Kube:
    """A thread-safe connection pool to one API server, authenticated from a kubeconfig."""

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
