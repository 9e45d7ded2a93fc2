"""Watching a running gang: classify every rank, act on the gang's verdict, report scheduling.

A gang is all or nothing: one rank preempted or failed ends the attempt for all of them
(classify.py decides per rank, ``gang_verdict`` for the gang). While the gang is active this module
also passes termination notices on to the ranks, says why ranks cannot be scheduled, and for an
elastic job hands over to sizing.py (re-shrink, grow).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..api.api_types import Job
from ..api.envvars import NOTICE_ANNOTATION
from ..api.status_types import Phase
from ..api.timeutil import parse_time
from . import conditions as cond
from . import elastic, leave, spares, survivors
from .classify import Outcome, RankOutcome, Signals, classify_rank, gang_verdict
from .gang_mechanisms import GangMechanism, of_status
from .notice import notice_payload
from .plan_types import NoticeWrite
from .podstate import UNSCHEDULABLE, as_deleted, is_deleting, scheduling_hold
from .reconcile_context import ReconcileContext
from .sizing import reshrink, watch_for_grow
from .transitions import interrupted


def _signals(job: Job, current: Mapping[int, dict[str, Any]]) -> Signals:
    ps = job.spec.preemption_signals
    return Signals(
        termination_taints=ps.termination_taints,
        node_not_ready_seconds=ps.node_not_ready_seconds,
        container_name=job.spec.container_name,
        failure_settle_seconds=ps.failure_settle_seconds,
        peer_lost_ranks=survivors.lost_peer_reporters(current.values(), job.status.attempt),
    )


def watch_gang(ctx: ReconcileContext) -> None:
    """Classify the current attempt's ranks and act on the gang's verdict."""
    st, plan, job = ctx.status, ctx.plan, ctx.job
    current = ctx.current_pods()
    signals = _signals(job, current)
    outcomes: list[RankOutcome] = []
    for rank in range(ctx.size):
        expected = survivors.pod_for_rank(ctx, rank)
        pod = current.get(rank) or as_deleted(ctx.departed.get(expected))
        node_name = ((pod or {}).get("spec") or {}).get("nodeName")
        outcomes.append(
            classify_rank(
                rank,
                pod,
                ctx.nodes.get(node_name) if node_name else None,
                signals=signals,
                now=ctx.now,
                expected_pod=expected,
            )
        )
    verdict = gang_verdict(
        outcomes,
        settle_seconds=signals.failure_settle_seconds,
        now=ctx.now,
        reporters=signals.peer_lost_ranks,
    )
    active = verdict.outcome is Outcome.ACTIVE
    if active and leave.at_notice(ctx, outcomes, current, verdict.all_running):
        return
    _deliver_notices(ctx, outcomes, current)
    if verdict.outcome is Outcome.PREEMPTED:
        keep = spares.fill_places(ctx, survivors.keepable(ctx, outcomes, current), ctx.size)
        interrupted(ctx, verdict, current, preemption=True, keep=keep)
    elif verdict.outcome is Outcome.FAILED:
        interrupted(ctx, verdict, current, preemption=False)
    elif verdict.outcome is Outcome.SUCCEEDED:
        st.completion_time = ctx.now
        ctx.phase(
            Phase.SUCCEEDED,
            "AllRanksSucceeded",
            f"all {ctx.size} ranks of attempt {st.attempt} exited 0",
        )
        plan.event("Normal", "Succeeded", f"all {ctx.size} ranks exited 0")
    else:
        if verdict.all_running and st.phase is not Phase.RUNNING:
            ctx.phase(
                Phase.RUNNING,
                "AllRanksRunning",
                f"all {ctx.size} ranks of attempt {st.attempt} are running",
            )
        survivors.switch_when_warm(ctx, current)
        spares.tend(ctx, current, verdict.all_running)
        _report_scheduling(ctx, current)
        _mechanism(ctx).report_admission(ctx)
        plan.requeue(verdict.recheck_after)
        if job.spec.elastic is None:
            st.grow = None  # elastic removed meanwhile: a pending grow is dropped with it
            st.grow_room_since = None
        elif not reshrink(ctx, current):
            watch_for_grow(ctx, verdict.all_running, current)


def _report_scheduling(ctx: ReconcileContext, current: Mapping[int, dict[str, Any]]) -> None:
    """PodsScheduled=False with the scheduler's reason while a rank cannot be placed (or its
    scheduling gates, while they hold it back: Kueue's until the queue admits the gang), so a
    gang that waits says why instead of showing Pending or Restarting alone."""
    stuck = [
        (rank, pod, *hold)
        for rank, pod in sorted(current.items())
        if not is_deleting(pod) and (hold := scheduling_hold(pod)) is not None
    ]
    had = cond.condition(ctx.status, cond.PODS_SCHEDULED)
    if stuck:
        # Under a gang, most ranks only say they wait for the others; show one that says why.
        rank, pod, reason, message = next(
            (entry for entry in stuck if "nodes are available" in entry[3]),
            next((entry for entry in stuck if entry[2] == UNSCHEDULABLE), stuck[0]),
        )
        cond.set_condition(
            ctx.status,
            cond.PODS_SCHEDULED,
            False,
            reason=reason,
            message=f"{len(stuck)} of {ctx.size} ranks cannot be scheduled"
            f"{_mechanism(ctx).held_note(ctx, bound=_bound_before_refusal(current))}; "
            f"rank {rank} ({pod['metadata'].get('name')}): {message}",
            now=ctx.now,
            generation=ctx.generation,
        )
    elif (
        had is not None
        and had.status == "False"
        and all((p.get("spec") or {}).get("nodeName") for p in current.values())
    ):
        cond.set_condition(
            ctx.status,
            cond.PODS_SCHEDULED,
            True,
            reason="AllRanksScheduled",
            message=f"every rank of attempt {ctx.status.attempt} is bound to a node",
            now=ctx.now,
            generation=ctx.generation,
        )


def _scheduled_since(pod: dict[str, Any], status: str) -> datetime | None:
    """When the pod's PodScheduled condition last turned ``status``."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == status:
            return parse_time(condition.get("lastTransitionTime"))
    return None


