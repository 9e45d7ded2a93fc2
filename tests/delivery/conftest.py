"""Fixtures for the delivery tests: the Helm chart, the Dockerfile and the plain manifests.

Tools come from the project's own cache (``hack/cluster/build.sh`` builds helm and kubectl with
the control plane), else from PATH. The cluster is the session's shared local control plane
(``control_plane`` in ``tests/conftest.py``), never the one ``KUBECONFIG`` points at: these
tests install and delete CRDs. A missing prerequisite skips locally and fails under CI=true.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tests.conftest import IN_CI, require
from tools.controlplane import ControlPlane
from tools.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "resumable-training-operator"
BUILD_SH = ROOT / "hack" / "cluster" / "build.sh"
OPERATOR_DIR = ROOT / "operator"
if str(OPERATOR_DIR) not in sys.path:
    sys.path.insert(0, str(OPERATOR_DIR))

T = TypeVar("T")

CRDS = (
    "resumabletrainingjobs.resumable.dev",
    "kopfpeerings.kopf.dev",
    "clusterkopfpeerings.kopf.dev",
)


def run(
    cmd: list[str],
    *,
    check: bool = True,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on an unexpected exit status fail with its output."""
    proc = subprocess.run(
        cmd,
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        pytest.fail(
            f"command failed ({proc.returncode}): {' '.join(cmd)}\n"
            f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
        )
    return proc


def without_symlink_notes(stderr: str) -> str:
    """helm's stderr minus its notes about following the chart's CRD symlink."""
    return "\n".join(line for line in stderr.splitlines() if "found symbolic link" not in line)


def _cached_bindir(build: bool) -> Path | None:
    if not BUILD_SH.exists():
        return None
    cached = run([str(BUILD_SH), "--check"], check=False).returncode == 0
    if not cached and build:
        # CI only: the first build of the control plane (helm and kubectl included).
        run([str(BUILD_SH)], timeout=7200)
        cached = True
    if not cached:
        return None
    return Path(run([str(BUILD_SH), "--print-bindir"]).stdout.strip())


def _tool(name: str) -> str:
    bindir = _cached_bindir(build=IN_CI)
    if bindir and (bindir / name).exists():
        return str(bindir / name)
    found = shutil.which(name)
    require(
        found is not None,
        f"{name} not found: run hack/cluster/build.sh (it builds helm and kubectl)",
    )
    return str(found)


@pytest.fixture(scope="session")
def helm() -> str:
    """Path of the helm v3 binary."""
    return _tool("helm")


@pytest.fixture(scope="session")
def kubectl() -> str:
    """Path of the kubectl binary."""
    return _tool("kubectl")


def render(
    helm: str, *args: str, release: str = "rtj-operator", namespace: str = "rtj-system"
) -> list[dict[str, Any]]:
    """``helm template`` of the chart with extra arguments, parsed."""
    proc = run([helm, "template", release, str(CHART), "--namespace", namespace, *args])
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def template_fails(helm: str, *args: str) -> str:
    """``helm template`` that must fail; its error output."""
    proc = run([helm, "template", "rtj-operator", str(CHART), *args], check=False)
    assert proc.returncode != 0, f"helm template {' '.join(args)} succeeded but must fail"
    return without_symlink_notes(proc.stderr)


@dataclass
class Cluster:
    """The private local control plane, driven with its own kubeconfig."""

    kubeconfig: str
    kubectl_bin: str
    helm_bin: str

    @property
    def env(self) -> dict[str, str]:
        """Environment for helm and kubectl: this cluster only, private helm state."""
        return {**os.environ, "KUBECONFIG": self.kubeconfig}

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the cluster."""
        return run(
            [self.kubectl_bin, "--kubeconfig", self.kubeconfig, *args],
            stdin=stdin,
            check=check,
            env=self.env,
        )

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run helm against the cluster."""
        return run(
            [self.helm_bin, "--kubeconfig", self.kubeconfig, *args], check=check, env=self.env
        )

    def get(self, *args: str) -> dict[str, Any] | None:
        """``kubectl get ... -o json``; None when absent."""
        proc = self.kubectl("get", *args, "-o", "json", "--ignore-not-found", check=True)
        return json.loads(proc.stdout) if proc.stdout.strip() else None

    def ensure_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        """Create a namespace if absent, and set labels."""
        if self.get("namespace", name) is None:
            self.kubectl("create", "namespace", name)
        if labels:
            self.kubectl(
                "label", "namespace", name, "--overwrite", *[f"{k}={v}" for k, v in labels.items()]
            )

    def crd_established(self, name: str) -> bool:
        """Whether the CRD exists and serves."""
        crd = self.get("crd", name) or {}
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def delete_crds(cluster: Cluster) -> None:
    """Remove the project's CRDs (and so every job): the start of a fresh install."""
    cluster.kubectl("delete", "crd", *CRDS, "--ignore-not-found", "--wait=true")
    wait_for("CRDs gone", lambda: all(cluster.get("crd", n) is None for n in CRDS), 60)


def apply_chart_crds(cluster: Cluster) -> None:
    """The install-without-Helm CRD step of docs/install.md."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    # kubectl wait fails outright ("status.conditions accessor error") while a just-created CRD
    # has no status yet; the API server takes a moment to compile the job CRD's schema.
    wait_for(
        "CRD status",
        lambda: all(cluster.get("crd", n).get("status", {}).get("conditions") for n in CRDS),
        60,
    )
    cluster.kubectl(
        "wait", "--for", "condition=established", "--timeout=60s", *[f"crd/{n}" for n in CRDS]
    )


def kwok_node(name: str) -> dict[str, Any]:
    """A Node that kwok plays the kubelet of: its pods go Running without a container."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"type": "kwok", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
        },
    }


@pytest.fixture(scope="package")
def cluster(helm: str, kubectl: str, control_plane: ControlPlane) -> Iterator[Cluster]:
    """The session's local control plane with one kwok node of its own for these tests.

    Always the local control plane, never the one ``KUBECONFIG`` points at: these tests install
    and delete CRDs. The node is deleted when the last delivery test is done (package scope),
    so no later suite's pods land on a node where nothing runs.
    """
    running = Cluster(control_plane.kubeconfig, kubectl, helm)
    node = f"delivery-{uuid.uuid4().hex[:6]}"
    running.kubectl("create", "-f", "-", stdin=json.dumps(kwok_node(node)))
    try:
        wait_for(
            f"node {node} Ready",
            lambda: any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in ((running.get("node", node) or {}).get("status") or {}).get(
                    "conditions", []
                )
            ),
            60,
        )
        yield running
    finally:
        running.kubectl("delete", "node", node, "--ignore-not-found", "--wait=false", check=False)
