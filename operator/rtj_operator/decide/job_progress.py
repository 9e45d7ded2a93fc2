"""``status.progress``: how far a job is, how fast it trains, and when it should end.

Rank 0 reports its step every few seconds (``resumable.dev/progress``) and, when the runtime
knows it, the job's total steps. The percentage is one over the other. The rate is measured
over the recent reports of the current gang only: the window is emptied when a new attempt
starts, so the time without a running gang (waits for capacity, restarts, backoff) never enters
it, and a rate is never averaged across gangs of another size. Until the new gang reported twice
the previous gang's rate stands. The estimate of the time left is the steps left over that rate,
and only while a gang trains: while the job waits for capacity, backs off or is being
resubmitted nobody knows how long that lasts, so ``etaSeconds`` is absent and the ETA column
names the state instead of a number that would be wrong.

Its companion ``mtbi`` gives each attempt the job's mean time between interruptions, for the
runtime's ``interval="auto"``.

Rejected: a rate from the commits alone (``goodput.samplesPerSecond``: commits may be an hour
apart, and it needs sample counts), and a rate over the job's whole life (it would count waits
and restarts as slow training, and the ETA would promise the past's interruptions again).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ..api.status_types import (
    MAX_PROGRESS_POINTS,
    TERMINAL_PHASES,
    Activity,
    JobProgress,
    JobStatus,
    Phase,
    ProgressPoint,
)
from ..api.timeutil import parse_time
from .goodput import activity, human_duration
from .progress import live_report

RATE_WINDOW_SECONDS = 300.0
"""The rate is measured over the current gang's reports of the last five minutes."""
MIN_POINT_SPACING_SECONDS = 10.0
"""A report is kept for the rate at most this often (the status stays small)."""


def update(status: JobStatus, rank0: dict[str, Any] | None, *, now: datetime) -> None:
    """Bring ``status.progress`` up to date with the current attempt's rank-0 pod (``rank0``,
    None when it does not exist) and the status the pass ends with."""
    live = live_report(rank0) if rank0 is not None else None
    doing = activity(status, now)
    current = status.progress or JobProgress(state=doing)
    progress = current.model_copy(deep=True)
    progress.state = doing
    if live is not None and live.total_steps is not None:
        progress.total_steps = live.total_steps
    if doing is Activity.TRAINING and live is not None and live.current_step is not None:
        at = parse_time(live.reported_at) or now
        _observe(
            progress,
            status.attempt,
            ProgressPoint(time=at, step=live.current_step, sample=live.current_sample),
        )
    _figures(progress, status)
    if progress.model_dump(mode="json") != (
        None if status.progress is None else status.progress.model_dump(mode="json")
    ):
        status.progress = progress


def _observe(progress: JobProgress, attempt: int, point: ProgressPoint) -> None:
    """Keep ``point`` in the window of ``attempt`` (a new attempt empties it) when it is newer
    than the last kept one by the spacing, and drop the reports older than the rate window
    (keeping two at least)."""
    if progress.attempt != attempt:
        progress.attempt, progress.window = attempt, []
    window = progress.window
    if window:
        last = window[-1]
        if point.step < last.step:  # a rescaled resume; the attempt is new, so never here
            window.clear()
        elif (point.time - last.time).total_seconds() < MIN_POINT_SPACING_SECONDS:
            return
    window.append(point)
    horizon = point.time - timedelta(seconds=RATE_WINDOW_SECONDS)
    while len(window) > 2 and window[1].time <= horizon:
        window.pop(0)
    del window[:-MAX_PROGRESS_POINTS]
    _measure(progress)


def _measure(progress: JobProgress) -> None:
    window = progress.window
    if len(window) < 2:
        return
    first, last = window[0], window[-1]
    seconds = (last.time - first.time).total_seconds()
    if seconds <= 0:
        return
    progress.rate_seconds = round(seconds, 1)
    progress.steps_per_second = round((last.step - first.step) / seconds, 4)
    if first.sample is not None and last.sample is not None and last.sample >= first.sample:
        progress.samples_per_second = round((last.sample - first.sample) / seconds, 3)
    else:
        progress.samples_per_second = None


def _figures(progress: JobProgress, status: JobStatus) -> None:
    last = status.last_committed_checkpoint
    step = status.current_step
    if step is None and last is not None:
        step = last.step
    progress.step = step
    total = progress.total_steps
    if total and step is not None:
        fraction = min(step / total, 1.0)
        progress.fraction = round(fraction, 4)
        progress.percent = f"{int(fraction * 100)}%"
    else:
        progress.fraction = progress.percent = None
    progress.eta_seconds = None
    if status.phase in TERMINAL_PHASES:
        progress.reason = (status.phase or Phase.FAILED).value
    elif progress.state is not Activity.TRAINING:
        progress.reason = progress.state.value
    elif not total or step is None:
        progress.reason = "TotalUnknown"
    elif not progress.steps_per_second or progress.steps_per_second <= 0:
        progress.reason = "RateUnknown"
    else:
        progress.reason = None
        progress.eta_seconds = round(max(total - step, 0) / progress.steps_per_second, 1)
    progress.eta = (
        human_duration(progress.eta_seconds)
        if progress.eta_seconds is not None
        else progress.reason
    )
