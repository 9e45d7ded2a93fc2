"""The ResumableTrainingJob status: the operator's record of truth, generated into the CRD too.

Status is where the operator keeps everything it must not forget across its own restarts: the
attempt number (written *before* the next gang is created, so a restarted operator completes
that attempt instead of starting another), whether the attempt's pods were all created, the
counters, the checkpoints it learned of and the quarantine. Nothing lives only in memory.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, PlainSerializer

from .spec_types import ApiModel, ExitCodeAction
from .timeutil import iso

MAX_INTERRUPTIONS = 20
"""Bound of the interruption history kept in status (the oldest entries are dropped)."""
MAX_SIZE_HISTORY = 20
"""Bound of the gang-size history kept in status (the oldest entries are dropped)."""
MAX_KNOWN_CHECKPOINTS = 10
"""Bound of the committed checkpoints remembered for quarantine fallback."""
MAX_PROGRESS_POINTS = 40
"""Bound of the progress reports kept for the training rate (``progress.window``)."""


Time = Annotated[datetime, PlainSerializer(iso, return_type=str, when_used="json")]
"""A timestamp, serialised as RFC 3339 UTC with milliseconds."""


class Phase(StrEnum):
    """Lifecycle phase of a job."""

    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})


class Cause(StrEnum):
    """Why an attempt ended (the metrics' ``cause`` label and the history's ``cause``)."""

    NODE_DELETED = "NodeDeleted"
    NODE_NOT_READY = "NodeNotReady"
    NODE_SILENT = "NodeSilent"
    """A rank of the gang reported a failed collective (a peer gone) and the node's kubelet
    stopped renewing its Lease: taken as lost before the node controller marks it NotReady."""
    EVICTED = "Evicted"
    TAINT_EVICTION = "TaintEviction"
    SCHEDULER_PREEMPTION = "SchedulerPreemption"
    NODE_SHUTDOWN = "NodeShutdown"
    POD_GC = "PodGarbageCollected"
    DISRUPTION = "Disruption"
    POD_DELETED = "PodDeleted"
    POD_REMOVED = "PodRemoved"
    KUBELET_REJECTED = "KubeletRejected"
    TERMINATION_NOTICE = "TerminationNotice"
    FAILURE = "Failure"
    SUSPENDED = "Suspended"
    GROW = "Grow"
    """The operator ended the attempt itself, right after the checkpoint it asked for, to
    resubmit the gang at a larger size (neither a preemption nor a failure)."""
    KUEUE_EVICTION = "KueueEviction"
    """Kueue evicted the gang's Workload (its ``TerminationTarget`` on the pods): a workload of
    higher priority took its quota, or the quota it borrowed was reclaimed. A preemption."""
    UNSCHEDULABLE = "Unschedulable"
    """An elastic gang's pods were not all scheduled within ``shrinkAfterSeconds``: the operator
    ended the attempt itself to resubmit the gang smaller (neither a preemption nor a failure)."""


PREEMPTION_CAUSES = frozenset(Cause) - {
    Cause.FAILURE,
    Cause.SUSPENDED,
    Cause.GROW,
    Cause.UNSCHEDULABLE,
}


class CheckpointRecord(ApiModel):
    """A committed checkpoint as reported by the runtime."""

    name: str
    """Checkpoint folder name (for example ``ep3-ba1200``)."""
    uri: str | None = None
    """Full URI or path of the checkpoint folder."""
    step: int
    """Global step counter at the checkpoint."""
    epoch: int | None = None
    """Epoch counter at the checkpoint."""
    sample: int | None = None
    """Sample counter at the checkpoint."""
    time: str | None = None
    """Commit time as reported by the runtime (RFC 3339)."""
    attempt: int | None = None
    """Attempt whose gang committed it."""
    world_size: int | None = None
    """World size of the gang that saved it, as the runtime reported it."""


class Interruption(ApiModel):
    """One ended attempt."""

    time: Time
    """When the operator observed it."""
    attempt: int
    """The attempt that ended."""
    cause: Cause
    """Classified cause (docs/operator.md, Classification)."""
    preemption: bool
    """Whether it counted as a preemption (otherwise a failure, a suspend, or a Grow or
    Unschedulable restart of an elastic gang)."""
    rank: int | None = None
    """The first rank that showed the signal."""
    pod: str | None = None
    """That rank's pod."""
    node: str | None = None
    """That rank's node."""
    exit_code: int | None = None
    """Exit code of the training container, when it terminated."""
    action: ExitCodeAction | None = None
    """For a failure: what the operator did about it. Count (counted against backoffLimit),
    Retry (against maxRetries) or FailJob (the job failed at once), by ``exitCodeRule``, or
    Count when no rule matched. Absent for other interruptions."""
    exit_code_rule: int | None = None
    """Index in ``spec.resumePolicy.exitCodeRules`` of the rule that decided ``action``; absent
    when none matched."""
    message: str | None = None
    """Human-readable detail."""
    last_committed_step: int | None = None
    """Step of the last committed checkpoint at the time."""
    steps_lost: int | None = None
    """Highest step the gang reported minus the last committed step, less what the interrupted
    attempt committed after the interruption was seen (its save on SIGTERM, a kept pod's save of
    the last finished step)."""


