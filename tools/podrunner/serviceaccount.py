"""The pod's service-account folder: a bound token, the cluster CA and the namespace.

A kubelet mounts ``/var/run/secrets/kubernetes.io/serviceaccount`` into every pod that
automounts its token, and in-cluster clients (``trainer_runtime.pod.progress`` among them) use it
with ``KUBERNETES_SERVICE_HOST``/``_PORT`` to call the API server. The runner cannot mount, so
it writes that folder per pod and points the container at it, two ways: the standard mount path
is rewritten to it like any volume path, and ``RTJ_SERVICEACCOUNT_DIR`` (the runtime's override
of the default path, which a program builds itself and the rewriting cannot see) names it.

Why not just reuse the ``kube-api-access-*`` projected volume the ServiceAccount admission
plugin adds? Its ``ca.crt`` is the ``kube-root-ca.crt`` ConfigMap: the CA of the in-cluster
endpoint (``kubernetes.default.svc``). Our pods reach the API server at the address of the
agent's kubeconfig instead, whose certificate is checked against the kubeconfig's CA; the two
coincide on the local control plane but need not elsewhere. So this folder takes ``ca.crt`` from
the kubeconfig, and replaces that projected volume at the standard path.

The token comes from the TokenRequest API, bound to the pod (it stops working once the pod is
gone), and is renewed at 80% of its lifetime, as the kubelet's token manager does.
"""

from __future__ import annotations

import logging
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .translate import ConfigError
from .volumes import write_atomic_dir

log = logging.getLogger("podrunner")

Obj = dict[str, Any]
MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where a kubelet mounts the service-account token, CA and namespace."""
ENV_DIR = "RTJ_SERVICEACCOUNT_DIR"
"""The runtime's variable naming that folder (``trainer_runtime.envvars.SERVICEACCOUNT_DIR``)."""
TOKEN_SECONDS = 3607
"""Requested lifetime: the kubelet's (and the admission plugin's) value."""
REFRESH_FRACTION = 0.8
RETRY_S = 30.0
"""After a failed renewal, try again this much later (the old token is still valid)."""

RequestToken = Callable[[Obj, int], Obj | None]
"""``request(pod, seconds)`` → the TokenRequest's ``status`` (``token``, ...), or None."""
Fetch = Callable[[str, str, str], Obj | None]


def automounts(pod: Obj, fetch: Fetch) -> bool:
    """Whether the pod gets a token: its own setting, else its ServiceAccount's, else yes."""
    spec = pod.get("spec") or {}
    if spec.get("automountServiceAccountToken") is not None:
        return bool(spec["automountServiceAccountToken"])
    account = spec.get("serviceAccountName") or "default"
    try:
        obj = fetch("serviceaccounts", pod["metadata"]["namespace"], account)
    except Exception as err:
        raise ConfigError(f"cannot read serviceaccount {account!r}: {err}") from err
    if obj is None:
        raise ConfigError(f"serviceaccount {account!r} not found")
    return obj.get("automountServiceAccountToken") is not False


def is_token_volume(volume: Obj) -> bool:
    """A projected volume carrying a service-account token (the admission plugin's
    ``kube-api-access-*``): the one this folder stands in for at the standard path."""
    sources = (volume.get("projected") or {}).get("sources") or []
    return any("serviceAccountToken" in s for s in sources)


@dataclass
class ServiceAccountFolder:
    """One pod's token folder, written atomically (the same ``..data`` swap as volumes)."""

    path: Path
    request: RequestToken
    ca_pem: bytes | None
    seconds: int = TOKEN_SECONDS
    clock: Callable[[], float] = time.monotonic
    refresh_at: float = field(default=0.0, init=False)

    def write(self, pod: Obj) -> None:
        """Request a token and write the folder; ConfigError when no token can be had (the pod
        waits, as a kubelet's volume mount would)."""
        status = self.request(pod, self.seconds)
        token = str((status or {}).get("token") or "")
        if not token:
            raise ConfigError("no service-account token (TokenRequest refused)")
        files = {"token": token.encode(), "namespace": pod["metadata"]["namespace"].encode()}
        if self.ca_pem:
            files["ca.crt"] = self.ca_pem
        write_atomic_dir(self.path, files, 0o644)
        self.refresh_at = self.clock() + REFRESH_FRACTION * self.seconds

    def refresh_due(self) -> bool:
        """Whether the token has used up 80% of its lifetime (or the last renewal failed)."""
        return self.clock() >= self.refresh_at

    def refresh(self, pod: Obj) -> bool:
        """Renew the token; on failure keep the current one and retry a little later."""
        try:
            self.write(pod)
        except ConfigError as err:
            log.warning("%s: token renewal failed: %s", pod["metadata"].get("name"), err)
            self.refresh_at = self.clock() + RETRY_S
            return False
        return True


def check_server_certificate(
    host: str, port: int, ca_pem: bytes | None, timeout_s: float = 5.0
) -> str | None:
    """Why a pod could not verify the API server with ``ca.crt`` at ``host``, or None if it can.

    The pods connect to ``KUBERNETES_SERVICE_HOST`` (the kubeconfig's host, ``127.0.0.1`` on the
    local control plane) with the CA from the kubeconfig; the serving certificate must name that
    host (an IP SAN for an address). The agent checks once at start and warns, because the
    runtime only logs a failed progress report and training goes on without it.
    """
    if not ca_pem:
        return "the kubeconfig names no certificate authority (pods get no ca.crt)"
    try:
        ctx = ssl.create_default_context(cadata=ca_pem.decode("ascii", errors="replace"))
        with (
            socket.create_connection((host, port), timeout_s) as raw,
            ctx.wrap_socket(raw, server_hostname=host),
        ):
            return None
    except (OSError, ssl.SSLError, ValueError) as err:
        return f"TLS to {host}:{port} with the kubeconfig's CA fails: {err}"
