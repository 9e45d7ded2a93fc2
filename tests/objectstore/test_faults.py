"""Fault injection with real processes: the S3 server or the training process dies mid-upload.

After each fault the remote pointer must name a complete, verifying checkpoint, and a resume
from an empty local disk must work.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import require
from tests.objectstore.conftest import SMALL_PARTS
from tests.objectstore.helpers import RUN, make_checkpoint
from tools.s3server import S3Server
from trainer_runtime.objectstore import (
    Backoff,
    CheckpointUploader,
    ObjectStoreError,
    S3Store,
    S3Uri,
    download_checkpoint,
    remote_pointer,
    resume_from_remote,
    verify_remote,
)
from trainer_runtime.save.manifest import Manifest, verify_entry

WORKER = Path(__file__).with_name("upload_worker.py")


class PointerWatcher(threading.Thread):
    """Polls latest.json; records every checkpoint it names and whether that one verified."""

    def __init__(self, run: S3Uri) -> None:
        super().__init__(daemon=True)
        self.run_uri = run
        self.store = S3Store(max_attempts=1, connect_timeout=0.5, read_timeout=2)
        self.seen: list[tuple[str, str | None]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                name = remote_pointer(self.store, self.run_uri)
                if name is None:
                    continue
                body = self.store.get_bytes(self.run_uri.join(name, "manifest.json"))
                reason = (
                    "manifest missing"
                    if body is None
                    else verify_remote(self.store, self.run_uri, Manifest.from_json(body))
                )
                self.seen.append((name, reason))
            except Exception:  # noqa: S112 - the server is down on purpose; keep polling
                continue


def assert_resumes(store: S3Store, run: S3Uri, tmp_path: Path, expect: str) -> None:
    """A fresh, empty local disk resumes from ``expect``, every file verified."""
    empty = tmp_path / f"fresh-{expect}"
    found = resume_from_remote(store, run, empty)
    assert found is not None
    ckpt, folder = found
    assert ckpt.name == expect and folder == empty / expect
    assert all(verify_entry(folder, e) is None for e in Manifest.read(folder).files)


def test_server_killed_mid_upload_and_restarted(own_s3_server: S3Server, tmp_path: Path) -> None:
    run = S3Uri(own_s3_server.bucket, f"kill-server/{RUN}")
    store = S3Store(transfer=SMALL_PARTS, max_attempts=2, connect_timeout=1, read_timeout=5)
    up = CheckpointUploader(store, run, backoff=Backoff(0.2, 1.0))
    up.submit(make_checkpoint(tmp_path / RUN, "ep0-ba10", 10)[0])
    assert up.flush(30)
    watcher = PointerWatcher(run)
    watcher.start()

    parts = 0

    def kill_on_third_part(**_: object) -> None:
        nonlocal parts
        parts += 1
        if parts == 3:
            own_s3_server.kill()  # SIGKILL while parts of B are in flight

    store.client.meta.events.register("before-send.s3.UploadPart", kill_on_third_part)
    up.submit(make_checkpoint(tmp_path / RUN, "ep0-ba20", 20, size=24 << 20)[0])
    deadline = time.monotonic() + 30
    while up.stats.failures < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert up.stats.failures >= 1 and up.is_pending("ep0-ba20")
    time.sleep(0.5)
    own_s3_server.restart()
    assert up.flush(60), up.stats
    time.sleep(0.3)
    watcher.stop.set()
    watcher.join()
    up.close()

    assert remote_pointer(store, run) == "ep0-ba20"
    names = [name for name, _ in watcher.seen]
    assert "ep0-ba10" in names and names[-1] == "ep0-ba20"
    assert all(reason is None for _, reason in watcher.seen), watcher.seen
    assert_resumes(store, run, tmp_path, "ep0-ba20")


def test_training_process_killed_mid_upload(
    s3_env: S3Server, s3_root: S3Uri, tmp_path: Path
) -> None:
    run = s3_root.join(RUN)
    local = tmp_path / "node-disk" / RUN
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(local), str(run)],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    assert proc.stdout is not None
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line.strip())
            if line.startswith("PART 2"):
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait(30)
    assert "A-UPLOADED" in lines and "PART 2" in lines, lines

    store = S3Store(transfer=SMALL_PARTS)
    assert remote_pointer(store, run) == "ep0-ba10"
    assert store.head(run.join("ep0-ba20", "manifest.json")) is None
    assert_resumes(store, run, tmp_path, "ep0-ba10")

    # The next attempt on the same disk resubmits B (in this process: a second interpreter
    # would only add the cost of importing torch): the parts already sent are not trusted,
    # the upload completes, and the pointer moves on.
    up = CheckpointUploader(store, run, backoff=Backoff(0.1, 0.5))
    assert up.resubmit_unsynced(local) == ["ep0-ba20"]  # A is committed remotely already
    assert up.close(timeout=60)
    assert remote_pointer(store, run) == "ep0-ba20"
    assert_resumes(store, run, tmp_path, "ep0-ba20")


def test_server_killed_mid_download_at_resume_is_waited_for(
    own_s3_server: S3Server, tmp_path: Path, caplog
) -> None:
    """A store that dies in the middle of a resume's download and is back a moment later is
    waited for (each file is retried), not reported as a failed resume."""
    store = S3Store(transfer=SMALL_PARTS)
    run = S3Uri(own_s3_server.bucket, f"dl/{RUN}")
    up = CheckpointUploader(store, run, backoff=Backoff(0.1, 0.5))
    folder, manifest = make_checkpoint(tmp_path / "node-a" / RUN, "ep0-ba10", 10, size=96 << 20)
    up.submit(folder, manifest)
    assert up.close(timeout=120)

    fresh = tmp_path / "node-b" / RUN
    killed = threading.Event()

    def kill_once_bytes_arrive() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(p.name.startswith(".rank0.pt") for p in fresh.glob("ep0-ba10/.*")):
                own_s3_server.kill()
                killed.set()
                time.sleep(0.5)
                own_s3_server.restart()
                return
            time.sleep(0.002)

    killer = threading.Thread(target=kill_once_bytes_arrive, daemon=True)
    killer.start()
    with caplog.at_level("WARNING", logger="trainer_runtime"):
        got = download_checkpoint(store, run.join("ep0-ba10"), fresh)
    killer.join(90)
    assert killed.is_set(), "the download finished before the server could be killed"
    assert any("failed (attempt 1/" in r.getMessage() for r in caplog.records), caplog.text
    assert got == fresh / "ep0-ba10"
    assert all(verify_entry(got, e) is None for e in Manifest.read(got).files)
    assert remote_pointer(store, run) == "ep0-ba10"


def test_a_download_the_store_dies_under_removes_what_it_wrote(
    own_s3_server: S3Server, tmp_path: Path
) -> None:
    """The store gone for good after a checkpoint's first file landed: the download fails
    with the store's error and leaves no partial folder (it was listed as NOT COMMITTED)."""
    store = S3Store(transfer=SMALL_PARTS, max_attempts=2, connect_timeout=1, read_timeout=5)
    run = S3Uri(own_s3_server.bucket, f"gone/{RUN}")
    ups = [CheckpointUploader(store, run, rank=r, world_size=2) for r in range(2)]
    folder, manifest = make_checkpoint(tmp_path / "node-a" / RUN, "ep0-ba10", 10, world_size=2)
    for up in ups:
        up.submit(folder, manifest)
    for up in ups:
        assert up.close(timeout=60)

    def kill_at_rank1(params: dict, **_: object) -> None:
        if params.get("url_path", "").endswith("/rank1.pt"):
            own_s3_server.kill()

    store.client.meta.events.register("before-call.s3.GetObject", kill_at_rank1)
    fresh = tmp_path / "node-b" / RUN
    with pytest.raises(ObjectStoreError):
        download_checkpoint(store, run.join("ep0-ba10"), fresh, attempts=2, backoff=Backoff(0.1))
    assert list(fresh.iterdir()) == []


