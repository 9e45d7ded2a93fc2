"""Status phase and conditions, kept consistent with each other in one place.

Every phase change goes through ``set_phase`` so ``kubectl get`` (phase column) and ``kubectl
describe``/``kubectl wait --for=condition=...`` (conditions) can never disagree. This is the only
module that writes ``status.conditions``: the steps of the reconcile decide which condition says
what, and write it through ``set_condition``/``set_phase`` (or, for a status that does not parse,
``upsert_stored`` on the stored list), so a transition time and a generation are kept one way.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..api.status_types import Condition, JobStatus, Phase
from ..api.timeutil import iso

RUNNING = "Running"
RESTARTING = "Restarting"
SUSPENDED = "Suspended"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
PREEMPTION_NOTICE = "PreemptionNotice"
BLOCKED = "Blocked"
"""True while a name the job needs is taken by an object it does not control (reason
NameConflict), while the API server refuses the attempt's pods (reason PodCreationRefused), or
while the job does not parse (reason InvalidSpec, invalid_spec.py)."""
NAME_CONFLICT = "NameConflict"
POD_CREATION_REFUSED = "PodCreationRefused"
CAPACITY = "CapacityAvailable"
"""Elastic jobs: True with the size chosen (FullSize, Shrunk, Grown), False while an attempt
waits for room (WaitingForFullGang, MinReplicasUnreachable)."""
PODS_SCHEDULED = "PodsScheduled"
"""False while a rank of the current attempt is unschedulable (reason Unschedulable, with the
scheduler's message) or held by scheduling gates (reason SchedulingGated: Kueue's until it admits
the gang)."""

_PHASE_CONDITION = {
    Phase.RUNNING: RUNNING,
    Phase.RESTARTING: RESTARTING,
    Phase.SUSPENDED: SUSPENDED,
    Phase.SUCCEEDED: SUCCEEDED,
    Phase.FAILED: FAILED,
}


def set_condition(
    status: JobStatus,
    type_: str,
    value: bool,
    *,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> None:
    """Upsert one condition; lastTransitionTime moves only when its status flips."""
    text = "True" if value else "False"
    for index, cond in enumerate(status.conditions):
        if cond.type == type_:
            changed = cond.status != text
            status.conditions[index] = Condition(
                type=type_,
                status=text,
                reason=reason,
                message=message,
                last_transition_time=now if changed else cond.last_transition_time,
                observed_generation=generation,
            )
            return
    status.conditions.append(
        Condition(
            type=type_,
            status=text,
            reason=reason,
            message=message,
            last_transition_time=now,
            observed_generation=generation,
        )
    )


def upsert_stored(
    stored: list[dict[str, Any]],
    type_: str,
    value: bool,
    *,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    """``set_condition`` on a stored (wire form) conditions list, for a status that does not
    parse into the model: a new list, the condition replaced where it was, else appended;
    lastTransitionTime moves only when its status flips."""
    text = "True" if value else "False"
    old = next((c for c in stored if c.get("type") == type_), None)
    same = old is not None and old.get("status") == text
    new = {
        "type": type_,
        "status": text,
        "reason": reason,
        "message": message,
        "lastTransitionTime": old.get("lastTransitionTime") if same and old else iso(now),
        "observedGeneration": generation,
    }
    if old is None:
        return [*stored, new]
    return [new if c is old else c for c in stored]


def set_phase(
    status: JobStatus,
    phase: Phase,
    *,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> None:
    """Move to ``phase``: its condition becomes True, the other phase conditions False; in a
    phase where no rank runs (suspended, ended) the gang's conditions settle too."""
    status.phase = phase
    if phase in _NO_GANG:
        _settle_gang_conditions(
            status, reason=reason, message=message, now=now, generation=generation
        )
    owner = _PHASE_CONDITION.get(phase)
    for cond_type in (RUNNING, RESTARTING, SUSPENDED, SUCCEEDED, FAILED):
        current = condition(status, cond_type)
        if cond_type == owner:
            set_condition(
                status,
                cond_type,
                True,
                reason=reason,
                message=message,
                now=now,
                generation=generation,
            )
        elif cond_type == RUNNING or (current and current.status == "True"):
            # A condition that stops being true says why (the new phase's reason); Running,
            # the one to read for why no rank runs, follows every phase (it kept "Suspended"
            # after a resume, while the job was Pending or Restarting).
            set_condition(
                status,
                cond_type,
                False,
                reason=reason,
                message=message,
                now=now,
                generation=generation,
            )


_NO_GANG = frozenset({Phase.SUSPENDED, Phase.SUCCEEDED, Phase.FAILED})
"""Phases in which no rank runs: what the gang's own conditions said no longer holds."""


def _settle_gang_conditions(
    status: JobStatus, *, reason: str, message: str, now: datetime, generation: int | None
) -> None:
    """No rank runs any more: ``PodsScheduled=False`` (about ranks that no longer exist),
    ``CapacityAvailable=False`` (a wait for room that stopped) and ``Blocked=True`` (a name taken,
    pods refused: nothing is created or retried any more) go, as they are absent while nothing
    is stuck, and ``PreemptionNotice=True`` turns False with the phase's reason. The next
    attempt sets them again."""
    status.conditions = [
        c
        for c in status.conditions
        if not (c.type in (PODS_SCHEDULED, CAPACITY) and c.status == "False")
        and not (c.type == BLOCKED and c.status == "True")
    ]
    notice = condition(status, PREEMPTION_NOTICE)
    if notice is not None and notice.status == "True":
        set_condition(
            status,
            PREEMPTION_NOTICE,
            False,
            reason=reason,
            message=f"no rank runs: {message}",
            now=now,
            generation=generation,
        )


def condition(status: JobStatus, type_: str) -> Condition | None:
    """The condition of that type, if set."""
    return next((c for c in status.conditions if c.type == type_), None)


def forget_scheduling(status: JobStatus) -> None:
    """An attempt ended: ``PodsScheduled`` was about its ranks, none of which belong to the next
    attempt. It goes (False or True), so a backoff or a wait for capacity does not show the old
    ranks as unschedulable, nor as "every rank of attempt N is bound"; the next attempt's ranks
    set it again when one of them cannot be placed."""
    status.conditions = [c for c in status.conditions if c.type != PODS_SCHEDULED]
