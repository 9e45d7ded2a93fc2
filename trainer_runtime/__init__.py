"""trainer_runtime: checkpoints that survive preemption, inside the training process.

The public surface is re-exported here; everything else is an implementation detail.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .errors import (
    CheckpointError,
    ConfigError,
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    ManifestError,
    NoCheckpointError,
    OverwriteError,
    SaveFailedError,
    StaleMembershipError,
    WorldSizeMismatchError,
)
from .resume.warm_start import start_from_environment as _start_prefetch
from .run import gang_sockets as _gang_sockets  # noqa: F401 - the sockets before the script's group

# In a pod of a new attempt, start fetching the checkpoint the operator named while the script
# goes on to import torch and form its process group (resume/warm_start.py); elsewhere a no-op.
_start_prefetch()

if TYPE_CHECKING:
    from .manager import CheckpointManager, ResumeResult, SavedCheckpoint
    from .objectstore.errors import ObjectStoreConfigError, ObjectStoreError
    from .prefetch import Prefetched
    from .sampler import DataPositionError, ResumableSampler
    from .save.manifest import Manifest
    from .switch import MembershipSwitched
    from .timestamp import Event, SaveInterval, Timestamp

# Names that need torch (or xxhash) load on first use, so tools that only need the object
# store or the manifest format (and ``trainer_runtime.objectstore``) import fast.
_LAZY = {
    "CheckpointManager": "manager",
    "ResumeResult": "manager",
    "SavedCheckpoint": "manager",
    "Manifest": "save.manifest",
    "Prefetched": "prefetch",
    "ObjectStoreConfigError": "objectstore.errors",
    "ObjectStoreError": "objectstore.errors",
    "MembershipSwitched": "switch",
    "ResumableSampler": "sampler",
    "DataPositionError": "sampler",
    "Event": "timestamp",
    "SaveInterval": "timestamp",
    "Timestamp": "timestamp",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'trainer_runtime' has no attribute {name!r}")
    return getattr(import_module(f".{module}", __name__), name)


__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "ConfigError",
    "CorruptCheckpointError",
    "DataPositionError",
    "Event",
    "IncompatibleCheckpointError",
    "Manifest",
    "ManifestError",
    "MembershipSwitched",
    "NoCheckpointError",
    "ObjectStoreConfigError",
    "ObjectStoreError",
    "OverwriteError",
    "Prefetched",
    "ResumableSampler",
    "ResumeResult",
    "SaveFailedError",
    "SaveInterval",
    "SavedCheckpoint",
    "StaleMembershipError",
    "Timestamp",
    "WorldSizeMismatchError",
]
