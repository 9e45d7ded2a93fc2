"""``keep_local``: how many uploaded checkpoints stay on the local disk, and deleting the rest.

With an object store the local disk is a cache: a node's disk is small and lost with the node.
After each upload the uploader hands the checkpoint here; the newest ``keep_local`` uploaded
ones stay, older ones are deleted, unless they were submitted again meanwhile (still pending).
Every rank uncommits the folder first (the manifest goes before the data, so a half-deleted
folder is no checkpoint: on node-local disks each node holds a manifest copy over its own
files); then the leader deletes the whole folder and other ranks only their own files.

Local checkpoints this process did not upload (the one a resume downloaded, those an earlier
attempt left on the disk) are *adopted* at start-up: they count like uploaded ones, but go only
once the bucket holds them committed, and only at the next upload, when every rank has long
finished loading the one it resumed from (on a shared volume another rank may still read it
while this one returns from its resume), or at ``close()`` when no upload came (a resumed run
that saved nothing): a resume from the store ends with every rank's load done.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..run_folder.deleter import LocalDeleter, delete
from ..run_folder.layout import RunFolder, progress_key
from ..run_folder.names import POINTER_NAME
from ..run_folder.retention import beyond_newest
from ..save.manifest import Manifest

log = logging.getLogger("trainer_runtime.objectstore.uploader")


@dataclass(frozen=True)
class _LocalCopy:
    folder: Path
    manifest: Manifest
    adopted: bool
    """Found on the disk at start-up rather than uploaded by this process."""

    @property
    def key(self) -> tuple:
        return progress_key(self.manifest)


class UploadedLocalCopies:
    """The uploaded checkpoints this process still keeps locally, newest first."""

    def __init__(self, keep: int, leader_rank: int) -> None:
        self.keep = keep
        self.leader_rank = leader_rank
        self._kept: list[_LocalCopy] = []
        self._lock = threading.Lock()  # adopt (start-up) beside uploaded (the worker thread)

    def adopt(self, manifest: Manifest, local_dir: Path) -> None:
        """Count a local checkpoint this process did not upload among the kept ones; it is
        deleted at a later ``uploaded`` once it is beyond the newest ``keep`` and committed in
        the bucket (a local checkpoint the bucket lacks is never deleted here)."""
        with self._lock:
            if all(c.folder != local_dir for c in self._kept):
                self._kept.append(_LocalCopy(local_dir, manifest, adopted=True))
                self._kept.sort(key=lambda c: c.key, reverse=True)

    def uploaded(
        self,
        manifest: Manifest,
        local_dir: Path,
        rank: int,
        *,
        still_pending: Callable[[str], bool],
        committed_remotely: Callable[[Manifest], bool] = lambda _: True,
    ) -> None:
        """Record an upload of ``rank``'s share; delete local copies beyond the newest ``keep``.

        On the leader an upload ends with the remote commit. Another rank's upload ends when
        its own files are in the bucket, before the leader has committed the checkpoint there
        (or if the leader dies, never): its copy goes only once ``committed_remotely`` says the
        manifest is up, so a crash meanwhile still leaves the checkpoint whole on the disk.
        """
        with self._lock:
            kept = [c for c in self._kept if c.folder != local_dir]
            kept.append(_LocalCopy(local_dir, manifest, adopted=False))
            self._trim(kept, rank, still_pending, committed_remotely)

    def at_close(
        self,
        rank: int,
        *,
        still_pending: Callable[[str], bool],
        committed_remotely: Callable[[Manifest], bool],
    ) -> None:
        """The uploads are flushed: delete the copies beyond the newest ``keep`` that no
        upload will come to delete. A run that resumed from the bucket and ends without a
        save uploads nothing, and its downloaded copy stayed for good (keep_local=0 included).
        Every rank finished loading at resume (``Resumer._adopt`` waits for all of them)."""
        with self._lock:
            self._trim(list(self._kept), rank, still_pending, committed_remotely)

    def _trim(
        self,
        kept: list[_LocalCopy],
        rank: int,
        still_pending: Callable[[str], bool],
        committed_remotely: Callable[[Manifest], bool],
    ) -> None:
        """Keep the newest ``keep`` of ``kept``; delete the others, except those still
        pending and those the bucket does not hold committed yet (the only copy). Called
        with ``self._lock`` held."""
        kept.sort(key=lambda c: c.key, reverse=True)
        beyond = beyond_newest(kept, self.keep)
        self._kept = [c for c in kept if c not in beyond]
        for copy in beyond:
            if still_pending(copy.manifest.name):
                self._kept.append(copy)  # re-submitted meanwhile: not yet
                continue
            if (copy.adopted or rank != self.leader_rank) and not committed_remotely(copy.manifest):
                self._kept.append(copy)  # not a remote checkpoint yet: tried again later
                continue
            self._delete(copy, rank)
        self._kept.sort(key=lambda c: c.key, reverse=True)

    def _delete(self, copy: _LocalCopy, rank: int) -> None:
        """The whole folder on the leader, and on every rank for an adopted copy (all ranks'
        files are remote); otherwise this rank's own files."""
        folder, manifest = copy.folder, copy.manifest
        whole = rank == self.leader_rank or copy.adopted
        own = None if whole else [entry.path for entry in manifest.files_for_rank(rank)]
        try:
            # Every rank uncommits first, so a half-deleted folder is no checkpoint: on
            # node-local disks each node holds a copy of the manifest over its own files, and
            # on a shared disk the leader removes the rest (the bucket holds it committed).
            delete(LocalDeleter(folder.parent), folder.name, own)
            _unpoint(RunFolder(folder.parent), manifest.name)
            log.info(
                "object store: deleted local copy %s (uploaded; keep_local=%d)", folder, self.keep
            )
        except OSError as exc:
            log.warning("object store: could not delete local copy %s: %s", folder, exc)


def _unpoint(run: RunFolder, name: str) -> None:
    """The local ``latest.json`` and latest links that named the deleted copy go with it
    (keep_local=0 deletes the newest): left behind, they named a missing checkpoint and every
    later resume warned about them. The bucket's pointer still names it. A commit that rewrites
    the pointer between the read and the unlink loses it until the next commit: resume does not
    read it (it lists the folder), and no pointer is better than one to nothing."""
    if run.pointer_name() == name:
        with contextlib.suppress(FileNotFoundError):
            (run.root / POINTER_NAME).unlink()
    for link, target in run.latest_links().items():
        if target == name:
            with contextlib.suppress(FileNotFoundError):
                link.unlink()
