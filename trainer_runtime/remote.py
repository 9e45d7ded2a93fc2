"""The seam between the checkpoint core and an object store (``trainer_runtime.objectstore``).

The core calls a remote only through ``RemoteBackend``: every method it calls is named there
with its real signature, so a backend's author reads one contract and the core never asks an
object what it can do. Local-only runs never import boto3, and tests of the core need no store.

Six methods are the core of the contract (``CoreBackend``: upload, what is uploading, find,
fetch, name, close); a backend that has only these still works. The other six are optional
capabilities (emergency ordering, listing the bucket's manifests, setting checkpoints aside in
the bucket, repairing its pointer, re-uploading what a killed attempt left, a stuck transfer).
``RemoteBackendBase`` gives each of them a no-op default, so a third-party backend subclasses it
and writes the core six; ``S3Backend`` overrides them all. An object that does not subclass it
(the form the docs have long allowed: any object with the core methods) is wrapped once, where
the run is opened (``as_backend``), in an adapter that forwards the core six and takes the
defaults for the rest.

Finding the newest valid remote checkpoint has one walk, ``newest_fetched``: the backend names
the newest checkpoint that verifies by metadata (``find_newest``), the caller fetches it, and a
checkpoint broken on download is passed over for the next older one. Resume across ranks
(``store_resume``) and a single reader (``objectstore.resolver.resume_from_remote``) both walk
it, with their own ``find`` and ``fetch``.

Rejected: probing a backend for optional methods (``getattr``) and their parameters
(``inspect.signature``) at each call, which made the contract whatever the core happened to
probe, invisible to a backend's author and to a type checker; a ``runtime_checkable`` protocol
(an ``isinstance`` check of method names, the same probing); requiring every backend to write
all twelve methods (a breaking change for backends written against the six); and a backend
method that finds and downloads in one call (``S3Backend.fetch_newest``, removed), which could
not let the ranks agree on one checkpoint and duplicated the walk.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .run_folder.fallback import first_valid
from .save.manifest import Manifest
from .timestamp import Timestamp


@dataclass(frozen=True)
class RemoteChoice:
    """What ``find_newest`` found: the newest remote checkpoint that verifies (``name`` None:
    none does) and, newest first, each newer one it passed over with the reason."""

    name: str | None
    world_size: int = 0
    passed_over: list[tuple[str, str]] = field(default_factory=list)


class CoreBackend(Protocol):
    """The six methods every backend has: what a ``remote=`` object must offer."""

    def submit(self, run_dir: Path, manifest: Manifest, rank: int) -> None:
        """Queue a locally committed checkpoint for upload (never blocks)."""

    def pending(self) -> set[str]:
        """Checkpoint names whose upload has not completed (local retention keeps them)."""

    def find_newest(
        self, *, exclude: set[str], pass_over: Mapping[str, str] | None = None
    ) -> RemoteChoice:
        """The newest remote checkpoint that verifies, not in ``exclude`` (names already tried,
        skipped silently); those in ``pass_over`` (name: reason, e.g. quarantined) are passed
        over with that reason, like the ones that do not verify. A store that cannot be listed
        raises (resume then refuses to start from scratch)."""

    def fetch(self, name: str, run_dir: Path, ranks: list[int] | None) -> Path:
        """Download and verify the files of ``ranks`` (all when None) of one checkpoint into
        ``run_dir``; its local folder. A broken checkpoint raises
        ``objectstore.ChecksumMismatchError`` or ``ObjectNotFoundError`` (resume falls back to
        an older one); any other error means the store failed."""

    def uri_for(self, checkpoint: str) -> str:
        """The remote URI of a checkpoint (reported to the operator)."""

    def close(self) -> None:
        """Flush pending uploads within a bounded time and log the outcome."""


class RemoteBackend(Protocol):
    """Everything the core calls on a remote: the core six (``CoreBackend``; ``close`` takes
    the flush bound) and six optional capabilities, whose defaults are in
    ``RemoteBackendBase``."""

    def submit(self, run_dir: Path, manifest: Manifest, rank: int) -> None: ...

    def pending(self) -> set[str]: ...

    def find_newest(
        self, *, exclude: set[str], pass_over: Mapping[str, str] | None = None
    ) -> RemoteChoice: ...

    def fetch(self, name: str, run_dir: Path, ranks: list[int] | None) -> Path: ...

    def uri_for(self, checkpoint: str) -> str: ...

    def close(self, timeout_s: float | None = None) -> None:
        """Flush pending uploads for at most ``timeout_s`` (None: the backend's own bound)."""

    def upload_first(self, name: str) -> list[str]:
        """Emergency path: upload ``name`` next; returns the queued uploads it dropped."""

    def committed(self, *, attempts: int | None = None) -> list[Manifest]:
        """The manifests of the run's committed remote checkpoints, newest first (overwrite
        protection and a stale local disk look at them); an outage is retried ``attempts``
        times (None: the backend's own count) and then raised."""

    def reject(self, name: str, reason: str, *, newer_than: Timestamp) -> bool:
        """Uncommit, in the store, a checkpoint resume passed over (or ``overwrite=True``
        discards) when it is newer than ``newer_than``; whether it was set aside."""

    def repair_pointer(self) -> str | None:
        """At resume (rank 0): move the store's pointer off a damaged checkpoint; the name it
        now gives, or None."""

    def resubmit_unsynced(self, run_dir: Path) -> list[str]:
        """At start-up: queue local checkpoints a killed attempt committed but never uploaded;
        their names."""

    def transfers_stuck(self) -> bool:
        """After ``close``: a transfer is still running (a hung store); the emergency exit
        then does not wait for it."""


class RemoteBackendBase(ABC):
    """A backend to subclass: write the core six, and override the optional capabilities
    the store supports. The defaults do nothing: no emergency ordering, no remote listing
    (overwrite protection sees the local folder only), nothing set aside or repaired in the
    store, nothing re-uploaded at start-up, never a stuck transfer."""

    @abstractmethod
    def submit(self, run_dir: Path, manifest: Manifest, rank: int) -> None: ...

    @abstractmethod
    def pending(self) -> set[str]: ...

    @abstractmethod
    def find_newest(
        self, *, exclude: set[str], pass_over: Mapping[str, str] | None = None
    ) -> RemoteChoice: ...

    @abstractmethod
    def fetch(self, name: str, run_dir: Path, ranks: list[int] | None) -> Path: ...

    @abstractmethod
    def uri_for(self, checkpoint: str) -> str: ...

    @abstractmethod
    def close(self, timeout_s: float | None = None) -> None: ...

    def upload_first(self, name: str) -> list[str]:
        return []

    def committed(self, *, attempts: int | None = None) -> list[Manifest]:
        return []

    def reject(self, name: str, reason: str, *, newer_than: Timestamp) -> bool:
        return False

    def repair_pointer(self) -> str | None:
        return None

    def resubmit_unsynced(self, run_dir: Path) -> list[str]:
        return []

    def transfers_stuck(self) -> bool:
        return False


class _CoreOnly(RemoteBackendBase):
    """A ``CoreBackend`` that does not subclass ``RemoteBackendBase``: its six methods, and
    the defaults for the rest (its ``close`` bounds its flush itself)."""

    def __init__(self, inner: CoreBackend) -> None:
        self.inner = inner

    def submit(self, run_dir: Path, manifest: Manifest, rank: int) -> None:
        self.inner.submit(run_dir, manifest, rank)

    def pending(self) -> set[str]:
        return self.inner.pending()

    def find_newest(
        self, *, exclude: set[str], pass_over: Mapping[str, str] | None = None
    ) -> RemoteChoice:
        return self.inner.find_newest(exclude=exclude, pass_over=pass_over)

    def fetch(self, name: str, run_dir: Path, ranks: list[int] | None) -> Path:
        return self.inner.fetch(name, run_dir, ranks)

    def uri_for(self, checkpoint: str) -> str:
        return self.inner.uri_for(checkpoint)

    def close(self, timeout_s: float | None = None) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return repr(self.inner)


def as_backend(remote: CoreBackend | RemoteBackend | None) -> RemoteBackend | None:
    """The core's view of a ``remote=`` object: itself when it subclasses
    ``RemoteBackendBase``, else its core six with the optional capabilities' defaults."""
    if remote is None or isinstance(remote, RemoteBackendBase):
        return remote
    return _CoreOnly(remote)  # type: ignore[arg-type]


def close_remote(remote: RemoteBackend, timeout_s: float | None) -> None:
    """Flush and close ``remote`` within ``timeout_s`` (None: the backend's own bound)."""
    remote.close(timeout_s)


def newest_fetched(
    find: Callable[[set[str]], RemoteChoice],
    fetch: Callable[[str, int], str | None],
    *,
    skip: Collection[str] = (),
    on_broken: Callable[[str, str], None] | None = None,
) -> tuple[str | None, list[tuple[str, str]]]:
    """The newest remote checkpoint that verifies and fetches intact, and, newest first, every
    newer one passed over with the reason.

    ``find(tried)`` names the newest that verifies by metadata, not in ``tried`` (``skip``
    and those already fetched and found broken), with those it passed over;
    ``fetch(name, saved_world_size)`` downloads it and returns None, or the reason it is
    broken (the next older one is tried; ``on_broken(name, reason)`` is told). Either may
    raise to stop the walk (the store failed: no silent fresh start). Returns the name
    fetched (None: none) and the checkpoints passed over.
    """
    passed: dict[str, str] = {}  # in the order met: newest first

    def newest_first() -> Iterator[tuple[str, int]]:
        tried = set(skip)
        while True:
            choice = find(tried)
            for name, why in choice.passed_over:
                passed.setdefault(name, why)
            if choice.name is None:
                return
            yield choice.name, choice.world_size
            tried.add(choice.name)

    def broken(found: tuple[str, int], why: str) -> None:
        if on_broken is not None:
            on_broken(found[0], why)
        passed.setdefault(found[0], why)

    walk = first_valid(newest_first(), lambda found: fetch(*found), on_reject=broken)
    return (None if walk.chosen is None else walk.chosen[0]), list(passed.items())
