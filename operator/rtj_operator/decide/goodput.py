"""The goodput account: what spot costs one job, kept in ``status.goodput``.

Every second since the account opened falls in one activity (``status_types.Activity``):
starting, training, waiting for capacity, restarting, backing off, suspended. The activity is
decided from the status a reconcile pass ends with, so it follows the state machine without a
second one; the open interval (``activity``, ``activitySince``) lives in the status too, so an
operator that restarts closes it with its whole length. Durations are folded into their fields
only when the status is written anyway (a transition, a training gang's progress report) or
once a minute, never on every pass: a no-op reconcile stays a no-op.

Work rolled back is settled late on purpose. At the moment an interruption is seen, the
interrupted ranks may still be in their grace period, about to commit an emergency save; the
next gang resumes from it. So the loss is recorded as pending and settled when the next gang
first trains (or the job ends, or another interruption comes first) against the newest
checkpoint the interrupted attempt or an earlier one committed by then.

Computing the figures from ``status.interruptions`` and the size history instead was rejected:
both are bounded to their last 20 entries and hold no waits; Prometheus counters were rejected
as the source because they reset with the operator and are not per job.
"""

from __future__ import annotations

from datetime import datetime

from ..api.status_types import (
    TERMINAL_PHASES,
    Activity,
    CheckpointRecord,
    Goodput,
    JobStatus,
    PendingRollback,
    Phase,
    RateSource,
)
from ..api.timeutil import parse_time
from . import conditions as cond
from .podstate import SCHEDULING_GATED, UNSCHEDULABLE
from .progress import progress_order

REFRESH_SECONDS = 60.0
"""The open interval is folded in at least this often when a pass runs, also when nothing else
in the status changed, so ``kubectl get`` is never much more stale than this plus the time
between passes (a job waiting for capacity is looked at every few seconds, any job at least every
``--resync-seconds``). Not while suspended or ended: nothing that matters moves then."""

_FIELDS = {
    Activity.STARTING: "starting_seconds",
    Activity.TRAINING: "training_seconds",
    Activity.WAITING_FOR_CAPACITY: "waiting_for_capacity_seconds",
    Activity.RESTARTING: "restarting_seconds",
    Activity.BACKING_OFF: "backoff_seconds",
    Activity.SUSPENDED: "suspended_seconds",
}
"""The field each activity's time is added to (Ended: none, the account is closed)."""

_FROZEN = frozenset({Activity.SUSPENDED, Activity.ENDED})
"""Activities in which no figure but ``suspendedSeconds`` moves: no refresh for them."""

_WAITING_REASONS = frozenset({UNSCHEDULABLE, SCHEDULING_GATED})
"""PodsScheduled=False reasons that mean the gang waits for room (or a queue's admission)."""


def open_account(status: JobStatus, now: datetime) -> None:
    """Start the account if the job has none (its first pass, or the first pass of an operator
    that keeps one)."""
    if status.goodput is None:
        status.goodput = Goodput(since=now, activity=activity(status, now), activity_since=now)


def activity(status: JobStatus, now: datetime) -> Activity:
    """What the job does according to ``status``."""
    if status.phase in TERMINAL_PHASES:
        return Activity.ENDED
    if status.phase is Phase.SUSPENDED:
        return Activity.SUSPENDED
    if status.membership_pending_since is not None:
        return Activity.TRAINING  # a warm join's kept pods train on until the switch
    if status.gang_created and status.training_since is not None:
        return Activity.TRAINING
    if status.restart_after is not None and now < status.restart_after:
        return Activity.BACKING_OFF
    if _waiting_for_room(status):
        return Activity.WAITING_FOR_CAPACITY
    return Activity.RESTARTING if status.interruptions else Activity.STARTING


def _waiting_for_room(status: JobStatus) -> bool:
    for c in status.conditions:
        if c.status != "False":
            continue
        if c.type == cond.CAPACITY or (
            c.type == cond.PODS_SCHEDULED and c.reason in _WAITING_REASONS
        ):
            return True
    return False


def note_interruption(status: JobStatus, now: datetime, *, unplanned: bool) -> None:
    """The current attempt is being interrupted (called before its gang is forgotten): settle an
    earlier pending loss, and record this gang's as pending when it trained at all.
    ``unplanned``: a preemption or a failure, which ``rollbacks`` counts when it lost work."""
    account = status.goodput
    if account is None:
        return
    _settle_rollback(status, account)
    if status.gang_created and status.training_since is not None:
        account.restarts += 1
        account.planned_restarts += not unplanned
        account.pending_rollback = PendingRollback(
            attempt=status.attempt,
            interrupted_at=now,
            trained_since=status.training_since,
            reached_step=status.current_step,
            unplanned=unplanned,
        )


