"""What the operator needs to know about a node, extracted from its API object.

Classification looks at a node through ``NodeView`` only, so the pure code never handles raw
Node dictionaries and a missing node (deleted: a spot reclaim) is an explicit state instead of a
``None`` checked in many places.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from ..api.timeutil import parse_time


@dataclass(frozen=True)
class NodeView:
    """A node as seen at one reconcile."""

    name: str
    exists: bool = True
    deleting: bool = False
    ready: bool | None = True
    """True, False, or None for Unknown (the node stopped reporting)."""
    not_ready_since: datetime | None = None
    """When the Ready condition left True (its lastTransitionTime), if it did."""
    taints: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    unschedulable: bool = False
    """spec.unschedulable (cordoned)."""
    labels: tuple[tuple[str, str], ...] = ()
    """The node's labels (for nodeSelector), sorted."""
    allocatable: tuple[tuple[str, str], ...] = ()
    """status.allocatable quantities (cpu, memory, pods, ...), sorted."""

    @property
    def gone(self) -> bool:
        """The node is deleted or being deleted: its pods will never report again."""
        return not self.exists or self.deleting


def node_view(name: str, body: dict[str, Any] | None) -> NodeView:
    """Build a NodeView from a Node object, or a deleted view when it is absent."""
    if body is None:
        return NodeView(name=name, exists=False, ready=None)
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    ready: bool | None = None
    since: datetime | None = None
    for cond in (body.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            status = cond.get("status")
            ready = True if status == "True" else False if status == "False" else None
            if ready is not True:
                since = parse_time(cond.get("lastTransitionTime"))
                if since is not None and since.microsecond == 0:
                    # Whole-second timestamps: the flip may have come up to a second later,
                    # and a grace period must never end early.
                    since += timedelta(seconds=1)
    return NodeView(
        name=name,
        exists=True,
        deleting=bool(meta.get("deletionTimestamp")),
        ready=ready,
        not_ready_since=since,
        taints=tuple(spec.get("taints") or ()),
        unschedulable=bool(spec.get("unschedulable")),
        labels=tuple(sorted((str(k), str(v)) for k, v in (meta.get("labels") or {}).items())),
        allocatable=tuple(
            sorted(
                (str(k), str(v))
                for k, v in ((body.get("status") or {}).get("allocatable") or {}).items()
            )
        ),
    )
