"""Elastic gang sizes applied to a job: the size an attempt starts at, re-shrink and grow.

``elastic.py`` holds the pure rules (which size, when to grow, when to re-shrink); this module
applies their decisions to the job's status and plan: conditions, the size history, events, the
grow's notices, and ending the attempt when a grow or re-shrink resubmits the gang. Keeping the
rules apart from their bookkeeping lets each rule be tested on its own, without a job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..api.status_types import Cause, GrowRequest, Interruption, JobStatus, Phase
from . import conditions as cond
from . import elastic, restore, survivors
from .grow_payoff import grow_cost
from .notice import notice_payload
from .plan_types import NoticeWrite
from .podstate import (
    SCHEDULING_GATED,
    is_finished,
    live_pods,
    pod_attempt,
    pod_deletion,
    scheduling_hold,
)
from .reconcile_context import ReconcileContext
from .transitions import (
    committed_and_lost,
    newest_committed_step,
    next_attempt,
    record_interruption,
)


def _grown_from(st: JobStatus) -> int | None:
    """The size of the gang a grow just ended (the next attempt starts larger at once)."""
    last = st.interruptions[-1] if st.interruptions else None
    if last is None or last.cause is not Cause.GROW or last.attempt != st.attempt - 1:
        return None
    return st.size_history[-1].size if st.size_history else None


def choose_size(ctx: ReconcileContext) -> bool:
    """Decide the current attempt's gang size before its pods exist; False while it waits."""
    st, job = ctx.status, ctx.job
    grown_from = _grown_from(st)
    decision = elastic.start_size(
        job.spec,
        ctx.fit(),
        waiting_since=st.capacity_wait_since,
        now=ctx.now,
        grown_from=grown_from,
    )
    if survivors.began_at_notice(st):
        decision = restore.after_leave(ctx, decision)
    elif grown_from is None:
        decision = restore.survivors_first(ctx, decision)
    capacity = cond.condition(st, cond.CAPACITY)
    st.capacity_wait_since = decision.wait_since
    if decision.size is None:
        if capacity is None or capacity.reason != decision.reason:
            ctx.plan.event("Warning", "WaitingForCapacity", decision.message)
        cond.set_condition(
            st,
            cond.CAPACITY,
            False,
            reason=decision.reason,
            message=decision.message,
            now=ctx.now,
            generation=ctx.generation,
        )
        ctx.phase(Phase.PENDING, decision.reason, f"attempt {st.attempt}: {decision.message}")
        ctx.plan.requeue(decision.recheck_after)
        return False
    st.gang_size = decision.size
    st.world_size = decision.size * job.spec.processes_per_pod
    if job.spec.elastic is not None or capacity is not None:
        cond.set_condition(
            st,
            cond.CAPACITY,
            True,
            reason=decision.reason,
            message=decision.message,
            now=ctx.now,
            generation=ctx.generation,
        )
    _record_start_size(ctx, decision, decision.size, grown_from)
    return True


def _record_start_size(
    ctx: ReconcileContext, decision: elastic.StartDecision, size: int, grown_from: int | None
) -> None:
    """Add the attempt's size to the size history (Grown, Restored, Shrunk or the start's
    reason) and say so in an event when it differs from the size before."""
    st, job = ctx.status, ctx.job
    previous = st.size_history[-1].size if st.size_history else None
    last = st.interruptions[-1] if st.interruptions else None
    lost = 0 if grown_from is not None else (last.steps_lost if last else None)
    reason = decision.reason.value
    if previous is not None and size == job.spec.replicas and previous < size:
        reason = elastic.StartReason.GROWN.value if grown_from else "Restored"
    changed = elastic.record_size(
        st,
        size=size,
        world_size=st.world_size,
        reason=reason,
        message=decision.message,
        now=ctx.now,
        steps_lost=lost if previous is not None else None,
    )
    # A first attempt that starts below replicas has shrunk from the size the spec asks for.
    before = previous if previous is not None else job.spec.replicas
    if changed and before != size:
        verb = "Shrunk" if size < before else "Grown"
        ctx.plan.event(
            "Warning" if verb == "Shrunk" else "Normal",
            verb,
            f"attempt {st.attempt}: {before} -> {size} pods (world size "
            f"{st.world_size}): {decision.message}",
        )


