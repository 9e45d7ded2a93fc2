"""How a sharded checkpoint's bytes land on disk and come back: DCP storage, with digests.

DCP splits a checkpoint into a planner (what each rank writes; replicated tensors deduplicated
so each is written once, by one rank, balanced over the ranks) and a storage layer (how bytes
land). This module is the storage layer; planning stays DCP's own. It differs from DCP's
``FileSystemWriter``/``FileSystemReader`` in three ways:

- tensors are written as raw bytes, not one ``torch.save`` zip archive per tensor: no per-tensor
  pickle and CRC pass, and a chunk that lands whole in its target is read straight into that
  target's memory (no intermediate buffer);
- every chunk gets an xxh3-128 digest, recorded in the ``.metadata`` file, and the reader checks
  each chunk as it reads it. A rank that loads at another world size reads only the chunks it
  needs, so whole-file checksums could only be verified by a second full read; chunk digests
  verify exactly the bytes that are used, during the one read;
- each data file's size and whole-file digest are computed while writing (no re-read) and
  handed to the runtime's manifest, which commits the checkpoint.

The ``.metadata`` file is DCP's pickle; it is unpickled with an allow-list (DCP's metadata
classes, torch dtypes and sizes, this module's chunk record), so a checkpoint from an untrusted
source cannot run code at load. Writing to plain DCP files instead (``torch.save`` per tensor)
was measured against this format; see docs/sharded-checkpoints.md.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import io
import os
import pickle
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Future as ConcurrentFuture
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import xxhash
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import _StorageInfo, _StoragePrefix
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import (
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from .. import io_progress
from ..run_folder.names import DATA_SUFFIX, METADATA_NAME
from ..save import atomic
from ..save.manifest import FileEntry

_IO_BLOCK = 16 << 20
"""Writes go in blocks this size; the hashing thread hashes one while the next is written."""


class ChunkDigestError(OSError):
    """A chunk read back does not match the digest written with it."""


@dataclass
class RawChunk(_StorageInfo):
    """Where one saved chunk lives, plus what it takes to decode and verify it."""

    xxh3_128: str = ""
    dtype: str | None = None
    """``None`` for a pickled (non-tensor) object."""
    shape: tuple[int, ...] | None = None


class HashPipeline:
    """Hashes a save's blocks on one background thread, in submission order, while the caller
    writes.

    ``xxhash`` and ``os.pwrite`` release the GIL, so hashing the block just written overlaps
    writing the next one: a chunk costs max(write, hash) instead of their sum. One thread keeps
    the order, which streaming digests need. (Loads hash in line: see ``reading.READ_BLOCK``.)
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rtj-xxh3")
        self._pending: list[ConcurrentFuture[Any]] = []

    def update(self, *hashers: Any, view: memoryview) -> None:
        self._pending.append(self._pool.submit(_update_all, hashers, view))

    def drain(self) -> None:
        """Wait for every block; re-raise the first failure (a digest that did not match)."""
        try:
            for fut in self._pending:
                fut.result()
        finally:
            self._pending = []

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _update_all(hashers: tuple[Any, ...], view: memoryview) -> None:
    for h in hashers:
        h.update(view)


