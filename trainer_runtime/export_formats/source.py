"""A checkpoint's model weights, listed without reading them and read a few tensors at a time.

``rtj-checkpoints export --format safetensors|dcp`` writes files of a known layout tensor by
tensor, so it needs, first, every weight's name, dtype and shape (to plan the files and write
their headers) and then the tensors themselves in order, never the whole model at once. This
module gives both for either checkpoint format:

- version 2 (sharded, DCP-based): names, dtypes and shapes come from the verified ``.metadata``
  file; a batch of tensors is read by DCP into a state dict holding only those keys (DCP reads
  the chunks those keys need, from every rank's file, and nothing else) through
  ``VerifyingReader``, so every chunk is checked against its digest as it is read;
- version 1 (replicated): rank 0's file holds every weight; it is mapped (``torch.load`` with
  ``mmap=True``), so a tensor's pages come from the file only when it is written out, and the
  kernel may drop them again (file-backed, not anonymous, memory).

Reading the whole ``model`` state dict at once (``export.read_sharded_weights``, what
``--format pt`` still does, since ``torch.save`` writes one object) was rejected for the folder
formats: it needs the whole model in one process's memory, which is what a model trained on
many GPUs does not fit into.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import CorruptCheckpointError, ManifestError, NoCheckpointError
from ..resume.per_rank_format import read_rank0_model
from ..run_folder.names import METADATA_NAME
from ..save.manifest import MANIFEST_NAME, FileEntry, Manifest
from ..sharded.checkpointer import check_files_present

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


def metadata_entry(ckpt: Path, manifest: Manifest) -> FileEntry:
    """The manifest's entry of a version-2 checkpoint's DCP ``.metadata``, once every file it
    lists is present with its recorded size; ``NoCheckpointError`` or ``ManifestError`` else."""
    problem = check_files_present(ckpt, manifest)
    if problem is not None:
        raise NoCheckpointError(f"checkpoint {ckpt} is incomplete: {problem}")
    meta = next((f for f in manifest.files if f.path == METADATA_NAME), None)
    if meta is None:
        raise ManifestError(f"{ckpt}/{MANIFEST_NAME} lists no {METADATA_NAME}")
    return meta


class ShardedSource(WeightSource):
    """A version-2 checkpoint: each read is one DCP load of only the keys asked for."""

    def __init__(
        self, ckpt: Path, manifest: Manifest, *, trusted: bool, cast: torch.dtype | None
    ) -> None:
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata  # noqa: PLC0415

        from ..sharded.keys import MODEL_KEY  # noqa: PLC0415
        from ..sharded.reading import VerifyingReader  # noqa: PLC0415

        try:
            self._metadata = VerifyingReader(
                ckpt, expected_metadata=metadata_entry(ckpt, manifest), trusted=trusted
            ).read_metadata()
        except Exception as exc:  # a digest that fails, or a pickle that will not load
            raise CorruptCheckpointError(
                f"checkpoint {ckpt}: {type(exc).__name__}: {' '.join(str(exc).split())}"
            ) from exc
        self._trusted = trusted
        self._key = MODEL_KEY
        entries: list[TensorEntry] = []
        others: list[str] = []
        planner_data = self._metadata.planner_data or {}
        for flat, md in self._metadata.state_dict_metadata.items():
            path = planner_data.get(flat)
            if path is None or len(path) < 2 or path[0] != MODEL_KEY:
                continue  # optimizer state, per-rank state, or not the model's
            name = ".".join(str(p) for p in path[1:])
            if len(path) > 2:  # a nested container inside the model's state dict
                others.append(name)
            elif isinstance(md, TensorStorageMetadata):
                stored = md.properties.dtype
                shape = tuple(int(d) for d in md.size)
                entries.append(TensorEntry(name, cast_dtype(stored, cast), shape, stored))
            else:
                others.append(name)
        super().__init__(ckpt, entries, others, cast=cast)
        self._by_name = {e.name: e for e in entries}

    def _read(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.default_planner import (  # noqa: PLC0415
            DefaultLoadPlanner,
        )

        from ..sharded.reading import VerifyingReader  # noqa: PLC0415

        targets = {}
        for name in names:
            e = self._by_name[name]
            targets[name] = torch.empty(e.shape, dtype=e.stored)
        state: dict[str, Any] = {self._key: targets}
        reader = VerifyingReader(self.checkpoint, metadata=self._metadata, trusted=self._trusted)
        dcp_read(self.checkpoint, state, reader, DefaultLoadPlanner())
        return state[self._key]


class ReplicatedSource(WeightSource):
    """A version-1 checkpoint: rank 0's file, mapped; a read hands out its tensors."""

    def __init__(
        self, ckpt: Path, manifest: Manifest, *, trusted: bool, cast: torch.dtype | None
    ) -> None:
        model = read_rank0_model(ckpt, manifest, trusted=trusted)
        if not isinstance(model, dict):
            raise NoCheckpointError(f"checkpoint {ckpt} holds no model weights")
        self._model = model
        tensors = [
            TensorEntry(str(k), cast_dtype(v.dtype, cast), tuple(v.shape), v.dtype)
            for k, v in model.items()
            if isinstance(v, torch.Tensor)
        ]
        others = [str(k) for k, v in model.items() if not isinstance(v, torch.Tensor)]
        super().__init__(ckpt, tensors, others, cast=cast)

    def _read(self, names: Sequence[str]) -> dict[str, torch.Tensor]:
        return {n: self._model[n] for n in names}


def open_source(
    ckpt: Path, manifest: Manifest, *, trusted: bool, cast: torch.dtype | None
) -> WeightSource:
    kind = ShardedSource if manifest.sharded else ReplicatedSource
    source = kind(ckpt, manifest, trusted=trusted, cast=cast)
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


def dcp_read(ckpt: Path, state: dict[str, Any], reader: Any, planner: Any) -> None:
    """DCP's load of ``state`` from ``reader`` in this process alone (no process group);
    any failure, DCP's own included, as one ``CorruptCheckpointError`` line."""
    from torch.distributed.checkpoint.api import CheckpointException  # noqa: PLC0415
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict  # noqa: PLC0415

    from ..run.dist import describe_failures  # noqa: PLC0415

    try:
        _load_state_dict(state, storage_reader=reader, planner=planner, no_dist=True)
    except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
        cause = (
            describe_failures(exc)  # one line, without DCP's traceback per rank
            if isinstance(exc, CheckpointException) and exc.failures
            else f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        )
        raise CorruptCheckpointError(f"checkpoint {ckpt}: {cause}") from exc
