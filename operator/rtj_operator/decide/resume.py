"""Where the next attempt resumes from, and when a checkpoint is quarantined.

RTJ_RESUME_FROM names a specific committed checkpoint when the operator knows one, so every rank
of the new gang loads the very same one even if the old gang is still finishing an emergency
save. Without one it is the run's root and the runtime resolves the newest valid checkpoint.

Quarantine handles the checkpoint that loads but poisons the run (NaN weights, a corrupt
optimizer state that passes checksums): when attempts keep failing soon after resuming from the
same checkpoint, without committing a newer one, that checkpoint is the likely cause. It is
recorded, passed to the runtime in RTJ_QUARANTINED, and the next attempt resumes from the one
before. A crash late in an attempt, or after a newer commit, never blames the checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from ..api.spec_types import ResumePolicy
from ..api.status_types import CheckpointRecord, ResumeFailures
from .progress import progress_order


def run_root(checkpoint_dir: str, run_name: str) -> str:
    """``<checkpointDir>/<runName>``: the folder holding every checkpoint of the run."""
    return f"{checkpoint_dir.rstrip('/')}/{run_name}"


def checkpoint_uri(checkpoint_dir: str, run_name: str, record: CheckpointRecord) -> str:
    """Full URI of a checkpoint: as the runtime reported it, else built from the layout."""
    return record.uri or f"{run_root(checkpoint_dir, run_name)}/{record.name}"


@dataclass(frozen=True)
class ResumePoint:
    """RTJ_RESUME_FROM for an attempt, and the checkpoint name when it is a specific one."""

    uri: str
    checkpoint: str | None


def resume_point(
    attempt: int,
    checkpoint_dir: str,
    run_name: str,
    known: Iterable[CheckpointRecord],
    quarantined: Iterable[str],
) -> ResumePoint:
    """Empty for attempt 0; else the newest known non-quarantined checkpoint, else the root."""
    if attempt == 0:
        return ResumePoint("", None)
    bad = set(quarantined)
    usable = sorted((r for r in known if r.name not in bad), key=progress_order, reverse=True)
    if usable:
        return ResumePoint(checkpoint_uri(checkpoint_dir, run_name, usable[0]), usable[0].name)
    return ResumePoint(run_root(checkpoint_dir, run_name), None)


@dataclass(frozen=True)
class QuarantineDecision:
    """Outcome of one failure for the quarantine bookkeeping."""

    resume_failures: ResumeFailures | None
    quarantine: str | None
    """The checkpoint to quarantine now, if any."""


def after_failure(
    policy: ResumePolicy,
    *,
    resumed_from: str | None,
    committed_this_attempt: str | None,
    attempt_started: datetime | None,
    failed_at: datetime,
    previous: ResumeFailures | None,
) -> QuarantineDecision:
    """Count a failure against the checkpoint the attempt resumed from; quarantine at threshold."""
    soon = (
        attempt_started is not None
        and (failed_at - attempt_started).total_seconds() <= policy.quarantine_window_seconds
    )
    if (
        policy.quarantine_threshold <= 0
        or resumed_from is None
        or committed_this_attempt is not None
        or not soon
    ):
        return QuarantineDecision(None, None)
    count = previous.count + 1 if previous and previous.checkpoint == resumed_from else 1
    if count >= policy.quarantine_threshold:
        return QuarantineDecision(None, resumed_from)
    return QuarantineDecision(ResumeFailures(checkpoint=resumed_from, count=count), None)
