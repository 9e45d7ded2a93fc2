"""The commit of a format-version-2 checkpoint: the one place that makes a checkpoint exist.

Order: every rank writes its share with ``ShardedEngine.write`` (collective, on the commit
channel), every rank reports its file entries or its failure, then rank 0 writes
``manifest.json`` (every file's size and xxh3-128) atomically, then ``latest.json``; a
broadcast is the barrier after which every rank links ``latest-rank{r}`` to the checkpoint
folder. A failure on any rank removes the partial folder on every rank and raises
``SaveFailedError`` everywhere, so a pointer never names an uncommitted checkpoint.

Every save commits through ``write_and_commit``: the one save scheduler
(``sharded.async_save.SaveScheduler``, which ``CheckpointManager`` and the engine-level
``ShardedCheckpointer`` both run) and the survivor's save from memory. Two copies of the
protocol drifted apart before (the rejected alternative: each saver keeping its own commit).
What the commit needs of the engine is the ``ShareWriter`` protocol, so this module imports
nothing of the engine's package, which commits through it.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, Protocol

from torch.distributed.checkpoint.api import CheckpointException

from ..errors import SaveFailedError, StaleMembershipError
from ..run.dist import Coordinator, describe_failures, failure_cause
from ..run_folder.layout import RunFolder
from ..run_folder.names import MANIFEST_NAME, POINTER_NAME
from ..timestamp import Timestamp
from .fence import Fence
from .manifest import FORMAT_VERSION_SHARDED, FileEntry, Manifest

log = logging.getLogger("trainer_runtime")

ENGINE_NAME = "torch.distributed.checkpoint"


class ShareWriter(Protocol):
    """What the commit needs of the engine (``sharded.engine.ShardedEngine``): the channel the
    ranks commit on, the gang's shape, and the write of this rank's share."""

    commit_coord: Coordinator
    rank: int
    world_size: int

    def write(
        self, state: dict[str, Any], folder: Path, *, staged: set[str] | None = None
    ) -> list[FileEntry]:
        """Write this rank's share of ``state`` into ``folder`` (collective); its entries."""
        ...


def write_and_commit(
    engine: ShareWriter,
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
    latest_like: re.Pattern[str] | None = None,
    on_commit: Callable[[Manifest], None] | None = None,
    fence: Fence | None = None,
) -> Manifest:
    """Write ``state`` as checkpoint ``name`` of ``folder`` and commit it (collective).

    ``state``: from ``engine.capture`` (live references; sync save) or ``engine.stage``
    (host copies; ``staged_keys`` the keys it holds). ``started``: monotonic time the save
    began, for the manifest's ``save_duration_s``. ``latest_like``: what the latest-link
    template renders (``NameTemplates.latest_pattern``); links like it that no rank of this
    gang writes (ranks it no longer has, after the world size shrank) are removed, so they
    neither name an older checkpoint nor dangle once retention deletes it.
    ``on_commit``: called on rank 0 as soon as the manifest is written (the commit), before
    the other ranks hear of it, so a report of the commit (the ``committed`` event, the
    progress annotation) is not lost to a kill in the steps after it (pointer, links, the
    barrier); it must not raise.

    Long on purpose: the commit protocol's order is its safety argument (every rank's files,
    then one gather of the outcomes, then the manifest on rank 0, then the broadcast that is
    also the barrier, then pointer and links), and it reads as one sequence here; the steps
    with a job of their own (``_abandon``, ``_commit_on_rank0``, ``_write_pointer``) are apart.
    """
    coord = engine.commit_coord
    path = folder.path(name)
    outcome: list[FileEntry] | str
    failure: BaseException | None = None
    try:  # the folder is made inside the collective save, so a failure there is shared
        outcome = engine.write(state, path, staged=staged_keys)
    except (Exception, CheckpointException, KeyboardInterrupt) as exc:  # DCP's is a BaseException
        # reported to every rank below, then raised (with this one as its cause); Ctrl-C too,
        # so the other ranks learn of it and the partial checkpoint goes everywhere
        failure, outcome = exc, describe_write_failure(exc, engine.rank)
    duration = time.monotonic() - started
    gathered = coord.all_gather((outcome, duration, latest_link))
    errors = [o for o, _, _ in gathered if isinstance(o, str)]
    if errors:
        _abandon(folder, name, errors, failure, rank=coord.rank)
    manifest = Manifest(
        name=name,
        run_name=run_name,
        world_size=engine.world_size,
        timestamp=timestamp.copy(),
        files=[entry for o, _, _ in gathered for entry in o],
        weights_only=weights_only,
        created_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
        save_duration_s=round(max(d for _, d, _ in gathered), 6),
        format_version=FORMAT_VERSION_SHARDED,
        extra={"engine": ENGINE_NAME} | ({} if fence is None else {"membershipEpoch": fence.epoch}),
    )
    problem = None
    if engine.rank == 0:
        failure, problem = _commit_on_rank0(folder, manifest, fence)
        if problem is None and on_commit is not None:
            on_commit(manifest)
    # One collective serves as the barrier (rank 0 has committed, or failed to) and shares
    # its time.
    manifest.created_at, problem = coord.broadcast((manifest.created_at, problem))
    if problem is not None:
        if isinstance(failure, StaleMembershipError) or problem.startswith(_STALE):
            # the folder may be the newer gang's checkpoint of the same name: leave it
            raise StaleMembershipError(f"checkpoint {name} not committed: {problem}")
        _abandon(folder, name, [problem], failure, rank=coord.rank)
    if engine.rank != 0 and not (path / MANIFEST_NAME).exists():
        # Node-local disk: this node holds only its own shard files; it records the commit
        # so retention and listing agree, but resuming needs a shared folder or the store.
        folder.write_manifest(manifest)
        _write_pointer(folder, manifest)
    if latest_link is not None:
        folder.link_latest(latest_link, name)
    if latest_like is not None:
        folder.remove_latest_links(latest_like, keep={link for _, _, link in gathered if link})
    log.info("committed checkpoint %s in %.2fs", name, manifest.save_duration_s)
    return manifest


