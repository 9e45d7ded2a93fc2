"""Sync and async saving of sharded (format version 2) checkpoints at the engine level.

The commit itself (data durable, then ``manifest.json``, ``latest.json``, the links to the
checkpoint folder) is ``trainer_runtime.commit.write_and_commit``, shared with
``CheckpointManager``; this class adds the save scheduling around it, for callers that drive
the engine without the manager (the engine benchmarks and tests).

An async save returns at once: a background thread copies the state into reused host buffers
(``staging.py``) at full priority, releases training, then writes and commits at low priority.
Until the copy is done, an optimizer pre-step hook holds the next ``optimizer.step()`` (the only
thing that changes parameters and optimizer state); the model's buffers, which the forward pass
changes before any step, are copied at the call. So the save call itself stalls training only
for taking references and that small copy. A thread, not a process: the persisting work is
file I/O and xxh3 hashing, both of which release the GIL, and a process would first have to
receive the staged state (shared memory) and join its own process group; see
docs/sharded-checkpoints.md.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from torch.optim.optimizer import register_optimizer_step_pre_hook

from ..commit import write_and_commit
from ..layout import RunFolder
from ..manifest import Manifest, size_problem
from ..timestamp import Timestamp
from .engine import ShardedEngine
from .staging import copy_buffers

log = logging.getLogger("trainer_runtime")


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
        # Module buffers are copied now: the next forward pass changes them (BatchNorm
        # statistics) before the hook below holds anything.
        state = copy_buffers(self.engine.components.model, state)
        self.engine.save_point(state)  # after the buffers' copies are queued
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

    def _write_and_commit(self, **kw: Any) -> Manifest:
        return write_and_commit(
            self.engine,
            self.folder,
            run_name=self.run_name,
            **kw,
        )


def _wait(event: threading.Event) -> None:
    event.wait()


def _lower_thread_priority() -> None:
    """Per-thread nice on Linux: writing and hashing yield the CPU to training."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
