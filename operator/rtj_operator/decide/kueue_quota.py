"""How many of an elastic job's pods its Kueue queue's free quota holds: a cap on elastic sizing.

Elastic sizing (elastic.py) starts an attempt at the size that fits. Node room alone (capacity.py)
is blind to Kueue: with room on the nodes for 3 pods but quota for 2, a 3-pod gang waits in the
queue for ever, although ``minReplicas`` 2 would run now. So for an elastic job with
``spec.queueName`` under the ``Kueue`` gang mechanism, the controller reads the job's LocalQueue
(``spec.clusterQueue``) and that ClusterQueue, and the count of pods that fit is capped by what
the ClusterQueue's free quota holds: for each resource group the pod's requests need, the best
flavor's ``nominalQuota`` (plus ``borrowingLimit`` in a cohort) minus what is reserved
(``status.flavorsReservation``, else ``flavorsUsage``), plus what the job's own live gangs hold
(they give it back when the job resizes). The least over the resource groups is the cap.

The count is an upper bound, like node room, never an admission decision: Kueue admits. A cohort
may have less to lend than the ``borrowingLimit``; fair sharing, priorities and admission checks
are not modelled. An overestimate costs what it cost before this module (the gang waits in the
queue, Admitted=False with Kueue's reason); it never loses work. Where the ClusterQueue does not
bound the count (unlimited borrowing in a cohort, a requested resource the queue does not cover,
which Kueue itself will report), there is no cap and node room alone decides.

Rejected: Kueue's workload slices (ElasticJobsViaWorkloadSlices) serve batch Jobs, not pod
groups; reading every Workload of the ClusterQueue to redo Kueue's arithmetic costs a list per
pass and still misses its rules. Everything here is pure: the controller reads the objects
(``act/kueue_reads.py``), the reconcile decides from them (``pods_that_fit``, ``room``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from . import gang
from .capacity import parse_quantity, pod_requests

CLUSTER_QUEUE = "KueueClusterQueue"
"""Key of the job's ClusterQueue among the observed support objects (``support.Observed``)."""
ADMISSION_GATE = "kueue.x-k8s.io/admission"

Obj = dict[str, Any]


def _quantity(value: Any) -> float:
    number = parse_quantity(value) if value is not None else None
    return number if number is not None else 0.0


def _reserved(cluster_queue: Obj) -> dict[tuple[str, str], float]:
    """(flavor, resource) -> quantity reserved in the ClusterQueue (borrowed included)."""
    status = cluster_queue.get("status") or {}
    flavors = status.get("flavorsReservation") or status.get("flavorsUsage") or []
    out: dict[tuple[str, str], float] = {}
    for flavor in flavors:
        for resource in flavor.get("resources") or []:
            out[(str(flavor.get("name")), str(resource.get("name")))] = _quantity(
                resource.get("total")
            )
    return out


def _flavor_fit(
    flavor: Obj,
    needs: Mapping[str, float],
    reserved: Mapping[tuple[str, str], float],
    own_pods: int,
    in_cohort: bool,
) -> int | None:
    """Pods that fit in one flavor's free quota (None: unbounded, unlimited borrowing)."""
    quotas = {str(r.get("name")): r for r in flavor.get("resources") or []}
    count: int | None = None
    for resource, need in needs.items():
        entry = quotas.get(resource)
        if entry is None:
            return 0  # the flavor does not list the resource: no quota for it here
        limit = _quantity(entry.get("nominalQuota"))
        if in_cohort:
            if entry.get("borrowingLimit") is None:
                return None
            limit += _quantity(entry.get("borrowingLimit"))
        used = reserved.get((str(flavor.get("name")), resource), 0.0)
        free = max(limit - used, 0.0) + own_pods * need
        fits = math.floor(free / need + 1e-9)
        count = fits if count is None else min(count, fits)
    return count


def pods_that_fit(
    cluster_queue: Obj, requests: Mapping[str, float], own_pods: int = 0
) -> int | None:
    """How many pods requesting ``requests`` the ClusterQueue's free quota holds, counting the
    ``own_pods`` the job's live gangs hold as free; None when the quota sets no bound (a
    requested resource no resource group covers, unlimited borrowing in a cohort)."""
    spec = cluster_queue.get("spec") or {}
    groups = spec.get("resourceGroups") or []
    covered = {str(r) for g in groups for r in g.get("coveredResources") or []}
    needs = {k: v for k, v in requests.items() if v > 0}
    if "pods" in covered:
        needs["pods"] = 1.0
    if any(resource not in covered for resource in needs):
        return None
    in_cohort = bool(spec.get("cohortName") or spec.get("cohort"))
    reserved = _reserved(cluster_queue)
    count: int | None = None
    for group in groups:
        group_needs = {r: needs[r] for r in group.get("coveredResources") or [] if str(r) in needs}
        if not group_needs:
            continue
        best: int | None = 0
        for flavor in group.get("flavors") or []:
            fits = _flavor_fit(flavor, group_needs, reserved, own_pods, in_cohort)
            if fits is None:
                best = None
                break
            best = max(best, fits)
        if best is not None:
            count = best if count is None else min(count, best)
    return count


def own_pods(pods: Iterable[Obj]) -> int:
    """Pods of quota the job's own gangs hold now: the total count of each pod group with a live
    pod Kueue has admitted (no admission gate, not finished, deleting included: Kueue releases a
    group's quota once all of its pods are gone)."""
    groups: dict[str, int] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        group = (meta.get("labels") or {}).get(gang.KUEUE_GROUP_LABEL)
        if not group or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        gates = [g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates") or []]
        if ADMISSION_GATE in gates:
            continue
        total = (meta.get("annotations") or {}).get(gang.KUEUE_TOTAL_ANNOTATION)
        groups[group] = int(total) if str(total or "").isdigit() else groups.get(group, 0) + 1
    return sum(groups.values())


def room(cluster_queue: Obj | None, template_spec: Obj, pods: Iterable[Obj]) -> int | None:
    """The cap the job's ClusterQueue puts on the pods that fit (None: no cap)."""
    if not cluster_queue:
        return None
    return pods_that_fit(cluster_queue, pod_requests(template_spec), own_pods(pods))
