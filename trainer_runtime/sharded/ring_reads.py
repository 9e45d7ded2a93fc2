"""The reads of a GPU load: reading threads (``DeviceRing.lanes``, two) read every chunk bound
for a GPU, block after block, the blocks dealt to them in turn, into their rings' free slots,
while the loading thread copies and hashes the blocks that landed.

A reading thread waits for nothing but the disk and a free slot of its own, so its next read
starts as soon as its last one ends, and with two of them the disk always has a second request
to serve. The loading thread takes the blocks in file order, lane after lane,
starts each one's copy to its target (``DeviceRing.send``), hashes it while the copy runs, and
gives the slot back. Before this, the loading thread handed the reading thread one block at a
time and took it back when it landed: three thread wake-ups between one read and the next, and
on one H100 machine the read loop took about the sum of the reads and the hashing instead of
the reads alone (docs/sharded-checkpoints.md, "Loading onto a GPU").
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .device_ring import DeviceRing
from .storage import ChunkDigestError

RING_BLOCK = 4 << 20
"""Reads of chunks bound for a GPU go in blocks this size (at most a ring slot). Measured on one
H100 machine (relaunched processes, 1 GiB, page cache dropped, 3 rounds,
benchmarks/load_phases.py): the file hashed through the ring in 1 MiB blocks 0.84 s
[0.67-0.84], in 4 MiB blocks 0.74 s [0.71-0.82], in 16 MiB blocks 0.81 s [0.80-0.82]."""


@dataclass(frozen=True)
class RingChunk:
    """A stored chunk's bytes ``[offset, offset + length)`` in the open file ``fd``, bound for
    ``ring``'s device."""

    fd: int
    rel: str
    offset: int
    length: int
    ring: DeviceRing


@dataclass(frozen=True)
class Landed:
    """A block of a chunk, read into ``slot`` of the chunk's ring."""

    slot: int
    begin: int
    """Where the block falls in its chunk."""
    data: memoryview


class RingReads:
    """Reads ``chunks`` in order into their rings' slots, on threads of its own (started here):
    one per lane of the rings (``DeviceRing.lanes``, the same for every ring of one load).

    The chunks' blocks, one after another, go to the lanes in turn: with two lanes, one thread
    reads blocks 0, 2, 4... and the other 1, 3, 5..., each into its own slots. The loading
    thread takes the chunks in the same order, ``take()`` for each, and must ``release`` every
    slot it was given once done with it; ``close()`` stops the threads and waits for them (a
    failed load leaves no read writing into a slot).
    """

    def __init__(self, chunks: Sequence[RingChunk], *, block: int = RING_BLOCK) -> None:
        self._chunks = list(chunks)
        lanes = {chunk.ring.lanes for chunk in self._chunks} or {1}
        if len(lanes) > 1:
            raise ValueError(f"the rings of one load have different lanes: {sorted(lanes)}")
        self._lanes = lanes.pop()
        self._blocks = [
            (index, begin, min(step, chunk.length - begin))
            for index, chunk in enumerate(self._chunks)
            for step in [min(block, chunk.ring.slot_bytes)]
            for begin in range(0, chunk.length, step)
        ]
        self._landed: list[queue.SimpleQueue[tuple[int, int, int, int] | BaseException]] = [
            queue.SimpleQueue() for _ in range(self._lanes)
        ]
        self._taken = 0
        self._blocks_taken = 0
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._run, args=(lane,), name=f"rtj-read-{lane}", daemon=True)
            for lane in range(self._lanes if self._chunks else 0)
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, lane: int) -> None:
        try:
            for index, begin, n in self._blocks[lane :: self._lanes]:
                chunk = self._chunks[index]
                slot = chunk.ring.acquire(lane)
                if slot is None or self._stopped:
                    return
                view = chunk.ring.view(slot, n)
                read_exactly(
                    chunk.fd, chunk.rel, view, chunk.offset + begin, chunk.offset + chunk.length
                )
                self._landed[lane].put((index, slot, begin, n))
        except BaseException as exc:  # raised on the loading thread, by take()
            self._landed[lane].put(exc)

    def take(self) -> tuple[RingChunk, Iterator[Landed]]:
        """The next chunk, and its blocks in order as they land (a failed read raises here)."""
        index = self._taken
        self._taken += 1
        chunk = self._chunks[index]

        def blocks() -> Iterator[Landed]:
            done = 0
            while done < chunk.length:
                got = self._landed[self._blocks_taken % self._lanes].get()
                if isinstance(got, BaseException):
                    raise got
                self._blocks_taken += 1
                at, slot, begin, n = got
                if (at, begin) != (index, done):
                    raise RuntimeError(f"block {at}@{begin} landed where {index}@{done} was due")
                yield Landed(slot, begin, chunk.ring.view(slot, n))
                done += n

        return chunk, blocks()

    def copy_next(self, dst: torch.Tensor, digest: Any = None) -> RingChunk:
        """Take the next chunk into ``dst`` (its bytes, flat, on the ring's device): start each
        block's copy as it lands, hash the block into ``digest`` while the copy runs, then give
        its slot back."""
        chunk, blocks = self.take()
        for block in blocks:
            chunk.ring.send(block.slot, dst[block.begin : block.begin + len(block.data)])
            if digest is not None:
                digest.update(block.data)
            chunk.ring.release(block.slot)
        return chunk

    def close(self) -> None:
        if not self._threads:
            return
        self._stopped = True
        for ring in {id(c.ring): c.ring for c in self._chunks}.values():
            ring.stop()
        for thread in self._threads:
            thread.join()
        self._threads = []


def read_exactly(fd: int, rel: str, view: memoryview, offset: int, chunk_end: int) -> None:
    """Read ``len(view)`` bytes at ``offset`` into ``view``; a file that ends first is damaged
    (its chunk ends at ``chunk_end``)."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise ChunkDigestError(
                f"{rel} ends at byte {offset + got}; the chunk needs {chunk_end}"
            )
        got += n
