"""Fixtures for tests on real nodes: kubelet + containerd joined to the local control plane.

One session brings up the control plane (``hack/cluster/cluster.sh``, no fake nodes, API server
bound to every address so pods and nodes in other network namespaces reach it), three real nodes
with CoreDNS (``hack/cluster/nodes.sh``), and loads the project's images, built by buildah
without a registry (``hack/images/build.sh``), into the nodes. The runtime image (torch, several
GiB) goes to nodes 1 and 3, where the tests that need it run; the job story loses node 3.

The suite is left out of a plain ``pytest`` run (``-m 'not realnodes'`` in pyproject.toml):
run it with ``make test-realnodes`` or ``pytest -m realnodes tests/realnodes``, as root.

Tests drive the cluster with ``kubectl``, as a user would (``logs``, ``exec``, ``delete``),
rather than through a client library: what is checked is what a user sees.

``RTJ_REALNODES_KEEP=1`` keeps the cluster and its nodes after the session and reuses them in
the next one (images already imported are not imported again); ``RTJ_REALNODES_CLUSTER_NAME``
names the cluster (default ``rtj-realnodes``).

Prerequisites are built or installed under ``CI=true`` and fail the suite when that fails;
locally a missing prerequisite skips the suite, and nothing that takes minutes (the control
plane or the images) is built from a test run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI, require
from tools.controlplane import ControlPlane, ControlPlaneError
from tools.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
BUILD_SH = ROOT / "hack" / "cluster" / "build.sh"
NODES_SH = ROOT / "hack" / "cluster" / "nodes.sh"
IMAGES_SH = ROOT / "hack" / "images" / "build.sh"
CHART = ROOT / "charts" / "resumable-training-operator"
DEPS_SH = ROOT / "hack" / "images" / "deps.sh"
CLUSTER_NAME = os.environ.get("RTJ_REALNODES_CLUSTER_NAME", "rtj-realnodes")
NODES = 3
SESSION_TIMEOUT_S = 2400
RUNTIME_NODES = (1, 3)
"""Nodes that get the runtime image (several GiB each); node 2 keeps the small images only."""
TOOLS = ("mmdebstrap", "buildah", "containerd", "runc", "iptables", "nsenter")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in this folder runs on real nodes.

    Their time limit covers the session fixture too, which the first test pays: bringing up
    the nodes and importing the runtime image (several GiB) into two of them takes minutes.
    """
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.realnodes)
            item.add_marker(pytest.mark.timeout(SESSION_TIMEOUT_S))


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, env=env, capture_output=True, text=True, check=False, timeout=timeout
    )