class SizeRecord(ApiModel):
    """One stretch of the job at one gang size."""

    size: int
    """Pods in the gang."""
    world_size: int
    """Training processes: ``size * processesPerPod``."""
    reason: str
    """Why this size was chosen: Fixed (a job without ``elastic``), FullSize, Shrunk, Grown,
    Restored, or SurvivorsFirst (a loss's kept pods went on alone while the lost places' pods
    started in standby)."""
    message: str | None = None
    """Human-readable detail (the capacity that was found)."""
    attempt: int
    """First attempt that ran at this size."""
    start_time: Time
    """When the first gang at this size was created."""
    end_time: Time | None = None
    """When the next size took over (absent for the current size)."""
    seconds: float | None = None
    """Time spent at this size (set when it ends)."""
    steps_lost: int | None = None
    """Steps the transition into this size lost: the step the previous gang reached minus the
    last committed step it resumed from (0 for a grow, which follows a fresh commit), settled as
    the interruption's ``stepsLost`` is."""


class GrowRequest(ApiModel):
    """A grow in progress: the running gang was asked to checkpoint now."""

    requested_at: Time
    """When the notice was written into the gang's pods."""
    target_size: int
    """The size that fitted when the grow was asked for."""
    after_step: int | None = None
    """Last committed step at the request: the grow waits for a commit past it."""


class Restore(ApiModel):
    """A loss shrank an elastic gang with ``survivors: Stay`` to its kept pods while pods for
    the lost places start in standby beside it (``docs/survivors.md``)."""

    size: int
    """The size the gang grows back to once the standby pods are warm."""
    since: Time
    """When the loss shrank the gang: standby pods no node took 120 s later, or not warm 600 s
    later, are given up, and the gang grows as its grow policy says."""


class Leaving(ApiModel):
    """Pods a notice took out of the gang while they still run: the attempt that began at the
    notice switched in process without them, and they leave at the same step boundary
    (``recovery.inProcessSwitch``, docs/survivors.md)."""

    pods: list[str] = Field(max_length=1024)
    """The pods on the nodes announced for termination, told ``stop: leave``."""
    attempt: int
    """The attempt that began without them: its kept pods are told ``stop: switch``."""
    since: Time
    """When they were told: pods still running 60 s later are deleted."""


class ResumeFailures(ApiModel):
    """Consecutive failures right after resuming from one checkpoint (quarantine bookkeeping)."""

    checkpoint: str
    """The checkpoint the failing attempts resumed from."""
    count: int
    """How many consecutive attempts failed soon after resuming from it."""


class Condition(ApiModel):
    """A standard Kubernetes condition."""

    type: str
    """Running, Restarting, Suspended, Succeeded, Failed, PreemptionNotice, Blocked,
    CapacityAvailable or PodsScheduled."""
    status: Literal["True", "False", "Unknown"]
    """Condition status."""
    reason: str | None = None
    """CamelCase reason."""
    message: str | None = None
    """Human-readable detail."""
    last_transition_time: Time | None = None
    """When the status last changed."""
    observed_generation: int | None = None
    """The spec generation the condition was computed from."""


