"""Writing one rank's checkpoint file (format 1: ``rank{r}.pt``, a full ``torch.save``).

Saving streams ``torch.save``'s zip format through a writer that hashes the bytes as they go out,
so the checksum costs no second pass over the data. The zip's own CRC-32 of every record is
switched off for these files: xxh3 already covers every byte (checked against the manifest
before any load) and the CRC costs about a quarter of a save. The switch is made on the one zip
writer the runtime builds (``PyTorchFileWriter(..., compute_crc32=False)``), never through
torch's process-wide ``set_crc32_options``: flipping that global, even under a lock, would also
strip the CRC from a ``torch.save`` another thread of the user's program runs at the same moment.
``torch.load`` reads the files either way (it does not check the CRC).

The runtime writes format 2 (``sharded/``) and only reads format 1, all of it in
``resume/per_rank_format.py``; this writer is what earlier releases saved with, kept so that
tests can write the files that reader must read.
"""

from __future__ import annotations

import io
import logging
import pickle
from pathlib import Path
from typing import Any, BinaryIO

import torch

from . import atomic
from .manifest import FileEntry, new_hasher

log = logging.getLogger(__name__)


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


def _crc_free_writer(buffer: BinaryIO) -> Any | None:
    """torch's zip writer over ``buffer`` with the CRC-32 off; None when this torch's private
    writer API has another shape (then plain ``torch.save`` is used, CRC and all)."""
    writer_cls = getattr(torch._C, "PyTorchFileWriter", None)
    alignment = getattr(torch.serialization, "_get_storage_alignment", lambda: 64)
    if writer_cls is None or not hasattr(torch.serialization, "_save"):
        return None
    try:
        return writer_cls(buffer, False, alignment())
    except TypeError:
        return None


_warned: set[str] = set()


def torch_save_no_crc(obj: Any, buffer: BinaryIO) -> None:
    """``torch.save(obj, buffer)`` without the per-record CRC-32 (readable by ``torch.load``).

    Touches no process-wide setting, so it is safe beside other threads' ``torch.save``.
    """
    zip_file = _crc_free_writer(buffer)
    if zip_file is None:
        if "crc" not in _warned:
            log.warning("this torch has no CRC-free zip writer; saving with torch.save")
            _warned.add("crc")
        torch.save(obj, buffer)
        return
    torch.serialization._save(obj, zip_file, pickle, torch.serialization.DEFAULT_PROTOCOL, False)
    zip_file.write_end_of_file()


def save_rank_file(obj: Any, final: Path, *, rank: int, rel_path: str) -> FileEntry:
    """Durably write ``obj`` to ``final``; return the manifest entry describing it."""
    with atomic.atomic_writer(final) as f:
        writer = _HashingWriter(f)
        try:
            torch_save_no_crc(obj, writer)
        except RuntimeError:
            if writer.error is not None:
                raise writer.error from None  # e.g. ENOSPC, with its real message
            raise
    return FileEntry(path=rel_path, rank=rank, size=writer.size, xxh3_128=writer.hasher.hexdigest())
