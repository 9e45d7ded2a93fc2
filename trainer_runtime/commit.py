"""The commit of a format-version-2 checkpoint: the one place that makes a checkpoint exist.

Order: every rank writes its share with ``ShardedEngine.write`` (collective, on the commit
channel), every rank reports its file entries or its failure, then rank 0 writes
``manifest.json`` (every file's size and xxh3-128) atomically, then ``latest.json``; a
broadcast is the barrier after which every rank links ``latest-rank{r}`` to the checkpoint
folder. A failure on any rank removes the partial folder on every rank and raises
``SaveFailedError`` everywhere, so a pointer never names an uncommitted checkpoint.

Both ``CheckpointManager`` and the engine-level ``ShardedCheckpointer`` commit through
``write_and_commit``; two copies of the protocol drifted apart before (the rejected
alternative: each saver keeping its own commit).
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from torch.distributed.checkpoint.api import CheckpointException

from .errors import SaveFailedError
from .layout import RunFolder
from .manifest import FORMAT_VERSION_SHARDED, MANIFEST_NAME, FileEntry, Manifest
from .timestamp import Timestamp

if TYPE_CHECKING:
    from .sharded.engine import ShardedEngine

log = logging.getLogger("trainer_runtime")

ENGINE_NAME = "torch.distributed.checkpoint"


def write_and_commit(
    engine: ShardedEngine,
    folder: RunFolder,
    *,
    state: dict[str, Any],
    name: str,
    run_name: str,
    timestamp: Timestamp,
    weights_only: bool,
    latest_link: str | None,
    started: float,
    staged_keys: set[str] | None = None,
) -> Manifest:
    """Write ``state`` as checkpoint ``name`` of ``folder`` and commit it (collective).

    ``state``: from ``engine.capture`` (live references; sync save) or ``engine.stage``
    (host copies; ``staged_keys`` the keys it holds). ``started``: monotonic time the save
    began, for the manifest's ``save_duration_s``.
    """
    coord = engine.commit_coord
    path = folder.path(name)
    outcome: list[FileEntry] | str
    try:  # the folder is made inside the collective save, so a failure there is shared
        outcome = engine.write(state, path, staged=staged_keys)
    except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
        # reported to every rank below, then raised
        outcome = f"rank {engine.rank}: {type(exc).__name__}: {exc}"
    duration = time.monotonic() - started
    gathered = coord.all_gather((outcome, duration))
    errors = [o for o, _ in gathered if isinstance(o, str)]
    if errors:
        folder.remove_tree(name)  # every rank: on node-local disks each has a copy
        raise SaveFailedError(
            f"checkpoint {name} not committed ({'; '.join(errors)}); earlier checkpoints are intact"
        )
    manifest = Manifest(
        name=name,
        run_name=run_name,
        world_size=engine.world_size,
        timestamp=timestamp.copy(),
        files=[entry for o, _ in gathered for entry in o],
        weights_only=weights_only,
        created_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
        save_duration_s=round(max(d for _, d in gathered), 6),
        format_version=FORMAT_VERSION_SHARDED,
        extra={"engine": ENGINE_NAME},
    )
    if engine.rank == 0:
        folder.write_manifest(manifest)
        folder.write_pointer(manifest)
    # One collective serves as the barrier (rank 0 has committed) and shares its time.
    manifest.created_at = coord.broadcast(manifest.created_at)
    if engine.rank != 0 and not (path / MANIFEST_NAME).exists():
        # Node-local disk: this node holds only its own shard files; it records the commit
        # so retention and listing agree, but resuming needs a shared folder or the store.
        folder.write_manifest(manifest)
        folder.write_pointer(manifest)
    if latest_link is not None:
        folder.link_latest(latest_link, name)
    log.info("committed checkpoint %s in %.2fs", name, manifest.save_duration_s)
    return manifest
