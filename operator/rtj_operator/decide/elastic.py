"""Elastic gang sizing: which size an attempt starts at, and when a running gang grows back.

Pure decisions from the spec, the capacity that fits now (capacity.py) and the status, so every
rule is unit-tested without a cluster. The rules (docs/operator.md, Elastic gangs):

- a fixed job (no ``spec.elastic``) always runs ``replicas`` pods;
- an elastic attempt starts at ``replicas`` as soon as they fit; otherwise, once ``minReplicas``
  fit, it waits up to ``shrinkAfterSeconds`` for them, then starts at the size that fits; below
  ``minReplicas`` it waits (Pending/Restarting with reason ``MinReplicasUnreachable``), never
  failing and never counting a preemption. The wait for the full gang starts when
  ``minReplicas`` first fit and starts again when fewer fit: time spent below the minimum is no
  sign that the full gang will not come (spot nodes come back in bursts), so counting it would
  start a partial gang the moment the first nodes return, and grow it (a full restart) seconds
  later when the rest do;
- a gang below ``replicas`` grows when more pods fit and it has trained for at least
  ``grow.minIntervalSeconds`` since its first progress after its resume (``trainingSince``):
  the gang is told to checkpoint now (the notice path) and is resubmitted at the larger size
  only once that checkpoint committed, so a grow costs no work beyond the fresh checkpoint. A
  gang that has not trained since its resume is never asked: counted from its creation, or
  from its pods Running, the interval could run out while it still loads its checkpoint, and
  the grow would throw away a whole restart for two steps of training. A checkpoint that does
  not come within ``grow.checkpointTimeoutSeconds`` abandons the grow; the gang trains on;
- a grow to a size below ``replicas`` also waits until the room for it has been there
  ``grow.settleSeconds`` (``growRoomSince``), the grow's mirror of the start's
  ``shrinkAfterSeconds``: every grow is a full restart, and spot nodes come back in bursts, so
  growing at each node that registers (2 -> 3, then 3 -> 4 twenty seconds later) pays twice for
  what one grow to the full size buys. A grow to ``replicas`` never waits for it;
- a gang above ``minReplicas`` whose pods are not all scheduled ``shrinkAfterSeconds`` (at least
  ``SCHEDULING_GRACE_SECONDS``) after
  they were created and the previous attempt's pods were gone (the capacity count was too high:
  a node counted as free was not) is ended and resubmitted smaller, at what fits (never below
  ``minReplicas``).

Resizing in place (torchrun rendezvous restarts) was rejected: a new world size needs the
checkpoint resharded and the data position re-dealt, which the runtime does on resume.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from ..api.spec_types import GrowPolicy, JobSpec, grow_min_interval_seconds, shrink_after_seconds
from ..api.status_types import MAX_SIZE_HISTORY, GrowRequest, JobStatus, SizeRecord
from .grow_payoff import GrowCost

POLL_SECONDS = 5.0
"""How often a job waiting for capacity or watching for more looks again (node events also
wake it up at once)."""

SCHEDULING_GRACE_SECONDS = 5.0
"""The least time a created gang gets to be scheduled before a re-shrink, also when
``shrinkAfterSeconds`` is shorter (0 included): the scheduler needs a moment to bind any gang."""

GROW_REASON = "resumable.dev/grow"
"""The notice reason written into a gang's pods when the operator asks for a checkpoint to grow."""


class StartReason(StrEnum):
    """Why an attempt starts at its size, or why it waits."""

    FIXED = "Fixed"
    FULL_SIZE = "FullSize"
    SHRUNK = "Shrunk"
    SURVIVORS_FIRST = "SurvivorsFirst"
    GROWN = "Grown"
    WAITING_FOR_FULL_GANG = "WaitingForFullGang"
    MIN_REPLICAS_UNREACHABLE = "MinReplicasUnreachable"


@dataclass(frozen=True)
class StartDecision:
    """The size to create the attempt's gang at, or None to wait."""

    size: int | None
    reason: StartReason
    message: str
    recheck_after: float | None = None
    wait_since: datetime | None = None
    """Since when the attempt waits for its full gang with room for ``minReplicas``
    (``status.capacityWaitSince``); None when it does not: it starts, or fewer fit."""


