"""The job state machine: from what is observed now to the plan of what to do. No side effects.

Level-triggered: every call looks at the whole job (its status, every pod it owns, the nodes of
the current attempt) and decides from scratch, so a missed or repeated event, or an operator that
restarts halfway through a resubmission, converges to the same result. The status it returns is
the record of truth and is written before anything else; in particular the next attempt's number
is persisted before its pods are created, and ``gangCreated`` only after all of them exist, so a
restarted operator finishes creating *that* attempt (409s for the pods that exist) rather than
starting another.

The steps live in modules with one job each: ``gang_create`` (support objects, size, pods),
``gang_watch`` (classify the ranks, act on the verdict), ``sizing`` (elastic sizes: start size,
re-shrink, grow), ``transitions`` (interruptions, budgets, the next attempt), ``goodput`` (what
spot cost the job). This module only learns progress, orders the steps and cleans up old
attempts' pods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ..api.api_types import Job
from ..api.status_types import TERMINAL_PHASES, Phase
from . import goodput, job_progress, leave, spares, support
from .gang_create import create_gang, ensure_support
from .gang_watch import watch_gang
from .invalid_spec import parses_again
from .nodes import NodeView
from .plan_types import Plan
from .podstate import is_deleting, is_finished, pod_attempt, pod_deletion
from .progress import (
    Report,
    comparable_step,
    highest_current_step,
    merge_checkpoints,
    pod_reports,
    progress_order,
    settle_continued,
    settle_losses,
    trained_since_resume,
)
from .reconcile_context import ReconcileContext
from .transitions import committed_and_lost, suspend, unsuspend

KEEP_FINISHED_ATTEMPTS = 2
"""Ended pods of the last attempts are kept for ``kubectl logs``; older ones are deleted."""


def reconcile(
    job: Job,
    pods: Sequence[dict[str, Any]],
    nodes: Mapping[str, NodeView],
    now: datetime,
    *,
    departed: Mapping[str, dict[str, Any]] | None = None,
    observed_support: support.Observed | None = None,
    cluster_nodes: Sequence[NodeView] | None = None,
    native_gang: bool = False,
    kueue: bool = False,
) -> Plan:
    """Decide what to do for one job.

    ``nodes`` holds a view of every node the pods run on. ``departed`` maps the names of pods
    that were deleted to their last state seen in the watch: a pod evicted and removed within
    milliseconds still tells *why* it went (its DisruptionTarget condition).
    ``observed_support`` holds the job's support objects by kind as read now (a kind that is
    absent or None does not exist). ``cluster_nodes`` holds every node of the cluster, for the
    capacity an elastic job sizes its gang by (None: assume room for the full gang).
    ``native_gang``: the API server serves the PodGroup API; ``kueue``: it serves Kueue's
    (gang.py).
    """
    plan = Plan()
    if job.ref.deleting:
        return plan  # ownerReferences let the garbage collector clean up
    uid = job.ref.uid
    ctx = ReconcileContext(
        job=job,
        status=job.status.model_copy(deep=True),
        plan=plan,
        now=now,
        owned=[p for p in pods if support.controlled_by(p, uid)],
        foreign=[p for p in pods if not support.controlled_by(p, uid)],
        nodes=nodes,
        departed={n: p for n, p in (departed or {}).items() if support.controlled_by(p, uid)},
        observed_support=observed_support or {},
        cluster_nodes=cluster_nodes,
        native_gang=native_gang,
        kueue=kueue,
    )
    _observe(ctx)
    _run_steps(ctx)
    _close_accounts(ctx)
    if ctx.status.model_dump(mode="json") != job.status.model_dump(mode="json"):
        plan.status = ctx.status
    return plan


def _observe(ctx: ReconcileContext) -> None:
    """What every pass records first: a new job's first status, the generation seen, the
    goodput account opened, a spec that parses again, the progress the pods report."""
    st, job, now = ctx.status, ctx.job, ctx.now
    if st.phase is None:
        st.run_name = job.run_name
        st.start_time = now
        st.attempt = 0
        st.resume_from = ""
        if not job.spec.suspend:
            # A job created suspended goes straight to Suspended (below): its conditions say
            # why nothing runs, not that a first gang is being created.
            ctx.phase(Phase.PENDING, "Created", "creating the first gang")
    st.observed_generation = job.ref.generation
    goodput.open_account(st, now)
    parses_again(st, now=now, generation=job.ref.generation)
    _absorb_progress(ctx)
    st.steps_at_risk = committed_and_lost(st)[1]


def _run_steps(ctx: ReconcileContext) -> None:
    """The steps, in order: an ended job is cleaned up; a suspended one suspends; else the gang
    is watched, its support objects kept, the gang created when missing, old pods cleaned up."""
    st, job = ctx.status, ctx.job
    if st.phase in TERMINAL_PHASES:
        _cleanup(ctx, keep_current=False)
    elif job.spec.suspend:
        suspend(ctx)
    else:
        if st.phase is Phase.SUSPENDED:
            unsuspend(ctx)
        if st.gang_created:
            watch_gang(ctx)
        if st.phase not in TERMINAL_PHASES:
            ready = ensure_support(ctx)
            if ready and not st.gang_created:
                create_gang(ctx)
        _cleanup(ctx, keep_current=st.phase not in TERMINAL_PHASES)
    if st.phase in TERMINAL_PHASES or job.spec.suspend:
        spares.release(ctx, "the job ended" if st.phase in TERMINAL_PHASES else "suspended")


def _close_accounts(ctx: ReconcileContext) -> None:
    """The goodput account and the job's progress, up to now; the status written once the
    gang exists carries the same."""
    st, plan, job, now = ctx.status, ctx.plan, ctx.job, ctx.now
    goodput.account(st, job.status, replicas=job.spec.replicas, now=now)
    job_progress.update(st, ctx.current_pods().get(0) if st.gang_created else None, now=now)
    if plan.after_creation is not None and st.goodput is not None:
        # Written after the pods exist, over the status above: it must carry the same account.
        plan.after_creation.goodput = st.goodput.model_copy(deep=True)
    if plan.after_creation is not None and st.progress is not None:
        plan.after_creation.progress = st.progress.model_copy(deep=True)


def _absorb_progress(ctx: ReconcileContext) -> None:
    """Learn committed checkpoints from every pod of the job (old attempts' emergency saves too),
    and when the current attempt's gang first trained past its resume point
    (``status.trainingSince``, which a grow waits for)."""
    st, spec = ctx.status, ctx.job.spec
    current_reports: list[Report] = []
    records = []
    for pod in ctx.owned:
        reports = pod_reports(pod, spec.container_name)
        attempt = pod_attempt(pod)
        records += [r.record(attempt) for r in reports]
        current_reports += [r for r in reports if r.of_attempt(attempt) == st.attempt]
    # Looked up before the merge below, which keeps only the newest few checkpoints.
    resumed = next((k for k in st.known_checkpoints if k.name == st.resume_checkpoint), None)
    if st.gang_created and st.training_since is None:
        current = [p for p in ctx.owned if pod_attempt(p) == st.attempt]
        if any(
            trained_since_resume(
                p, attempt=st.attempt, resume_checkpoint=st.resume_checkpoint, resumed=resumed
            )
            for p in current
        ):
            st.training_since = ctx.now
    if st.gang_created:
        current = (p for p in ctx.owned if pod_attempt(p) == st.attempt)
        step = comparable_step(
            highest_current_step(current, spec.container_name),
            st.last_committed_checkpoint,
            world_size=st.world_size,
            committed_here=bool(current_reports),
        )
        if step is not None and (st.current_step is None or step > st.current_step):
            st.current_step = step
        current = (p for p in ctx.owned if pod_attempt(p) == st.attempt)
        settle_continued(st.interruptions, st.size_history, current, st.attempt)
    if not records:
        return
    st.known_checkpoints = merge_checkpoints(st.known_checkpoints, records)
    settle_losses(st.interruptions, records, st.size_history)
    newest = max(records, key=progress_order)
    last = st.last_committed_checkpoint
    if last is None or progress_order(newest) > progress_order(last):
        st.last_committed_checkpoint = newest
    if st.gang_created and current_reports:
        fresh = [
            r
            for r in current_reports
            if r.checkpoint != st.resume_checkpoint
            and (resumed is None or progress_order(r) > progress_order(resumed))
        ]
        if fresh:
            st.attempt_checkpoint = max(fresh, key=progress_order).checkpoint
            st.resume_failures = None  # progress past the resume point clears the suspicion


def _cleanup(ctx: ReconcileContext, keep_current: bool) -> None:
    """Delete pods of older attempts (live ones always, ended ones past the kept attempts), and
    unless ``keep_current`` the current attempt's pods that still run.

    Once the job ended the current attempt's pods that ended are kept for their logs; one that
    still runs is deleted. After a success that is a pod whose training container exited 0 while
    a regular (non-init) sidecar container keeps it Running: it would hold its node for ever.
    (Native sidecars, init containers with ``restartPolicy: Always``, stop by themselves and
    their pod ends ``Succeeded``.)"""
    st = ctx.status
    # Pods this pass deletes already, or relabels (kept, or a standby pod made a spare: restore.py)
    planned = {d.name for d in ctx.plan.deletions} | {m.pod for m in ctx.plan.memberships}
    for pod in ctx.owned:
        attempt = pod_attempt(pod)
        if is_deleting(pod) or attempt is None or pod["metadata"].get("name") in planned:
            continue
        if pod["metadata"].get("name") in st.kept_pods:
            continue  # kept by the current attempt, relabelled into it at its creation
        if leave.waits(ctx, pod):
            continue  # its workers leave the gang at the next step boundary
        if attempt == st.attempt:
            if not keep_current and not is_finished(pod):
                ctx.plan.deletions.append(pod_deletion(pod, "job ended"))
            continue
        old_enough = attempt < st.attempt - KEEP_FINISHED_ATTEMPTS
        if not is_finished(pod) or old_enough:
            ctx.plan.deletions.append(pod_deletion(pod, f"attempt {attempt} is over"))
    leave.forget_when_gone(ctx)
