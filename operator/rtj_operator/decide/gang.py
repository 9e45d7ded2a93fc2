"""All-or-nothing scheduling of a gang: which mechanism, and how its pods are linked to it.

A gang is useful only when every pod of it runs; pods that bind while the rest wait hold nodes
doing nothing. Three mechanisms, chosen per attempt (docs/operator.md, All-or-nothing
scheduling):

- ``Kueue`` when ``spec.queueName`` is set and the cluster serves Kueue's API: the pods get
  Kueue's pod-group labels and Kueue admits the group as one workload (the user asked for that
  queue's quota and ordering). Without Kueue nothing would hold those pods back, so the queue
  name is set aside (with a Warning event) and the mechanism is chosen as without one;
- ``PodGroup`` when the API server serves ``podgroups`` in ``scheduling.k8s.io/v1alpha2``
  (Kubernetes 1.36 with the ``GenericWorkload`` and ``GangScheduling`` feature gates): the
  operator creates one PodGroup per attempt, gang policy ``minCount`` = the gang's size, and
  links every pod with ``spec.schedulingGroup.podGroupName``; the scheduler binds none of them
  until all fit;
- ``Operator`` otherwise: the operator's own capacity check before creating the gang (elastic
  jobs wait, then shrink to what fits); a fixed job's pods are created and the scheduler places
  them one by one.

What each mechanism does for the reconcile (the names it needs free, the object it creates before
the pods, how a pod joins the gang, how a waiting gang is described, its admission) is one
implementation each of ``gang_mechanisms.GangMechanism``; this module chooses the mechanism and
holds the shapes of its objects.

The cluster's API discovery decides, not a user setting: a flag would be wrong on half the
clusters it is copied to. Creating a Workload object as well was rejected: in 1.36 a standalone
PodGroup carries the gang policy by itself, and the Workload's templates are immutable while a
gang's size changes with each elastic resize.
"""

from __future__ import annotations

import copy
from enum import StrEnum
from typing import Any

from ..api import names
from ..api.api_types import Job

GROUP_VERSION = "scheduling.k8s.io/v1alpha2"
"""The Workload/PodGroup API of Kubernetes 1.36 (alpha)."""
PODGROUP_RESOURCE = "podgroups"

KUEUE_GROUP = "kueue.x-k8s.io"
"""Kueue's API group: served when Kueue (its CRDs) is installed."""
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
KUEUE_RETRIABLE_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
"""Set to ``"false"``: the operator never replaces a pod inside an attempt's group (the next
attempt is a new group), so Kueue must not hold the group's quota waiting for replacements; it
finishes the Workload once the pods have ended, and the quota goes to the next attempt."""


class Mechanism(StrEnum):
    """How a gang is kept all-or-nothing (``status.gangScheduling``)."""

    KUEUE = "Kueue"
    POD_GROUP = "PodGroup"
    OPERATOR = "Operator"


def choose(job: Job, native_available: bool, kueue_available: bool = False) -> Mechanism:
    """The mechanism for ``job`` on a cluster that does (not) serve the PodGroup API and
    Kueue's API. A queue name on a cluster without Kueue does not count: labels no controller
    reads would leave the pods to be scheduled one by one while status said ``Kueue``."""
    if job.spec.queue_name and kueue_available:
        return Mechanism.KUEUE
    return Mechanism.POD_GROUP if native_available else Mechanism.OPERATOR


def group_name(job: str, attempt: int) -> str:
    """Name of an attempt's PodGroup (and Kueue pod group): ``<job>-a<attempt>``."""
    return f"{job}-a{attempt}"


WHOLE_GANG_FIELDS = ("disruptionMode", "priorityClassName")
"""PodGroup fields the API server serves only under the WorkloadAwarePreemption feature gate
(Kubernetes 1.36): with them the scheduler preempts the whole gang or none of it."""


def pod_group(job: Job, attempt: int, size: int, owner: dict[str, Any]) -> dict[str, Any]:
    """The PodGroup of one attempt: gang policy with ``minCount`` = the gang's size, preempted
    whole (``disruptionMode: PodGroup``) at the template's ``priorityClassName``, if any.
    ``without_whole_gang_fields`` gives the group a cluster without them accepts."""
    spec: dict[str, Any] = {
        "schedulingPolicy": {"gang": {"minCount": size}},
        "disruptionMode": "PodGroup",
    }
    priority_class = (job.raw_template.get("spec") or {}).get("priorityClassName")
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "PodGroup",
        "metadata": {
            "name": group_name(job.ref.name, attempt),
            "namespace": job.ref.namespace,
            "labels": {names.LABEL_JOB: job.ref.name, names.LABEL_ATTEMPT: str(attempt)},
            "ownerReferences": [owner],
        },
        "spec": spec,
    }


def without_whole_gang_fields(group: dict[str, Any]) -> dict[str, Any]:
    """``group`` without ``WHOLE_GANG_FIELDS`` (a copy)."""
    group = copy.deepcopy(group)
    for field in WHOLE_GANG_FIELDS:
        group["spec"].pop(field, None)
    return group


def refuses_whole_gang_fields(message: str) -> bool:
    """Whether an API server's refusal of a PodGroup names one of ``WHOLE_GANG_FIELDS``."""
    return any(f"spec.{field}" in message for field in WHOLE_GANG_FIELDS)


def serves_group(group: dict[str, Any] | None) -> bool:
    """Whether an APIGroup (``GET /apis/<group>``) has a version served."""
    return bool((group or {}).get("versions"))


def serves_pod_groups(discovery: dict[str, Any] | None) -> bool:
    """Whether an APIResourceList (``GET /apis/scheduling.k8s.io/v1alpha2``) lists podgroups."""
    resources = (discovery or {}).get("resources") or []
    return any(r.get("name") == PODGROUP_RESOURCE for r in resources)