def start_size(
    spec: JobSpec,
    fit: int,
    *,
    waiting_since: datetime | None,
    now: datetime,
    grown_from: int | None = None,
) -> StartDecision:
    """The size of an attempt's gang given ``fit`` pods of room now.

    ``waiting_since`` is when the attempt began waiting for its full gang with room for
    ``minReplicas`` (the decision's ``wait_since`` of the previous pass); ``grown_from`` the size
    of the gang a grow ended (the grow already waited for its checkpoint: no further wait).
    """
    full = spec.replicas
    elastic = spec.elastic
    if elastic is None:
        return StartDecision(full, StartReason.FIXED, f"fixed size: {full} pods")
    if fit >= full:
        return StartDecision(full, StartReason.FULL_SIZE, f"room for all {full} pods")
    minimum = elastic.min_replicas
    if fit < minimum:
        return StartDecision(
            None,
            StartReason.MIN_REPLICAS_UNREACHABLE,
            f"room for {fit} of {full} pods, fewer than minReplicas={minimum}; waiting for "
            "capacity",
            POLL_SECONDS,
        )
    if grown_from is not None and fit > grown_from:
        return StartDecision(
            fit, StartReason.GROWN, f"room for {fit} of {full} pods (was {grown_from})"
        )
    since = waiting_since if waiting_since is not None else now
    shrink_after = shrink_after_seconds(spec)
    remaining = shrink_after - (now - since).total_seconds()
    if remaining > 0:
        return StartDecision(
            None,
            StartReason.WAITING_FOR_FULL_GANG,
            f"room for {fit} of {full} pods; waiting up to {shrink_after}s for "
            f"the full gang before starting {fit}",
            min(remaining, POLL_SECONDS),
            since,
        )
    return StartDecision(
        fit,
        StartReason.SHRUNK,
        f"room for {fit} of {full} pods after waiting {shrink_after}s",
    )


def survivors_first(
    spec: JobSpec, decision: StartDecision, kept: int, pays: Callable[[int, int], bool]
) -> StartDecision | None:
    """After a loss, an elastic gang with ``survivors: Stay`` starts as its ``kept`` pods alone
    when they are at least ``minReplicas``, ``decision`` would add pods, and ``pays(kept,
    size)`` (``grow_payoff.survivors_first_pays``): the pods for the lost places start in
    standby beside it and join it when warm (``restore.py``), instead of holding the kept ranks
    up in ``init_process_group`` through their cold start. None: start as ``decision`` says."""
    if spec.elastic is None or decision.size is None or not kept:
        return None
    if decision.size <= kept or kept < spec.elastic.min_replicas:
        return None
    if not pays(kept, decision.size):
        return None
    return StartDecision(
        kept,
        StartReason.SURVIVORS_FIRST,
        f"the {kept} kept pods train on at once; {decision.size - kept} pods for the lost "
        f"places start in standby and join when warm (room for {decision.size} of "
        f"{spec.replicas} pods)",
    )


class GrowAction(StrEnum):
    """What to do about growing a running gang."""

    NONE = "None"
    REQUEST = "Request"
    """Ask the gang to checkpoint now (write the notice), record the request."""
    RESTART = "Restart"
    """The requested checkpoint committed: end the attempt and resubmit at the larger size."""
    ABANDON = "Abandon"
    """The checkpoint did not come in time (or the room went away): forget the grow."""


@dataclass(frozen=True)
class GrowDecision:
    """The grow step for one reconcile of a running gang."""

    action: GrowAction
    target: int
    message: str
    recheck_after: float | None = None
    room_since: datetime | None = None
    """Since when room for more pods than the gang, but not for all ``replicas``, has been there
    (``status.growRoomSince``); None while there is no such room."""
    deferred: bool = False
    """There is room to grow, but the grow would not pay yet (``message`` says why)."""


def grow_step(
    spec: JobSpec,
    *,
    size: int,
    fit: int,
    all_running: bool,
    trained_since: datetime | None,
    abandoned_at: datetime | None,
    room_since: datetime | None,
    request: GrowRequest | None,
    committed_step: int | None,
    now: datetime,
    cost: GrowCost | None = None,
) -> GrowDecision:
    """Decide the next grow step of a gang of ``size`` pods with room for ``fit``.

    ``committed_step`` is the newest committed checkpoint's step; ``trained_since`` when the gang
    first trained past its resume point (None: not yet, no grow); ``abandoned_at`` when the last
    grow was abandoned. ``grow.minIntervalSeconds`` counts from the later of the two.
    ``room_since`` is the decision's ``room_since`` of the previous pass: since when room for a
    partial grow has been there (``grow.settleSeconds``). ``cost``: what a grow costs the job
    (``grow_payoff.grow_cost``; None: not measured yet), for ``grow.onlyWhenItPays``.
    """
    elastic = spec.elastic
    target = min(fit, spec.replicas)
    if elastic is None or not elastic.grow.enabled or size >= spec.replicas:
        if request is not None:
            return GrowDecision(GrowAction.ABANDON, size, "growing is off")
        return GrowDecision(GrowAction.NONE, size, "")
    policy = elastic.grow
    partial = size < target < spec.replicas
    room_since = (room_since or now) if partial else None
    if request is not None:
        return _requested_grow(
            policy,
            request,
            size=size,
            target=target,
            committed_step=committed_step,
            room_since=room_since,
            now=now,
        )
    if target <= size or not all_running or trained_since is None:
        return GrowDecision(GrowAction.NONE, size, "", POLL_SECONDS, room_since)
    wait = _wait_before_asking(spec, trained_since, abandoned_at, room_since, now)
    if wait > 0:
        return GrowDecision(GrowAction.NONE, size, "", min(POLL_SECONDS, wait), room_since)
    if policy.only_when_it_pays and cost is not None and not cost.pays(size, target):
        message = cost.explain(size, target, spec.replicas)
        return GrowDecision(GrowAction.NONE, size, message, POLL_SECONDS, room_since, True)
    settled = f" for {policy.settle_seconds}s (grow.settleSeconds)" if room_since else ""
    return GrowDecision(
        GrowAction.REQUEST,
        target,
        f"room for {target} of {spec.replicas} pods{settled}; asked the {size} running pods "
        "to checkpoint now",
        room_since=room_since,
    )


