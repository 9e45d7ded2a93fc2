"""Saving: the run's policy around each save, and a background failure raised at the next call.

The save itself (capture, the copy of an async save into reused host buffers, the optimizer
pre-step hook that holds training until that copy is done, the persisting thread, the commit)
is ``sharded.async_save.SaveScheduler``, the one scheduling path, which the engine-level
``ShardedCheckpointer`` and so the engine benchmarks run too. ``Saver`` decides around it:
whether to save at all (nothing new since the last save, a save still persisting under
``async_policy``), the checkpoint's name, what the checkpoint records of the run
(``runtime_record``), the report of the commit (event, progress annotation), and after the
commit: the position counted as saved, the upload, and retention
(``run_folder.retention.select_for_deletion``; deletions on a thread of their own). A failed
background save is logged at once and raised as ``SaveFailedError`` by the next call into the
manager, never lost. (Rejected: a scheduler of the manager's own beside the engine-level one,
which is what the benchmarks measured: sharded/async_save.py.)
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import events
from ..envvars import ATTEMPT
from ..errors import OverwriteError, SaveFailedError
from ..pod.reporting import report_commit
from ..resume import rejection
from ..run.config import env
from ..run.context import RUNTIME_KEY, RunContext
from ..run_folder.layout import RunFolder
from ..run_folder.retention import select_for_deletion
from ..sharded.async_save import SaveScheduler, SaveTarget, yield_cpu_to_training
from ..timestamp import Timestamp
from .manifest import Manifest
from .staging_gate import SaveTiming, StagingPrewarm

log = logging.getLogger("trainer_runtime")


@dataclass
class SavedCheckpoint:
    name: str
    path: Path
    timestamp: Timestamp
    duration_s: float
    timing: SaveTiming = field(default_factory=SaveTiming)
    """Where this rank's time went: the call, the staging copy, the wait at the next step."""

    @property
    def held_s(self) -> float:
        """Seconds training was blocked by this save on this rank: the whole save when
        synchronous; the ``save()`` call plus the next ``optimizer.step()``'s wait for the
        staging copy when asynchronous."""
        return self.timing.held_s


