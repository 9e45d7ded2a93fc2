"""The job state machine: from what is observed now to the plan of what to do. No side effects.

Level-triggered: every call looks at the whole job (its status, every pod it owns, the nodes of
the current attempt) and decides from scratch, so a missed or repeated event, or an operator that
restarts halfway through a resubmission, converges to the same result. The status it returns is
the record of truth and is written before anything else; in particular the next attempt's number
is persisted before its pods are created, and ``gangCreated`` only after all of them exist, so a
restarted operator finishes creating *that* attempt (409s for the pods that exist) rather than
starting another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from . import conditions as cond
from . import elastic, gang, names, support
from .api_types import Job
from .backoff import failure_delay
from .capacity import fitting_pods
from .classify import GangVerdict, Outcome, RankOutcome, Signals, classify_rank, gang_verdict
from .envvars import NOTICE_ANNOTATION
from .manifests import build_pod, checkpoint_root, owner_reference
from .nodes import NodeView
from .notice import notice_payload
from .plan_types import NoticeWrite, Plan, PodDeletion
from .progress import Report, highest_current_step, merge_checkpoints, pod_reports
from .resume import after_failure, resume_point
from .status_types import (
    MAX_INTERRUPTIONS,
    TERMINAL_PHASES,
    Cause,
    GrowRequest,
    Interruption,
    JobStatus,
    Phase,
)

KEEP_FINISHED_ATTEMPTS = 2
"""Ended pods of the last attempts are kept for ``kubectl logs``; older ones are deleted."""


def owned_by(pod: dict[str, Any], uid: str) -> bool:
    """Whether the job (this incarnation of the name) controls the pod."""
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid and ref.get("controller") for ref in refs)


def pod_attempt(pod: dict[str, Any]) -> int | None:
    """The attempt label of a pod."""
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(names.LABEL_ATTEMPT)
    return int(value) if value is not None and str(value).isdigit() else None


def pod_rank(pod: dict[str, Any]) -> int | None:
    """The rank label of a pod."""
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(names.LABEL_RANK)
    return int(value) if value is not None and str(value).isdigit() else None


def _deleting(pod: dict[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def _finished(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _deletion(pod: dict[str, Any], reason: str) -> PodDeletion:
    meta = pod.get("metadata") or {}
    return PodDeletion(name=meta.get("name", ""), uid=meta.get("uid"), reason=reason)


@dataclass
class _Context:
    job: Job
    status: JobStatus
    plan: Plan
    now: datetime
    owned: list[dict[str, Any]]
    nodes: Mapping[str, NodeView]
    departed: Mapping[str, dict[str, Any]]
    observed_support: support.Observed
    cluster_nodes: Sequence[NodeView] | None = None
    native_gang: bool = False

    @property
    def generation(self) -> int:
        return self.job.ref.generation

    @property
    def size(self) -> int:
        """Pods in the current attempt's gang."""
        return self.status.gang_size or self.job.spec.replicas

    def fit(self) -> int:
        """How many of the job's pods the cluster's nodes could take now (all of them when the
        caller passed no node list)."""
        if self.cluster_nodes is None:
            return self.job.spec.replicas
        return fitting_pods(
            self.cluster_nodes, self.job.raw_template.get("spec") or {}, self.job.spec.replicas
        )

    def phase(self, phase: Phase, reason: str, message: str) -> None:
        cond.set_phase(
            self.status,
            phase,
            reason=reason,
            message=message,
            now=self.now,
            generation=self.generation,
        )

    def current_pods(self) -> dict[int, dict[str, Any]]:
        found: dict[int, dict[str, Any]] = {}
        for pod in self.owned:
            rank = pod_rank(pod)
            if pod_attempt(pod) == self.status.attempt and rank is not None:
                found[rank] = pod
        return found


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
) -> Plan:
    """Decide what to do for one job.

    ``nodes`` holds a view of every node the pods run on. ``departed`` maps the names of pods
    that were deleted to their last state seen in the watch: a pod evicted and removed within
    milliseconds still tells *why* it went (its DisruptionTarget condition).
    ``observed_support`` holds the job's support objects by kind as read now (a kind that is
    absent or None does not exist). ``cluster_nodes`` holds every node of the cluster, for the
    capacity an elastic job sizes its gang by (None: assume room for the full gang).
    ``native_gang``: the API server serves the PodGroup API (gang.py).
    """
    plan = Plan()
    if job.ref.deleting:
        return plan  # ownerReferences let the garbage collector clean up
    ctx = _Context(
        job=job,
        status=job.status.model_copy(deep=True),
        plan=plan,
        now=now,
        owned=[p for p in pods if owned_by(p, job.ref.uid)],
        nodes=nodes,
        departed={n: p for n, p in (departed or {}).items() if owned_by(p, job.ref.uid)},
        observed_support=observed_support or {},
        cluster_nodes=cluster_nodes,
        native_gang=native_gang,
    )
    st = ctx.status
    if st.phase is None:
        st.run_name = job.run_name
        st.start_time = now
        st.attempt = 0
        st.resume_from = ""
        ctx.phase(Phase.PENDING, "Created", "creating the first gang")
    st.observed_generation = job.ref.generation
    _absorb_progress(ctx)

    if st.phase in TERMINAL_PHASES:
        _cleanup(ctx, keep_current=st.phase is Phase.SUCCEEDED)
    elif job.spec.suspend:
        _suspend(ctx)
    else:
        if st.phase is Phase.SUSPENDED:
            _unsuspend(ctx)
        if st.gang_created:
            _watch_gang(ctx)
        if st.phase not in TERMINAL_PHASES:
            ready = _ensure_support(ctx)
            if ready and not st.gang_created:
                _create_gang(ctx)
        _cleanup(ctx, keep_current=True)

    if st.model_dump(mode="json") != job.status.model_dump(mode="json"):
        plan.status = st
    return plan


