"""Learn the last committed checkpoint from what the runtime reports.

The runtime reports each commit twice (contract with ``trainer_runtime``): a one-line JSON in the
training container's termination-message file, which the kubelet copies into the pod status when
the container ends, and, best effort, the same JSON plus ``current_step`` in the pod annotation
``resumable.dev/progress``. The annotation is what survives a node loss (no kubelet is left to
publish a termination message); the termination message is what survives a runtime without API
credentials. The operator reads both and keeps the newest, in the runtime's order of progress
(``progress_order``). Rank 0's annotation also carries the job's total steps, when the
runtime knows them, and its global sample count: ``live_report``, for ``status.progress``.

The annotation also tells whether the current attempt's gang has trained since its resume
(``trained_since_resume``): a grow is asked only of a gang that has, since one asked of a gang
still loading its checkpoint throws that load away. Every pod is one attempt's, created without
the annotation, so whatever it holds was written by that attempt's runtime; a pod that is Running
says nothing of the trainer inside it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..api.envvars import PROGRESS_ANNOTATION
from ..api.status_types import (
    MAX_KNOWN_CHECKPOINTS,
    CheckpointRecord,
    Interruption,
    SizeRecord,
)
from .classify import training_container_name


@dataclass(frozen=True)
class Report:
    """One progress report from one rank."""

    checkpoint: str
    step: int
    uri: str | None = None
    epoch: int | None = None
    sample: int | None = None
    time: str | None = None
    current_step: int | None = None
    world_size: int | None = None
    attempt: int | None = None
    """The attempt whose runtime committed it, when the report says (``RTJ_ATTEMPT``): a kept
    pod is relabelled into the next attempt while its old worker may still commit (the save
    of a survivor's memory, trainer_runtime/save/survivor.py)."""

    def of_attempt(self, labelled: int | None) -> int | None:
        """The report's own attempt, else the one of the pod that carries it."""
        return self.attempt if self.attempt is not None else labelled

    def record(self, attempt: int | None) -> CheckpointRecord:
        """The status form of the checkpoint this report announces (``attempt``: the pod's;
        the report's own wins)."""
        attempt = self.of_attempt(attempt)
        return CheckpointRecord(
            name=self.checkpoint,
            uri=self.uri,
            step=self.step,
            epoch=self.epoch,
            sample=self.sample,
            time=self.time,
            attempt=attempt,
            world_size=self.world_size,
        )


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def parse_report(text: str | None) -> Report | None:
    """The last line of ``text`` that is a valid report; None when there is none.

    Lenient on purpose: a termination message may hold log lines (FallbackToLogsOnError) or a
    truncated write, and one bad report must never break reconciliation.
    """
    if not text:
        return None
    for line in reversed(text.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        name, step = data.get("checkpoint"), _int(data.get("step"))
        if not isinstance(name, str) or not name or step is None:
            continue
        uri = data.get("uri")
        return Report(
            checkpoint=name,
            step=step,
            uri=uri if isinstance(uri, str) and uri else None,
            epoch=_int(data.get("epoch")),
            sample=_int(data.get("sample")),
            time=data.get("time") if isinstance(data.get("time"), str) else None,
            current_step=_int(data.get("current_step")),
            world_size=_int(data.get("world_size")),
            attempt=_int(data.get("attempt")),
        )
    return None


def annotation_json(pod: Mapping[str, Any] | None, key: str) -> dict[str, Any] | None:
    """The pod's annotation ``key`` as a JSON object (its last line that is one: the runtime's
    progress may carry several), or None when absent or not an object."""
    text = (((pod or {}).get("metadata") or {}).get("annotations") or {}).get(key)
    for line in reversed((text or "").strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return None


def _progress_json(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pod's progress annotation as a JSON object (the last line that is one), also before
    the attempt's first commit, when it holds only ``current_step``."""
    return annotation_json(pod, PROGRESS_ANNOTATION)


@dataclass(frozen=True)
class Live:
    """What rank 0's annotation says of the gang now: its step, its global samples, the job's
    total steps (when the runtime knows them) and when it sent them."""

    current_step: int | None
    current_sample: int | None
    total_steps: int | None
    reported_at: str | None


def live_report(pod: dict[str, Any]) -> Live | None:
    """The live figures of a pod's progress annotation; None without one."""
    data = _progress_json(pod)
    if data is None:
        return None
    total = _int(data.get("total_steps"))
    at = data.get("reported_at")
    return Live(
        current_step=_int(data.get("current_step")),
        current_sample=_int(data.get("current_sample")),
        total_steps=total if total is not None and total > 0 else None,
        reported_at=at if isinstance(at, str) else None,
    )


def trained_since_resume(
    pod: dict[str, Any],
    *,
    attempt: int,
    resume_checkpoint: str | None,
    resumed: CheckpointRecord | None,
) -> bool:
    """Whether a pod of the current attempt says its gang trained past the point it resumed
    from (``resume_checkpoint``, known as ``resumed``, or none).

    Trained: a step before the attempt's first commit (the runtime sends ``current_step`` alone
    after each step), a commit newer than the resume point (commits follow training), or a step
    past the commit it reports. Not trained: no annotation, or one that repeats the checkpoint it
    resumed from at that checkpoint's step (a save at the resume point), or one that says
    another ``attempt``: a kept pod is relabelled into the next attempt while its old workers
    still train (a warm join, until the switch) or save (a loss, a re-shrink). The step alone
    is never compared with the resumed checkpoint's: a resume at another world size rescales
    the step (``progress_order``), so the first step after it may be lower.
    """
    data = _progress_json(pod)
    if data is None:
        return False
    said = data.get("attempt")
    if isinstance(said, int) and said != attempt:
        return False  # a kept pod's old workers, still training or saving before the switch
    current = _int(data.get("current_step"))
    report = parse_report(json.dumps(data))
    if report is None:
        return current is not None
    if report.checkpoint != resume_checkpoint and (
        resumed is None or progress_order(report) > progress_order(resumed)
    ):
        return True
    return current is not None and current > report.step


def pod_reports(pod: dict[str, Any], container_name: str | None) -> list[Report]:
    """Reports found on one pod: its progress annotation and its termination message."""
    reports = []
    annotation = ((pod.get("metadata") or {}).get("annotations") or {}).get(PROGRESS_ANNOTATION)
    if (report := parse_report(annotation)) is not None:
        reports.append(report)
    container = training_container_name(pod, container_name)
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") != container:
            continue
        for state_key in ("state", "lastState"):
            terminated = (status.get(state_key) or {}).get("terminated") or {}
            if (report := parse_report(terminated.get("message"))) is not None:
                reports.append(report)
    return reports


class Progress(Protocol):
    """What orders a checkpoint: a report or a status record."""

    @property
    def step(self) -> int: ...
    @property
    def epoch(self) -> int | None: ...
    @property
    def sample(self) -> int | None: ...


def progress_order(record: Progress) -> tuple[int, int, int]:
    """How far training was at a checkpoint, in the runtime's order (its ``Timestamp``): the
    global sample count first, then the step, then the epoch. The sample count is the one
    counter a resume never moves back: a relaunch with a larger global batch rescales the step
    down (160 samples: step 10 at 16 a step, 5 at 32), so ordered by step the checkpoints it
    commits would look older than the one it resumed from. A run that counts no samples
    reports 0 and is ordered by its steps; an epoch-end save after the epoch's last step has
    the step of the save before it (``ep7-ba96``, ``ep8-ba96``) and is the newer one."""
    sample = record.sample if record.sample is not None else 0
    return sample, record.step, record.epoch if record.epoch is not None else -1


def merge_checkpoints(
    known: Iterable[CheckpointRecord], new: Iterable[CheckpointRecord]
) -> list[CheckpointRecord]:
    """Known checkpoints plus new ones, one per name, newest (``progress_order``) first,
    bounded."""
    by_name: dict[str, CheckpointRecord] = {}
    for record in [*known, *new]:
        current = by_name.get(record.name)
        order = progress_order(record)
        newer = current is None or order > progress_order(current)
        better = (
            current is not None and order == progress_order(current) and current.attempt is None
        )
        if newer or better:
            by_name[record.name] = record
    ordered = sorted(by_name.values(), key=progress_order, reverse=True)
    return ordered[:MAX_KNOWN_CHECKPOINTS]


def settle_losses(
    interruptions: Iterable[Interruption],
    records: Iterable[CheckpointRecord],
    size_history: Iterable[SizeRecord] = (),
) -> None:
    """Take a commit an interrupted attempt made after its interruption was seen (the save on
    SIGTERM, during the grace period, or a kept survivor's save of the last finished step) out
    of that interruption's ``stepsLost``, and out of the size history's entry for the attempt
    after it, which copied the count when it started.

    The loss is counted when the operator sees the interruption; the ended gang may still
    commit the steps it reached, and then nothing was lost. Only commits of the same attempt
    count (same step units); the steps reached stay what was reported at the time.
    """
    after = {record.attempt: record for record in size_history}
    by_attempt: dict[int, int] = {}
    for record in records:
        if record.attempt is not None:
            by_attempt[record.attempt] = max(
                by_attempt.get(record.attempt, record.step), record.step
            )
    for gone in interruptions:
        newest = by_attempt.get(gone.attempt)
        if newest is None or gone.steps_lost is None or gone.last_committed_step is None:
            continue
        if newest > gone.last_committed_step:
            reached = gone.last_committed_step + gone.steps_lost
            gone.last_committed_step = newest
            gone.steps_lost = max(0, reached - newest)
            entry = after.get(gone.attempt + 1)
            if entry is not None and entry.steps_lost is not None:
                entry.steps_lost = min(entry.steps_lost, gone.steps_lost)


def settle_continued(
    interruptions: Iterable[Interruption],
    size_history: Iterable[SizeRecord],
    pods: Iterable[dict[str, Any]],
    attempt: int,
) -> None:
    """Take the steps a gang kept in process out of the interruption before its attempt: after
    a loss the kept workers rejoin in process (``stop: rejoin``) and go on from the last step
    they finished, which nobody committed; rank 0 reports it once as ``continued_from``."""
    said = [
        step
        for pod in pods
        if (data := _progress_json(pod)) is not None
        and data.get("attempt") == attempt
        and (step := _int(data.get("continued_from"))) is not None
    ]
    if not said:
        return
    for gone in interruptions:
        if gone.attempt != attempt - 1 or gone.steps_lost is None:
            continue
        if gone.last_committed_step is None:
            continue
        reached = gone.last_committed_step + gone.steps_lost
        gone.steps_lost = min(gone.steps_lost, max(0, reached - max(said)))
        for entry in size_history:
            if entry.attempt == attempt and entry.steps_lost is not None:
                entry.steps_lost = min(entry.steps_lost, gone.steps_lost)


def comparable_step(
    step: int | None,
    last: CheckpointRecord | None,
    *,
    world_size: int | None,
    committed_here: bool,
) -> int | None:
    """``step`` when it counts in the same units as ``last`` (the newest commit), else None.

    A gang resumed at another world size may train at another global batch, and the runtime
    then rescales its step (``progress_order``): until the gang commits itself, its steps and
    the last commit's do not subtract (a 2-rank gang at step 101 after a 4-rank commit at step
    50 of twice the batch lost 1 step, not 51). Unknown is better than wrong there.
    """
    if step is None or last is None or committed_here:
        return step
    if last.world_size is None or world_size is None or last.world_size == world_size:
        return step
    return None


def highest_current_step(
    pods: Iterable[dict[str, Any]], container_name: str | None = None
) -> int | None:
    """The furthest step the gang said it reached (for the steps lost at an interruption): the
    annotation's ``current_step``, also before the attempt's first commit, when that is all it
    holds, and the step of every commit a pod reports."""
    steps = []
    for pod in pods:
        current = _int((_progress_json(pod) or {}).get("current_step"))
        if current is not None:
            steps.append(current)
        steps += [r.step for r in pod_reports(pod, container_name)]
    return max(steps) if steps else None