class Saver:
    """Sync and async saves of one run; at most one save persists at a time."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.saved: list[SavedCheckpoint] = []
        self.skipped_saves = 0
        self._saves = SaveScheduler(ctx.engine, ctx.folder)
        """Captures, stages, gates, persists and commits each save."""
        self._pending_name: str | None = None
        self._rendered: set[str] = set()
        """Every checkpoint name this process's saves have rendered (the same on every rank:
        saves are collective), so a repeated one is known without asking the other ranks."""
        self._taken: frozenset[str] = frozenset()
        """The names of the checkpoints committed before this process's first save (rank
        0's view, the same on every rank), locally or in the bucket."""
        self._pending_key: tuple | None = None
        """The position the background save in flight is saving."""
        self._pruner: ThreadPoolExecutor | None = None
        """Deletes the files of checkpoints retention has already uncommitted."""
        self._deleting: Future[None] | None = None
        self._checked_newer = False
        if ctx.settings.async_save and ctx.components.model is not None:
            self._saves.prewarm_staging(
                list(ctx.components.optimizers.values()), weights_only=ctx.settings.weights_only
            )

    @property
    def pending(self) -> Future[SavedCheckpoint] | None:
        """The background save in flight (or finished but not yet collected)."""
        return self._saves.pending

    @property
    def prewarm(self) -> StagingPrewarm | None:
        """With async saves on: staging buffers allocated after the first optimizer step."""
        return self._saves.prewarm

    # ------------------------------------------------------------------ the save
    def save(self, *, blocking: bool | None, closed: bool) -> SavedCheckpoint | None:
        """Save now; an async save returns None at once and commits in the background."""
        ctx, settings, pos = self.ctx, self.ctx.settings, self.ctx.position
        called = time.perf_counter()
        use_async = settings.async_save if blocking is None else not blocking
        may_skip = use_async and settings.async_policy == "skip"
        if may_skip:
            busy = self._busy_on_any_rank()
        else:
            self.raise_background_failure()
            busy = self.persisting()
        if closed:
            raise SaveFailedError("save() called after close()")
        pos.timestamp.wall_time = pos.wall_time()
        key = pos.key()
        if key == pos.last_saved_key or self._persisting_key(key):
            return None  # nothing new since the last committed save (or the one in flight)
        if busy:
            if may_skip:
                self.skipped_saves += 1
                log.info(
                    "save at batch %d skipped: previous save %s still persisting%s",
                    pos.timestamp.batch,
                    self._pending_name,
                    "" if self.persisting() else " on another rank",
                )
                return None
            self.wait()
        if not self._checked_newer:
            self._taken = check_newer_checkpoints(ctx)
            self._checked_newer = True
        started = time.monotonic()
        timing = SaveTiming()
        # The position counts as saved once this commits (_committed).
        target = self._target(pos.timestamp.copy(), timing)
        kw: dict[str, Any] = {
            "metrics": pos.metrics,
            "extras": {**pos.extras, RUNTIME_KEY: runtime_record(ctx)},
            "timing": timing,
            "called": called,
            "started": started,
        }

        def then(manifest: Manifest) -> SavedCheckpoint:
            return self._committed(manifest, target, timing)

        if not use_async:  # written before training continues: no copy needed
            # The scheduler records the hold (the whole call) before the commit is reported,
            # so the event's held_s and SavedCheckpoint.held_s are one figure.
            return self._saves.save(target, then, **kw)
        self._pending_name, self._pending_key = target.name, key
        self._saves.save_async(target, then, **kw).add_done_callback(_log_failure)
        return None

    def _target(self, ts: Timestamp, timing: SaveTiming) -> SaveTarget:
        """The checkpoint this save commits: its name (never one a committed checkpoint
        has), its latest link, and the report of its commit."""
        ctx, settings = self.ctx, self.ctx.settings
        values = ctx.template_values()
        rendered = settings.templates.render_checkpoint(values)[0]
        repeated = rendered in self._rendered or rendered in self._taken
        checkpoint = unused_name(ctx, rendered, repeated=repeated, taken=self._taken)
        self._rendered.add(rendered)

        def report(manifest: Manifest) -> None:
            """Rank 0, at the commit itself: a kill right after it loses no report of it."""
            uri = ctx.remote.uri_for(checkpoint) if ctx.remote else str(ctx.run_dir / checkpoint)
            record = report_commit(manifest, uri)
            if ctx.progress is not None:
                ctx.progress.committed(record)
            events.committed(manifest, str(record["uri"]), rank=ctx.rank, held_s=timing.held_s)

        return SaveTarget(
            name=checkpoint,
            run_name=ctx.run_name,
            timestamp=ts,
            weights_only=settings.weights_only,
            latest_link=settings.templates.render_latest(values),
            latest_like=settings.templates.latest_pattern(),
            fence=ctx.fence,
            on_commit=report,
        )

    def _persisting_key(self, key: tuple) -> bool:
        """A background save of this very position is still in flight."""
        return self.persisting() and key == self._pending_key

    # ------------------------------------------------------------------ waiting, failures
    def _busy_on_any_rank(self) -> bool:
        """Collective: whether any rank's background save is still persisting, so that every
        rank skips the same saves (``async_policy="skip"``). Each rank's own view differs by
        how long its part of the commit takes; a rank that saved while another skipped would
        pair its save's collectives with the other's next save. A background failure on any
        rank raises ``SaveFailedError`` on every rank, before anything else is saved."""
        fut = self.pending
        failed = fut is not None and fut.done() and fut.exception() is not None
        views = self.ctx.coord.all_gather((self.persisting(), failed))
        self.raise_background_failure()
        failed_on = [rank for rank, (_, f) in enumerate(views) if f]
        if failed_on:
            raise SaveFailedError(
                f"a background save failed on rank(s) {failed_on} (see their logs); "
                "this rank does not save without them"
            )
        return any(busy for busy, _ in views)

    def raise_background_failure(self) -> None:
        fut = self._saves.collect()
        if fut is None:
            return
        exc = fut.exception()
        if exc is not None:
            raise SaveFailedError(f"a background save failed: {exc}") from exc

    def retry_after_failure(self, by: str, *, block: bool = True) -> None:
        """Collect the background save without raising its failure, logged instead: ``by``
        (the save about to run: the final or the emergency one) writes the same state again.
        ``block``: wait for a save still persisting (else collect only one already done)."""
        try:
            if block:
                self.wait()
            else:
                self.raise_background_failure()
        except SaveFailedError as exc:
            log.warning("%s retries what a failed save left: %s", by, exc)

    def release_hook_if_done(self) -> None:
        self._saves.release_hook_if_done()

    def wait_for_snapshot(self) -> None:
        self._saves.wait_for_copy()

    def wait(self) -> None:
        self._saves.settle()
        if self._deleting is not None:  # retention's deletions queued so far (never raise)
            self._deleting.result()
            self._deleting = None
        self.raise_background_failure()

    def release_staging_buffers(self) -> None:
        """Wait until no background work uses the host staging buffers: the save persisting
        from them, and the staging thread's first touch of them (``StagingPrewarm``). A load
        reads into those buffers; one that ran beside a persisting save overwrote what that
        save was writing, and the save committed the loaded state under its own name with
        valid checksums. A failure of that save is not raised here: the next ``save()``,
        ``wait()`` or ``batch_end`` raises it, as it would have without the load."""
        self._saves.release_staging_buffers()

    def persisting(self) -> bool:
        """A background save of this rank is still running (it may use the commit channel)."""
        return self._saves.persisting()

    def shutdown(self) -> None:
        self._saves.shutdown()
        if self._pruner is not None:  # after the saves: their retention may queue deletions
            self._pruner.shutdown(wait=True)

    # ------------------------------------------------------------------ after the commit
    def _committed(
        self, manifest: Manifest, target: SaveTarget, timing: SaveTiming
    ) -> SavedCheckpoint:
        """What follows a commit, on the thread that committed: the position counts as saved,
        the upload is queued, retention runs."""
        ctx = self.ctx
        ctx.position.mark_saved(target.timestamp)
        saved = SavedCheckpoint(
            target.name,
            ctx.folder.path(target.name),
            target.timestamp,
            manifest.save_duration_s,
            timing,
        )
        self.saved.append(saved)
        if ctx.remote is not None:
            ctx.remote.submit(ctx.run_dir, manifest, ctx.rank)
        self._apply_retention()
        return saved

    def _apply_retention(self) -> None:
        """Rank 0's listing and every rank's protected names decide; every rank deletes."""
        ctx = self.ctx
        keep = ctx.settings.num_checkpoints_to_keep
        if keep == -1:
            return
        protected = set() if ctx.remote is None else ctx.remote.pending()
        if self._pending_name is not None and self.persisting():
            protected.add(self._pending_name)
        pointer = ctx.folder.pointer_name()  # behind when its write failed (a full disk):
        if pointer is not None:  # it must go on naming a committed checkpoint
            protected.add(pointer)
        views = ctx.commit_coord.all_gather((protected, [m.name for m in ctx.folder.committed()]))
        keep_out = set().union(*(p for p, _ in views))
        listing = views[0][1]  # rank 0's view, newest first, decides for everyone
        doomed = select_for_deletion(listing, keep=keep, protected=keep_out)
        if not doomed:
            return
        for name in doomed:
            ctx.folder.uncommit(name)
        ctx.commit_coord.barrier()
        # No longer checkpoints (no manifest on any rank): their files go in the background.
        # Deleting is not free (a 1 GiB file took 0.7 s on ext4 mounted with discard), and a
        # synchronous save need not wait for it; close() does.
        if self._pruner is None:
            self._pruner = ThreadPoolExecutor(1, thread_name_prefix="rtj-prune")
        self._deleting = self._pruner.submit(_delete_uncommitted, ctx.folder, doomed)


