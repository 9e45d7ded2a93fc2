"""A load straight onto the GPU, through a few pinned host slots.

A tensor that lives on a GPU is loaded into a target on that GPU, not into a host copy of the
whole state: reading threads read each block into a small pinned slot
(``ring_reads.RingReads``), the loading thread starts an asynchronous copy of it to the target
on a side stream and hashes it meanwhile, and the slot is refilled only after its copy has
finished. The host memory a GPU load touches is therefore the few slots (reused, pinned once),
not a fresh host buffer as large as the state, which a relaunched process pays for page by
page, and the copy to the GPU overlaps the disk instead of following it.

The targets are private (fresh tensors on the GPU, never live state), so a chunk that fails its
digest changes nothing the caller keeps, as on the host path. ``DeviceRing`` with a CPU device
does the same with plain synchronous copies (what the tests without a GPU exercise).
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("trainer_runtime")

RING_SLOTS = 4
RING_SLOT = 4 << 20
"""Four 4 MiB slots: a 4 MiB read takes about 2 ms at 2 GB/s and a 4 MiB copy to the GPU
about 0.1-0.2 ms at 25-50 GB/s, so a slot is free again well before the reader comes back to
it. Reads in blocks of a whole slot were the fastest measured (``ring_reads.RING_BLOCK``).
Sixteen slots measured the same on an H100 machine (a 1 GiB load in 0.886 s against 0.887 s,
medians of 6; docs/sharded-checkpoints.md, run 7)."""

RING_LANES = 2
"""Reading threads per load (``ring_reads.RingReads``), each reading every other block into its
own two of the slots. On one H100 machine (relaunched 1 GiB loads, page cache dropped, 17
interleaved rounds of two runs) two threads took 0.630 s against 0.718 s for one (paired 0.91x,
faster in 11 of 17 rounds), against 0.552 s for a raw read of the file: the disk answers two
requests at once faster than one after the other (docs/sharded-checkpoints.md, runs 8 and 9)."""


class DeviceRing:
    """Reused host slots, and a side stream that copies them to tensors on one device.

    The slots circulate between the reading threads and the loading thread: ``acquire`` (a reading
    thread) hands out a free slot once its last copy has left it, the reader fills ``view``;
    ``send`` (loading thread) copies it to its target, ``release`` returns it to the free ones.
    ``close()`` waits for every copy.

    With ``lanes`` above 1 the slots are dealt out among that many reading threads (slot ``s``
    belongs to lane ``s % lanes``): a reader waits only for its own slots, which the loading
    thread gives back in the order it takes the blocks, so no reader can hold the slot that
    another one's next block needs.
    """

    def __init__(
        self,
        device: torch.device,
        *,
        slots: int = RING_SLOTS,
        slot_bytes: int = RING_SLOT,
        lanes: int = RING_LANES,
    ) -> None:
        if not 1 <= lanes <= slots:
            raise ValueError(f"lanes must be between 1 and the ring's {slots} slots, not {lanes}")
        self.device = device
        self.lanes = lanes
        cuda = device.type == "cuda"
        self._slots = [
            torch.empty(slot_bytes, dtype=torch.uint8, pin_memory=cuda) for _ in range(slots)
        ]
        self._views = [memoryview(s.numpy()).cast("B") for s in self._slots]
        self._done: list[torch.cuda.Event | None] = [None] * slots
        self._free: list[queue.SimpleQueue[int | None]] = [
            queue.SimpleQueue() for _ in range(lanes)
        ]
        for slot in range(slots):
            self._free[slot % lanes].put(slot)
        self._stream = torch.cuda.Stream(device) if cuda else None
        if self._stream is not None:
            # The targets were allocated on the current stream: copy only after it.
            self._stream.wait_stream(torch.cuda.current_stream(device))
        self.copies = 0

    @property
    def slot_bytes(self) -> int:
        return len(self._views[0])

    def acquire(self, lane: int = 0) -> int | None:
        """A free slot of ``lane``, once its last copy has left it; ``None`` once ``stop`` was
        called."""
        slot = self._free[lane].get()
        if slot is not None:
            done = self._done[slot]
            if done is not None:
                with torch.cuda.device(self.device):  # this thread's current device may differ
                    done.synchronize()
                self._done[slot] = None
        return slot

    def view(self, slot: int, n: int) -> memoryview:
        """The first ``n`` bytes of ``slot``, to fill."""
        if n > self.slot_bytes:
            raise ValueError(f"a block of {n} bytes exceeds the ring's {self.slot_bytes}")
        return self._views[slot][:n]

    def send(self, slot: int, dst: torch.Tensor) -> None:
        """Copy the first ``dst.numel()`` bytes of ``slot`` into ``dst`` (bytes on this ring's
        device), asynchronously on a GPU."""
        src = self._slots[slot][: dst.numel()]
        if self._stream is None:
            dst.copy_(src)
        else:
            with torch.cuda.stream(self._stream):
                dst.copy_(src, non_blocking=True)
                done = torch.cuda.Event()
                done.record(self._stream)
            self._done[slot] = done
        self.copies += 1

    def release(self, slot: int) -> None:
        """``slot`` may be refilled once its copy is done."""
        self._free[slot % self.lanes].put(slot)

    def stop(self) -> None:
        """Wake the readers waiting in ``acquire``: each lane's gets ``None``."""
        for free in self._free:
            free.put(None)

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
