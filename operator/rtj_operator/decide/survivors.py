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
be in the state the survivors hold. A kept pod that cannot rejoin (its worker waited
``RTJ_LOSS_HOLD_SECONDS`` after a failed collective, its agent ``RTJ_REJOIN_SECONDS`` after
that, for the membership, and gave up) ends with its worker's exit code, and the
attempt is handled as any ended attempt: the next one replaces every pod. (Rejected: restarting
the kept pods' containers in place with a container restart rule: the interpreter and ``import
torch`` would be paid again, which is most of a restart.)

A grow keeps the running gang training through the new pods' cold start (a warm join): the new
pods are created in standby (``RTJ_STANDBY=1``: the agent imports torch and the runtime, writes
``resumable.dev/agent-ready`` on its pod, and starts no worker), the kept pods are relabelled
but not yet told the new membership, and only when every new pod is warm (or after
``STANDBY_WAIT_SECONDS``) does every pod get it, the kept ones with ``stop: save``: their
workers commit the step they reached and re-form the gang with the new ones at once. So a grow
costs the running ranks an emergency save and an in-place restart, not the new pods' start.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..api import names
from ..api.api_types import Job
from ..api.envvars import (
    AGENT_READY_ANNOTATION,
    MEMBERSHIP_ANNOTATION,
    NOTICE_ANNOTATION,
    PEER_LOST_ANNOTATION,
    PROGRESS_ANNOTATION,
    STANDBY,
)
from ..api.spec_types import Survivors
from ..api.status_types import JobStatus, Phase
from . import elastic
from .classify import Outcome, RankOutcome
from .gang_mechanisms import GangMechanism, of_status
from .mtbi import interruptions, mtbi_seconds
from .plan_types import MembershipWrite
from .podstate import is_deleting, pod_attempt, pod_deletion, pod_rank
from .progress import annotation_json
from .reconcile_context import ReconcileContext

STANDBY_WAIT_SECONDS = 120.0
"""How long a warm join waits for its new pods' agents to say they are warm before it gives
every pod the new membership anyway (the kept ranks then wait for the late ones in
``init_process_group``, as without the wait)."""
STOP_SAVE, STOP_KILL, STOP_SWITCH, STOP_LEAVE = "save", "kill", "switch", "leave"
STOP_REJOIN = "rejoin"


def _keeps(ctx: ReconcileContext) -> bool:
    return (
        ctx.job.spec.recovery.survivors is Survivors.STAY
        and of_status(ctx.status.gang_scheduling).keeps_pods
    )


def began_at_notice(st: JobStatus) -> bool:
    """Whether the current attempt began at a notice, with pods told to leave (leave.py): every
    old member is alive, so its kept pods switch in process."""
    return st.leaving is not None and st.leaving.attempt == st.attempt


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


def keep(
    ctx: ReconcileContext, names_: Sequence[str], why: str, *, warm_join: bool = False
) -> None:
    """Record the pods the next attempt keeps (call after ``next_attempt``); ``warm_join``:
    they train on until the attempt's new pods are warm (every old member is alive: a grow)."""
    if not names_ or ctx.status.phase is Phase.FAILED:
        return
    ctx.status.kept_pods = list(names_)
    if warm_join:
        ctx.status.membership_pending_since = ctx.now
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
    return rank_pod_name(ctx.job.ref.name, ctx.status.attempt, ctx.status.kept_pods, rank)


def rank_pod_name(job_name: str, attempt: int, kept: Sequence[str], rank: int) -> str:
    """The pod of ``rank`` in ``attempt``: the kept pods hold the first ranks under their own
    names (a pod cannot be renamed), the attempt's new pods the rest."""
    return kept[rank] if rank < len(kept) else names.pod_name(job_name, attempt, rank)


def attempt_pod_names(job: Job) -> list[str]:
    """Every rank pod of the job's current attempt, kept ones included, by rank. Whatever looks
    for the attempt's pods by name asks here: the attempt's own names alone miss the kept pods
    and name pods that never exist."""
    st = job.status
    size = st.gang_size or job.spec.replicas
    return [rank_pod_name(job.ref.name, st.attempt, st.kept_pods, r) for r in range(size)]


