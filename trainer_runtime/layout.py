"""One run's checkpoint folder on a local or shared filesystem (docs/runtime.md).

``<run_dir>/<checkpoint>/rank{r}.pt ... manifest.json``, ``<run_dir>/latest.json`` and the
``latest-rank{r}`` links. A checkpoint folder without a manifest that parses is not a
checkpoint; it is either being written or left over from a crash.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from . import atomic
from .errors import ManifestError
from .manifest import MANIFEST_NAME, POINTER_NAME, Manifest, verify_entry

log = logging.getLogger(__name__)

REJECTED_DIR = "rejected"
"""Where resume moves the checkpoints it passed over (``rejection.py``); never a candidate."""


@dataclass
class Candidate:
    """A folder that may be a checkpoint: its manifest, or why it has none."""

    name: str
    manifest: Manifest | None
    reason: str | None = None

    @property
    def sort_key(self) -> tuple:
        if self.manifest is None:
            return ((-1,), "")
        return (self.manifest.timestamp.sort_key(), self.manifest.created_at)


class RunFolder:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, name: str) -> Path:
        return self.root / name

    def candidates(self) -> list[Candidate]:
        """Every checkpoint-like folder, committed ones newest first, then the rest."""
        if not self.root.is_dir():
            return []
        found: list[Candidate] = []
        for entry in os.scandir(self.root):
            if not entry.is_dir(follow_symlinks=False) or entry.name.startswith("."):
                continue
            if entry.name == REJECTED_DIR:
                continue
            try:
                found.append(Candidate(entry.name, Manifest.read(Path(entry.path))))
            except ManifestError as exc:
                found.append(Candidate(entry.name, None, str(exc)))
        found.sort(key=lambda c: c.sort_key, reverse=True)
        return found

    def committed(self) -> list[Manifest]:
        return [c.manifest for c in self.candidates() if c.manifest is not None]

    def verify(self, manifest: Manifest, ranks: list[int]) -> str | None:
        """Check the files of ``ranks`` against the manifest; None when all verify."""
        folder = self.path(manifest.name)
        for rank in ranks:
            for entry in manifest.files_for_rank(rank):
                reason = verify_entry(folder, entry)
                if reason:
                    return reason
        return None

    def write_manifest(self, manifest: Manifest) -> None:
        atomic.write_bytes_atomic(
            self.path(manifest.name) / MANIFEST_NAME, manifest.to_json().encode()
        )

    def write_pointer(self, manifest: Manifest) -> None:
        body = {
            "checkpoint": manifest.name,
            "manifest": f"{manifest.name}/{MANIFEST_NAME}",
            "timestamp": manifest.timestamp.to_dict(),
            "updated_at": manifest.created_at,
        }
        atomic.write_bytes_atomic(
            self.root / POINTER_NAME, (json.dumps(body, indent=2) + "\n").encode()
        )

    def read_pointer(self) -> dict | None:
        try:
            return json.loads((self.root / POINTER_NAME).read_text())
        except (OSError, ValueError):
            return None

    def link_latest(self, link_name: str, target: str) -> None:
        atomic.symlink_atomic(target, self.root / link_name)

    def uncommit(self, name: str) -> None:
        """Remove the manifest first: from then on the folder is no longer a checkpoint."""
        with contextlib.suppress(FileNotFoundError):
            (self.path(name) / MANIFEST_NAME).unlink()
            atomic.fsync_dir(self.path(name))

    def remove_files(self, name: str, files: list[str]) -> None:
        for rel in files:
            with contextlib.suppress(FileNotFoundError):
                (self.path(name) / rel).unlink()

    def remove_if_empty(self, name: str) -> None:
        with contextlib.suppress(OSError):
            self.path(name).rmdir()

    def remove_tree(self, name: str) -> None:
        """Delete a folder that holds no manifest (a crash leftover)."""
        folder = self.path(name)
        if (folder / MANIFEST_NAME).exists():
            raise ManifestError(f"refusing to delete committed checkpoint {folder}")
        shutil.rmtree(folder, ignore_errors=True)

    def remove_temp_files(self, name: str) -> None:
        folder = self.path(name)
        if not folder.is_dir():
            return
        for child in folder.iterdir():
            if atomic.is_temp(child):
                with contextlib.suppress(OSError):
                    child.unlink()
