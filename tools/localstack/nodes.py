"""The stack's spot Nodes: one pod-runner agent process each, so a node can be lost alone.

Losing a node is what the story is about, so each way a cloud takes one away is a method here:
a reclaim without notice, a termination taint, a graceful shutdown.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tools.kubeapi import MERGE
from tools.waiting import wait_for

from .base import StackBase
from .common import NODE_PREFIX, REPO, Obj, StackError
from .process import Proc


class NodesPart(StackBase):
    """Starting, losing and tainting pod-runner Nodes."""

    def add_node(self, *, wait: bool = True, labels: dict[str, str] | None = None) -> str:
        """Start one more pod-runner agent (a new spot Node); its name. ``labels``: set on the
        Node when it registers (a node pool's label, say), never after."""
        assert self.kubeconfig is not None
        while True:
            name = f"{NODE_PREFIX}{self._node_seq}"
            self._node_seq += 1
            if name not in self.agents and self.kube.get(f"/api/v1/nodes/{name}") is None:
                break
        workdir = self.node_workdir(name)
        argv = [
            sys.executable,
            "-m",
            "tools.podrunner",
            "--kubeconfig",
            str(self.kubeconfig),
            "--node",
            name,
            "--workdir",
            str(workdir),
            "--state-dir",
            str(self.state_dir),
            "--image-path",
            f"/app={REPO}",
            "--shutdown-grace",
            "30",
        ]
        for key, value in (labels or {}).items():
            argv += ["--label", f"{key}={value}"]
        env = self._env(PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
        agent = Proc.start(name, argv, workdir / "agent.log", env=env)
        self.agents[name] = agent
        self._on_stop(f"node {name}", lambda: self._remove_node(name))
        if wait:
            self._wait_node_ready(name)
        return name

    def node_workdir(self, name: str) -> Path:
        """The agent's ``--workdir``: pod folders and container logs of that node."""
        return self.workdir / "nodes" / name

    def _wait_node_ready(self, name: str) -> None:
        agent = self.agents[name]
        wait_for(
            f"node {name} Ready",
            lambda: not agent.alive() or self.kube.node_ready(name),
            60,
            on_timeout=agent.tail,
        )
        if not agent.alive():
            raise StackError(f"pod-runner agent {name} exited at start:\n{agent.tail()}")
        self.say(f"node {name}: Ready (pod-runner agent pid {agent.pid})")

    def live_nodes(self) -> list[str]:
        """Nodes whose agent still runs."""
        return [n for n, a in self.agents.items() if a.alive()]

    def ensure_nodes(self, count: int) -> None:
        """Start agents until ``count`` of them run (each scenario wants spare capacity)."""
        while len(self.live_nodes()) < count:
            self.add_node()

    def _remove_node(self, name: str) -> None:
        agent = self.agents.get(name)
        if agent is not None and agent.alive():
            agent.signal(signal.SIGKILL)  # tear-down: its pods die with it (the watchdog)
            agent.stop(5)
        if not self._created_cluster:
            self._delete(f"/api/v1/nodes/{name}")

    def reclaim_node(self, name: str) -> None:
        """A spot reclaim without notice: the Node object is deleted and the machine is gone.

        The Node is deleted a few milliseconds before the agent is SIGKILLed (its processes die
        with it). The order matters little to the story (a cloud deletes the Node after the VM
        stops), but this way the operator sees the deletion before the surviving rank crashes on
        its broken connection, instead of racing it.
        """
        self.delete_node(name)
        self.silence_node(name)

    def silence_node(self, name: str) -> None:
        """A machine that dies while its Node stays (a kernel panic, a cut network, a spot
        reclaim whose Node the cloud deletes only later): the agent is SIGKILLed and its
        processes die with it; the Node stays Ready until the node controller's grace
        (``--node-monitor-grace-period``) passes without a Lease renewal. ``delete_node`` later
        does what the cloud's controller does."""
        agent = self.agents[name]
        agent.signal(signal.SIGKILL)
        agent.popen.wait(10)

    def delete_node(self, name: str) -> None:
        """Delete the Node object (a silenced node's, as a cloud's controller does)."""
        self._delete(f"/api/v1/nodes/{name}")

    def taint_node(self, name: str, key: str, effect: str = "NoSchedule", value: str = "") -> None:
        """Add a taint, e.g. a spot termination notice (``PodRunnerCluster.TAINT``)."""
        node = self.kube.request("GET", f"/api/v1/nodes/{name}")
        taints = [t for t in node["spec"].get("taints") or [] if t.get("key") != key]
        taint: Obj = {"key": key, "effect": effect}
        if value:
            taint["value"] = value
        self.kube.request(
            "PATCH",
            f"/api/v1/nodes/{name}",
            body={"spec": {"taints": [*taints, taint]}},
            content_type=MERGE,
        )

    def untaint_node(self, name: str, key: str) -> None:
        """Remove the taints with ``key`` (capacity that comes back)."""
        node = self.kube.request("GET", f"/api/v1/nodes/{name}")
        taints = [t for t in node["spec"].get("taints") or [] if t.get("key") != key]
        self.kube.request(
            "PATCH", f"/api/v1/nodes/{name}", body={"spec": {"taints": taints}}, content_type=MERGE
        )

    def shut_down_node(self, name: str, timeout: float = 60) -> None:
        """The node shuts down gracefully (SIGTERM to its agent: DisruptionTarget, SIGTERM to the
        pods, their grace period), then the machine is gone and its Node object deleted."""
        agent = self.agents[name]
        agent.signal(signal.SIGTERM)
        try:
            agent.popen.wait(timeout)
        except subprocess.TimeoutExpired as err:
            raise StackError(
                f"node {name} did not shut down in {timeout:.0f}s:\n{agent.tail()}"
            ) from err
        self._delete(f"/api/v1/nodes/{name}")
