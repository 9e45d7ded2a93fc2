"""The three gang mechanisms behind one interface, chosen once per attempt.

``gang.py`` says which mechanism keeps an attempt's gang all-or-nothing (Kueue, the PodGroup API,
or the operator's own capacity check) and holds their objects' names and shapes. This module
gives each mechanism the operations the reconcile needs of it (``GangMechanism``): which names
must be free before the gang is created, what to create before its pods, how a pod joins the
gang, how a gang that waits is described, and what its admission says. The reconcile picks the
implementation once (``choose`` for a new gang, ``of_pod`` for one half created, ``of_status``
for the running attempt) and asks it, instead of comparing ``status.gangScheduling`` in every
step: a fourth mechanism is a class here, not a branch in each of them.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from ..api.api_types import Job
from . import gang, kueue_workload, support
from .reconcile_context import ReconcileContext


class GangMechanism(Protocol):
    """One way of keeping a gang all-or-nothing (``status.gangScheduling`` names it)."""

    name: ClassVar[gang.Mechanism]
    queued: ClassVar[bool]
    """Whether a queue admits the gang: ``spec.queueName`` is honoured, not set aside."""
    keeps_pods: ClassVar[bool]
    """Whether running pods may be kept from one attempt into the next (survivors that stay,
    spares): a mechanism that admits the gang as a whole anew each attempt cannot."""

    def taken_names(self, job: Job, observed: support.Observed) -> list[str]:
        """Objects of the mechanism's own whose names another object holds (``Kind name``):
        the gang is not created while any is."""
        ...

    def group(
        self, job: Job, attempt: int, size: int, owner: dict[str, Any]
    ) -> dict[str, Any] | None:
        """The object created before the attempt's pods that holds ``size`` new ones all or
        none, else None."""
        ...

    def link_pod(self, pod: dict[str, Any], job: Job, attempt: int, size: int) -> dict[str, Any]:
        """``pod`` joined to its attempt's gang of ``size`` pods (a copy when changed)."""
        ...

    def held_note(self, ctx: ReconcileContext, *, bound: int) -> str:
        """How the gang is held back, for the PodsScheduled message. ``bound``: ranks already
        bound while others wait, which an enforcing scheduler never allows."""
        ...

    def report_admission(self, ctx: ReconcileContext) -> None:
        """Say on the job whether the gang was admitted, where the mechanism admits it."""
        ...


class OperatorGang:
    """The operator's own capacity check before the gang is created; nothing on the pods."""

    name = gang.Mechanism.OPERATOR
    queued = False
    keeps_pods = True

    def taken_names(self, job: Job, observed: support.Observed) -> list[str]:
        return []

    def group(
        self, job: Job, attempt: int, size: int, owner: dict[str, Any]
    ) -> dict[str, Any] | None:
        return None

    def link_pod(self, pod: dict[str, Any], job: Job, attempt: int, size: int) -> dict[str, Any]:
        return pod

    def held_note(self, ctx: ReconcileContext, *, bound: int) -> str:
        return ""

    def report_admission(self, ctx: ReconcileContext) -> None:
        return None


class PodGroupGang:
    """One PodGroup per attempt (``minCount`` = the new pods), each pod linked to it by
    ``spec.schedulingGroup``: the scheduler binds none until all fit."""

    name = gang.Mechanism.POD_GROUP
    queued = False
    keeps_pods = True

    def taken_names(self, job: Job, observed: support.Observed) -> list[str]:
        return support.taken_pod_group(job, observed)

    def group(
        self, job: Job, attempt: int, size: int, owner: dict[str, Any]
    ) -> dict[str, Any] | None:
        return gang.pod_group(job, attempt, size, owner)

    def link_pod(self, pod: dict[str, Any], job: Job, attempt: int, size: int) -> dict[str, Any]:
        # Copies only what changes (a deep copy of every pod was most of a resubmission's CPU).
        group = {"podGroupName": gang.group_name(job.ref.name, attempt)}
        return {**pod, "spec": {**pod["spec"], "schedulingGroup": group}}

    def held_note(self, ctx: ReconcileContext, *, bound: int) -> str:
        group = gang.group_name(ctx.job.ref.name, ctx.status.attempt)
        if bound:
            # The API serves PodGroups but the scheduler binds pods one by one: its
            # GangScheduling feature gate is off (API discovery cannot tell).
            return (
                f" and {bound} {'is' if bound == 1 else 'are'} bound although PodGroup {group} "
                f"should bind none until all {ctx.size} fit: the scheduler does not enforce the "
                "PodGroup (feature gate GangScheduling off?)"
            )
        return f" (all-or-nothing: PodGroup {group} binds no pod until all {ctx.size} fit)"

    def report_admission(self, ctx: ReconcileContext) -> None:
        return None


