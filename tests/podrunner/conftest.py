"""Fixtures for the pod runner's cluster tests: a control plane, agents, namespaces.

The cluster is the test session's shared local control plane (``kubeconfig`` in
``tests/conftest.py``), or the cluster ``KUBECONFIG`` names; each test works in its own
namespace. Every agent is
a real ``python -m tools.podrunner`` process serving one Node, so losing a node is a SIGKILL.
Test Nodes carry a NoSchedule taint, so other suites' pods sharing a cluster never land on them
(the tests bind their pods with ``spec.nodeName``, which needs no toleration).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from tests.conftest import NamespaceFactory, unique
from tools.kubeapi import ApiError, Kube
from tools.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
TAINT = "podrunner-test=true:NoSchedule"

T = TypeVar("T")


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
def ns(make_namespace: NamespaceFactory) -> str:
    """A fresh namespace whose default ServiceAccount exists (pods need it); deleted after."""
    return make_namespace("podrunner")
