"""The plan that creates an attempt's gang: support objects first, then the pods.

The support objects (ServiceAccount, Role, RoleBinding, headless Service) must be the job's own
before any pod exists; then the size is chosen (sizing.py), and the pods are planned joined to
the gang as the attempt's mechanism does it (PodGroup, Kueue labels or nothing:
gang_mechanisms.py). ``gangCreated`` is marked only after every pod exists, so an operator
restarted mid-creation finishes this attempt instead of starting another.
"""

from __future__ import annotations

from typing import Any

from ..api.spec_types import ExitCodeAction
from ..api.status_types import Cause, Interruption, JobStatus
from . import conditions as cond
from . import gang, gang_mechanisms, support, survivors
from .manifests import build_pod, checkpoint_root, owner_reference
from .reconcile_context import ReconcileContext
from .sizing import choose_size
from .transitions import choose_resume_point

BLOCKED_RECHECK_SECONDS = 10.0
"""How often a job blocked by a foreign object looks again (its deletion sends no event)."""


def ensure_support(ctx: ReconcileContext) -> bool:
    """Plan the writes that bring the support objects to the current attempt's desired state;
    whether the gang may be created (no name it needs, support object or pod of the attempt
    still to create, is taken by an object the job does not own)."""
    st, job = ctx.status, ctx.job
    decision = support.decide(job, st.attempt, ctx.observed_support, st.kept_pods)
    ctx.plan.support = decision.writes
    conflicts = list(decision.conflicts)
    if not st.gang_created:
        conflicts += support.taken_pod_names(job, st.attempt, ctx.size, ctx.foreign)
        mechanism = gang_mechanisms.choose(job, ctx.native_gang, ctx.kueue)
        conflicts += mechanism.taken_names(job, ctx.observed_support)
    had = cond.condition(st, cond.BLOCKED)
    if conflicts:
        message = support.conflict_message(job, conflicts)
        if had is None or had.status != "True" or had.message != message:
            ctx.plan.event("Warning", cond.NAME_CONFLICT, message)
        cond.set_condition(
            st,
            cond.BLOCKED,
            True,
            reason=cond.NAME_CONFLICT,
            message=message,
            now=ctx.now,
            generation=ctx.generation,
        )
        ctx.plan.requeue(BLOCKED_RECHECK_SECONDS)
        return False
    if had is not None and had.status == "True" and had.reason == cond.NAME_CONFLICT:
        cond.set_condition(
            st,
            cond.BLOCKED,
            False,
            reason="NamesAvailable",
            message="every name the job needs is free or its own",
            now=ctx.now,
            generation=ctx.generation,
        )
    return True


def create_gang(ctx: ReconcileContext) -> None:
    """Create the current attempt's missing pods (after its backoff, if any)."""
    st, plan, job = ctx.status, ctx.plan, ctx.job
    if st.restart_after is not None and ctx.now < st.restart_after:
        plan.requeue((st.restart_after - ctx.now).total_seconds())
        return
    st.restart_after = None
    existing = ctx.current_pods()
    if not existing:
        # Every rank of a gang must be told the same checkpoint: it is chosen again only
        # before the first pod exists (status, written first, keeps it for the rest).
        choose_resume_point(ctx)
    elif st.resume_from is None:
        st.resume_from = ""
    if st.gang_size is None and not choose_size(ctx):
        return
    # Mid-creation (an operator restart), the pods that exist decide: one gang, one mechanism.
    mechanism = (
        gang_mechanisms.of_pod(next(iter(existing.values())))
        if existing
        else gang_mechanisms.choose(job, ctx.native_gang, ctx.kueue)
    )
    st.gang_scheduling = mechanism.name.value
    survivors.adopt(ctx, mechanism, existing)
    kept = len(st.kept_pods)
    if job.spec.queue_name and not mechanism.queued and not existing:
        plan.event(
            "Warning",
            "QueueNotServed",
            f"spec.queueName {job.spec.queue_name}: the cluster does not serve Kueue's API "
            f"({gang.KUEUE_GROUP}), so no queue admits attempt {st.attempt}; it is scheduled "
            f"with gangScheduling {mechanism.name.value} instead",
        )
    plan.creations = [
        mechanism.link_pod(_rank_pod(ctx, rank), job, st.attempt, ctx.size)
        for rank in range(kept, ctx.size)
        if rank not in existing
    ]
    if plan.creations:
        # kept pods are bound already: the group holds the new ones, placed all or none
        size = len(plan.creations) if st.kept_pods else ctx.size
        group = mechanism.group(job, st.attempt, size, owner_reference(job))
        if group is not None:
            plan.pod_group = group
    plan.after_creation = _created_status(ctx)
    if st.attempt > 0 and st.interruptions:
        plan.resubmission = _resubmission_kind(st.interruptions[-1])
    if not plan.creations and not plan.memberships:
        return  # all exist (an operator restart mid-creation): only the mark is missing
    _announce_creation(ctx, kept)


def _rank_pod(ctx: ReconcileContext, rank: int) -> dict[str, Any]:
    """The pod of ``rank`` in the attempt being created, before it joins the gang."""
    st = ctx.status
    return build_pod(
        ctx.job,
        st.attempt,
        rank,
        size=ctx.size,
        resume_from=st.resume_from,
        quarantined=list(st.quarantined_checkpoints),
        master_addr=survivors.master_addr(ctx),
        status=st,  # the interruption this pass saw counts in the MTBI already
        standby=st.membership_pending_since is not None,
        joins_kept=bool(st.kept_pods),
    )


def _created_status(ctx: ReconcileContext) -> JobStatus:
    """The status written once every pod exists: the gang marked created, the attempt's start
    time, and a ``Blocked`` condition that said pods were refused cleared."""
    created = ctx.status.model_copy(deep=True)
    created.gang_created = True
    refused = cond.condition(created, cond.BLOCKED)
    if (
        refused is not None
        and refused.status == "True"
        and refused.reason == cond.POD_CREATION_REFUSED
    ):
        cond.set_condition(
            created,
            cond.BLOCKED,
            False,
            reason="PodsCreated",
            message=f"every pod of attempt {created.attempt} was created",
            now=ctx.now,
            generation=ctx.generation,
        )
    created.attempt_start_time = ctx.now
    return created


def _resubmission_kind(last: Interruption) -> str:
    """The ``rtj_resubmissions_total`` kind of a gang resubmitted after ``last``."""
    return (
        "preemption"
        if last.preemption
        else "retry"
        if last.action is ExitCodeAction.RETRY
        else "failure"
        if last.cause is Cause.FAILURE
        else "grow"
        if last.cause is Cause.GROW
        else "reshrink"
        if last.cause is Cause.UNSCHEDULABLE
        else "resume"
    )


def _announce_creation(ctx: ReconcileContext, kept: int) -> None:
    """The Started or Resubmitted event: how many pods, how many kept, resuming from what."""
    st, plan, job = ctx.status, ctx.plan, ctx.job
    source = st.resume_from or "scratch"
    if st.resume_from and st.resume_checkpoint is None:
        source = f"the newest valid checkpoint under {checkpoint_root(job)}"
    plan.event(
        "Normal",
        "Resubmitted" if st.attempt else "Started",
        f"attempt {st.attempt}: creating {len(plan.creations)} pods"
        + (f", keeping {kept}" if kept else "")
        + f", resuming from {source}"
        + (
            f" (quarantined: {','.join(st.quarantined_checkpoints)})"
            if st.quarantined_checkpoints
            else ""
        ),
        with_creation=True,
    )