def _absorb_progress(ctx: _Context) -> None:
    """Learn committed checkpoints from every pod of the job (old attempts' emergency saves too)."""
    st, spec = ctx.status, ctx.job.spec
    current_reports: list[Report] = []
    records = []
    for pod in ctx.owned:
        reports = pod_reports(pod, spec.container_name)
        attempt = pod_attempt(pod)
        records += [r.record(attempt) for r in reports]
        if attempt == st.attempt:
            current_reports += reports
    if not records:
        return
    st.known_checkpoints = merge_checkpoints(st.known_checkpoints, records)
    newest = max(records, key=lambda r: r.step)
    if st.last_committed_checkpoint is None or newest.step > st.last_committed_checkpoint.step:
        st.last_committed_checkpoint = newest
    if st.gang_created and current_reports:
        step = highest_current_step(current_reports)
        if step is not None and (st.current_step is None or step > st.current_step):
            st.current_step = step
        resumed = next((k for k in st.known_checkpoints if k.name == st.resume_checkpoint), None)
        fresh = [
            r
            for r in current_reports
            if r.checkpoint != st.resume_checkpoint and (resumed is None or r.step > resumed.step)
        ]
        if fresh:
            st.attempt_checkpoint = max(fresh, key=lambda r: r.step).checkpoint
            st.resume_failures = None  # progress past the resume point clears the suspicion


