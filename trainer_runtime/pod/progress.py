"""Rank 0 tells the operator how far training got, by annotating its own pod.

The termination message (``pod/reporting.py``) only reaches the API server when a container ends
normally; when a node is lost it never does. So rank 0 also keeps the annotation
``resumable.dev/progress`` on its pod current: the last committed checkpoint (at once after each
commit) and the current step (every ``interval_s``, default 2 s, and at once on SIGTERM or a
notice). The operator reads it to resume from the right checkpoint, to count the steps an
interruption lost and to show the job's progress and ETA (``total_steps``, when the runtime
knows the job's total work, and ``current_sample``, for a rate in samples), so the step must
stay current whatever the commit rate: the cadence is a fixed clock that commits do not reset.
(It was a wait restarted by each commit: with commits more often than the interval, only each
commit's step was ever sent, and every loss without notice recorded ``stepsLost`` 0 however
many steps it rolled back.)

It patches its own pod (``pod/own_pod.py``) from a daemon thread: training never waits on the API
server, and a failure is logged once, not raised.

A commit that an earlier worker of the same pod reported is carried (``carried_commit``) until
this worker commits itself: the save of a survivor's memory is reported just before its worker
ends, and the agent's next worker would otherwise overwrite it before the operator has read it,
leaving the loss counted from an older commit. A survivor that is not rank 0 reports its save as
well (``report_commit_once``): rank 0's node may be the one lost.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .. import envvars
from ..run import arguments
from .own_pod import PATCH_ERRORS, OwnPod

log = logging.getLogger(__name__)
DEFAULT_INTERVAL_S = 2.0


def interval_from(env: dict[str, str]) -> float:
    """``RTJ_PROGRESS_INTERVAL_SECONDS``, or the default; a value that is not a positive number
    is a ``ConfigError`` naming the variable."""
    return arguments.environment_seconds(
        envvars.PROGRESS_INTERVAL_SECONDS,
        env,
        DEFAULT_INTERVAL_S,
        "a positive number of seconds",
        lambda s: s > 0,
    )


class ProgressReporter:
    def __init__(
        self, *, interval_s: float | None = None, environ: dict[str, str] | None = None
    ) -> None:
        env = dict(os.environ if environ is None else environ)
        self.interval_s = interval_from(env) if interval_s is None else interval_s
        self.own_pod = OwnPod(env)
        attempt = env.get(envvars.ATTEMPT, "").strip()
        # Every report says its attempt: a kept pod's old workers go on reporting after the pod
        # was relabelled into the next attempt, and the operator must not take their steps for
        # the new gang's (decide/progress.trained_since_resume).
        self._attempt = int(attempt) if attempt.isdigit() else None
        self.enabled = self.own_pod.enabled
        self._state: dict[str, Any] = {}
        self._sent: dict[str, Any] | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._warned = False
        self._thread: threading.Thread | None = None
        self._carried: str | None = None
        self._looked = False

    def _ensure_thread(self) -> None:
        if self._thread is None and self.enabled:
            self._thread = threading.Thread(target=self._run, name="rtj-progress", daemon=True)
            self._thread.start()

    def step(self, current_step: int, current_sample: int | None = None) -> None:
        """Cheap: records the step (and the global sample count, when counted); the thread
        sends it on its next tick."""
        if self.enabled:
            self._state["current_step"] = current_step
            if current_sample:
                self._state["current_sample"] = current_sample
            self._ensure_thread()

    def total(self, total_steps: int | None) -> None:
        """The job's total steps (None: unknown), sent with the next report."""
        if total_steps is None:
            self._state.pop("total_steps", None)
        else:
            self._state["total_steps"] = int(total_steps)

    def send_now(self, current_step: int | None = None) -> None:
        """Send the current step at once (SIGTERM or a notice: the node may go any moment)."""
        if self.enabled:
            if current_step is not None:
                self._state["current_step"] = current_step
            self._ensure_thread()
            self._wake.set()

    def continued(self, step: int) -> None:
        """The gang went on in process from ``step`` after a loss (``run/rejoin.py``): said
        with every report of this attempt, so the operator counts no step before it as lost."""
        if self.enabled:
            self._state["continued_from"] = int(step)
            self._ensure_thread()
            self._wake.set()

    def committed(self, record: dict[str, Any]) -> None:
        """A checkpoint committed: send now."""
        if self.enabled:
            self._state.update(record)
            self._state["current_step"] = max(
                record.get("step", 0), self._state.get("current_step", 0)
            )
            self._ensure_thread()
            self._wake.set()

    def _run(self) -> None:
        tick = time.monotonic() + self.interval_s
        while not self._stop.is_set():
            self._wake.wait(max(0.0, tick - time.monotonic()))
            self._wake.clear()
            self.flush()
            now = time.monotonic()
            if now >= tick:  # a wake-up for a commit does not move the clock
                tick = now + self.interval_s

    def flush(self) -> None:
        state = dict(self._state)
        if not state:
            return
        if self._attempt is not None:
            state.setdefault("attempt", self._attempt)
        if state == self._sent:
            return
        state["reported_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        text = json.dumps(state)
        if "checkpoint" not in state and (carried := self._earlier_commit()):
            text = f"{carried}\n{text}"
        try:
            self._send({envvars.PROGRESS_ANNOTATION: text})
            self._sent = {k: v for k, v in state.items() if k != "reported_at"}
        except PATCH_ERRORS as exc:
            if not self._warned:
                log.warning("cannot report progress to the API server (%s); training goes on", exc)
                self._warned = True

    def _send(self, annotations: dict[str, str]) -> None:
        self.own_pod.annotate(annotations)

    def _earlier_commit(self) -> str | None:
        """The commit an earlier worker of this pod reported, read once (``carried_commit``)."""
        if not self._looked:
            self._looked = True
            try:
                text = self.own_pod.annotations().get(envvars.PROGRESS_ANNOTATION)
            except (*PATCH_ERRORS, ValueError):
                text = None
            self._carried = carried_commit(text, self._attempt)
        return self._carried

    def close(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._wake.set()
            self._thread.join(timeout=5)
            self._thread = None
        if self.enabled:
            self.flush()


COMMIT_KEYS = ("checkpoint", "uri", "step", "epoch", "sample", "time", "world_size", "attempt")
"""What a commit's report says (``pod/reporting.commit_record``)."""


def carried_commit(annotation: str | None, attempt: int | None) -> str | None:
    """The newest commit report in a progress annotation that an earlier attempt's worker
    wrote, as one JSON line of its commit fields; None when there is none, when it is this
    ``attempt``'s own (nothing to carry) or when either attempt is unknown."""
    if attempt is None:
        return None
    for line in reversed((annotation or "").strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if not isinstance(data, dict) or not data.get("checkpoint") or "step" not in data:
            continue
        said = data.get("attempt")
        if not isinstance(said, int) or isinstance(said, bool) or said == attempt:
            return None
        return json.dumps({k: data[k] for k in COMMIT_KEYS if k in data})
    return None


def report_commit_once(record: dict[str, Any]) -> None:
    """Put one commit's report on this pod's progress annotation now, from a worker that keeps
    no reporter (a survivor other than rank 0 that saved for the new gang); best effort."""
    reporter = ProgressReporter()
    if reporter.enabled:
        reporter.committed(record)
        reporter.close()


@dataclass
class TotalWork:
    """The job's total steps, as far as the runtime can know them: given (``total_steps=``,
    ``RTJ_TOTAL_STEPS``, ``steps(total)``), or ``epochs`` times the steps of one epoch (given
    as ``steps_per_epoch``, else learned when the first epoch ends: the runtime does not know
    how many batches a loader yields before it has seen them). None while unknown."""

    steps: int | None = None
    epochs: int | None = None
    steps_per_epoch: int | None = None

    def known(self) -> int | None:
        if self.steps is not None:
            return self.steps
        if self.epochs is not None and self.steps_per_epoch is not None:
            return self.epochs * self.steps_per_epoch
        return None

    def epoch_ended(self, batch: int, epoch: int) -> bool:
        """Learn the steps per epoch at an epoch's end (``batch`` global steps after ``epoch``
        epochs); True when that made the total known."""
        if self.steps is not None or self.epochs is None or self.steps_per_epoch is not None:
            return False
        if epoch < 1 or batch < 1:
            return False
        self.steps_per_epoch = max(1, batch // epoch)
        return True
