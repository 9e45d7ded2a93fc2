"""Format 2's reader: what ``formats.reader_for`` hands a DCP-based (sharded) checkpoint to.

The work is the sharded engine's (``sharded/load.py``): a version-2 checkpoint is verified while
DCP reads it (every chunk against its digest; a failure leaves the live state as it was), so
verifying a candidate *is* loading it, on every rank together. ``ShardedReader`` adapts that to
the interface the load paths use for either format (``formats.CheckpointReader``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from ..errors import CorruptCheckpointError
from ..run.context import RunContext
from ..save.manifest import Manifest
from ..sharded.checkpointer import check_files_present
from .position import apply_saved

log = logging.getLogger("trainer_runtime")


class Loaded:
    """What ``ShardedReader.verify`` returns when the checkpoint verified: it is loaded."""


LOADED = Loaded()


class ShardedReader:
    """Reads a format-2 checkpoint into one run's live state (``formats.CheckpointReader``)."""

    any_world_size = True
    """DCP re-shards on load: any number of ranks loads it."""
    refusal = "does not load"
    """How a load that cannot use the checkpoint says why: verifying it was loading it."""

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
