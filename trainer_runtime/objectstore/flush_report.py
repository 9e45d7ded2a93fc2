"""What the uploader says about itself: its counters, what its worker waits on, and the log
of a flush (what is still pending, and whether the store is hung rather than failing).

Split from ``uploader.py`` so that the worker's loop stays readable; a hung store (it takes
connections and never answers) says nothing on its own, so the wait is named here.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from .uri import S3Uri

log = logging.getLogger("trainer_runtime.objectstore.uploader")


@dataclass(frozen=True)
class InFlight:
    """What the worker is waiting on: an upload of ``checkpoint``, or the prune after it."""

    checkpoint: str
    since: float
    pruning: bool = False


@dataclass
class UploadStats:
    """Counters a training loop or an exporter can read; updated by the worker thread."""

    submitted: int = 0
    uploaded: int = 0
    """Checkpoints whose upload (this rank's share; on the leader, the commit) completed."""
    failures: int = 0
    """Failed attempts, each logged as a warning; the checkpoint is retried."""
    consecutive_failures: int = 0
    abandoned: int = 0
    """Checkpoints dropped because a local file was missing or corrupt (never retried)."""
    bytes_uploaded: int = 0
    last_uploaded: str | None = None
    last_error: str | None = None

    def abandon(self, error: str) -> None:
        """A checkpoint dropped, never retried."""
        self.abandoned += 1
        self.last_error = error

    def fail(self, error: str) -> None:
        """A failed attempt; the checkpoint is retried."""
        self.failures += 1
        self.consecutive_failures += 1
        self.last_error = error

    def succeed(self, name: str, sent: int) -> None:
        """A checkpoint uploaded, ``sent`` bytes of it in this attempt."""
        self.uploaded += 1
        self.consecutive_failures = 0
        self.bytes_uploaded += sent
        self.last_uploaded = name


def inflight_note(inflight: InFlight | None, keep_remote: int) -> str:
    """Says so when the current attempt (an upload, or the prune after one: the checkpoint
    is then committed) is waiting on a store that does not answer."""
    if inflight is None:
        return ""
    what = f"the upload of {inflight.checkpoint}"
    if inflight.pruning:
        what = (
            f"pruning older remote checkpoints (keep_remote={keep_remote}) "
            f"after {inflight.checkpoint} was committed"
        )
    return (
        f"; {what} has been waiting {time.monotonic() - inflight.since:.1f}s for the store, "
        "with no reply and no error: the store is hung or unreachable"
    )


def log_flush(
    run_uri: S3Uri, still: list[str], took: float, stats: UploadStats, *, note: str, pruning: bool
) -> None:
    """Log a flush's outcome: a warning naming what is still pending, or a prune still
    waiting on the store after every upload is done; else one info line."""
    if still:
        failures = (
            f"; {stats.failures} failed attempt(s), last error: {stats.last_error}"
            if stats.failures
            else ""  # a hung store fails nothing: the note says what the upload waits on
        )
        log.warning(
            "object store: %d checkpoint(s) still not uploaded to %s after %.1fs: %s "
            "(kept locally%s)%s",
            len(still),
            run_uri,
            took,
            ", ".join(still),
            failures,
            note,
        )
    elif pruning:
        log.warning(
            "object store: all submitted checkpoints are uploaded to %s (%d, waited %.1fs)%s",
            run_uri,
            stats.uploaded,
            took,
            note,
        )
    else:
        log.info(
            "object store: all submitted checkpoints are uploaded to %s (%d, waited %.1fs)",
            run_uri,
            stats.uploaded,
            took,
        )
