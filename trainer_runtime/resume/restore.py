"""Loading: put a verified checkpoint's state into the live model, optimizer and position.

Every load path (resume's chosen checkpoint, ``load()`` of a checkpoint folder, a run folder,
a single file or an ``s3://`` location) ends here, so a checkpoint is verified before the first
tensor of it touches the live state, whichever way it was named. Format version 2 is verified
while DCP reads it (every chunk against its digest; a failure leaves the live state as it was);
version 1 reads each rank file once, checked against the manifest, and deserializes from that
buffer. After the tensors, ``resume/position.py`` applies the runtime's own part: position,
metrics, extras and the data overrides. Choosing *which* checkpoint is ``resume/flow.py``'s job.
(Rejected: loading inside the resume code, which left ``load()`` with its own, weaker copy of
the verification.)
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import (
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    NoCheckpointError,
    WorldSizeMismatchError,
)
from ..run import rng
from ..run.context import RunContext
from ..run_folder.fallback import first_valid
from ..run_folder.layout import RunFolder
from ..save import rank_contents as state_mod
from ..save.manifest import MANIFEST_NAME, Manifest
from ..save.safe_unpickle import refusal
from ..sharded.checkpointer import check_files_present
from .from_file import ACCEPTED, read_single_file
from .position import apply_saved
from .verified_read import VerifiedFile, read_verified

log = logging.getLogger("trainer_runtime")

_OLDER_ONE = "give its run folder {0.parent} instead to load the newest checkpoint that verifies"
"""What to do when a checkpoint folder given to ``load()`` or ``load_path`` does not load."""


@dataclass(frozen=True)
class LoadedFrom:
    """What a ``load_path`` load read: ``local``, the file or checkpoint folder on this machine;
    ``shown``, that checkpoint as the user names it (an ``s3://`` URI for a fetched one);
    ``passed_over``, ``"<name>: <reason>"`` per newer checkpoint of a run folder skipped."""

    local: Path
    shown: str
    passed_over: list[str] = field(default_factory=list)


class Loader:
    """Verified loads into one run's live state (collective for format version 2)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def load(
        self,
        path: str | os.PathLike[str],
        *,
        weights_only: bool = False,
        strict: bool = True,
        ignore_keys: Sequence[str] = (),
        arg: str = "load path",
    ) -> LoadedFrom:
        """Load a file, a checkpoint folder or a run folder's newest checkpoint that verifies
        (local or ``s3://``); ``arg``: how errors name ``path`` (the argument the user set)."""
        opts = {"weights_only": weights_only, "strict": strict, "ignore_keys": ignore_keys}
        shown = str(path)
        passed: list[str] = []
        if "://" in shown:
            path = self._fetch_remote_load_path(shown, arg=arg, passed=passed)
        p = Path(path)
        if p.is_file():
            self._load_file(p, shown=shown, arg=arg, **opts)
            return LoadedFrom(p, shown, passed)
        if (p / MANIFEST_NAME).exists():
            self.load_checkpoint_dir(p, **opts)
            name = Manifest.read(p).name
            if "://" in shown and shown.rstrip("/").rsplit("/", 1)[-1] != name:
                shown = f"{shown.rstrip('/')}/{name}"  # a run folder's checkpoint
            return LoadedFrom(p, shown, passed)
        if p.is_dir():
            folder = RunFolder(p)
            walk = first_valid(
                folder.committed(),
                lambda m: self.try_load(folder.path(m.name), m, **opts),
                on_reject=lambda m, why: log.warning("load path: skipping %s: %s", m.name, why),
            )
            if walk.chosen is not None:
                chosen = folder.path(walk.chosen.name)
                return LoadedFrom(chosen, str(chosen), walk.reasons(lambda m: m.name))
        raise NoCheckpointError(f"{arg} {shown!r} holds no checkpoint that verifies")

    def _load_file(
        self,
        path: Path,
        *,
        shown: str,
        arg: str,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
    ) -> None:
        """A single file: a format-1 rank file, or a plain model state_dict (weights only)."""
        found = read_single_file(
            path, shown=shown, arg=arg, trusted=self.ctx.settings.trusted_pickle
        )
        if found.weights_only:
            self._check_any_model_key(found.data["state"]["model"], shown=shown, arg=arg)
        with naming_the_checkpoint(shown):
            self.restore_v1(
                found.data,
                weights_only=weights_only or found.weights_only,
                strict=strict,
                ignore_keys=ignore_keys,
            )
        found.buffer.release_unused()

    def _check_any_model_key(self, weights: Mapping[str, Any], *, shown: str, arg: str) -> None:
        """A state_dict that shares no key with the model would load nothing, even when keys
        need not all match (``strict=False``): that is never what was meant."""
        model = self.ctx.components.model_state()
        if model and not set(model) & set(weights):
            raise NoCheckpointError(
                f"{arg} {shown!r} is a state_dict with no key of the model (its keys: "
                f"{_some(weights)}; the model's: {_some(model)}); expected {ACCEPTED}"
            )

    def try_load(
        self,
        folder: Path,
        manifest: Manifest,
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
    ) -> str | None:
        """Load one checkpoint if it verifies; else the reason (the live state untouched)."""
        opts = {"weights_only": weights_only, "strict": strict, "ignore_keys": ignore_keys}
        if manifest.sharded:
            return self.try_load_sharded(folder, manifest, **opts)
        files = self.read_rank_files(folder, manifest, weights_only=weights_only)
        if isinstance(files, str):
            return files
        self.load_checkpoint_dir(folder, files=files, **opts)
        return None

    def _fetch_remote_load_path(self, uri: str, *, arg: str, passed: list[str]) -> Path:
        from ..objectstore.errors import NoValidCheckpointError  # noqa: PLC0415
        from ..objectstore.resolver import fetch_load_path  # noqa: PLC0415 - boto3 on use
        from ..objectstore.store import open_store  # noqa: PLC0415

        store, _ = open_store(uri, arg="load_path", write=False)
        local = self.ctx.run_dir.parent / ".load-path" / uri.removeprefix("s3://").replace("/", "_")
        try:
            # Every file: a version-2 checkpoint's state is spread over all its files.
            return fetch_load_path(
                store, uri, local, ranks=None, on_reject=lambda c, why: passed.append(f"{c}: {why}")
            )
        except NoValidCheckpointError as exc:
            raise NoCheckpointError(
                f"{arg} {uri!r} holds no checkpoint that verifies: {exc}"
            ) from exc

    def _source_rank(self, manifest: Manifest, weights_only: bool) -> int:
        """Which saved rank's file this rank loads (format version 1)."""
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

    def read_rank_files(
        self, folder: Path, manifest: Manifest, *, weights_only: bool
    ) -> list[VerifiedFile] | str:
        """This rank's files of a version-1 checkpoint, each read once and checked against the
        manifest; a reason instead when one does not verify (then nothing is deserialized)."""
        rank = self._source_rank(manifest, weights_only)
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

    def load_checkpoint_dir(
        self,
        folder: Path,
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
        files: list[VerifiedFile] | None = None,
    ) -> None:
        """``files``: this rank's files the caller has already read and verified (resume
        does, while choosing the checkpoint); otherwise they are read and verified here. Every
        file verifies before the first one touches the live state."""
        manifest = Manifest.read(folder)
        opts = {"strict": strict, "ignore_keys": ignore_keys}
        if manifest.sharded:
            reason = self.try_load_sharded(folder, manifest, weights_only=weights_only, **opts)
            if reason is not None:
                raise NoCheckpointError(
                    f"checkpoint {folder} does not load: {reason}; {_OLDER_ONE.format(folder)}"
                )
            return
        if files is None:
            got = self.read_rank_files(folder, manifest, weights_only=weights_only)
            if isinstance(got, str):
                raise NoCheckpointError(
                    f"checkpoint {folder} does not verify: {got}; {_OLDER_ONE.format(folder)}"
                )
            files = got
        # A rank the saving run did not have loads another rank's file (``_source_rank``): its
        # generators get a stream of their own, as in a sharded load, not a copy of that rank's.
        new_rank = self.ctx.rank >= manifest.world_size
        for verified in files:
            data = verified.load(trusted=self.ctx.settings.trusted_pickle)
            if new_rank and isinstance(data.get("rng"), dict):
                data["rng"] = rng.derived(data["rng"], self.ctx.rank)
            with naming_the_checkpoint(folder):
                self.restore_v1(
                    data,
                    weights_only=weights_only,
                    saved_weights_only=manifest.weights_only,
                    saved_world_size=manifest.world_size,
                    **opts,
                )
            # Module weights now live in the parameters; their pages in the buffer are unused.
            verified.release_unused()

    def try_load_sharded(
        self,
        folder: Path,
        manifest: Manifest,
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
    ) -> str | None:
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
        keys = self._ignored_keys(ignore_keys)
        try:
            with naming_the_checkpoint(folder):
                saved, report = ctx.engine.load(
                    folder, manifest, weights_only=weights_only, strict=strict, ignore_keys=keys
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
        return None

    def _ignored_keys(self, ignore_keys: Sequence[str]) -> list[str]:
        keys = list(ignore_keys)
        if self.ctx.settings.ignore_data_position and self.ctx.sampler is not None:
            keys.append("state/stateful/sampler")
        return keys

    def restore_v1(
        self,
        data: dict[str, Any],
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
        saved_weights_only: bool = False,
        saved_world_size: int | None = None,
    ) -> None:
        """Restore one version-1 rank file's contents (``saved_weights_only``: the file was
        saved with ``weights_only=True``; ``saved_world_size``: its manifest's, None for a
        single file)."""
        saved = state_mod.restore(
            self.ctx.components,
            data,
            weights_only=weights_only,
            strict=strict,
            ignore_keys=self._ignored_keys(ignore_keys),
        )
        apply_saved(
            self.ctx,
            saved,
            weights_only=weights_only,
            saved_weights_only=saved_weights_only,
            saved_world_size=saved_world_size,
        )


def _some(keys: Mapping[str, Any], shown: int = 4) -> str:
    names = list(keys)
    return ", ".join(names[:shown]) + (
        f" and {len(names) - shown} more" if len(names) > shown else ""
    )


@contextlib.contextmanager
def naming_the_checkpoint(folder: Path | str) -> Iterator[None]:
    """An ``IncompatibleCheckpointError`` names the checkpoint it came from: the fitting checks
    name only the keys, and a run folder or an ``s3://`` load path can hold several."""
    try:
        yield
    except IncompatibleCheckpointError as exc:
        if str(folder) in str(exc):
            raise
        raise IncompatibleCheckpointError(f"{folder}: {exc}") from exc
