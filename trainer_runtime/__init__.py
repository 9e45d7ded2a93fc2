"""trainer_runtime: checkpoints that survive preemption, inside the training process.

The public surface is re-exported here; everything else is an implementation detail.
"""

from .errors import (
    CheckpointError,
    ConfigError,
    IncompatibleCheckpointError,
    ManifestError,
    NoCheckpointError,
    OverwriteError,
    SaveFailedError,
    WorldSizeMismatchError,
)
from .manager import CheckpointManager, ResumeResult, SavedCheckpoint
from .manifest import Manifest
from .timestamp import Event, SaveInterval, Timestamp

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "ConfigError",
    "Event",
    "IncompatibleCheckpointError",
    "Manifest",
    "ManifestError",
    "NoCheckpointError",
    "OverwriteError",
    "ResumeResult",
    "SaveFailedError",
    "SaveInterval",
    "SavedCheckpoint",
    "Timestamp",
    "WorldSizeMismatchError",
]
