"""Setting a checkpoint aside: out of the candidates, into ``<run>/rejected/<name>/`` with why.

Resume sets aside the committed checkpoints it passed over, so that they no longer block the
run going on from an older one (``resume/rejection.py`` says why they are not deleted outright);
``overwrite=True`` sets aside those in the bucket that the run saves before. Both places keep
the evidence under ``rejected/``, which no listing takes for a candidate, and differ only in
what they can afford: a local folder is renamed whole (one ``rename``), and only the newest
``REJECTED_WITH_DATA`` keep their data files; a bucket has no rename, and copying a
multi-gigabyte checkpoint costs as much as uploading it again, so it keeps the manifest and
``reason.json`` and deletes the checkpoint manifest first (``deleter.BucketDeleter``).
(Rejected: the two halves in ``run_folder/layout.py`` and ``objectstore/rejected.py``, each with
its own idea of the folder and the reason; moving the pointer off a set-aside checkpoint stays with
the callers, which know what to name instead.)
"""

from __future__ import annotations

import contextlib
import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ..save import atomic
from .deleter import BucketDeleter, delete
from .names import (
    DATA_FILE,
    MANIFEST_NAME,
    REASON_FILE,
    REJECTED_DIR,
    REJECTED_WITH_DATA,
    REMOTE_REASON_FILE,
    TRIMMED_FILE,
)
from .retention import beyond_newest

if TYPE_CHECKING:  # boto3 only where a bucket is used
    from ..objectstore.store import S3Store
    from ..objectstore.uri import S3Uri

log = logging.getLogger(__name__)


def move_aside(root: Path, name: str, reason: str) -> Path | None:
    """Rename ``<root>/<name>`` into ``<root>/rejected/`` (``<name>.2`` and on when taken)
    with a ``REJECTED.txt`` that says when and why; None if it is not there (another rank on a
    shared folder moved it). Older set-aside folders then lose their data (``trim_rejected``)."""
    src = root / name
    if not src.is_dir():
        return None
    dest_root = root / REJECTED_DIR
    atomic.makedirs_durable(dest_root)
    dest = dest_root / name
    n = 1
    while dest.exists():
        n += 1
        dest = dest_root / f"{name}.{n}"
    try:
        os.rename(src, dest)
    except FileNotFoundError:
        return None
    atomic.fsync_dir(root)
    atomic.fsync_dir(dest_root)
    atomic.write_bytes_atomic(dest / REASON_FILE, f"set aside on {_now()}: {reason}\n".encode())
    log.warning("moved %s aside to %s: %s", name, dest, reason)
    trim_rejected(dest_root)
    return dest


def trim_rejected(rejected: Path) -> None:
    """Delete the data files of all but the newest ``REJECTED_WITH_DATA`` folders in
    ``rejected/`` (by when they were set aside); only files a save writes are deleted."""

    def set_aside_at(path: Path) -> float:
        try:
            return (path / REASON_FILE).stat().st_mtime
        except OSError:
            return 0.0

    folders = [Path(e.path) for e in os.scandir(rejected) if e.is_dir(follow_symlinks=False)]
    folders.sort(key=set_aside_at, reverse=True)
    for folder in beyond_newest(folders, REJECTED_WITH_DATA):
        data = [p for p in folder.iterdir() if DATA_FILE.fullmatch(p.name)]
        if not data:
            continue
        freed = 0
        for path in data:
            with contextlib.suppress(OSError):
                freed += path.stat().st_size
                path.unlink()
        atomic.write_bytes_atomic(  # not into REASON_FILE: its time orders the folders
            folder / TRIMMED_FILE,
            f"data files deleted on {_now()}: only the newest {REJECTED_WITH_DATA} folders "
            "set aside keep theirs\n".encode(),
        )
        log.info("deleted the data of %s (%d bytes): older set-aside folder", folder.name, freed)


def set_aside_in_bucket(
    store: S3Store, run_uri: S3Uri, name: str, manifest_body: bytes, reason: str
) -> S3Uri:
    """Keep ``name``'s manifest (``manifest_body``, as read) and ``reason.json`` under
    ``<run>/rejected/<name>/``, then delete the checkpoint manifest first; returns where."""
    aside = run_uri.join(REJECTED_DIR, name)
    store.put_bytes(aside.join(MANIFEST_NAME), manifest_body, content_type="application/json")
    store.put_json(
        aside.join(REMOTE_REASON_FILE),
        {
            "checkpoint": name,
            "reason": reason,
            "rejected_at": datetime.now(UTC).isoformat(),
        },
    )
    delete(BucketDeleter(store, run_uri), name)
    return aside


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
