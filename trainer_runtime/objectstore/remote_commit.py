"""One checkpoint into the bucket, in the order that keeps the remote copy valid.

For one checkpoint, every rank first uploads its own data files; the leader rank then waits
until *every* rank's objects are present with the manifest's size and xxh3 digest (HEAD
requests, bounded, with backoff), and only then uploads ``manifest.json``, and only after that
``latest.json``, which never moves back to an older checkpoint. A reader of the bucket can
therefore trust any manifest it finds, and the pointer always names a checkpoint whose manifest
is already there. Remote retention (``prune_remote``) runs after the pointer moved, as a step
of its own (the uploader reports a prune apart from the upload it follows).

The queue, retries and local copies around it are ``uploader.py``'s.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ManifestError
from ..run_folder.deleter import BucketDeleter, delete
from ..run_folder.layout import RunFolder, pointer_body
from ..run_folder.names import MANIFEST_NAME, POINTER_NAME
from ..run_folder.retention import select_for_deletion
from ..save.manifest import FileEntry, Manifest
from ..timestamp import Timestamp
from .bucket_fence import check_before_commit
from .errors import ObjectStoreError
from .folder import remote_run_folder, verify_remote
from .retry import Backoff
from .store import S3Store
from .uri import S3Uri

log = logging.getLogger("trainer_runtime.objectstore.uploader")


def matches(info: object, entry: FileEntry) -> bool:
    """True when a HEAD result is the manifest entry's object (size and xxh3 metadata)."""
    return (
        info is not None
        and getattr(info, "size", None) == entry.size
        and getattr(info, "xxh3", None) == entry.xxh3_128
    )


def not_committed_remotely(
    store: S3Store, run_uri: S3Uri, local: RunFolder, rank: int
) -> list[Manifest]:
    """Local checkpoints with files of ``rank`` newer than what the remote ``latest.json``
    names (all of them, if it names none), newest first."""
    current = None
    with contextlib.suppress(ValueError):
        current = store.get_json(run_uri.join(POINTER_NAME))
    floor = None
    if isinstance(current, dict) and isinstance(current.get("timestamp"), dict):
        with contextlib.suppress(TypeError, ValueError):
            floor = Timestamp.from_dict(current["timestamp"]).sort_key()
    return [
        m
        for m in local.committed()
        if m.files_for_rank(rank) and (floor is None or m.timestamp.sort_key() > floor)
    ]


