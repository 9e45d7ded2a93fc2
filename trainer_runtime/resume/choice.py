"""Choosing the checkpoint to resume from, agreed by every rank.

Each rank lists its own view of the run folder (on node-local disks the views differ), the views
are merged newest first, and candidates are verified one at a time until one verifies on every
rank. Only the candidate being considered is checksummed, so a resume reads one checkpoint,
not all of them. Every candidate passed over yields a log line that says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..run_folder.fallback import first_valid
from ..run_folder.layout import RunFolder
from . import rejection

QUARANTINE_REASON = "quarantined by the operator (repeated failures after it)"


@dataclass(frozen=True)
class Listed:
    """One rank's cheap (no checksum) opinion of a checkpoint folder."""

    key: tuple
    world_size: int | None
    reason: str | None
    any_world_size: bool = False
    """Format version 2: loads at any world size."""


@dataclass
class Merged:
    name: str
    key: tuple
    world_size: int | None
    reason: str | None
    any_world_size: bool = False
    partial: bool = False
    """Committed where it is listed, but absent from some rank's disk (node-local folders)."""


@dataclass
class Decision:
    chosen: str | None
    fallbacks: list[str] = field(default_factory=list)
    world_size_conflict: tuple[str, int] | None = None
    rejected: list[tuple[str, str]] = field(default_factory=list)
    """(name, reason) of committed checkpoints passed over: newer than ``chosen``."""
    leftovers: list[tuple[str, str]] = field(default_factory=list)
    """(name, reason) of folders no rank has a manifest for."""


def list_view(folder: RunFolder, quarantined: set[str]) -> dict[str, Listed]:
    """This rank's candidates; a folder of the user's (``tb_logs/``) is none."""
    view: dict[str, Listed] = {}
    for cand in folder.candidates():
        if cand.manifest is None and rejection.is_user_folder(folder, cand.name):
            continue
        if cand.manifest is None:
            view[cand.name] = Listed(cand.sort_key, None, cand.reason or "no manifest")
        elif cand.name in quarantined:
            view[cand.name] = Listed(
                cand.sort_key,
                cand.manifest.world_size,
                QUARANTINE_REASON,
                cand.manifest.sharded,
            )
        else:
            view[cand.name] = Listed(
                cand.sort_key, cand.manifest.world_size, None, cand.manifest.sharded
            )
    return view


def merge(views: list[dict[str, Listed]]) -> list[Merged]:
    """Union of the ranks' views, newest first; a folder unusable on any rank says why."""
    names = set().union(*views)
    merged: list[Merged] = []
    for name in names:
        entries = [(rank, v.get(name)) for rank, v in enumerate(views)]
        known = [e for _, e in entries if e is not None and e.world_size is not None]
        key = max((e.key for _, e in entries if e is not None), default=((-1,), ""))
        ws = known[0].world_size if known else None
        reason = None
        partial = False
        for rank, e in entries:
            if e is None:
                reason, partial = f"not present on rank {rank}", True
            elif e.reason is not None:
                reason = e.reason if len(views) == 1 else f"rank {rank}: {e.reason}"
                partial = False
            if reason:
                break
        any_ws = bool(known) and known[0].any_world_size
        merged.append(Merged(name, key, ws, reason, any_ws, partial and ws is not None))
    merged.sort(key=lambda m: m.key, reverse=True)
    return merged


class _WorldSizeConflictError(Exception):
    """Stops the walk: the newest usable checkpoint needs another world size."""

    def __init__(self, cand: Merged) -> None:
        super().__init__(cand.name)
        self.cand = cand


def decide(
    merged: list[Merged],
    world_size: int,
    verify_everywhere: Callable[[str], str | None],
    *,
    elastic: bool = False,
    keep_partial: bool = False,
) -> Decision:
    """Walk candidates newest first (``fallback.first_valid``); ``verify_everywhere``
    checksums one on every rank. A candidate some rank already faults (quarantined, missing
    on a rank) is passed over without a read; a format-version-1 one saved at another world
    size stops the walk (``world_size_conflict``) unless ``elastic``, since an older one
    would silently lose progress. ``keep_partial`` (a run with an object store): a checkpoint
    committed on some ranks' disks and absent from others' is passed over but not rejected:
    nothing says it is broken, and the store may hold it whole (a survivor's save,
    ``save/survivor.py``, is on one node's disk and in the bucket)."""
    decision = Decision(chosen=None)
    # Folders without a usable manifest have no known position: report them all up front.
    decision.leftovers = [(c.name, str(c.reason)) for c in merged if c.world_size is None]
    decision.fallbacks = [f"{name}: {why}" for name, why in decision.leftovers]

    def check(cand: Merged) -> str | None:
        if cand.reason is not None:
            return cand.reason
        if cand.world_size != world_size and not elastic and not cand.any_world_size:
            raise _WorldSizeConflictError(cand)
        return verify_everywhere(cand.name)

    def reject(cand: Merged, why: str) -> None:
        decision.fallbacks.append(f"{cand.name}: {why}")
        if not (keep_partial and cand.partial):
            decision.rejected.append((cand.name, why))

    committed = (c for c in merged if c.world_size is not None)
    try:
        walk = first_valid(committed, check, on_reject=reject)
    except _WorldSizeConflictError as stop:
        decision.world_size_conflict = (stop.cand.name, int(stop.cand.world_size or 0))
        return decision
    decision.chosen = None if walk.chosen is None else walk.chosen.name
    return decision