def position_record(ctx: RunContext, **runtime: Any) -> dict[str, Any]:
    """The position's part of a capture at the current step (``timestamp``, ``run_name``,
    ``metrics``, ``extras`` with the runtime's record, ``runtime`` over it): what the
    survivor's save and the in-process switch's hand-over capture beside the live state."""
    pos = ctx.position
    pos.timestamp.wall_time = pos.wall_time()
    return {
        "timestamp": pos.timestamp.to_dict(),
        "run_name": ctx.run_name,
        "metrics": dict(pos.metrics),
        "extras": {**pos.extras, RUNTIME_KEY: {**runtime_record(ctx), **runtime}},
    }


def runtime_record(ctx: RunContext) -> dict[str, Any]:
    """The runtime's own bookkeeping saved with a checkpoint: the global batch size (resume
    rescales the step when it changes) and the data overrides this run applies, since its
    data position already follows them (``position._apply_data_overrides``). With
    ``ignore_data_position`` the sampler's position is recorded here too: a relaunch with the
    override does not load the sampler's own state (it may be another dataset's), and the
    timestamp alone misses the steps ``data_skip_steps`` skipped."""
    settings = ctx.settings
    record: dict[str, Any] = {
        # The run's own global_batch_size when given: the last batch_end count is short at
        # the end of an epoch that the batch does not divide (100 samples by 16: 4), and a
        # relaunch with the same global_batch_size then rescaled the step (7 -> 6).
        "global_batch_size": settings.global_batch_size or ctx.position.last_global_batch,
        "data_overrides": {
            "ignore_data_position": settings.ignore_data_position,
            "data_skip_steps": settings.data_skip_steps,
        },
    }
    if settings.ignore_data_position and ctx.sampler is not None:
        record["data_position"] = ctx.sampler.state_dict()
    return record


