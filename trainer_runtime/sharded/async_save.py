"""The one scheduling path of a save: capture -> copy -> gate -> persist -> commit.

Every save of a version-2 checkpoint runs through ``SaveScheduler``: the manager's
(``policy.Saver``, which adds the run's policy around it: names, the skip policy, reports,
retention) and the engine-level ``checkpointer.ShardedCheckpointer`` (what the engine
benchmarks and tests drive), so a benchmark times the path the product runs.

A synchronous save writes straight from the live tensors on the calling thread (training waits
anyway) and commits. An async save, in the manner of DCP's ``async_save`` with an
``AsyncStager`` and its thread executor (``staging.py``, ``_async_executor.py``), returns as
soon as it has taken references:

1. capture, on the training thread: ``ShardedEngine.capture`` (live tensor references, this
   rank's small state serialized at once); the model's buffers are cloned
   (``staging.copy_buffers``: the next forward pass changes them before any step), then the
   save point is recorded on each GPU's stream (``ShardedEngine.save_point``);
2. copy, on the engine's staging thread at full priority (``ShardedEngine.stage``): into host
   buffers kept from one save to the next (allocated after the first optimizer step when
   ``prewarm_staging`` is armed);
3. gate: ``staging_gate.StagingGate``, an optimizer pre-step hook, holds the next
   ``optimizer.step()`` (the only thing that changes parameters and optimizer state) until the
   copy is done, and times that wait (``SaveTiming``);
4. persist, on this scheduler's thread, lowered to nice 10 once the copy is done: writing and
   hashing yield the CPU to training;
5. commit: ``commit.write_and_commit`` (data durable, manifest, pointer, links), then the
   caller's continuation (``then``) on the same thread.

At most one save is in flight per scheduler; its future is ``pending`` until ``collect``
hands it over, so a failure is raised once, where the caller decides.

Rejected: two schedulers, one per saver (the engine-level one had its own event, hook and
priority lowering, and the engine benchmarks measured it instead of the manager's); staging on
the training thread (the stall becomes the copy time; DCP's default); a background process
(it would first have to receive the staged state through shared memory and join a process
group of its own, while file writes and xxh3 hashing release the GIL anyway; see
docs/sharded-checkpoints.md).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from ..run_folder.layout import RunFolder
from ..save.commit import write_and_commit
from ..save.fence import Fence
from ..save.manifest import Manifest
from ..save.staging_gate import SaveTiming, StagingGate, StagingPrewarm
from ..timestamp import Timestamp
from .engine import ShardedEngine
from .staging import copy_buffers

T = TypeVar("T")


@dataclass(frozen=True)
class SaveTarget:
    """What one save commits and where its pointers go (``commit.write_and_commit``)."""

    name: str
    run_name: str
    timestamp: Timestamp
    weights_only: bool = False
    latest_link: str | None = None
    latest_like: re.Pattern[str] | None = None
    """What the latest-link template renders: links like it no rank writes are removed."""
    fence: Fence | None = None
    on_commit: Callable[[Manifest], None] | None = None
    """Rank 0, at the commit itself, before the other ranks hear of it; must not raise."""


class SaveScheduler:
    """Sync and async saves of one engine into one run folder, one in flight at a time."""

    def __init__(self, engine: ShardedEngine, folder: RunFolder) -> None:
        self.engine = engine
        self.folder = folder
        self.pending: Future[Any] | None = None
        """The async save in flight, or finished and not yet collected."""
        self.prewarm: StagingPrewarm | None = None
        """Once armed: the staging buffers allocated after every optimizer's first step."""
        self._gate: StagingGate | None = None
        self._executor: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ saves
    def save(
        self,
        target: SaveTarget,
        then: Callable[[Manifest], T],
        *,
        metrics: Mapping[str, Any] | None = None,
        extras: Mapping[str, Any] | None = None,
        timing: SaveTiming | None = None,
        called: float | None = None,
        started: float | None = None,
    ) -> T:
        """Capture, write from the live tensors and commit before returning (collective).

        ``then``: what follows the commit (its result is returned). ``timing.call_s``: the
        whole call, from ``called`` (``time.perf_counter``), measured on rank 0 at the commit
        (so ``target.on_commit`` reports it) and elsewhere once the commit returns.
        ``started``: ``time.monotonic`` at the start, for the manifest's save duration.
        """
        called = time.perf_counter() if called is None else called
        started = time.monotonic() if started is None else started
        timing = SaveTiming() if timing is None else timing
        state = self._capture(target, metrics, extras)

        def at_commit(manifest: Manifest) -> None:
            timing.call_s = time.perf_counter() - called
            if target.on_commit is not None:
                target.on_commit(manifest)

        manifest = self._commit(state, None, target, started, at_commit)
        if self.engine.rank != 0:
            timing.call_s = time.perf_counter() - called
        return then(manifest)

    def save_async(
        self,
        target: SaveTarget,
        then: Callable[[Manifest], T],
        *,
        metrics: Mapping[str, Any] | None = None,
        extras: Mapping[str, Any] | None = None,
        timing: SaveTiming | None = None,
        called: float | None = None,
        started: float | None = None,
    ) -> Future[T]:
        """Capture and return; copy, persist and commit in the background (``pending``).

        The caller makes sure no save is in flight. ``timing`` records the call, the copy and
        the wait of the next ``optimizer.step()`` for it; ``called`` and ``started`` as in
        ``save``.
        """
        called = time.perf_counter() if called is None else called
        started = time.monotonic() if started is None else started
        timing = SaveTiming() if timing is None else timing
        state = self._capture(target, metrics, extras)
        state = copy_buffers(self.engine.components.model, state)  # the forward pass changes them
        self.engine.save_point(state)  # after the buffers' copies are queued
        self.release_hook_if_done()  # the previous save's, open since its copy
        gate = self._gate = StagingGate(timing)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="rtj-save")

        def background() -> T:
            copy_started = time.perf_counter()
            try:  # at full priority: the next optimizer step may be waiting for this copy
                snapshot, keys = self.engine.stage(state)
            finally:
                gate.open(time.perf_counter() - copy_started)
            yield_cpu_to_training()
            return then(self._commit(snapshot, keys, target, started, target.on_commit))

        timing.call_s = time.perf_counter() - called  # the rest is the submit, microseconds
        self.pending = fut = self._executor.submit(background)
        return fut

    def _capture(
        self,
        target: SaveTarget,
        metrics: Mapping[str, Any] | None,
        extras: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        """Live tensor references plus this rank's small state, already serialized."""
        return self.engine.capture(
            timestamp=target.timestamp.to_dict(),
            run_name=target.run_name,
            metrics=dict(metrics or {}),
            extras=dict(extras or {}),
            weights_only=target.weights_only,
        )

    def _commit(
        self,
        state: dict[str, Any],
        staged_keys: set[str] | None,
        target: SaveTarget,
        started: float,
        on_commit: Callable[[Manifest], None] | None,
    ) -> Manifest:
        return write_and_commit(
            self.engine,
            self.folder,
            state=state,
            staged_keys=staged_keys,
            name=target.name,
            run_name=target.run_name,
            timestamp=target.timestamp,
            weights_only=target.weights_only,
            latest_link=target.latest_link,
            latest_like=target.latest_like,
            started=started,
            on_commit=on_commit,
            fence=target.fence,
        )

    # ------------------------------------------------------------------ staging buffers
    def prewarm_staging(
        self, optimizers: Sequence[torch.optim.Optimizer], *, weights_only: bool
    ) -> StagingPrewarm:
        """Allocate and touch the staging buffers once every optimizer has stepped, so the
        first async save copies into mapped memory (``staging_gate.StagingPrewarm``)."""
        engine = self.engine
        self.prewarm = StagingPrewarm(
            optimizers,
            lambda: engine.prepare_staging(weights_only=weights_only),
            engine.on_staging_thread,
        )
        return self.prewarm

    def release_staging_buffers(self) -> None:
        """Wait until no background work uses the staging buffers (the save persisting from
        them, their first touch), without raising that save's failure (``collect`` does)."""
        if self.prewarm is not None and self.prewarm.done is not None:
            self.prewarm.done.exception()  # waits without raising
        self.settle()

    # ------------------------------------------------------------------ waiting
    def persisting(self) -> bool:
        """An async save is still running (it may use the commit channel)."""
        return self.pending is not None and not self.pending.done()

    def wait_for_copy(self) -> None:
        """Block until the save in flight has copied the state (training may then change it);
        an explicit wait, not counted as a hold."""
        if self._gate is not None:
            self._gate.wait()
        self.release_hook_if_done()

    def settle(self) -> None:
        """Block until the save in flight is done, neither raising nor collecting it."""
        if self.pending is not None:
            self.pending.exception()  # waits without raising
        self.release_hook_if_done()

    def collect(self) -> Future[Any] | None:
        """The finished save's future, handed over once (None while it runs, or when none)."""
        fut = self.pending
        if fut is None or not fut.done():
            return None
        self.pending = None
        return fut

    def release_hook_if_done(self) -> None:
        """Drop the pre-step hook once the copy it waits for is done."""
        if self._gate is not None and self._gate.remove_hook_if_open():
            self._gate = None

    def shutdown(self) -> None:
        """Stop arming the buffers and wait for the persisting thread; a later save starts a
        new one."""
        if self.prewarm is not None:
            self.prewarm.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def yield_cpu_to_training() -> None:
    """Lower this thread's CPU priority (Linux: per-thread nice) for the rest of its life:
    after the snapshot, writing, hashing and deleting should not slow training down."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
