"""The sharded storage layer's I/O: write-behind on save, block-wise verified reads on load.

Write-behind only changes when the disk write starts, never what is written: these tests pin
that down (the same bytes and digests either way), and that a load read in blocks smaller than
its chunks is exact and checks every chunk. Their speed is measured in benchmarks/, not here.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from trainer_runtime.resume import pages
from trainer_runtime.sharded import reading, storage
from trainer_runtime.sharded.device_ring import DeviceRing, load_targets
from trainer_runtime.sharded.reading import VerifyingReader
from trainer_runtime.sharded.ring_reads import RingChunk, RingReads
from trainer_runtime.sharded.staging import HostStager
from trainer_runtime.sharded.storage import ChunkDigestError, HashingWriter, start_writeback

MiB = 1 << 20


def state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "big": torch.randn(3 << 20),  # 12 MiB: several pages, one chunk
        "odd": torch.randn(12345, dtype=torch.float64),
        "small": torch.arange(7, dtype=torch.int32),
    }


def save(folder: Path, *, write_behind: bool) -> HashingWriter:
    writer = HashingWriter(folder, write_behind=write_behind)
    dcp.save(state(), storage_writer=writer, no_dist=True)
    return writer


def flip_byte(folder: Path, writer: HashingWriter, *, from_end: int) -> None:
    """Flip one bit of the byte ``from_end`` bytes before the end of the first data file."""
    data = next(e for e in writer.written if e.path.endswith(".distcp"))
    path = folder / data.path
    raw = bytearray(path.read_bytes())
    raw[len(raw) - from_end] ^= 0x01
    path.write_bytes(bytes(raw))


def test_write_behind_writes_the_same_bytes_and_digests_as_a_plain_write(tmp_path):
    plain = save(tmp_path / "plain", write_behind=False)
    behind = save(tmp_path / "behind", write_behind=True)
    data = [e for e in plain.written if e.path.endswith(".distcp")]
    assert data and [(e.path, e.size, e.xxh3_128) for e in data] == [
        (e.path, e.size, e.xxh3_128) for e in behind.written if e.path.endswith(".distcp")
    ]
    for entry in data:
        assert (tmp_path / "plain" / entry.path).read_bytes() == (
            tmp_path / "behind" / entry.path
        ).read_bytes()


def test_start_writeback_ignores_what_it_cannot_do(tmp_path):
    """A failed hint must not fail a save: the fsync after it is what makes data durable."""
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"x" * 100)
    start_writeback(fd, 0, 100)
    os.close(fd)
    start_writeback(fd, 0, 100)  # a closed descriptor: EBADF, ignored
    assert (tmp_path / "f").read_bytes() == b"x" * 100


def load_exactly(folder: Path) -> VerifyingReader:
    """Load ``state()`` saved in ``folder`` and check it bitwise; returns the reader."""
    target = {k: torch.empty_like(v) for k, v in state().items()}
    reader = VerifyingReader(folder)
    dcp.load(target, storage_reader=reader, no_dist=True)
    for key, value in state().items():
        assert torch.equal(target[key], value), key
    return reader


def test_a_load_read_in_blocks_smaller_than_its_chunks_is_exact(tmp_path):
    assert state()["big"].numel() * 4 > reading.READ_BLOCK  # the big chunk spans blocks
    save(tmp_path, write_behind=True)
    reader = load_exactly(tmp_path)
    assert reader.bytes_read >= sum(v.numel() * v.element_size() for v in state().values())


def test_a_flipped_byte_in_a_later_block_of_a_chunk_fails_the_load(tmp_path):
    writer = save(tmp_path, write_behind=True)
    flip_byte(tmp_path, writer, from_end=reading.READ_BLOCK // 2)  # in the last block read
    target = {k: torch.empty_like(v) for k, v in state().items()}
    with pytest.raises(CheckpointException) as failure:
        dcp.load(target, storage_reader=VerifyingReader(tmp_path), no_dist=True)
    ((cause, _trace),) = failure.value.failures.values()
    assert isinstance(cause, ChunkDigestError) and "fail their checksum" in str(cause)


@pytest.mark.parametrize("prefault", [True, False])
def test_a_load_is_exact_with_and_without_the_page_mapping_thread(tmp_path, prefault):
    save(tmp_path, write_behind=True)
    target = {k: torch.empty_like(v) for k, v in state().items()}
    dcp.load(target, storage_reader=VerifyingReader(tmp_path, prefault=prefault), no_dist=True)
    for key, value in state().items():
        assert torch.equal(target[key], value), key


def record_mapping(monkeypatch, *, present=lambda t: False) -> list[tuple[int, int]]:
    """Record the spans mapped; by default every target counts as never touched (small tensors
    come from the heap, whose pages may be present already)."""
    mapped: list[tuple[int, int]] = []
    monkeypatch.setattr(reading, "populate_pages", lambda a, n: mapped.append((a, n)) or True)
    monkeypatch.setattr(reading, "all_present", present)
    return mapped


def test_a_target_whose_pages_are_present_already_is_not_mapped_again(monkeypatch):
    written = torch.ones(64 * MiB, dtype=torch.uint8)  # every page present
    fresh = torch.empty(64 * MiB, dtype=torch.uint8)  # above glibc's mmap threshold: untouched
    mapped = record_mapping(monkeypatch, present=pages.all_present)
    mapper = reading._PageMapper([written, fresh], helper=False, span=4 * MiB)
    for index in range(2):
        for begin in range(0, 64 * MiB, MiB):
            mapper.before_block(index, begin, begin + MiB)
    mapper.close()
    assert sorted(mapped) == pages.page_spans(fresh, 4 * MiB)


def test_every_page_is_mapped_once_whichever_thread_gets_there_first(monkeypatch):
    mapped = record_mapping(monkeypatch)
    targets = [torch.empty(1 << 16) for _ in range(64)]  # 256 KiB each
    mapper = reading._PageMapper([*targets, None], helper=True, lead=1 << 20, span=64 << 10)
    for index, target in enumerate(targets):  # the reader, racing the helper, 96 KiB blocks
        size = target.numel() * target.element_size()
        for begin in range(0, size, 96 << 10):
            mapper.before_block(index, begin, min(size, begin + (96 << 10)))
    mapper.close()
    expected = sorted(span for t in targets for span in pages.page_spans(t, 64 << 10))
    assert sorted(mapped) == expected  # every span once: none missed, none twice


def test_the_helper_maps_no_further_than_its_lead_ahead_of_the_reader(monkeypatch):
    mapped = record_mapping(monkeypatch)
    targets = [torch.empty(1 << 18, dtype=torch.uint8) for _ in range(16)]  # 256 KiB each
    spans = {
        span: (i, span[0] - t.data_ptr())
        for i, t in enumerate(targets)
        for span in pages.page_spans(t, 64 << 10)
    }
    lead = 1 << 20

    def ahead_of(reached: int) -> set[tuple[int, int]]:
        return {s for s, (i, off) in spans.items() if (i << 18) + off < reached + lead}

    mapper = reading._PageMapper(targets, helper=True, lead=lead, span=64 << 10)
    try:
        for reached_target in (0, 5, 9):  # the reader stands still at each of these
            mapper.before_block(reached_target, 0, 4096)
            allowed = ahead_of(reached_target << 18)
            deadline = time.monotonic() + 10
            while set(mapped) != allowed and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.05)  # long enough for a helper that ignores its lead to overrun it
            assert set(mapped) == allowed, f"reader at target {reached_target}"
    finally:
        mapper.close()
    assert len(mapped) == len(set(mapped))


def test_a_failed_load_stops_the_mapping_thread_and_unpickles_nothing(tmp_path):
    torch.manual_seed(0)
    saved = {"meta": {"step": 7}, "first": torch.randn(1 << 20), "last": torch.randn(1 << 20)}
    writer = HashingWriter(tmp_path)
    dcp.save(saved, storage_writer=writer, no_dist=True)
    flip_byte(tmp_path, writer, from_end=1)  # in the last chunk

    unpickled: list[str] = []

    class Recording(DefaultLoadPlanner):
        def load_bytes(self, read_item, value):
            unpickled.append(read_item.dest_index.fqn)
            super().load_bytes(read_item, value)

    target = {"meta": {"step": 0}, "first": torch.zeros(1 << 20), "last": torch.zeros(1 << 20)}
    with pytest.raises(CheckpointException):
        dcp.load(
            target,
            storage_reader=VerifyingReader(tmp_path, prefault=True),
            planner=Recording(),
            no_dist=True,
        )
    assert unpickled == [] and target["meta"] == {"step": 0}
    assert not [t for t in threading.enumerate() if t.name == "rtj-prefault"]


@pytest.mark.parametrize(
    ("cpus", "local_world_size", "expected"),
    [(16, None, True), (16, "8", True), (16, "16", False), (1, None, False), (4, "0", True)],
)
def test_the_mapping_thread_runs_only_with_a_spare_cpu_per_local_process(
    monkeypatch, cpus, local_world_size, expected
):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cpus)))
    if local_world_size is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world_size)
    assert reading.prefault_thread() is expected


def test_no_mapping_thread_where_the_kernel_cannot_map_pages_in_one_call(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(reading, "can_populate", lambda: False)
    assert reading.prefault_thread() is False


def test_a_malformed_local_world_size_is_named_in_a_warning_and_counts_one(monkeypatch, caplog):
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with caplog.at_level("WARNING", logger="trainer_runtime"):
        assert reading.prefault_thread() is True
    assert "LOCAL_WORLD_SIZE='two': expected a positive integer" in caplog.text


def test_the_reader_is_importable_from_the_package_and_from_its_old_module():
    from trainer_runtime import sharded

    assert sharded.VerifyingReader is VerifyingReader is storage.VerifyingReader
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = storage.Nothing


# -- loads onto a GPU, through pinned slots (device_ring); here with a CPU device ------------


def ring_file(tmp_path: Path, sizes: tuple[int, ...]) -> tuple[Path, list[torch.Tensor]]:
    """A file of random chunks of ``sizes`` bytes, one after another."""
    torch.manual_seed(1)
    sources = [torch.randint(0, 256, (n,), dtype=torch.uint8) for n in sizes]
    path = tmp_path / "chunks.bin"
    path.write_bytes(b"".join(s.numpy().tobytes() for s in sources))
    return path, sources


def ring_chunks(fd: int, ring: DeviceRing, sources: list[torch.Tensor]) -> list[RingChunk]:
    offsets = list(itertools.accumulate((s.numel() for s in sources), initial=0))[:-1]
    return [
        RingChunk(fd, "chunks.bin", at, s.numel(), ring)
        for at, s in zip(offsets, sources, strict=True)
    ]


def carry(reads: RingReads, targets: list[torch.Tensor]) -> None:
    for dst in targets:
        reads.copy_next(dst)


@pytest.mark.parametrize("lanes", [1, 2, 3])
def test_ring_reads_carry_chunks_larger_and_smaller_than_a_slot_exactly(
    tmp_path, monkeypatch, lanes
):
    path, sources = ring_file(tmp_path, (4321, 7, 1000, 999, 1))
    ring = DeviceRing(torch.device("cpu"), slots=3, slot_bytes=1000, lanes=lanes)
    targets = [torch.zeros_like(s) for s in sources]
    preadv, readers = os.preadv, []

    def recorded(fd, buffers, offset):
        readers.append((offset, threading.current_thread().name))
        return preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", recorded)
    fd = os.open(path, os.O_RDONLY)
    reads = RingReads(ring_chunks(fd, ring, sources))
    try:
        carry(reads, targets)
    finally:
        reads.close()
        ring.close()
        os.close(fd)
    for src, dst in zip(sources, targets, strict=True):
        assert torch.equal(src, dst)
    assert ring.copies == 5 + 4  # 4321 bytes took five 1000-byte slots, the others one each
    # The blocks, in file order, went to the lanes' threads in turn.
    assert [name for _, name in sorted(readers)] == [f"rtj-read-{b % lanes}" for b in range(9)]


def test_ring_lanes_must_be_between_one_and_the_slots(tmp_path):
    for lanes in (0, 3):
        with pytest.raises(
            ValueError, match=f"lanes must be between 1 and the ring's 2 slots, not {lanes}"
        ):
            DeviceRing(torch.device("cpu"), slots=2, slot_bytes=64, lanes=lanes)
    path, sources = ring_file(tmp_path, (64, 64))
    one, two = (DeviceRing(torch.device("cpu"), slots=2, slot_bytes=64, lanes=n) for n in (1, 2))
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = [ring_chunks(fd, ring, sources[:1])[0] for ring in (one, two)]
        with pytest.raises(ValueError, match=r"different lanes: \[1, 2\]"):
            RingReads(chunks)
    finally:
        os.close(fd)


@pytest.mark.parametrize("lanes", [1, 3])
def test_the_reading_thread_reads_ahead_into_every_free_slot_without_waiting_for_the_loader(
    tmp_path, monkeypatch, lanes
):
    """Reads follow one another as fast as the disk allows: the reading threads fill each free
    slot without the loading thread's asking, and wait only when none is free."""
    path, sources = ring_file(tmp_path, (10 * 64,))
    ring = DeviceRing(torch.device("cpu"), slots=3, slot_bytes=64, lanes=lanes)
    preadv, reads_done = os.preadv, []

    def recorded(fd, buffers, offset):
        reads_done.append(offset)
        return preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", recorded)
    fd = os.open(path, os.O_RDONLY)
    reads = RingReads(ring_chunks(fd, ring, sources))
    try:
        deadline = time.monotonic() + 10
        while len(reads_done) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert sorted(reads_done) == [0, 64, 128]  # every slot filled, none taken: they wait
        target = torch.zeros_like(sources[0])
        carry(reads, [target])
        assert torch.equal(target, sources[0]) and len(reads_done) == 10
    finally:
        reads.close()
        ring.close()
        os.close(fd)


