"""Autoresume: choose the checkpoint every rank continues from, clear what was passed over,
and load it.

Order: the newest checkpoint in the local run folder that verifies on every rank, then the
newest in the object store that downloads intact on every rank, then ``load_path``, else a
fresh start. The pure choice over the ranks' views is ``choice.decide``; the walk newest first
is ``fallback.first_valid``; the store's part (which remote checkpoint, and the bucket's
housekeeping) is ``from_store.StoreResume``; loading is ``restore.Loader``. This module is
the sequence and its side effects, in crash order: rejected checkpoints are moved aside
(``resume/rejection.py``) and the pointer repointed before training goes on, so a relaunch never
trips over them. (Rejected: loading first and cleaning up after, which let a crash in between
leave a pointer to a checkpoint resume had refused.)
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .. import events
from ..errors import WorldSizeMismatchError
from ..run.announce import announce
from ..run.context import RunContext
from ..run_folder.layout import progress_key
from ..save.manifest import Manifest
from ..switch import expects_peer_state
from ..timestamp import Timestamp
from . import choice, from_peer, rejection
from .choice import Decision
from .from_store import StoreResume, lines_not_named, quarantined_pairs, refuse_to_start_over
from .restore import Loader
from .warm_start import was_prefetched

log = logging.getLogger("trainer_runtime")


@dataclass
class ResumeResult:
    """What ``resume()`` did: where the state came from and the restored position."""

    source: Literal["fresh", "checkpoint", "remote", "load_path", "peers"]
    path: str | None
    timestamp: Timestamp
    fallbacks: list[str] = field(default_factory=list)
    """One line per newer checkpoint that was passed over, with the reason."""


class Resumer:
    """``CheckpointManager.resume()``: one call per run, on every rank."""

    def __init__(self, ctx: RunContext, loader: Loader) -> None:
        self.ctx = ctx
        self.loader = loader
        self.store = StoreResume(ctx)
        self._verified: tuple[str, Any] | None = None
        """(checkpoint, what verifying it while choosing it left for the load): this rank's
        files, read once (version 1), or the load itself (version 2: verification is the
        load; ``Loader.verify_everywhere``)."""

    def resume(self) -> ResumeResult:
        ctx, settings = self.ctx, self.ctx.settings
        if expects_peer_state(os.environ):
            contents = from_peer.exchange(ctx, holder=False)
            if contents is not None:  # the running gang switched in process: its state
                sent_by = from_peer.load_from_peer(ctx, contents)
                return self._resumed("peers", "", [], saved_world_size=sent_by)
        opts = {"strict": settings.load_strict, "ignore_keys": settings.load_ignore_keys}
        fallbacks: list[str] = []
        if settings.autoresume:
            if settings.resume_from:
                log.info(
                    "resume hint %s (the newest valid checkpoint of %s is used)",
                    settings.resume_from,
                    ctx.run_dir,
                )
            if ctx.rank == 0:
                self.store.repair_pointer()
            decision = self._agree()
            fallbacks = decision.fallbacks
            self._set_aside(decision)
            if decision.chosen is not None:
                return self._resume_chosen(decision.chosen, fallbacks, opts)
            if ctx.remote is not None:
                resumed, fallbacks = self._resume_from_store(decision, fallbacks, opts)
                if resumed is not None:
                    return resumed
        if settings.load_path:
            loaded = self.loader.load(
                settings.load_path,
                weights_only=settings.load_weights_only,
                arg="load_path",
                **opts,
            )
            if settings.load_weights_only:
                ctx.position.timestamp = Timestamp()
            fallbacks = fallbacks + loaded.passed_over
            return self._resumed("load_path", loaded.shown, fallbacks, local=str(loaded.local))
        announce(
            log,
            logging.INFO,
            "starting run %s from scratch (no checkpoint to resume in %s)",
            ctx.run_name,
            ctx.run_dir,
            speak=ctx.coord.local_rank == 0,
        )
        events.fresh(rank=ctx.rank, run=ctx.run_name, world_size=ctx.world_size)
        self.store.resubmit_unsynced()
        return ResumeResult("fresh", None, ctx.position.timestamp, fallbacks)

    def _resume_chosen(
        self, chosen: str, fallbacks: list[str], opts: dict[str, Any]
    ) -> ResumeResult:
        """Resume from ``chosen``, the local checkpoint every rank agreed on (or from a newer
        one in the store, when there is one)."""
        ctx = self.ctx
        newer = self._newer_in_store(chosen, fallbacks)
        if newer is not None:
            return newer
        path = ctx.folder.path(chosen)
        # fetched from the store by this pod, at import (warm_start)
        source: Literal["checkpoint", "remote"] = (
            "remote" if was_prefetched(ctx.run_dir, chosen) else "checkpoint"
        )
        verified, self._verified = self._verified, None
        kept = verified[1] if verified and verified[0] == chosen else None
        self.loader.load_checkpoint_dir(path, weights_only=False, verified=kept, **opts)
        return self._resumed(source, str(path), fallbacks)

    def _resume_from_store(
        self, decision: Decision, fallbacks: list[str], opts: dict[str, Any]
    ) -> tuple[ResumeResult | None, list[str]]:
        """No local checkpoint: resume from the newest one that downloads intact. Returns the
        result (None: the store has none) and the fallbacks, those passed over there added."""
        ctx = self.ctx
        fetched, passed = self.store.fetch_agreed()
        fallbacks = fallbacks + lines_not_named(passed, decision)
        refuse_to_start_over(fetched, passed, overwrite=ctx.settings.overwrite)
        if ctx.rank == 0:
            chosen = None if fetched is None else Manifest.read(fetched).timestamp
            self.store.reject(passed, chosen)  # quarantined ones met included
        if fetched is None:
            return None, fallbacks
        self.loader.load_checkpoint_dir(fetched, weights_only=False, **opts)
        self._adopt(fetched)
        return self._resumed("remote", str(fetched), fallbacks), fallbacks

    # ------------------------------------------------------------------ local choice
    def _agree(self) -> Decision:
        ctx, settings = self.ctx, self.ctx.settings
        views = ctx.coord.all_gather(choice.list_view(ctx.folder, set(settings.quarantined)))
        opts = {"strict": settings.load_strict, "ignore_keys": settings.load_ignore_keys}

        def verify_everywhere(name: str) -> str | None:
            path = ctx.folder.path(name)
            # The verifying read is also the loading read (version 1: buffers kept for it;
            # version 2: verified while loading, a failure leaves the state as it was).
            got = self.loader.verify_everywhere(
                path, Manifest.read(path), weights_only=False, **opts
            )
            self._verified = None if isinstance(got, str) else (name, got)
            return got if isinstance(got, str) else None

        decision = choice.decide(
            choice.merge(views),
            ctx.world_size,
            verify_everywhere,
            elastic=settings.elastic,
            keep_partial=ctx.remote is not None,
        )
        if ctx.rank == 0:
            for line in decision.fallbacks:
                log.warning("not resuming from %s", line)
        if decision.world_size_conflict is not None:
            name, saved_ws = decision.world_size_conflict
            raise WorldSizeMismatchError(
                f"newest checkpoint {name} in {str(ctx.run_dir)!r} (format version 1) was "
                f"saved by {saved_ws} rank(s) but {ctx.world_size} are resuming it; pass "
                "elastic=True (data-parallel training with ResumableSampler), restart with "
                f"WORLD_SIZE={saved_ws}, or start a new run"
            )
        return decision

    def _set_aside(self, decision: Decision) -> None:
        """Move the checkpoints resume passed over into ``rejected/`` and delete leftovers
        (``resume/rejection.py``), locally and in the bucket, so they do not block the run. Rank 0
        first (a shared folder), then each other rank on its own disk; every rank takes part
        in the barriers, since the decision is the same everywhere."""
        ctx = self.ctx
        chosen = (
            None if decision.chosen is None else Manifest.read(ctx.folder.path(decision.chosen))
        )
        for turn in ("rank 0", "others"):
            if (ctx.rank == 0) == (turn == "rank 0"):
                for name, why in decision.rejected:
                    ctx.folder.move_aside(name, why)
                for name, why in decision.leftovers:
                    rejection.remove_leftover(ctx.folder, name, why)
                # Every rank: on node-local disks each has its own pointer and link.
                self._repoint(chosen, {n for n, _ in decision.rejected})
                if ctx.rank == 0 and chosen is not None:
                    # Without a local choice the bucket decides (StoreResume.fetch_agreed), and
                    # rejects what it passes over itself.
                    self.store.reject(
                        [*decision.rejected, *quarantined_pairs(self.ctx.settings.quarantined)],
                        chosen.timestamp,
                    )
            ctx.coord.barrier()

    def _repoint(self, chosen: Manifest | None, rejected: set[str]) -> None:
        stale = rejection.repoint(self.ctx.folder, chosen)
        if stale is not None and stale not in rejected and self.ctx.folder.is_committed(stale):
            # A crash between a manifest and the pointer leaves it behind: expected, no fault.
            log.info(
                "latest.json named %s, an older committed checkpoint; it now names %s",
                stale,
                chosen.name if chosen is not None else "nothing",
            )
        elif stale is not None and stale not in rejected:
            log.warning(
                "latest.json named %s, which is not a valid checkpoint in %s; it now names %s "
                "(resume lists the folder and does not trust the pointer)",
                stale,
                self.ctx.run_dir,
                chosen.name if chosen is not None else "nothing",
            )

    # ------------------------------------------------------------------ remote choice
    def _newer_in_store(self, local: str, fallbacks: list[str]) -> ResumeResult | None:
        """Resume from the store when it holds a committed checkpoint newer than ``local``, the
        local choice, and one of those verifies: a disk an earlier attempt left on this node
        is behind the bucket when another attempt went further elsewhere, and training on from
        the older one would upload over the newer ones."""
        ctx, settings = self.ctx, self.ctx.settings
        if ctx.remote is None:
            return None
        mine = Manifest.read(ctx.folder.path(local))
        remote = ctx.remote_committed()
        newer = {m.name for m in remote if progress_key(m) > progress_key(mine)}
        if not newer:
            return None
        log.info(
            "the object store holds checkpoints newer than the local %s: %s",
            local,
            ", ".join(sorted(newer)),
        )
        fetched, passed = self.store.fetch_agreed(skip={m.name for m in remote} - newer)
        if ctx.rank == 0:
            self.store.reject(passed, mine.timestamp)
        if fetched is None:
            return None  # none of them verifies: the local choice stands
        opts = {"strict": settings.load_strict, "ignore_keys": settings.load_ignore_keys}
        self.loader.load_checkpoint_dir(fetched, weights_only=False, **opts)
        self._adopt(fetched)
        lines = [f"{name}: {why}" for name, why in passed]
        return self._resumed("remote", str(fetched), fallbacks + lines)

    def _adopt(self, fetched: Path) -> None:
        """The local pointer and this rank's latest link name the fetched checkpoint, once
        every rank has loaded it: a rank's ``close()`` may delete it next (keep_local, with
        nothing saved), and a format-1 load reads its files after every collective."""
        self.ctx.coord.barrier()
        manifest = Manifest.read(fetched)
        link = self.ctx.settings.templates.render_latest(
            self.ctx.template_values(manifest.timestamp)
        )
        rejection.adopt_fetched(self.ctx.folder, manifest, link)

    # ------------------------------------------------------------------ after the choice
    def _resumed(
        self,
        source: Literal["checkpoint", "remote", "load_path", "peers"],
        path: str,
        fallbacks: list[str],
        *,
        local: str | None = None,
        saved_world_size: int | None = None,
    ) -> ResumeResult:
        """``path``: the checkpoint loaded, as reported; ``local``: its copy on this machine
        when that differs (a fetched ``load_path``), where the event reads its manifest;
        ``saved_world_size``: the sending gang's size, for the state from peers (no path)."""
        ctx, pos = self.ctx, self.ctx.position
        self.store.resubmit_unsynced()
        pos.restart_clock()
        pos.mark_saved()
        announce(
            log,
            logging.INFO,
            "resumed run %s from %s at epoch %d batch %d%s",
            ctx.run_name,
            path or "the running gang's rank 0 (in-process switch)",
            pos.timestamp.epoch,
            pos.timestamp.batch,
            f" (passed over {'; '.join(fallbacks)})" if fallbacks else "",
            speak=ctx.coord.local_rank == 0,
        )
        remote_uri = ctx.remote.uri_for(Path(path).name) if ctx.remote is not None else path
        events.resumed(
            rank=ctx.rank,
            run=ctx.run_name,
            source=source,
            path=local or path,
            uri=remote_uri if source == "remote" else path,
            step=pos.timestamp.batch,
            epoch=pos.timestamp.epoch,
            fallbacks=fallbacks,
            world_size=ctx.world_size,
            saved_world_size=saved_world_size,
        )
        return ResumeResult(source, path, pos.timestamp.copy(), fallbacks)
