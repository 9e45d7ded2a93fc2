"""The one place a checkpoint's format version picks the code that reads it.

Two formats are read. Format 2 (DCP-based, sharded; ``sharded_format.ShardedReader``) is the one
this runtime writes. Format 1 (one ``rank{r}.pt`` per rank; ``per_rank_format.PerRankReader``)
is read-only legacy, from earlier releases. Both readers have the small interface
``CheckpointReader``, and the load paths (``restore.Loader``, resume's choice of a checkpoint,
the store's world-size check) and export (the ranks it verifies, the whole model for
``--format pt``, the tensor source of the folder formats) ask ``reader_for`` instead of
branching on the format themselves: format 1's reading stays in one module, which goes when
format 1 does. (Rejected: a ``manifest.sharded`` branch at each place that reads, which spread
format 1 over restore, resume, the store's resume and export.)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..run.context import RunContext
from ..save.manifest import Manifest
from .per_rank_format import PerRankReader
from .sharded_format import ShardedReader

if TYPE_CHECKING:
    import torch

    from ..export_formats.weight_source import WeightSource


class CheckpointReader(Protocol):
    """Reads one checkpoint format into a run's live state.

    ``verify`` returns what ``load`` takes, or the reason the checkpoint cannot be used (the
    live state untouched then). Format 2 verifies while it loads, so its ``verify`` has loaded
    the checkpoint and its ``load`` does nothing; format 1 verifies this rank's files and keeps
    them read for ``load``."""

    any_world_size: ClassVar[bool]
    """Whether any number of ranks loads it, not only the number that saved it."""
    refusal: ClassVar[str]
    """How a load names a checkpoint whose ``verify`` failed: ``checkpoint X <refusal>: why``."""

    def __init__(self, ctx: RunContext) -> None: ...

    @staticmethod
    def weight_ranks(manifest: Manifest) -> list[int]:
        """The ranks whose files hold the model weights (what export verifies)."""
        ...

    @staticmethod
    def read_model(ckpt: Path, manifest: Manifest, *, trusted: bool) -> object:
        """The whole model ``state_dict``, in this one process (what ``--format pt`` exports);
        None, or no dict, when the checkpoint holds none."""
        ...

    @staticmethod
    def export_source(
        ckpt: Path, manifest: Manifest, *, trusted: bool, cast: torch.dtype | None
    ) -> WeightSource:
        """The model's tensors, listed without reading them and read a few at a time (what the
        folder formats export), floating ones cast to ``cast``."""
        ...

    def verify(
        self,
        folder: Path,
        manifest: Manifest,
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
    ) -> Any:
        """What ``load`` takes, or the reason (a ``str``), on this rank."""
        ...

    def verify_everywhere(
        self,
        folder: Path,
        manifest: Manifest,
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
    ) -> Any:
        """``verify``, with the same answer on every rank (collective)."""
        ...

    def load(
        self,
        folder: Path,
        manifest: Manifest,
        verified: Any,
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
    ) -> None:
        """Put what ``verify`` returned into the live state."""
        ...


def reader_for(manifest: Manifest) -> type[CheckpointReader]:
    """The reader of ``manifest``'s format (``Manifest.read`` accepts no other version)."""
    return ShardedReader if manifest.sharded else PerRankReader