def account(status: JobStatus, before: JobStatus, *, replicas: int, now: datetime) -> None:
    """Bring ``status.goodput`` up to ``now`` when the status is written anyway, the activity
    changed, or the open interval is older than ``REFRESH_SECONDS``. ``before``: the status as
    the pass found it."""
    current = status.goodput
    if current is None:
        return
    doing = activity(status, now)
    open_for = (now - current.activity_since).total_seconds()
    due = (
        before.goodput is None
        or doing is not current.activity
        or (current.activity not in _FROZEN and open_for >= REFRESH_SECONDS)
        or _dump(status) != _dump(before)
    )
    if not due:
        return
    field = _FIELDS.get(current.activity)
    if field is not None and open_for > 0:
        setattr(current, field, round(getattr(current, field) + open_for, 3))
        pending = current.pending_rollback  # the interruption this restart follows
        if current.activity is Activity.RESTARTING and pending and not pending.unplanned:
            current.planned_restarting_seconds = round(
                current.planned_restarting_seconds + open_for, 3
            )
    current.activity, current.activity_since = doing, now
    pending = current.pending_rollback
    if pending is not None and (
        doing is Activity.ENDED
        or (status.training_since is not None and status.attempt > pending.attempt)
    ):
        _settle_rollback(status, current)
    _measure_rate(status, current, replicas)
    _figures(status, current)


def _dump(status: JobStatus) -> dict[str, object]:
    return status.model_dump(mode="json", exclude={"goodput"})


def _kept_checkpoint(status: JobStatus, attempt: int) -> CheckpointRecord | None:
    """The newest checkpoint committed by ``attempt`` or an earlier one: what the gang after it
    resumed from (the runtime takes the newest valid checkpoint)."""
    candidates = [
        c
        for c in [*status.known_checkpoints, status.last_committed_checkpoint]
        if c is not None and (c.attempt is None or c.attempt <= attempt)
    ]
    return max(candidates, key=progress_order) if candidates else None


def _samples_per_step(*records: CheckpointRecord | None) -> float | None:
    for record in records:
        if record is not None and record.sample and record.step > 0:
            return record.sample / record.step
    return None


def _settle_rollback(status: JobStatus, account: Goodput) -> None:
    """Add the pending interruption's lost work to the account."""
    pending = account.pending_rollback
    if pending is None:
        return
    account.pending_rollback = None
    kept = _kept_checkpoint(status, pending.attempt)
    kept_step = kept.step if kept is not None else 0
    steps = max((pending.reached_step or 0) - kept_step, 0)
    start, end = pending.trained_since, pending.interrupted_at
    if kept is not None and kept.attempt == pending.attempt:
        committed_at = parse_time(kept.time)
        # A commit time that does not parse: the gang kept work, when is unknown; count none.
        start = end if committed_at is None else min(max(committed_at, start), end)
    account.rolled_back_seconds = round(
        account.rolled_back_seconds + max((end - start).total_seconds(), 0.0), 3
    )
    account.rolled_back_steps += steps
    if pending.unplanned and (steps > 0 or pending.reached_step is None):
        account.rollbacks += 1
    per_step = _samples_per_step(kept, status.last_committed_checkpoint)
    if per_step is not None:
        account.rolled_back_samples += round(steps * per_step)


def _measure_rate(status: JobStatus, account: Goodput, replicas: int) -> None:
    """The current gang's rate over its commits (sample counts over commit times), when it has
    committed at least twice; at full size it is the ideal's rate."""
    size = status.gang_size
    if not status.gang_created or not size:
        return
    timed = [
        (at, c.sample)
        for c in status.known_checkpoints
        if c.attempt == status.attempt and c.sample and (at := parse_time(c.time)) is not None
    ]
    if len(timed) < 2:
        return
    first, last = min(timed), max(timed)
    seconds, samples = (last[0] - first[0]).total_seconds(), last[1] - first[1]
    if seconds <= 0 or samples <= 0:
        return
    rate = samples / seconds
    account.samples_per_second = round(rate, 3)
    if size >= replicas:
        account.full_size_samples_per_second = round(rate, 3)
        account.full_size_rate = RateSource.MEASURED
    elif account.full_size_rate is not RateSource.MEASURED:
        account.full_size_samples_per_second = round(rate * replicas / size, 3)
        account.full_size_rate = RateSource.SCALED


def elapsed_seconds(account: Goodput) -> float:
    """Closed time not suspended (the fraction's denominator, in seconds)."""
    return sum(
        getattr(account, field) for a, field in _FIELDS.items() if a is not Activity.SUSPENDED
    )


def _figures(status: JobStatus, account: Goodput) -> None:
    account.lost_seconds = round(
        account.waiting_for_capacity_seconds
        + account.restarting_seconds
        + account.backoff_seconds
        + account.rolled_back_seconds,
        3,
    )
    account.lost = human_duration(account.lost_seconds)
    last = status.last_committed_checkpoint
    account.committed_samples = last.sample if last is not None else None
    ideal = (account.full_size_samples_per_second or 0.0) * elapsed_seconds(account)
    if account.committed_samples is None or ideal <= 0:
        account.fraction = account.percent = None
        return
    account.fraction = round(account.committed_samples / ideal, 3)
    account.percent = f"{account.committed_samples / ideal * 100:.0f}%"


def human_duration(seconds: float) -> str:
    """``45s``, ``12m5s``, ``1h5m``, ``2d3h``: two units at most, like ``kubectl``'s ages."""
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h" if hours else f"{days}d"
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{secs}s" if secs else f"{minutes}m"
    return f"{secs}s"
