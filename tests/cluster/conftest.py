"""Fixtures for tests that need a real API server.

The cluster is the test session's shared local control plane (``kubeconfig`` and
``control_plane`` in ``tests/conftest.py``: kube-apiserver, etcd, controller-manager, scheduler
and kwok fake nodes), or any cluster named by ``KUBECONFIG`` when it is set. Missing tooling
skips the suite locally but fails it under ``CI=true``.

The operator runs as a real subprocess (``python -m rtj_operator``), serving only namespaces named
``rtj-e2e-*``; each test gets its own namespace and its own pool of fake nodes, so tests never
share pods or nodes and a failure leaves the others unaffected.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import NamespaceFactory

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_DIR = ROOT / "operator"
if str(OPERATOR_DIR) not in sys.path:
    sys.path.insert(0, str(OPERATOR_DIR))

from tools.kubeapi import Kube, unique  # noqa: E402
from tools.ports import free_port  # noqa: E402
from tools.waiting import wait_for  # noqa: E402

E2E_NAMESPACES = "rtj-e2e-*"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in this folder needs the API server."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def kube(kubeconfig: str) -> Kube:
    """API access for the tests, with the CRDs installed."""
    client = Kube(kubeconfig)
    wait_for("the API server", lambda: client.get("/readyz") is not None, 60)
    for crd in sorted((ROOT / "crds").glob("*.yaml")):
        client.apply_file(crd)
    for name in ("resumabletrainingjobs.resumable.dev", "kopfpeerings.kopf.dev"):
        wait_for(f"CRD {name} established", lambda n=name: _established(client, n), 30)
    return client


def _established(client: Kube, name: str) -> bool:
    crd = client.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or {}
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


@dataclass
class OperatorProcess:
    """A running ``python -m rtj_operator``."""

    proc: subprocess.Popen[bytes]
    log: Path
    liveness: str
    metrics: str

    def tail(self, lines: int = 60) -> str:
        """The end of its log (for failure messages)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.proc.poll() is None

    def stop(self) -> None:
        """Terminate (SIGTERM, then SIGKILL)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_operator(
    kubeconfig: str,
    log: Path,
    *args: str,
    env: dict[str, str] | None = None,
    wait: bool = True,
    crash_at: str | None = None,
) -> OperatorProcess:
    """Start the operator as a subprocess; wait until its liveness endpoint answers.

    ``crash_at``: run it through ``tests.cluster.crashing_operator``, which exits abruptly at
    that point (``after-status`` or ``mid-creation``) of its first gang resubmission.
    """
    live_port, metrics_port = free_port(), free_port()
    liveness = f"http://127.0.0.1:{live_port}/healthz"
    full_env = {
        **os.environ,
        "KUBECONFIG": kubeconfig,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(
            [str(OPERATOR_DIR), str(ROOT), os.environ.get("PYTHONPATH", "")]
        ),
        **(env or {}),
    }
    entry = ["rtj_operator"]
    if crash_at is not None:
        entry = ["tests.cluster.crashing_operator", "--crash-at", crash_at]
    cmd = [
        sys.executable,
        "-m",
        *entry,
        "--liveness",
        liveness,
        "--metrics-port",
        str(metrics_port),
        "--metrics-address",
        "127.0.0.1",
        "--resync-seconds",
        "30",
        *args,
    ]
    handle = log.open("ab")
    proc = subprocess.Popen(cmd, env=full_env, stdout=handle, stderr=subprocess.STDOUT)
    op = OperatorProcess(proc, log, liveness, f"http://127.0.0.1:{metrics_port}/metrics")
    if wait:
        wait_for(
            "operator liveness",
            lambda: _answers(liveness) or not op.alive(),
            60,
            interval=0.2,
            on_timeout=op.tail,
        )
        assert op.alive(), f"operator exited at start:\n{op.tail()}"
    return op


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:  # noqa: S310 (local URL)
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="package")
def operator(
    kube: Kube, kubeconfig: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The operator under test, serving the ``rtj-e2e-*`` namespaces.

    Package-scoped: it stops when the last test of this folder is done, so the suites that run
    after it on the session's shared control plane do not share the machine with it.
    """
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = start_operator(kubeconfig, log, "--namespace", E2E_NAMESPACES, "--standalone")
    # kopf lists the namespaces, then starts a namespace watch that ignores its own initial
    # listing: a namespace created between the two is not served until it next changes. Let
    # the watch start before the first test namespace exists.
    time.sleep(3)
    yield op
    op.stop()
    print(f"\noperator log: {log}")


@dataclass
class Pool:
    """A private set of fake nodes for one test."""

    kube: Kube
    name: str
    nodes: list[str] = field(default_factory=list)

    def add(self, count: int = 1, *, cpu: str = "32", kwok: bool = True) -> list[str]:
        """Create nodes and wait until they are Ready."""
        added = []
        for _ in range(count):
            node = unique(self.name)
            self.kube.make_node(node, self.name, cpu=cpu, kwok=kwok)
            self.nodes.append(node)
            added.append(node)
        for node in added:
            wait_for(f"node {node} Ready", lambda n=node: self.kube.node_ready(n), 60)
        return added

    def cleanup(self) -> None:
        """Delete every node of the pool."""
        for node in self.nodes:
            self.kube.delete_node(node)


@pytest.fixture
def pool(kube: Kube) -> Iterator[Pool]:
    """An empty pool; tests add the nodes they need."""
    p = Pool(kube, unique("pool"))
    yield p
    p.cleanup()


@pytest.fixture
def ns(kube: Kube, operator: OperatorProcess, make_namespace: NamespaceFactory) -> Iterator[str]:
    """A fresh namespace served by the operator (deleted after the test)."""
    name = make_namespace("rtj-e2e")
    time.sleep(0.2)
    yield name
