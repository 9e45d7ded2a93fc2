"""xxh3-128 digests of files, the checksum the checkpoint manifest records for every file.

Hashing reads through ``os.pread`` so it can run beside a parallel transfer of the same file
(no shared file offset), and xxhash releases the GIL, so a hash overlaps the network I/O instead
of adding to it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import xxhash

CHUNK = 8 << 20


class RangeHasher:
    """Feeds consecutive byte ranges of one open file into an xxh3-128 digest, in order."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._hash = xxhash.xxh3_128()
        self.offset = 0

    def advance_to(self, end: int) -> None:
        """Hash bytes ``[offset, end)``; raise if the file is shorter than that."""
        while self.offset < end:
            want = min(CHUNK, end - self.offset)
            buf = os.pread(self._fd, want, self.offset)
            if not buf:
                raise EOFError(f"file ended at byte {self.offset}, expected {end}")
            self._hash.update(buf)
            self.offset += len(buf)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def file_xxh3(path: str | os.PathLike[str], *, stop: Callable[[], bool] | None = None) -> str:
    """Hex xxh3-128 of a whole file (``stop`` lets a caller abandon a long hash early)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        hasher = RangeHasher(fd)
        size = os.fstat(fd).st_size
        while hasher.offset < size:
            if stop is not None and stop():
                raise InterruptedError("hash abandoned")
            hasher.advance_to(min(size, hasher.offset + CHUNK))
        return hasher.hexdigest()
    finally:
        os.close(fd)
