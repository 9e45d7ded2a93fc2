"""What the watches told the operator that a fresh list cannot: routing and last states.

A pod event names the job it belongs to and the node it runs on; a node event changes the jobs
on that node. Kept here: which jobs run on each node (so a node event kicks only those), the
nodes' last seen state (a miss falls back to a GET), and the last state of each recently deleted
rank pod (its DELETED event carries the DisruptionTarget condition and the exit codes a later
list no longer shows). Nothing here decides a reconcile on its own: the job and its pods are
read fresh from the API server on every pass (``controller.py``). (Rejected: kopf's indexes,
which are per handler and do not expose a deleted object's last state to another handler.)
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from typing import Any

from ..api import names
from ..api.api_types import Job
from ..decide import survivors
from ..decide.nodes import NodeView, node_view
from .workqueue import Key

DEPARTED_TTL = 300.0
"""How long the last state of a deleted pod is remembered for classification."""

DELETE_EVENT_WAIT = 1.0
"""Seconds to wait for the DELETED event of a rank pod that vanished from a fresh list."""


def node_fingerprint(view: NodeView) -> tuple[Any, ...]:
    """The parts of a node that can change a decision (heartbeats are not among them)."""
    taints = tuple(
        sorted((t.get("key", ""), t.get("value", ""), t.get("effect", "")) for t in view.taints)
    )
    return view.exists, view.deleting, view.ready, taints, view.unschedulable, view.allocatable


class WatchCache:
    """Routing and last states from pod and node events; one per controller."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeView] = {}
        # Nodes the watch saw deleted (when): the passes of every job that had a rank there
        # know it is gone without a GET that answers 404, one round trip of a mass reclaim.
        self.deleted_nodes: dict[str, float] = {}
        self.pod_routes: dict[tuple[str, str], tuple[Key, str | None]] = {}
        # The jobs on each node, with how many of their rank pods it holds (a job leaves at 0):
        # a count, not a scan of every route on each pod event, which with hundreds of jobs
        # made the pod events of a mass reclaim quadratic.
        self.jobs_on_node: dict[str, Counter[Key]] = defaultdict(Counter)
        self.departed: dict[Key, dict[str, tuple[float, dict[str, Any]]]] = defaultdict(dict)
        # Jobs with a rank pod missing from the list whose DELETED event is still on its way.
        self.unexplained: dict[Key, float] = {}

    def pod_event(self, event_type: str | None, body: dict[str, Any]) -> Key | None:
        """Remember a rank pod's node (or its last state, when deleted); its job's key, None
        for a pod that is no job's rank."""
        meta = body.get("metadata") or {}
        job = (meta.get("labels") or {}).get(names.LABEL_JOB)
        if not job:
            return None
        key: Key = (meta.get("namespace", ""), job)
        pod_id = (key[0], meta.get("name", ""))
        previous = self.pod_routes.pop(pod_id, None)
        if previous is not None and previous[1]:
            self._unroute(previous[1], key)
        if event_type == "DELETED":
            self.departed[key][pod_id[1]] = (time.monotonic(), body)
        else:
            node = (body.get("spec") or {}).get("nodeName")
            self.pod_routes[pod_id] = (key, node)
            if node:
                self.jobs_on_node[node][key] += 1
        return key

    def _unroute(self, node: str, key: Key) -> None:
        jobs = self.jobs_on_node[node]
        jobs[key] -= 1
        if jobs[key] <= 0:
            del jobs[key]
        if not jobs:
            del self.jobs_on_node[node]

    def node_event(self, event_type: str | None, body: dict[str, Any]) -> list[Key] | None:
        """Remember a node's state; the jobs on it when something that matters changed, None
        when nothing did (a heartbeat)."""
        name = (body.get("metadata") or {}).get("name", "")
        view = node_view(name, None if event_type == "DELETED" else body)
        before = self.nodes.get(name)
        if event_type == "DELETED":
            self.nodes.pop(name, None)
            now = time.monotonic()
            self.deleted_nodes = {
                n: seen for n, seen in self.deleted_nodes.items() if now - seen <= DEPARTED_TTL
            }
            self.deleted_nodes[name] = now
        else:
            self.nodes[name] = view
            self.deleted_nodes.pop(name, None)
        if before is not None and node_fingerprint(before) == node_fingerprint(view):
            return None
        return list(self.jobs_on_node.get(name, ()))

    def node(self, name: str) -> NodeView | None:
        """The node as last seen, a view of a node that does not exist when the watch saw it
        deleted (in the last ``DEPARTED_TTL`` seconds), None when unknown (GET it)."""
        cached = self.nodes.get(name)
        if cached is not None:
            return cached
        deleted = self.deleted_nodes.get(name)
        if deleted is None:
            return None
        if time.monotonic() - deleted > DEPARTED_TTL:
            del self.deleted_nodes[name]
            return None
        return node_view(name, None)

    def forget_nodes(self) -> None:
        """Forget every node (a pause: no decision may rest on what was seen before it)."""
        self.nodes.clear()
        self.deleted_nodes.clear()

    def departed_pods(self, key: Key, listed: set[str]) -> dict[str, dict[str, Any]]:
        """Last states of this job's recently deleted pods (kept for a few minutes)."""
        horizon = time.monotonic() - DEPARTED_TTL
        kept = {
            name: (seen, body)
            for name, (seen, body) in self.departed.get(key, {}).items()
            if seen >= horizon and name not in listed
        }
        if kept:
            self.departed[key] = kept
        else:
            self.departed.pop(key, None)
        return {name: body for name, (_, body) in kept.items()}

    def deletion_event_wait(
        self, key: Key, job: Job, pods: list[dict[str, Any]], departed: dict[str, Any]
    ) -> float | None:
        """A rank pod is gone from the list but its DELETED watch event (which carries its last
        state: DisruptionTarget, exit codes) has not arrived yet. Give the watch a moment, so
        the interruption is classified by what really happened, not as "disappeared": the
        seconds to wait, or None to decide now."""
        st = job.status
        if not st.gang_created:
            self.unexplained.pop(key, None)
            return None
        listed = {p["metadata"]["name"] for p in pods}
        missing = set(survivors.attempt_pod_names(job)) - listed - set(departed)
        if not missing:
            self.unexplained.pop(key, None)
            return None
        first = self.unexplained.setdefault(key, time.monotonic())
        if time.monotonic() - first < DELETE_EVENT_WAIT:
            return 0.2
        self.unexplained.pop(key, None)
        return None
