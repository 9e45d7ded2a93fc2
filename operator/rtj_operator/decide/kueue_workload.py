"""What Kueue says about an attempt's gang: its Workload's admission, as a condition of the job.

Under ``gangScheduling: Kueue`` the ranks wait behind Kueue's admission gate while the queue
has not admitted the gang, and the pods say no more than that they are gated. Why they wait
(no quota left in the ClusterQueue, a higher-priority workload ahead, a flavor that does not
fit) is on the Workload Kueue made for the pod group, named after the group
(``<job>-a<attempt>``, gang.py). The operator reads that Workload on each pass while the gang
is not admitted and reports it as the job's ``Admitted`` condition: False with Kueue's reason
and message and the queue's name while the gang waits, True once Kueue admitted it.

Reading Kueue's own object was chosen over repeating the ClusterQueue's arithmetic (quota minus
usage, priorities, borrowing): only Kueue knows all of its rules, and its message already
says which one holds the gang back. Without permission to read Workloads (an RBAC set without
``kueue.x-k8s.io``) the condition is left out: the ``PodsScheduled`` condition still says the
ranks are held by Kueue's gate.
"""

from __future__ import annotations

from typing import Any

from . import conditions as cond
from . import gang
from .reconcile_context import ReconcileContext

WORKLOAD = "KueueWorkload"
"""Key of the attempt's Workload among the observed support objects (``support.Observed``):
read with them by the controller, so the reconcile stays a pure function of what was read."""
ADMITTED = "Admitted"
"""The job's condition: whether Kueue admitted the current attempt's gang."""
RECHECK_SECONDS = 10.0
"""How often a gang Kueue has not admitted reads its Workload again: the operator does not watch
Workloads (a changed message sends it no event), and the admission itself ungates the pods,
whose events start a pass at once."""


def _condition(workload: dict[str, Any], kind: str) -> dict[str, Any]:
    for entry in (workload.get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return entry
    return {}


def admission(workload: dict[str, Any] | None) -> tuple[bool, str, str] | None:
    """(admitted, reason, Kueue's message) of a Workload; None when there is none yet.

    A Workload not admitted says why in its ``QuotaReserved`` condition (reason ``Pending``
    with the quota it lacks) or, with quota reserved, in ``Admitted`` (admission checks)."""
    if not workload:
        return None
    admitted = _condition(workload, "Admitted")
    if admitted.get("status") == "True":
        return True, "Admitted", str(admitted.get("message") or "")
    reserved = _condition(workload, "QuotaReserved")
    why = reserved if reserved.get("status") != "True" and reserved else admitted
    if not why:
        return False, "Pending", "the Workload has no admission condition yet"
    return False, str(why.get("reason") or "Pending"), str(why.get("message") or "")


def report_admission(ctx: ReconcileContext) -> None:
    """Set the job's ``Admitted`` condition from the current attempt's Workload (asked only of
    a gang under ``gangScheduling: Kueue``, gang_mechanisms.KueueGang, and only when the
    controller could read the Workload)."""
    st = ctx.status
    if WORKLOAD not in ctx.observed_support:
        return
    workload = ctx.observed_support.get(WORKLOAD)
    seen = admission(workload)
    if seen is None or not seen[0]:
        ctx.plan.requeue(RECHECK_SECONDS)
    if seen is None:
        return
    admitted, reason, message = seen
    group = gang.group_name(ctx.job.ref.name, st.attempt)
    queue = ctx.job.spec.queue_name
    cluster_queue = ((workload or {}).get("status") or {}).get("admission", {}).get("clusterQueue")
    if admitted:
        text = f"Kueue admitted Workload {group} of queue {queue}" + (
            f" in ClusterQueue {cluster_queue}" if cluster_queue else ""
        )
    else:
        text = f"Workload {group} waits in Kueue queue {queue}: {message}"
    cond.set_condition(
        st,
        ADMITTED,
        admitted,
        reason=reason,
        message=text,
        now=ctx.now,
        generation=ctx.generation,
    )