@dataclass
class RemoteCommitter:
    """Uploads a rank's files of a checkpoint; on the leader, waits for the others and commits."""

    store: S3Store
    run_uri: S3Uri
    leader_rank: int
    peer_timeout_s: float
    keep_remote: int
    """-1 keeps every remote checkpoint; N >= 1 prunes all but the newest N that verify."""
    stop: threading.Event

    def upload(self, manifest: Manifest, local_dir: Path, rank: int, *, check_first: bool) -> int:
        """One attempt at ``rank``'s share of a checkpoint (and, on the leader, its commit);
        returns the bytes sent. With ``check_first``, objects already present and verified are
        skipped (a retry or a resubmission after a restart)."""
        ckpt = self.run_uri.join(manifest.name)
        sent = 0
        for entry in manifest.files_for_rank(rank):
            remote = ckpt.join(entry.path)
            if check_first and matches(self.store.head(remote), entry):
                continue
            self.store.upload_file(
                local_dir / entry.path,
                remote,
                size=entry.size,
                xxh3=entry.xxh3_128,
                stop=self.stop,
            )
            sent += entry.size
        if rank == self.leader_rank:
            self._wait_for_peers(manifest, rank, ckpt)
            self._commit(manifest, local_dir, ckpt)
        return sent

    def _wait_for_peers(self, manifest: Manifest, rank: int, ckpt: S3Uri) -> None:
        """Poll until every file of every rank is remote and matches; bounded by the timeout."""
        missing = [e for e in manifest.files if e.rank != rank]
        deadline = time.monotonic() + self.peer_timeout_s
        poll = Backoff(initial=0.2, maximum=5.0)
        attempt = 0
        while missing:
            missing = [e for e in missing if not matches(self.store.head(ckpt.join(e.path)), e)]
            if not missing:
                return
            if time.monotonic() >= deadline:
                ranks = sorted({e.rank for e in missing})
                raise ObjectStoreError(
                    f"ranks {ranks} have not uploaded their files of {manifest.name} within "
                    f"{self.peer_timeout_s:.0f}s; not committing it remotely"
                )
            if self.stop.wait(min(poll.delay(attempt), max(0.0, deadline - time.monotonic()))):
                raise ObjectStoreError("uploader stopped while waiting for other ranks")
            attempt += 1

    def _commit(self, manifest: Manifest, local_dir: Path, ckpt: S3Uri) -> None:
        """Manifest, then pointer (only forward): the two steps that make it visible."""
        local_manifest = local_dir / MANIFEST_NAME
        try:
            body = local_manifest.read_bytes()
            Manifest.from_json(body, source=str(local_manifest))
        except (OSError, ManifestError):
            body = manifest.to_json().encode()
        check_before_commit(self.store, self.run_uri, manifest)  # a newer gang owns the run?
        self.store.put_bytes(ckpt.join(MANIFEST_NAME), body, content_type="application/json")
        pointer_uri = self.run_uri.join(POINTER_NAME)
        current = None
        with contextlib.suppress(ValueError):
            current = self.store.get_json(pointer_uri)
        if (
            isinstance(current, dict)
            and isinstance(current.get("timestamp"), dict)
            and current.get("checkpoint") != manifest.name
        ):
            try:
                theirs = Timestamp.from_dict(current["timestamp"]).sort_key()
            except (TypeError, ValueError):
                theirs = None
            if theirs is not None and theirs > manifest.timestamp.sort_key():
                log.info(
                    "object store: %s is committed remotely; latest.json stays on the newer %s",
                    manifest.name,
                    current.get("checkpoint"),
                )
                return
        self.store.put_json(pointer_uri, pointer_body(manifest))

    def prunes(self, rank: int) -> bool:
        """Whether ``rank``'s uploads are followed by ``prune`` (the leader, keep_remote)."""
        return rank == self.leader_rank and self.keep_remote > 0

    def prune(self, after: str) -> None:
        """Remote retention, once ``after`` is committed; best effort: a failure is logged."""
        try:
            prune_remote(self.store, self.run_uri, keep=self.keep_remote)
        except ObjectStoreError as exc:
            log.warning(
                "object store: pruning old checkpoints under %s (keep_remote=%d, after %s) "
                "failed: %s",
                self.run_uri,
                self.keep_remote,
                after,
                exc,
            )


def prune_remote(store: S3Store, run_uri: S3Uri, *, keep: int) -> list[str]:
    """Delete committed remote checkpoints older than the newest ``keep`` that verify.

    Never touches folders without a manifest (another rank may be uploading them), nor the
    checkpoint ``latest.json`` names, nor anything newer than the last one kept. Deletes the
    manifest first, so a half-pruned checkpoint is simply not a checkpoint.
    """
    if keep < 1:
        raise ValueError(f"keep={keep}: expected >= 1")
    folder = remote_run_folder(store, run_uri)
    committed = folder.committed()
    pointer = None
    with contextlib.suppress(ObjectStoreError):
        pointer = folder.pointer_name()
    by_name = {m.name: m for m in committed}
    doomed = select_for_deletion(
        [m.name for m in committed],
        keep=keep,
        protected={pointer} if pointer else set(),
        counts=lambda name: (
            verify_remote(store, run_uri, by_name[name], require_digest=True) is None
        ),
    )
    deleted: list[str] = []
    bucket = BucketDeleter(store, run_uri)
    for manifest in (by_name[name] for name in doomed):
        delete(bucket, manifest.name)
        deleted.append(manifest.name)
        log.info(
            "object store: pruned remote checkpoint %s (keep_remote=%d)",
            run_uri.join(manifest.name),
            keep,
        )
    return deleted