def test_a_full_disk_at_resume_download_is_a_local_error_and_the_bucket_keeps_everything(
    s3_env: S3Server, s3_root: S3Uri, tmp_path: Path
) -> None:
    """No space for a checkpoint being downloaded: an OSError that says so, at once (the store
    is not retried for the disk's fault), no file under the checkpoint's name, and nothing
    in the bucket touched."""
    require(os.geteuid() == 0, "mounting a tmpfs needs root")
    store = S3Store(transfer=SMALL_PARTS)
    run = s3_root.join(RUN)
    up = CheckpointUploader(store, run, backoff=Backoff(0.1, 0.5))
    for batch in (10, 20):
        up.submit(
            *make_checkpoint(tmp_path / "node-a" / RUN, f"ep0-ba{batch}", batch, size=8 << 20)
        )
    assert up.close(timeout=120)
    before = sorted(o.uri.key for o in store.list_objects(run))

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)
    try:
        started = time.monotonic()
        with pytest.raises(OSError, match="No space left on device") as err:
            resume_from_remote(store, run, mnt / RUN)
        assert not isinstance(err.value, ObjectStoreError)
        assert time.monotonic() - started < 5, "a full disk is not retried against the store"
        assert not (mnt / RUN / "ep0-ba20" / "manifest.json").exists()
        assert not (mnt / RUN / "ep0-ba20" / "rank0.pt").exists()
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    assert sorted(o.uri.key for o in store.list_objects(run)) == before
    assert remote_pointer(store, run) == "ep0-ba20"
