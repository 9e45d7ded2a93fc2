"""The object store's part of resume: which remote checkpoint every rank fetches, and the
bucket's housekeeping around that choice.

Rank 0 lists the store (``listed_on_rank0``: one listing, broadcast, so the ranks never disagree
about what the bucket holds); every rank downloads the chosen checkpoint; one broken anywhere is
passed over for the next older one (``remote.newest_fetched``, the one walk to the newest valid
remote checkpoint). Around the choice: the bucket's
pointer moved off a damaged folder, the checkpoints passed over uncommitted in the bucket, and
local checkpoints a killed attempt never uploaded queued again. ``flow.Resumer`` decides when
each runs and loads what was fetched. Every call on the store is a ``remote.RemoteBackend``
method (a backend without a capability does nothing there, ``RemoteBackendBase``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from .. import events
from ..errors import NoCheckpointError, WorldSizeMismatchError
from ..objectstore.errors import ChecksumMismatchError, ObjectNotFoundError, ObjectStoreError
from ..remote import RemoteBackend, RemoteChoice, newest_fetched
from ..run.context import RunContext
from ..save.manifest import Manifest
from ..timestamp import Timestamp
from .choice import QUARANTINE_REASON, Decision
from .formats import reader_for
from .warm_start import folder_bytes

log = logging.getLogger("trainer_runtime")
T = TypeVar("T")


def quarantined_pairs(quarantined: Iterable[str]) -> list[tuple[str, str]]:
    """``(name, reason)`` for each quarantined checkpoint, sorted by name."""
    return [(q, QUARANTINE_REASON) for q in sorted(quarantined)]


class StoreResume:
    """The store's side of ``CheckpointManager.resume()``, on every rank (a run with a store)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    def fetch_agreed(
        self, skip: set[str] | frozenset[str] = frozenset()
    ) -> tuple[Path | None, list[tuple[str, str]]]:
        """Rank 0 names the newest remote checkpoint that verifies by HEAD; every rank
        fetches it; one broken anywhere is passed over for the next older one. Returns the
        local folder (None: the store has none) and, newest first, every newer checkpoint
        passed over with the reason (quarantined, not verifying by HEAD, broken on download),
        the same on every rank. Checkpoints named in ``skip`` are not considered."""
        ctx = self.ctx
        remote = ctx.remote
        assert remote is not None
        fetched: dict[str, Path] = {}
        quarantined = dict(quarantined_pairs(ctx.settings.quarantined))

        def find(tried: set[str]) -> RemoteChoice:
            return listed_on_rank0(
                ctx, lambda: remote.find_newest(exclude=tried, pass_over=quarantined)
            )

        chosen, passed = newest_fetched(
            find,
            lambda name, saved_world: self._fetch_everywhere(remote, name, saved_world, fetched),
            skip=skip,
            on_broken=lambda name, why: log.warning(
                "remote checkpoint %s is broken (%s); trying an older one", name, why
            ),
        )
        return (None if chosen is None else fetched[chosen]), passed

    def _fetch_everywhere(
        self, remote: RemoteBackend, name: str, saved_world: int, fetched: dict[str, Path]
    ) -> str | None:
        """Every rank fetches checkpoint ``name`` (saved by ``saved_world`` ranks) into the run
        folder, noted in ``fetched``; returns why it is broken on some rank (None: fetched on
        every rank). A store that fails, or a world size the checkpoint cannot take, raises."""
        ctx = self.ctx
        path, problem = None, None
        began = time.monotonic()
        try:  # every file: version 2 spreads each rank's state over all of them
            path = remote.fetch(name, ctx.run_dir, None)
            events.fetched(
                rank=ctx.rank,
                checkpoint=name,
                uri=remote.uri_for(name),
                sent=folder_bytes(path),
                seconds=time.monotonic() - began,
            )
        except (ObjectNotFoundError, ChecksumMismatchError) as exc:
            problem = ("broken", str(exc))
        except Exception as exc:  # the store failed: no silent fresh start
            problem = ("fatal", f"{type(exc).__name__}: {exc}")
        problems = [p for p in ctx.coord.all_gather(problem) if p is not None]
        fatal = [why for kind, why in problems if kind == "fatal"]
        if fatal:
            raise NoCheckpointError(f"cannot fetch remote checkpoint {name}: {fatal[0]}")
        if problems:
            return str(problems[0][1])
        assert path is not None
        wrong_size = saved_world != ctx.world_size and not ctx.settings.elastic
        if wrong_size and not reader_for(Manifest.read(path)).any_world_size:
            raise WorldSizeMismatchError(
                f"newest remote checkpoint {name} was saved by {saved_world} rank(s) "
                f"but {ctx.world_size} are resuming it; pass elastic=True or restart "
                f"with WORLD_SIZE={saved_world}"
            )
        fetched[name] = path
        return None

    def repair_pointer(self) -> None:
        """Move the bucket's ``latest.json`` off a damaged folder (rank 0)."""
        remote = self.ctx.remote
        if remote is None:
            return
        try:
            remote.repair_pointer()
        except Exception as exc:  # the store is down: resume says so itself
            log.warning("object store: could not check latest.json: %s", exc)

    def reject(self, rejected: list[tuple[str, str]], chosen: Timestamp | None) -> None:
        """Uncommit, in the bucket, rejected checkpoints newer than the resume position."""
        remote = self.ctx.remote
        if remote is None or not rejected:
            return
        for name, why in dict(rejected).items():
            try:
                remote.reject(name, why, newer_than=chosen or Timestamp())
            except Exception as exc:  # the store is down: the run still goes on
                log.warning(
                    "object store: could not set rejected checkpoint %s aside: %s", name, exc
                )

    def resubmit_unsynced(self) -> None:
        """Queue local checkpoints a killed attempt committed but never uploaded."""
        remote = self.ctx.remote
        if remote is not None:
            queued = remote.resubmit_unsynced(self.ctx.run_dir)
            if queued:
                log.info("re-uploading local checkpoints the store lacks: %s", ", ".join(queued))


