"""The upload queue: which committed checkpoints still have to reach the store, in what order.

One queue per uploader, shared by the training thread (``put``, ``is_pending``, the emergency
path's ``move_first``) and the upload worker (``next``, ``done``). A checkpoint is *pending*
from ``put`` until its last job is ``done``: queued, uploading, or waiting to retry. Local
retention asks ``is_pending`` before deleting a folder, so the count is per checkpoint name, not
per job (a resubmission of the same name keeps it pending until both jobs are done).
(Rejected: a ``queue.Queue``, which cannot reorder for the emergency path nor say whether a
checkpoint is anywhere in it.)
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..run_folder.layout import progress_key
from ..save.manifest import Manifest


@dataclass
class UploadJob:
    """One rank's share of one checkpoint, to upload (and, on the leader, commit)."""

    local_dir: Path
    manifest: Manifest
    rank: int
    attempts: int = 0
    resumed: bool = False
    """Submitted again after a restart: some files may be remote already."""
    submitted_at: float = field(default_factory=time.monotonic)

    @property
    def name(self) -> str:
        return self.manifest.name


class UploadQueue:
    """Jobs in upload order, and the names that are pending; thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._jobs: collections.deque[UploadJob] = collections.deque()
        self._pending: dict[str, int] = {}  # name -> number of queued/in-flight jobs

    def put(self, job: UploadJob) -> None:
        with self._cond:
            self._jobs.append(job)
            self._pending[job.name] = self._pending.get(job.name, 0) + 1
            self._cond.notify_all()

    def is_pending(self, name: str) -> bool:
        with self._cond:
            return name in self._pending

    def pending(self) -> list[str]:
        with self._cond:
            return list(self._pending)

    def pending_other(self, name: str, current: UploadJob) -> bool:
        """Pending for a job other than ``current`` (a re-submission of the same name)."""
        with self._cond:
            return self._pending.get(name, 0) > (1 if name == current.name else 0)

    def next(self, stop: threading.Event) -> UploadJob | None:
        """The job at the head, left in the queue until ``done``; None once ``stop`` is set."""
        with self._cond:
            while not self._jobs and not stop.is_set():
                self._cond.wait()
            return None if stop.is_set() else self._jobs[0]

    def done(self, job: UploadJob) -> None:
        """The head job is finished (uploaded, abandoned or stopped)."""
        with self._cond:
            self._jobs.popleft()
            self._forget(job.name)
            self._cond.notify_all()

    def wait_empty(self, timeout: float | None, stop: threading.Event) -> list[str]:
        """Wait until nothing is pending, ``stop`` is set or ``timeout`` s have passed;
        returns the names still pending."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending and not stop.is_set():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._cond.wait(1.0 if left is None else min(left, 1.0))
            return list(self._pending)

    def wake(self) -> None:
        """Wake every waiter (after ``stop`` is set)."""
        with self._cond:
            self._cond.notify_all()

    def move_first(self, name: str) -> list[str]:
        """Put ``name`` right after the job in progress and drop the queued jobs of older
        checkpoints (by training progress); returns the names dropped, sorted."""
        with self._cond:
            if not self._jobs:
                return []
            head, rest = self._jobs[0], list(self._jobs)[1:]
            first = [j for j in rest if j.name == name]
            if not first:
                return []
            key = progress_key(first[0].manifest)
            dropped = [j for j in rest if j.name != name and progress_key(j.manifest) < key]
            kept = [j for j in rest if j.name != name and j not in dropped]
            self._jobs = collections.deque([head, *first, *kept])
            for job in dropped:
                self._forget(job.name)
            self._cond.notify_all()
        return sorted({j.name for j in dropped})

    def _forget(self, name: str) -> None:
        count = self._pending.get(name, 1) - 1
        if count > 0:
            self._pending[name] = count
        else:
            self._pending.pop(name, None)