class KueueGang:
    """Kueue's pod-group labels on every pod: Kueue admits the group as one Workload, from the
    queue ``spec.queueName`` names; its admission becomes the job's ``Admitted`` condition."""

    name = gang.Mechanism.KUEUE
    queued = True
    keeps_pods = False

    def taken_names(self, job: Job, observed: support.Observed) -> list[str]:
        return []

    def group(
        self, job: Job, attempt: int, size: int, owner: dict[str, Any]
    ) -> dict[str, Any] | None:
        return None  # Kueue makes the Workload for the pod group itself

    def link_pod(self, pod: dict[str, Any], job: Job, attempt: int, size: int) -> dict[str, Any]:
        meta = pod["metadata"]
        labels = {
            **(meta.get("labels") or {}),
            gang.KUEUE_QUEUE_LABEL: job.spec.queue_name or "",
            gang.KUEUE_GROUP_LABEL: gang.group_name(job.ref.name, attempt),
        }
        annotations = {
            **(meta.get("annotations") or {}),
            gang.KUEUE_TOTAL_ANNOTATION: str(size),
            gang.KUEUE_RETRIABLE_ANNOTATION: "false",
        }
        return {**pod, "metadata": {**meta, "labels": labels, "annotations": annotations}}

    def held_note(self, ctx: ReconcileContext, *, bound: int) -> str:
        return f" (Kueue pod group, queue {ctx.job.spec.queue_name})"

    def report_admission(self, ctx: ReconcileContext) -> None:
        kueue_workload.report_admission(ctx)


MECHANISMS: dict[gang.Mechanism, GangMechanism] = {
    m.name: m for m in (OperatorGang(), PodGroupGang(), KueueGang())
}


def choose(job: Job, native_available: bool, kueue_available: bool = False) -> GangMechanism:
    """The mechanism for a new gang of ``job`` (``gang.choose``)."""
    return MECHANISMS[gang.choose(job, native_available, kueue_available)]


def of_pod(pod: dict[str, Any]) -> GangMechanism:
    """The mechanism an existing pod of an attempt was created under.

    An operator restarted while it was creating a gang must finish it the same way: if the
    previous instance chose ``Operator`` (API discovery failed or lagged) and this one chose
    ``PodGroup``, the pods it adds would belong to a group the first pods never joined, and
    the scheduler would hold them until ``minCount`` pods of that group exist: forever.
    """
    if (pod.get("spec") or {}).get("schedulingGroup"):
        return MECHANISMS[gang.Mechanism.POD_GROUP]
    if gang.KUEUE_GROUP_LABEL in ((pod.get("metadata") or {}).get("labels") or {}):
        return MECHANISMS[gang.Mechanism.KUEUE]
    return MECHANISMS[gang.Mechanism.OPERATOR]


def of_status(gang_scheduling: str | None) -> GangMechanism:
    """The mechanism of the current attempt (``status.gangScheduling``); a gang not yet
    created has none, and is treated as the operator's own (nothing on its pods, no group)."""
    try:
        return MECHANISMS[gang.Mechanism(gang_scheduling)]
    except ValueError:
        return MECHANISMS[gang.Mechanism.OPERATOR]