@pytest.mark.parametrize("lanes", [1, 2])
def test_closing_ring_reads_stops_a_reader_that_waits_for_a_slot(tmp_path, lanes):
    path, sources = ring_file(tmp_path, (5 * 64, 64))
    ring = DeviceRing(torch.device("cpu"), slots=2, slot_bytes=64, lanes=lanes)
    fd = os.open(path, os.O_RDONLY)
    reads = RingReads(ring_chunks(fd, ring, sources))
    try:
        _chunk, blocks = reads.take()
        next(blocks)  # a slot taken and never given back: the reader waits for one
    finally:
        reads.close()
        os.close(fd)
    assert not [t for t in threading.enumerate() if t.name.startswith("rtj-read")]


def test_a_read_that_fails_on_any_lane_raises_when_its_block_is_due(tmp_path):
    path, sources = ring_file(tmp_path, (4 * 64,))
    ring = DeviceRing(torch.device("cpu"), slots=4, slot_bytes=64, lanes=2)
    fd = os.open(path, os.O_RDONLY)
    chunk = RingChunk(fd, "chunks.bin", 0, 5 * 64, ring)  # one block more than the file holds
    reads = RingReads([chunk])
    target = torch.zeros(5 * 64, dtype=torch.uint8)
    try:
        with pytest.raises(
            ChunkDigestError, match=r"chunks\.bin ends at byte 256; the chunk needs 320"
        ):
            reads.copy_next(target)
    finally:
        reads.close()
        ring.close()
        os.close(fd)
    assert torch.equal(target[: 4 * 64], sources[0])  # the blocks before it landed in order
    assert not [t for t in threading.enumerate() if t.name.startswith("rtj-read")]


