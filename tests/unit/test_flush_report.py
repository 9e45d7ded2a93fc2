"""The flush's log line: what is pending, and why (failed attempts, or a store that never
answers)."""

from __future__ import annotations

import logging
import time

import pytest

from trainer_runtime.objectstore.flush_report import InFlight, UploadStats, inflight_note, log_flush
from trainer_runtime.objectstore.uri import S3Uri

RUN = S3Uri("bucket", "prefix/run")


def flush_line(caplog: pytest.LogCaptureFixture, stats: UploadStats, note: str) -> str:
    with caplog.at_level(logging.INFO, logger="trainer_runtime.objectstore.uploader"):
        log_flush(RUN, ["ep0-ba4", "ep0-ba2"], 8.0, stats, note=note, pruning=False)
    return caplog.records[-1].getMessage()


def test_a_hung_store_is_named_without_a_count_of_zero_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """docs/runtime.md (Preemption): with a store that does not answer, the log says the
    upload has been waiting with no reply, "not 0 failed attempts"."""
    note = inflight_note(InFlight("ep0-ba2", time.monotonic() - 10), keep_remote=-1)
    line = flush_line(caplog, UploadStats(submitted=2), note)
    assert "2 checkpoint(s) still not uploaded to s3://bucket/prefix/run" in line
    assert "ep0-ba4, ep0-ba2 (kept locally)" in line
    assert "the store is hung or unreachable" in line
    assert "failed attempt" not in line
    assert "last error: None" not in line


def test_failed_attempts_are_counted_with_the_last_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stats = UploadStats(submitted=2, failures=3, last_error="ObjectStoreError: connection refused")
    line = flush_line(caplog, stats, note="")
    assert "(kept locally; 3 failed attempt(s), last error: ObjectStoreError: connection " in line
