"""What one pod says about itself, read the same way by every part of the state machine.

Ownership (the controller reference of this incarnation of the job), the attempt and rank labels,
whether it is being deleted or has ended, and the scheduler's message when it could not be placed.
Plain functions over the API's dictionaries: parsing pods into models on every pass was rejected as
slower and as a second, drifting copy of the pod schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..api import names
from .plan_types import PodDeletion


def pod_attempt(pod: dict[str, Any]) -> int | None:
    """The attempt label of a pod."""
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(names.LABEL_ATTEMPT)
    return int(value) if value is not None and str(value).isdigit() else None


def pod_rank(pod: dict[str, Any]) -> int | None:
    """The rank label of a pod."""
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(names.LABEL_RANK)
    return int(value) if value is not None and str(value).isdigit() else None


def is_deleting(pod: dict[str, Any]) -> bool:
    """Whether the pod has a deletionTimestamp (it is going away)."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def is_finished(pod: dict[str, Any]) -> bool:
    """Whether the pod ended (phase Succeeded or Failed)."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pod_deletion(pod: dict[str, Any], reason: str) -> PodDeletion:
    """A planned deletion of the pod, with its uid as precondition and the reason."""
    meta = pod.get("metadata") or {}
    return PodDeletion(name=meta.get("name", ""), uid=meta.get("uid"), reason=reason)


def live_pods(
    pods: Mapping[int, dict[str, Any]] | Sequence[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The pods neither being deleted nor ended."""
    values = pods.values() if isinstance(pods, Mapping) else pods
    return [p for p in values if not is_deleting(p) and not is_finished(p)]


def as_deleted(pod: dict[str, Any] | None) -> dict[str, Any] | None:
    """A departed pod's last state, marked as deleted if the watch caught it before that."""
    if pod is None:
        return None
    meta = dict(pod.get("metadata") or {})
    meta.setdefault("deletionTimestamp", "departed")
    return {**pod, "metadata": meta}


UNSCHEDULABLE = "Unschedulable"
"""PodScheduled's reason when the scheduler found no node."""
SCHEDULING_GATED = "SchedulingGated"
"""PodScheduled's reason while scheduling gates keep the scheduler from trying."""


def scheduling_hold(pod: dict[str, Any]) -> tuple[str, str] | None:
    """Why the pod is not placed, as (reason, message): the scheduler's message when it found
    no node, or the scheduling gates that keep it from trying (Kueue's admission gate while the
    queue has not admitted the gang, or the template's own); None otherwise."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") != "PodScheduled" or condition.get("status") != "False":
            continue
        reason = condition.get("reason")
        if reason == UNSCHEDULABLE:
            return UNSCHEDULABLE, str(condition.get("message") or "unschedulable")
        if reason == SCHEDULING_GATED:
            gates = (pod.get("spec") or {}).get("schedulingGates") or []
            names = ", ".join(str(g.get("name")) for g in gates) or "(none left)"
            return SCHEDULING_GATED, f"held by scheduling gates: {names}"
    return None