def test_a_ring_refuses_a_block_larger_than_a_slot():
    ring = DeviceRing(torch.device("cpu"), slots=2, slot_bytes=64)
    slot = ring.acquire()
    assert slot is not None and len(ring.view(slot, 64)) == 64
    with pytest.raises(ValueError, match="exceeds"):
        ring.view(slot, 65)


@pytest.fixture
def through_the_ring(monkeypatch, request):
    """Targets count as off the host, so whole chunks take the GPU path (with a CPU ring)."""
    made: list[DeviceRing] = []

    class Recorded(DeviceRing):
        def __init__(self, device, **kw):
            lanes = getattr(request, "param", 1)
            super().__init__(device, slots=2, slot_bytes=2 * reading.READ_BLOCK, lanes=lanes)
            made.append(self)

    monkeypatch.setattr(reading._Task, "on_host", property(lambda self: False))
    monkeypatch.setattr(reading, "DeviceRing", Recorded)
    return made


@pytest.mark.parametrize("through_the_ring", [1, 2], indirect=True)
def test_a_load_through_the_ring_is_exact(tmp_path, through_the_ring):
    save(tmp_path, write_behind=True)
    reader = load_exactly(tmp_path)
    (ring,) = through_the_ring  # one ring per device, reused for every chunk
    assert ring.copies >= 6 + 2  # 12 MiB in 2 MiB slots, then the two small chunks
    assert reader.ring_copies == ring.copies