class Activity(StrEnum):
    """What the job was doing, for the goodput account: every second since ``goodput.since``
    falls in exactly one of these."""

    STARTING = "Starting"
    """Before the job's first interruption, not training yet: the first gang is created,
    scheduled, started and loads (a cost any job pays, spot or not)."""
    TRAINING = "Training"
    """A gang trains: from ``trainingSince`` until the operator sees it interrupted or ended."""
    WAITING_FOR_CAPACITY = "WaitingForCapacity"
    """No room: an elastic attempt waits for room for its gang (``CapacityAvailable=False``), or
    a rank of the current attempt cannot be scheduled (``PodsScheduled=False``: Unschedulable, or
    SchedulingGated while a queue has not admitted the gang)."""
    RESTARTING = "Restarting"
    """After an interruption, until the next gang trains: the old pods go, the new ones are
    created, start and load the checkpoint (waits for room and backoff not included)."""
    BACKING_OFF = "BackingOff"
    """The failure backoff: the next attempt may not start before ``restartAfter``."""
    SUSPENDED = "Suspended"
    """``spec.suspend``: the user's pause, counted apart and left out of the fraction."""
    ENDED = "Ended"
    """Succeeded or Failed: the account is closed."""


class RateSource(StrEnum):
    """Where ``goodput.fullSizeSamplesPerSecond`` comes from."""

    MEASURED = "Measured"
    """Measured while the gang ran at ``replicas`` pods."""
    SCALED = "Scaled"
    """No full-size gang has committed twice yet: a smaller gang's rate times ``replicas`` over
    its size (linear scaling, an upper bound for most jobs, so the fraction is a lower bound)."""


class PendingRollback(ApiModel):
    """An interrupted gang whose lost work is settled once the next gang trains (by then any
    emergency save it made in its grace period has committed and is the resume point)."""

    attempt: int
    """The interrupted attempt."""
    interrupted_at: Time
    """When the operator saw it interrupted."""
    trained_since: Time
    """When that gang first trained past its resume point."""
    reached_step: int | None = None
    """The highest step it reported."""
    unplanned: bool = True
    """A preemption or a failure. A grow, a re-shrink or a suspend is planned: its rollback is
    not counted in ``rollbacks``."""


