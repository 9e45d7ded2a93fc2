"""The plan a reconcile produces: plain data that the executor applies to the API server.

Keeping the decision (``reconcile``) and its application (``executor``) apart is what lets the
whole state machine run in unit tests, and it fixes the order of side effects in one place:
status first (the record of truth), then pod deletions and notices, then the support objects
(trainer identity, Service) in dependency order, then pod creation, then the "gang created" mark.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..api.status_types import Interruption, JobStatus
from .support import SupportWrite


@dataclass(frozen=True)
class PodDeletion:
    """Delete one pod with its own grace period (so the rank can save)."""

    name: str
    uid: str | None
    reason: str


@dataclass(frozen=True)
class NoticeWrite:
    """Write the preemption notice annotation into one pod (an empty payload withdraws it)."""

    pod: str
    payload: str


@dataclass(frozen=True)
class MembershipWrite:
    """Adopt a kept pod into the current attempt: new labels, the membership annotation, and
    annotations to remove (None values) (survivors.py)."""

    pod: str
    labels: dict[str, str | None]
    annotations: dict[str, str | None]


@dataclass(frozen=True)
class EventSpec:
    """A Kubernetes Event about the job."""

    type: str
    reason: str
    message: str
    with_creation: bool = False
    """Announces this plan's pod creations: posted only when they were made (a pass that
    failed before them plans it again)."""


@dataclass
class Plan:
    """Everything one reconcile wants done, in the order the executor does it."""

    status: JobStatus | None = None
    """New status to write first (None: unchanged)."""
    deletions: list[PodDeletion] = field(default_factory=list)
    notices: list[NoticeWrite] = field(default_factory=list)
    memberships: list[MembershipWrite] = field(default_factory=list)
    """Kept pods to relabel into the attempt and tell its membership (before the gang mark)."""
    support: list[SupportWrite] = field(default_factory=list)
    """Support objects to create or update, in dependency order, before any pod."""
    pod_group: dict[str, Any] | None = None
    """The attempt's PodGroup (native gang scheduling), created before its pods (409 is
    success); the previous attempt's group is deleted then."""
    creations: list[dict[str, Any]] = field(default_factory=list)
    """Pods of the current attempt to create (409 is success: they exist)."""
    spares: list[dict[str, Any]] = field(default_factory=list)
    """Spare pods to create (spares.py): best effort, a refusal is logged, never retried."""
    after_creation: JobStatus | None = None
    """Status to write once every creation succeeded (marks the gang created)."""
    events: list[EventSpec] = field(default_factory=list)
    requeue_after: float | None = None
    interruption: Interruption | None = None
    """The interruption recorded by this plan (for metrics)."""
    resubmission: str | None = None
    """Why this plan starts a new attempt's pods: preemption, failure or resume (metrics)."""

    def event(self, type_: str, reason: str, message: str, *, with_creation: bool = False) -> None:
        """Queue an Event."""
        self.events.append(EventSpec(type_, reason, message, with_creation))

    def requeue(self, seconds: float | None) -> None:
        """Ask to be reconciled again after at most ``seconds``."""
        if seconds is None:
            return
        self.requeue_after = (
            seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        )
