"""Format 2's reader: what ``formats.reader_for`` hands a DCP-based (sharded) checkpoint to.

The work is the sharded engine's (``sharded/load.py``): a version-2 checkpoint is verified while
DCP reads it (every chunk against its digest; a failure leaves the live state as it was), so
verifying a candidate *is* loading it, on every rank together. ``ShardedReader`` adapts that to
the interface the load paths use for either format (``formats.CheckpointReader``).

Export reads format 2 here too, in one process without a process group, only the ``model``
entries (never the optimizer state or the pickled per-rank state), every chunk checked against
its digest as ``VerifyingReader`` reads it: ``read_sharded_weights``, the whole model as full,
unsharded tensors in the manner of DCP's ``dcp_to_torch_save`` (``--format pt``, since
``torch.save`` writes one object), and ``ShardedSource``, a few tensors per DCP read (the folder
formats, for a model larger than one process's memory). ``ShardedReader.read_model`` and
``export_source`` hand them to export, which does not ask which format it holds.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CorruptCheckpointError, ManifestError, NoCheckpointError
from ..export_formats.weight_source import TensorEntry, WeightSource, cast_dtype
from ..run.context import RunContext
from ..run_folder.names import METADATA_NAME
from ..save.manifest import MANIFEST_NAME, FileEntry, Manifest
from ..sharded.checkpointer import check_files_present
from .position import apply_saved

if TYPE_CHECKING:
    import torch

log = logging.getLogger("trainer_runtime")


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


def read_sharded_weights(ckpt: Path, manifest: Manifest, *, trusted: bool = False) -> object:
    """The full (unsharded) model ``state_dict`` of a version-2 checkpoint, one process.

    Every chunk read is checked against its digest; a damaged one raises
    ``CorruptCheckpointError``.
    """
    from torch.distributed.checkpoint.default_planner import (  # noqa: PLC0415
        _EmptyStateDictLoadPlanner,
    )

    from ..sharded.keys import MODEL_KEY  # noqa: PLC0415
    from ..sharded.reading import VerifyingReader  # noqa: PLC0415

    meta = metadata_entry(ckpt, manifest)
    state: dict = {}
    dcp_read(
        ckpt,
        state,
        VerifyingReader(ckpt, expected_metadata=meta, trusted=trusted),
        _EmptyStateDictLoadPlanner(keys={MODEL_KEY}),
    )
    return state.get(MODEL_KEY)


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
        import torch  # noqa: PLC0415
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


class Loaded:
    """What ``ShardedReader.verify`` returns when the checkpoint verified: it is loaded."""


LOADED = Loaded()


class ShardedReader:
    """Reads a format-2 checkpoint into one run's live state (``formats.CheckpointReader``)."""

    any_world_size = True
    """DCP re-shards on load: any number of ranks loads it."""
    refusal = "does not load"
    """How a load that cannot use the checkpoint says why: verifying it was loading it."""
    read_model = staticmethod(read_sharded_weights)
    """Export's whole model: full tensors from every rank's files."""
    export_source = ShardedSource
    """Export's source of a few tensors at a time: one DCP read each."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    @staticmethod
    def weight_ranks(manifest: Manifest) -> list[int]:
        """The ranks whose files hold the model weights: every rank's holds part of them."""
        return list(range(manifest.world_size))

    def verify(
        self,
        folder: Path,
        manifest: Manifest,
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
    ) -> Loaded | str:
        """Load a version-2 checkpoint on every rank (collective); the reason when it cannot
        be used, the same on every rank (then the live state is untouched).

        Every rank first checks that every file is present with its recorded size (no read:
        content is verified chunk by chunk during the load); a rank that lacks a file (node-
        local disks without an object store) names it in the reason.
        """
        ctx = self.ctx
        problems = ctx.coord.all_gather(check_files_present(folder, manifest))
        missing = [f"on rank {r}, {why}" for r, why in enumerate(problems) if why]
        if missing:
            return "; ".join(missing)
        try:
            saved, report = ctx.engine.load(
                folder,
                manifest,
                weights_only=weights_only,
                strict=strict,
                ignore_keys=ignore_keys,
            )
        except CorruptCheckpointError as exc:
            return str(exc)
        log.info(
            "loaded %s (saved by %d rank(s); rank state of saved rank %d, rng %s) in %.2fs%s",
            folder,
            report.saved_world_size,
            report.source_rank,
            report.rng,
            report.seconds,
            ", straight onto the GPU" if report.onto_gpu else "",
        )
        apply_saved(
            self.ctx,
            saved,
            weights_only=weights_only,
            saved_weights_only=manifest.weights_only,
            saved_world_size=manifest.world_size,
        )
        return LOADED

    def verify_everywhere(
        self,
        folder: Path,
        manifest: Manifest,
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
    ) -> Loaded | str:
        """``verify``: its answer is the same on every rank already."""
        return self.verify(
            folder, manifest, weights_only=weights_only, strict=strict, ignore_keys=ignore_keys
        )

    def load(
        self,
        folder: Path,
        manifest: Manifest,
        verified: Loaded,
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
    ) -> None:
        """Nothing left to do: ``verify`` loaded the checkpoint."""