def membership_payload(
    ctx: ReconcileContext,
    rank: int,
    *,
    stop: str = STOP_KILL,
    resume_from: str | None = None,
    nnodes: int | None = None,
) -> str:
    """The membership annotation of the current attempt's rank ``rank`` (docs/survivors.md);
    ``resume_from`` default: the attempt's resume point; ``nnodes`` default: the gang's size."""
    st = ctx.status
    return json.dumps(
        {
            "epoch": st.attempt,
            "attempt": st.attempt,
            "nnodes": ctx.size if nnodes is None else nnodes,
            "nodeRank": rank,
            "masterAddr": master_addr(ctx),
            "masterPort": ctx.job.spec.master_port,
            "resumeFrom": (st.resume_from or "") if resume_from is None else resume_from,
            "stop": stop,
            # What a new pod gets as RTJ_MTBI_SECONDS / RTJ_INTERRUPTIONS: kept pods' restarted
            # workers get today's figures, not those of their pod's creation.
            "mtbiSeconds": round(mtbi_seconds(st)),
            "interruptions": interruptions(st),
            "savers": savers(ctx),
        },
        separators=(",", ":"),
    )


def savers(ctx: ReconcileContext) -> int:
    """How many pods hold the training state at a loss (``savers`` in the membership): the kept
    pods that have trained, which take the first ranks. Left out: the spares that take a place
    now, which follow them and still carry their role (``adopt`` removes it), and the standby
    pods of a warm join the loss cut short, kept before they were told a membership. A spare or
    standby pod told one since has trained and counts. They save the last finished step
    together when it is large (docs/survivors.md); at least node rank 0."""
    return max(1, len(trained_kept(ctx)))


def trained_kept(ctx: ReconcileContext) -> list[str]:
    """The kept pods that hold the training state (``_has_trained``), in rank order."""
    by_name = {p["metadata"]["name"]: p for p in ctx.owned}
    return [name for name in ctx.status.kept_pods if _has_trained(by_name.get(name))]


def _has_trained(pod: Mapping[str, Any] | None) -> bool:
    """Whether ``pod`` has run the training workers: no spare role, and either started as a
    rank or told a membership since it started in standby. A pod not seen is not counted."""
    if pod is None or _spare_now(pod):
        return False
    if annotation_json(pod, MEMBERSHIP_ANNOTATION) is not None:
        return True
    return not any(
        env.get("name") == STANDBY and env.get("value") == "1"
        for container in (pod.get("spec") or {}).get("containers") or []
        for env in container.get("env") or []
    )


def _spare_now(pod: Mapping[str, Any] | None) -> bool:
    """Whether ``pod`` still carries the spare role (``spares.is_spare``, which imports this
    module); a pod not seen is not counted as holding the state either."""
    labels = ((pod or {}).get("metadata") or {}).get("labels") or {}
    return pod is None or names.LABEL_ROLE in labels


def adopt(ctx: ReconcileContext, mechanism: GangMechanism, existing: Mapping[int, Any]) -> None:
    """Plan the relabelling and the membership of the kept pods the attempt has not yet
    adopted; give up keeping (delete them, create every rank) when the gang cannot keep them."""
    st, plan = ctx.status, ctx.plan
    if not st.kept_pods:
        return
    by_name = {p["metadata"]["name"]: p for p in ctx.owned}
    usable = mechanism.keeps_pods and len(st.kept_pods) <= ctx.size
    gone = [name for name in st.kept_pods if not _running(by_name.get(name))]
    if not usable or gone:
        for name in st.kept_pods:
            pod = by_name.get(name)
            if pod is not None and not is_deleting(pod):
                plan.deletions.append(pod_deletion(pod, "its attempt replaces the whole gang"))
        st.kept_pods = []
        return
    pending = st.membership_pending_since is not None
    stop = kept_stop(ctx)
    for rank, name in enumerate(st.kept_pods):
        if rank in existing:
            continue  # relabelled already (an operator restart mid-creation)
        annotations: dict[str, str | None] = {PROGRESS_ANNOTATION: None}
        labels: dict[str, str | None] = {
            names.LABEL_ATTEMPT: str(st.attempt),
            names.LABEL_RANK: str(rank),
        }
        if _spare_now(by_name[name]):
            labels[names.LABEL_ROLE] = None  # a spare takes the place (spares.py)
        if _grow_notice(by_name.get(name)):
            annotations[NOTICE_ANNOTATION] = None  # answered: its checkpoint is committed
        if not pending:  # a warm join tells them once the new pods are warm (switch_when_warm)
            annotations[MEMBERSHIP_ANNOTATION] = membership_payload(ctx, rank, stop=stop)
        plan.memberships.append(MembershipWrite(pod=name, labels=labels, annotations=annotations))


