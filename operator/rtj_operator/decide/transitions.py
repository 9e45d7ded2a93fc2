"""Status bookkeeping when an attempt ends: the interruption record, the budgets, the next attempt.

Every way an attempt can end (preemption, failure, a failure an exit code rule retries or makes
fatal, suspend, a grow or re-shrink of an elastic gang)
goes through ``record_interruption`` and ``next_attempt`` here, so the history, the counters and
the resume point are kept by one set of rules. The next attempt's number and resume point are
persisted in status before its pods exist (reconcile.py explains why that order matters).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from ..api.spec_types import ExitCodeAction
from ..api.status_types import MAX_INTERRUPTIONS, Cause, Interruption, JobStatus, Phase
from ..api.timeutil import iso
from . import conditions as cond
from . import goodput, survivors
from .backoff import failure_delay
from .classify import GangVerdict, RankOutcome
from .exit_policy import ExitDecision, decide
from .podstate import live_pods, pod_deletion
from .reconcile_context import ReconcileContext
from .resume import after_failure, resume_point


def newest_committed_step(st: JobStatus) -> int | None:
    """The step of the newest committed checkpoint, if any."""
    return st.last_committed_checkpoint.step if st.last_committed_checkpoint else None


def committed_and_lost(st: JobStatus) -> tuple[int | None, int | None]:
    """The newest committed step, and the steps reported since it (None when either is
    unknown; a checkpoint at step 0 counts like any other)."""
    last = newest_committed_step(st)
    if st.current_step is None or last is None:
        return last, None
    return last, max(st.current_step - last, 0)


def record_interruption(ctx: ReconcileContext, interruption: Interruption) -> None:
    """Append to the bounded interruption history, tell the plan (metrics) and the goodput
    account (called before the ended gang is forgotten)."""
    st = ctx.status
    unplanned = interruption.preemption or interruption.action is not None
    goodput.note_interruption(st, ctx.now, unplanned=unplanned)
    st.interruptions = [*st.interruptions, interruption][-MAX_INTERRUPTIONS:]
    ctx.plan.interruption = interruption


def interrupted(
    ctx: ReconcileContext,
    verdict: GangVerdict,
    current: Mapping[int, dict[str, Any]],
    *,
    preemption: bool,
    keep: Sequence[str] = (),
    leaving: Sequence[str] = (),
) -> None:
    """An attempt ended early: record it, stop the rest of its gang, start the next one (a
    failure first goes through the job's exit code rules, exit_policy.py). ``keep``: pods of a
    preempted gang that the next attempt keeps (survivors.py), unless the job ends here;
    ``leaving``: pods not deleted either, which leave the gang in process (leave.py: no step
    is lost then)."""
    st, plan = ctx.status, ctx.plan
    trigger = verdict.trigger
    assert trigger is not None
    exit_decision = (
        None if preemption else decide(ctx.job.spec.resume_policy.exit_code_rules, trigger)
    )
    last, lost = committed_and_lost(st)
    if leaving:
        lost = 0  # every rank is alive: the kept ones train on from the step they reached
    record_interruption(
        ctx,
        Interruption(
            time=ctx.now,
            attempt=st.attempt,
            cause=trigger.cause or Cause.DISRUPTION,
            preemption=preemption,
            rank=trigger.rank,
            pod=trigger.pod,
            node=trigger.node,
            exit_code=trigger.exit_code,
            action=exit_decision.action if exit_decision else None,
            exit_code_rule=exit_decision.rule if exit_decision else None,
            message=trigger.message,
            last_committed_step=last,
            steps_lost=lost,
        ),
    )
    for pod in live_pods(current):
        if pod["metadata"].get("name") not in (*keep, *leaving):
            plan.deletions.append(pod_deletion(pod, f"attempt {st.attempt} was interrupted"))
    where = f"rank {trigger.rank} (pod {trigger.pod}" + (
        f" on node {trigger.node})" if trigger.node else ")"
    )
    if exit_decision is None:
        _preempted(ctx, trigger, where)
        why = "lets the pods on noticed nodes leave" if leaving else "replaces the lost ones"
        survivors.keep(ctx, keep, why)
    elif exit_decision.action is ExitCodeAction.RETRY:
        _retry(ctx, trigger, where, exit_decision)
    elif exit_decision.action is ExitCodeAction.FAIL_JOB:
        st.failures += 1
        what = f"{where}: {trigger.message} matches {exit_decision.describe()}"
        plan.event("Warning", "FatalExit", f"attempt {st.attempt}: {what}")
        fail_job(ctx, "ExitCodeFailJob", what)
    else:
        _failed(ctx, trigger, where, exit_decision)


def _preempted(ctx: ReconcileContext, trigger: RankOutcome, where: str) -> None:
    """A preemption: counted against maxPreemptions, the next attempt at once."""
    st, policy = ctx.status, ctx.job.spec.resume_policy
    st.preemptions += 1
    ctx.plan.event(
        "Warning",
        "Preempted",
        f"attempt {st.attempt}: {where}: {trigger.cause}: {trigger.message}",
    )
    if policy.max_preemptions is not None and st.preemptions > policy.max_preemptions:
        fail_job(
            ctx,
            "PreemptionLimitExceeded",
            f"{st.preemptions} preemptions exceed maxPreemptions={policy.max_preemptions}",
        )
        return
    next_attempt(ctx, 0.0, "Preempted", f"{trigger.cause} of {where}")


def _retry(ctx: ReconcileContext, trigger: RankOutcome, where: str, rule: ExitDecision) -> None:
    """A failure a Retry rule matched: counted against maxRetries with the failures' backoff
    (the retry count as its exponent), never against backoffLimit nor towards quarantine (the
    user called the error transient: the checkpoint is not to blame, and a quarantine count
    already started is left as it is)."""
    st, policy = ctx.status, ctx.job.spec.resume_policy
    st.retries += 1
    what = f"{where}: {trigger.message} matches {rule.describe()}"
    ctx.plan.event(
        "Warning",
        "RetryableExit",
        f"attempt {st.attempt}: {what}; retry {st.retries} (maxRetries={policy.max_retries})",
    )
    if st.retries > policy.max_retries:
        fail_job(
            ctx,
            "RetryLimitExceeded",
            f"{st.retries} retries exceed maxRetries={policy.max_retries}; last: {what}",
        )
        return
    delay = failure_delay(st.retries, policy.backoff_base_seconds, policy.backoff_max_seconds)
    next_attempt(ctx, delay, "Retrying", what, backing_off_for=f"retry {st.retries}")


def _failed(ctx: ReconcileContext, trigger: RankOutcome, where: str, rule: ExitDecision) -> None:
    """A failure (no rule, or a Count rule): backoffLimit, backoff and quarantine."""
    st, plan, policy = ctx.status, ctx.plan, ctx.job.spec.resume_policy
    st.failures += 1
    matched = f" (matches {rule.describe()})" if rule.rule is not None else ""
    plan.event(
        "Warning", "RankFailed", f"attempt {st.attempt}: {where}: {trigger.message}{matched}"
    )
    decision = after_failure(
        policy,
        resumed_from=st.resume_checkpoint,
        committed_this_attempt=st.attempt_checkpoint,
        attempt_started=st.attempt_start_time,
        # When the rank ended, not when the failure was counted (failureSettleSeconds, an
        # operator that was down): the window is about how soon after the resume it crashed.
        failed_at=min(trigger.finished_at or ctx.now, ctx.now),
        previous=st.resume_failures,
    )
    st.resume_failures = decision.resume_failures
    if decision.quarantine and decision.quarantine not in st.quarantined_checkpoints:
        st.quarantined_checkpoints = [*st.quarantined_checkpoints, decision.quarantine]
        st.quarantined = len(st.quarantined_checkpoints)
        plan.event(
            "Warning",
            "CheckpointQuarantined",
            f"checkpoint {decision.quarantine}: {policy.quarantine_threshold} attempts "
            "in a row failed soon after resuming from it; resuming from the one before",
        )
    if st.failures > policy.backoff_limit:
        fail_job(
            ctx,
            "BackoffLimitExceeded",
            f"{st.failures} failures exceed backoffLimit={policy.backoff_limit}; "
            f"last: {where}: {trigger.message}",
        )
        return
    delay = failure_delay(st.failures, policy.backoff_base_seconds, policy.backoff_max_seconds)
    next_attempt(ctx, delay, "Failed", f"{where}: {trigger.message}")


def fail_job(ctx: ReconcileContext, reason: str, message: str) -> None:
    """End the job Failed and stop its current gang."""
    st = ctx.status
    st.completion_time = ctx.now
    st.restart_after = None
    ctx.phase(Phase.FAILED, reason, message)
    ctx.plan.event("Warning", "JobFailed", f"{reason}: {message}")
    for pod in live_pods(ctx.current_pods()):
        ctx.plan.deletions.append(pod_deletion(pod, "job failed"))


def forget_gang(st: JobStatus) -> None:
    """Clear what described a gang that no longer exists: its size and world size and its
    all-or-nothing mechanism are chosen again before the next gang's pods exist, a grow asked
    of it (or a grow back to its size before a loss) is over, and the next gang has yet to
    train."""
    st.gang_size = None
    st.world_size = None
    st.gang_scheduling = None
    st.grow = None
    st.grow_room_since = None
    st.restore = None
    st.training_since = None


def choose_resume_point(ctx: ReconcileContext) -> None:
    """RTJ_RESUME_FROM of the current attempt: the newest known checkpoint that is not
    quarantined (else the run's root; empty for attempt 0). Chosen when the attempt begins and
    again right before its first pod is created, so a checkpoint committed meanwhile (the old
    gang's emergency save during a failure backoff or a wait for room) is the one named."""
    st, job = ctx.status, ctx.job
    point = resume_point(
        st.attempt,
        job.spec.checkpoint.dir,
        job.run_name,
        st.known_checkpoints,
        st.quarantined_checkpoints,
    )
    st.resume_from, st.resume_checkpoint = point.uri, point.checkpoint


def next_attempt(
    ctx: ReconcileContext,
    delay: float,
    reason: str,
    message: str,
    *,
    backing_off_for: str | None = None,
) -> None:
    """Advance to the next attempt (persisted before its pods exist); ``backing_off_for`` names
    what a delay follows (default: the failure count)."""
    st = ctx.status
    st.attempt += 1
    st.gang_created = False
    st.kept_pods = []
    st.membership_pending_since = None
    st.attempt_start_time = None
    st.attempt_checkpoint = None
    st.current_step = None
    forget_gang(st)
    st.capacity_wait_since = None  # a wait of the ended gang's pods is not the new attempt's
    cond.forget_scheduling(st)
    choose_resume_point(ctx)
    if delay > 0:
        st.restart_after = ctx.now + timedelta(seconds=delay)
        ctx.plan.event(
            "Normal",
            "BackingOff",
            f"attempt {st.attempt} starts in {delay:.0f}s "
            f"({backing_off_for or f'failure {st.failures}'})",
        )
    else:
        st.restart_after = None
    ctx.phase(Phase.RESTARTING, reason, f"attempt {st.attempt} after {message}")


def suspend(ctx: ReconcileContext) -> None:
    """spec.suspend: record the interruption once, delete every live pod."""
    st, plan = ctx.status, ctx.plan
    if st.phase is not Phase.SUSPENDED:
        if st.gang_created:
            record_interruption(
                ctx,
                Interruption(
                    time=ctx.now,
                    attempt=st.attempt,
                    cause=Cause.SUSPENDED,
                    preemption=False,
                    message="spec.suspend set",
                    last_committed_step=newest_committed_step(st),
                ),
            )
        # A suspended job waits for nothing: shrinkAfterSeconds counts again from the resume.
        st.capacity_wait_since = None
        message = _suspend_message(ctx)
        ctx.phase(Phase.SUSPENDED, "Suspended", f"spec.suspend is true; {message}")
        plan.event("Normal", "Suspended", f"attempt {st.attempt}: {message}")
        forget_gang(st)
    for pod in live_pods(ctx.owned):
        plan.deletions.append(pod_deletion(pod, "job suspended"))


def _suspend_message(ctx: ReconcileContext) -> str:
    """What a suspend does to the attempt: delete its pods, or, when none exists (a failure
    backoff, a wait for room), only keep the next attempt from starting."""
    st = ctx.status
    if live_pods(ctx.current_pods()):
        return "deleting the gang"
    if st.restart_after is not None and ctx.now < st.restart_after:
        last = st.interruptions[-1] if st.interruptions else None
        after = (
            f"retry {st.retries}"
            if last is not None and last.action is ExitCodeAction.RETRY
            else f"failure {st.failures}"
        )
        return (
            f"no gang exists (backing off after {after}); the attempt starts "
            f"once spec.suspend is cleared, not before {iso(st.restart_after)}"
        )
    return "no gang exists; the attempt starts once spec.suspend is cleared"


def unsuspend(ctx: ReconcileContext) -> None:
    """spec.suspend cleared: a created gang is resubmitted as the next attempt, and so is one
    suspended mid-creation whose pods still exist (they may still be terminating: their
    names taken for the new gang's would end it at once as a preemption)."""
    st = ctx.status
    ctx.plan.event("Normal", "Resumed", "spec.suspend cleared")
    if st.gang_created or ctx.current_pods():
        next_attempt(ctx, 0.0, "Resumed", "resuming after suspend")
    else:
        ctx.phase(
            Phase.PENDING if st.attempt == 0 else Phase.RESTARTING,
            "Resumed",
            "spec.suspend cleared",
        )