def lines_not_named(passed: list[tuple[str, str]], local: Decision) -> list[str]:
    """``"<name>: <reason>"`` for each remote checkpoint passed over that the local decision
    has not already reported."""
    named = {name for name, _ in (*local.rejected, *local.leftovers)}
    return [f"{name}: {why}" for name, why in passed if name not in named]


def refuse_to_start_over(
    fetched: Path | None, passed: list[tuple[str, str]], *, overwrite: bool
) -> None:
    """Every committed checkpoint in the store failed verification (quarantined ones aside):
    a store that answers wrongly (a proxy, a misconfigured endpoint) is likelier than all of
    them damaged, and starting over would set them all aside. Unless ``overwrite``, stop."""
    broken = [(name, why) for name, why in passed if why != QUARANTINE_REASON]
    if fetched is not None or not broken or overwrite:
        return
    listed = "; ".join(f"{name}: {why}" for name, why in broken[:5])
    raise NoCheckpointError(
        f"none of the object store's {len(broken)} committed checkpoint(s) verifies ({listed}); "
        "nothing was set aside. Check the store and its endpoint, or pass overwrite=True to set "
        "them aside and start over"
    )


def listed_on_rank0(ctx: RunContext, listing: Callable[[], T]) -> T:
    """Rank 0 lists the store and every rank gets the answer. When the listing fails (the
    store is down or hung, after its retries), rank 0 raises its error and every other rank
    an ``ObjectStoreError`` with the same text, at the same moment (``RunContext.on_rank0``)."""
    got = ctx.on_rank0(listing)
    if got.raised is not None:
        raise got.raised
    if got.error is not None:
        raise ObjectStoreError(f"rank 0 could not list the object store: {got.error}")
    return got.value