def _bound_before_refusal(current: Mapping[int, dict[str, Any]]) -> int:
    """Ranks bound to a node no later than the scheduler refused a rank of the same gang
    (``Unschedulable``, same second included). A scheduler that enforces the PodGroup binds the
    whole gang at once, after any refusal; a bound rank older than a refusal means it binds the
    pods one by one. Ranks bound after every refusal (the gang binding now) do not count."""
    live = [p for p in current.values() if not is_deleting(p)]
    refused = [
        t
        for p in live
        if (scheduling_hold(p) or ("",))[0] == UNSCHEDULABLE
        and (t := _scheduled_since(p, "False")) is not None
    ]
    if not refused:
        return 0
    latest = max(refused)
    return sum(
        1
        for p in live
        if (p.get("spec") or {}).get("nodeName")
        and (t := _scheduled_since(p, "True")) is not None
        and t <= latest
    )


def _mechanism(ctx: ReconcileContext) -> GangMechanism:
    """The mechanism that keeps the current attempt's gang all-or-nothing."""
    return of_status(ctx.status.gang_scheduling)


def _deliver_notices(
    ctx: ReconcileContext, outcomes: list[RankOutcome], current: Mapping[int, dict[str, Any]]
) -> None:
    """Write the notice into every running rank whose node has a termination taint, and empty
    it again when the taint is withdrawn (a cancelled scale-down): the notice file is empty
    when there is no notice, so a later termination of the same node is new content the
    runtime acts on, not the old notice it already answered."""
    noticed = []
    for outcome in outcomes:
        pod = current.get(outcome.rank)
        if pod is None or outcome.outcome is not Outcome.ACTIVE:
            continue
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        told = str(annotations.get(NOTICE_ANNOTATION) or "")
        if outcome.notice is None:
            if told and elastic.GROW_REASON not in told:
                ctx.plan.notices.append(NoticeWrite(pod=outcome.pod or "", payload=""))
            continue
        noticed.append(outcome)
        if told and elastic.GROW_REASON not in told:
            continue  # already told (a grow's notice is overwritten by a real one)
        payload = notice_payload(outcome.notice, outcome.node or "", ctx.now)
        ctx.plan.notices.append(NoticeWrite(pod=outcome.pod or "", payload=payload))
        ctx.plan.event(
            "Warning",
            "PreemptionNotice",
            f"attempt {ctx.status.attempt}: node {outcome.node} of rank "
            f"{outcome.rank} has taint {outcome.notice.get('key')}; "
            "told the rank to checkpoint now",
        )
    had = cond.condition(ctx.status, cond.PREEMPTION_NOTICE)
    if noticed:
        first = noticed[0]
        cond.set_condition(
            ctx.status,
            cond.PREEMPTION_NOTICE,
            True,
            reason="TerminationTaint",
            message=f"node {first.node} of rank {first.rank} is about to go "
            f"({(first.notice or {}).get('key')})",
            now=ctx.now,
            generation=ctx.generation,
        )
    elif had is not None and had.status == "True":
        cond.set_condition(
            ctx.status,
            cond.PREEMPTION_NOTICE,
            False,
            reason="NoNotice",
            message="no rank's node is announced for termination",
            now=ctx.now,
            generation=ctx.generation,
        )
