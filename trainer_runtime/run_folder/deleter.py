"""Deleting a checkpoint manifest first, on a local disk or in a bucket: one order, two places.

A checkpoint is committed while its manifest is there (``save/commit.py`` writes it last), so a
deletion removes it first (``uncommit``) and only then the rest (``remove_rest``): a deletion
cut short leaves a folder that is no checkpoint, never a checkpoint missing files. Resume deletes
such a leftover locally (``rejection.remove_leftover``), and a bucket's listing never takes
one for a checkpoint. ``Deleter.delete`` is that order, written once; ``LocalDeleter`` and
``BucketDeleter`` only say how a manifest and the rest go in each place. (Rejected: each
caller, local retention, the ``keep_local`` copies, the remote prune, the bucket's set-aside
and a download replacing a stale copy, deleting in its own words.)
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..save import atomic
from .names import MANIFEST_NAME

if TYPE_CHECKING:  # boto3 only where a bucket is used
    from ..objectstore.store import S3Store
    from ..objectstore.uri import S3Uri


class Deleter(Protocol):
    """Where checkpoints are deleted: a run folder on a disk or under a bucket prefix."""

    def uncommit(self, name: str) -> None:
        """Remove ``name``'s manifest: from then on it is no checkpoint. Absent: nothing."""

    def remove_rest(self, name: str, files: Sequence[str] | None = None) -> None:
        """Remove what is left of ``name`` once uncommitted: ``files`` (relative paths) and
        the folder if that empties it, or the whole folder when None."""


def delete(where: Deleter, name: str, files: Sequence[str] | None = None) -> None:
    """Delete checkpoint ``name`` (only ``files`` of it, when given) manifest first."""
    where.uncommit(name)
    where.remove_rest(name, files)


class LocalDeleter:
    """Checkpoints in a run folder on a local or shared filesystem."""

    def __init__(self, root: Path | str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def uncommit(self, name: str) -> None:
        folder = self.root / name
        with contextlib.suppress(FileNotFoundError):
            (folder / MANIFEST_NAME).unlink()
            atomic.fsync_dir(folder)  # durable before anything else of it goes

    def remove_rest(self, name: str, files: Sequence[str] | None = None) -> None:
        folder = self.root / name
        if files is None:
            shutil.rmtree(folder, ignore_errors=True)
            return
        for rel in files:
            with contextlib.suppress(FileNotFoundError):
                (folder / rel).unlink()
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty: on a shared disk other ranks' files stay


class BucketDeleter:
    """Checkpoints under a run's prefix in an object store (``<run_uri>/<name>/...``)."""

    def __init__(self, store: S3Store, run_uri: S3Uri) -> None:
        self.store = store
        self.run_uri = run_uri

    def uncommit(self, name: str) -> None:
        self.store.delete(self.run_uri.join(name, MANIFEST_NAME))

    def remove_rest(self, name: str, files: Sequence[str] | None = None) -> None:
        ckpt = self.run_uri.join(name)
        if files is None:
            self.store.delete_prefix(ckpt)
            return
        for rel in files:
            self.store.delete(ckpt.join(rel))
