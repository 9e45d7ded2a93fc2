"""The sharded storage layer's I/O: write-behind on save, block-wise verified reads on load.

Write-behind only changes when the disk write starts, never what is written: these tests pin
that down (the same bytes and digests either way), and that a load read in blocks smaller than
its chunks is exact and checks every chunk. Their speed is measured in benchmarks/, not here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from trainer_runtime.sharded import storage
from trainer_runtime.sharded.storage import (
    ChunkDigestError,
    HashingWriter,
    VerifyingReader,
    start_writeback,
)


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


def test_a_load_read_in_blocks_smaller_than_its_chunks_is_exact(tmp_path):
    assert state()["big"].numel() * 4 > storage._READ_BLOCK  # the big chunk spans blocks
    save(tmp_path, write_behind=True)
    target = {k: torch.empty_like(v) for k, v in state().items()}
    reader = VerifyingReader(tmp_path)
    dcp.load(target, storage_reader=reader, no_dist=True)
    for key, value in state().items():
        assert torch.equal(target[key], value), key
    assert reader.bytes_read >= sum(v.numel() * v.element_size() for v in state().values())


def test_a_flipped_byte_in_a_later_block_of_a_chunk_fails_the_load(tmp_path):
    writer = save(tmp_path, write_behind=True)
    data = next(e for e in writer.written if e.path.endswith(".distcp"))
    path = tmp_path / data.path
    raw = bytearray(path.read_bytes())
    at = len(raw) - storage._READ_BLOCK // 2  # inside the last block the reader reads
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))
    target = {k: torch.empty_like(v) for k, v in state().items()}
    with pytest.raises(CheckpointException) as failure:
        dcp.load(target, storage_reader=VerifyingReader(tmp_path), no_dist=True)
    ((cause, _trace),) = failure.value.failures.values()
    assert isinstance(cause, ChunkDigestError) and "fail their checksum" in str(cause)
