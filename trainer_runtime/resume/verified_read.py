"""Loading a rank file with one read: checksum it into anonymous memory, then unpickle from there.

Resume used to read every rank file twice (a checksum pass over the file, then
``torch.load(mmap=True)``) and then copy the optimizer state off the file mapping. Here the file
is read once, in large chunks, into an anonymous memory mapping, and each chunk is hashed
(streaming xxh3-128) as it arrives. Only when the digest matches the manifest is the buffer
unpickled, and the tensors are zero-copy slices of it (torch's own ``overall_storage`` path, the
one ``mmap=True`` uses for a file): no tensor is ever backed by the checkpoint file, and corrupt
bytes never reach a live tensor because nothing is deserialized before the whole file verified.

Rejected alternatives: ``torch.load(BytesIO(...))`` copies every record into fresh storages (a
second pass over all bytes, and fresh memory the first step would fault in); verifying the file
and then mapping it reads it twice and leaves the state file-backed.

Large tensor records (1 MiB and up) are read straight into storages of their own, allocated as
``torch.load`` allocates them, so the module weights' memory is freed as soon as
``load_state_dict`` has copied them into the parameters. The rest of the file lands in one
anonymous mapping at its own offsets (untouched pages of it cost nothing); after the restore,
its pages that no surviving tensor uses (small weights, the zip's headers) are handed back to
the kernel (``release_unused``).
"""

from __future__ import annotations

import inspect
import io
import logging
import mmap
import os
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any

import torch

from ..save.manifest import FileEntry, entry_label, new_hasher, wrong_size
from ..save.safe_unpickle import refused_globals
from .pages import populate_for_write

log = logging.getLogger(__name__)

_CHUNK = 64 << 20
_OWN_STORAGE_MIN = 1 << 20  # smaller records stay in the shared buffer


def _takes_weights_only(private_load: Any) -> bool:
    try:
        return "weights_only" in inspect.signature(private_load).parameters
    except (TypeError, ValueError):
        return False


