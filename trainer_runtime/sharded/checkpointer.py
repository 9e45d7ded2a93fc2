"""The commit protocol for sharded (format version 2) checkpoints, sync and async.

Order, as for version 1: every rank's data durable, then ``manifest.json`` (rank 0, atomically,
listing every file with size and xxh3-128), then ``latest.json``, then the ``latest-rank{r}``
links. What differs: one DCP save writes the checkpoint collectively, so a rank's files are not
a self-contained copy; the links therefore point at the checkpoint folder, not at a rank file.

An async save returns at once: a background thread copies the state into reused host buffers
(``staging.py``) at full priority, releases training, then writes and commits at low priority.
Until the copy is done, an optimizer pre-step hook holds the next ``optimizer.step()`` (the only
thing that changes parameters and optimizer state), so the save call itself stalls training
only for taking references. A thread, not a process: the persisting work is file I/O and
xxh3 hashing, both of which release the GIL, and a process would first have to receive the
staged state (shared memory) and join its own process group; see docs/sharded-checkpoints.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.api import CheckpointException
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ..errors import SaveFailedError
from ..layout import RunFolder
from ..manifest import FORMAT_VERSION_SHARDED, MANIFEST_NAME, FileEntry, Manifest
from ..timestamp import Timestamp
from .engine import ShardedEngine

log = logging.getLogger("trainer_runtime")


def check_files_present(folder: Path, manifest: Manifest) -> str | None:
    """Cheap pre-load check of a v2 checkpoint: every file exists with its recorded size.

    Content is verified chunk by chunk during the load itself (no second read), so this only
    rules out a checkpoint that is visibly torn before any rank starts reading it.
    """
    for entry in manifest.files:
        try:
            size = os.stat(folder / entry.path).st_size
        except FileNotFoundError:
            return f"{entry.path} (rank {entry.rank}) is missing"
        if size != entry.size:
            return f"{entry.path} (rank {entry.rank}) has {size} bytes, manifest says {entry.size}"
    return None


class ShardedCheckpointer:
    """Save version-2 checkpoints into a run folder and commit them."""

    def __init__(self, engine: ShardedEngine, folder: RunFolder, *, run_name: str) -> None:
        self.engine = engine
        self.folder = folder
        self.run_name = run_name
        self.coord = engine.commit_coord
        self.rank, self.world_size = engine.rank, engine.world_size
        self._executor: ThreadPoolExecutor | None = None
        self._staged: threading.Event | None = None
        self._hook: Any = None
        self.pending: Future[Manifest] | None = None

    # ------------------------------------------------------------------ sync
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
        started = time.monotonic()
        state = self._capture(timestamp, metrics, extras, weights_only)
        return self._write_and_commit(
            state=state,
            name=name,
            timestamp=timestamp,
            weights_only=weights_only,
            latest_link=latest_link,
            started=started,
        )

    # ------------------------------------------------------------------ async
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
        started = time.monotonic()
        state = self._capture(timestamp, metrics, extras, weights_only)
        staged = threading.Event()
        self._staged = staged
        self._hook = register_optimizer_step_pre_hook(lambda *_: _wait(staged))
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="rtj-sharded-save")

        def background() -> Manifest:
            try:
                copy, keys = self.engine.stage(state)
            finally:
                staged.set()
            _lower_thread_priority()
            return self._write_and_commit(
                staged_keys=keys,
                state=copy,
                name=name,
                timestamp=timestamp,
                weights_only=weights_only,
                latest_link=latest_link,
                started=started,
            )

        self.pending = self._executor.submit(background)
        return self.pending

    def wait_for_staging(self) -> None:
        """Block until the in-flight save has copied the state (then training may mutate it)."""
        if self._staged is not None:
            self._staged.wait()
        self._release_hook()

    def wait(self) -> Manifest | None:
        """Block until the in-flight save has committed; raise its failure."""
        fut, self.pending = self.pending, None
        if fut is None:
            return None
        try:
            return fut.result()
        finally:
            self._release_hook()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None

    def _release_hook(self) -> None:
        if self._hook is not None and self._staged is not None and self._staged.is_set():
            self._hook.remove()
            self._hook = None

    # ------------------------------------------------------------------ shared
    def _capture(
        self,
        timestamp: Timestamp,
        metrics: dict[str, Any] | None,
        extras: dict[str, Any] | None,
        weights_only: bool,
    ) -> dict[str, Any]:
        return self.engine.capture(
            timestamp=timestamp.to_dict(),
            run_name=self.run_name,
            metrics=dict(metrics or {}),
            extras=dict(extras or {}),
            weights_only=weights_only,
        )

    def _write_and_commit(
        self,
        *,
        state: dict[str, Any],
        name: str,
        timestamp: Timestamp,
        weights_only: bool,
        latest_link: str | None,
        started: float,
        staged_keys: set[str] | None = None,
    ) -> Manifest:
        path = self.folder.path(name)
        outcome: list[FileEntry] | str
        try:  # the folder is made inside the collective save, so a failure there is shared
            outcome = self.engine.write(state, path, staged=staged_keys)
        except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
            # reported to every rank below, then raised
            outcome = f"rank {self.rank}: {type(exc).__name__}: {exc}"
        duration = time.monotonic() - started
        gathered = self.coord.all_gather((outcome, duration))
        errors = [o for o, _ in gathered if isinstance(o, str)]
        if errors:
            self.folder.remove_tree(name)  # every rank: on node-local disks each has a copy
            raise SaveFailedError(
                f"checkpoint {name} not committed ({'; '.join(errors)}); earlier checkpoints "
                "are intact"
            )
        manifest = Manifest(
            name=name,
            run_name=self.run_name,
            world_size=self.world_size,
            timestamp=timestamp.copy(),
            files=[entry for o, _ in gathered for entry in o],
            weights_only=weights_only,
            created_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
            save_duration_s=round(max(d for _, d in gathered), 6),
            format_version=FORMAT_VERSION_SHARDED,
            extra={"engine": "torch.distributed.checkpoint"},
        )
        if self.rank == 0:
            self.folder.write_manifest(manifest)
            self.folder.write_pointer(manifest)
        # One collective serves as the barrier (rank 0 has committed) and shares its time.
        manifest.created_at = self.coord.broadcast(manifest.created_at)
        if self.rank != 0 and not (path / MANIFEST_NAME).exists():
            # Node-local disk: this node holds only its own shard files; it records the commit
            # so retention and listing agree, but resuming needs a shared folder or the store.
            self.folder.write_manifest(manifest)
            self.folder.write_pointer(manifest)
        if latest_link is not None:
            self.folder.link_latest(latest_link, name)
        log.info("committed sharded checkpoint %s in %.2fs", name, manifest.save_duration_s)
        return manifest


def _wait(event: threading.Event) -> None:
    event.wait()


def _lower_thread_priority() -> None:
    """Per-thread nice on Linux: writing and hashing yield the CPU to training."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
