"""How long an async save holds training, measured where it happens, and staging memory
prepared before the first save needs it.

An async save holds training twice: the ``save()`` call itself, and the wait of the next
``optimizer.step()`` at a pre-step hook until the state is copied (``StagingGate``). Both are
recorded per save (``SaveTiming``), so a user sees the stall as DCP defines it (how long
training was blocked) in ``SavedCheckpoint.held_s`` and the ``committed`` event, instead of
inferring it from how much slower a step was: a step while the checkpoint persists is also
slower because writing and hashing share the CPUs and memory bus (a throughput cost, not a
hold). Inferring the hold from step times was the alternative, and it mixes the two.

``StagingPrewarm`` allocates and touches the host staging buffers on the staging thread once
every optimizer of the run has stepped (Adam-like optimizers create their state then), so
the first async save copies into memory that is already mapped instead of faulting in a fresh
copy of the state while the next step waits (first touch of fresh memory costs 0.4-1.8 s/GiB
on some VMs). The alternative, allocating at the first save, puts that cost into the hold.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook


@dataclass
class SaveTiming:
    """Where one save's time went on this rank, in seconds."""

    call_s: float = 0.0
    """The ``save()`` call (for a sync save: the whole save)."""
    staging_s: float = 0.0
    """The host copy on the staging thread (async saves)."""
    waited_s: float = 0.0
    """Time optimizer steps waited at the pre-step hook for the copy (async saves)."""

    @property
    def held_s(self) -> float:
        """How long training was blocked by this save: the call plus the wait at the hook."""
        return self.call_s + self.waited_s


class StagingGate:
    """Holds every ``optimizer.step()`` until the staging copy is done, timing the wait."""

    def __init__(self, timing: SaveTiming) -> None:
        self.timing = timing
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._hook: Any = register_optimizer_step_pre_hook(lambda *_: self._hold())

    def _hold(self) -> None:  # optimizer pre-step hooks must return None
        if self._done.is_set():
            return
        t0 = time.perf_counter()
        self._done.wait()
        with self._lock:
            self.timing.waited_s += time.perf_counter() - t0

    def open(self, staging_s: float) -> None:
        """The copy is done (or failed): training may change the live tensors."""
        self.timing.staging_s = staging_s
        self._done.set()

    def wait(self) -> None:
        """Block until the copy is done (an explicit wait, not counted as a hold)."""
        self._done.wait()

    def remove_hook_if_open(self) -> bool:
        """Drop the hook once the copy is done; True when there is no hook left."""
        if self._hook is not None and self._done.is_set():
            self._hook.remove()
            self._hook = None
        return self._hook is None


class StagingPrewarm:
    """Once every optimizer of the run has stepped (so has its state): allocate and touch the
    staging buffers.

    ``prepare`` runs on the training thread right after a step (it takes the state dict, which
    must not race a step) and returns the work for the staging thread; ``submit`` queues that
    work there, ahead of any save's copy, which then reuses the buffers.
    """

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer],
        prepare: Callable[[], Callable[[], int]],
        submit: Callable[[Callable[[], int]], Future[int]],
    ) -> None:
        self._optimizers = list(optimizers)
        self._prepare = prepare
        self._submit = submit
        self.done: Future[int] | None = None
        """Bytes newly allocated, once the staging thread has touched them."""
        self._hooks: list[Any] = [
            opt.register_step_post_hook(lambda *_: self._after_step()) for opt in self._optimizers
        ]

    def _after_step(self) -> None:
        if self.done is None and all(opt.state for opt in self._optimizers):
            self.cancel()
            self.done = self._submit(self._prepare())

    def cancel(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
