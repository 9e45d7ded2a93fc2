"""Loops that fetch the next batch before the optimizer step, resumed bit for bit.

nanoGPT's loop (and many like it) draws batch N+1 (``get_batch``: random offsets from the global
torch generator) while step N is still running, so when the step's save point comes the
generator is already past a batch that no step has trained on. The checkpoint then holds the
generator's state after that draw, but not the batch: a resumed run draws batch N+2 where the
uninterrupted run trained on N+1, and every loss after the resume differs. Nothing fails.

``Prefetched`` wraps the fetch and saves the batch it returned last (the one fetched ahead) in
the checkpoint, as a stateful object of the rank; the first fetch after a resume returns that
batch instead of drawing a new one. The generator state saved beside it is the one after the
draw, so every later draw is the uninterrupted run's.
(Rejected: rewinding the generator to its state before the fetch: the forward pass between the
fetch and the save point draws from the same generator (dropout), so no single earlier state is
right for both; and the batch is small beside the model.)

It is for loops that fetch ahead only: in a loop that fetches at the top of each step, the
batch returned last has already been trained on when the save point comes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from .errors import ConfigError


class Prefetched:
    """A batch source whose batch fetched ahead of the save point is saved and replayed.

    ``source``: a function returning the next batch (``lambda: get_batch("train")``) or an
    iterator. Register it with the manager (``stateful={"batches": fetch}``) and call it where
    the loop called the source. Batches are tensors, or tuples, lists and dicts of them and of
    plain values (what the weights-only unpickler reads); tensors are saved on the CPU and
    restored to the device they were on.
    """

    def __init__(self, source: Callable[[], Any] | Iterator[Any]) -> None:
        if callable(source):
            self._next: Callable[[], Any] = source
        elif hasattr(source, "__next__"):
            self._next = source.__next__
        else:
            raise ConfigError(
                f"Prefetched(source): expected a function returning a batch or an iterator, "
                f"got {type(source).__name__}"
            )
        self._last: Any = None
        self._has_last = False
        self._replay: list[Any] = []

    def __call__(self) -> Any:
        batch = self._replay.pop() if self._replay else self._next()
        self._last, self._has_last = batch, True
        return batch

    def state_dict(self) -> dict[str, Any]:
        if not self._has_last:
            return {"ahead": False}
        return {"ahead": True, "batch": _to_cpu(self._last), "devices": _devices(self._last)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._replay = []
        if state.get("ahead"):
            self._replay.append(_to_devices(state["batch"], state.get("devices")))
        self._last, self._has_last = None, False


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, tuple | list):
        return type(value)(_to_cpu(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _devices(value: Any) -> Any:
    """The device of each tensor, in the batch's shape (None where there is none)."""
    if isinstance(value, torch.Tensor):
        return str(value.device)
    if isinstance(value, tuple | list):
        return [_devices(v) for v in value]
    if isinstance(value, dict):
        return {k: _devices(v) for k, v in value.items()}
    return None


def _to_devices(value: Any, devices: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(_usable(devices)) if isinstance(devices, str) else value
    if isinstance(value, tuple | list):
        shape = devices if isinstance(devices, list) else [None] * len(value)
        return type(value)(_to_devices(v, d) for v, d in zip(value, shape, strict=False))
    if isinstance(value, dict):
        shape = devices if isinstance(devices, dict) else {}
        return {k: _to_devices(v, shape.get(k)) for k, v in value.items()}
    return value


def _usable(device: str) -> torch.device:
    """The saved device, or the CPU when this process has no such device (a GPU run resumed on
    a machine without one: the model moves the same way)."""
    wanted = torch.device(device)
    if wanted.type == "cuda" and not torch.cuda.is_available():
        return torch.device("cpu")
    return wanted
