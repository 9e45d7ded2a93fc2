"""The job's mean time between interruptions, passed to each attempt as ``RTJ_MTBI_SECONDS``.

The runtime's ``interval="auto"`` sets its save interval by Young-Daly from its own save cost
and this figure (trainer_runtime/save/auto_interval.py). The operator computes it because only the
operator sees the job's whole history: the time its gangs were up (the goodput account's
starting, training and restarting seconds) over its preemptions and failures, smoothed by a
one-hour prior counted as one interruption, so a job never interrupted sees its estimate grow with
its run time instead of staying at the prior, and one interruption early on does not swing it to
a few minutes. The count goes with it (``RTJ_INTERRUPTIONS``), so the runtime grows the figure
by its own time up as this rule would (``M + t / (n + 1)``). Its own module because the pod
manifests need it and must not import the goodput account's dependencies (a cycle). Rejected:
the spacing of ``status.interruptions`` (bounded to the last 20 and blind to waits between them,
which no gang was up to lose).
"""

from __future__ import annotations

from ..api.status_types import JobStatus

PRIOR_MTBI_SECONDS = 3600.0
"""The mean time between interruptions assumed before the job's first interruption."""


def mtbi_seconds(status: JobStatus) -> float:
    """The job's mean time between interruptions, in seconds: ``(up + prior) / (n + 1)``, with
    ``up`` the closed time its gangs were up (the goodput account's starting, training and
    restarting seconds; 0 without an account), ``n`` its preemptions and failures (retried
    ones too) and the one-hour prior counted as one interruption. Before any: the prior, then
    more as the job runs without one."""
    account = status.goodput
    up = 0.0
    if account is not None:
        up = account.starting_seconds + account.training_seconds + account.restarting_seconds
    return (up + PRIOR_MTBI_SECONDS) / (interruptions(status) + 1)


def interruptions(status: JobStatus) -> int:
    """The interruptions ``mtbi_seconds`` counts (``RTJ_INTERRUPTIONS``): preemptions and
    failures, retried ones too (a suspend, a grow or an unschedulable restart is none)."""
    return status.preemptions + status.failures + status.retries
