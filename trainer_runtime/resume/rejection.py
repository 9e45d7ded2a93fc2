"""Checkpoints that resume passed over must not block the run that goes on from an older one.

When resume falls back past committed checkpoints (torn, a rank's file missing or failing its
checksum, quarantined by the operator through ``RTJ_QUARANTINED``), those checkpoints are newer
than the position training continues from. Left committed, the first save would refuse to
overwrite them (``OverwriteError``) and advise resuming from the very checkpoint just rejected:
under the operator every relaunch would fail the same way. So resume moves each of them aside,
into ``<run>/rejected/<name>/`` with a ``REJECTED.txt`` that says why, and logs it. Moving (one
``rename``) rather than deleting keeps the evidence; a folder under ``rejected/`` is never a
resume candidate. Uncommitting in place (removing the manifest) was rejected: the folder would
then look like a crash leftover, and the reason would be lost.

Leftovers (folders without a manifest: a save or download cut short by a crash) are deleted at
resume: they can never be resumed, and nothing writes them while every rank is resuming. Only
folders that hold nothing but checkpoint files are: a folder of the user's in the run folder
(``tb_logs/``, say) was deleted as a leftover too, so any other file or a subfolder keeps it.
Overwrite protection is untouched for everything else: another run's checkpoints, and newer
committed checkpoints that verify (those are resumed from, not rejected).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from ..errors import ManifestError
from ..run_folder.layout import RunFolder
from ..run_folder.names import MANIFEST_NAME, POINTER_NAME, is_checkpoint_file
from ..save import atomic
from ..save.manifest import Manifest

log = logging.getLogger("trainer_runtime")


def foreign_entry(path: Path) -> str | None:
    """The first entry of ``path`` that no save or download writes into a checkpoint folder
    (a subfolder, a file of another kind), or None when it holds only checkpoint files."""
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        name = entry.name
        if entry.is_dir(follow_symlinks=False) or entry.is_symlink():
            return name + "/" if entry.is_dir() else name
        if not (is_checkpoint_file(name) or atomic.is_temp(Path(entry.path))):
            return name
    return None


def is_user_folder(folder: RunFolder, name: str) -> bool:
    """Whether ``<run>/<name>``, a folder without a manifest, holds something no save writes
    (a subfolder, a file of another kind: ``tb_logs/``). Such a folder is the user's, neither
    a checkpoint nor a crashed save's leftover: resume leaves it alone and warns, but does not
    report it as a checkpoint passed over (it was in every resume's fallbacks, as "not
    committed")."""
    path = folder.path(name)
    foreign = foreign_entry(path) if path.is_dir() else None
    if foreign is None:
        return False
    log.warning(
        "%s is not a checkpoint (it holds %s, which no save writes): left alone; keep "
        "other files outside the run folder",
        path,
        foreign,
    )
    return True


def remove_leftover(folder: RunFolder, name: str, reason: str) -> None:
    """Delete a folder without a manifest; one whose manifest is unreadable is moved aside;
    one that holds anything but checkpoint files (not a save's) is left alone."""
    if not folder.path(name).is_dir() or is_user_folder(folder, name):
        return
    try:
        folder.remove_tree(name)
    except ManifestError:
        folder.move_aside(name, reason)
        return
    log.info("removed leftover %s (%s)", folder.path(name), reason)


def repoint(folder: RunFolder, chosen: Manifest | None) -> str | None:
    """Make ``latest.json`` name the checkpoint resume chose (or remove it when there is none),
    and the ``latest-rank{r}`` links with it; returns the name the pointer held before when
    that was a different checkpoint.

    Resume itself does not trust the pointer: it lists the folder, because a crash between a
    manifest and its pointer leaves the pointer one checkpoint behind. Tools and people read it.
    """
    fault = folder.pointer_fault()
    named = folder.pointer_name()
    if chosen is not None:
        if named != chosen.name:
            folder.write_pointer(chosen)
    elif named is not None or fault is not None:
        with contextlib.suppress(FileNotFoundError):
            (folder.root / POINTER_NAME).unlink()
    if fault is not None:
        log.warning(
            "%s %s; resume does not read it (it lists the run folder); it now %s",
            folder.root / POINTER_NAME,
            fault,
            f"names {chosen.name}" if chosen is not None else "is removed (nothing is committed)",
        )
    relink(folder, None if chosen is None else chosen.name)
    return None if named is None or (chosen is not None and named == chosen.name) else str(named)


def relink(folder: RunFolder, chosen: str | None) -> None:
    """Point every latest link that names no committed checkpoint (one moved aside, deleted or
    uncommitted) at ``chosen``; remove it when there is none."""
    for link, target in folder.latest_links().items():
        if (folder.path(target) / MANIFEST_NAME).is_file():
            continue
        if chosen is None:
            with contextlib.suppress(FileNotFoundError):
                link.unlink()
        else:
            atomic.symlink_atomic(chosen, link)
        log.info("%s named %s, no longer a checkpoint; now %s", link.name, target, chosen)


def adopt_fetched(folder: RunFolder, fetched: Manifest, link: str | None) -> None:
    """After a resume from the object store: ``latest.json`` and this rank's ``link`` name the
    checkpoint just downloaded, as after a commit. Without this a disk an earlier attempt left
    on the node kept pointing at its own, older checkpoint. A pointer that cannot be written
    is logged: the state is loaded and the next commit writes it again."""
    try:
        stale = repoint(folder, fetched)
        if link is not None:
            folder.link_latest(link, fetched.name)
    except OSError as exc:
        log.warning("resumed from %s, but latest.json could not name it: %s", fetched.name, exc)
        return
    if stale is not None:
        log.info(
            "latest.json named %s; it now names %s (from the object store)", stale, fetched.name
        )
