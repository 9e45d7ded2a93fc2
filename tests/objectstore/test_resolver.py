"""Remote resume: newest verifying checkpoint first, falling back (with a reason) when damaged."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from tests.objectstore.helpers import RUN, make_checkpoint
from tools.s3server import S3Server
from trainer_runtime.objectstore import (
    Backoff,
    CheckpointUploader,
    NoValidCheckpointError,
    ObjectNotFoundError,
    S3Backend,
    S3Store,
    S3Uri,
    download_checkpoint,
    fetch_load_path,
    find_remote_checkpoint,
    resume_from_remote,
)
from trainer_runtime.save.manifest import Manifest, verify_entry


@pytest.fixture
def two_remote(store: S3Store, s3_root: S3Uri, tmp_path: Path) -> S3Uri:
    """A run with two committed 2-rank checkpoints remotely: ep0-ba10 (older), ep0-ba20."""
    run_dir = tmp_path / "writer" / RUN
    ups = [
        CheckpointUploader(
            store, s3_root.join(RUN), rank=r, world_size=2, backoff=Backoff(0.1, 0.5)
        )
        for r in range(2)
    ]
    for batch in (10, 20):
        folder, manifest = make_checkpoint(
            run_dir,
            f"ep0-ba{batch}",
            batch,
            world_size=2,
            size=(7 << 20) if batch == 20 else (64 << 10),
        )
        for up in ups:
            up.submit(folder, manifest)
    for up in ups:
        assert up.close(30)
    return s3_root.join(RUN)


def _resume(store: S3Store, run: S3Uri, dest: Path, **kwargs: object) -> str:
    found = resume_from_remote(store, run, dest, **kwargs)  # type: ignore[arg-type]
    assert found is not None
    ckpt, folder = found
    manifest = Manifest.read(folder)
    assert manifest.name == ckpt.name
    assert all(verify_entry(folder, e) is None for e in manifest.files)
    return ckpt.name


def test_resume_from_empty_disk(store: S3Store, two_remote: S3Uri, tmp_path: Path) -> None:
    dest = tmp_path / "fresh" / RUN
    assert _resume(store, two_remote, dest) == "ep0-ba20"
    assert sorted(p.name for p in (dest / "ep0-ba20").iterdir()) == [
        "manifest.json",
        "rank0.pt",
        "rank1.pt",
    ]  # no temporary files left behind


def _damage_keeping_metadata(s3_env: S3Server, store: S3Store, uri: S3Uri) -> None:
    """Other bytes of the same size, with the same checksum metadata: HEAD cannot tell, only
    the downloaded bytes can."""
    info = store.head(uri)
    assert info is not None
    s3_env.client().put_object(
        Bucket=uri.bucket, Key=uri.key, Body=os.urandom(info.size), Metadata=dict(info.metadata)
    )


def test_corrupt_bytes_fall_back(
    store: S3Store,
    s3_env: S3Server,
    two_remote: S3Uri,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _damage_keeping_metadata(s3_env, store, two_remote.join("ep0-ba20", "rank1.pt"))
    with caplog.at_level(logging.WARNING):
        assert _resume(store, two_remote, tmp_path / "fresh") == "ep0-ba10"
    assert "cannot use" in caplog.text and "checksum" in caplog.text
    assert not (tmp_path / "fresh" / "ep0-ba20" / "manifest.json").exists()


def _without_digest_metadata(s3_env: S3Server, uri: S3Uri, body: bytes | None = None) -> None:
    """The object again without its xxh3 metadata, as a backup restored with a plain upload."""
    client = s3_env.client()
    if body is None:
        body = client.get_object(Bucket=uri.bucket, Key=uri.key)["Body"].read()
    client.put_object(Bucket=uri.bucket, Key=uri.key, Body=body)
    assert client.head_object(Bucket=uri.bucket, Key=uri.key).get("Metadata") == {}


def test_objects_without_digest_metadata_are_checked_by_their_bytes(
    store: S3Store, s3_env: S3Server, two_remote: S3Uri, tmp_path: Path
) -> None:
    """A checkpoint put back into the bucket by a tool that drops object metadata was passed
    over ("carries checksum None"), and set aside when an older one verified: its bytes decide."""
    for rank in (0, 1):
        _without_digest_metadata(s3_env, two_remote.join("ep0-ba20", f"rank{rank}.pt"))
    found = find_remote_checkpoint(store, two_remote)
    assert found is not None and found.name == "ep0-ba20"
    assert _resume(store, two_remote, tmp_path / "fresh") == "ep0-ba20"
    # Without metadata and with other bytes, the download's check still falls back.
    victim = two_remote.join("ep0-ba20", "rank1.pt")
    info = store.head(victim)
    assert info is not None
    _without_digest_metadata(s3_env, victim, os.urandom(info.size))
    assert _resume(store, two_remote, tmp_path / "fresh-2") == "ep0-ba10"


def test_deleted_object_falls_back(
    store: S3Store, two_remote: S3Uri, caplog: pytest.LogCaptureFixture
) -> None:
    store.delete(two_remote.join("ep0-ba20", "rank1.pt"))
    with caplog.at_level(logging.WARNING):
        found = find_remote_checkpoint(store, two_remote)
    assert found is not None and found.name == "ep0-ba10"
    assert "rank1.pt (rank 1) is missing remotely" in caplog.text
    # Restricted to rank 0's files, the newest still serves rank 0.
    found = find_remote_checkpoint(store, two_remote, ranks=[0])
    assert found is not None and found.name == "ep0-ba20"


@pytest.mark.parametrize("damage", ["garbage", "deleted", "missing-rank"])
def test_broken_manifest_falls_back(
    store: S3Store, two_remote: S3Uri, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    key = two_remote.join("ep0-ba20", "manifest.json")
    if damage == "garbage":
        store.put_bytes(key, b'{"format": "rtj-checkpoint", "format_ver')
    elif damage == "deleted":
        store.delete(key)
    else:
        manifest = Manifest.from_json(store.get_bytes(key) or b"")
        manifest.files = manifest.files[:1]
        store.put_bytes(key, manifest.to_json().encode())
    with caplog.at_level(logging.WARNING):
        assert _resume(store, two_remote, tmp_path / "fresh") == "ep0-ba10"
    assert "latest.json names ep0-ba20, but" in caplog.text  # the pointer was not trusted


def test_committed_but_pointer_not_yet_moved(store: S3Store, two_remote: S3Uri) -> None:
    """Leader died between the manifest and the pointer: the manifest is the commit."""
    store.put_json(two_remote.join("latest.json"), {"checkpoint": "ep0-ba10"})
    found = find_remote_checkpoint(store, two_remote)
    assert found is not None and found.name == "ep0-ba20"


def test_quarantined_excluded_and_nothing_valid(
    store: S3Store, two_remote: S3Uri, tmp_path: Path
) -> None:
    assert _resume(store, two_remote, tmp_path / "a", exclude={"ep0-ba20"}) == "ep0-ba10"
    store.delete(two_remote.join("ep0-ba10", "rank0.pt"))
    store.delete(two_remote.join("ep0-ba20", "rank0.pt"))
    with pytest.raises(NoValidCheckpointError, match=r"ep0-ba20: .*ep0-ba10: "):
        resume_from_remote(store, two_remote, tmp_path / "b")
    assert resume_from_remote(store, two_remote.parent().join("other-run"), tmp_path / "c") is None


def test_download_per_rank_into_shared_folder(
    store: S3Store, two_remote: S3Uri, tmp_path: Path
) -> None:
    run_dir = tmp_path / "shared" / RUN
    ckpt = two_remote.join("ep0-ba20")
    folder = download_checkpoint(store, ckpt, run_dir, ranks=[1])
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", "rank1.pt"]
    assert download_checkpoint(store, ckpt, run_dir, ranks=[0]) == folder
    manifest = Manifest.read(folder)
    assert all(verify_entry(folder, e) is None for e in manifest.files)


def test_a_failed_download_removes_only_what_it_wrote(
    store: S3Store, two_remote: S3Uri, tmp_path: Path
) -> None:
    """A download that fails midway (rank 0's file in place, rank 1's object gone) left the
    folder with rank0.pt and no manifest: listed as NOT COMMITTED, for someone to delete later
    while another rank may use it. Now the failed call removes the files and the folder it
    created; what was there before (another rank's share, a committed checkpoint) stays."""
    run_dir = tmp_path / "node" / RUN
    older = download_checkpoint(store, two_remote.join("ep0-ba10"), run_dir)
    store.delete(two_remote.join("ep0-ba20", "rank1.pt"))
    with pytest.raises(ObjectNotFoundError):
        download_checkpoint(store, two_remote.join("ep0-ba20"), run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == ["ep0-ba10"]
    assert all(verify_entry(older, e) is None for e in Manifest.read(older).files)

    shared = tmp_path / "shared" / RUN
    folder = download_checkpoint(store, two_remote.join("ep0-ba20"), shared, ranks=[0])
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    with pytest.raises(ObjectNotFoundError):
        download_checkpoint(store, two_remote.join("ep0-ba20"), shared, ranks=[1])
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before  # rank 0's share


def test_a_checkpoint_that_fails_its_checksum_leaves_no_folder_behind(
    store: S3Store, s3_env: S3Server, two_remote: S3Uri, tmp_path: Path
) -> None:
    """Resume falls back past a checkpoint whose second file has damaged bytes: the first
    file it had downloaded goes with it, so the local run folder holds only the checkpoint
    resumed from."""
    _damage_keeping_metadata(s3_env, store, two_remote.join("ep0-ba20", "rank1.pt"))
    dest = tmp_path / "fresh" / RUN
    assert _resume(store, two_remote, dest) == "ep0-ba10"
    assert sorted(p.name for p in dest.iterdir()) == ["ep0-ba10"]


def test_fetch_load_path_forms(store: S3Store, two_remote: S3Uri, tmp_path: Path) -> None:
    folder = fetch_load_path(store, str(two_remote.join("ep0-ba10")), tmp_path / "a")
    assert folder == tmp_path / "a" / "ep0-ba10" and (folder / "manifest.json").exists()
    single = fetch_load_path(store, str(two_remote.join("ep0-ba10", "rank1.pt")), tmp_path / "b")
    assert single == tmp_path / "b" / "rank1.pt" and single.stat().st_size == (64 << 10) + 1
    newest = fetch_load_path(store, str(two_remote), tmp_path / "c")
    assert newest.name == "ep0-ba20"


def test_backend_seam(s3_env: S3Server, s3_root: S3Uri, tmp_path: Path) -> None:
    """The RemoteBackend the manager uses: submit, pending, find_newest, fetch, uri_for,
    close."""
    writer = S3Backend(str(s3_root), RUN, rank=0, world_size=1, backoff=Backoff(0.1, 0.5))
    run_dir = tmp_path / "node-a" / RUN
    _, manifest = make_checkpoint(run_dir, "ep0-ba10", 10)
    writer.submit(run_dir, manifest, 0)
    writer.close()
    assert writer.pending() == set()
    assert writer.uri_for("ep0-ba10") == f"{s3_root}/{RUN}/ep0-ba10"
    reader = S3Backend(str(s3_root), RUN, rank=0, world_size=1)
    choice = reader.find_newest(exclude=set())
    assert (choice.name, choice.world_size, choice.passed_over) == ("ep0-ba10", 1, [])
    fetched = reader.fetch("ep0-ba10", tmp_path / "node-b" / RUN, None)
    assert fetched == tmp_path / "node-b" / RUN / "ep0-ba10"
    assert reader.find_newest(exclude={"ep0-ba10"}).name is None
    reader.close()
