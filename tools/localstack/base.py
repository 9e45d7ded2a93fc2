"""The stack's configuration and the state every part of it shares.

``LocalStack`` is assembled from one class per concern (cluster, chart and operator, S3 and
namespace, nodes, jobs), each a mixin over this base: the alternative, one class of 600 lines,
was what this package replaced. The base holds the fields, the API client, the cleanup list and
the few API helpers every part uses.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.controlplane import ControlPlane
from tools.kubeapi import ApiError, Kube

from .common import RESULTS_CLAIM, Obj, Say, StackError, _quiet
from .process import Proc


@dataclass
class StackConfig:
    """What to start, and where."""

    workdir: Path
    """Logs, pod folders, the S3 data and the pod runner's shared state (``--state-dir``)."""
    cluster_name: str = "rtj-demo"
    """kwokctl cluster name (``RTJ_CLUSTER_NAME`` of ``cluster.sh``)."""
    namespace: str = "rtj-demo"
    """Where the jobs run."""
    nodes: int = 3
    """Pod-runner Nodes to start (one agent process each)."""
    bucket: str = "rtj-checkpoints"
    """S3 bucket created on the local server (the manifest's ``checkpoint.dir`` names it)."""
    s3_kind: str | None = None
    """``minio``, ``moto`` or None (MinIO when built, else moto)."""
    kubeconfig: Path | None = None
    """An already running local control plane to use (the test session's shared one): the
    stack then neither starts nor deletes it, and removes what it created in it instead."""
    keep_cluster: bool = False
    """Reuse a running cluster of that name and leave it up; otherwise start afresh and delete
    it at the end."""
    say: Say = _quiet
    """Narration of what the stack does (one line each)."""


@dataclass
class Timings:
    """Seconds each start-up phase took (reported by the demo and the e2e)."""

    phases: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a block."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = time.monotonic() - start

    def line(self) -> str:
        """``name 1.2s, other 3.4s``."""
        return ", ".join(f"{k} {v:.1f}s" for k, v in self.phases.items())


class StackBase:
    """Fields and helpers shared by the stack's parts (see ``LocalStack``)."""

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        self.say = cfg.say
        self.workdir = cfg.workdir.resolve()
        self.state_dir = self.workdir / "podrunner-state"
        self.timings = Timings()
        self.kubeconfig: Path | None = None
        self._kube: Kube | None = None
        self.bindir: Path | None = None
        self.s3: Any = None
        self.deployment: Obj = {}
        self.operator: Proc | None = None
        self.operator_liveness = ""
        self.agents: dict[str, Proc] = {}
        self._node_seq = 0
        self._cleanups: list[tuple[str, Callable[[], None]]] = []
        self._created_cluster = False
        self.plane = ControlPlane(cfg.cluster_name, keep=cfg.keep_cluster)

    @property
    def kube(self) -> Kube:
        """API access (admin credentials of the local cluster)."""
        if self._kube is None:
            raise StackError("the stack is not started")
        return self._kube

    def _env(self, **extra: str) -> dict[str, str]:
        env = {**os.environ, "RTJ_CLUSTER_NAME": self.cfg.cluster_name, **extra}
        if self.bindir is not None:
            env["PATH"] = f"{self.bindir}{os.pathsep}{env.get('PATH', '')}"
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def _on_stop(self, what: str, fn: Callable[[], None]) -> None:
        self._cleanups.append((what, fn))

    @property
    def shared_cluster(self) -> bool:
        """Whether the cluster outlives the stack (so the stack cleans up inside it)."""
        return self.cfg.keep_cluster or self.cfg.kubeconfig is not None

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 60) -> str:
        """Run kubectl against the stack's cluster; its output (StackError when it fails)."""
        return self._cluster_tool(
            "kubectl", args, what=" ".join(args), stdin=stdin, timeout=timeout
        )

    def _cluster_tool(
        self,
        tool: str,
        args: tuple[str, ...],
        *,
        what: str,
        timeout: float,
        stdin: str | None = None,
        cwd: Path | None = None,
    ) -> str:
        """Run kubectl or helm from the stack's binaries against its cluster; its output."""
        assert self.bindir is not None and self.kubeconfig is not None
        out = subprocess.run(
            [str(self.bindir / tool), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            env=self._env(),
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            cwd=cwd,
        )
        if out.returncode != 0:
            raise StackError(f"{tool} {what} failed:\n{out.stderr[-3000:]}")
        return out.stdout

    def _create(self, path: str, body: Obj) -> None:
        try:
            self.kube.request("POST", path, body=body)
        except ApiError as err:
            if not err.conflict:
                raise
            name = body["metadata"]["name"]
            self.kube.request("PUT", f"{path}/{name}", body=body)

    def _delete(self, path: str) -> None:
        try:
            self.kube.request("DELETE", path)
        except ApiError as err:
            if not err.not_found:
                raise

    @property
    def results_dir(self) -> Path:
        """The shared folder behind the ``rtj-results`` claim (rank 0 writes final weights)."""
        return self.state_dir / "pvc" / self.cfg.namespace / RESULTS_CLAIM
