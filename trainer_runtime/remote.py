"""The seam between the checkpoint core and an object store (``trainer_runtime.objectstore``).

The manager only needs these few calls, so local-only runs never import boto3 and tests of the
core do not depend on a store being up.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .manifest import Manifest


@dataclass(frozen=True)
class RemoteChoice:
    """What ``find_newest`` found: the newest remote checkpoint that verifies (``name`` None:
    none does) and, newest first, each newer one it passed over with the reason."""

    name: str | None
    world_size: int = 0
    passed_over: list[tuple[str, str]] = field(default_factory=list)


class RemoteBackend(Protocol):
    def submit(self, run_dir: Path, manifest: Manifest, rank: int) -> None:
        """Queue a locally committed checkpoint for upload (never blocks)."""

    def pending(self) -> set[str]:
        """Checkpoint names whose upload has not completed (local retention keeps them)."""

    def find_newest(
        self, *, exclude: set[str], pass_over: Mapping[str, str] | None = None
    ) -> RemoteChoice:
        """The newest remote checkpoint that verifies, not in ``exclude`` (names already tried,
        skipped silently); those in ``pass_over`` (name: reason, e.g. quarantined) are passed
        over with that reason, like the ones that do not verify."""

    def fetch(self, name: str, run_dir: Path, ranks: list[int] | None) -> Path:
        """Download and verify the files of ``ranks`` (all when None) of one checkpoint into
        ``run_dir``; its local folder."""

    def uri_for(self, checkpoint: str) -> str:
        """The remote URI of a checkpoint (reported to the operator)."""

    def close(self) -> None:
        """Flush pending uploads within a bounded time and log the outcome.

        Optional richer forms the manager uses when present: ``close(timeout_s=...)`` (the
        bound), ``upload_first(name)`` (emergency ordering), ``resubmit_unsynced(run_dir)``,
        ``reject(name, reason)`` (uncommit a checkpoint resume passed over) and
        ``committed()`` (the remote manifests, newest first: overwrite protection and a stale
        local disk look at them).
        """


def close_remote(remote: RemoteBackend, timeout_s: float | None) -> None:
    """Flush and close ``remote``, bounded by ``timeout_s`` where its ``close`` takes one; a
    backend with the minimal protocol bounds its flush itself (None: its own default)."""
    close = remote.close
    if timeout_s is None or "timeout_s" not in inspect.signature(close).parameters:
        close()
    else:
        close(timeout_s=timeout_s)  # type: ignore[call-arg]
