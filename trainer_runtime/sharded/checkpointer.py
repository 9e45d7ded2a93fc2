"""Sync and async saving of sharded (format version 2) checkpoints at the engine level.

``ShardedCheckpointer`` is for callers that drive the engine without the manager (the engine
benchmarks and tests). It is a thin layer over ``async_save.SaveScheduler``, the scheduler the
manager's saves run through (capture, the copy into the staging buffers, the optimizer
pre-step hook that holds training until the copy is done, the persisting thread, the commit),
so what the benchmarks time is the product's own path. It adds only what a caller without a
run needs: names and timestamps given per call, and a failure raised as it is by ``wait()``
(the manager's ``Saver`` wraps it in ``SaveFailedError`` at the next call instead).

The rejected alternative, this class scheduling its saves itself (its own event, hook and
priority lowering), had the benchmarks measure a path the product did not run.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ..run_folder.layout import RunFolder
from ..save.manifest import Manifest, size_problem
from ..timestamp import Timestamp
from .async_save import SaveScheduler, SaveTarget
from .engine import ShardedEngine


def check_files_present(folder: Path, manifest: Manifest) -> str | None:
    """Cheap pre-load check of a v2 checkpoint: every file exists with its recorded size.

    Content is verified chunk by chunk during the load itself (no second read), so this only
    rules out a checkpoint that is visibly torn before any rank starts reading it.
    """
    for entry in manifest.files:
        problem = size_problem(folder, entry)
        if problem is not None:
            return problem
    return None


class ShardedCheckpointer:
    """Save version-2 checkpoints into a run folder and commit them."""

    def __init__(self, engine: ShardedEngine, folder: RunFolder, *, run_name: str) -> None:
        self.engine = engine
        self.folder = folder
        self.run_name = run_name
        self.coord = engine.commit_coord
        self.rank, self.world_size = engine.rank, engine.world_size
        self.scheduler = SaveScheduler(engine, folder)

    @property
    def pending(self) -> Future[Manifest] | None:
        """The async save in flight (or finished, until ``wait()``)."""
        return self.scheduler.pending

    def save(
        self,
        name: str,
        *,
        timestamp: Timestamp,
        metrics: dict[str, Any] | None = None,
        extras: dict[str, Any] | None = None,
        weights_only: bool = False,
        latest_link: str | None = None,
    ) -> Manifest:
        """Write and commit checkpoint ``name`` before returning (collective)."""
        self.wait()
        target = self._target(name, timestamp, weights_only, latest_link)
        return self.scheduler.save(target, _manifest, metrics=metrics, extras=extras)

    def save_async(
        self,
        name: str,
        *,
        timestamp: Timestamp,
        metrics: dict[str, Any] | None = None,
        extras: dict[str, Any] | None = None,
        weights_only: bool = False,
        latest_link: str | None = None,
    ) -> Future[Manifest]:
        """Start a save; returns once references are taken. One save in flight at a time."""
        self.wait()
        target = self._target(name, timestamp, weights_only, latest_link)
        return self.scheduler.save_async(target, _manifest, metrics=metrics, extras=extras)

    def wait_for_staging(self) -> None:
        """Block until the in-flight save has copied the state (then training may mutate it)."""
        self.scheduler.wait_for_copy()

    def wait(self) -> Manifest | None:
        """Block until the in-flight save has committed; raise its failure."""
        self.scheduler.settle()
        fut = self.scheduler.collect()
        return None if fut is None else fut.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self.scheduler.shutdown()

    def _target(
        self, name: str, timestamp: Timestamp, weights_only: bool, latest_link: str | None
    ) -> SaveTarget:
        return SaveTarget(
            name=name,
            run_name=self.run_name,
            timestamp=timestamp,
            weights_only=weights_only,
            latest_link=latest_link,
        )


def _manifest(manifest: Manifest) -> Manifest:
    """Nothing follows the commit at the engine level."""
    return manifest