def _log_failure(fut: Future[SavedCheckpoint]) -> None:
    """Log at once; the error itself is raised by the next call into the manager."""
    exc = fut.exception()
    if exc is not None:
        log.error("background save failed (raised at the next call): %s", exc)


def _delete_uncommitted(folder: RunFolder, names: list[str]) -> None:
    """A failure leaves a manifest-less leftover, which is reported and cleaned at resume."""
    yield_cpu_to_training()
    try:
        for name in names:
            folder.remove_tree(name)
    except Exception as exc:  # a thread of its own: nothing else would ever see it
        log.warning("retention could not delete %s: %s", ", ".join(names), exc)
        return
    log.info("retention removed %s", ", ".join(names))


def unused_name(
    ctx: RunContext, name: str, *, repeated: bool, taken: frozenset[str] = frozenset()
) -> str:
    """``name``, or a variant that names no quarantined or committed checkpoint.

    Same position as a quarantined checkpoint: a new name, or resume would skip it. Two saves
    can render one name: two in one epoch with ``ep{epoch}``, an emergency save and the
    epoch's end, ``s{sample}`` when ``batch_end()`` counts no samples, ``ba{batch}`` when
    only ``epoch_end()`` is called. The second would rewrite the first's files in place,
    destroying a committed checkpoint before the new one commits (it did for ``{sample}`` and
    ``{batch}`` names, which were taken to differ at every save). It gets ``-ba<batch>``
    instead; rank 0 looks, every rank takes its answer (saves are collective). A name with
    ``{batch}`` or ``{sample}`` that neither an earlier save of this process rendered nor a
    checkpoint committed before its first save has (``repeated``, the same on every rank) is
    taken as it is, without that exchange: a checkpoint of an earlier attempt at this position
    was already refused or uncommitted before this run's first save
    (``check_newer_checkpoints``). An older one can have it: after a relaunch with a larger
    ``global_batch_size`` the steps count again from a lower number."""
    settings = ctx.settings
    if name in settings.quarantined:
        name = f"{name}-a{env(ATTEMPT) or os.getpid()}"
    elif settings.templates.names_each_position and not repeated:
        return name
    if ctx.rank == 0:
        base, batch = name, ctx.position.timestamp.batch
        candidates = itertools.chain(
            [base, f"{base}-ba{batch}"], (f"{base}-ba{batch}-{n}" for n in itertools.count(2))
        )
        name = next(c for c in candidates if c not in taken and not ctx.folder.is_committed(c))
        if name != base:
            log.info(
                "checkpoint name %s is taken by a committed checkpoint: saving as %s",
                base,
                name,
            )
    return ctx.coord.broadcast(name)