def describe_write_failure(exc: BaseException, rank: int) -> str:
    """The cause in one line: DCP wraps each rank's error in a ``CheckpointException``
    whose text is a full traceback per rank; the traceback stays in the chained cause."""
    if isinstance(exc, CheckpointException) and exc.failures:
        return describe_failures(exc)
    return f"rank {rank}: {type(exc).__name__}: {' '.join(str(exc).split())}"


_STALE = "fenced out: "


def _commit_on_rank0(
    folder: RunFolder, manifest: Manifest, fence: Fence | None
) -> tuple[Exception | None, str | None]:
    """Write the manifest (the commit), then the pointer; the failure and its one-line
    description when the manifest could not be written (or the gang was fenced out)."""
    stale = fence.stale() if fence is not None else None
    if stale is not None:
        return StaleMembershipError(stale), _STALE + stale
    try:
        folder.write_manifest(manifest)
    except OSError as exc:
        with contextlib.suppress(OSError):
            folder.uncommit(manifest.name)  # written, but its folder's sync failed
        return exc, describe_write_failure(exc, 0)
    _write_pointer(folder, manifest)
    return None, None


def _write_pointer(folder: RunFolder, manifest: Manifest) -> None:
    """Point ``latest.json`` at a committed checkpoint. Failing to is not a failed save: the
    pointer is replaced atomically, so it still names the previous committed checkpoint.
    A pointer that named no checkpoint at all (garbage, written from outside) is reported."""
    fault = folder.pointer_fault()
    try:
        folder.write_pointer(manifest)
    except OSError as exc:
        log.warning(
            "checkpoint %s committed, but latest.json still names the previous one: %s",
            manifest.name,
            exc,
        )
        return
    if fault is not None:
        log.warning("%s %s; it now names %s", folder.root / POINTER_NAME, fault, manifest.name)


def _abandon(
    folder: RunFolder, name: str, errors: list[str], cause: BaseException | None, *, rank: int
) -> NoReturn:
    """Remove the partial checkpoint on every rank and raise the failure everywhere: a
    ``SaveFailedError``, except on a rank whose own write Ctrl-C (SIGINT) broke, which gets its
    ``KeyboardInterrupt`` back. DCP turns that into a failed write like any other; raised as a
    ``SaveFailedError`` it stopped nothing in a script that carries on after a failed save."""
    folder.remove_tree(name)  # every rank: on node-local disks each has a copy
    reasons = "; ".join(dict.fromkeys(errors))
    failed = SaveFailedError(
        f"checkpoint {name} not committed ({reasons}); earlier checkpoints are intact"
    )
    if _interrupted(cause, rank):
        raise KeyboardInterrupt(
            f"checkpoint {name} not committed (interrupted); earlier checkpoints are intact"
        ) from failed
    raise failed from cause


def _interrupted(cause: BaseException | None, rank: int) -> bool:
    """Whether Ctrl-C broke this rank's own write (raised as it is, or wrapped by DCP)."""
    if isinstance(cause, KeyboardInterrupt):
        return True
    if isinstance(cause, CheckpointException):
        own = cause.failures.get(rank)
        return own is not None and isinstance(failure_cause(own), KeyboardInterrupt)
    return False
