"""Durable, atomic file operations: the only way the runtime writes to a checkpoint folder.

A file appears under its final name only when its bytes are on disk: write to a temporary name
in the same folder, fsync the file, rename over the final name, fsync the folder so the rename
itself survives a power loss. A crash at any point leaves either the old file or the new one,
never a torn mix. (The alternative, writing a whole checkpoint folder and renaming it, cannot
work when several ranks on several nodes fill one folder; a manifest written last this way is
the commit instead.)
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

TMP_MARKER = ".tmp-"


def temp_name(final: Path) -> Path:
    """A unique sibling name that listing code recognises as not-yet-committed."""
    return final.with_name(f".{final.name}{TMP_MARKER}{os.getpid()}-{secrets.token_hex(4)}")


def is_temp(path: Path) -> bool:
    return path.name.startswith(".") and TMP_MARKER in path.name


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def makedirs_durable(path: Path) -> None:
    """Create ``path`` and make each newly created level's entry durable in its parent."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    for created in reversed(missing):
        fsync_dir(created.parent)


@contextlib.contextmanager
def atomic_writer(final: Path) -> Iterator[BinaryIO]:
    """Yield an unbuffered file; on clean exit it is fsynced and renamed onto ``final``."""
    tmp = temp_name(final)
    f = open(tmp, "xb", buffering=0)  # noqa: SIM115 - closed below on every path
    try:
        yield f  # type: ignore[misc]
        os.fsync(f.fileno())
        f.close()
        os.replace(tmp, final)
    except BaseException:
        f.close()
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(final.parent)


def write_atomic(final: Path, write: Callable[[BinaryIO], None]) -> None:
    with atomic_writer(final) as f:
        write(f)


def write_bytes_atomic(final: Path, data: bytes) -> None:
    with atomic_writer(final) as f:
        view = memoryview(data)
        while view:
            n = f.write(view)
            view = view[n:]


def symlink_atomic(target: str, link: Path) -> None:
    """Point ``link`` at ``target`` (relative paths recommended) by renaming a fresh link."""
    tmp = temp_name(link)
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(link.parent)
