"""A notice under ``recovery.inProcessSwitch``: the noticed pods leave, the others switch at once.

Without it, a termination notice on a node of a ``Stay`` gang makes every rank checkpoint, and
the gang changes only when the node really goes: the kept ranks then save or lose the step in
flight and their workers restart (on a GPU cluster: CUDA, NCCL, the fetch and load of the
commit), all of them, for one lost node. But at a notice every member of the gang is still
alive, which is what an in-process switch needs. So when the job switches in process, the
operator ends the attempt at the notice (a preemption, cause ``TerminationNotice``): the next
attempt keeps the pods on the other nodes and tells them the smaller gang with ``stop: switch``
(``survivors.adopt``), and tells the pods on the noticed nodes ``stop: leave``
(``status.leaving``). At the first step boundary every rank agrees on, the kept workers form the
smaller group and train on, and the leaving ones end with exit code 0: no checkpoint, no
restart, no step lost. Room elsewhere is taken as after any loss: the pods for the lost places
start in standby and join warm (``restore.after_leave``).

A fixed-size gang with ``recovery.spares`` does the same when a warm spare can take each noticed
place: the spares are told the same membership in standby, and join the switch as a grow's new
pods do, getting the state from rank 0. The gang keeps its size, and no worker restarts.

It is done only when the gang could switch: a ``Stay`` gang under the operator's own or native
gang scheduling, every rank running and trained in this attempt (its workers built their
manager, so they can take part in the agreement), no warm join under way, and enough kept pods
and warm spares: ``minReplicas`` for an elastic gang, every place for a fixed one. Otherwise the
notice is passed on as before (the ranks checkpoint) and the gang changes when the node goes.
A leaving pod still running ``LEAVE_WAIT_SECONDS`` after it was told is deleted (its workers
could not reach a boundary).
(Rejected: waiting for the node's shutdown to switch: the shutdown's SIGTERM reaches the
leaving workers first, and their emergency save is a collective of the whole old gang, which
ends every worker.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..api.envvars import MEMBERSHIP_ANNOTATION
from ..api.status_types import Cause, Leaving
from . import spares, survivors
from .classify import GangVerdict, Outcome, RankOutcome
from .plan_types import MembershipWrite
from .podstate import is_finished
from .reconcile_context import ReconcileContext
from .transitions import interrupted

LEAVE_WAIT_SECONDS = 60.0
"""How long a pod told ``stop: leave`` may run on before the operator deletes it."""


def at_notice(
    ctx: ReconcileContext,
    outcomes: Sequence[RankOutcome],
    current: Mapping[int, dict[str, Any]],
    all_running: bool,
) -> bool:
    """End the attempt at a notice and let the noticed pods leave, when the gang can switch
    without them (module docstring); whether it did."""
    st, spec = ctx.status, ctx.job.spec
    noticed = [o for o in outcomes if o.outcome is Outcome.ACTIVE and o.notice is not None]
    if not noticed or not spec.recovery.in_process_switch:
        return False
    if not all_running or st.training_since is None or st.membership_pending_since is not None:
        return False
    kept = spares.fill_places(ctx, survivors.keepable(ctx, outcomes, current), ctx.size)
    if len(kept) < (ctx.size if spec.elastic is None else spec.elastic.min_replicas):
        return False
    first = noticed[0]
    nodes = sorted({o.node or "" for o in noticed})
    trigger = RankOutcome(
        first.rank,
        Outcome.PREEMPTED,
        pod=first.pod,
        node=first.node,
        cause=Cause.TERMINATION_NOTICE,
        message=f"node {first.node} has taint {(first.notice or {}).get('key')}; "
        f"{len(noticed)} pods on {', '.join(nodes)} leave and {len(kept)} switch in process",
    )
    leaving = [o.pod or "" for o in noticed]
    verdict = GangVerdict(Outcome.PREEMPTED, trigger=trigger, all_running=True)
    interrupted(ctx, verdict, current, preemption=True, keep=kept, leaving=leaving)
    if st.kept_pods:  # the job goes on (not failed for maxPreemptions)
        tell(ctx, leaving)
    return True


def tell(ctx: ReconcileContext, pods: Sequence[str]) -> None:
    """Tell ``pods`` they leave the current attempt's gang (``stop: leave``), and record them."""
    st = ctx.status
    payload = survivors.membership_payload(
        ctx, -1, stop=survivors.STOP_LEAVE, resume_from="", nnodes=len(st.kept_pods)
    )
    for pod in pods:
        ctx.plan.memberships.append(
            MembershipWrite(pod=pod, labels={}, annotations={MEMBERSHIP_ANNOTATION: payload})
        )
    st.leaving = Leaving(pods=list(pods), attempt=st.attempt, since=ctx.now)
    ctx.plan.event(
        "Normal",
        "Leaving",
        f"attempt {st.attempt}: {len(pods)} pods on nodes announced for termination "
        f"({', '.join(pods)}) leave the gang at the next step boundary; the "
        f"{len(st.kept_pods)} kept pods switch to it in process",
    )


def waits(ctx: ReconcileContext, pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` (of an older attempt) is one told to leave that may still run: its
    workers leave at a step boundary, and deleting it first would end them mid-agreement."""
    leaving = ctx.status.leaving
    if leaving is None or not survivors.began_at_notice(ctx.status) or is_finished(pod):
        return False
    told = (ctx.now - leaving.since).total_seconds() < LEAVE_WAIT_SECONDS
    return told and pod["metadata"].get("name") in leaving.pods


def forget_when_gone(ctx: ReconcileContext) -> None:
    """Clear ``status.leaving`` once none of its pods runs, or a newer attempt began."""
    leaving = ctx.status.leaving
    if leaving is None:
        return
    live = {p["metadata"].get("name") for p in ctx.owned if not is_finished(p)}
    if not survivors.began_at_notice(ctx.status) or not live.intersection(leaving.pods):
        ctx.status.leaving = None