class Goodput(ApiModel):
    """What spot cost the job so far: wall time by activity, work rolled back, and the share of
    the ideal that was kept. Durations are closed (added up) whenever the operator writes the
    status: at every transition, at every progress report of a training gang, and otherwise at
    the first pass a minute after the last (not while suspended or ended). The open part is
    ``activity``/``activitySince``."""

    since: Time
    """When accounting started: the job's first reconcile (for a job created before the
    operator kept this account, the first reconcile by such an operator)."""
    activity: Activity
    """What the job is doing now (Starting, Training, WaitingForCapacity, Restarting,
    BackingOff, Suspended, Ended)."""
    activity_since: Time
    """Since when the time of ``activity`` is not yet added to its field."""
    starting_seconds: float = 0.0
    """Time before the job's first interruption spent not training yet (first gang created,
    scheduled, started, loading), waits for room excluded."""
    training_seconds: float = 0.0
    """Time a gang trained: from its first progress past its resume point (``trainingSince``)
    until the operator saw it interrupted or ended. Includes ``rolledBackSeconds``."""
    waiting_for_capacity_seconds: float = 0.0
    """Time waiting for room: an elastic attempt waiting before its pods exist, or ranks of the
    current attempt unschedulable or held by a queue's scheduling gates (also a new gang's wait
    for its predecessor's pods to free their nodes)."""
    restarting_seconds: float = 0.0
    """Time from each interruption's detection until the next gang trained, waits for room and
    backoff excluded: old pods going, new ones created, started, loading the checkpoint. A warm
    join (``survivors: Stay``) counts as training until its switch, since the kept pods train on
    while the new ones start; its restart runs from the switch until the re-formed gang trains."""
    backoff_seconds: float = 0.0
    """Time in the failure backoff (``restartAfter``)."""
    suspended_seconds: float = 0.0
    """Time suspended (``spec.suspend``); not counted as lost nor in the fraction."""
    rolled_back_seconds: float = 0.0
    """Training time whose work was thrown away: per interruption, from the interrupted gang's
    last kept commit (or its first progress, when it kept none) to the interruption's
    detection, so it includes the time the loss took to be seen. Part of
    ``trainingSeconds``."""
    rolled_back_steps: int = 0
    """Steps redone: per interruption, the highest step the gang reported minus the step of the
    newest checkpoint it (or an earlier attempt) committed, as known when the next gang first
    trained: unlike ``interruptions[].stepsLost``, an emergency save committed in the grace
    period counts."""
    restarts: int = 0
    """Interruptions of a gang that had trained (preemptions, failures, grows, re-shrinks):
    ``restartingSeconds / restarts`` is the job's mean restart."""
    planned_restarts: int = 0
    """Of ``restarts``, those after a planned interruption (a grow, a re-shrink)."""
    planned_restarting_seconds: float = 0.0
    """Of ``restartingSeconds``, the time after planned interruptions:
    ``plannedRestartingSeconds / plannedRestarts`` is what a grow's pause costs the job, which
    ``grow.onlyWhenItPays`` weighs against what the grow adds (the mean of every restart until a
    planned one was measured)."""
    rollbacks: int = 0
    """Settled preemptions and failures that rolled work back: the gang had reached a step past
    the checkpoint the next gang resumed from, or never said which step it reached. A loss that
    an emergency save or a survivor's save from memory covered is not one, nor is a grow, a
    re-shrink or a suspend. Over the job's time up, the automatic checkpoint interval's mean
    time between interruptions (``RTJ_MTBI_SECONDS``)."""
    rolled_back_samples: int = 0
    """``rolledBackSteps`` in samples: each interruption's steps times its kept checkpoint's
    samples per step (sample over step). Stays 0 for a run that reports no sample counts."""
    lost_seconds: float = 0.0
    """``waitingForCapacitySeconds + restartingSeconds + backoffSeconds +
    rolledBackSeconds``."""
    lost: str = "0s"
    """``lostSeconds`` for people (``1h5m``): the LOST column."""
    committed_samples: int | None = None
    """Global samples in the newest committed checkpoint (``lastCommittedCheckpoint.sample``)."""
    samples_per_second: float | None = None
    """Training rate of the newest gang that committed twice: the sample counts of its commits
    (up to the last 10) over their commit times."""
    full_size_samples_per_second: float | None = None
    """The rate of a gang at ``replicas`` pods (see ``fullSizeRate``): the ideal's rate."""
    full_size_rate: RateSource | None = None
    """Measured (the last full-size gang that committed twice) or Scaled (from a smaller
    gang's rate, linearly)."""
    fraction: float | None = None
    """Goodput: ``committedSamples / (fullSizeSamplesPerSecond * (elapsed -
    suspendedSeconds))``, elapsed counted from ``since`` to now (or to the job's end). The
    ideal assumes the full gang could have run the whole time: the operator does not know
    what capacity the cloud had, so this is committed work over what the job would have kept
    on dedicated nodes (docs/operator.md, What spot costs this job)."""
    percent: str | None = None
    """``fraction`` for people (``87%``): the GOODPUT column."""
    pending_rollback: PendingRollback | None = None
    """An interruption whose rolled-back work is settled when the next gang trains."""


class ProgressPoint(ApiModel):
    """One progress report of the current gang's rank 0, kept for the rate."""

    time: Time
    """When rank 0 sent it (its ``reported_at``; the operator's clock when absent)."""
    step: int
    """The step it reported."""
    sample: int | None = None
    """The global sample count it reported, when the run counts samples."""


