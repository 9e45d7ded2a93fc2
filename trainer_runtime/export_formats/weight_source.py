"""What an export reads a checkpoint's model weights through, whichever format holds them.

``WeightSource`` lists a checkpoint's model tensors (``TensorEntry``: name, dtype, shape)
without reading them and reads a few at a time. Each checkpoint format's reader has its own
source (``formats.CheckpointReader.export_source``: ``sharded_format.ShardedSource`` for
version 2, ``per_rank_format.ReplicatedSource`` for version 1, both under ``resume/``); the
writers of the folder formats (``source.BatchedReads``, ``hf_safetensors``, ``dcp``) see only
this interface. It lives apart from ``source.py``, which asks ``formats.reader_for``, and
imports nothing of the package, so that the format modules can subclass it without an import
circle; torch only for the annotations (the format-2 reader keeps torch lazy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TensorEntry:
    """One model tensor as exported: name, dtype after any cast, shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    stored: torch.dtype
    """The dtype in the checkpoint (what a read returns)."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Bytes as exported (after the cast)."""
        return self.numel * self.dtype.itemsize

    @property
    def stored_nbytes(self) -> int:
        return self.numel * self.stored.itemsize


def cast_dtype(stored: torch.dtype, to: torch.dtype | None) -> torch.dtype:
    """What a tensor stored as ``stored`` is exported as: floating tensors take ``to``; integer,
    boolean and complex ones keep their dtype (a step counter in bf16 would lose counts)."""
    if to is None or not stored.is_floating_point:
        return stored
    return to


class WeightSource:
    """A checkpoint's model weights: ``entries`` in the checkpoint's order, ``read`` a subset."""

    def __init__(
        self, ckpt: Path, entries: list[TensorEntry], others: list[str], *, cast: torch.dtype | None
    ) -> None:
        self.checkpoint = ckpt
        self.entries = entries
        self.others = others
        """Model entries that are not tensors: ``--format pt`` keeps them, the others cannot."""
        self.cast = cast
        self.reads = 0
        """How many reads went to the checkpoint (each brings in a batch of tensors)."""

    def read(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        """The tensors ``names``, as stored (dtype and all); every byte verified as read."""
        self.reads += 1
        return self._read(names)

    def _read(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    @property
    def total_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries)
