"""The agent: registers its Nodes, heartbeats them, and hands each bound pod to a worker.

One thread renews every node's Lease (and, less often, its Ready heartbeat); one thread per node
lists and watches the pods bound to it. Per pod, a ``PodWorker`` thread does the rest.

Restart: the agent's processes die with it (see ``processes``), so on start a pod that an
earlier agent had running is reported lost (exit 137, ``ContainerStatusUnknown``, Failed for
``restartPolicy: Never``) rather than silently started twice, and a pod already being deleted
is removed at once. A clean stop (SIGTERM/SIGINT) is a graceful node shutdown: the Node is reported
NotReady ("node is shutting down") at once, then every pod gets a
``DisruptionTarget`` condition, its containers SIGTERM and their grace period, the pod is
reported Failed.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import IO

from tools.kubeapi import ApiError, Kube, Obj

from . import nodes
from .deletion import finalize_deletion, is_deleting
from .preparation import Context
from .worker import PodWorker

log = logging.getLogger("podrunner")


def agent_file(state_dir: Path, node: str, suffix: str) -> Path:
    """``<state>/agents/<node>.<suffix>``: the node's lock and pid files."""
    return state_dir / "agents" / f"{node}.{suffix}"


class Agent:
    """Serves a set of Nodes until ``stop`` is set."""

    def __init__(
        self,
        ctx: Context,
        node_configs: list[nodes.NodeConfig],
        *,
        heartbeat_s: float = 5.0,
        status_s: float = 60.0,
    ) -> None:
        self.ctx = ctx
        self.kube: Kube = ctx.kube
        self.configs = node_configs
        self.heartbeat_s = heartbeat_s
        self.status_s = status_s
        self.stop = threading.Event()
        self.stopping = False
        self._lock = threading.Lock()
        self.workers: dict[str, PodWorker] = {}
        self._started: list[PodWorker] = []
        self._nodes: dict[str, Obj] = {}
        self._locks: list[IO[str]] = []

    def _claim(self, name: str) -> None:
        """One agent per node name: a second one would run every pod twice."""
        path = agent_file(self.ctx.state_dir, name, "lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+")  # noqa: SIM115 (held for the agent's lifetime)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            raise SystemExit(f"another podrunner agent serves node {name} (lock {path})") from err
        self._locks.append(handle)
        agent_file(self.ctx.state_dir, name, "pid").write_text(f"{os.getpid()}\n")

    def run(self) -> None:
        """Register, serve until stopped, then shut down gracefully."""
        for cfg in self.configs:
            self._claim(cfg.name)
        for cfg in self.configs:
            node = nodes.register(self.kube, cfg)
            nodes.renew_lease(self.kube, node)
            self._nodes[cfg.name] = node
        self._clean_orphans()
        threads = [threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True)]
        threads += [
            threading.Thread(target=self._watch, args=(name,), name=f"watch {name}", daemon=True)
            for name in self._nodes
        ]
        for thread in threads:
            thread.start()
        log.info(
            "serving node(s) %s (workdir %s, state %s)",
            ", ".join(self._nodes),
            self.ctx.workdir,
            self.ctx.state_dir,
        )
        self.stop.wait()
        self._shutdown()

    def _clean_orphans(self) -> None:
        """Remove pod folders an earlier agent left for pods that no longer exist here."""
        root = self.ctx.workdir / "pods"
        if not root.is_dir():
            return
        known: set[str] = set()
        for name in self._nodes:
            listed = self.kube.request(
                "GET", "/api/v1/pods", params={"fieldSelector": f"spec.nodeName={name}"}
            )
            known |= {p["metadata"]["uid"] for p in listed.get("items") or []}
        for entry in root.iterdir():
            if entry.name not in known:
                shutil.rmtree(entry, ignore_errors=True)
                log.info("removed the folder of vanished pod %s", entry.name)

    def _shutdown(self) -> None:
        log.info("shutting down: stopping pods (graceful node shutdown)")
        with self._lock:
            self.stopping = True
            alive = [w for w in self._started if w.is_alive()]
        # As the kubelet does, the node turns NotReady when the shutdown begins, before its
        # pods learn of it: the node controller's not-ready taint then keeps the scheduler from
        # placing the replacement gang on a node that is going away.
        self._report_not_ready("node is shutting down")
        for worker in alive:
            worker.shutdown()
        deadline = time.monotonic() + self.ctx.shutdown_grace_s + 15.0
        for worker in alive:
            worker.join(max(0.0, deadline - time.monotonic()))
        self._report_not_ready("podrunner agent stopped")
        for name in self._nodes:
            agent_file(self.ctx.state_dir, name, "pid").unlink(missing_ok=True)
        self.ctx.watchdog.close()
        log.info("stopped")

    def _report_not_ready(self, message: str) -> None:
        for name in self._nodes:
            try:
                nodes.set_ready(self.kube, name, False, "KubeletNotReady", message)
            except (ApiError, OSError) as err:
                log.warning("node %s: could not report NotReady: %s", name, err)

    def _heartbeat(self) -> None:
        next_status = time.monotonic() + self.status_s
        while not self.stop.wait(self.heartbeat_s):
            post_status = time.monotonic() >= next_status
            if post_status:
                next_status = time.monotonic() + self.status_s
            for name, node in self._nodes.items():
                try:
                    nodes.renew_lease(self.kube, node)
                    if post_status:
                        nodes.set_ready(
                            self.kube,
                            name,
                            True,
                            "KubeletReady",
                            "podrunner is posting ready status",
                        )
                except (ApiError, OSError) as err:
                    log.warning("node %s: heartbeat failed: %s", name, err)

    def _watch(self, node: str) -> None:
        """List then watch the pods bound to ``node``; relist when the watch expires."""
        selector = {"fieldSelector": f"spec.nodeName={node}"}
        version: str | None = None
        while not self.stop.is_set():
            try:
                if version is None:
                    listed = self.kube.request("GET", "/api/v1/pods", params=selector)
                    version = listed["metadata"]["resourceVersion"]
                    self._resync(node, listed.get("items") or [])
                for event in self.kube.watch(
                    "/api/v1/pods", {**selector, "resourceVersion": version}
                ):
                    if self.stop.is_set():
                        return
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        log.info("watch of node %s restarts: %s", node, obj.get("message"))
                        version = None
                        break
                    version = obj["metadata"]["resourceVersion"]
                    if kind != "BOOKMARK":
                        self._on_pod(kind, obj)
            except ApiError as err:
                if not err.gone:
                    log.warning("watch of node %s failed: %s", node, err)
                    time.sleep(1)
                version = None
            except Exception as err:
                log.warning("watch of node %s interrupted: %s", node, err)
                time.sleep(1)

    def _resync(self, node: str, pods: list[Obj]) -> None:
        listed = {p["metadata"]["uid"] for p in pods}
        with self._lock:
            vanished = [
                uid for uid, w in self.workers.items() if w.node == node and uid not in listed
            ]
        for uid in vanished:
            self._on_pod("DELETED", {"metadata": {"uid": uid}})
        for pod in pods:
            self._on_pod("ADDED", pod)

    def _on_pod(self, kind: str | None, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        with self._lock:
            worker = self.workers.get(uid)
            if kind == "DELETED":
                self.workers.pop(uid, None)
                if worker is not None and worker.is_alive():
                    worker.gone()
                else:
                    shutil.rmtree(self.ctx.pod_dir(uid), ignore_errors=True)
                return
            if worker is not None:
                if worker.is_alive():
                    worker.update(pod)
                elif is_deleting(pod):
                    self._finalize(pod)
                return
            if self.stopping:
                return
            status = pod.get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed"):
                if is_deleting(pod):
                    self._finalize(pod)
                return
            if is_deleting(pod):
                self._finalize(pod)  # nothing of it runs here (an earlier agent's pod)
                return
            lost = status.get("phase") == "Running" or any(
                "running" in (c.get("state") or {}) or "terminated" in (c.get("state") or {})
                for c in status.get("containerStatuses") or []
            )
            worker = PodWorker(self.ctx, pod, lost=lost)
            self.workers[uid] = worker
            self._started = [w for w in self._started if w.is_alive()] + [worker]
            worker.start()  # under the lock, so a concurrent shutdown cannot miss it

    def _finalize(self, pod: Obj) -> None:
        try:
            if finalize_deletion(self.kube, pod):
                meta = pod["metadata"]
                log.info("%s/%s: deleted", meta["namespace"], meta["name"])
        except (ApiError, OSError) as err:
            log.warning("could not finalize deletion of %s: %s", pod["metadata"].get("name"), err)
