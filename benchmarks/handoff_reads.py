"""The GPU load's reads as they were before ``ring_reads.RingReads``, kept as the baseline that
``load_phases.py``'s ``load-handoff`` and ``ring-<size>-handoff`` contenders measure against.

The loading thread handed the reading thread one block at a time: it waited for block N to land,
took a free slot, started the read of block N + 1 (and waited until that read had begun), and
only then copied and hashed block N. Same interface as ``RingReads``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from typing import Any

from trainer_runtime.sharded.ring_reads import (
    RING_BLOCK,
    Landed,
    RingChunk,
    RingReads,
    read_exactly,
)


class HandoffReads:
    copy_next = RingReads.copy_next  # the loading thread's side is the same: only take() differs

    def __init__(self, chunks: Sequence[RingChunk], *, block: int = RING_BLOCK) -> None:
        self._chunks = list(chunks)
        self._block = block
        self._taken = 0
        self._pool = futures.ThreadPoolExecutor(1, thread_name_prefix="rtj-read")

    def _start(self, fn: Callable[..., None], *args: Any) -> futures.Future[None]:
        begun = threading.Event()

        def run() -> None:
            begun.set()
            fn(*args)

        future = self._pool.submit(run)
        begun.wait()
        return future

    def take(self) -> tuple[RingChunk, Iterator[Landed]]:
        chunk = self._chunks[self._taken]
        self._taken += 1
        block = min(self._block, chunk.ring.slot_bytes)
        end = chunk.offset + chunk.length

        def start(begin: int) -> tuple[Landed, futures.Future[None]]:
            slot = chunk.ring.acquire()
            assert slot is not None
            n = min(block, chunk.length - begin)
            view = chunk.ring.view(slot, n)
            return Landed(slot, begin, view), self._start(
                read_exactly, chunk.fd, chunk.rel, view, chunk.offset + begin, end
            )

        def blocks() -> Iterator[Landed]:
            landing = start(0)
            while landing is not None:
                landing[1].result()
                landed, landing = landing[0], None
                following = landed.begin + len(landed.data)
                if following < chunk.length:
                    landing = start(following)
                yield landed

        return chunk, blocks()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
