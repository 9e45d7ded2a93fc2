"""A load straight onto the GPU, through a few pinned host slots.

A tensor that lives on a GPU is loaded into a target on that GPU, not into a host copy of the
whole state: the reader reads and hashes each block into a small pinned slot, and an
asynchronous copy on a side stream moves the slot's bytes to the target while the reader fills
the next slot. A slot is refilled only after its copy has finished. The host memory a GPU load
touches is therefore the few slots (reused, pinned once), not a fresh host buffer as large as
the state, which a relaunched process pays for page by page, and the copy to the GPU overlaps
the disk instead of following it.

The targets are private (fresh tensors on the GPU, never live state), so a chunk that fails its
digest changes nothing the caller keeps, as on the host path. ``DeviceRing`` with a CPU device
does the same with plain synchronous copies (what the tests without a GPU exercise).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("trainer_runtime")

RING_SLOTS = 4
RING_SLOT = 4 << 20
"""Four 4 MiB slots, sized by estimate, not tuned: a 1 MiB read takes about 0.5 ms at 2 GB/s
and a 4 MiB copy to the GPU about 0.1-0.2 ms at 25-50 GB/s, so a slot should be free again
well before the reader comes back to it."""


class DeviceRing:
    """Carries chunks to tensors on one device through reused host slots, in order.

    Per chunk: ``begin(dst)``, then ``block(n)`` for each consecutive piece (the reader fills
    and hashes the returned view), then ``end()``. ``close()`` waits for every copy.
    """

    def __init__(
        self, device: torch.device, *, slots: int = RING_SLOTS, slot_bytes: int = RING_SLOT
    ) -> None:
        self.device = device
        cuda = device.type == "cuda"
        self._slots = [
            torch.empty(slot_bytes, dtype=torch.uint8, pin_memory=cuda) for _ in range(slots)
        ]
        self._views = [memoryview(s.numpy()).cast("B") for s in self._slots]
        self._done: list[torch.cuda.Event | None] = [None] * slots
        self._stream = torch.cuda.Stream(device) if cuda else None
        if self._stream is not None:
            # The targets were allocated on the current stream: copy only after it.
            self._stream.wait_stream(torch.cuda.current_stream(device))
        self._slot = 0
        self._fill = 0
        self._dst: torch.Tensor | None = None
        self._sent = 0
        self.copies = 0

    @property
    def slot_bytes(self) -> int:
        return len(self._views[0])

    def begin(self, dst: torch.Tensor) -> None:
        """The next chunk goes to ``dst`` (contiguous, on this ring's device), from its start."""
        self._dst = dst.detach().reshape(-1).view(torch.uint8)
        self._sent = 0

    def block(self, n: int) -> memoryview:
        """Where the chunk's next ``n`` bytes go (at most ``slot_bytes``)."""
        if n > self.slot_bytes:
            raise ValueError(f"a block of {n} bytes exceeds the ring's {self.slot_bytes}")
        if self._fill + n > self.slot_bytes:
            self._send()
        if self._fill == 0:
            done = self._done[self._slot]
            if done is not None:
                done.synchronize()  # its previous copy has left the slot
                self._done[self._slot] = None
        view = self._views[self._slot][self._fill : self._fill + n]
        self._fill += n
        return view

    def end(self) -> None:
        """The chunk is complete: send what its last slot holds."""
        self._send()
        assert self._dst is not None
        if self._sent != self._dst.numel():
            raise ValueError(f"sent {self._sent} bytes to a {self._dst.numel()}-byte target")
        self._dst = None

    def _send(self) -> None:
        n = self._fill
        if n == 0:
            return
        assert self._dst is not None
        src, dst = self._slots[self._slot][:n], self._dst[self._sent : self._sent + n]
        if self._stream is None:
            dst.copy_(src)
        else:
            with torch.cuda.stream(self._stream):
                dst.copy_(src, non_blocking=True)
                done = torch.cuda.Event()
                done.record(self._stream)
            self._done[self._slot] = done
        self.copies += 1
        self._sent += n
        self._fill = 0
        self._slot = (self._slot + 1) % len(self._slots)

    def close(self) -> None:
        """Wait for every copy; the current stream then sees the targets complete."""
        if self._stream is not None:
            self._stream.synchronize()
            torch.cuda.current_stream(self.device).wait_stream(self._stream)
        self._done = [None] * len(self._slots)


def load_targets(
    make: Callable[[bool], tuple[dict[str, Any], Any]],
) -> tuple[dict[str, Any], Any]:
    """``make(gpu_on_gpu)`` builds a load's targets (the tree, the fresh optimizer state):
    first with tensors of a GPU on that GPU, and where that GPU lacks the memory, again with
    every target on the host.

    On the GPU the targets take as much memory as the model's parameters (the optimizer's
    targets become its state), no more than the gradients training allocates after resume."""
    try:
        return make(True)
    except torch.cuda.OutOfMemoryError as exc:
        log.info("load targets do not fit on the GPU (%s); reading through host memory", exc)
    return make(False)
