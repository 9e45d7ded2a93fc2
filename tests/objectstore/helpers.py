"""Builders shared by the objectstore tests and their subprocess scripts."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from trainer_runtime import atomic
from trainer_runtime.manifest import MANIFEST_NAME, FileEntry, Manifest, hash_file
from trainer_runtime.timestamp import Timestamp

RUN = "run"


def make_checkpoint(
    run_dir: Path,
    name: str,
    batch: int,
    *,
    world_size: int = 1,
    size: int = 256 << 10,
    run_name: str = RUN,
) -> tuple[Path, Manifest]:
    """A committed local checkpoint of random bytes: rank files, then the manifest, last."""
    folder = run_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for rank in range(world_size):
        path = folder / f"rank{rank}.pt"
        with open(path, "wb") as f:
            f.write(os.urandom(size + rank))
        got_size, digest = hash_file(path)
        files.append(FileEntry(path=path.name, rank=rank, size=got_size, xxh3_128=digest))
    manifest = Manifest(
        name=name,
        run_name=run_name,
        world_size=world_size,
        timestamp=Timestamp(epoch=0, batch=batch, sample=batch * 8),
        files=files,
        created_at=datetime.now(UTC).isoformat(),
    )
    atomic.write_bytes_atomic(folder / MANIFEST_NAME, manifest.to_json().encode())
    return folder, manifest