def kept_stop(ctx: ReconcileContext) -> str:
    """How the kept pods take the attempt: in process at a notice (every old member alive:
    ``switch``); after a loss, in process too when the job switches in process and every place
    of the attempt is a kept pod or a spare (``rejoin``: a cold new pod would resume from the
    commit, not from its peers); else their workers restart (``kill``)."""
    st = ctx.status
    if began_at_notice(st):
        return STOP_SWITCH
    if ctx.job.spec.recovery.in_process_switch and len(st.kept_pods) == ctx.size:
        return STOP_REJOIN
    return STOP_KILL


def _grow_notice(pod: Mapping[str, Any] | None) -> bool:
    """Whether the pod's notice is a grow's request to checkpoint (not a real one)."""
    said = annotation_json(pod, NOTICE_ANNOTATION) or {}
    return said.get("reason") == elastic.GROW_REASON


def ready_epoch(pod: Mapping[str, Any] | None) -> int | None:
    """The epoch a standby pod's agent said it is warm for (``resumable.dev/agent-ready``)."""
    value = (annotation_json(pod, AGENT_READY_ANNOTATION) or {}).get("epoch")
    return value if isinstance(value, int) else None


def lost_peer_reporters(pods: Iterable[Mapping[str, Any]], attempt: int) -> frozenset[int]:
    """The ranks whose pods of ``attempt`` reported a failed collective of that gang
    (``resumable.dev/peer-lost``: a kept worker waiting for its new membership, or any managed
    worker before it ends; an older gang's report is stale). The one filter for the question:
    the reads (act/job_reads.py) and the gang watch pass whatever pods they hold."""
    return frozenset(
        rank
        for pod in pods
        if pod_attempt(pod) == attempt
        and (rank := pod_rank(pod)) is not None
        and (annotation_json(pod, PEER_LOST_ANNOTATION) or {}).get("epoch") == attempt
    )


def reports_lost_peer(pods: Iterable[Mapping[str, Any]], attempt: int) -> bool:
    """Whether a rank's pod of ``attempt`` reported a failed collective of that gang."""
    return bool(lost_peer_reporters(pods, attempt))


def switch_when_warm(ctx: ReconcileContext, current: Mapping[int, dict[str, Any]]) -> None:
    """A warm join: once every new pod's agent is warm (or ``STANDBY_WAIT_SECONDS`` passed),
    give every pod of the attempt its membership; the kept ones save the step they reached
    first (``stop: save``) and every rank resumes from the newest commit."""
    st, plan = ctx.status, ctx.plan
    since = st.membership_pending_since
    if since is None or not st.gang_created:
        return
    kept = len(st.kept_pods)
    new = [current.get(rank) for rank in range(kept, ctx.size)]
    warm = sum(1 for pod in new if _running(pod) and ready_epoch(pod) == st.attempt)
    waited = (ctx.now - since).total_seconds()
    if warm < len(new) and waited < STANDBY_WAIT_SECONDS:
        plan.requeue(min(1.0, STANDBY_WAIT_SECONDS - waited))
        return
    in_process = ctx.job.spec.recovery.in_process_switch
    for rank in range(ctx.size):
        stop = STOP_SWITCH if in_process else STOP_SAVE if rank < kept else STOP_KILL
        plan.memberships.append(
            MembershipWrite(
                pod=pod_for_rank(ctx, rank),
                labels={},
                annotations={
                    MEMBERSHIP_ANNOTATION: membership_payload(ctx, rank, stop=stop, resume_from="")
                },
            )
        )
    st.membership_pending_since = None
    how = (
        "every pod runs already"
        if not new
        else f"all {len(new)} new pods are warm"
        if warm == len(new)
        else f"{warm} of {len(new)} new pods are warm after {STANDBY_WAIT_SECONDS:g}s"
    )
    trained = savers(ctx)  # the kept pods that hold the state (not warm standby pods kept)
    then = (
        f"the {trained} kept pods that trained switch in process and send the others the state"
        if in_process
        else f"the {trained} kept pods that trained save and every pod re-forms the gang of "
        f"{ctx.size}"
    )
    plan.event(
        "Normal", "MembershipSwitched", f"attempt {st.attempt}: {how} ({waited:.1f}s); {then}"
    )
