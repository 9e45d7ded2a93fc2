"""CheckpointUploader: commit order (data, manifest, pointer), ranks, retention, outages."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from tests.objectstore.conftest import SMALL_PARTS
from tests.objectstore.helpers import RUN, make_checkpoint
from tests.objectstore.recording import Recorder, RecordingStore
from tools.s3server import S3Server
from trainer_runtime import io_progress
from trainer_runtime.objectstore import (
    Backoff,
    CheckpointUploader,
    S3Store,
    S3Uri,
    find_remote_checkpoint,
    remote_pointer,
)
from trainer_runtime.save.manifest import verify_entry

FAST = Backoff(initial=0.1, maximum=0.5)


def _uploader(store: S3Store, root: S3Uri, **kwargs: object) -> CheckpointUploader:
    return CheckpointUploader(store, root.join(RUN), backoff=FAST, **kwargs)  # type: ignore[arg-type]


def test_single_rank_commit_order(s3_env: S3Server, s3_root: S3Uri, tmp_path: Path) -> None:
    rec = Recorder()
    store = RecordingStore(rec, "r0", transfer=SMALL_PARTS)
    up = _uploader(store, s3_root)
    run_dir = tmp_path / RUN
    for i, name in enumerate(["ep0-ba10", "ep0-ba20"]):
        folder, _ = make_checkpoint(run_dir, name, batch=10 * (i + 1), size=(7 << 20))
        up.submit(folder)
    assert up.flush(60)
    for name in ["ep0-ba10", "ep0-ba20"]:
        (data,) = rec.seq("uploaded", f"{name}/rank0.pt")
        (manifest,) = rec.seq("put", f"{name}/manifest.json")
        assert data < manifest
    pointers = rec.seq("put", "latest.json")
    manifests = rec.seq("put", "manifest.json")
    assert len(pointers) == 2 and manifests[0] < pointers[0] < manifests[1] < pointers[1]
    assert remote_pointer(store, s3_root.join(RUN)) == "ep0-ba20"
    assert up.stats.uploaded == 2 and up.stats.failures == 0
    up.close()


def test_uploads_count_the_bytes_they_send(store: S3Store, s3_root: S3Uri, tmp_path: Path) -> None:
    """A survivor's save is waited for as long as this count grows (save/survivor.py): a
    multipart upload and a small one both advance it by what they sent."""
    up = _uploader(store, s3_root)
    sizes = {"ep0-ba10": 7 << 20, "ep0-ba20": 1 << 20}  # multipart, then one PUT
    for batch, (name, size) in enumerate(sizes.items(), start=1):
        folder, _ = make_checkpoint(tmp_path / RUN, name, batch=10 * batch, size=size)
        before = io_progress.total()
        up.submit(folder)
        assert up.flush(60)
        assert io_progress.total() - before >= size
    up.close()


def test_two_ranks_manifest_waits_for_the_slow_rank(
    s3_env: S3Server, s3_root: S3Uri, tmp_path: Path
) -> None:
    rec = Recorder()
    folder, manifest = make_checkpoint(tmp_path / RUN, "ep0-ba10", 10, world_size=2, size=7 << 20)
    stores = [
        RecordingStore(rec, "r0", transfer=SMALL_PARTS),
        RecordingStore(rec, "r1", transfer=SMALL_PARTS, upload_delay=1.5),
    ]
    ups = [_uploader(stores[r], s3_root, rank=r, world_size=2) for r in range(2)]
    threads = [threading.Thread(target=ups[r].submit, args=(folder, manifest)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(u.flush(60) for u in ups)
    assert rec.keys("r0") == [str(s3_root.join(RUN, "ep0-ba10", "rank0.pt"))]
    assert rec.keys("r1") == [str(s3_root.join(RUN, "ep0-ba10", "rank1.pt"))]
    (r1_done,) = rec.seq("uploaded", "rank1.pt")
    (r0_done,) = rec.seq("uploaded", "rank0.pt")
    (manifest_put,) = rec.seq("put", "manifest.json")
    (pointer_put,) = rec.seq("put", "latest.json")
    assert r0_done < r1_done < manifest_put < pointer_put  # rank 0 waited for rank 1
    assert [e[3] for e in rec.events if e[1] == "put"] == ["r0", "r0"]  # only the leader commits
    found = find_remote_checkpoint(stores[0], s3_root.join(RUN))
    assert found is not None and found.name == "ep0-ba10"
    for u in ups:
        u.close()


def test_pointer_never_moves_back(store: S3Store, s3_root: S3Uri, tmp_path: Path) -> None:
    up = _uploader(store, s3_root)
    new, _ = make_checkpoint(tmp_path / RUN, "ep1-ba20", 20)
    old, _ = make_checkpoint(tmp_path / RUN, "ep0-ba10", 10)
    up.submit(new)
    up.submit(old)  # e.g. a retried older upload finishing late
    assert up.flush(30)
    assert remote_pointer(store, s3_root.join(RUN)) == "ep1-ba20"
    assert store.head(s3_root.join(RUN, "ep0-ba10", "manifest.json")) is not None
    up.close()


def test_keep_local_zero_and_one(store: S3Store, s3_root: S3Uri, tmp_path: Path) -> None:
    run_dir = tmp_path / RUN
    up = _uploader(store, s3_root, keep_local=0)
    folder, _ = make_checkpoint(run_dir, "ep0-ba10", 10)
    up.submit(folder)
    assert up.flush(30)
    assert not folder.exists()
    up.close()

    up = _uploader(store, s3_root, keep_local=1)
    folders = [make_checkpoint(run_dir, f"ep0-ba{b}", b)[0] for b in (20, 30, 40)]
    for f in folders:
        up.submit(f)
    assert up.flush(30)
    assert [f.exists() for f in folders] == [False, False, True]
    up.close()


def test_keep_remote_prunes_old_committed_only(
    store: S3Store, s3_root: S3Uri, tmp_path: Path
) -> None:
    run = s3_root.join(RUN)
    store.put_bytes(run.join("ep0-ba1", "rank0.pt"), b"in flight: no manifest yet")
    up = _uploader(store, s3_root, keep_remote=2)
    for b in (10, 20, 30):
        up.submit(make_checkpoint(tmp_path / RUN, f"ep0-ba{b}", b)[0])
    assert up.flush(30)
    assert sorted(store.list_folders(run)) == ["ep0-ba1", "ep0-ba20", "ep0-ba30"]
    up.close()


class _HangsAfterPointer(S3Store):
    """SIGSTOPs the server once ``latest.json`` names ``checkpoint``: what follows (the prune)
    meets a hung store."""

    def __init__(self, server: S3Server, checkpoint: str, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.server, self.checkpoint = server, checkpoint

    def put_json(self, location: S3Uri | str, value: object, **kwargs: object) -> None:
        super().put_json(location, value, **kwargs)  # type: ignore[arg-type]
        if str(location).endswith("latest.json") and self.checkpoint in str(value):
            self.server.pause()


def test_a_prune_against_a_hung_store_is_reported_as_the_prune_not_as_an_upload(
    own_s3_server: S3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ep0-ba20 is committed (latest.json names it); then the store hangs while keep_remote
    prunes ep0-ba10. The flush counts ep0-ba20 uploaded (its event is out) and says that the
    prune waits on a hung store; ep0-ba30, queued behind it, is the one not uploaded."""
    store = _HangsAfterPointer(own_s3_server, "ep0-ba20", transfer=SMALL_PARTS, max_attempts=2)
    root = S3Uri(own_s3_server.bucket, "hung-prune")
    up = _uploader(store, root, keep_remote=1)
    ten, twenty, thirty = (
        make_checkpoint(tmp_path / RUN, f"ep0-ba{b}", b)[0] for b in (10, 20, 30)
    )
    try:
        up.submit(ten)
        assert up.flush(30)
        up.submit(twenty)
        with caplog.at_level(logging.INFO, logger="trainer_runtime.objectstore"):
            assert up.flush(3), "ep0-ba20 is uploaded and committed"
            up.submit(thirty)
            assert not up.flush(1)
        assert up.stats.last_uploaded == "ep0-ba20" and not up.is_pending("ep0-ba20")
        messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        prune_hung = [m for m in messages if "pruning" in m and "hung" in m]
        assert len(prune_hung) == 2, messages
        assert all("ep0-ba20" in m and "keep_remote=1" in m for m in prune_hung), prune_hung
        assert "all submitted checkpoints are uploaded" in prune_hung[0], prune_hung
        assert "1 checkpoint(s) still not uploaded" in prune_hung[1], prune_hung
        assert ": ep0-ba30 (kept locally" in prune_hung[1], prune_hung
        assert not any("upload of ep0-ba20" in m or ": ep0-ba20 (" in m for m in messages)
    finally:
        own_s3_server.unpause()
        up.close(timeout=30)
    assert remote_pointer(S3Store(), root.join(RUN)) == "ep0-ba30"


