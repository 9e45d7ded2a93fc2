"""Background upload of committed checkpoints: a queue, retries, and the local copies.

Training is never blocked: ``submit`` only queues. One worker thread per process uploads the
queue in order, one checkpoint at a time, each in the order that keeps the remote copy valid
(``remote_commit.py``: every rank's data, then the manifest, then ``latest.json``); a failure is
logged as a warning, counted, and retried with backoff for as long as the process lives, and
the checkpoint stays *pending*, so local retention must keep it (``is_pending``). ``flush`` at
exit waits a bounded time and logs what is still pending. The queue and the pending names are
``upload_queue.py``'s; the counters and the flush's log are ``flush_report.py``'s.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .. import events
from ..errors import ManifestError, StaleMembershipError
from ..run import arguments
from ..run_folder.layout import RunFolder
from ..save.manifest import MANIFEST_NAME, Manifest
from .errors import LocalDataError, ObjectStoreError
from .flush_report import InFlight, UploadStats, inflight_note, log_flush
from .local_copies import UploadedLocalCopies
from .remote_commit import RemoteCommitter, not_committed_remotely
from .retry import Backoff
from .store import S3Store
from .upload_queue import UploadJob, UploadQueue
from .uri import S3Uri, parse_s3_uri

log = logging.getLogger(__name__)


def check_retention(keep_local: object, keep_remote: object) -> None:
    """A ``ConfigError`` naming ``keep_local`` or ``keep_remote`` when it is no retention
    count (checked before the store is asked anything)."""
    arguments.optional_integer("keep_local", keep_local, "a count >= 0", lambda n: n >= 0)
    arguments.integer(
        "keep_remote", keep_remote, "-1 (keep all) or a count >= 1", lambda n: n == -1 or n >= 1
    )


class CheckpointUploader:
    """Uploads this rank's share of each submitted checkpoint; the leader also commits it."""

    def __init__(
        self,
        store: S3Store,
        remote_run: S3Uri | str,
        *,
        rank: int = 0,
        world_size: int = 1,
        keep_local: int | None = None,
        keep_remote: int = -1,
        peer_timeout_s: float = 1800.0,
        backoff: Backoff | None = None,
        on_uploaded: Callable[[str], None] | None = None,
        leader_rank: int = 0,
    ) -> None:
        """``remote_run`` is the run folder ``s3://bucket/prefix/<run_name>``.

        ``keep_local``: None leaves local folders alone (the core's retention decides, asking
        ``is_pending``); N >= 0 keeps the newest N checkpoints this uploader has uploaded and
        deletes older ones (0 deletes each as soon as it is safely uploaded). ``keep_remote``:
        -1 keeps every remote checkpoint; N >= 1 prunes (on the leader) all but the newest N
        that verify, never the one ``latest.json`` names. ``peer_timeout_s`` bounds how long
        the leader waits for other ranks' files before counting the attempt as failed.
        """
        check_retention(keep_local, keep_remote)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} is outside world_size={world_size}")
        self.store = store
        self.run_uri = (
            remote_run
            if isinstance(remote_run, S3Uri)
            else parse_s3_uri(remote_run, arg="remote_run")
        )
        self.rank = rank
        self.world_size = world_size
        self.keep_local = keep_local
        self.backoff = backoff or Backoff(initial=1.0, maximum=60.0)
        self.on_uploaded = on_uploaded
        self.stats = UploadStats()
        self.queue = UploadQueue()
        self.local_copies = (
            None if keep_local is None else UploadedLocalCopies(keep_local, leader_rank)
        )
        self._stop = threading.Event()
        self._inflight: InFlight | None = None
        self._idle = threading.Event()  # no job and no prune in progress
        self._idle.set()
        # The committer owns the cross-rank commit settings (leader, peer wait, remote keep).
        self.committer = RemoteCommitter(
            store, self.run_uri, leader_rank, peer_timeout_s, keep_remote, self._stop
        )
        self._thread = threading.Thread(target=self._run, name=f"rtj-uploader-r{rank}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public API

    def submit(
        self,
        local_ckpt_dir: str | os.PathLike[str],
        manifest: Manifest | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        resumed: bool = False,
    ) -> None:
        """Queue a locally committed checkpoint; returns at once.

        ``manifest`` defaults to the folder's ``manifest.json``. ``rank``/``world_size``
        default to the constructor's and must agree with the manifest. ``resumed`` says a
        previous process may have uploaded some of its files already.
        """
        folder = Path(local_ckpt_dir)
        if manifest is None:
            manifest = Manifest.read(folder)
        rank = self.rank if rank is None else rank
        if world_size is not None and world_size != manifest.world_size:
            raise ValueError(
                f"world_size={world_size} but {manifest.name}'s manifest says {manifest.world_size}"
            )
        if not manifest.files_for_rank(rank):
            raise ManifestError(f"{manifest.name}'s manifest lists no file for rank {rank}")
        if self._stop.is_set():
            raise RuntimeError("uploader is closed")
        self.stats.submitted += 1
        self.queue.put(UploadJob(folder, manifest, rank, resumed=resumed))

    def resubmit_unsynced(self, local_run_dir: str | os.PathLike[str]) -> list[str]:
        """Queue the local checkpoints a previous attempt may not have finished uploading.

        Those newer than what the remote ``latest.json`` names (all, if it names none), newest
        first: the checkpoint a later resume would use reaches the store first (after an
        emergency exit with the store down, that is the emergency save); older ones follow, and
        ``latest.json`` never moves back. Files already uploaded are skipped by each job's HEAD
        check. The other local checkpoints (a resume's download among them) are in the bucket
        already: with ``keep_local`` they count among the uploaded ones. Call it once at
        start-up, after building the uploader. Returns the names queued.
        """
        local = RunFolder(Path(local_run_dir))
        newest_first = not_committed_remotely(self.store, self.run_uri, local, self.rank)
        for manifest in newest_first:
            folder = local.path(manifest.name)
            log.info("object store: resubmitting %s (not yet committed remotely)", folder)
            self.submit(folder, manifest, resumed=True)
        queued = [m.name for m in newest_first]
        if self.local_copies is not None:  # the rest is in the bucket: keep_local counts it
            for manifest in local.committed():
                if manifest.name not in queued and manifest.files_for_rank(self.rank):
                    self.local_copies.adopt(manifest, local.path(manifest.name))
        return queued

    def is_pending(self, name: str) -> bool:
        """True while checkpoint ``name`` is queued, uploading or waiting to retry."""
        return self.queue.is_pending(name)

    def pending(self) -> list[str]:
        return self.queue.pending()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until nothing is pending (at most ``timeout`` s); log and return the outcome."""
        start = time.monotonic()
        still = self.queue.wait_empty(timeout, self._stop)
        if not still:  # a prune may follow the last upload: within the same bound
            self._idle.wait(
                None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
            )
        inflight = self._inflight
        pruning = not self._idle.is_set() and inflight is not None and inflight.pruning
        log_flush(
            self.run_uri,
            still,
            time.monotonic() - start,
            self.stats,
            note=inflight_note(inflight, self.committer.keep_remote),
            pruning=pruning,
        )
        return not still

    def upload_first(self, name: str) -> list[str]:
        """Put ``name`` next in line and drop queued uploads of older checkpoints.

        For the emergency path: the newest checkpoint is the one the next attempt resumes from.
        The dropped ones stay committed locally; the next attempt's start-up resubmission
        (``resubmit_unsynced``) uploads them only if the store's pointer is still older (the
        emergency checkpoint did not make it either). An upload already in progress cannot be
        interrupted safely and finishes first. Returns the names dropped.
        """
        names = self.queue.move_first(name)
        if names:
            log.warning(
                "object store: uploading %s first; %s dropped from the upload queue (committed "
                "locally; uploaded by the next attempt only if %s does not reach the store)",
                name,
                ", ".join(names),
                name,
            )
        return names

    def worker_alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout: float | None = 60.0) -> bool:
        """Flush (bounded), then stop the worker, cancelling any transfer still running.

        The whole call stays within ``timeout`` (plus at most 0.5 s), even when a transfer
        thread is stuck on a store that does not answer; that thread is a daemon.
        """
        start = time.monotonic()
        ok = self.flush(timeout)
        if ok and self.local_copies is not None:
            # Copies no upload came to delete (a resume's download, with nothing saved after
            # it); asked with resume's short waits, the flush having just reached the store.
            self.local_copies.at_close(
                self.rank,
                still_pending=self.queue.is_pending,
                committed_remotely=lambda m: self._committed_remotely(m, self.store.responsive()),
            )
        self._stop.set()
        self.queue.wake()
        join = 10.0 if timeout is None else max(0.5, timeout - (time.monotonic() - start))
        self._thread.join(timeout=min(10.0, join))
        return ok

    # ------------------------------------------------------------------ worker

    def _run(self) -> None:
        while (job := self.queue.next(self._stop)) is not None:
            self._idle.clear()
            uploaded = self._process(job)
            self._inflight = None
            self.queue.done(job)  # uploaded (or given up): no longer pending, even if the
            if uploaded and self.committer.prunes(job.rank) and not self._stop.is_set():
                self._inflight = InFlight(job.name, time.monotonic(), pruning=True)
                self.committer.prune(job.name)  # prune after it hangs
                self._inflight = None
            self._idle.set()

    def _process(self, job: UploadJob) -> bool:
        """Upload one job, retrying until it succeeds (True), its data is bad, or we are
        stopped."""
        while not self._stop.is_set():
            job.attempts += 1
            self._inflight = InFlight(job.name, time.monotonic())
            try:
                # A first attempt skips the HEAD per file (the object is new; a stray one is
                # simply overwritten); a retry or a resubmission asks first, sends what is missing.
                retrying = job.attempts > 1 or job.resumed
                sent = self.committer.upload(
                    job.manifest, job.local_dir, job.rank, check_first=retrying
                )
            except (StaleMembershipError, LocalDataError) as exc:
                self.stats.abandon(str(exc))
                _log_given_up(self.run_uri, job, exc)
                return False
            except Exception as exc:
                if self._stop.is_set():
                    return False
                self.stats.fail(f"{type(exc).__name__}: {exc}")
                wait = self.backoff.delay(job.attempts - 1)
                _log_retry(self.run_uri, job, exc, wait, self.stats.consecutive_failures)
                self._stop.wait(wait)
                continue
            self.stats.succeed(job.name, sent)
            _report_uploaded(self.run_uri, job, sent)
            self._after_upload(job)
            return True
        return False

    def _after_upload(self, job: UploadJob) -> None:
        if self.on_uploaded is not None:
            try:
                self.on_uploaded(job.name)
            except Exception:
                log.exception("object store: on_uploaded callback failed for %s", job.name)
        if self.local_copies is not None:
            self.local_copies.uploaded(
                job.manifest,
                job.local_dir,
                job.rank,
                still_pending=lambda n: self.queue.pending_other(n, job),
                committed_remotely=self._committed_remotely,
            )

    def _committed_remotely(self, manifest: Manifest, store: S3Store | None = None) -> bool:
        """Whether the leader has committed ``manifest``'s checkpoint in the bucket (its
        manifest is there); False when the store cannot say. ``store``: another client of
        it (default: the uploads')."""
        try:
            uri = self.run_uri.join(manifest.name, MANIFEST_NAME)
            return (store or self.store).head(uri) is not None
        except ObjectStoreError:
            return False


def _log_given_up(run_uri: S3Uri, job: UploadJob, exc: Exception) -> None:
    """An upload that is never retried: a newer gang's fence, or a local file that does not
    match its manifest (the error names the file, and so the checkpoint, once)."""
    if isinstance(exc, StaleMembershipError):
        log.error("object store: not committed (never retried): %s", exc)
        return
    log.error(
        "object store: giving up on an upload to %s (rank %d; a local file that "
        "does not match its manifest is never retried): %s",
        run_uri,
        job.rank,
        exc,
    )


def _log_retry(run_uri: S3Uri, job: UploadJob, exc: Exception, wait: float, in_a_row: int) -> None:
    log.warning(
        "object store: upload of %s (rank %d) to %s failed (attempt %d, %d failure(s) "
        "in a row); kept locally, retrying in %.0fs: %s",
        job.name,
        job.rank,
        run_uri,
        job.attempts,
        in_a_row,
        wait,
        exc,
    )


def _report_uploaded(run_uri: S3Uri, job: UploadJob, sent: int) -> None:
    """The log line and the ``uploaded`` event of a job's upload."""
    log.info(
        "object store: %s (rank %d) uploaded to %s in %.1fs",
        job.name,
        job.rank,
        run_uri,
        time.monotonic() - job.submitted_at,
    )
    events.uploaded(
        rank=job.rank,
        checkpoint=job.name,
        uri=str(run_uri.join(job.name)),
        sent=sent,
        seconds=time.monotonic() - job.submitted_at,
    )
