"""Loading: put a verified checkpoint's state into the live model, optimizer and position.

Every load path (resume's chosen checkpoint, ``load()`` of a checkpoint folder, a run folder,
a single file or an ``s3://`` location) ends here, so a checkpoint is verified before the first
tensor of it touches the live state, whichever way it was named. Each format's reader
(``formats.reader_for``) verifies and loads: format version 2 is verified while DCP reads it
(every chunk against its digest; a failure leaves the live state as it was, ``sharded_format``);
version 1 reads each rank file once, checked against the manifest, and deserializes from that
buffer (``per_rank_format``). After the tensors, ``resume/position.py`` applies the runtime's
own part: position, metrics, extras and the data overrides. Choosing *which* checkpoint is
``resume/flow.py``'s job. (Rejected: loading inside the resume code, which left ``load()``
with its own, weaker copy of the verification.)
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import IncompatibleCheckpointError, NoCheckpointError
from ..run.context import RunContext
from ..run_folder.fallback import first_valid
from ..run_folder.layout import RunFolder
from ..save.manifest import MANIFEST_NAME, Manifest
from .formats import CheckpointReader, reader_for
from .from_file import ACCEPTED, read_single_file
from .per_rank_format import PerRankReader

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
        with naming_the_checkpoint(shown):  # a rank file's layout: format 1's restore
            PerRankReader(self.ctx).restore(
                found.data,
                weights_only=weights_only or found.weights_only,
                strict=strict,
                ignore_keys=self._ignored_keys(ignore_keys),
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
        reader = self._reader(manifest)
        opts = self._options(weights_only, strict, ignore_keys)
        with naming_the_checkpoint(folder):
            got = reader.verify(folder, manifest, **opts)
            if isinstance(got, str):
                return got
            reader.load(folder, manifest, got, **opts)
        return None

    def verify_everywhere(
        self,
        folder: Path,
        manifest: Manifest,
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
    ) -> Any:
        """Resume's check of a candidate, the same answer on every rank (collective): the
        reason it cannot be used, else what ``load_checkpoint_dir(verified=...)`` takes (for
        format 2, the checkpoint is loaded already: verifying it was loading it)."""
        reader = self._reader(manifest)
        with naming_the_checkpoint(folder):
            return reader.verify_everywhere(
                folder, manifest, **self._options(weights_only, strict, ignore_keys)
            )

    def _reader(self, manifest: Manifest) -> CheckpointReader:
        return reader_for(manifest)(self.ctx)

    def _options(
        self, weights_only: bool, strict: bool, ignore_keys: Sequence[str]
    ) -> dict[str, Any]:
        """A reader's load options, ``ignore_keys`` with what this run leaves out on its own."""
        keys = self._ignored_keys(ignore_keys)
        return {"weights_only": weights_only, "strict": strict, "ignore_keys": keys}

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

    def load_checkpoint_dir(
        self,
        folder: Path,
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
        verified: Any = None,
    ) -> None:
        """``verified``: what resume's verifying read of this checkpoint left
        (``verify_everywhere``: this rank's files, read and verified, or for format 2 the load
        itself); otherwise it is verified here. Every file verifies before the first one
        touches the live state."""
        manifest = Manifest.read(folder)
        reader = self._reader(manifest)
        opts = self._options(weights_only, strict, ignore_keys)
        with naming_the_checkpoint(folder):
            got = reader.verify(folder, manifest, **opts) if verified is None else verified
            if isinstance(got, str):
                raise NoCheckpointError(
                    f"checkpoint {folder} {reader.refusal}: {got}; {_OLDER_ONE.format(folder)}"
                )
            reader.load(folder, manifest, got, **opts)

    def _ignored_keys(self, ignore_keys: Sequence[str]) -> list[str]:
        keys = list(ignore_keys)
        if self.ctx.settings.ignore_data_position and self.ctx.sampler is not None:
            keys.append("state/stateful/sampler")
        return keys


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