class JobProgress(ApiModel):
    """How far the job is and when it should end: the PROGRESS and ETA columns. The step and
    the total come from rank 0's progress annotation (the runtime reports ``total_steps``
    when it knows the job's total work); the rate is measured over the current gang's recent
    reports only, so time without a running gang (waits for capacity, restarts) never lowers
    it."""

    state: Activity
    """What the job is doing (the goodput account's activity): only Training has an ETA."""
    reason: str | None = None
    """Why ``etaSeconds`` is absent: the state (Starting, WaitingForCapacity, Restarting,
    BackingOff, Suspended), Succeeded or Failed, TotalUnknown (the runtime reported no total)
    or RateUnknown (fewer than two reports of the current gang yet, and none before)."""
    step: int | None = None
    """The current step: the highest the current gang reported, else the last commit's."""
    total_steps: int | None = None
    """The job's total steps, as the runtime last reported them."""
    fraction: float | None = None
    """``step / totalSteps`` (at most 1)."""
    percent: str | None = None
    """``fraction`` for people (``42%``): the PROGRESS column."""
    steps_per_second: float | None = None
    """Training rate over the current gang's last reports (up to ``RATE_WINDOW_SECONDS``); the
    previous gang's until the current one reported twice."""
    samples_per_second: float | None = None
    """The same rate in global samples, when the run counts samples."""
    rate_seconds: float | None = None
    """The span of reports the rate was measured over."""
    eta_seconds: float | None = None
    """Estimated seconds of training left: ``(totalSteps - step) / stepsPerSecond``. Absent when
    no gang trains (see ``reason``): the time the job will wait or restart is not known."""
    eta: str | None = None
    """``etaSeconds`` for people (``1h5m``), else the ``reason``: the ETA column."""
    attempt: int | None = None
    """The attempt whose reports ``window`` holds."""
    window: list[ProgressPoint] = Field(default_factory=list)
    """Recent reports of that attempt's rank 0, oldest first (bounded)."""


