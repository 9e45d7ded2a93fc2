"""The remote side of autoresume: find the newest remote checkpoint that verifies, fetch it.

Order of trust: ``latest.json`` names the checkpoint the leader last committed, but it is only a
hint. Every checkpoint folder under the run is considered (the pointer's own target included,
even if a listing were stale), newest first by the training progress its manifest records
(``layout.RunFolder`` over ``folder.StorePrefix``: the same listing as a local run folder);
the first whose every file is present with the manifest's size and xxh3 metadata is chosen
(``fallback.first_valid``), and its download is verified byte by byte. When the newest is torn
(no manifest), missing a rank, or fails a checksum, the next older one is tried, with a log
line saying why.

Downloads follow the local commit protocol: each file appears under its name only once its bytes
are verified and durable, and the manifest is written last, so a crash mid-download leaves a
folder without a manifest, which is no checkpoint (the same rule as a local save). A download
that fails with an error (bytes that fail their checksum, an object gone, the store gone)
removes what it wrote before raising.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ManifestError, NoCheckpointError
from ..remote import RemoteChoice, newest_fetched
from ..run_folder.deleter import LocalDeleter
from ..run_folder.fallback import first_valid
from ..save import atomic
from ..save.manifest import MANIFEST_NAME, FileEntry, Manifest, verify_entry
from .errors import (
    ChecksumMismatchError,
    NoValidCheckpointError,
    ObjectNotFoundError,
    ObjectStoreError,
    is_transient,
)
from .folder import remote_run_folder, verify_remote
from .retry import Backoff, retry_call
from .store import S3Store
from .uri import S3Uri, parse_s3_uri

if TYPE_CHECKING:
    from ..run_folder.fallback import Walk

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RemoteCheckpoint:
    """A committed checkpoint in the bucket: its folder and its (parsed) manifest."""

    uri: S3Uri
    manifest: Manifest

    @property
    def name(self) -> str:
        return self.manifest.name


def _uri(value: S3Uri | str, arg: str) -> S3Uri:
    return value if isinstance(value, S3Uri) else parse_s3_uri(value, arg=arg)


def remote_pointer(store: S3Store, run_uri: S3Uri | str) -> str | None:
    """The checkpoint name ``latest.json`` gives, or None (absent or unreadable)."""
    return remote_run_folder(store, _uri(run_uri, "run_uri")).pointer_name()


def list_remote_checkpoints(
    store: S3Store, run_uri: S3Uri | str, *, exclude: Collection[str] = ()
) -> list[RemoteCheckpoint]:
    """Committed checkpoints of the run (manifest parses), newest first; no file is checked.

    The listing and order are ``layout.RunFolder``'s (ties go to the one ``latest.json``
    names, which is a candidate even if the listing lags). Folders without a valid manifest
    and names in ``exclude`` (quarantined) are skipped with a log line.
    """
    run = _uri(run_uri, "run_uri")
    folder = remote_run_folder(store, run)
    pointer = folder.pointer_name()
    result: list[RemoteCheckpoint] = []
    for cand in folder.candidates():
        if cand.name in exclude:
            log.info(
                "object store: skipping remote checkpoint %s (quarantined, or already tried)",
                run.join(cand.name),
            )
        elif cand.manifest is None:
            if cand.name == pointer:
                log.warning(
                    "object store: latest.json names %s, but %s; falling back",
                    cand.name,
                    cand.reason,
                )
            else:
                log.info(
                    "object store: %s is not a checkpoint: %s", run.join(cand.name), cand.reason
                )
        else:
            result.append(RemoteCheckpoint(run.join(cand.name), cand.manifest))
    return result


def find_remote_checkpoint(
    store: S3Store,
    run_uri: S3Uri | str,
    *,
    exclude: Collection[str] = (),
    ranks: Collection[int] | None = None,
) -> RemoteCheckpoint | None:
    """The newest committed checkpoint whose files (of ``ranks``; all by default) verify by HEAD.

    Only metadata is checked here (size and the xxh3 recorded at upload); the bytes are checked
    when downloaded. Returns None when the run has no remote checkpoint at all.
    """
    return walk_remote_checkpoints(store, run_uri, exclude=exclude, ranks=ranks).chosen


def walk_remote_checkpoints(
    store: S3Store,
    run_uri: S3Uri | str,
    *,
    exclude: Collection[str] = (),
    pass_over: Mapping[str, str] | None = None,
    ranks: Collection[int] | None = None,
) -> Walk[RemoteCheckpoint]:
    """``find_remote_checkpoint``, with every newer committed checkpoint passed over and why:
    those that do not verify by HEAD, and those named in ``pass_over`` (name: reason, without a
    request). Names in ``exclude`` are skipped with a log line only."""
    run = _uri(run_uri, "run_uri")
    rank_list = None if ranks is None else list(ranks)
    given = pass_over or {}
    return first_valid(
        list_remote_checkpoints(store, run, exclude=exclude),
        lambda ckpt: given.get(ckpt.name) or verify_remote(store, run, ckpt.manifest, rank_list),
        on_reject=lambda ckpt, why: log.warning(
            "object store: passing over remote checkpoint %s (%s); trying an older one",
            ckpt.uri,
            why,
        ),
    )


def download_checkpoint(
    store: S3Store,
    checkpoint: RemoteCheckpoint | S3Uri | str,
    local_run_dir: str | os.PathLike[str],
    *,
    ranks: Collection[int] | None = None,
    attempts: int = 4,
    backoff: Backoff | None = None,
) -> Path:
    """Download a committed checkpoint into ``local_run_dir/<name>``, verified; returns it.

    The local commit protocol is kept: each file lands atomically (temporary name, fsync,
    rename) after its xxh3 is checked, and the manifest is written last, so a download cut
    short (the process killed) leaves a folder without a manifest, which is no checkpoint. A
    download that fails with an error removes the files it put in place and the checkpoint
    folder if it created it and nothing else is in it, before raising; files that were there
    (another rank's share) stay. Files already there that verify are not fetched again (a
    resume killed mid-download continues cheaply), so several ranks can fill one shared
    folder, each with its own ``ranks``. A local manifest that differs from the remote one is
    removed first. Transient failures are retried (``attempts`` per file, waits from
    ``backoff``): a server that restarts mid-download is waited for, and the retry fetches the
    file again. Then ChecksumMismatchError (bytes do not match) or ObjectNotFoundError (object
    gone) mean "broken, use an older one", while any other ObjectStoreError means the store is
    not usable right now. A local disk that
    cannot take the file (full, read-only) raises its OSError at once: retrying cannot help.
    """
    checkpoint = _committed(store, checkpoint)
    manifest = checkpoint.manifest
    entries = [e for e in manifest.files if ranks is None or e.rank in ranks]
    folder = Path(local_run_dir) / manifest.name
    made = _Written(folder)
    atomic.makedirs_durable(folder)
    manifest_path = folder / MANIFEST_NAME
    body = manifest.to_json().encode()
    _uncommit_if_stale(folder, body)
    wait = backoff or Backoff(initial=1.0, maximum=8.0)
    fetch = partial(_fetch_file, store, attempts=attempts, wait=wait)
    fetched = 0
    try:
        for entry in entries:
            dest = folder / entry.path
            if dest.exists() and verify_entry(folder, entry) is None:
                continue
            made.folder_for(dest)
            fetch(checkpoint.uri.join(entry.path), dest, entry=entry)
            made.files.append(dest)
            fetched += entry.size
        if not manifest_path.exists():
            atomic.write_bytes_atomic(manifest_path, body)
    except Exception:
        made.remove(checkpoint.uri)
        raise
    log.info(
        "object store: fetched %s (%d file(s), %d bytes downloaded) into %s",
        checkpoint.uri,
        len(entries),
        fetched,
        folder,
    )
    return folder


def _committed(store: S3Store, checkpoint: RemoteCheckpoint | S3Uri | str) -> RemoteCheckpoint:
    """The checkpoint at ``checkpoint`` with its manifest; ObjectStoreError when it has none
    (not committed) or one that does not parse."""
    if isinstance(checkpoint, RemoteCheckpoint):
        return checkpoint
    uri = _uri(checkpoint, "checkpoint")
    data = store.get_bytes(uri.join(MANIFEST_NAME))
    if data is None:
        raise ObjectStoreError(f"{uri} has no {MANIFEST_NAME}: not a committed checkpoint")
    try:
        return RemoteCheckpoint(uri, Manifest.from_json(data, source=str(uri)))
    except ManifestError as exc:
        raise ObjectStoreError(str(exc)) from exc


def _uncommit_if_stale(folder: Path, body: bytes) -> None:
    """Uncommit a local copy of the checkpoint whose manifest is not ``body`` (the remote
    one), before any of its files is touched."""
    manifest_path = folder / MANIFEST_NAME
    with contextlib.suppress(FileNotFoundError):
        if manifest_path.read_bytes() != body:
            log.warning(
                "object store: local %s differs from the remote one; replacing it", manifest_path
            )
            LocalDeleter(folder.parent).uncommit(folder.name)


def _fetch_file(
    store: S3Store, source: S3Uri, dest: Path, *, entry: FileEntry, attempts: int, wait: Backoff
) -> None:
    """Download one manifest entry to ``dest``, verified, retrying transient failures."""
    retry_call(
        lambda: store.download_file(source, dest, size=entry.size, xxh3=entry.xxh3_128),
        attempts=attempts,
        backoff=wait,
        retryable=is_transient,
        what=f"GET {source}",
    )


class _Written:
    """What one ``download_checkpoint`` call put on the disk: the files it renamed into place
    and the folders it created. A failed download removes exactly these, so it leaves no
    partial folder (listed as NOT COMMITTED, and deleted later only at the risk of racing a
    rank that fills the same shared folder), and never touches files that were there before
    (another rank's share, files that already verified)."""

    def __init__(self, folder: Path) -> None:
        self.files: list[Path] = []
        self.folders: list[Path] = [] if folder.exists() else [folder]

    def folder_for(self, dest: Path) -> None:
        """Create ``dest``'s folder (a manifest entry may lie in a subfolder), noting it."""
        if not dest.parent.exists():
            self.folders.append(dest.parent)
            dest.parent.mkdir(parents=True, exist_ok=True)

    def remove(self, source: S3Uri) -> None:
        for path in self.files:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        for folder in reversed(self.folders):  # innermost first; one another rank uses stays
            with contextlib.suppress(OSError):
                folder.rmdir()
        if self.files or self.folders:
            log.warning(
                "object store: the download of %s failed; removed the %d file(s) it had "
                "written and the folder(s) it had created",
                source,
                len(self.files),
            )


def resume_from_remote(
    store: S3Store,
    run_uri: S3Uri | str,
    local_run_dir: str | os.PathLike[str],
    *,
    exclude: Collection[str] = (),
    ranks: Collection[int] | None = None,
    on_reject: Callable[[str, str], None] | None = None,
) -> tuple[RemoteCheckpoint, Path] | None:
    """Find and download the newest remote checkpoint that verifies, falling back to older ones
    (each one passed over is logged, and given to ``on_reject(name, reason)``): the walk resume
    takes (``remote.newest_fetched``) with one reader instead of every rank.

    Returns None when the run has no remote checkpoint; raises NoValidCheckpointError when it
    has some but none could be downloaded intact (each one's reason is in the message).
    """
    run = _uri(run_uri, "run_uri")
    rank_list = None if ranks is None else list(ranks)
    met: dict[str, RemoteCheckpoint] = {}
    fetched: dict[str, Path] = {}
    reported: set[str] = set()

    def report(name: str, why: str) -> None:
        if on_reject is not None and name not in reported:
            on_reject(name, why)
        reported.add(name)

    def find(tried: set[str]) -> RemoteChoice:
        walk = walk_remote_checkpoints(store, run, exclude={*exclude, *tried}, ranks=rank_list)
        passed = [(ckpt.name, why) for ckpt, why in walk.passed_over]
        for name, why in passed:
            report(name, why)
        if walk.chosen is None:
            return RemoteChoice(None, passed_over=passed)
        met[walk.chosen.name] = walk.chosen
        return RemoteChoice(walk.chosen.name, walk.chosen.manifest.world_size, passed)

    def fetch(name: str, _saved_world: int) -> str | None:
        try:
            fetched[name] = download_checkpoint(store, met[name], local_run_dir, ranks=ranks)
        except (ChecksumMismatchError, ObjectNotFoundError) as exc:
            return str(exc)  # this checkpoint is broken; a store outage propagates
        return None

    def broken(name: str, why: str) -> None:
        log.warning(
            "object store: cannot use %s (%s); trying an older checkpoint", run.join(name), why
        )
        report(name, why)

    chosen, passed = newest_fetched(find, fetch, on_broken=broken)
    if chosen is not None:
        return met[chosen], fetched[chosen]
    if not passed:
        return None
    raise NoValidCheckpointError(
        f"no remote checkpoint under {run} verifies: "
        + "; ".join(f"{name}: {why}" for name, why in passed)
    )


def fetch_load_path(
    store: S3Store,
    location: S3Uri | str,
    local_dir: str | os.PathLike[str],
    *,
    ranks: Collection[int] | None = None,
    exclude: Collection[str] = (),
    on_reject: Callable[[str, str], None] | None = None,
) -> Path:
    """Fetch a user's ``load_path`` into ``local_dir``; returns the local path to load.

    ``location`` may be a checkpoint folder (has ``manifest.json``: downloaded and verified),
    a run folder (its newest verifying checkpoint, with fallback: ``on_reject(name, reason)``
    for each newer one passed over), or a single object (e.g. ``.../rank0.pt``, verified
    against its xxh3 metadata when it has one). Nothing there: ``NoCheckpointError``, as for a
    local load path that holds nothing.
    """
    uri = _uri(location, "load_path")
    local = Path(local_dir)
    if uri.key and store.head(uri.join(MANIFEST_NAME)) is not None:
        return download_checkpoint(store, uri, local, ranks=ranks)
    if uri.key and store.head(uri) is not None:
        atomic.makedirs_durable(local)
        dest = local / uri.name
        store.download_file(uri, dest)
        return dest
    found = resume_from_remote(store, uri, local, exclude=exclude, ranks=ranks, on_reject=on_reject)
    if found is None:
        raise NoCheckpointError(
            f"load_path {uri} is neither a checkpoint, a run folder with checkpoints, nor an object"
        )
    return found[1]
