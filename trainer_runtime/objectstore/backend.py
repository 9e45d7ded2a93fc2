"""``S3Backend``: the object store behind the core's ``RemoteBackend`` seam (``remote.py``).

It only adapts: the uploader does the write path, the resolver the read path. Building one
checks the location (URI, bucket, credentials, endpoint, write permission) at once, so a bad
configuration fails before training starts, not at the first upload an hour later.

Rank 0 names the checkpoint to resume (``find_newest``) and every rank fetches it (``fetch``);
the walk past broken ones is the caller's (``remote.newest_fetched``). (Rejected: a call that
finds and downloads at once, ``fetch_newest``: the ranks could not agree on one checkpoint
through it, and it was a second walk.)
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..remote import RemoteBackendBase, RemoteChoice
from ..run import arguments
from ..save.manifest import Manifest
from ..timestamp import Timestamp
from .bucket_fence import claim_at_start
from .errors import is_transient
from .folder import remote_run_folder
from .rejected import reject_remote, repair_pointer
from .resolver import (
    download_checkpoint,
    walk_remote_checkpoints,
)
from .retry import Backoff, retry_call
from .store import S3Store, TransferSettings, open_store
from .uploader import CheckpointUploader, check_retention
from .uri import S3Uri, parse_s3_uri

log = logging.getLogger(__name__)

RESUME_BACKOFF = Backoff(initial=2.0, maximum=30.0)
"""Waits between the ``resume_attempts`` of a listing or a download at resume (about a minute
in all with the default 6 attempts)."""


class S3Backend(RemoteBackendBase):
    """Uploads this rank's checkpoints in the background and fetches the newest remote one;
    every capability of ``remote.RemoteBackend``, optional ones included."""

    def __init__(
        self,
        location: S3Uri | str,
        run_name: str,
        *,
        rank: int = 0,
        world_size: int = 1,
        keep_local: int | None = None,
        keep_remote: int = -1,
        flush_timeout_s: float = 120.0,
        resume_attempts: int = 6,
        peer_timeout_s: float = 1800.0,
        transfer: TransferSettings | None = None,
        backoff: Backoff | None = None,
        store: S3Store | None = None,
        arg: str = "folder",
        **store_kwargs: Any,
    ) -> None:
        """``location`` is the checkpoint root ``s3://bucket/prefix``; the run lives under
        ``<location>/<run_name>/``. Raises ValueError (malformed URI) or
        ObjectStoreConfigError (missing bucket, denied credentials, unreachable endpoint).
        ``arg`` names the user's argument in those messages. A negative or NaN
        ``flush_timeout_s`` / ``peer_timeout_s``, ``resume_attempts`` < 1, or a
        ``keep_local`` / ``keep_remote`` that is no retention count, is a
        ConfigError naming the argument, raised before any request.
        """
        self.flush_timeout_s = arguments.seconds(
            "flush_timeout_s", flush_timeout_s, "seconds >= 0", lambda s: s >= 0
        )
        peer_timeout_s = arguments.seconds(
            "peer_timeout_s", peer_timeout_s, "seconds > 0", lambda s: s > 0
        )
        self.resume_attempts = arguments.integer(
            "resume_attempts", resume_attempts, "a count >= 1", lambda n: n >= 1
        )
        check_retention(keep_local, keep_remote)
        if store is None:
            store, root = open_store(location, arg=arg, transfer=transfer, **store_kwargs)
        else:
            root = location if isinstance(location, S3Uri) else parse_s3_uri(location, arg=arg)
            store.check_access(root, write=True, arg=arg)
        self.store = store
        self.resume_store = store.responsive()
        """Resume's listing, downloads and repairs: every rank waits on them, so a hung store
        fails each request within seconds (``S3Store.responsive``); uploads keep ``store``."""
        self.run_uri = root.join(run_name)
        claim_at_start(store, self.run_uri, rank)  # a managed gang's rank 0 (bucket_fence.py)
        self.uploader = CheckpointUploader(
            store,
            self.run_uri,
            rank=rank,
            world_size=world_size,
            keep_local=keep_local,
            keep_remote=keep_remote,
            peer_timeout_s=peer_timeout_s,
            backoff=backoff,
        )

    def submit(self, run_dir: Path, manifest: Manifest, rank: int) -> None:
        """Queue ``run_dir/<manifest.name>`` for upload; returns at once."""
        self.uploader.submit(Path(run_dir) / manifest.name, manifest, rank=rank)

    def resubmit_unsynced(self, run_dir: Path) -> list[str]:
        """At start-up: queue local checkpoints newer than the remote pointer (see uploader)."""
        return self.uploader.resubmit_unsynced(run_dir)

    def pending(self) -> set[str]:
        return set(self.uploader.pending())

    def is_pending(self, name: str) -> bool:
        return self.uploader.is_pending(name)

    def find_newest(
        self, *, exclude: set[str], pass_over: Mapping[str, str] | None = None
    ) -> RemoteChoice:
        """The newest remote checkpoint whose objects verify by HEAD, and every newer one
        passed over with the reason (not verifying, or named in ``pass_over``); names in
        ``exclude`` (already tried) are skipped.

        Rank 0 calls this and broadcasts the answer, so every rank fetches the same checkpoint.
        A store outage is retried (``resume_attempts``) and then raised.
        """
        walk = retry_call(
            lambda: walk_remote_checkpoints(
                self.resume_store, self.run_uri, exclude=exclude, pass_over=pass_over
            ),
            attempts=self.resume_attempts,
            backoff=RESUME_BACKOFF,
            retryable=is_transient,
            what=f"listing remote checkpoints of {self.run_uri}",
        )
        passed = [(ckpt.name, why) for ckpt, why in walk.passed_over]
        if walk.chosen is None:
            return RemoteChoice(None, passed_over=passed)
        return RemoteChoice(walk.chosen.name, walk.chosen.manifest.world_size, passed)

    def committed(self, *, attempts: int | None = None) -> list[Manifest]:
        """The manifests of the run's committed remote checkpoints, newest first (a LIST and
        one GET per manifest; an outage is retried like ``find_newest``, ``attempts`` times
        when given, then raised)."""
        return retry_call(
            lambda: remote_run_folder(self.resume_store, self.run_uri).committed(),
            attempts=self.resume_attempts if attempts is None else attempts,
            backoff=RESUME_BACKOFF,
            retryable=is_transient,
            what=f"listing remote checkpoints of {self.run_uri}",
        )

    def fetch(self, name: str, run_dir: Path, ranks: list[int] | None) -> Path:
        """Download one checkpoint (the files of ``ranks``; all when None) and verify them.

        Rank 0 has already chosen ``name`` with ``find_newest``; this reads only its manifest.
        Raises ChecksumMismatchError / ObjectNotFoundError when the checkpoint is broken (the
        caller falls back to an older one); other errors mean the store itself failed, after
        each file's download was retried like ``find_newest``'s listing.
        """
        return download_checkpoint(
            self.resume_store,
            self.run_uri.join(name),
            run_dir,
            ranks=ranks,
            attempts=self.resume_attempts,
            backoff=RESUME_BACKOFF,
        )

    def uri_for(self, checkpoint: str) -> str:
        return str(self.run_uri.join(checkpoint))

    def upload_first(self, name: str) -> list[str]:
        """Emergency path: upload ``name`` next; older queued uploads are dropped (see
        ``CheckpointUploader.upload_first``). Returns the names dropped."""
        return self.uploader.upload_first(name)

    def reject(self, name: str, reason: str, *, newer_than: Timestamp) -> bool:
        """Uncommit a checkpoint resume passed over, when it is newer than ``newer_than``
        (``rejected.py``); returns whether it was committed remotely and set aside."""
        return reject_remote(self.resume_store, self.run_uri, name, reason, newer_than=newer_than)

    def repair_pointer(self) -> str | None:
        """``latest.json`` off a damaged folder (``rejected.repair_pointer``)."""
        return repair_pointer(self.resume_store, self.run_uri)

    def transfers_stuck(self) -> bool:
        """After ``close``: the upload thread is still inside a transfer (a hung store)."""
        return self.uploader.worker_alive()

    def close(self, timeout_s: float | None = None) -> None:
        """Flush pending uploads for at most ``timeout_s`` (default ``flush_timeout_s``);
        the outcome is logged, and what is not uploaded stays committed locally."""
        self.uploader.close(self.flush_timeout_s if timeout_s is None else timeout_s)
