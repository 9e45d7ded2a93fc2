"""A checkpoint's model weights, listed without reading them and read a few tensors at a time.

``rtj-checkpoints export --format safetensors|dcp`` writes files of a known layout tensor by
tensor, so it needs, first, every weight's name, dtype and shape (to plan the files and write
their headers) and then the tensors themselves in order, never the whole model at once.
``open_source`` asks the checkpoint's format reader (``resume/formats.reader_for``) for its
``WeightSource`` (``weight_source.py``), which gives both; the sources themselves live with
their format's reader:

- version 2 (sharded, DCP-based; ``resume/sharded_format.ShardedSource``): names, dtypes and
  shapes come from the verified ``.metadata`` file; a batch of tensors is read by DCP into a
  state dict holding only those keys (DCP reads the chunks those keys need, from every rank's
  file, and nothing else) through ``VerifyingReader``, so every chunk is checked against its
  digest as it is read;
- version 1 (replicated; ``resume/per_rank_format.ReplicatedSource``): rank 0's file holds every
  weight; it is mapped (``torch.load`` with ``mmap=True``), so a tensor's pages come from the
  file only when it is written out, and the kernel may drop them again (file-backed, not
  anonymous, memory).

``BatchedReads`` hands the tensors out in the order a writer needs, a batch of about
``READ_BATCH_BYTES`` at a time. Reading the whole ``model`` state dict at once
(``CheckpointReader.read_model``, what ``--format pt`` still does, since ``torch.save`` writes
one object) was rejected for the folder formats: it needs the whole model in one process's
memory, which is what a model trained on many GPUs does not fit into.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from ..errors import CorruptCheckpointError, NoCheckpointError
from ..resume.formats import reader_for
from ..resume.per_rank_format import ReplicatedSource  # noqa: F401 - importable from here too
from ..resume.sharded_format import (  # defined with format 2's reader, importable from here too
    ShardedSource,  # noqa: F401
    dcp_read,  # noqa: F401
    metadata_entry,  # noqa: F401
)
from ..save.manifest import Manifest
from .weight_source import (  # defined apart (weight_source.py), importable from here too
    TensorEntry,
    WeightSource,
    cast_dtype,  # noqa: F401
)

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp32": torch.float32,
}
"""``--dtype`` choices: what floating tensors are cast to on export."""

READ_BATCH_BYTES = 256 << 20
"""How many bytes of weights one read brings in (at least one tensor, however large): large
enough that DCP's per-read planning is noise beside the bytes, small beside any model worth
streaming."""


def export_tensor(t: torch.Tensor, entry: TensorEntry) -> torch.Tensor:
    """``t`` (as read) cast and laid out for writing: contiguous, on the CPU, with storage of
    its own (``torch.save`` writes a view's whole storage), of the entry's dtype and shape."""
    t = t.detach()
    if tuple(t.shape) != entry.shape or t.dtype != entry.stored:
        raise CorruptCheckpointError(
            f"model tensor {entry.name!r} read as {t.dtype} {tuple(t.shape)}, "
            f"the checkpoint lists {entry.stored} {entry.shape}"
        )
    t = t.to(device="cpu", dtype=entry.dtype).contiguous()
    if t.untyped_storage().nbytes() != t.nbytes:
        t = t.clone()
    return t


def open_source(
    ckpt: Path, manifest: Manifest, *, trusted: bool, cast: torch.dtype | None
) -> WeightSource:
    """The model weights of ``ckpt``, through its format's reader (``reader_for``)."""
    source = reader_for(manifest).export_source(ckpt, manifest, trusted=trusted, cast=cast)
    if not source.entries and not source.others:
        raise NoCheckpointError(f"checkpoint {ckpt} holds no model weights")
    return source


class BatchedReads:
    """Hands out a source's tensors one at a time, in a given order, reading them in batches of
    about ``budget`` bytes: the tensors of one batch are in memory together, no others.

    A name asked for out of order drops what is held and starts a new batch there (memory stays
    bounded; only the number of reads grows)."""

    def __init__(
        self, source: WeightSource, order: Iterable[str], *, budget: int = READ_BATCH_BYTES
    ) -> None:
        self.source = source
        by_name = {e.name: e for e in source.entries}
        self._order = [by_name[n] for n in order]
        self._at = {e.name: i for i, e in enumerate(self._order)}
        self._budget = budget
        self._held: dict[str, torch.Tensor] = {}

    def take(self, name: str) -> torch.Tensor:
        """Tensor ``name``, cast and laid out for writing (``export_tensor``)."""
        if name not in self._held:
            self._held = {}  # freed before the next batch is allocated
            batch: list[str] = []
            size = 0
            for e in self._order[self._at[name] :]:
                if batch and size + e.stored_nbytes > self._budget:
                    break
                batch.append(e.name)
                size += e.stored_nbytes
            self._held = self.source.read(batch)
        entry = self._order[self._at[name]]
        return export_tensor(self._held.pop(name), entry)