def reshrink(ctx: ReconcileContext, current: Mapping[int, dict[str, Any]]) -> bool:
    """End a gang whose pods were not all scheduled within the wait and resubmit it at the
    smaller size that fits (elastic.reshrink_step); whether it did."""
    st, plan, job = ctx.status, ctx.plan, ctx.job
    live = live_pods(current)
    scheduled = sum(1 for p in live if (p.get("spec") or {}).get("nodeName"))
    # Pods of an earlier attempt still hold their nodes until they are gone: the wait starts
    # once they are, so a gang is never shrunk for room its own predecessor still occupies.
    lingering = any(pod_attempt(p) != st.attempt and not is_finished(p) for p in ctx.owned)
    # A rank held by scheduling gates (Kueue's, until the queue admits the gang) waits for
    # admission, not for room: a smaller gang would only queue again, at the back.
    gated = any((scheduling_hold(p) or ("",))[0] == SCHEDULING_GATED for p in live)
    minimum = job.spec.elastic.min_replicas if job.spec.elastic is not None else ctx.size
    if ctx.size <= minimum or scheduled >= ctx.size or lingering or gated:
        st.capacity_wait_since = None
        return False
    if st.capacity_wait_since is None:
        st.capacity_wait_since = ctx.now
    decision = elastic.reshrink_step(
        job.spec,
        size=ctx.size,
        fit=ctx.fit(),
        scheduled=scheduled,
        waiting_since=st.capacity_wait_since,
        now=ctx.now,
    )
    if decision.size is None:
        plan.requeue(decision.recheck_after)
        return False
    _resubmit_smaller(ctx, current, live, decision.size, decision.message)
    return True


def _resubmit_smaller(
    ctx: ReconcileContext,
    current: Mapping[int, dict[str, Any]],
    live: list[dict[str, Any]],
    size: int,
    message: str,
) -> None:
    """End the attempt as unschedulable and start the next one at ``size`` pods, keeping
    running pods up to that size (survivors.py)."""
    st, plan, job = ctx.status, ctx.plan, ctx.job
    previous = ctx.size
    record_interruption(
        ctx,
        Interruption(
            time=ctx.now,
            attempt=st.attempt,
            cause=Cause.UNSCHEDULABLE,
            preemption=False,
            message=message,
            last_committed_step=newest_committed_step(st),
            steps_lost=0,
        ),
    )
    kept = survivors.all_running(ctx, current)[:size]
    for pod in live:
        if pod["metadata"].get("name") not in kept:
            plan.deletions.append(pod_deletion(pod, f"shrinking to {size} pods"))
    next_attempt(ctx, 0.0, "Reshrinking", message)
    survivors.keep(ctx, kept, f"shrinks to {size} pods")
    # The size is decided here, from what could be scheduled, not again from the capacity count
    # that was just proven too high.
    st.gang_size = size
    st.world_size = size * job.spec.processes_per_pod
    cond.set_condition(
        st,
        cond.CAPACITY,
        True,
        reason=elastic.StartReason.SHRUNK,
        message=message,
        now=ctx.now,
        generation=ctx.generation,
    )
    elastic.record_size(
        st,
        size=size,
        world_size=st.world_size,
        reason=elastic.StartReason.SHRUNK.value,
        message=message,
        now=ctx.now,
        steps_lost=0,
    )
    plan.event(
        "Warning",
        "Shrunk",
        f"attempt {st.attempt}: {previous} -> {size} pods (world size {st.world_size}): {message}",
    )


def _committed_step_of_attempt(st: JobStatus) -> int | None:
    last = st.last_committed_checkpoint
    return last.step if last is not None and last.attempt == st.attempt else None


