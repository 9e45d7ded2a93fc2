"""Exceptions a user of the runtime can catch, one per thing that can go wrong.

They all derive from ``CheckpointError`` so a training script can handle the family at once,
and each message names the argument or file at fault and what was expected instead.
"""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """Base class of every error the runtime raises on purpose."""


class ConfigError(CheckpointError, ValueError):
    """A constructor argument is malformed (raised before any training happens), a call's
    argument is (``batch_end(num_samples=-1)``), or a value handed to a save (``extras``,
    ``metrics``) could not be loaded back (raised before anything is written)."""


class ManifestError(CheckpointError):
    """A manifest is missing, unreadable, or does not describe the files beside it."""


class IncompatibleCheckpointError(CheckpointError):
    """The checkpoint's model state does not fit the model being trained."""


class WorldSizeMismatchError(CheckpointError):
    """The checkpoint was written by a different number of ranks than are resuming it."""


class OverwriteError(CheckpointError):
    """Saving would mix this run's checkpoints with another run's, or with newer ones."""


class SaveFailedError(CheckpointError):
    """A save did not commit. Nothing was committed and earlier checkpoints are intact."""


class StaleMembershipError(SaveFailedError):
    """A newer gang has claimed the run (its membership epoch is above this process's): this
    gang's saves are refused so that it never commits behind the new gang (``save/fence.py``)."""


class NoCheckpointError(CheckpointError):
    """A load path was given but holds no checkpoint that verifies."""


class CorruptCheckpointError(NoCheckpointError):
    """A committed checkpoint's bytes do not match their recorded digests (torn, truncated or
    bit-rotted). Nothing was loaded into the live state: resume from an older checkpoint."""
