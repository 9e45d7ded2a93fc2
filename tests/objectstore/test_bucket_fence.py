"""The run's fence in the bucket (objectstore/bucket_fence.py): a stale gang's checkpoint is
not committed remotely, against a real S3 server."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.objectstore.helpers import RUN, make_checkpoint
from tests.objectstore.test_uploader import _uploader
from trainer_runtime.objectstore import S3Backend, S3Store, S3Uri, remote_pointer
from trainer_runtime.objectstore.bucket_fence import BucketFence, claim_at_start
from trainer_runtime.save import atomic
from trainer_runtime.save.manifest import MANIFEST_NAME, Manifest


def fenced_checkpoint(run_dir: Path, name: str, batch: int, epoch: int) -> Path:
    """A committed local checkpoint whose manifest records the gang's membership epoch."""
    folder, manifest = make_checkpoint(run_dir, name, batch=batch)
    marked: Manifest = dataclasses.replace(manifest, extra={"membershipEpoch": epoch})
    atomic.write_bytes_atomic(folder / MANIFEST_NAME, marked.to_json().encode())
    return folder


def test_rank_0_of_a_managed_gang_raises_the_fence_and_never_lowers_it(
    store: S3Store, s3_root: S3Uri
) -> None:
    run_uri = s3_root.join(RUN)
    claim_at_start(store, run_uri, 1, {"RTJ_MEMBERSHIP_EPOCH": "3"})  # not rank 0
    claim_at_start(store, run_uri, 0, {})  # an unmanaged run
    assert BucketFence(store, run_uri, 0).current() is None
    claim_at_start(store, run_uri, 0, {"RTJ_MEMBERSHIP_EPOCH": "3"})
    claim_at_start(store, run_uri, 0, {"RTJ_MEMBERSHIP_EPOCH": "2"})  # a stale gang's start
    assert BucketFence(store, run_uri, 2).current() == 3
    assert "older than the run's fence 3" in (BucketFence(store, run_uri, 2).stale() or "")
    assert BucketFence(store, run_uri, 3).stale() is None


def test_a_stale_gangs_checkpoint_is_not_committed_to_the_bucket(
    store: S3Store, s3_root: S3Uri, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_uri = s3_root.join(RUN)
    claim_at_start(store, run_uri, 0, {"RTJ_MEMBERSHIP_EPOCH": "2"})  # the new gang started
    monkeypatch.setenv("RTJ_MEMBERSHIP_EPOCH", "1")  # this process: the old gang, further on
    up = _uploader(store, s3_root)
    up.submit(fenced_checkpoint(tmp_path / RUN, "ep0-ba30", 30, epoch=1))
    assert up.flush(60)
    assert store.get_bytes(run_uri.join("ep0-ba30").join(MANIFEST_NAME)) is None
    assert remote_pointer(store, run_uri) is None  # the pointer never names the stale line
    assert up.stats.abandoned == 1 and up.stats.failures == 0  # refused once, not retried
    assert "membership epoch 1 is older than the run's fence 2" in up.stats.last_error
    up.close()


def test_a_newer_gang_sends_an_older_gangs_committed_checkpoint_on(
    store: S3Store, s3_root: S3Uri, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old gang committed on this disk but its upload was cut short; the new gang (the
    fence's epoch) finds it and uploads it: the epoch that counts is the uploader's."""
    run_uri = s3_root.join(RUN)
    claim_at_start(store, run_uri, 0, {"RTJ_MEMBERSHIP_EPOCH": "2"})
    monkeypatch.setenv("RTJ_MEMBERSHIP_EPOCH", "2")
    up = _uploader(store, s3_root)
    up.submit(fenced_checkpoint(tmp_path / RUN, "ep0-ba30", 30, epoch=1))
    assert up.flush(60)
    assert remote_pointer(store, run_uri) == "ep0-ba30"
    assert up.stats.abandoned == 0
    up.close()


def test_a_managed_gangs_backend_raises_the_fence_when_it_opens(
    s3_root: S3Uri, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RTJ_MEMBERSHIP_EPOCH", "4")
    backend = S3Backend(s3_root, RUN, rank=0)
    try:
        assert BucketFence(backend.store, backend.run_uri, 0).current() == 4
    finally:
        backend.close()