def watch_for_grow(
    ctx: ReconcileContext, all_running: bool, current: Mapping[int, dict[str, Any]]
) -> None:
    """Grow a gang below full size: notice, wait for the commit, then resubmit larger (a gang
    that keeps its pods resubmits at once: they save or hand the state over at the switch)."""
    st, plan, job = ctx.status, ctx.plan, ctx.job
    if st.restore is not None:
        joining = restore.joining(ctx, all_running)
        if joining:
            _restart_larger(ctx, current, restore.decision(ctx, joining), joining)
        if st.restore is not None or joining:
            return
    if ctx.size >= job.spec.replicas and st.grow is None:
        return
    decision = elastic.grow_step(
        job.spec,
        size=ctx.size,
        fit=ctx.fit(),
        all_running=all_running,
        trained_since=st.training_since,
        # An abandoned grow restarts the interval: a gang that cannot commit in time is not
        # asked to checkpoint again on the very next pass.
        abandoned_at=st.grow_abandoned_at,
        room_since=st.grow_room_since,
        request=st.grow,
        committed_step=_committed_step_of_attempt(st),
        now=ctx.now,
        cost=grow_cost(st),
    )
    st.grow_room_since = decision.room_since
    if decision.deferred and st.grow_deferred is None:
        plan.event("Normal", "GrowDeferred", f"attempt {st.attempt}: {decision.message}")
    st.grow_deferred = decision.message if decision.deferred else None
    plan.requeue(decision.recheck_after)
    if decision.action is elastic.GrowAction.REQUEST and _keeps_every_pod(ctx, current):
        message = (
            f"room for {decision.target} of {job.spec.replicas} pods; the {ctx.size} running "
            "pods stay and train on, with no checkpoint first"
        )
        _restart_larger(ctx, current, replace(decision, message=message))
    elif decision.action is elastic.GrowAction.REQUEST:
        _request_grow(ctx, current, decision)
    elif decision.action is elastic.GrowAction.ABANDON:
        st.grow = None
        st.grow_abandoned_at = ctx.now
        plan.event("Warning", "GrowAbandoned", f"attempt {st.attempt}: {decision.message}")
    elif decision.action is elastic.GrowAction.RESTART:
        _restart_larger(ctx, current, decision)


def _keeps_every_pod(ctx: ReconcileContext, current: Mapping[int, dict[str, Any]]) -> bool:
    """Whether the grow needs no checkpoint first: with ``survivors: Stay`` every running pod
    is kept through the warm join, and its workers commit the step they reached at the switch
    (``stop: save``) or hand the state over in process (``recovery.inProcessSwitch``). Should a
    kept pod go before the switch, the survivors save the last finished step as at any loss;
    should the whole gang be replaced, it resumes from the newest commit."""
    kept = survivors.all_running(ctx, current)
    return bool(kept) and len(kept) == len(live_pods(current))


def _request_grow(
    ctx: ReconcileContext, current: Mapping[int, dict[str, Any]], decision: elastic.GrowDecision
) -> None:
    """Ask the running ranks to checkpoint now (a grow's notice), remembering the request."""
    st, plan = ctx.status, ctx.plan
    st.grow = GrowRequest(
        requested_at=ctx.now, target_size=decision.target, after_step=newest_committed_step(st)
    )
    for pod in live_pods(current):
        node = (pod.get("spec") or {}).get("nodeName") or ""
        taint = {"key": elastic.GROW_REASON}
        plan.notices.append(
            NoticeWrite(
                pod=pod["metadata"].get("name", ""),
                payload=notice_payload(taint, node, ctx.now),
            )
        )
    plan.event("Normal", "GrowRequested", f"attempt {st.attempt}: {decision.message}")
    plan.requeue(elastic.POLL_SECONDS)


def _restart_larger(
    ctx: ReconcileContext,
    current: Mapping[int, dict[str, Any]],
    decision: elastic.GrowDecision,
    joining: list[str] | None = None,
) -> None:
    """End the attempt and start the next one larger (the grow's checkpoint is committed, or
    none is needed): the running pods are kept and train on until the new pods are warm
    (survivors.py); ``joining``: warm standby pods that take the next places (restore.py)."""
    st, plan = ctx.status, ctx.plan
    last, lost = committed_and_lost(st)
    kept = survivors.all_running(ctx, current) + list(joining or [])
    if kept:
        lost = 0  # they train on until the new pods are warm, then save (survivors.py)
    record_interruption(
        ctx,
        Interruption(
            time=ctx.now,
            attempt=st.attempt,
            cause=Cause.GROW,
            preemption=False,
            message=decision.message,
            last_committed_step=last,
            steps_lost=lost,
        ),
    )
    for pod in live_pods(current):
        if pod["metadata"].get("name") not in kept:
            plan.deletions.append(pod_deletion(pod, f"growing to {decision.target} pods"))
    plan.event("Normal", "Growing", f"attempt {st.attempt}: {decision.message}")
    next_attempt(ctx, 0.0, "Growing", decision.message)
    survivors.keep(
        ctx,
        kept,
        f"adds pods to grow to {decision.target}; they train on until the new pods are warm",
        warm_join=True,
    )
