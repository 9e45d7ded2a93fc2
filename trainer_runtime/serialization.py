"""Writing and reading one rank's checkpoint file.

Saving streams ``torch.save`` through a writer that hashes the bytes as they go out, so the
checksum costs no second pass over the data. Loading verifies the file against its manifest
entry first, then maps it (``mmap=True``) so tensors are read once, straight from the page cache.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, BinaryIO

import torch

from . import atomic
from .manifest import FileEntry, new_hasher


class _HashingWriter(io.RawIOBase):
    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self.hasher = new_hasher()
        self.size = 0
        self.error: OSError | None = None

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        self.hasher.update(view)
        remaining = view
        try:
            while remaining:
                n = self._f.write(remaining)
                remaining = remaining[n:]
        except OSError as exc:  # torch's writer hides it behind a generic error
            self.error = exc
            raise
        self.size += len(view)
        return len(view)


def save_rank_file(obj: Any, final: Path, *, rank: int, rel_path: str) -> FileEntry:
    """Durably write ``obj`` to ``final``; return the manifest entry describing it."""
    with atomic.atomic_writer(final) as f:
        writer = _HashingWriter(f)
        try:
            torch.save(obj, writer)
        except RuntimeError:
            if writer.error is not None:
                raise writer.error from None  # e.g. ENOSPC, with its real message
            raise
    return FileEntry(path=rel_path, rank=rank, size=writer.size, xxh3_128=writer.hasher.hexdigest())


def load_file(path: Path, *, trusted: bool) -> dict[str, Any]:
    """Read a checkpoint file onto the CPU. Untrusted files cannot run pickled code."""
    return torch.load(path, map_location="cpu", weights_only=not trusted, mmap=True)
