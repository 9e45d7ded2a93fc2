"""The job's mean time between interruptions, passed to each attempt as ``RTJ_MTBI_SECONDS``.

The runtime's ``interval="auto"`` sets its save interval by Young-Daly from its own save cost and
this figure (trainer_runtime/save/auto_interval.py). The operator computes it because only the
operator sees the job's whole history: the time its gangs trained (the goodput account's training
seconds) over its interruptions, smoothed by a one-hour prior counted as one interruption, so a job
never interrupted sees its estimate grow with its run time instead of staying at the prior, and one
interruption early on does not swing it to a few minutes. The count goes with it
(``RTJ_INTERRUPTIONS``), so the runtime grows the figure by its own time up as this rule would
(``M + t / (n + 1)``). Its own module because the pod manifests need it and must not import the
goodput account's dependencies (a cycle).

Only preemptions and failures that rolled work back count (``status.goodput.rollbacks``, and the
pending one, not yet settled); a grow, a re-shrink or a suspend is planned, whatever it lost.
Young-Daly's M is the time between losses that send the job back to its last periodic
checkpoint; a loss that an emergency save on a notice or a survivor's save from memory covered
(``recovery.survivors: Stay``) cost no rollback, and counting it would make the job save more
often for nothing (at 64 nodes on replayed spot traces: an interval of 1-2 minutes instead of
12-65, and 2-6.5 points of goodput, docs/goodput.md). A job without a goodput account counts its
preemptions and failures, as before that account existed.

Rejected: the spacing of ``status.interruptions`` (bounded to the last 20 and blind to waits
between them, which no gang was up to lose).
"""

from __future__ import annotations

from ..api.status_types import JobStatus

PRIOR_MTBI_SECONDS = 3600.0
"""The mean time between interruptions assumed before the job's first interruption."""


def mtbi_seconds(status: JobStatus) -> float:
    """The job's mean time between interruptions that rolled work back, in seconds:
    ``(trained + prior) / (n + 1)``, with ``trained`` the closed time its gangs trained (the
    goodput account's training seconds; 0 without an account), ``n`` the interruptions it
    counts (``interruptions``) and the one-hour prior counted as one interruption. Before any:
    the prior, then more as the job trains without one. Training time, not the time gangs were
    up: only a gang that trained has work to roll back, so only its time is exposed."""
    account = status.goodput
    trained = account.training_seconds if account is not None else 0.0
    return smoothed_mean_seconds(trained, interruptions(status))


def smoothed_mean_seconds(trained_s: float, count: int) -> float:
    """``trained_s`` over ``count`` events, the one-hour prior counted as one more:
    ``(trained + prior) / (count + 1)`` (also ``grow_payoff.py``'s time between losses)."""
    return (trained_s + PRIOR_MTBI_SECONDS) / (count + 1)


def interruptions(status: JobStatus) -> int:
    """The interruptions ``mtbi_seconds`` counts (``RTJ_INTERRUPTIONS``): preemptions and failures
    that rolled work back (``goodput.rollbacks``), and the one still pending, whose loss is
    not settled yet and counts until it is (a grow, a re-shrink or a suspend never). Without
    a goodput account: preemptions and failures, retried ones too (a suspend, a grow or an
    unschedulable restart is none)."""
    account = status.goodput
    if account is None:
        return status.preemptions + status.failures + status.retries
    pending = account.pending_rollback
    return account.rollbacks + (pending is not None and pending.unplanned)
