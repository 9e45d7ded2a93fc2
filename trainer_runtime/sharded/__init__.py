"""Sharded checkpoints (manifest format version 2) on torch.distributed.checkpoint.

``engine.ShardedEngine`` builds and loads the state; ``checkpointer.ShardedCheckpointer`` writes
and commits it, sync or async; ``storage`` is the DCP storage layer with per-chunk digests;
``staging`` holds the reused host buffers. See docs/sharded-checkpoints.md.
"""

from .checkpointer import ShardedCheckpointer, check_files_present
from .engine import LoadReport, ShardedEngine

__all__ = ["LoadReport", "ShardedCheckpointer", "ShardedEngine", "check_files_present"]