def data_file_name(rank: int) -> str:
    return f"__{rank}_0{DATA_SUFFIX}"


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a CPU tensor (copied once when not contiguous)."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_SYNC_FILE_RANGE = _load_sync_file_range() if sys.platform.startswith("linux") else None
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``length`` bytes at ``offset`` to disk, without waiting.

    A save that only calls ``fsync`` at the end leaves the whole file dirty in the page cache
    until then, so the disk idles while the file is written and the fsync then waits for all
    of it. Starting the writeback of each block right after it is written (Linux
    ``sync_file_range(SYNC_FILE_RANGE_WRITE)``) overlaps the disk with the writing and hashing
    of the next blocks; the final ``fsync`` still makes everything durable (``sync_file_range``
    alone guarantees nothing: no metadata, no device cache flush). Elsewhere a no-op.
    """
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, length, _SYNC_FILE_RANGE_WRITE)  # failure: fsync covers it


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        n = os.pwrite(fd, view, offset)
        io_progress.moved(n)
        view, offset = view[n:], offset + n


class HashingWriter(FileSystemWriter):
    """DCP storage writer: one raw data file per rank with per-chunk and whole-file digests.

    After ``dcp.save`` returns, ``written`` holds this rank's manifest entries (its data file,
    and on the coordinator the ``.metadata`` file).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        sync_files: bool = True,
        staged: set[str] | None = None,
        write_behind: bool = True,
    ) -> None:
        """``staged``: the tensor keys copied for this save; writing any other tensor fails
        the save (it would be read from live memory that training is changing).
        ``write_behind``: start the disk write of each block as soon as it is written
        (``start_writeback``); off only to measure what it gains."""
        super().__init__(path, single_file_per_rank=True, sync_files=sync_files, overwrite=True)
        self.written: list[FileEntry] = []
        self.staged = staged
        self.tensor_keys: set[str] = set()
        """Keys of the tensors this rank wrote (DCP assigns each replicated tensor to one rank)."""
        self.write_behind = write_behind

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        super().reset(checkpoint_id)
        self.written = []

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [
            dataclasses.replace(p, storage_data=_StoragePrefix(f"__{i}_"))
            for i, p in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        tensor_keys = {i.index.fqn for i in plan.items if i.type != WriteItemType.BYTE_IO}
        if self.staged is not None and not tensor_keys <= self.staged:
            unstaged = sorted(tensor_keys - self.staged)[:5]
            raise RuntimeError(f"this rank was assigned tensors it did not stage: {unstaged}")
        self.tensor_keys = tensor_keys
        rank = int(plan.storage_data.prefix.strip("_"))
        name = data_file_name(rank)
        path = Path(self.path) / name
        file_hash = xxhash.xxh3_128()
        results: list[WriteResult] = []
        chunk_hashes: list[Any] = []
        offset = 0
        # Small pickled objects first, then tensors largest first (as DCP's writer does).
        items = sorted(plan.items, key=lambda i: i.type != WriteItemType.BYTE_IO)
        hashing = HashPipeline()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for item in items:
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    assert isinstance(data, io.BytesIO)
                    view, dtype, shape = data.getbuffer().cast("B"), None, None
                else:
                    assert isinstance(data, torch.Tensor)
                    tensor = data.detach()
                    if tensor.device.type != "cpu":
                        tensor = tensor.cpu()
                    view = _tensor_bytes(tensor)
                    dtype, shape = str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape)
                chunk_hash = xxhash.xxh3_128()
                for start in range(0, len(view), _IO_BLOCK):
                    block = view[start : start + _IO_BLOCK]
                    _pwrite_all(fd, block, offset + start)
                    if self.sync_files and self.write_behind:
                        start_writeback(fd, offset + start, len(block))
                    hashing.update(chunk_hash, file_hash, view=block)
                chunk_hashes.append(chunk_hash)
                info = RawChunk(
                    relative_path=name, offset=offset, length=len(view), dtype=dtype, shape=shape
                )
                results.append(
                    WriteResult(index=item.index, size_in_bytes=len(view), storage_data=info)
                )
                offset += len(view)
            hashing.drain()
            if self.sync_files:
                os.fsync(fd)
        finally:
            os.close(fd)
            hashing.close()
        for result, chunk_hash in zip(results, chunk_hashes, strict=True):
            result.storage_data.xxh3_128 = chunk_hash.hexdigest()
        if self.sync_files:
            atomic.fsync_dir(path.parent)  # the file's name is durable before the manifest
        self.written.append(FileEntry(name, rank, offset, file_hash.hexdigest()))
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def storage_meta(self) -> StorageMeta:
        # The folder's name, not its absolute path: a checkpoint is moved, uploaded, fetched.
        return StorageMeta(checkpoint_id=Path(self.path).name, save_id=self.save_id)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.version = "1.0.0"
        metadata.storage_data = {wr.index: wr.storage_data for res in results for wr in res}
        metadata.storage_meta = self.storage_meta()
        blob = pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL)
        atomic.write_bytes_atomic(Path(self.path) / METADATA_NAME, blob)
        atomic.fsync_dir(Path(self.path).parent)  # the checkpoint folder's own entry
        self.written.append(
            FileEntry(METADATA_NAME, self.rank or 0, len(blob), xxhash.xxh3_128_hexdigest(blob))
        )


_ALLOWED_FUNCTIONS = {
    ("collections", "OrderedDict"),
    ("torch.serialization", "_get_layout"),  # how torch pickles a layout: by name
}


def _enum_member(cls: Any, name: Any) -> enum.Enum:
    """``getattr(cls, name)`` limited to one use: how Python 3.11.0 to 3.11.4 pickle an Enum
    member (by name; Debian 12's python3 is 3.11.2). ``cls`` comes from ``find_class``, so it
    is already one of the allowed classes; it must be an Enum and ``name`` one of its members."""
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
        raise pickle.UnpicklingError(
            f"checkpoint metadata calls getattr on {cls!r}: only Enum members are allowed"
        )
    if not isinstance(name, str) or name not in cls.__members__:
        raise pickle.UnpicklingError(
            f"checkpoint metadata names {cls.__name__}.{name}: not a member of that Enum"
        )
    return cls[name]


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata and nothing else: no arbitrary callables from the file."""

    def find_class(self, module: str, name: str) -> Any:
        if "." in name:
            raise pickle.UnpicklingError(f"checkpoint metadata refers to {module}.{name}")
        if module == "builtins" and name == "getattr":
            return _enum_member
        if module == __name__ and name == "RawChunk":
            return RawChunk
        if module == "torch.distributed.checkpoint.filesystem" and name == "_StorageInfo":
            return _StorageInfo
        if module == "torch.distributed.checkpoint.metadata":
            obj = super().find_class(module, name)
            if isinstance(obj, type):  # dataclasses and enums only, no functions
                return obj
        if module == "torch":
            obj = getattr(torch, name, None)
            if obj is torch.Size or isinstance(
                obj, torch.dtype | torch.layout | torch.memory_format
            ):
                return obj
        if (module, name) in _ALLOWED_FUNCTIONS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"checkpoint metadata refers to {module}.{name}: not allowed")


def read_metadata_bytes(blob: bytes, *, trusted: bool) -> Metadata:
    if trusted:
        return pickle.loads(blob)  # noqa: S301 - the caller trusts this checkpoint's source
    return _MetadataUnpickler(io.BytesIO(blob)).load()


def chunk_files(metadata: Metadata) -> Sequence[str]:
    return sorted({info.relative_path for info in metadata.storage_data.values()})