def check_newer_checkpoints(ctx: RunContext) -> frozenset[str]:
    """Before a run's first save: refuse to write under checkpoints at or after the position
    (or, with ``overwrite=True``, uncommit them). One at the very position would have its
    files rewritten in place by this save, a committed checkpoint destroyed before the new
    one commits; a resumed run never gets here with one (it saved nothing new yet). Returns
    the names of the checkpoints committed then, locally or in the bucket (rank 0's view,
    on every rank), which no save of this process may write into (``unused_name``)."""
    ts = ctx.position.timestamp

    def at_or_after(manifests: list[Manifest]) -> list[Manifest]:
        return [m for m in manifests if m.timestamp.sort_key()[:3] >= ts.sort_key()[:3]]

    local = ctx.folder.committed()
    newer = at_or_after(local)
    # The bucket too: a new pod's local folder is empty, and an upload would replace them.
    remote = ctx.remote_committed(required=False)  # unlistable now: logged
    remote_newer = at_or_after(remote)
    if (newer or remote_newer) and not ctx.settings.overwrite:
        where, top = (
            (str(ctx.run_dir), newer[0])
            if newer
            else (ctx.remote.uri_for("") if ctx.remote else "", remote_newer[0])
        )
        samples = (  # progress is ordered by samples first (Timestamp.sort_key)
            f", {top.timestamp.sample} samples trained against {ts.sample}"
            if top.timestamp.batch < ts.batch
            else ""
        )
        raise OverwriteError(
            f"{where!r} holds checkpoint {top.name} (batch {top.timestamp.batch}) "
            f"at or after the current position (batch {ts.batch}{samples}); resume from "
            "it (autoresume=True) or pass overwrite=True to discard those checkpoints"
        )
    ctx.coord.barrier()
    if (newer or remote_newer) and ctx.rank == 0:
        for m in newer:
            log.warning("overwrite=True: uncommitting newer checkpoint %s", m.name)
            ctx.folder.uncommit(m.name)
        # Should this save fail, no pointer or link may name what was just uncommitted.
        still = ctx.folder.committed()
        rejection.repoint(ctx.folder, still[0] if still else None)
        for m in remote_newer if ctx.remote is not None else []:
            log.warning("overwrite=True: uncommitting newer remote checkpoint %s", m.name)
            ctx.remote.reject(
                m.name, "overwrite=True: a run saving before it", newer_than=Timestamp()
            )
    taken = None
    if ctx.rank == 0:  # what the listings held, less what overwrite=True just uncommitted
        set_aside = {m.name for m in [*newer, *remote_newer]} if ctx.settings.overwrite else set()
        taken = {m.name for m in [*local, *remote]} - set_aside
    taken = ctx.coord.broadcast(taken)  # after rank 0's uncommits: the barrier they need
    return frozenset(taken)
