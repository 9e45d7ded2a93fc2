"""A per-job work queue: events only *kick* a job; one worker reconciles it at a time.

Pod, node and job events arrive on different kopf workers, often in bursts (a node deletion
touches every rank). Reconciling directly in each handler would run several reconciles of one job
concurrently. Here a kick marks the job dirty; a job is never processed by two workers at once,
kicks that arrive while it runs coalesce into exactly one more run, delayed kicks (backoff,
NotReady grace) are timers, and a failing reconcile is retried with a per-job exponential delay.
The queue also remembers when the first unprocessed kick arrived, which is the start of the
preemption-to-resubmission latency.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

Key = tuple[str, str]
"""(namespace, name) of a job."""

Worker = Callable[[Key, float], Awaitable[float | None]]
"""Reconcile one job; gets the monotonic time of its first pending kick; returns a requeue delay."""

log = logging.getLogger(__name__)

RETRY_BASE = 0.2
RETRY_MAX = 30.0


@dataclass
class _Entry:
    first_kick: float | None = None
    running: bool = False
    dirty: bool = False
    failures: int = 0
    timer: asyncio.TimerHandle | None = None
    timer_due: float | None = None


class WorkQueue:
    """Coalescing, per-key serialised, delay-capable queue of job keys."""

    def __init__(self, worker: Worker, concurrency: int = 8):
        self.worker = worker
        self.concurrency = concurrency
        self.entries: dict[Key, _Entry] = {}
        self.ready: asyncio.Queue[Key] = asyncio.Queue()
        self.tasks: list[asyncio.Task[None]] = []
        self.processed = 0

    def start(self) -> None:
        """Start the workers on the running loop."""
        self.tasks = [
            asyncio.create_task(self._work(), name=f"rtj-worker-{i}")
            for i in range(self.concurrency)
        ]

    async def stop(self) -> None:
        """Stop the workers and timers."""
        for entry in self.entries.values():
            if entry.timer:
                entry.timer.cancel()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks = []

    def kick(self, key: Key, delay: float = 0.0) -> None:
        """Ask for ``key`` to be reconciled, now or after ``delay`` seconds."""
        entry = self.entries.setdefault(key, _Entry())
        if delay > 0:
            self._schedule(key, entry, delay)
            return
        if entry.first_kick is None:
            entry.first_kick = time.monotonic()
        if entry.running:
            entry.dirty = True
        elif not entry.dirty:
            entry.dirty = True
            self.ready.put_nowait(key)

    def forget(self, key: Key) -> None:
        """Drop a deleted job's timers (a kick still in flight finds it gone and stops)."""
        entry = self.entries.get(key)
        if entry and entry.timer:
            entry.timer.cancel()
            entry.timer = None
        if entry and not entry.running and not entry.dirty:
            self.entries.pop(key, None)

    def stats(self) -> dict[str, int]:
        """For the liveness probe."""
        return {"jobs": len(self.entries), "ready": self.ready.qsize(), "processed": self.processed}

    def _schedule(self, key: Key, entry: _Entry, delay: float) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        if entry.timer is not None and entry.timer_due is not None and entry.timer_due <= due:
            return  # an earlier wake-up is already planned
        if entry.timer is not None:
            entry.timer.cancel()
        entry.timer_due = due
        entry.timer = loop.call_at(due, self._fire, key)

    def _fire(self, key: Key) -> None:
        entry = self.entries.get(key)
        if entry is not None:
            entry.timer = None
            entry.timer_due = None
        self.kick(key)

    async def _work(self) -> None:
        while True:
            key = await self.ready.get()
            entry = self.entries.setdefault(key, _Entry())
            entry.dirty = False
            entry.running = True
            first_kick = entry.first_kick if entry.first_kick is not None else time.monotonic()
            entry.first_kick = None
            requeue: float | None = None
            try:
                requeue = await self.worker(key, first_kick)
                entry.failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:
                entry.failures += 1
                requeue = min(RETRY_BASE * 2 ** (entry.failures - 1), RETRY_MAX)
                log.exception(
                    "reconcile of %s/%s failed (retry %d in %.1fs)",
                    key[0],
                    key[1],
                    entry.failures,
                    requeue,
                )
            finally:
                entry.running = False
                self.processed += 1
            if entry.dirty:
                self.ready.put_nowait(key)
            elif requeue is not None:
                self._schedule(key, entry, max(requeue, 0.001))
