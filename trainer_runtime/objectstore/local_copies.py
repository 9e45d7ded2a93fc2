"""``keep_local``: how many uploaded checkpoints stay on the local disk, and deleting the rest.

With an object store the local disk is a cache: a node's disk is small and lost with the node.
After each upload the uploader hands the checkpoint here; the newest ``keep_local`` uploaded
ones stay, older ones are deleted, unless they were submitted again meanwhile (still pending).
The leader deletes the whole folder, uncommitting it first (the manifest goes before the data,
so a half-deleted folder is no checkpoint); other ranks delete only their own files.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from .. import atomic
from ..layout import progress_key
from ..manifest import MANIFEST_NAME, Manifest

log = logging.getLogger("trainer_runtime.objectstore.uploader")


class UploadedLocalCopies:
    """The uploaded checkpoints this process still keeps locally, newest first."""

    def __init__(self, keep: int, leader_rank: int) -> None:
        self.keep = keep
        self.leader_rank = leader_rank
        self._kept: list[tuple[tuple, Path, Manifest]] = []

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
        kept = [e for e in self._kept if e[1] != local_dir]
        kept.append((progress_key(manifest), local_dir, manifest))
        kept.sort(key=lambda e: e[0], reverse=True)
        self._kept = kept[: self.keep]
        for entry in kept[self.keep :]:
            if still_pending(entry[2].name):
                self._kept.append(entry)  # re-submitted meanwhile: not yet
                continue
            if rank != self.leader_rank and not committed_remotely(entry[2]):
                self._kept.append(entry)  # not a remote checkpoint yet: tried again later
                continue
            self._delete(entry[1], entry[2], rank)
        self._kept.sort(key=lambda e: e[0], reverse=True)

    def _delete(self, folder: Path, manifest: Manifest, rank: int) -> None:
        """Leader: the whole folder (all ranks' files are remote); others: their own files."""
        try:
            if rank == self.leader_rank:
                with contextlib.suppress(FileNotFoundError):
                    (folder / MANIFEST_NAME).unlink()  # uncommit first: a half-deleted
                    atomic.fsync_dir(folder)  # folder is then no checkpoint
                shutil.rmtree(folder, ignore_errors=True)
            else:
                for entry in manifest.files_for_rank(rank):
                    with contextlib.suppress(FileNotFoundError):
                        (folder / entry.path).unlink()
                with contextlib.suppress(OSError):
                    folder.rmdir()
            log.info(
                "object store: deleted local copy %s (uploaded; keep_local=%d)", folder, self.keep
            )
        except OSError as exc:
            log.warning("object store: could not delete local copy %s: %s", folder, exc)
