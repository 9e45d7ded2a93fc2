"""Rank 0 tells the operator how far training got, by annotating its own pod.

The termination message (``reporting.py``) only reaches the API server when a container ends
normally; when a node is lost it never does. So rank 0 also keeps the annotation
``resumable.dev/progress`` on its pod current: the last committed checkpoint (at once after each
commit) and the current step (at most every ``interval_s``). The operator reads it to resume
from the right checkpoint and to count the steps an interruption lost.

It speaks plain HTTPS to the API server with the pod's service-account token (the runtime must
not depend on the kubernetes client), from a daemon thread: training never waits on the API
server, and a failure is logged once, not raised.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import threading
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import envvars

log = logging.getLogger(__name__)
DEFAULT_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class ProgressReporter:
    def __init__(self, *, interval_s: float = 10.0, environ: dict[str, str] | None = None) -> None:
        env = dict(os.environ if environ is None else environ)
        self.interval_s = interval_s
        self.pod = env.get(envvars.POD_NAME, "").strip()
        host = env.get(envvars.KUBERNETES_SERVICE_HOST, "").strip()
        port = env.get(envvars.KUBERNETES_SERVICE_PORT, "443").strip()
        sa = Path(env.get(envvars.SERVICEACCOUNT_DIR, "").strip() or DEFAULT_SA_DIR)
        ns = env.get(envvars.NAMESPACE, "").strip()
        if not ns and (sa / "namespace").exists():
            ns = (sa / "namespace").read_text().strip()
        self.namespace = ns
        self.token_file = sa / "token"
        self.ca_file = sa / "ca.crt"
        host = f"[{host}]" if ":" in host else host
        self.url = f"https://{host}:{port}/api/v1/namespaces/{ns}/pods/{self.pod}"
        self.enabled = bool(self.pod and host and ns and self.token_file.exists())
        self._state: dict[str, Any] = {}
        self._sent: dict[str, Any] | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._warned = False
        self._thread: threading.Thread | None = None

    def _ensure_thread(self) -> None:
        if self._thread is None and self.enabled:
            self._thread = threading.Thread(target=self._run, name="rtj-progress", daemon=True)
            self._thread.start()

    def step(self, current_step: int) -> None:
        """Cheap: records the step; the thread sends it on its next tick."""
        if self.enabled:
            self._state["current_step"] = current_step
            self._ensure_thread()

    def committed(self, record: dict[str, Any]) -> None:
        """A checkpoint committed: send now."""
        if self.enabled:
            self._state.update(record)
            self._state["current_step"] = max(
                record.get("step", 0), self._state.get("current_step", 0)
            )
            self._ensure_thread()
            self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            self.flush()

    def flush(self) -> None:
        state = dict(self._state)
        if not state or state == self._sent:
            return
        state["reported_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        body = {"metadata": {"annotations": {envvars.PROGRESS_ANNOTATION: json.dumps(state)}}}
        try:
            self._patch(body)
            self._sent = {k: v for k, v in state.items() if k != "reported_at"}
        except (OSError, urllib.error.URLError, ssl.SSLError) as exc:
            if not self._warned:
                log.warning("cannot report progress to the API server (%s); training goes on", exc)
                self._warned = True

    def _patch(self, body: dict[str, Any]) -> None:
        token = self.token_file.read_text().strip()
        ctx = ssl.create_default_context(
            cafile=str(self.ca_file) if self.ca_file.exists() else None
        )
        req = urllib.request.Request(  # noqa: S310 - https URL built from the kubelet's env
            self.url,
            data=json.dumps(body).encode(),
            method="PATCH",
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/merge-patch+json",
                "Accept": "application/json",
            },
        )
        with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:  # noqa: S310
            resp.read()

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._wake.set()
            self._thread.join(timeout=5)
            self._thread = None
        if self.enabled:
            self.flush()