@dataclass
class RealCluster:
    """The control plane and its real nodes, driven with kubectl."""

    kubeconfig: str
    kubectl: str
    env: dict[str, str]
    images: dict[str, str]
    """Image references by target: operator, runtime."""

    def node(self, index: int) -> str:
        """The Node name (and IP) of node ``index`` (1-based)."""
        return _run([str(NODES_SH), "name", str(index)], self.env, 30).stdout.strip()

    def kill_node(self, index: int) -> None:
        """Lose node ``index``: SIGKILL its kubelet, containerd and containers, delete its Node."""
        killed = _run([str(NODES_SH), "kill-node", str(index)], self.env, 120)
        assert killed.returncode == 0, killed.stderr

    def kubectl_run(
        self, *args: str, check: bool = True, timeout: float = 120, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [self.kubectl, "--kubeconfig", self.kubeconfig, *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
        return proc

    def apply(self, manifest: dict[str, Any]) -> None:
        self.kubectl_run("apply", "-f", "-", stdin=json.dumps(manifest))

    def get(self, kind: str, name: str, ns: str) -> dict[str, Any] | None:
        """The object as JSON, or None when it does not exist; ns "" for cluster-scoped kinds."""
        where = ["-n", ns] if ns else []
        proc = self.kubectl_run("get", kind, name, *where, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def pod_phase(self, name: str, ns: str) -> str:
        pod = self.get("pod", name, ns)
        return pod["status"].get("phase", "") if pod else ""

    def wait_phase(self, name: str, ns: str, phases: set[str], timeout: float = 120) -> str:
        return wait_for(
            f"pod {ns}/{name} in {sorted(phases)}",
            lambda: (p := self.pod_phase(name, ns)) in phases and p,
            timeout,
        )

    def logs(self, name: str, ns: str) -> str:
        return self.kubectl_run("logs", name, "-n", ns).stdout

    def exec(self, name: str, ns: str, *cmd: str) -> subprocess.CompletedProcess[str]:
        return self.kubectl_run("exec", name, "-n", ns, "--", *cmd, check=False)


def _ensure_tools() -> None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing and IN_CI:
        proc = subprocess.run([str(DEPS_SH)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            pytest.fail(f"hack/images/deps.sh failed:\n{proc.stderr[-3000:]}")
        missing = [t for t in TOOLS if shutil.which(t) is None]
    require(not missing, f"missing {', '.join(missing)}: run hack/images/deps.sh")


def _build_images(env: dict[str, str]) -> dict[str, str]:
    """Archive path by target; builds them under CI, requires them cached otherwise."""
    archives = {}
    for target in ("pause", "operator", "runtime"):
        path = _run([str(IMAGES_SH), "--path", target], env, 60).stdout.strip()
        if not Path(path).exists():
            require(IN_CI, f"image {target} not built: run hack/images/build.sh {target}")
            built = _run([str(IMAGES_SH), target], env, 3600)
            if built.returncode != 0:
                pytest.fail(f"hack/images/build.sh {target} failed:\n{built.stderr[-4000:]}")
        archives[target] = path
    coredns = ROOT / "hack" / "cluster" / "build-coredns.sh"
    if _run([str(coredns), "--check"], env, 60).returncode != 0:
        require(IN_CI, "CoreDNS not built: run hack/cluster/build-coredns.sh")
        built = _run([str(coredns)], env, 3600)
        if built.returncode != 0:
            pytest.fail(f"hack/cluster/build-coredns.sh failed:\n{built.stderr[-4000:]}")
    return archives


def _nodes_up(env: dict[str, str]) -> bool:
    """Whether the session's nodes already run (kept by RTJ_REALNODES_KEEP=1)."""
    status = _run([str(NODES_SH), "status"], env, 60).stdout
    return status.count("kubelet=up") == NODES and "=down" not in status


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[RealCluster]:
    """The control plane with three real nodes, CoreDNS, and the project's images loaded."""
    require(os.geteuid() == 0, "real nodes need root (network namespaces, cgroups, mounts)")
    _ensure_tools()
    env = {
        **os.environ,
        "RTJ_CLUSTER_NAME": CLUSTER_NAME,
        "RTJ_APISERVER_BIND_ADDRESS": "0.0.0.0",
    }
    cached = _run([str(BUILD_SH), "--check"], env, 120).returncode == 0
    if not cached:
        require(IN_CI, "control-plane binaries not built: run hack/cluster/build.sh")
        built = _run([str(BUILD_SH)], env, 5400)
        if built.returncode != 0:
            pytest.fail(f"hack/cluster/build.sh failed:\n{built.stderr[-4000:]}")
    archives = _build_images(env)
    keep = os.environ.get("RTJ_REALNODES_KEEP") == "1"
    # Not the session's shared control plane (tests/conftest.py): kubelets and pods in other
    # network namespaces must reach this API server, so it listens on every address.
    plane = ControlPlane(
        CLUSTER_NAME, keep=keep, extra_env={"RTJ_APISERVER_BIND_ADDRESS": "0.0.0.0"}
    )
    if not (keep and _nodes_up(env)):
        # A cluster left over by an interrupted run may have its API server bound to
        # 127.0.0.1 only: start over.
        _run([str(NODES_SH), "down"], env, 300)
        plane.delete(timeout=300)
        try:
            plane.up(nodes=0, timeout=600)
        except ControlPlaneError as err:
            pytest.fail(str(err))
        nodes = _run([str(NODES_SH), "up", str(NODES)], env, 600)
        if nodes.returncode != 0:
            _run([str(NODES_SH), "down"], env, 300)
            pytest.fail(f"nodes.sh up failed:\n{nodes.stderr[-4000:]}")
    try:
        for target in ("operator",):
            imported = _run([str(NODES_SH), "import-image", archives[target]], env, 600)
            if imported.returncode != 0:
                pytest.fail(f"import of {target} failed:\n{imported.stderr[-3000:]}")
        imported = _run(
            [str(NODES_SH), "import-image", archives["runtime"], *map(str, RUNTIME_NODES)],
            env,
            1800,
        )
        if imported.returncode != 0:
            pytest.fail(f"import of runtime failed:\n{imported.stderr[-3000:]}")
        refs = {
            t: _run([str(IMAGES_SH), "--ref", t], env, 60).stdout.strip()
            for t in ("operator", "runtime")
        }
        bin_dir = _run([str(BUILD_SH), "--print-bindir"], env, 60).stdout.strip()
        kubeconfig = plane.kubeconfig_path()
        yield RealCluster(kubeconfig=kubeconfig, kubectl=f"{bin_dir}/kubectl", env=env, images=refs)
    finally:
        if not keep:
            _run([str(NODES_SH), "down"], env, 300)
            plane.delete(timeout=300)


@pytest.fixture
def ns(real_cluster: RealCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards."""
    name = f"rn-{request.node.name.replace('_', '-')[5:40].strip('-')}-{os.getpid() % 1000}"
    real_cluster.kubectl_run("create", "namespace", name)
    # The default ServiceAccount appears shortly after the namespace; pods need it.
    wait_for(
        f"serviceaccount default in {name}",
        lambda: real_cluster.get("serviceaccount", "default", name),
        30,
    )
    yield name
    real_cluster.kubectl_run("delete", "namespace", name, "--wait=false", check=False)


@contextmanager
def operator_release(cluster: RealCluster, ns: str) -> Iterator[list[dict[str, Any]]]:
    """The chart installed in ``ns`` from the built operator image, as a user installs it.

    Yields the release's pods once ``helm install --wait`` says the Deployment is ready (an
    install that fails shows the operator's last log lines); uninstalls afterwards.
    """
    helm = str(Path(cluster.kubectl).parent / "helm")
    release = "rtj"
    repo, _, tag = cluster.images["operator"].rpartition(":")
    base = [helm, "--kubeconfig", cluster.kubeconfig]
    try:
        install = subprocess.run(
            [
                *base,
                *("install", release, str(CHART), "-n", ns),
                *("--set", f"image.repository={repo}", "--set", f"image.tag={tag}"),
                *("--set", "image.pullPolicy=Never", "--set", f"peering.name=rtj-{ns}"),
                *("--wait", "--timeout", "180s"),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=240,
        )
        selector = f"app.kubernetes.io/instance={release}"
        listed = cluster.kubectl_run("get", "pods", "-n", ns, "-l", selector, "-o", "json")
        pods = json.loads(listed.stdout)["items"]
        if install.returncode != 0:
            tails = "".join(
                cluster.kubectl_run(
                    "logs", p["metadata"]["name"], "-n", ns, "--tail=30", check=False
                ).stdout
                for p in pods
            )
            pytest.fail(f"helm install failed:\n{install.stderr[-3000:]}\n{tails}")
        yield pods
    finally:
        subprocess.run(
            [*base, "uninstall", release, "-n", ns],
            capture_output=True,
            check=False,
            timeout=120,
        )