class VerifiedFile:
    """One rank file's bytes in anonymous memory, already checked against its manifest entry."""

    def __init__(
        self, buffer: mmap.mmap, size: int, records: dict[int, torch.UntypedStorage]
    ) -> None:
        self.buffer = buffer
        self.size = size
        self._records = records  # offset -> a large record's own storage (its bytes not in buffer)
        self._record_ranges = [(off, off + s.nbytes()) for off, s in records.items()]
        self._slices: list[tuple[int, int, int]] = []  # (start, stop, storage weak ref)

    def load(self, *, trusted: bool) -> dict[str, Any]:
        """Unpickle the file; its tensors are the storages read into (nothing is file-backed)."""
        reader = getattr(torch._C, "PyTorchFileReader", None)
        private_load = getattr(torch.serialization, "_load", None)
        if reader is None or private_load is None or self.size == 0:
            return self._load_copying(trusted=trusted)
        whole = torch.frombuffer(self.buffer, dtype=torch.uint8, count=self.size).untyped_storage()
        zip_file = reader(_MemoryFile(memoryview(self.buffer)[: self.size]))
        slices = _RecordingSlices(whole, self._slices, self._records)
        self._records = {}  # from here on the loaded tree alone keeps them alive
        if trusted:
            return private_load(zip_file, "cpu", pickle, overall_storage=slices)
        # Newer torch also takes weights_only here; before it (2.11 and older), the restricted
        # unpickler module alone is what torch.load's weights_only passes.
        extra = {"weights_only": True} if _takes_weights_only(private_load) else {}
        try:
            return private_load(
                zip_file,
                "cpu",
                torch.serialization._weights_only_unpickler,
                overall_storage=slices,
                **extra,
            )
        except pickle.UnpicklingError as exc:
            explain = getattr(torch.serialization, "_get_wo_message", None)  # gone in 2.15
            raise pickle.UnpicklingError(explain(str(exc)) if explain else str(exc)) from None

    def refused_globals(self) -> list[str]:
        """The classes in the file's pickle the weights-only unpickler refuses (the pickle
        is scanned, nothing is loaded)."""
        return refused_globals(_MemoryFile(memoryview(self.buffer)[: self.size]))

    def _load_copying(self, *, trusted: bool) -> dict[str, Any]:
        log.debug("this torch has no zero-copy load; copying out of the verified buffer")
        data = bytearray(self.buffer[: self.size])
        for off, storage in self._records.items():
            as_bytes = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
            data[off : off + storage.nbytes()] = as_bytes.tobytes()
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=not trusted)

    def release_unused(self) -> int:
        """Give back the pages no live tensor uses; returns the bytes released.

        Call once the restore has dropped its references to the loaded tree. A storage still
        alive anywhere (optimizer state, user extras, a tensor a custom module kept) keeps its
        pages, so this never changes a value a live tensor can see.
        """
        live = list(self._record_ranges)  # never held bytes in the buffer: nothing to give back
        for start, stop, ref in self._slices:
            if not torch.UntypedStorage._expired(ref):
                live.append((start, stop))
            torch.UntypedStorage._free_weak_ref(ref)
        self._slices.clear()
        page = mmap.PAGESIZE
        released, cursor = 0, 0
        for start, stop in [*sorted(live), (self.size, self.size)]:
            lo, hi = -(-cursor // page) * page, (start // page) * page
            if hi > lo and hasattr(self.buffer, "madvise"):
                self.buffer.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
                released += hi - lo
            cursor = max(cursor, stop)
        return released


def read_verified(folder: Path, entry: FileEntry) -> VerifiedFile | str:
    """Read ``entry``'s file once into anonymous memory, hashing it on the way.

    Returns the verified bytes, or a reason (fit for a log line) why the file does not match
    its manifest entry; no byte of a file that fails is ever deserialized.
    """
    path = folder / entry.path
    try:
        f = open(path, "rb", buffering=0)  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return f"{entry_label(entry)} is missing"
    with f:
        size = os.fstat(f.fileno()).st_size
        if size != entry.size:
            return wrong_size(entry_label(entry), size, entry.size)
        got, digest = _read_hashing(f, size)
    if got.size != size:
        return f"{entry_label(entry)} ended after {got.size} of {size} bytes"
    if digest != entry.xxh3_128:
        return f"{entry_label(entry)} fails its checksum"
    return got


def read_whole(path: Path) -> VerifiedFile:
    """Read a checkpoint file that has no manifest (``load(path_to_file)``) into anonymous
    memory, unchecked: such a file is loaded as it is, like ``torch.load`` would."""
    with open(path, "rb", buffering=0) as f:
        return _read_hashing(f, os.fstat(f.fileno()).st_size)[0]


def _read_hashing(f: io.RawIOBase, size: int) -> tuple[VerifiedFile, str]:
    """The file's bytes and their xxh3-128, in one sequential pass.

    Large tensor records are read straight into storages of their own (allocated like
    ``torch.load`` allocates them, so memory freed after the restore is reused as usual);
    everything else lands at its offset in an anonymous mapping whose untouched pages cost
    nothing. The zip's directory is read first to learn where records lie; it is trusted for
    nothing else, and a layout that does not add up just means everything goes to the mapping.
    """
    layout = _large_records(f, size)
    buffer = mmap.mmap(-1, max(size, 1))
    view = memoryview(buffer)
    hasher = new_hasher()
    records: dict[int, torch.UntypedStorage] = {}
    pos = 0

    def read_into(target: memoryview, start: int, stop: int) -> bool:
        nonlocal pos
        f.seek(start)
        at = 0
        while start + at < stop:
            n = f.readinto(target[at : min(at + _CHUNK, stop - start)])
            if not n:
                return False
            hasher.update(target[at : at + n])
            at += n
        pos = stop
        return True

    try:
        for header, length in layout:
            if header < pos:
                break  # a directory that does not add up: the rest goes to the buffer
            if not read_into(view[pos : header + 30], pos, header + 30):
                break
            name_len, extra_len = struct.unpack_from("<HH", view, header + 26)
            data = header + 30 + name_len + extra_len
            if data + length > size or not read_into(view[pos:data], pos, data):
                break
            storage = torch.empty(length, dtype=torch.uint8)
            populate_for_write(storage)  # its pages mapped in one call, not one fault each
            if not read_into(memoryview(storage.numpy()), data, data + length):
                break
            records[data] = storage.untyped_storage()
        read_into(view[pos:size], pos, size)
    finally:
        view.release()
    return VerifiedFile(buffer, pos, records), hasher.hexdigest()


def _large_records(f: io.RawIOBase, size: int) -> list[tuple[int, int]]:
    """(local header offset, data length) of the stored records worth a storage of their own,
    in file order; empty when the zip directory cannot be read or does not add up."""
    try:
        infos = zipfile.ZipFile(f).infolist()  # type: ignore[arg-type]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error):
        return []
    found: list[tuple[int, int]] = []
    end = 0
    for info in sorted(infos, key=lambda i: i.header_offset):
        if info.header_offset < end or info.compress_type != zipfile.ZIP_STORED:
            return []
        end = info.header_offset + 30 + info.compress_size
        if end > size:
            return []
        if info.compress_size >= _OWN_STORAGE_MIN and "/data/" in info.filename:
            found.append((info.header_offset, info.compress_size))
    return found


class _RecordingSlices:
    """``overall_storage`` for ``torch.serialization._load``: slices of the buffer, each
    remembered (by weak reference) so the pages of the ones that die can be given back."""

    def __init__(
        self,
        whole: torch.UntypedStorage,
        record: list[tuple[int, int, int]],
        own: dict[int, torch.UntypedStorage],
    ) -> None:
        self._whole = whole
        self._record = record
        self._own = own

    def __getitem__(self, item: slice) -> torch.UntypedStorage:
        own = self._own.get(item.start)
        if own is not None:  # a record read into its own storage; the buffer lacks its bytes
            length = item.stop - item.start
            if length > own.nbytes():
                raise ValueError(f"a tensor wants {length} bytes of a {own.nbytes()}-byte record")
            return own if length == own.nbytes() else own[:length]
        part = self._whole[item]
        self._record.append((item.start, item.stop, part._weak_ref()))
        return part


class _MemoryFile(io.RawIOBase):
    """A seekable read-only file over a memoryview, for torch's zip reader."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = base + offset
        return self._pos

    def readinto(self, b: Any) -> int:
        out = memoryview(b).cast("B")
        chunk = self._view[self._pos : self._pos + len(out)]
        out[: len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)
