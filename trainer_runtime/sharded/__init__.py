"""Sharded checkpoints (manifest format version 2) on torch.distributed.checkpoint.

``engine.ShardedEngine`` builds and writes the state, and loads it through ``load.ShardedLoader``;
``checkpointer.ShardedCheckpointer`` commits it, sync or async; ``storage`` is the DCP storage
layer with per-chunk digests and ``reading.VerifyingReader`` its reader; ``staging`` holds the
reused host buffers. See docs/sharded-checkpoints.md.
"""

from . import storage
from .checkpointer import ShardedCheckpointer, check_files_present
from .engine import ShardedEngine
from .load import LoadReport
from .reading import VerifyingReader
from .storage import HashingWriter

# ``storage.VerifyingReader``: where the reader lived before ``reading``. Set here, where both
# are imported, because ``reading`` imports ``storage`` (a lazy import back would be a circle).
storage.VerifyingReader = VerifyingReader  # type: ignore[attr-defined]

__all__ = [
    "HashingWriter",
    "LoadReport",
    "ShardedCheckpointer",
    "ShardedEngine",
    "VerifyingReader",
    "check_files_present",
]
