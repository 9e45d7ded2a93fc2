"""Format 1, read-only legacy: one ``rank{r}.pt`` per rank, a full ``torch.save`` of its state.

Earlier releases wrote it (``Manifest.format_version == 1``); this runtime writes format 2
(``sharded/``) and reads format 1 here and nowhere else: ``formats.reader_for`` hands a format-1
manifest to ``PerRankReader``, which has the interface of format 2's reader
(``formats.CheckpointReader``), so the load paths and export never ask which format they hold.

Loading reads each rank file once, checked against the manifest, and deserializes from that
buffer (``verified_read``); every file of this rank verifies before the first one touches the
live state. A rank the saving run did not have loads another rank's file (``source_rank``):
data-parallel state is replicated, and only ``elastic`` or a weights-only load allow it.

Export does not read files through ``verified_read``: ``load_file`` (a mapped ``torch.load``)
serves only the export command, which copies the weights out at once (``read_rank0_model``,
after ``export.resolve_checkpoint`` verified the file in full). Model weights are replicated
across data-parallel ranks, so rank 0's file is the source, of the whole model
(``PerRankReader.read_model``) as of the folder formats' reads of a few tensors at a time
(``PerRankReader.export_source``: ``ReplicatedSource``, the mapped file's tensors).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import ManifestError, NoCheckpointError, WorldSizeMismatchError
from ..export_formats.weight_source import TensorEntry, WeightSource, cast_dtype
from ..run import rng
from ..run.context import RunContext
from ..save import rank_contents as state_mod
from ..save.manifest import MANIFEST_NAME, Manifest
from ..save.safe_unpickle import refusal
from .position import apply_saved
from .verified_read import VerifiedFile, read_verified


def load_file(path: Path, *, trusted: bool) -> dict[str, Any]:
    """Read a checkpoint file onto the CPU, mapped from the file (for export, which writes the
    weights out and exits). Untrusted files cannot run pickled code."""
    return torch.load(path, map_location="cpu", weights_only=not trusted, mmap=True)


def read_rank0_model(ckpt: Path, manifest: Manifest, *, trusted: bool) -> object:
    """The model ``state_dict`` in rank 0's file, mapped (None when the file holds none): what
    export writes out, whichever export format."""
    entries = manifest.files_for_rank(0)
    if not entries:
        raise ManifestError(f"{ckpt}/{MANIFEST_NAME} lists no file for rank 0")
    data = load_file(ckpt / entries[0].path, trusted=trusted)
    return data.get("state", {}).get("model") if isinstance(data, dict) else None


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


class PerRankReader:
    """Reads a format-1 checkpoint into one run's live state (``formats.CheckpointReader``)."""

    any_world_size = False
    """Loads only at the world size that saved it, unless ``elastic`` or weights only."""
    refusal = "does not verify"
    """How a load that cannot use the checkpoint says why: its files did not verify."""
    read_model = staticmethod(read_rank0_model)
    """Export's whole model: the ``state_dict`` in rank 0's file, mapped."""
    export_source = ReplicatedSource
    """Export's source of a few tensors at a time: rank 0's file, mapped."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    @staticmethod
    def weight_ranks(manifest: Manifest) -> list[int]:
        """The ranks whose files hold the model weights: rank 0's has them all."""
        return [0]

    def source_rank(self, manifest: Manifest, weights_only: bool) -> int:
        """Which saved rank's file this rank loads."""
        ctx = self.ctx
        if manifest.world_size == ctx.world_size:
            return ctx.rank
        if weights_only:
            return 0  # model weights are replicated across data-parallel ranks
        if ctx.settings.elastic:
            # Data-parallel state is replicated; the data position is global (sampler.py).
            return ctx.rank % manifest.world_size
        raise WorldSizeMismatchError(
            f"checkpoint {manifest.name} was saved by {manifest.world_size} rank(s) but "
            f"{ctx.world_size} are loading it; pass elastic=True (data-parallel training with "
            f"ResumableSampler), load it with weights_only=True, or resume with "
            f"WORLD_SIZE={manifest.world_size}"
        )

    def verify(
        self,
        folder: Path,
        manifest: Manifest,
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
    ) -> list[VerifiedFile] | str:
        """This rank's files, each read once and checked against the manifest; a reason instead
        when one does not verify (then nothing is deserialized). Nothing is loaded yet."""
        rank = self.source_rank(manifest, weights_only)
        files: list[VerifiedFile] = []
        for entry in manifest.files_for_rank(rank):
            got = read_verified(folder, entry)
            if isinstance(got, str):
                return got
            refused = [] if self.ctx.settings.trusted_pickle else got.refused_globals()
            if refused:
                return f"{entry.path} {refusal(refused)}"
            files.append(got)
        return files

    def verify_everywhere(
        self,
        folder: Path,
        manifest: Manifest,
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
    ) -> list[VerifiedFile] | str:
        """``verify`` on every rank, the answer the same everywhere (collective): the verifying
        read is also the loading read (its buffers are kept for ``load``)."""
        got = self.verify(
            folder, manifest, weights_only=weights_only, strict=strict, ignore_keys=ignore_keys
        )
        reasons = self.ctx.coord.all_gather(got if isinstance(got, str) else None)
        bad = [why for why in reasons if why]
        return "; ".join(bad) if bad else got

    def load(
        self,
        folder: Path,
        manifest: Manifest,
        verified: list[VerifiedFile],
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
    ) -> None:
        """Restore this rank's verified files (``verify``) into the live state."""
        # A rank the saving run did not have loads another rank's file (``source_rank``): its
        # generators get a stream of their own, as in a sharded load, not a copy of that rank's.
        new_rank = self.ctx.rank >= manifest.world_size
        for file in verified:
            data = file.load(trusted=self.ctx.settings.trusted_pickle)
            if new_rank and isinstance(data.get("rng"), dict):
                data["rng"] = rng.derived(data["rng"], self.ctx.rank)
            self.restore(
                data,
                weights_only=weights_only,
                strict=strict,
                ignore_keys=ignore_keys,
                saved_weights_only=manifest.weights_only,
                saved_world_size=manifest.world_size,
            )
            # Module weights now live in the parameters; their pages in the buffer are unused.
            file.release_unused()

    def restore(
        self,
        data: dict[str, Any],
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
        saved_weights_only: bool = False,
        saved_world_size: int | None = None,
    ) -> None:
        """Restore one rank file's contents (``saved_weights_only``: the file was saved with
        ``weights_only=True``; ``saved_world_size``: its manifest's, None for a single file)."""
        saved = state_mod.restore(
            self.ctx.components,
            data,
            weights_only=weights_only,
            strict=strict,
            ignore_keys=ignore_keys,
        )
        apply_saved(
            self.ctx,
            saved,
            weights_only=weights_only,
            saved_weights_only=saved_weights_only,
            saved_world_size=saved_world_size,
        )
