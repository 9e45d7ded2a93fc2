"""``layout.RunFolder`` over an object-store prefix (``objectstore.folder.StorePrefix``),
against a real S3 server: the same listing, order, pointer and verification as a local run
folder, and the newest-valid walk falling back past damaged remote checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.objectstore.helpers import RUN, make_checkpoint
from trainer_runtime.objectstore import Backoff, CheckpointUploader, S3Store, S3Uri
from trainer_runtime.objectstore.folder import StorePrefix, remote_run_folder
from trainer_runtime.run_folder.layout import RunFolder
from trainer_runtime.run_folder.names import MANIFEST_NAME, POINTER_NAME


@pytest.fixture
def uploaded(store: S3Store, s3_root: S3Uri, tmp_path: Path) -> tuple[Path, S3Uri]:
    """Three 2-rank checkpoints committed locally and uploaded; (local run dir, remote run)."""
    run_dir = tmp_path / "local" / RUN
    ups = [
        CheckpointUploader(
            store, s3_root.join(RUN), rank=r, world_size=2, backoff=Backoff(0.1, 0.5)
        )
        for r in range(2)
    ]
    for name, batch in (("ep0-ba9", 9), ("ep0-ba30", 30), ("ep0-ba10", 10)):
        folder, manifest = make_checkpoint(run_dir, name, batch, world_size=2, size=32 << 10)
        for up in ups:
            up.submit(folder, manifest)
        for up in ups:
            assert up.flush(30)
    for up in ups:
        assert up.close(30)
    return run_dir, s3_root.join(RUN)


def test_remote_listing_matches_the_local_one(store: S3Store, uploaded):
    run_dir, run = uploaded
    local, remote = RunFolder(run_dir), remote_run_folder(store, run)
    names = [m.name for m in remote.committed()]
    assert names == ["ep0-ba30", "ep0-ba10", "ep0-ba9"], "newest by progress, not by name"
    assert names == [m.name for m in local.committed()]
    assert [m.to_json() for m in remote.committed()] == [m.to_json() for m in local.committed()]
    # The uploader moved the pointer forward only: the last upload (ep0-ba10) did not pull it
    # back from ep0-ba30.
    assert remote.pointer_name() == "ep0-ba30"


def test_torn_remote_folder_is_a_candidate_with_a_reason(store: S3Store, uploaded):
    _, run = uploaded
    store.put_bytes(run.join("ep0-ba50", "rank0.pt"), b"half an upload")
    store.put_bytes(run.join("ep0-ba60", MANIFEST_NAME), b"{not json")
    cands = {c.name: c for c in remote_run_folder(store, run).candidates()}
    assert cands["ep0-ba50"].manifest is None
    assert "does not exist" in str(cands["ep0-ba50"].reason)
    assert cands["ep0-ba60"].manifest is None and cands["ep0-ba60"].reason
    assert remote_run_folder(store, run).committed()[0].name == "ep0-ba30"


def test_pointer_target_is_a_candidate_even_when_the_listing_lacks_it(
    store: S3Store, uploaded, tmp_path: Path
):
    """A listing may lag a fresh pointer; the pointer's checkpoint is still considered."""
    _, run = uploaded

    class LaggingListing(StorePrefix):
        def folder_names(self) -> list[str]:
            return [n for n in super().folder_names() if n != "ep0-ba30"]

    lagging = RunFolder(LaggingListing(store, run))
    assert [m.name for m in lagging.committed()] == ["ep0-ba30", "ep0-ba10", "ep0-ba9"]
    # Not so for a local folder: the pointer is a hint there, and the listing is the truth.
    local = tmp_path / "l"
    make_checkpoint(local, "ep0-ba1", 1, size=1024)
    (local / POINTER_NAME).write_text('{"checkpoint": "ep0-ba99"}')
    assert [c.name for c in RunFolder(local).candidates()] == ["ep0-ba1"]


def test_newest_valid_falls_back_past_a_missing_remote_object(store: S3Store, uploaded):
    _, run = uploaded
    store.delete(run.join("ep0-ba30", "rank1.pt"))
    folder = remote_run_folder(store, run)
    newest = folder.committed()[0]
    assert folder.verify(newest, [0]) is None, "rank 0's objects are all there"
    walk = folder.newest_valid(lambda m: None)
    assert walk.chosen is not None and walk.chosen.name == "ep0-ba10"
    assert walk.reasons(lambda m: m.name) == ["ep0-ba30: rank1.pt (rank 1) is missing remotely"]


def test_remote_folder_has_no_local_path_for_writes(store: S3Store, s3_root: S3Uri):
    folder = remote_run_folder(store, s3_root.join(RUN))
    assert folder.candidates() == [] and folder.pointer_name() is None
    with pytest.raises(TypeError, match="not a local folder"):
        folder.uncommit("ep0-ba1")
