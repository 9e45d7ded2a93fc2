"""What the operator needs to know about a node, extracted from its API object.

Classification looks at a node through ``NodeView`` only, so the pure code never handles raw
Node dictionaries and a missing node (deleted: a spot reclaim) is an explicit state instead of a
``None`` checked in many places.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from ..api.timeutil import parse_time

SILENT_SHARE_OF_LEASE = 0.5
"""The share of its Lease's duration after which an unrenewed Lease marks the node silent."""
RENEWAL_SHARE_OF_LEASE = 0.25
"""How often a kubelet renews its Lease, as a share of the Lease's duration."""


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
    lease_renewed: datetime | None = None
    """When the node's kubelet last renewed its Lease in ``kube-node-lease`` (by the kubelet's
    clock); read only while a rank reports a lost peer (``with_lease``), else None."""
    lease_seconds: float = 0.0
    """The Lease's ``leaseDurationSeconds`` (0: not read)."""
    lease_seen: datetime | None = None
    """When the operator first read that same renewal (by its own clock)."""

    def silent_in(self, now: datetime) -> float | None:
        """Seconds until the node counts as silent (0 or less: it is); None when its Lease was
        not read. Silent once the Lease went unrenewed for half its duration (the kubelet renews
        every quarter of it: two renewals missed) and the operator itself has seen no renewal for
        a quarter of it, so that a kubelet whose clock runs behind is not taken for silent."""
        if self.lease_renewed is None or self.lease_seen is None or self.lease_seconds <= 0:
            return None
        quiet = (now - self.lease_renewed).total_seconds()
        watched = (now - self.lease_seen).total_seconds()
        return max(
            self.lease_seconds * SILENT_SHARE_OF_LEASE - quiet,
            self.lease_seconds * RENEWAL_SHARE_OF_LEASE - watched,
        )

    @property
    def silent_check_seconds(self) -> float:
        """The longest ``silent_in`` takes to say silent after the kubelet's last renewal
        that the operator saw early: half the Lease's duration unrenewed, and a quarter more
        for the operator's own reads."""
        return self.lease_seconds * (SILENT_SHARE_OF_LEASE + RENEWAL_SHARE_OF_LEASE)

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


def with_lease(view: NodeView, lease: dict[str, Any] | None, seen: datetime) -> NodeView:
    """``view`` with its node's Lease (``kube-node-lease``), when there is a renewed one;
    ``seen``: when the operator first read this renewal."""
    spec = (lease or {}).get("spec") or {}
    renewed = parse_time(spec.get("renewTime"))
    seconds = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(seconds, int) or seconds <= 0:
        return view
    return replace(view, lease_renewed=renewed, lease_seconds=float(seconds), lease_seen=seen)
