"""A sharded checkpoint's load: every chunk read once, its digest checked as it lands.

``VerifyingReader`` is DCP's storage reader for folders ``storage.HashingWriter`` wrote. One
thread reads the chunks this rank needs, in file order, on one descriptor per file (so the
kernel's readahead sees one sequential stream). A relaunched process loads into memory it never
touched, and mapping those pages costs about as much CPU as reading the bytes; where the process
has a second CPU to itself (``prefault_thread``), a helper thread maps the pages just ahead of
the reader (``pages.populate_pages``, at most ``MAP_LEAD`` ahead) while the reader waits on the
disk. Whichever thread reaches a span of pages first maps it, so a helper that falls behind costs
nothing. Chunks bound for a GPU go through ``DeviceRing`` slots instead, read on two threads of
their own (``ring_reads``) while this one copies and hashes the blocks that landed. Host loads
keep one reading thread: several, each on its own part of the file, were slower on a 2-core VM
and 8% faster on 16 cores (docs/sharded-checkpoints.md, "Loading").

Nothing a failed load reads reaches the caller's live state: every chunk goes into a load target
(staging, or a fresh optimizer tensor), and pickled objects are handed to the planner only after
every chunk has passed its digest.
"""

from __future__ import annotations

import io
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import xxhash
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from .. import envvars
from ..resume.pages import all_present, can_populate, page_spans, populate_for_write, populate_pages
from ..save.manifest import FileEntry
from .device_ring import DeviceRing
from .ring_reads import RingChunk, RingReads, read_exactly
from .storage import METADATA_NAME, ChunkDigestError, RawChunk, read_metadata_bytes

log = logging.getLogger("trainer_runtime")

READ_BLOCK = 1 << 20
"""Reads go in blocks this size, each hashed on the reading thread as soon as it lands, while
it is still in the CPU cache. Measured in relaunched processes (1 GiB, page cache dropped,
medians of 6, interleaved): 1 MiB blocks hashed in line loaded in 0.75 s, 16 MiB 0.82 s,
64 MiB 0.80 s. docs/sharded-checkpoints-history.md has the figures."""

MAP_LEAD = 16 << 20
"""How far ahead of the reader the helper thread maps pages: within the CPU's last-level cache
(32 MiB on the VM measured), so the pages it zeroes are still cached when the reader fills them.
Measured on the 2-core VM (reads of 1 GiB into fresh memory, page cache dropped, 10 runs
each): no limit 0.50-1.71 s (4 runs over 0.85 s), about 18 MiB 0.49-0.57 s."""

MAP_SPAN = 4 << 20
"""The most the helper maps in one call, so that it stops close to the lead."""


def prefault_thread() -> bool:
    """Whether a load maps its targets' pages on a helper thread: when the kernel can map them
    in one call (``pages.can_populate``) and this process has at least two CPUs to itself (its
    affinity divided by ``LOCAL_WORLD_SIZE``, the processes torchrun started on this node)."""
    if not can_populate():
        return False
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    raw = os.environ.get(envvars.LOCAL_WORLD_SIZE, "1")
    try:
        local = int(raw)
    except ValueError:
        local = 0
    if local < 1:
        log.warning(
            "%s=%r: expected a positive integer (the processes torchrun started on this "
            "node); counting 1",
            envvars.LOCAL_WORLD_SIZE,
            raw,
        )
        local = 1
    return cpus // local >= 2


@dataclass(frozen=True)
class _Span:
    """Pages of one load target that are mapped in one call."""

    begin: int
    """Where the span's first byte falls in the read: bytes of earlier targets plus its offset."""
    address: int
    length: int


