"""Survivors stay: a preempted gang keeps its healthy pods and tells them the new membership.

With ``spec.recovery.survivors: Stay``, a preemption of some of a gang's pods (a node lost, an
eviction, a disruption) still ends the attempt (it is recorded, counted against
``maxPreemptions``, and the next attempt resumes from the newest commit), but the pods that run
on healthy nodes are not deleted. The next attempt *keeps* them (``status.keptPods``): they take
its first ranks, rank 0 among them, so the rendezvous is on a pod that is already up. Each kept
pod is relabelled into the new attempt and given the annotation ``resumable.dev/membership``
(the epoch, which is the attempt number, the gang's size, its new rank, the rendezvous, the
checkpoint); its in-pod agent (``python -m trainer_runtime.agent``, put in front of the
container's command by ``manifests.build_pod``) restarts the workers in place, warm. Only the
lost places get new pods. Its progress annotation is cleared with the relabelling: every
report a pod of the attempt carries must be that attempt's.

A pod is kept only when it is Running, not being deleted, and on a node without a termination
notice. Under native gang scheduling the new attempt's PodGroup holds only its new pods
(``minCount`` = their number): the kept ones are bound already, and the new ones are still
placed all or none. A gang Kueue admits is replaced whole: Kueue admits a pod group by its
labels and count as one workload, which kept pods of an earlier group would break. A failure
(a rank's own non-zero exit) always replaces the whole gang: the failure may
be in the state the survivors hold. A kept pod that cannot rejoin (its agent waited
``RTJ_REJOIN_SECONDS`` for the membership and gave up) ends with its worker's exit code, and the
attempt is handled as any ended attempt: the next one replaces every pod. (Rejected: restarting
the kept pods' containers in place with a container restart rule: the interpreter and ``import
torch`` would be paid again, which is most of a restart.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from . import gang, names
from .classify import Outcome, RankOutcome
from .envvars import MEMBERSHIP_ANNOTATION, PROGRESS_ANNOTATION
from .plan_types import MembershipWrite
from .podstate import is_deleting, pod_deletion
from .reconcile_context import ReconcileContext
from .spec_types import Survivors
from .status_types import Phase


def _keeps(ctx: ReconcileContext) -> bool:
    return ctx.job.spec.recovery.survivors is Survivors.STAY and ctx.status.gang_scheduling in (
        None,
        gang.Mechanism.OPERATOR.value,
        gang.Mechanism.POD_GROUP.value,
    )


def _running(pod: dict[str, Any] | None) -> bool:
    return (
        pod is not None
        and not is_deleting(pod)
        and (pod.get("status") or {}).get("phase") == "Running"
    )


def keepable(
    ctx: ReconcileContext, outcomes: Sequence[RankOutcome], current: Mapping[int, dict[str, Any]]
) -> list[str]:
    """The pods a preempted attempt may keep, by rank order; [] unless the job keeps survivors:
    running, and on a node that is neither lost nor announced for termination."""
    if not _keeps(ctx):
        return []
    return [
        current[o.rank]["metadata"]["name"]
        for o in outcomes
        if o.outcome is Outcome.ACTIVE and o.notice is None and _running(current.get(o.rank))
    ]


def all_running(ctx: ReconcileContext, current: Mapping[int, dict[str, Any]]) -> list[str]:
    """Every running pod of a gang that ends healthy (a grow, a re-shrink), by rank; [] unless
    the job keeps survivors."""
    if not _keeps(ctx):
        return []
    return [pod["metadata"]["name"] for _, pod in sorted(current.items()) if _running(pod)]


def keep(ctx: ReconcileContext, names_: Sequence[str], why: str) -> None:
    """Record the pods the next attempt keeps (call after ``next_attempt``)."""
    if not names_ or ctx.status.phase is Phase.FAILED:
        return
    ctx.status.kept_pods = list(names_)
    ctx.plan.event(
        "Normal",
        "SurvivorsStay",
        f"attempt {ctx.status.attempt} keeps {len(names_)} running pods "
        f"({', '.join(names_)}) and {why}",
    )


def master_addr(ctx: ReconcileContext) -> str:
    """The new gang's rendezvous: its rank 0, a kept pod when there is one."""
    if ctx.status.kept_pods:
        return f"{ctx.status.kept_pods[0]}.{names.service_name(ctx.job.ref.name)}"
    return names.master_addr(ctx.job.ref.name, ctx.status.attempt)


def pod_for_rank(ctx: ReconcileContext, rank: int) -> str:
    """The name of the current attempt's pod of ``rank`` (a kept pod's own name)."""
    kept = ctx.status.kept_pods
    if rank < len(kept):
        return kept[rank]
    return names.pod_name(ctx.job.ref.name, ctx.status.attempt, rank)


def membership_payload(ctx: ReconcileContext, rank: int) -> str:
    """The membership annotation of the current attempt's rank ``rank`` (docs/survivors.md)."""
    st = ctx.status
    return json.dumps(
        {
            "epoch": st.attempt,
            "attempt": st.attempt,
            "nnodes": ctx.size,
            "nodeRank": rank,
            "masterAddr": master_addr(ctx),
            "masterPort": ctx.job.spec.master_port,
            "resumeFrom": st.resume_from or "",
            "stop": "kill",
        },
        separators=(",", ":"),
    )


def adopt(ctx: ReconcileContext, mechanism: gang.Mechanism, existing: Mapping[int, Any]) -> None:
    """Plan the relabelling and the membership of the kept pods the attempt has not yet
    adopted; give up keeping (delete them, create every rank) when the gang cannot keep them."""
    st, plan = ctx.status, ctx.plan
    if not st.kept_pods:
        return
    by_name = {p["metadata"]["name"]: p for p in ctx.owned}
    usable = mechanism is not gang.Mechanism.KUEUE and len(st.kept_pods) <= ctx.size
    gone = [name for name in st.kept_pods if not _running(by_name.get(name))]
    if not usable or gone:
        for name in st.kept_pods:
            pod = by_name.get(name)
            if pod is not None and not is_deleting(pod):
                plan.deletions.append(pod_deletion(pod, "its attempt replaces the whole gang"))
        st.kept_pods = []
        return
    for rank, name in enumerate(st.kept_pods):
        if rank in existing:
            continue  # relabelled already (an operator restart mid-creation)
        plan.memberships.append(
            MembershipWrite(
                pod=name,
                labels={names.LABEL_ATTEMPT: str(st.attempt), names.LABEL_RANK: str(rank)},
                annotations={
                    MEMBERSHIP_ANNOTATION: membership_payload(ctx, rank),
                    PROGRESS_ANNOTATION: None,
                },
            )
        )
