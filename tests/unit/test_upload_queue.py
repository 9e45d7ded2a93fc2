"""The upload queue's order and pending names (pure logic; the uploads themselves are tested
against a real S3 server in tests/objectstore/test_uploader.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from trainer_runtime.objectstore.upload_queue import UploadJob, UploadQueue
from trainer_runtime.save.manifest import Manifest
from trainer_runtime.timestamp import Timestamp


def job(batch: int, name: str | None = None) -> UploadJob:
    manifest = Manifest(
        name=name or f"ep0-ba{batch}",
        run_name="run",
        world_size=1,
        timestamp=Timestamp(batch=batch, batch_in_epoch=batch),
        files=[],
        created_at=f"2026-01-01T00:00:{batch:02d}Z",
    )
    return UploadJob(Path("/nonexistent"), manifest, rank=0)


def names(queue: UploadQueue, stop: threading.Event) -> list[str]:
    out = []
    while queue.pending():
        got = queue.next(stop)
        assert got is not None
        out.append(got.name)
        queue.done(got)
    return out


def test_move_first_puts_the_emergency_save_after_the_upload_in_progress_and_drops_older():
    queue, stop = UploadQueue(), threading.Event()
    for batch in (1, 2, 3):
        queue.put(job(batch))
    queue.put(job(9, "emergency"))
    queue.put(job(12))  # newer than the emergency save: kept, after it
    assert queue.move_first("emergency") == ["ep0-ba2", "ep0-ba3"]
    assert not queue.is_pending("ep0-ba2")
    # ep0-ba1 is at the head (the upload in progress): it finishes first.
    assert names(queue, stop) == ["ep0-ba1", "emergency", "ep0-ba12"]


def test_move_first_of_a_name_not_queued_changes_nothing():
    queue, stop = UploadQueue(), threading.Event()
    for batch in (1, 2):
        queue.put(job(batch))
    assert queue.move_first("ep0-ba7") == []
    assert queue.move_first("ep0-ba1") == []  # the head: already in progress
    assert names(queue, stop) == ["ep0-ba1", "ep0-ba2"]


def test_a_resubmitted_name_stays_pending_until_both_jobs_are_done():
    queue, stop = UploadQueue(), threading.Event()
    first, again = job(1), job(1)
    queue.put(first)
    queue.put(again)
    got = queue.next(stop)
    assert got is first and queue.pending_other("ep0-ba1", first)
    queue.done(first)
    assert queue.is_pending("ep0-ba1") and not queue.pending_other("ep0-ba1", again)
    queue.done(queue.next(stop))
    assert queue.pending() == []


def test_wait_empty_returns_what_is_pending_at_the_timeout_or_at_stop():
    queue, stop = UploadQueue(), threading.Event()
    queue.put(job(1))
    started = time.monotonic()
    assert queue.wait_empty(0.2, stop) == ["ep0-ba1"]
    assert time.monotonic() - started >= 0.2
    threading.Timer(0.1, lambda: (stop.set(), queue.wake())).start()
    assert queue.wait_empty(None, stop) == ["ep0-ba1"]
    assert queue.next(stop) is None  # a stopped worker takes no job


def test_wait_empty_returns_as_soon_as_the_last_job_is_done():
    queue, stop = UploadQueue(), threading.Event()
    pending = job(1)
    queue.put(pending)
    threading.Timer(0.1, lambda: queue.done(queue.next(stop))).start()
    assert queue.wait_empty(30, stop) == []