class _PageMapper:
    """Maps load targets' pages in read order, on a helper thread that stays a short way ahead
    of the reader.

    The reader reports where it is before each block it reads (``before_block``) and maps, itself,
    whatever pages of that block the helper has not claimed; each span is mapped once, by
    whichever thread claims it first. The helper maps no further than ``lead`` bytes ahead of the
    reader: pages it mapped far ahead, zeroed long before the reader filled them, made one load
    in three on the 2-core VM run at a third of the disk's speed, the reader's copies out of the
    page cache taking seven times their usual CPU (docs/sharded-checkpoints.md). Mapping leaves
    the contents alone, so a read that overlaps the helper's call on the same pages is still
    exact. A target whose pages are all present already (a staging buffer that a save or an
    earlier load wrote) is left out: mapping it again would only cost time.
    """

    def __init__(
        self,
        targets: list[torch.Tensor | None],
        *,
        helper: bool,
        lead: int = MAP_LEAD,
        span: int = MAP_SPAN,
    ) -> None:
        self._spans: list[_Span] = []
        self._by_target: list[range] = []
        self._starts: list[int] = []  # each target's first byte, counted along the read
        at = 0
        for target in targets:
            first = len(self._spans)
            self._starts.append(at)
            if target is not None and not all_present(target):
                shift = at - target.data_ptr()
                for address, length in page_spans(target, span):
                    self._spans.append(_Span(address + shift, address, length))
                at += target.numel() * target.element_size()
            self._by_target.append(range(first, len(self._spans)))
        self._cursor = [r.start for r in self._by_target]
        self._claimed = [False] * len(self._spans)
        self._reached = 0
        self._lead = lead
        self._cv = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None
        if helper and self._spans:
            self._thread = threading.Thread(target=self._run, name="rtj-prefault", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        for index, span in enumerate(self._spans):
            with self._cv:
                self._cv.wait_for(
                    lambda b=span.begin: self._stopped or b < self._reached + self._lead
                )
                if self._stopped:
                    return
                if self._claimed[index]:
                    continue
                self._claimed[index] = True
            populate_pages(span.address, span.length)

    def before_block(self, target: int, begin: int, end: int) -> None:
        """The reader is about to fill bytes ``[begin, end)`` of ``target`` (blocks of one target
        come in order): map the spans under them that the helper has not claimed."""
        mine: list[_Span] = []
        begin, end = self._starts[target] + begin, self._starts[target] + end  # along the read
        with self._cv:
            self._reached = begin
            spans = self._by_target[target]
            k = self._cursor[target]
            while k < spans.stop and self._spans[k].begin + self._spans[k].length <= begin:
                k += 1
            self._cursor[target] = k
            while k < spans.stop and self._spans[k].begin < end:
                if not self._claimed[k]:
                    self._claimed[k] = True
                    mine.append(self._spans[k])
                k += 1
            self._cv.notify()
        for span in mine:
            populate_pages(span.address, span.length)

    def close(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()


@dataclass
class _Task:
    """One stored chunk to read, and where its bytes go."""

    rel: str
    item: ReadItem
    info: RawChunk
    target: torch.Tensor | None
    """The whole chunk's destination, the region of the destination this item fills (part of
    a chunk: resharding), or ``None`` for a pickled object."""
    whole: bool
    """The target is the whole chunk, contiguous, of the stored dtype: read straight into it
    (through a ``DeviceRing`` when it lives on a GPU)."""

    @property
    def on_host(self) -> bool:
        return self.target is not None and self.target.device.type == "cpu"

    @property
    def on_ring(self) -> bool:
        """A whole chunk bound for a GPU: read through that device's ``DeviceRing``."""
        return self.whole and self.target is not None and not self.on_host


class VerifyingReader(FileSystemReader):
    """DCP storage reader for ``HashingWriter`` folders: checks every chunk's digest as read.

    With ``expected_metadata`` (size, digest) from the manifest, the ``.metadata`` file itself is
    verified before anything in it is trusted.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        expected_metadata: FileEntry | None = None,
        trusted: bool = False,
        metadata: Metadata | None = None,
        prefault: bool | None = None,
    ) -> None:
        """``metadata``: already read and verified by the caller (saves a second parse).
        ``prefault``: map targets' pages on a helper thread; ``None``: ``prefault_thread()``."""
        super().__init__(path)
        self.expected_metadata = expected_metadata
        self._metadata = metadata
        self.trusted = trusted
        self.prefault = prefault_thread() if prefault is None else prefault
        self.bytes_read = 0
        self.ring_copies = 0
        """Copies to a GPU through ``DeviceRing`` slots (0: nothing was read onto a GPU)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = self._metadata
        if metadata is None:
            path = Path(self.path) / METADATA_NAME
            blob = path.read_bytes()
            expected = self.expected_metadata
            if expected is not None and (
                len(blob) != expected.size or xxhash.xxh3_128_hexdigest(blob) != expected.xxh3_128
            ):
                raise ChunkDigestError(
                    f"{path} does not match its manifest entry (size or checksum)"
                )
            metadata = read_metadata_bytes(blob, trusted=self.trusted)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        tasks = sorted(
            (self._task(item, planner) for item in plan.items),
            key=lambda t: (t.rel, t.info.offset),
        )
        pages = _PageMapper(
            [t.target if t.whole and t.on_host else None for t in tasks],
            helper=self.prefault,
        )
        fds: dict[str, int] = {}
        rings: dict[torch.device, DeviceRing] = {}
        pickled: list[tuple[ReadItem, bytearray]] = []
        reads: RingReads | None = None
        try:
            for task in tasks:
                if task.rel not in fds:
                    fd = fds[task.rel] = os.open(Path(self.path) / task.rel, os.O_RDONLY)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)  # larger readahead
            reads = RingReads([self._ring_chunk(t, fds, rings) for t in tasks if t.on_ring])
            for index, task in enumerate(tasks):
                if task.on_ring:
                    self._read_through_ring(task, reads)
                    continue
                before_block = partial(pages.before_block, index)
                blob = self._read_task(fds[task.rel], task, before_block)
                if blob is not None:
                    pickled.append((task.item, blob))
        finally:
            if reads is not None:
                reads.close()  # no read is left writing into a slot
            pages.close()
            for ring in rings.values():
                ring.close()
                self.ring_copies += ring.copies
            for fd in fds.values():
                os.close(fd)
        for item, blob in pickled:  # every chunk verified: only now are objects unpickled
            planner.load_bytes(item, io.BytesIO(blob))
        for task in tasks:
            if task.target is not None:
                planner.commit_tensor(task.item, task.target)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _task(self, item: ReadItem, planner: LoadPlanner) -> _Task:
        info = self.storage_data[item.storage_index]
        rel = getattr(info, "relative_path", "?")
        if not isinstance(info, RawChunk):
            raise ChunkDigestError(f"{rel}: not written by this runtime's sharded writer")
        if item.type == LoadItemType.BYTE_IO:
            return _Task(rel, item, info, None, whole=True)
        if info.dtype is None or info.shape is None:
            raise ChunkDigestError(f"{rel}@{info.offset}: a tensor item names a pickled chunk")
        target = planner.resolve_tensor(item).detach()
        whole = (
            tuple(item.lengths) == tuple(info.shape)
            and not any(item.storage_offsets)
            and target.device.type in ("cpu", "cuda")
            and target.dtype == getattr(torch, info.dtype, None)
            and target.is_contiguous()
            and target.numel() > 0
        )
        return _Task(rel, item, info, target, whole=whole)

    @staticmethod
    def _ring_chunk(
        task: _Task, fds: dict[str, int], rings: dict[torch.device, DeviceRing]
    ) -> RingChunk:
        assert task.target is not None
        device = task.target.device
        ring = rings.get(device)
        if ring is None:
            ring = rings[device] = DeviceRing(device)
        return RingChunk(fds[task.rel], task.rel, task.info.offset, task.info.length, ring)

    def _read_through_ring(self, task: _Task, reads: RingReads) -> None:
        """Read a chunk bound for a GPU into its target through the ring; check its digest."""
        assert task.target is not None
        _check_size(task.rel, task.info, task.target.numel() * task.target.element_size())
        digest = xxhash.xxh3_128()
        chunk = reads.copy_next(task.target.detach().reshape(-1).view(torch.uint8), digest)
        self.bytes_read += chunk.length
        _check_digest(task.rel, task.info, digest)

    def _read_task(
        self, fd: int, task: _Task, before_block: Callable[[int, int], None]
    ) -> bytearray | None:
        """Read and verify one chunk that does not go through a ring into its target; a pickled
        object's bytes are returned."""
        info = task.info
        if task.target is None:  # a pickled object: verified before it is unpickled
            buf = bytearray(info.length)
            self._read_verified(fd, task.rel, info, len(buf), _into(memoryview(buf)))
            return buf
        # Whole chunks go straight into the load target: staging or a fresh tensor, never live
        # state, so a chunk that fails its digest has changed nothing the caller keeps.
        if task.whole:
            view = _writable_bytes(task.target)
            self._read_verified(fd, task.rel, info, len(view), _into(view, before_block))
            return None
        # Part of a chunk (resharding): verify the whole chunk before using any of it.
        stored = torch.empty(info.length, dtype=torch.uint8)
        populate_for_write(stored)
        self._read_verified(fd, task.rel, info, info.length, _into(_writable_bytes(stored)))
        assert info.dtype is not None and info.shape is not None
        chunk = stored.view(getattr(torch, info.dtype)).reshape(info.shape)
        part = narrow_tensor_by_index(chunk, task.item.storage_offsets, task.item.lengths)
        task.target.copy_(part)
        return None

    def _read_verified(
        self,
        fd: int,
        rel: str,
        info: RawChunk,
        size: int,
        into: Callable[[int, int], memoryview],
    ) -> None:
        """Read one chunk into a target of ``size`` bytes in blocks, each into
        ``into(begin, end)`` (the chunk's bytes ``[begin, end)``), hashed right after it lands,
        while it is still in the CPU cache; check the chunk's digest."""
        _check_size(rel, info, size)
        digest = xxhash.xxh3_128()
        done, end = 0, info.offset + info.length
        while done < info.length:
            view = into(done, min(done + READ_BLOCK, info.length))
            read_exactly(fd, rel, view, info.offset + done, end)
            digest.update(view)
            done += len(view)
        self.bytes_read += done
        _check_digest(rel, info, digest)


def _check_size(rel: str, info: RawChunk, size: int) -> None:
    if size != info.length:
        raise ChunkDigestError(
            f"{rel}@{info.offset}: target holds {size} bytes, chunk {info.length}"
        )


def _check_digest(rel: str, info: RawChunk, digest: Any) -> None:
    if digest.hexdigest() != info.xxh3_128:
        raise ChunkDigestError(
            f"{rel}: bytes {info.offset}..{info.offset + info.length} fail their checksum"
        )


def _into(
    view: memoryview, before_block: Callable[[int, int], None] | None = None
) -> Callable[[int, int], memoryview]:
    """Blocks of a host buffer; ``before_block(begin, end)`` is told of each first."""

    def block(begin: int, end: int) -> memoryview:
        if before_block is not None:
            before_block(begin, end)
        return view[begin:end]

    return block


def _writable_bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")
