"""The sharded storage layer's I/O helpers: write-behind on save, prefaulting on load.

Both only change when work happens, never what is written or read: these tests pin that down
(the same bytes and digests either way, an exact load either way) and the one ordering rule the
prefault thread must keep (it never writes into a target after the reader was told to go on).
Their speed is measured in benchmarks/, not here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

from trainer_runtime.sharded.storage import (
    HashingWriter,
    Prefaulter,
    VerifyingReader,
    start_writeback,
)

PAGE = os.sysconf("SC_PAGE_SIZE")


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


@pytest.mark.parametrize("prefault", [True, False])
def test_a_load_is_exact_with_and_without_prefaulting(tmp_path, prefault):
    save(tmp_path, write_behind=True)
    target = {k: torch.empty_like(v) for k, v in state().items()}
    reader = VerifyingReader(tmp_path, prefault=prefault)
    dcp.load(target, storage_reader=reader, no_dist=True)
    for key, value in state().items():
        assert torch.equal(target[key], value), key
    assert reader.bytes_read >= sum(v.numel() * v.element_size() for v in state().values())


def _item(name: str) -> ReadItem:
    index = MetadataIndex(name, (0,), 0)
    return ReadItem(LoadItemType.TENSOR, index, (0,), index, (0,), (1,))


def test_the_prefaulter_touches_every_page_and_is_done_before_the_reader_goes_on():
    targets = {f"t{i}": torch.full((5 * PAGE + 3,), 7, dtype=torch.uint8) for i in range(4)}
    items = {name: _item(name) for name in targets}
    prefault = Prefaulter()
    try:
        for name, t in targets.items():
            prefault.submit(items[name], t)
        for name, t in targets.items():
            prefault.wait(items[name])
            touched = [*t[::PAGE].tolist(), int(t[-1])]
            assert touched == [0] * len(touched), name  # one write per page, and the tail
            t.fill_(9)  # the reader's data: nothing may overwrite it now
    finally:
        prefault.close()
    for name, t in targets.items():
        assert bool((t == 9).all()), f"{name} was written after its wait() returned"
