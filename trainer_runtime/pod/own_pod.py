"""The runtime's one way to talk to the API server: its own pod's annotations, read or patched.

Rank 0 keeps its progress there (``pod/progress.py``); a standby pod's agent says there that it is
warm (``agent/standby.py``). It speaks plain HTTPS with the pod's service-account token (the
runtime must not depend on the kubernetes client). Outside a pod (no pod name, no API server
address or no token) it is disabled, and callers skip it.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from .. import envvars

DEFAULT_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
PATCH_ERRORS = (OSError, ssl.SSLError)
"""What a failed patch raises (``urllib.error.URLError`` is an ``OSError``)."""


class OwnPod:
    """This pod on the API server, as the kubelet's environment and service account name it."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.pod = environ.get(envvars.POD_NAME, "").strip()
        host = environ.get(envvars.KUBERNETES_SERVICE_HOST, "").strip()
        port = environ.get(envvars.KUBERNETES_SERVICE_PORT, "443").strip()
        sa = Path(environ.get(envvars.SERVICEACCOUNT_DIR, "").strip() or DEFAULT_SA_DIR)
        ns = environ.get(envvars.NAMESPACE, "").strip()
        if not ns and (sa / "namespace").exists():
            ns = (sa / "namespace").read_text().strip()
        self.namespace = ns
        self.token_file = sa / "token"
        self.ca_file = sa / "ca.crt"
        host = f"[{host}]" if ":" in host else host
        self.url = f"https://{host}:{port}/api/v1/namespaces/{ns}/pods/{self.pod}"
        self.enabled = bool(self.pod and host and ns and self.token_file.exists())

    def annotate(self, annotations: Mapping[str, str | None]) -> None:
        """Set (None: remove) annotations of this pod; raises one of ``PATCH_ERRORS``."""
        body = {"metadata": {"annotations": dict(annotations)}}
        self._call("PATCH", json.dumps(body).encode())

    def annotate_retrying(
        self, annotations: Mapping[str, str | None], tries: int
    ) -> BaseException | None:
        """``annotate``, tried up to ``tries`` times (at least once) with a growing pause between
        (0.5 s, 1 s, ...); None once written, else the last of ``PATCH_ERRORS`` raised."""
        attempt = 1
        while True:
            try:
                self.annotate(annotations)
                return None
            except PATCH_ERRORS as exc:
                if attempt >= tries:
                    return exc
            time.sleep(0.5 * attempt)
            attempt += 1

    def annotations(self) -> dict[str, str]:
        """This pod's annotations now; raises one of ``PATCH_ERRORS``, or ``ValueError`` on an
        answer that is not a pod."""
        pod = json.loads(self._call("GET", None))
        found = ((pod if isinstance(pod, dict) else {}).get("metadata") or {}).get("annotations")
        return {k: v for k, v in (found or {}).items() if isinstance(v, str)}

    def _call(self, method: str, body: bytes | None) -> bytes:
        token = self.token_file.read_text().strip()
        ctx = ssl.create_default_context(
            cafile=str(self.ca_file) if self.ca_file.exists() else None
        )
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/merge-patch+json"
        req = urllib.request.Request(  # noqa: S310 - https URL built from the kubelet's env
            self.url, data=body, method=method, headers=headers
        )
        with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:  # noqa: S310
            return resp.read()