def test_a_local_file_of_the_wrong_size_is_not_uploaded_and_named_with_both_sizes(
    store: S3Store, s3_root: S3Uri, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The error names the file, the size found and the size expected, and the checkpoint
    once; nothing of the checkpoint is uploaded, and it is never retried."""
    folder, manifest = make_checkpoint(tmp_path / RUN, "ep0-ba10", 10)
    data = folder / "rank0.pt"
    size = manifest.files[0].size
    with open(data, "r+b") as f:
        f.truncate(size - 7)
    up = _uploader(store, s3_root)
    with caplog.at_level(logging.ERROR, logger="trainer_runtime.objectstore"):
        up.submit(folder, manifest)
        assert up.flush(30)
    up.close()
    (said,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert f"{data} has {size - 7} bytes, expected {size} (its size in the manifest)" in said
    assert said.count("ep0-ba10") == 1, said
    assert up.stats.abandoned == 1 and up.stats.failures == 0
    assert store.head(s3_root.join(RUN, "ep0-ba10", "manifest.json")) is None


def test_store_down_keeps_pending_warns_and_recovers(
    own_s3_server: S3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = S3Store(transfer=SMALL_PARTS, max_attempts=2, connect_timeout=1)
    root = S3Uri(own_s3_server.bucket, "down")
    up = _uploader(store, root)
    folder, _ = make_checkpoint(tmp_path / RUN, "ep0-ba10", 10)
    own_s3_server.kill()
    t0 = time.monotonic()
    up.submit(folder)
    assert time.monotonic() - t0 < 0.5  # submit never blocks on the store
    deadline = time.monotonic() + 30
    while up.stats.failures < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert up.stats.failures >= 2 and up.is_pending("ep0-ba10")
    assert "kept locally, retrying" in caplog.text
    with caplog.at_level(logging.WARNING):
        assert up.flush(timeout=0.3) is False
    assert "still not uploaded" in caplog.text and "ep0-ba10" in caplog.text
    own_s3_server.restart()
    assert up.flush(timeout=60)
    assert not up.is_pending("ep0-ba10") and up.stats.consecutive_failures == 0
    assert remote_pointer(store, root.join(RUN)) == "ep0-ba10"
    up.close()


def test_leader_never_commits_without_every_rank(
    store: S3Store, s3_root: S3Uri, tmp_path: Path
) -> None:
    folder, manifest = make_checkpoint(tmp_path / RUN, "ep0-ba10", 10, world_size=2)
    up = _uploader(store, s3_root, rank=0, world_size=2, peer_timeout_s=0.5)
    up.submit(folder, manifest)
    assert up.flush(timeout=1.5) is False  # rank 1 never uploads
    assert up.stats.failures >= 1 and up.is_pending("ep0-ba10")
    assert store.head(s3_root.join(RUN, "ep0-ba10", "rank0.pt")) is not None
    assert store.head(s3_root.join(RUN, "ep0-ba10", "manifest.json")) is None
    assert remote_pointer(store, s3_root.join(RUN)) is None
    up.close(timeout=0)


def test_corrupt_local_file_is_abandoned_not_uploaded(
    store: S3Store, s3_root: S3Uri, tmp_path: Path
) -> None:
    folder, _ = make_checkpoint(tmp_path / RUN, "ep0-ba10", 10)
    with open(folder / "rank0.pt", "r+b") as f:
        f.write(b"\x00" * 8)
    up = _uploader(store, s3_root)
    up.submit(folder)
    assert up.flush(30)
    assert up.stats.abandoned == 1 and up.stats.uploaded == 0
    assert store.head(s3_root.join(RUN, "ep0-ba10", "rank0.pt")) is None
    assert remote_pointer(store, s3_root.join(RUN)) is None
    up.close()


def test_keep_local_counts_local_checkpoints_the_bucket_holds_and_keeps_those_it_lacks(
    store: S3Store, s3_root: S3Uri, tmp_path: Path
) -> None:
    """At start-up the local checkpoints already committed in the bucket count like uploaded
    ones (keep_local=1: they go once a newer one is uploaded); one the bucket lacks stays."""
    run_dir = tmp_path / RUN
    earlier = _uploader(store, s3_root)  # an earlier attempt uploaded ep0-ba10 and ep0-ba20
    ten, _ = make_checkpoint(run_dir, "ep0-ba10", 10)
    twenty, _ = make_checkpoint(run_dir, "ep0-ba20", 20)
    earlier.submit(ten)
    earlier.submit(twenty)
    assert earlier.flush(30)
    earlier.close()
    five, _ = make_checkpoint(run_dir, "ep0-ba5", 5)  # older than the pointer, never uploaded

    up = _uploader(store, s3_root, keep_local=1)
    assert up.resubmit_unsynced(run_dir) == []
    assert ten.exists() and twenty.exists(), "nothing is deleted before the next upload"
    thirty, _ = make_checkpoint(run_dir, "ep0-ba30", 30)
    up.submit(thirty)
    assert up.flush(30)
    assert [f.exists() for f in (five, ten, twenty, thirty)] == [True, False, False, True]
    up.close()


def test_keep_local_zero_keeps_a_rank_copy_until_the_leader_commits_it(
    store: S3Store, s3_root: S3Uri, tmp_path: Path
) -> None:
    """Rank 1's share is up, but the leader is gone before committing the checkpoint in the
    bucket: rank 1 must not delete its copy, or the checkpoint is lost on both sides."""
    run_dir = tmp_path / RUN
    ten, manifest10 = make_checkpoint(run_dir, "ep0-ba10", 10, world_size=2)
    rank1 = _uploader(store, s3_root, rank=1, world_size=2, keep_local=0)
    rank1.submit(ten, manifest10)
    assert rank1.flush(30)  # its own file is uploaded; no leader commits (it died)
    assert store.head(s3_root.join(RUN, "ep0-ba10", "rank1.pt")) is not None
    assert store.head(s3_root.join(RUN, "ep0-ba10", "manifest.json")) is None
    assert all(verify_entry(ten, e) is None for e in manifest10.files), "rank 1's copy is gone"

    # The next attempt's leader commits it; once it is a remote checkpoint, rank 1's copy goes
    # at its next upload.
    leader = _uploader(store, s3_root, rank=0, world_size=2, peer_timeout_s=30)
    leader.submit(ten, manifest10)
    assert leader.flush(30)
    assert remote_pointer(store, s3_root.join(RUN)) == "ep0-ba10"
    twenty, manifest20 = make_checkpoint(run_dir, "ep0-ba20", 20, world_size=2)
    rank1.submit(twenty, manifest20)
    assert rank1.flush(30)
    assert not (ten / "rank1.pt").exists()
    assert (twenty / "rank1.pt").exists(), "ep0-ba20 is not committed remotely yet"
    leader.close(timeout=0)
    rank1.close(timeout=0)


def test_keep_local_on_a_node_local_disk_leaves_no_torn_checkpoint(
    store: S3Store, s3_root: S3Uri, tmp_path: Path
) -> None:
    """On node-local disks each node holds its own files and a copy of the manifest (the
    commit writes one where rank 0's is not visible). Rank 1's keep_local deleted only its own
    files there, so the manifest stayed over a folder without them: a torn checkpoint that the
    next resume on that node passed over and moved into rejected/."""
    shared = tmp_path / "leader" / RUN  # rank 0's node
    node1 = tmp_path / "node1" / RUN  # rank 1's node: its own file and its manifest copy
    ten, manifest10 = make_checkpoint(shared, "ep0-ba10", 10, world_size=2)
    twenty, manifest20 = make_checkpoint(shared, "ep0-ba20", 20, world_size=2)
    for folder in (ten, twenty):
        copy = node1 / folder.name
        copy.mkdir(parents=True)
        (copy / "rank1.pt").write_bytes((folder / "rank1.pt").read_bytes())
        (copy / "manifest.json").write_bytes((folder / "manifest.json").read_bytes())
    leader = _uploader(store, s3_root, rank=0, world_size=2, peer_timeout_s=30)
    rank1 = _uploader(store, s3_root, rank=1, world_size=2, keep_local=1)
    for folder, manifest in ((ten, manifest10), (twenty, manifest20)):
        rank1.submit(node1 / folder.name, manifest)
        leader.submit(folder, manifest)
        assert leader.flush(30) and rank1.flush(30)
    assert remote_pointer(store, s3_root.join(RUN)) == "ep0-ba20"
    # One more upload: ep0-ba10 is now beyond keep_local=1 and committed in the bucket.
    thirty, manifest30 = make_checkpoint(shared, "ep0-ba30", 30, world_size=2)
    copy30 = node1 / thirty.name
    copy30.mkdir(parents=True)
    (copy30 / "rank1.pt").write_bytes((thirty / "rank1.pt").read_bytes())
    (copy30 / "manifest.json").write_bytes((thirty / "manifest.json").read_bytes())
    leader.submit(thirty, manifest30)
    rank1.submit(copy30, manifest30)
    assert leader.flush(30) and rank1.flush(30)
    assert not (node1 / "ep0-ba10").exists(), sorted(p.name for p in (node1 / "ep0-ba10").iterdir())
    assert (node1 / "ep0-ba30" / "manifest.json").exists()
    leader.close(timeout=0)
    rank1.close(timeout=0)
