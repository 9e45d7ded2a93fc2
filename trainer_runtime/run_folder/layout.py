"""One run's checkpoint folder, local or in an object store: one model for both (docs/runtime.md).

``<run>/<checkpoint>/... manifest.json``, ``<run>/latest.json`` and, locally, the
``latest-rank{r}`` links. A checkpoint folder without a manifest that parses is not a
checkpoint; it is either being written or left over from a crash. ``RunFolder`` lists the
candidates newest first (training progress, then creation time; a tie goes to the one the
pointer names), reads manifests and the pointer, and verifies a checkpoint's files, the same
way for a local path and for an ``s3://`` prefix; only the ``Location`` differs (a local
folder here; ``objectstore.folder.StorePrefix`` wraps the object-store backend). The writes
(commit, retention, set-aside) are the local commit protocol's and need a local folder; the
object store is written only by the uploader, in its own order. Deleting and setting aside
are ``run_folder``'s, the same for both places; the file names are ``run_folder.names``.
(Rejected: a separate remote listing with its own ordering and manifest checks, which is what
the resolver had, and which disagreed with the local one on ties and on what counts as
committed.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from ..errors import ManifestError
from ..save import atomic
from ..save.manifest import Manifest, verify_files
from . import set_aside
from .deleter import LocalDeleter
from .fallback import Walk, first_valid
from .names import MANIFEST_NAME, POINTER_NAME, REJECTED_DIR

log = logging.getLogger(__name__)

_JSON_KINDS = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


@dataclass(frozen=True)
class NoManifest:
    """Why a folder has no manifest that parses. ``damaged``: a manifest file is there but does
    not read or parse (the commit writes it whole, by rename, so that is damage); otherwise
    there is none (a save cut short, a folder being written), or it names another checkpoint
    (a copy under another name)."""

    reason: str
    damaged: bool


@dataclass
class Candidate:
    """A folder that may be a checkpoint: its manifest, or why it has none."""

    name: str
    manifest: Manifest | None
    reason: str | None = None
    damaged: bool = False
    """A manifest file is there but does not parse (``NoManifest.damaged``)."""

    @property
    def sort_key(self) -> tuple:
        if self.manifest is None:
            return ((-1,), "")
        return progress_key(self.manifest)


def misnamed(folder: Path | str, named: str) -> str:
    """The one wording for a manifest that names another checkpoint than its folder."""
    return (
        f"{folder}/{MANIFEST_NAME} names checkpoint {named!r}, not {Path(str(folder)).name!r}: "
        "a copy under another name (cp -rL of a latest link, say) is not a checkpoint"
    )


def progress_key(manifest: Manifest) -> tuple:
    """Order of checkpoints: training progress, then creation time."""
    return (manifest.timestamp.sort_key(), manifest.created_at)


def pointer_body(manifest: Manifest, updated_at: str | None = None) -> dict:
    """``latest.json``'s contents for a checkpoint, the same locally and in a bucket;
    ``updated_at`` is now unless given (the local commit gives the manifest's time)."""
    return {
        "checkpoint": manifest.name,
        "manifest": f"{manifest.name}/{MANIFEST_NAME}",
        "timestamp": manifest.timestamp.to_dict(),
        "updated_at": updated_at or datetime.now(UTC).isoformat(),
    }


class Location(Protocol):
    """Where a run folder's bytes are: what ``RunFolder`` needs to read them."""

    listing_may_lag: bool
    """True: a folder the pointer names is a candidate even when the listing lacks it."""

    def describe(self) -> str:
        """The folder's path or URI, for messages."""

    def folder_names(self) -> list[str]:
        """Names of the sub-folders (dot-names excluded)."""

    def manifests(self, names: list[str]) -> dict[str, Manifest | NoManifest]:
        """Each folder's manifest, or why it has none that parses."""

    def read_pointer(self) -> dict | None:
        """``latest.json`` parsed, or None (absent or unreadable)."""

    def verify(self, manifest: Manifest, ranks: list[int] | None) -> str | None:
        """None when the files of ``ranks`` (all: None) match the manifest, else why not."""


class LocalLocation:
    """A run folder on a local or shared filesystem; files are checked by full checksum."""

    listing_may_lag = False

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def describe(self) -> str:
        return str(self.root)

    def folder_names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return [
            e.name
            for e in os.scandir(self.root)
            if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")
        ]

    def manifests(self, names: list[str]) -> dict[str, Manifest | NoManifest]:
        found: dict[str, Manifest | NoManifest] = {}
        for name in names:
            try:
                manifest = Manifest.read(self.root / name)
            except ManifestError as exc:
                there = os.path.lexists(self.root / name / MANIFEST_NAME)
                found[name] = NoManifest(str(exc), damaged=there)
                continue
            if manifest.name != name:  # a copy under another name: cp -rL of a latest link
                found[name] = NoManifest(misnamed(self.root / name, manifest.name), damaged=False)
            else:
                found[name] = manifest
        return found

    def read_pointer(self) -> dict | None:
        try:
            body = json.loads((self.root / POINTER_NAME).read_text())
        except (OSError, ValueError):
            return None
        return body if isinstance(body, dict) else None

    def verify(self, manifest: Manifest, ranks: list[int] | None) -> str | None:
        return verify_files(self.root / manifest.name, manifest, ranks)


class RunFolder:
    """One run's checkpoints: ``RunFolder(path)`` locally, ``RunFolder(StorePrefix(...))``
    in an object store."""

    def __init__(self, where: Path | str | os.PathLike[str] | Location) -> None:
        if isinstance(where, str | os.PathLike):
            where = LocalLocation(Path(where))
        self.location: Location = where

    @property
    def root(self) -> Path:
        """The local folder (the commit protocol's writes need one)."""
        if not isinstance(self.location, LocalLocation):
            raise TypeError(f"{self.location.describe()} is not a local folder")
        return self.location.root

    def path(self, name: str) -> Path:
        return self.root / name

    def candidates(self) -> list[Candidate]:
        """Every checkpoint-like folder, committed ones newest first, then the rest."""
        loc = self.location
        names = [n for n in loc.folder_names() if n != REJECTED_DIR]
        pointer = self.pointer_name()
        if loc.listing_may_lag and pointer and pointer not in names:
            names.append(pointer)  # trust the pointer even if the listing lags behind it
        found = [
            Candidate(name, got)
            if isinstance(got, Manifest)
            else Candidate(name, None, got.reason, damaged=got.damaged)
            for name, got in loc.manifests(names).items()
        ]
        found.sort(key=lambda c: (c.sort_key, c.name == pointer), reverse=True)
        return found

    def committed(self) -> list[Manifest]:
        """Manifests of the committed checkpoints, newest first."""
        return [c.manifest for c in self.candidates() if c.manifest is not None]

    def is_committed(self, name: str) -> bool:
        """Whether checkpoint ``name`` has a manifest that reads."""
        return isinstance(self.location.manifests([name]).get(name), Manifest)

    def newest_valid(self, ranks_for: Callable[[Manifest], list[int] | None]) -> Walk[Manifest]:
        """The newest committed checkpoint whose files (of ``ranks_for(manifest)``) verify,
        with every newer one passed over and why (``fallback.first_valid``)."""
        return first_valid(self.committed(), lambda m: self.verify(m, ranks_for(m)))

    def verify(self, manifest: Manifest, ranks: list[int] | None) -> str | None:
        """Check the files of ``ranks`` (all: None) against the manifest; None when all
        verify (locally by checksum; in an object store by size and recorded digest)."""
        return self.location.verify(manifest, ranks)

    def read_pointer(self) -> dict | None:
        return self.location.read_pointer()

    def pointer_name(self) -> str | None:
        """The checkpoint ``latest.json`` names (a hint: resume lists the folder)."""
        name = (self.read_pointer() or {}).get("checkpoint")
        return name if isinstance(name, str) and name else None

    def pointer_fault(self) -> str | None:
        """What is wrong with the local ``latest.json`` when it names no checkpoint at all
        (it does not parse, is no JSON object, has no ``checkpoint`` name); None when it is
        absent or names one (committed or not: resume checks that by listing the folder)."""
        try:
            raw = (self.root / POINTER_NAME).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"cannot be read ({exc})"
        try:
            body = json.loads(raw)
        except ValueError as exc:  # UnicodeDecodeError included
            return f"is not JSON ({exc})"
        if not isinstance(body, dict):
            return f"is not a JSON object (it holds {_JSON_KINDS.get(type(body), 'a value')})"
        name = body.get("checkpoint")
        if not isinstance(name, str) or not name:
            return f'names no checkpoint ("checkpoint" is {json.dumps(name)}, not a name)'
        return None

    # ------------------------------------------------------------------ local writes
    def write_manifest(self, manifest: Manifest) -> None:
        atomic.write_bytes_atomic(
            self.path(manifest.name) / MANIFEST_NAME, manifest.to_json().encode()
        )

    def write_pointer(self, manifest: Manifest) -> None:
        body = pointer_body(manifest, manifest.created_at)
        atomic.write_bytes_atomic(
            self.root / POINTER_NAME, (json.dumps(body, indent=2) + "\n").encode()
        )

    def link_latest(self, link_name: str, target: str) -> None:
        """Point ``link_name`` at checkpoint ``target``. A folder in the link's place (a copy
        of the run folder that followed its links: ``cp -rL``, ``aws s3 sync`` and back) is
        moved into ``rejected/`` first: renaming a link over it failed every save."""
        link = self.root / link_name
        if link.is_dir() and not link.is_symlink():
            self.move_aside(link_name, f"a folder where the link {link_name} -> {target} goes")
        atomic.symlink_atomic(target, link)

    def move_aside(self, name: str, reason: str) -> Path | None:
        """Rename ``<run>/<name>`` into ``<run>/rejected/`` with a ``REJECTED.txt`` that says
        when and why; None if it is not there (``run_folder.set_aside.move_aside``)."""
        return set_aside.move_aside(self.root, name, reason)

    def latest_links(self) -> dict[Path, str]:
        """The links in the run folder that name a checkpoint folder of it, and that name."""
        if not self.root.is_dir():
            return {}
        links = {}
        for entry in os.scandir(self.root):
            if entry.is_symlink() and not atomic.is_temp(Path(entry.path)):
                target = os.readlink(entry.path)
                if target and "/" not in target and not target.startswith("."):
                    links[Path(entry.path)] = target
        return links

    def remove_latest_links(self, like: re.Pattern[str], keep: set[str]) -> None:
        """Remove the links named like ``like`` (the latest-link template) but not in ``keep``:
        those of ranks the gang that keeps its links no longer has, whether they name a
        checkpoint folder or, as earlier releases wrote them, a ``rank{r}.pt`` in one."""
        if not self.root.is_dir():
            return
        for entry in os.scandir(self.root):
            stale = entry.name not in keep and like.fullmatch(entry.name)
            if stale and entry.is_symlink() and not atomic.is_temp(Path(entry.path)):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    log.info("removed %s: no rank of this gang writes it", entry.name)

    def uncommit(self, name: str) -> None:
        """Remove the manifest first: from then on the folder is no longer a checkpoint."""
        LocalDeleter(self.root).uncommit(name)

    def remove_tree(self, name: str) -> None:
        """Delete a folder that holds no manifest (an uncommitted checkpoint, a crash
        leftover)."""
        folder = self.path(name)
        if (folder / MANIFEST_NAME).exists():
            raise ManifestError(f"refusing to delete committed checkpoint {folder}")
        LocalDeleter(self.root).remove_rest(name)

    def remove_temp_files(self, name: str) -> None:
        folder = self.path(name)
        if not folder.is_dir():
            return
        for child in folder.iterdir():
            if atomic.is_temp(child):
                with contextlib.suppress(OSError):
                    child.unlink()