def _wait_before_asking(
    spec: JobSpec,
    trained_since: datetime,
    abandoned_at: datetime | None,
    room_since: datetime | None,
    now: datetime,
) -> float:
    """Seconds until ``grow.minIntervalSeconds`` (from the gang's first progress or the last
    abandoned grow) and, for a partial grow, ``grow.settleSeconds`` have passed."""
    start = max(trained_since, abandoned_at) if abandoned_at is not None else trained_since
    wait = grow_min_interval_seconds(spec) - (now - start).total_seconds()
    if room_since is not None and spec.elastic is not None:
        # Room for a partial grow only: give the rest of the gang time to come back first.
        settle = spec.elastic.grow.settle_seconds
        wait = max(wait, settle - (now - room_since).total_seconds())
    return wait


def _requested_grow(
    policy: GrowPolicy,
    request: GrowRequest,
    *,
    size: int,
    target: int,
    committed_step: int | None,
    room_since: datetime | None,
    now: datetime,
) -> GrowDecision:
    """A grow already asked for: restart at ``target`` once a checkpoint past the request is
    committed (abandon it when the room went away), abandon it past the checkpoint timeout,
    else wait for the checkpoint."""
    if committed_step is not None and (
        request.after_step is None or committed_step > request.after_step
    ):
        if target <= size:
            return GrowDecision(
                GrowAction.ABANDON,
                size,
                f"checkpoint at step {committed_step} committed but the room for more than "
                f"{size} pods went away",
                room_since=room_since,
            )
        return GrowDecision(
            GrowAction.RESTART,
            target,
            f"checkpoint at step {committed_step} committed; resubmitting {target} pods",
            room_since=room_since,
        )
    waited = (now - request.requested_at).total_seconds()
    if waited >= policy.checkpoint_timeout_seconds:
        return GrowDecision(
            GrowAction.ABANDON,
            size,
            f"no checkpoint committed within {policy.checkpoint_timeout_seconds}s of the "
            "request; training on",
            room_since=room_since,
        )
    return GrowDecision(
        GrowAction.NONE,
        request.target_size,
        "",
        min(POLL_SECONDS, policy.checkpoint_timeout_seconds - waited),
        room_since,
    )


@dataclass(frozen=True)
class ReshrinkDecision:
    """The smaller size to resubmit a gang that could not be scheduled at, or None to wait."""

    size: int | None
    message: str = ""
    recheck_after: float | None = None


def reshrink_step(
    spec: JobSpec,
    *,
    size: int,
    fit: int,
    scheduled: int,
    waiting_since: datetime | None,
    now: datetime,
) -> ReshrinkDecision:
    """Whether a created gang of ``size`` pods, ``scheduled`` of them bound to a node, should be
    resubmitted smaller because the capacity count that chose its size was too high.
    ``waiting_since``: since when the gang's pods wait to be scheduled (the previous attempt's
    pods gone).

    The new size is what the evidence says fits: the pods that did bind (the operator's own
    wait-then-shrink binds them one by one), else one fewer than now when nothing bound (a
    native gang binds all or none), never more than ``fit`` and never below ``minReplicas``.
    """
    elastic = spec.elastic
    if elastic is None or waiting_since is None or size <= elastic.min_replicas:
        return ReshrinkDecision(None)
    if scheduled >= size:
        return ReshrinkDecision(None)
    wait = max(shrink_after_seconds(spec), SCHEDULING_GRACE_SECONDS)
    waited = (now - waiting_since).total_seconds()
    remaining = wait - waited
    if remaining > 0:
        return ReshrinkDecision(None, recheck_after=min(remaining, POLL_SECONDS))
    target = max(elastic.min_replicas, min(fit, scheduled or size - 1, size - 1))
    return ReshrinkDecision(
        target,
        f"only {scheduled} of {size} pods were scheduled within {wait:g}s "
        f"(the capacity count was too high); resubmitting {target} pods",
    )


def record_size(
    status: JobStatus,
    *,
    size: int,
    world_size: int,
    reason: str,
    message: str,
    now: datetime,
    steps_lost: int | None,
) -> bool:
    """Close the current stretch and open one at ``size`` when the size changes; whether it did."""
    history = status.size_history
    if history and history[-1].size == size:
        return False
    if history:
        last = history[-1]
        history[-1] = last.model_copy(
            update={
                "end_time": now,
                "seconds": round(max((now - last.start_time).total_seconds(), 0.0), 3),
            }
        )
    history.append(
        SizeRecord(
            size=size,
            world_size=world_size,
            reason=reason,
            message=message,
            attempt=status.attempt,
            start_time=now,
            steps_lost=steps_lost,
        )
    )
    status.size_history = history[-MAX_SIZE_HISTORY:]
    return True
