"""Fixtures for the pod runner's cluster tests: a control plane, agents, namespaces.

The cluster is the project's local control plane under its own name (``rtj-podrunner``, or
``RTJ_PODRUNNER_CLUSTER_NAME``) so it never collides with the operator suite's, or any cluster
named by ``KUBECONFIG``. It is torn down at the end when this session created it. Every agent is
a real ``python -m tools.podrunner`` process serving one Node, so losing a node is a SIGKILL.
Test Nodes carry a NoSchedule taint, so other suites' pods sharing a cluster never land on them
(the tests bind their pods with ``spec.nodeName``, which needs no toleration).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.conftest import IN_CI, require
from tools.podrunner.kube import ApiError, Kube

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_SH = ROOT / "hack" / "cluster" / "cluster.sh"
BUILD_SH = ROOT / "hack" / "cluster" / "build.sh"
CLUSTER_NAME = os.environ.get("RTJ_PODRUNNER_CLUSTER_NAME", "rtj-podrunner")
TAINT = "podrunner-test=true:NoSchedule"

T = TypeVar("T")


def unique(prefix: str) -> str:
    """A fresh DNS-safe name."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def wait_for(
    what: str, check: Callable[[], T | None], timeout: float = 30.0, interval: float = 0.1
) -> T:
    """Poll ``check`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def _binaries_cached() -> bool:
    return (
        BUILD_SH.exists()
        and subprocess.run([str(BUILD_SH), "--check"], capture_output=True, check=False).returncode
        == 0
    )


@pytest.fixture(scope="session")
def kubeconfig() -> Iterator[str]:
    """KUBECONFIG of the cluster under test; brings the local control plane up when needed."""
    given = os.environ.get("KUBECONFIG")
    if given:
        require(Path(given).exists(), f"KUBECONFIG={given} does not exist")
        yield given
        return
    require(CLUSTER_SH.exists(), f"{CLUSTER_SH} is missing")
    if not IN_CI:
        require(
            _binaries_cached(),
            "control-plane binaries not built: run hack/cluster/build.sh (or set KUBECONFIG)",
        )
    env = {**os.environ, "RTJ_CLUSTER_NAME": CLUSTER_NAME}
    existed = (
        subprocess.run(
            [str(CLUSTER_SH), "status"], env=env, capture_output=True, check=False
        ).returncode
        == 0
    )
    up = subprocess.run(
        [str(CLUSTER_SH), "up", "--nodes", "0"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if up.returncode != 0:
        pytest.fail(f"hack/cluster/cluster.sh up failed:\n{up.stderr[-4000:]}")
    path = subprocess.run(
        [str(CLUSTER_SH), "env"], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    yield path
    if not existed and os.environ.get("RTJ_PODRUNNER_KEEP_CLUSTER") != "1":
        subprocess.run([str(CLUSTER_SH), "down"], env=env, capture_output=True, check=False)


@pytest.fixture(scope="session")
def kube(kubeconfig: str) -> Kube:
    """API access for the tests."""
    client = Kube(kubeconfig)
    wait_for("the API server", lambda: client.get("/version"), 60)
    return client


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The state folder every agent of the session shares (ports, PVCs, pid files)."""
    return tmp_path_factory.mktemp("podrunner-state")


@dataclass
class AgentProcess:
    """A running ``python -m tools.podrunner`` serving one Node."""

    node: str
    proc: subprocess.Popen[bytes]
    log: Path
    workdir: Path

    def tail(self, lines: int = 40) -> str:
        """The end of its log, for failure messages."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL: the node is lost."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 40.0) -> None:
        """SIGTERM (graceful node shutdown), then SIGKILL."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


AgentFactory = Callable[..., AgentProcess]


def node_ready(kube: Kube, node: str) -> str | None:
    """The node's Ready condition status (True/False/Unknown), None when absent."""
    obj = kube.get(f"/api/v1/nodes/{node}") or {}
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond["type"] == "Ready":
            return str(cond["status"])
    return None


@pytest.fixture
def start_agent(
    kube: Kube, kubeconfig: str, state_dir: Path, tmp_path: Path
) -> Iterator[AgentFactory]:
    """Start agents (one node each); all are stopped and their Nodes deleted afterwards."""
    started: list[AgentProcess] = []

    def start(node: str | None = None, *extra: str) -> AgentProcess:
        name = node or unique("pr-node")
        workdir = tmp_path / f"agent-{name}"
        workdir.mkdir(exist_ok=True)
        log = workdir / "agent.log"
        cmd = [
            sys.executable, "-m", "tools.podrunner", "--kubeconfig", kubeconfig,
            "--node", name, "--workdir", str(workdir), "--state-dir", str(state_dir),
            "--taint", TAINT, "--shutdown-grace", "5", *extra,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        with open(log, "ab") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        agent = AgentProcess(name, proc, log, workdir)
        started.append(agent)
        try:
            wait_for(
                f"node {name} Ready",
                lambda: proc.poll() is not None or node_ready(kube, name) == "True",
                60,
            )
        finally:
            assert proc.poll() is None, f"agent exited at start:\n{agent.tail()}"
        return agent

    yield start
    for agent in started:
        agent.stop(15)
    for node in {agent.node for agent in started}:
        try:
            kube.request("DELETE", f"/api/v1/nodes/{node}")
        except ApiError as err:
            if not err.not_found:
                raise
    for agent in started:
        print(f"\nagent log {agent.node}:\n{agent.tail(25)}")


KillNode = Callable[..., None]


@pytest.fixture
def kill_node(kubeconfig: str, state_dir: Path) -> KillNode:
    """``python -m tools.podrunner kill-node NODE [flags]``: how a person loses a node by hand."""

    def kill(node: str, *flags: str) -> None:
        cmd = [sys.executable, "-m", "tools.podrunner", "kill-node", "--kubeconfig", kubeconfig]
        cmd += ["--state-dir", str(state_dir), node, *flags]
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=60)

    return kill


@pytest.fixture
def ns(kube: Kube) -> Iterator[str]:
    """A fresh namespace whose default ServiceAccount exists (pods need it)."""
    name = unique("podrunner")
    kube.request(
        "POST", "/api/v1/namespaces", body={"apiVersion": "v1", "metadata": {"name": name}}
    )
    wait_for(
        "default ServiceAccount",
        lambda: kube.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        60,
    )
    yield name
    try:
        kube.request("DELETE", f"/api/v1/namespaces/{name}")
    except ApiError as err:
        if not err.not_found:
            raise
