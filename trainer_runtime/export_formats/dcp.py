"""Writing model weights as a plain DCP checkpoint, the one stock ``torch.distributed.checkpoint``
reads with ``FileSystemReader``.

The runtime's own version-2 checkpoints are DCP too, but in a storage layout of their own (raw
chunks with digests, ``sharded.storage``) beside the optimizer and per-rank state, so stock DCP
cannot read them. The export is the model's ``state_dict`` alone, keyed by the model's own
parameter names, in stock ``FileSystemWriter``'s layout: one ``__0_0.distcp`` data file holding
each tensor as a ``torch.save`` record, and the pickled ``.metadata``. Any world size loads it
(DCP reshards on load), with or without a process group.

Stock ``dcp.save`` plans the checkpoint here; the state dict it plans from holds meta tensors
(dtype and shape, no memory). ``StreamingWriter`` then writes each tensor as it comes from the
source, a read batch at a time. Plain ``dcp.save`` of the real tensors was rejected: it needs
every tensor in memory at once, and even with tensors resolved lazily, stock
``FileSystemWriter.write_data`` keeps a reference to each tensor it wrote until the file is
done, so the whole model ends up in memory anyway.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from .source import READ_BATCH_BYTES, BatchedReads, WeightSource

DATA_FILE_SUFFIX = ".distcp"


class StreamingWriter(FileSystemWriter):
    """``FileSystemWriter`` whose data come from ``reads``, one tensor at a time, in plan order,
    each dropped once written (the planner's state dict holds only meta tensors)."""

    def __init__(self, path: Path, source: WeightSource, *, read_batch: int) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=True, thread_count=1)
        self._source = source
        self._read_batch = read_batch

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        prefix = getattr(plan.storage_data, "prefix", "__0_")
        name = f"{prefix}0{DATA_FILE_SUFFIX}"
        items = list(plan.items)
        if any(i.type == WriteItemType.BYTE_IO for i in items):
            raise AssertionError("only tensors are exported to DCP")
        reads = BatchedReads(self._source, [i.index.fqn for i in items], budget=self._read_batch)
        results = []
        with open(Path(self.path) / name, "xb") as f:
            for item in items:
                t = reads.take(item.index.fqn)
                offset = f.tell()
                torch.save(t, f)
                del t
                length = f.tell() - offset
                results.append(
                    WriteResult(
                        index=item.index,
                        size_in_bytes=length,
                        storage_data=_StorageInfo(name, offset, length),
                    )
                )
            f.flush()
            os.fsync(f.fileno())
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut


def write_folder(
    source: WeightSource, folder: Path, *, read_batch: int = READ_BATCH_BYTES
) -> list[str]:
    """Write ``source``'s tensors as a DCP checkpoint into the (new, empty) ``folder``; returns
    the files written. The caller makes the folder itself appear."""
    from torch.distributed.checkpoint import save  # noqa: PLC0415
    from torch.distributed.checkpoint.api import CheckpointException  # noqa: PLC0415
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner  # noqa: PLC0415

    from ..run.dist import failure_cause  # noqa: PLC0415

    plan_from: dict[str, Any] = {
        e.name: torch.empty(e.shape, dtype=e.dtype, device="meta") for e in source.entries
    }
    try:
        with warnings.catch_warnings():
            # "torch.distributed is disabled, ...: assuming the intent is to save in a single
            # process": it is.
            warnings.filterwarnings("ignore", message=".*single process.*")
            save(
                plan_from,
                storage_writer=StreamingWriter(folder, source, read_batch=read_batch),
                planner=DefaultSavePlanner(),
                no_dist=True,
            )
    except CheckpointException as exc:  # a BaseException, wrapping what went wrong
        causes = [failure_cause(f) for f in exc.failures.values()]
        if causes and isinstance(causes[0], Exception):
            raise causes[0] from None  # the OSError of a full disk, a CorruptCheckpointError
        raise
    return sorted(p.name for p in folder.iterdir())