class JobStatus(ApiModel):
    """Observed state of a ResumableTrainingJob, written only by the operator."""

    phase: Phase | None = None
    """Pending, Running, Restarting, Suspended, Succeeded or Failed."""
    attempt: int = 0
    """Current attempt (RTJ_ATTEMPT of its pods). Written before that attempt's pods exist."""
    gang_created: bool = False
    """Whether every pod of the current attempt has been created. A pod missing after this is a
    lost pod; before it, a pod still to create."""
    kept_pods: list[str] = Field(default_factory=list)
    """With ``recovery.survivors: Stay``: the pods of earlier attempts the current attempt kept
    (they run its first ranks: rank ``i`` in ``keptPods[i]``) and told the new membership,
    instead of replacing them. Written before they are relabelled into this attempt."""
    membership_pending_since: Time | None = None
    """With ``recovery.survivors: Stay``, while an elastic gang grows: since when the kept pods
    train on under their previous membership while the attempt's new pods start in standby.
    Cleared when every pod is given the new membership (each new pod's agent said it is warm,
    or 120 s passed)."""
    run_name: str | None = None
    """Effective run name (spec.runName or the job's name), fixed at the first reconcile."""
    resume_from: str | None = None
    """RTJ_RESUME_FROM given to the current attempt."""
    resume_checkpoint: str | None = None
    """Name of the checkpoint the current attempt resumes from, when the operator chose one."""
    restart_after: Time | None = None
    """While backing off after a failure: the earliest time the current attempt's pods start."""
    attempt_start_time: Time | None = None
    """When the current attempt's pods were created."""
    gang_size: int | None = None
    """Pods in the current attempt's gang (``spec.replicas`` unless the job is elastic). Written
    before that attempt's pods exist; absent while a new attempt backs off or waits for room, and
    while the job is suspended (chosen again when it resumes)."""
    world_size: int | None = None
    """World size of the current attempt: ``gangSize * processesPerPod`` (WORLD_SIZE); absent
    when ``gangSize`` is."""
    gang_scheduling: str | None = None
    """How the current attempt's gang is kept all-or-nothing: PodGroup (native gang scheduling),
    Kueue (spec.queueName) or Operator (the operator's own capacity check). Chosen when the
    attempt's pods are created: absent while a new attempt backs off or waits for room, and
    while the job is suspended."""
    capacity_wait_since: Time | None = None
    """While an elastic job's attempt waits for room for its full gang (before its pods exist):
    since when room for ``minReplicas`` pods was first seen (absent while fewer fit; the wait
    starts again when they fit again), the start of ``shrinkAfterSeconds``. While its pods wait
    to be scheduled once the previous attempt's pods are gone: since when."""
    training_since: Time | None = None
    """When the operator first saw the current attempt's gang train past the point it resumed
    from: a step or a commit in rank 0's ``resumable.dev/progress`` annotation (a pod Running
    says nothing of the trainer, which may still be loading its checkpoint). No grow is asked
    of a gang before it, and ``grow.minIntervalSeconds`` counts from it. Absent until then, and
    for each new attempt."""
    grow_room_since: Time | None = None
    """While an elastic gang runs below ``replicas`` with room for more pods but not for all
    ``replicas``: since when. A grow to that partial size waits ``grow.settleSeconds`` from then
    for room for the full gang; absent while there is no such room (it starts again when the
    room comes back), and for each new gang."""
    grow_deferred: str | None = None
    """While room for more pods is there but a grow to it would not pay yet
    (``grow.onlyWhenItPays``): what it would cost, what it would add, and from which size it
    pays. Absent otherwise."""
    grow: GrowRequest | None = None
    """The grow in progress, if any."""
    restore: Restore | None = None
    """With ``recovery.survivors: Stay`` on an elastic gang: after a loss, the kept pods train
    on alone at once, and the gang grows back to ``restore.size`` as soon as the lost places'
    standby pods are warm, without waiting for ``grow.minIntervalSeconds``."""
    leaving: Leaving | None = None
    """With ``recovery.inProcessSwitch``: the pods on nodes announced for termination that the
    current attempt left out at the notice, while they leave the gang."""
    grow_abandoned_at: Time | None = None
    """When the last grow was abandoned (its checkpoint did not commit within
    ``grow.checkpointTimeoutSeconds``, or the room went away): the next grow waits
    ``grow.minIntervalSeconds`` from then, as from ``trainingSince``."""
    size_history: list[SizeRecord] = Field(default_factory=list)
    """Gang sizes the job ran at, oldest first (bounded to the last 20)."""
    preemptions: int = 0
    """Preemptions so far (counted against resumePolicy.maxPreemptions)."""
    failures: int = 0
    """Real failures so far (counted against resumePolicy.backoffLimit)."""
    retries: int = 0
    """Failures retried by an ``exitCodeRules`` rule with action Retry (counted against
    resumePolicy.maxRetries, never against backoffLimit)."""
    quarantined: int = 0
    """Number of quarantined checkpoints."""
    quarantined_checkpoints: list[str] = Field(default_factory=list)
    """Names of quarantined checkpoints, passed to the ranks as RTJ_QUARANTINED."""
    resume_failures: ResumeFailures | None = None
    """Consecutive failures right after resuming from the same checkpoint."""
    last_committed_checkpoint: CheckpointRecord | None = None
    """Newest committed checkpoint (by step) the runtime reported."""
    known_checkpoints: list[CheckpointRecord] = Field(default_factory=list)
    """Recently committed checkpoints, newest first (bounded); the quarantine fallback."""
    attempt_checkpoint: str | None = None
    """Newest checkpoint committed by the current attempt's gang."""
    current_step: int | None = None
    """Highest step the current attempt's ranks reported."""
    steps_at_risk: int | None = None
    """The steps an interruption now would throw away: ``currentStep`` less the step of
    ``lastCommittedCheckpoint`` (committed at its ``time``); absent while either is unknown. For
    checkpoint-aware choices of a victim: ``kubectl get rtj --sort-by=.status.stepsAtRisk``."""
    interruptions: list[Interruption] = Field(default_factory=list)
    """Most recent interruptions, oldest first (bounded to the last 20)."""
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    """Standard conditions with reasons and messages."""
    start_time: Time | None = None
    """When the operator first started the job."""
    completion_time: Time | None = None
    """When the job Succeeded or Failed."""
    observed_generation: int | None = None
    """The spec generation last reconciled."""
    goodput: Goodput | None = None
    """What spot cost the job so far: time by activity, work rolled back, goodput (docs/operator.md,
    What spot costs this job)."""
    progress: JobProgress | None = None
    """Progress and ETA: step, total, rate and the time left (docs/progress-and-interval.md)."""