def _live(pods: Mapping[int, dict[str, Any]] | Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    values = pods.values() if isinstance(pods, Mapping) else pods
    return [p for p in values if not _deleting(p) and not _finished(p)]


def _cleanup(ctx: _Context, keep_current: bool) -> None:
    """Delete pods of older attempts (live ones always, ended ones past the kept attempts)."""
    st = ctx.status
    planned = {d.name for d in ctx.plan.deletions}
    for pod in ctx.owned:
        attempt = pod_attempt(pod)
        if _deleting(pod) or attempt is None or pod["metadata"].get("name") in planned:
            continue
        if attempt == st.attempt:
            if not keep_current and not _finished(pod):
                ctx.plan.deletions.append(_deletion(pod, "job ended"))
            continue
        old_enough = attempt < st.attempt - KEEP_FINISHED_ATTEMPTS
        if not _finished(pod) or old_enough:
            ctx.plan.deletions.append(_deletion(pod, f"attempt {attempt} is over"))


def _suspend(ctx: _Context) -> None:
    st, plan = ctx.status, ctx.plan
    if st.phase is not Phase.SUSPENDED:
        if st.gang_created:
            _record(
                ctx,
                Interruption(
                    time=ctx.now,
                    attempt=st.attempt,
                    cause=Cause.SUSPENDED,
                    preemption=False,
                    message="spec.suspend set",
                    last_committed_step=_last_step(st),
                ),
            )
        ctx.phase(Phase.SUSPENDED, "Suspended", "spec.suspend is true; the gang is deleted")
        plan.event("Normal", "Suspended", f"attempt {st.attempt}: deleting the gang")
    for pod in _live(ctx.owned):
        plan.deletions.append(_deletion(pod, "job suspended"))


def _unsuspend(ctx: _Context) -> None:
    st = ctx.status
    ctx.plan.event("Normal", "Resumed", "spec.suspend cleared")
    if st.gang_created:
        _next_attempt(ctx, 0.0, "Resumed", "resuming after suspend")
    else:
        ctx.phase(
            Phase.PENDING if st.attempt == 0 else Phase.RESTARTING,
            "Resumed",
            "spec.suspend cleared",
        )


def _signals(job: Job) -> Signals:
    ps = job.spec.preemption_signals
    return Signals(
        termination_taints=ps.termination_taints,
        node_not_ready_seconds=ps.node_not_ready_seconds,
        container_name=job.spec.container_name,
    )


def _watch_gang(ctx: _Context) -> None:
    """Classify the current attempt's ranks and act on the gang's verdict."""
    st, plan, job = ctx.status, ctx.plan, ctx.job
    current = ctx.current_pods()
    signals = _signals(job)
    outcomes: list[RankOutcome] = []
    for rank in range(ctx.size):
        expected = names.pod_name(job.ref.name, st.attempt, rank)
        pod = current.get(rank) or _as_deleted(ctx.departed.get(expected))
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
    _deliver_notices(ctx, outcomes, current)
    verdict = gang_verdict(outcomes)
    if verdict.outcome is Outcome.PREEMPTED:
        _interrupted(ctx, verdict, current, preemption=True)
    elif verdict.outcome is Outcome.FAILED:
        _interrupted(ctx, verdict, current, preemption=False)
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
        _report_scheduling(ctx, current)
        plan.requeue(verdict.recheck_after)
        if job.spec.elastic is not None and not _reshrink(ctx, current):
            _watch_for_grow(ctx, verdict.all_running, current)


def _unschedulable(pod: dict[str, Any]) -> str | None:
    """The scheduler's message when it could not place the pod."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return str(condition.get("message") or "unschedulable")
    return None


def _report_scheduling(ctx: _Context, current: Mapping[int, dict[str, Any]]) -> None:
    """PodsScheduled=False with the scheduler's reason while a rank cannot be placed, so a gang
    that waits for capacity says why instead of showing Pending or Restarting alone."""
    stuck = [
        (rank, pod, message)
        for rank, pod in sorted(current.items())
        if not _deleting(pod) and (message := _unschedulable(pod)) is not None
    ]
    had = cond.condition(ctx.status, cond.PODS_SCHEDULED)
    if stuck:
        # Under a gang, most ranks only say they wait for the others; show one that says why.
        rank, pod, message = next(
            (entry for entry in stuck if "nodes are available" in entry[2]), stuck[0]
        )
        cond.set_condition(
            ctx.status,
            cond.PODS_SCHEDULED,
            False,
            reason="Unschedulable",
            message=f"{len(stuck)} of {ctx.size} ranks cannot be scheduled{_gang_note(ctx)}; "
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


def _gang_note(ctx: _Context) -> str:
    """How the gang is held back, for the PodsScheduled message."""
    st = ctx.status
    if st.gang_scheduling == gang.Mechanism.POD_GROUP:
        return (
            f" (all-or-nothing: PodGroup {gang.group_name(ctx.job.ref.name, st.attempt)} binds "
            f"no pod until all {ctx.size} fit)"
        )
    if st.gang_scheduling == gang.Mechanism.KUEUE:
        return f" (Kueue pod group, queue {ctx.job.spec.queue_name})"
    return ""


def _as_deleted(pod: dict[str, Any] | None) -> dict[str, Any] | None:
    """A departed pod's last state, marked as deleted if the watch caught it before that."""
    if pod is None:
        return None
    meta = dict(pod.get("metadata") or {})
    meta.setdefault("deletionTimestamp", "departed")
    return {**pod, "metadata": meta}


def _deliver_notices(
    ctx: _Context, outcomes: list[RankOutcome], current: Mapping[int, dict[str, Any]]
) -> None:
    """Write the notice into every running rank whose node has a termination taint."""
    noticed = []
    for outcome in outcomes:
        pod = current.get(outcome.rank)
        if pod is None or outcome.outcome is not Outcome.ACTIVE or outcome.notice is None:
            continue
        noticed.append(outcome)
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if annotations.get(NOTICE_ANNOTATION) and elastic.GROW_REASON not in str(
            annotations.get(NOTICE_ANNOTATION)
        ):
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


def _last_step(st: JobStatus) -> int | None:
    return st.last_committed_checkpoint.step if st.last_committed_checkpoint else None


def _record(ctx: _Context, interruption: Interruption) -> None:
    st = ctx.status
    st.interruptions = [*st.interruptions, interruption][-MAX_INTERRUPTIONS:]
    ctx.plan.interruption = interruption


def _interrupted(
    ctx: _Context, verdict: GangVerdict, current: Mapping[int, dict[str, Any]], preemption: bool
) -> None:
    """An attempt ended early: record it, stop the rest of its gang, start the next one."""
    st, plan, policy = ctx.status, ctx.plan, ctx.job.spec.resume_policy
    trigger = verdict.trigger
    assert trigger is not None
    last = _last_step(st)
    lost = None
    if st.current_step is not None and last is not None:
        lost = max(st.current_step - last, 0)
    _record(
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
            message=trigger.message,
            last_committed_step=last,
            steps_lost=lost,
        ),
    )
    for pod in _live(current):
        plan.deletions.append(_deletion(pod, f"attempt {st.attempt} was interrupted"))
    where = f"rank {trigger.rank} (pod {trigger.pod}" + (
        f" on node {trigger.node})" if trigger.node else ")"
    )
    if preemption:
        st.preemptions += 1
        plan.event(
            "Warning",
            "Preempted",
            f"attempt {st.attempt}: {where}: {trigger.cause}: {trigger.message}",
        )
        if policy.max_preemptions is not None and st.preemptions > policy.max_preemptions:
            _fail(
                ctx,
                "PreemptionLimitExceeded",
                f"{st.preemptions} preemptions exceed maxPreemptions={policy.max_preemptions}",
            )
            return
        _next_attempt(ctx, 0.0, "Preempted", f"{trigger.cause} of {where}")
        return

    st.failures += 1
    plan.event("Warning", "RankFailed", f"attempt {st.attempt}: {where}: {trigger.message}")
    decision = after_failure(
        policy,
        resumed_from=st.resume_checkpoint,
        committed_this_attempt=st.attempt_checkpoint,
        attempt_started=st.attempt_start_time,
        failed_at=ctx.now,
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
        _fail(
            ctx,
            "BackoffLimitExceeded",
            f"{st.failures} failures exceed backoffLimit={policy.backoff_limit}; "
            f"last: {where}: {trigger.message}",
        )
        return
    delay = failure_delay(st.failures, policy.backoff_base_seconds, policy.backoff_max_seconds)
    _next_attempt(ctx, delay, "Failed", f"{where}: {trigger.message}")


def _fail(ctx: _Context, reason: str, message: str) -> None:
    st = ctx.status
    st.completion_time = ctx.now
    st.restart_after = None
    ctx.phase(Phase.FAILED, reason, message)
    ctx.plan.event("Warning", "JobFailed", f"{reason}: {message}")
    for pod in _live(ctx.current_pods()):
        ctx.plan.deletions.append(_deletion(pod, "job failed"))


def _next_attempt(ctx: _Context, delay: float, reason: str, message: str) -> None:
    """Advance to the next attempt (persisted before its pods exist)."""
    st, job = ctx.status, ctx.job
    st.attempt += 1
    st.gang_created = False
    st.attempt_start_time = None
    st.attempt_checkpoint = None
    st.current_step = None
    st.gang_size = None
    st.grow = None
    point = resume_point(
        st.attempt,
        job.spec.checkpoint.dir,
        job.run_name,
        st.known_checkpoints,
        st.quarantined_checkpoints,
    )
    st.resume_from, st.resume_checkpoint = point.uri, point.checkpoint
    if delay > 0:
        st.restart_after = ctx.now + timedelta(seconds=delay)
        ctx.plan.event(
            "Normal",
            "BackingOff",
            f"attempt {st.attempt} starts in {delay:.0f}s (failure {st.failures})",
        )
    else:
        st.restart_after = None
    ctx.phase(Phase.RESTARTING, reason, f"attempt {st.attempt} after {message}")


BLOCKED_RECHECK_SECONDS = 10.0
"""How often a job blocked by a foreign object looks again (its deletion sends no event)."""


def _ensure_support(ctx: _Context) -> bool:
    """Plan the writes that bring the support objects to the current attempt's desired state;
    whether the gang may be created (no name is taken by an object the job does not own)."""
    st, job = ctx.status, ctx.job
    decision = support.decide(job, st.attempt, ctx.observed_support)
    ctx.plan.support = decision.writes
    had = cond.condition(st, cond.BLOCKED)
    if decision.conflicts:
        message = support.conflict_message(job, decision.conflicts)
        if had is None or had.status != "True" or had.message != message:
            ctx.plan.event("Warning", "NameConflict", message)
        cond.set_condition(
            st,
            cond.BLOCKED,
            True,
            reason="NameConflict",
            message=message,
            now=ctx.now,
            generation=ctx.generation,
        )
        ctx.plan.requeue(BLOCKED_RECHECK_SECONDS)
        return False
    if had is not None and had.status == "True":
        cond.set_condition(
            st,
            cond.BLOCKED,
            False,
            reason="NamesAvailable",
            message="every support object is controlled by this job",
            now=ctx.now,
            generation=ctx.generation,
        )
    return True


def _create_gang(ctx: _Context) -> None:
    """Create the current attempt's missing pods (after its backoff, if any)."""
    st, plan, job = ctx.status, ctx.plan, ctx.job
    if st.restart_after is not None and ctx.now < st.restart_after:
        plan.requeue((st.restart_after - ctx.now).total_seconds())
        return
    st.restart_after = None
    if st.resume_from is None:
        st.resume_from = ""
    existing = ctx.current_pods()
    if st.gang_size is None and not _choose_size(ctx):
        return
    mechanism = gang.choose(job, ctx.native_gang)
    st.gang_scheduling = mechanism.value
    plan.creations = [
        gang.link_pod(
            build_pod(
                job,
                st.attempt,
                rank,
                size=ctx.size,
                resume_from=st.resume_from,
                quarantined=list(st.quarantined_checkpoints),
            ),
            job,
            st.attempt,
            ctx.size,
            mechanism,
        )
        for rank in range(ctx.size)
        if rank not in existing
    ]
    if mechanism is gang.Mechanism.POD_GROUP and plan.creations:
        plan.pod_group = gang.pod_group(job, st.attempt, ctx.size, owner_reference(job))
    created = st.model_copy(deep=True)
    created.gang_created = True
    created.attempt_start_time = ctx.now
    plan.after_creation = created
    if st.attempt > 0 and st.interruptions:
        last = st.interruptions[-1]
        plan.resubmission = (
            "preemption"
            if last.preemption
            else "failure"
            if last.cause is Cause.FAILURE
            else "grow"
            if last.cause is Cause.GROW
            else "reshrink"
            if last.cause is Cause.UNSCHEDULABLE
            else "resume"
        )
    if not plan.creations:
        return  # all exist (an operator restart mid-creation): only the mark is missing
    source = st.resume_from or "scratch"
    if st.resume_from and st.resume_checkpoint is None:
        source = f"the newest valid checkpoint under {checkpoint_root(job)}"
    plan.event(
        "Normal",
        "Resubmitted" if st.attempt else "Started",
        f"attempt {st.attempt}: creating {ctx.size} pods, resuming from {source}"
        + (
            f" (quarantined: {','.join(st.quarantined_checkpoints)})"
            if st.quarantined_checkpoints
            else ""
        ),
        with_creation=True,
    )


def _grown_from(st: JobStatus) -> int | None:
    """The size of the gang a grow just ended (the next attempt starts larger at once)."""
    last = st.interruptions[-1] if st.interruptions else None
    if last is None or last.cause is not Cause.GROW or last.attempt != st.attempt - 1:
        return None
    return st.size_history[-1].size if st.size_history else None


def _choose_size(ctx: _Context) -> bool:
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
    capacity = cond.condition(st, cond.CAPACITY)
    if decision.size is None:
        if st.capacity_wait_since is None:
            st.capacity_wait_since = ctx.now
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
    st.capacity_wait_since = None
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
    previous = st.size_history[-1].size if st.size_history else None
    last = st.interruptions[-1] if st.interruptions else None
    lost = 0 if grown_from is not None else (last.steps_lost if last else None)
    reason = decision.reason.value
    if previous is not None and decision.size == job.spec.replicas and previous < decision.size:
        reason = elastic.StartReason.GROWN.value if grown_from else "Restored"
    changed = elastic.record_size(
        st,
        size=decision.size,
        world_size=st.world_size,
        reason=reason,
        message=decision.message,
        now=ctx.now,
        steps_lost=lost if previous is not None else None,
    )
    if changed and previous is not None:
        verb = "Shrunk" if decision.size < previous else "Grown"
        ctx.plan.event(
            "Warning" if verb == "Shrunk" else "Normal",
            verb,
            f"attempt {st.attempt}: {previous} -> {decision.size} pods (world size "
            f"{st.world_size}): {decision.message}",
        )
    return True


def _reshrink(ctx: _Context, current: Mapping[int, dict[str, Any]]) -> bool:
    """End a gang whose pods were not all scheduled within the wait and resubmit it at the
    smaller size that fits (elastic.reshrink_step); whether it did."""
    st, plan, job = ctx.status, ctx.plan, ctx.job
    live = _live(current)
    scheduled = sum(1 for p in live if (p.get("spec") or {}).get("nodeName"))
    # Pods of an earlier attempt still hold their nodes until they are gone: the wait starts
    # once they are, so a gang is never shrunk for room its own predecessor still occupies.
    lingering = any(pod_attempt(p) != st.attempt and not _finished(p) for p in ctx.owned)
    minimum = job.spec.elastic.min_replicas if job.spec.elastic is not None else ctx.size
    if ctx.size <= minimum or scheduled >= ctx.size or lingering:
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
    previous = ctx.size
    _record(
        ctx,
        Interruption(
            time=ctx.now,
            attempt=st.attempt,
            cause=Cause.UNSCHEDULABLE,
            preemption=False,
            message=decision.message,
            last_committed_step=_last_step(st),
            steps_lost=0,
        ),
    )
    for pod in live:
        plan.deletions.append(_deletion(pod, f"shrinking to {decision.size} pods"))
    _next_attempt(ctx, 0.0, "Reshrinking", decision.message)
    st.capacity_wait_since = None
    # The size is decided here, from what could be scheduled, not again from the capacity count
    # that was just proven too high.
    st.gang_size = decision.size
    st.world_size = decision.size * job.spec.processes_per_pod
    cond.set_condition(
        st,
        cond.CAPACITY,
        True,
        reason=elastic.StartReason.SHRUNK,
        message=decision.message,
        now=ctx.now,
        generation=ctx.generation,
    )
    elastic.record_size(
        st,
        size=decision.size,
        world_size=st.world_size,
        reason=elastic.StartReason.SHRUNK.value,
        message=decision.message,
        now=ctx.now,
        steps_lost=0,
    )
    plan.event(
        "Warning",
        "Shrunk",
        f"attempt {st.attempt}: {previous} -> {decision.size} pods (world size "
        f"{st.world_size}): {decision.message}",
    )
    return True


def _committed_step_of_attempt(st: JobStatus) -> int | None:
    last = st.last_committed_checkpoint
    return last.step if last is not None and last.attempt == st.attempt else None


def _watch_for_grow(
    ctx: _Context, all_running: bool, current: Mapping[int, dict[str, Any]]
) -> None:
    """Grow a gang below full size: notice, wait for the commit, then resubmit larger."""
    st, plan, job = ctx.status, ctx.plan, ctx.job
    if ctx.size >= job.spec.replicas and st.grow is None:
        return
    decision = elastic.grow_step(
        job.spec,
        size=ctx.size,
        fit=ctx.fit(),
        all_running=all_running,
        last_resize=elastic.last_resize_time(st),
        request=st.grow,
        committed_step=_committed_step_of_attempt(st),
        now=ctx.now,
    )
    plan.requeue(decision.recheck_after)
    if decision.action is elastic.GrowAction.REQUEST:
        st.grow = GrowRequest(
            requested_at=ctx.now, target_size=decision.target, after_step=_last_step(st)
        )
        for pod in _live(current):
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
    elif decision.action is elastic.GrowAction.ABANDON:
        st.grow = None
        plan.event("Warning", "GrowAbandoned", f"attempt {st.attempt}: {decision.message}")
    elif decision.action is elastic.GrowAction.RESTART:
        last = _last_step(st)
        lost = max(st.current_step - last, 0) if st.current_step is not None and last else None
        _record(
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
        for pod in _live(current):
            plan.deletions.append(_deletion(pod, f"growing to {decision.target} pods"))
        plan.event("Normal", "Growing", f"attempt {st.attempt}: {decision.message}")
        _next_attempt(ctx, 0.0, "Growing", decision.message)