def test_a_flipped_byte_fails_a_load_through_the_ring(tmp_path, through_the_ring):
    writer = save(tmp_path, write_behind=True)
    flip_byte(tmp_path, writer, from_end=reading.READ_BLOCK // 2)
    target = {k: torch.empty_like(v) for k, v in state().items()}
    with pytest.raises(CheckpointException) as failure:
        dcp.load(target, storage_reader=VerifyingReader(tmp_path), no_dist=True)
    ((cause, _trace),) = failure.value.failures.values()
    assert isinstance(cause, ChunkDigestError) and "fail their checksum" in str(cause)


def test_reads_through_the_ring_run_on_a_reading_thread_a_slot_at_a_time(
    tmp_path, through_the_ring, monkeypatch
):
    save(tmp_path, write_behind=True)
    calls: list[tuple[str, int]] = []
    preadv = os.preadv

    def recorded(fd, buffers, offset):
        calls.append((threading.current_thread().name, sum(len(b) for b in buffers)))
        return preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", recorded)
    load_exactly(tmp_path)
    data = [(name, n) for name, n in calls if n > 4096]  # not .metadata's small reads
    assert data and all(name.startswith("rtj-read") for name, _ in data)
    slot = through_the_ring[0].slot_bytes
    assert max(n for _, n in data) == slot  # blocks as large as a slot, not READ_BLOCK
    assert not [t for t in threading.enumerate() if t.name.startswith("rtj-read")]


@pytest.mark.parametrize("through_the_ring", [1, 2], indirect=True)
def test_a_file_cut_short_fails_a_load_through_the_ring_and_leaves_no_reader(
    tmp_path, through_the_ring
):
    writer = save(tmp_path, write_behind=True)
    data = next(e for e in writer.written if e.path.endswith(".distcp"))
    os.truncate(tmp_path / data.path, data.size - 3 * reading.READ_BLOCK)
    target = {k: torch.empty_like(v) for k, v in state().items()}
    with pytest.raises(CheckpointException) as failure:
        dcp.load(target, storage_reader=VerifyingReader(tmp_path), no_dist=True)
    ((cause, _trace),) = failure.value.failures.values()
    assert isinstance(cause, ChunkDigestError) and "ends at byte" in str(cause)
    assert not [t for t in threading.enumerate() if t.name.startswith("rtj-read")]


def test_a_flipped_first_byte_fails_a_load_through_the_ring(tmp_path, through_the_ring):
    writer = save(tmp_path, write_behind=True)
    data = next(e for e in writer.written if e.path.endswith(".distcp"))
    flip_byte(tmp_path, writer, from_end=data.size)  # the file's first byte: the first block
    target = {k: torch.empty_like(v) for k, v in state().items()}
    with pytest.raises(CheckpointException) as failure:
        dcp.load(target, storage_reader=VerifyingReader(tmp_path), no_dist=True)
    ((cause, _trace),) = failure.value.failures.values()
    assert isinstance(cause, ChunkDigestError) and "fail their checksum" in str(cause)


def test_targets_that_do_not_fit_on_the_gpu_are_made_on_the_host(caplog):
    asked: list[bool] = []

    def make(gpu_on_gpu: bool):
        asked.append(gpu_on_gpu)
        if gpu_on_gpu:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {"model": "host"}, None

    with caplog.at_level("INFO", logger="trainer_runtime"):
        assert load_targets(make) == ({"model": "host"}, None)
    assert asked == [True, False]
    assert "do not fit on the GPU" in caplog.text and "2.00 GiB" in caplog.text
    assert load_targets(lambda gpu: ({"gpu": gpu}, None)) == ({"gpu": True}, None)


def test_a_save_point_without_cuda_records_nothing_and_staging_copies_as_before():
    stager = HostStager()
    live = {"w": torch.arange(10.0), "n": [torch.ones(3)]}
    stager.mark_save_point(live)
    staged = stager.stage(live)
    stager.synchronize()
    assert torch.equal(staged["w"], live["w"]) and staged["w"] is not live["w"]
    assert stager._save_points == {} and stager._streams == {}
