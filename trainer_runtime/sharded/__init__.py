"""Sharded checkpoints (manifest format version 2) on torch.distributed.checkpoint.

``engine.ShardedEngine`` builds and loads the state; ``checkpointer.ShardedCheckpointer`` writes
and commits it, sync or async; ``storage`` is the DCP storage layer with per-chunk digests and
``reading.VerifyingReader`` its reader; ``staging`` holds the reused host buffers. See
docs/sharded-checkpoints.md.
"""

from .checkpointer import ShardedCheckpointer, check_files_present
from .engine import LoadReport, ShardedEngine
from .reading import VerifyingReader
from .storage import HashingWriter

__all__ = [
    "HashingWriter",
    "LoadReport",
    "ShardedCheckpointer",
    "ShardedEngine",
    "VerifyingReader",
    "check_files_present",
]
