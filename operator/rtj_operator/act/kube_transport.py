"""The one way this project speaks to a Kubernetes API server: credentials, a connection pool,
a JSON request, and one ``ApiError``.

The operator's async client (``kube.KubeApi``) and the synchronous client the pod runner, the
local stack, the tests and the benchmarks share (``tools/kubeapi.py``) are both built on
``Transport``, so authentication (tokens refreshed by the ``kubernetes`` package, client
certificates, the server's CA), error parsing and timeouts are written once. The tools depend
on the product here, never the other way round.

Plain dictionaries in the wire format (camelCase, as ``kubectl get -o json`` shows) rather than
the generated client's models: those are slow to build on the resubmission path, a different
shape from what kopf hands the handlers, and a kubelet stand-in must round-trip fields the models
may not know yet. The ``kubernetes`` package is used for what it is good at: reading kubeconfig
and in-cluster credentials.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from ..api import envvars

JSON = "application/json"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"

ERROR_TEXT_LIMIT = 2000
"""At most this much of a non-JSON error body goes into ``ApiError.message``."""


class ApiError(Exception):
    """A non-2xx answer from the API server: ``status``, the parsed ``body`` (a Status object,
    or ``{"message": text}`` when the body is not JSON), and its ``reason`` and ``message``."""

    def __init__(self, status: int, body: Mapping[str, Any] | None, method: str, path: str):
        self.status = status
        self.body = dict(body or {})
        self.reason = str(self.body.get("reason", "") or "")
        self.message = str(self.body.get("message", "") or f"HTTP {status}")
        super().__init__(f"{method} {path}: {status} {self.reason}: {self.message}")

    @property
    def not_found(self) -> bool:
        """404: the object does not exist (or is gone)."""
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
    def forbidden(self) -> bool:
        """403: refused by authorization or admission (a missing ServiceAccount, a quota)."""
        return self.status == 403

    @property
    def gone(self) -> bool:
        """410: a watch's resourceVersion is too old; list again."""
        return self.status == 410


def load_configuration(
    kubeconfig: str | None = None, *, in_cluster: bool = True
) -> k8s_client.Configuration:
    """Credentials for one API server. ``kubeconfig``: that file's current context. ``None``:
    in a pod (``KUBERNETES_SERVICE_HOST`` set) and with ``in_cluster``, the pod's
    ServiceAccount; else the kubeconfig ``KUBECONFIG`` names (``~/.kube/config`` without it)."""
    cfg = k8s_client.Configuration()
    if kubeconfig is None and in_cluster and os.environ.get(envvars.IN_CLUSTER_HOST):
        k8s_config.load_incluster_config(client_configuration=cfg)
    else:
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    return cfg


def _parsed(data: bytes, *, error: bool) -> dict[str, Any]:
    """A response body as a dict: its JSON object, ``{}`` when empty, ``{"message": text}``
    otherwise (a plain-text endpoint such as ``/readyz``, or a proxy's error page)."""
    if not data:
        return {}
    try:
        found = json.loads(data)
    except ValueError:
        found = None
    if isinstance(found, dict):
        return found
    text = data.decode("utf-8", errors="replace")
    return {"message": text[:ERROR_TEXT_LIMIT] if error else text}


class Transport:
    """A thread-safe pool of connections to one API server, authenticated as ``cfg`` says."""

    def __init__(
        self,
        cfg: k8s_client.Configuration,
        *,
        user_agent: str,
        max_connections: int,
        timeout: urllib3.Timeout,
    ) -> None:
        self.cfg = cfg
        self.host = cfg.host.rstrip("/")
        self.user_agent = user_agent
        self.timeout = timeout
        pool_args: dict[str, Any] = {"num_pools": 4, "maxsize": max_connections, "block": False}
        if self.host.startswith("https"):
            pool_args["cert_reqs"] = ssl.CERT_REQUIRED if cfg.verify_ssl else ssl.CERT_NONE
            if cfg.ssl_ca_cert:
                pool_args["ca_certs"] = cfg.ssl_ca_cert
            if cfg.cert_file:
                pool_args["cert_file"] = cfg.cert_file
            if cfg.key_file:
                pool_args["key_file"] = cfg.key_file
            if getattr(cfg, "tls_server_name", None):
                pool_args["server_hostname"] = cfg.tls_server_name
        if not cfg.verify_ssl:
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self.http = urllib3.PoolManager(retries=False, **pool_args)

    def close(self) -> None:
        """Release the connections."""
        self.http.clear()

    def headers(self, content_type: str | None = None) -> dict[str, str]:
        """What every request carries: the credentials as they are now (a token the
        ``kubernetes`` package refreshes is read again each time)."""
        headers = {"Accept": JSON, "User-Agent": self.user_agent}
        if content_type:
            headers["Content-Type"] = content_type
        token = self.cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token if " " in token else f"Bearer {token}"
        elif self.cfg.username and self.cfg.password:
            headers.update(
                urllib3.make_headers(basic_auth=f"{self.cfg.username}:{self.cfg.password}")
            )
        return headers

    def url(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        """The server's URL of ``path``; query parameters that are ``None`` are left out."""
        params = {k: v for k, v in (query or {}).items() if v is not None}
        return self.host + path + (f"?{urlencode(params)}" if params else "")

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout: urllib3.Timeout | float | None = None,
    ) -> dict[str, Any]:
        """One call, its answer as a dict; ``ApiError`` on a non-2xx answer."""
        data = None if body is None else json.dumps(body).encode()
        response = self.http.request(
            method,
            self.url(path, query),
            body=data,
            headers=self.headers(content_type if data is not None else None),
            timeout=self.timeout if timeout is None else timeout,
            preload_content=True,
        )
        ok = 200 <= response.status < 300
        payload = _parsed(response.data, error=not ok)
        if not ok:
            raise ApiError(response.status, payload, method, path)
        return payload

    def stream(
        self, path: str, query: Mapping[str, Any], *, read_timeout_s: float | None
    ) -> urllib3.BaseHTTPResponse:
        """A GET whose body is read as it arrives (a watch), returned once its headers are in;
        the caller checks the status and releases the connection (``release_conn``)."""
        return self.http.request(
            "GET",
            self.url(path, query),
            headers=self.headers(),
            preload_content=False,
            timeout=urllib3.Timeout(connect=self.timeout.connect_timeout, read=read_timeout_s),
        )

    @staticmethod
    def error_of(response: urllib3.BaseHTTPResponse, method: str, path: str) -> ApiError:
        """The ``ApiError`` for a streamed response that was not a 2xx."""
        return ApiError(response.status, _parsed(response.read(), error=True), method, path)
