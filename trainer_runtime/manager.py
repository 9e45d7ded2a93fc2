"""CheckpointManager: the runtime's public face inside a training loop.

A facade: it counts the loop (``batch_end``/``epoch_end``), asks the save schedule and the
preemption watcher at each step boundary, and hands the work to parts with one job each:

- ``config.py``: constructor arguments and environment, validated once; the run's location;
- ``saving.py``: sync and async saves (staging, background persist, failure propagation);
- ``commit.py``: the commit protocol (every rank's files, then the manifest, then the pointer);
- ``resuming.py`` and ``loading.py``: choosing the checkpoint to continue from, and loading it;
- ``emergency.py``: the response to a preemption notice or SIGTERM.

They share one ``context.RunContext`` (the run, its channels, its live position). Everything
the manager needs to know inside a managed pod comes from the environment (``envvars``);
explicit arguments win. (Rejected: the one 1200-line class this replaced, which every change
touched and no part of which could be tested alone.)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from torch import nn

from . import arguments, envvars, events, naming
from . import state as state_mod
from .auto_interval import AutoSchedule
from .config import (
    AsyncPolicy,
    Settings,
    check_location_arguments,
    check_run_folder,
    run_folder_source,
)
from .context import global_batch, open_run
from .emergency import PreemptionResponse
from .errors import ConfigError
from .loading import Loader
from .preemption import DEFAULT_EXIT_CODE, PreemptionWatcher
from .progress import TotalWork
from .remote import RemoteBackend, close_remote
from .resuming import Resumer, ResumeResult
from .sampler import ResumableSampler
from .saving import SavedCheckpoint, Saver
from .timestamp import Event, IntervalFn, Timestamp
from .warm_start import wait_for_prefetch

__all__ = ["CheckpointManager", "ResumeResult", "SavedCheckpoint"]

log = logging.getLogger("trainer_runtime")


def _position_field(name: str, doc: str) -> Any:
    """A manager attribute that lives in the run's shared ``Position`` (resume replaces it)."""
    return property(
        lambda self: getattr(self._ctx.position, name),
        lambda self, value: setattr(self._ctx.position, name, value),
        doc=doc,
    )


class CheckpointManager:
    """Save, commit, retain and resume a training run's checkpoints.

    Minimal use::

        ckpt = CheckpointManager(model=model, optimizer=opt, interval="100ba")
        ckpt.resume()
        for epoch in range(ckpt.timestamp.epoch, epochs):
            for x, y in loader:
                train_step(x, y)
                ckpt.batch_end(num_samples=len(x))
            ckpt.epoch_end()
        ckpt.close()
    """

    def __init__(
        self,
        *,
        model: nn.Module | None = None,
        optimizer: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        stateful: Mapping[str, Any] | None = None,
        folder: str | os.PathLike[str] | None = None,
        filename: str = naming.DEFAULT_FILENAME,
        latest_filename: str | None = naming.DEFAULT_LATEST,
        run_name: str | None = None,
        interval: int | str | IntervalFn = "1ep",
        interval_min: float | timedelta | None = None,
        interval_max: float | timedelta | None = None,
        total_steps: int | None = None,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
        num_checkpoints_to_keep: int = -1,
        weights_only: bool = False,
        overwrite: bool = False,
        autoresume: bool = True,
        resume_from: str | None = None,
        load_path: str | None = None,
        load_weights_only: bool = False,
        load_strict: bool = True,
        load_ignore_keys: Sequence[str] = (),
        async_save: bool = False,
        async_policy: AsyncPolicy = "wait",
        trusted_pickle: bool = False,
        quarantined: Iterable[str] | None = None,
        remote: RemoteBackend | None = None,
        local_folder: str | os.PathLike[str] | None = None,
        num_local_checkpoints_to_keep: int | None = None,
        num_remote_checkpoints_to_keep: int = -1,
        sampler: ResumableSampler | None = None,
        ignore_data_position: bool = False,
        data_skip_steps: int = 0,
        elastic: bool = False,
        global_batch_size: int | None = None,
        handle_sigterm: bool = True,
        notice_file: str | None = None,
        grace_period_s: float | None = None,
        preemption_exit_code: int = DEFAULT_EXIT_CODE,
        upload_flush_timeout_s: float | None = None,
        final_save: bool = True,
        coordination_timeout: timedelta = timedelta(minutes=10),
    ) -> None:
        self.components = state_mod.checked_components(
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=scaler,
            stateful=stateful,
            sampler=sampler,
        )
        cfg = Settings.resolve(
            folder=folder,
            filename=filename,
            latest_filename=latest_filename,
            run_name=run_name,
            interval=interval,
            num_checkpoints_to_keep=num_checkpoints_to_keep,
            num_local_checkpoints_to_keep=num_local_checkpoints_to_keep,
            num_remote_checkpoints_to_keep=num_remote_checkpoints_to_keep,
            weights_only=weights_only,
            overwrite=overwrite,
            autoresume=autoresume,
            resume_from=resume_from,
            load_path=load_path,
            load_weights_only=load_weights_only,
            load_strict=load_strict,
            load_ignore_keys=load_ignore_keys,
            async_save=async_save,
            async_policy=async_policy,
            trusted_pickle=trusted_pickle,
            quarantined=quarantined,
            data_skip_steps=data_skip_steps,
            sampler_batch_size=None if sampler is None else sampler.batch_size,
            has_sampler=sampler is not None,
            ignore_data_position=ignore_data_position,
            elastic=elastic,
            global_batch_size=global_batch_size,
            handle_sigterm=handle_sigterm,
            notice_file=notice_file,
            grace_period_s=grace_period_s,
            preemption_exit_code=preemption_exit_code,
            upload_flush_timeout_s=upload_flush_timeout_s,
            final_save=final_save,
            coordination_timeout=coordination_timeout,
            interval_min=interval_min,
            interval_max=interval_max,
            total_steps=total_steps,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
        )
        check_location_arguments(local_folder, remote)
        self.settings = cfg
        self.interval = cfg.interval
        self.sampler = sampler
        wait_for_prefetch()  # the run folder is the prefetch's until it is done (warm_start)
        ctx = self._ctx = open_run(
            cfg,
            self.components,
            sampler=sampler,
            remote=remote,
            local_folder=local_folder,
            keep_local=cfg.num_local_checkpoints_to_keep,
            keep_remote=cfg.num_remote_checkpoints_to_keep,
            coordination_timeout=cfg.coordination_timeout,
        )
        self.coord, self.commit_coord = ctx.coord, ctx.commit_coord
        self.rank, self.world_size = ctx.rank, ctx.world_size
        self.run_name, self.run_dir, self.folder = ctx.run_name, ctx.run_dir, ctx.folder
        self.remote, self.engine, self.progress = ctx.remote, ctx.engine, ctx.progress
        self.preemption = PreemptionWatcher(
            notice_file=cfg.notice_file, handle_sigterm=cfg.handle_sigterm
        )
        self.saver = Saver(self._ctx)
        self.loader = Loader(self._ctx)
        self.resumer = Resumer(self._ctx, self.loader)
        self._response = PreemptionResponse(
            self,
            grace_period_s=cfg.grace_period_s,
            exit_code=cfg.preemption_exit_code,
            upload_flush_timeout_s=cfg.upload_flush_timeout_s,
        )
        self.preemption.on_sigterm = self._response.watchdog.start_clock
        self._closed = False
        check_run_folder(
            ctx.folder,
            run_name=ctx.run_name,
            rank=ctx.rank,
            overwrite=cfg.overwrite,
            source=run_folder_source(cfg, local_folder),
            remote=ctx.remote_committed(),
            remote_uri=None if ctx.remote is None else ctx.remote.uri_for(""),
        )
        if ctx.fence is not None and ctx.rank == 0:
            ctx.fence.claim()  # from now on an older gang can no longer commit (fence.py)
        self.total_work = TotalWork(cfg.total_steps, cfg.epochs, cfg.steps_per_epoch)
        """The job's total steps, reported beside the current step (progress.py)."""
        self._report_total()
        self.auto_interval = (
            None
            if cfg.auto_interval is None
            else AutoSchedule(cfg.auto_interval, rank=ctx.rank, coord=ctx.coord)
        )
        """``interval="auto"``'s schedule (auto_interval.py); None for other intervals."""
        self._resumed_at: float | None = None
        """When ``resume()`` ended, until the first step after it (its event)."""
        events.started(
            rank=ctx.rank,
            world_size=ctx.world_size,
            attempt=os.environ.get(envvars.ATTEMPT, "").strip() or None,
        )

    # ------------------------------------------------------------------ live position
    timestamp = _position_field("timestamp", "The training position (resume restores it).")
    metrics = _position_field("metrics", "Saved with every checkpoint, restored by resume.")
    extras = _position_field(
        "extras", "Tensors and plain Python values to save and restore with the run."
    )

    @property
    def saved(self) -> list[SavedCheckpoint]:
        """Checkpoints this process committed, oldest first."""
        return self.saver.saved

    @property
    def skipped_saves(self) -> int:
        """Async saves skipped (``async_policy="skip"``) while one was still persisting."""
        return self.saver.skipped_saves

    # ------------------------------------------------------------------ the loop
    def batch_end(self, num_samples: int | None = None) -> SavedCheckpoint | None:
        """Count one finished batch and save if the interval (or a preemption) says so.

        ``num_samples`` is the *global* batch size: the samples all ranks consumed together.
        The batch is counted before a background save's failure is raised, so a loop that
        catches the error and goes on keeps its position.
        """
        self.saver.release_hook_if_done()
        num_samples = global_batch(num_samples)
        if num_samples is None and self.interval.needs_samples:
            raise ConfigError(
                "interval counts samples, so batch_end() needs num_samples= (the global batch size)"
            )
        if num_samples is None and self.sampler is not None and self.sampler.batch_size is None:
            # Refused before anything is counted: the step would move and the data would not.
            raise ConfigError(
                "batch_end() without num_samples= cannot advance the sampler's data position: "
                "pass num_samples= (the global batch size) or ResumableSampler(batch_size=...)"
            )
        before = self._ctx.position.count_batch(num_samples)
        if self.sampler is not None:
            self.sampler.advance(num_samples)
        if self.progress is not None:
            self.progress.step(self.timestamp.batch, self.timestamp.sample)
        if self._resumed_at is not None:
            if self.rank == 0:
                since = time.monotonic() - self._resumed_at
                events.first_step(rank=0, step=self.timestamp.batch, seconds=since)
            self._resumed_at = None
        self._collect_background_failure()
        return self._loop_point(before, Event.BATCH_END)

    def epoch_end(self) -> SavedCheckpoint | None:
        """Count one finished epoch (before a background failure is raised, as batch_end) and
        save if the interval (or a preemption) says so."""
        before = self._ctx.position.count_epoch()
        if self.total_work.epoch_ended(self.timestamp.batch, self.timestamp.epoch):
            self._report_total()
        if self.sampler is not None:
            self.sampler.set_epoch(self.timestamp.epoch)
        self._collect_background_failure()
        return self._loop_point(before, Event.EPOCH_END)

    def _collect_background_failure(self) -> None:
        """Raise a background save's failure; after SIGTERM, log it instead: the emergency
        save this step makes writes the same state, and raising would skip it."""
        if self.preemption.terminating:
            self.saver.retry_after_failure("SIGTERM: the emergency save", block=False)
        else:
            self.saver.raise_background_failure()

    def _loop_point(self, before: Timestamp, event: Event) -> SavedCheckpoint | None:
        """Shared tail of batch_end/epoch_end: preemption first, then the save schedule."""
        saved = self._response.at_step_boundary(self.timestamp.batch)
        auto = self.auto_interval
        if auto is not None:
            auto.observe(self.saver.saved)
            if saved is not None:
                auto.saving()
            if event is Event.BATCH_END and auto.due():  # every rank, every step: a collective
                auto.saving()
                return self.save() or saved
            return saved
        if self.interval.should_save(self.timestamp, before, event):
            return self.save() or saved
        return saved

    def _report_total(self) -> None:
        if self.progress is not None:
            self.progress.total(self.total_work.known())

    # ------------------------------------------------------------------ saving
    def save(self, *, blocking: bool | None = None) -> SavedCheckpoint | None:
        """Save now. Async managers return None at once and commit in the background."""
        return self.saver.save(blocking=blocking, closed=self._closed)

    def wait_for_snapshot(self) -> None:
        """Block until an async save has copied the state (before editing weights by hand)."""
        self.saver.wait_for_snapshot()

    def wait(self) -> None:
        """Block until any background save has committed and retention has deleted the
        checkpoints it uncommitted; raise if the save failed."""
        self.saver.wait()

    def steps(self, total: int) -> range:
        """The step numbers a step-based loop (no epochs) still has to run: from the resumed
        position (``timestamp.batch``) up to ``total``, excluded. The end is tested before each
        step, so a re-run of a finished job trains no step; ``total`` that is not an int >= 0
        is a ``ConfigError``. ``total`` is also the job's total work from then on (the progress
        report's ``total_steps``)."""
        end = arguments.integer("steps(total)", total, "a number of steps >= 0", lambda n: n >= 0)
        if end and end != self.total_work.steps:
            self.total_work.steps = end
            self._report_total()
        return range(min(self.timestamp.batch, end), end)

    # ------------------------------------------------------------------ loading
    def resume(self) -> ResumeResult:
        """Restore the newest state this run may continue from.

        Order: the newest checkpoint in the run folder that verifies on every rank (older ones
        when newer are torn, incomplete or quarantined), then the object store, then
        ``load_path``, else a fresh start.
        """
        self.saver.release_staging_buffers()
        result = self.resumer.resume()
        self._resumed_at = time.monotonic()
        return result

    def load(
        self,
        path: str | os.PathLike[str],
        *,
        weights_only: bool = False,
        strict: bool = True,
        ignore_keys: Sequence[str] = (),
    ) -> None:
        """Load a checkpoint folder (verified against its manifest), a run folder (its newest
        valid checkpoint) or a single file (unverified): a format-1 rank file, or a plain model
        ``state_dict`` (weights only); any other file raises ``NoCheckpointError``."""
        self.saver.release_staging_buffers()  # the load reads into them
        self.loader.load(path, weights_only=weights_only, strict=strict, ignore_keys=ignore_keys)

    # ------------------------------------------------------------------ shutdown
    def close(self, *, save: bool | None = None, upload_timeout_s: float | None = None) -> None:
        """End of training: save the final state, wait for it, flush uploads, release
        resources (the two coordination groups included). Idempotent; call it on every rank.

        ``save`` (default: the constructor's ``final_save``, True) saves unless nothing
        happened since the last save or resume, so a finished run's checkpoint is its final
        state and a re-run of it trains no step. ``upload_timeout_s`` bounds the upload flush
        (default ``upload_flush_timeout_s``).
        """
        if self._closed:
            return
        try:
            if self.settings.final_save if save is None else save:
                self._save_final()
        finally:
            self._closed = True
            if self.progress is not None:
                self.progress.close()
            try:
                self.wait()
            finally:
                self.saver.shutdown()
                try:
                    if self.remote is not None:
                        timeout = upload_timeout_s
                        if timeout is None:
                            timeout = self.settings.upload_flush_timeout_s
                        close_remote(self.remote, timeout)
                finally:
                    self._release_groups()
                    # SIGTERM stays handled until the uploads are flushed: a signal during the
                    # flush starts the watchdog's clock, so the uploads get the grace period
                    # and the process ends with the preemption exit code at its deadline,
                    # instead of dying at once by the default action.
                    self.preemption.close()
                    self._response.watchdog.close()  # idle: ended; signalled: keeps its deadline

    def _release_groups(self) -> None:
        """Destroy both coordination groups, once no save thread of this rank can use them."""
        if self.saver.persisting():
            return  # still persisting (close interrupted): leave them to the process's end
        self.coord.close()
        self.commit_coord.close()

    def _save_final(self) -> None:
        ts = self.timestamp
        if ts.batch == 0 and ts.sample == 0:
            return  # no step trained (epoch_end() alone counts none): no checkpoint of it
        self.saver.retry_after_failure("the final save")  # one in flight, or one that failed
        saved = self.save(blocking=True)
        if saved is not None:
            log.info("final checkpoint %s at epoch %d batch %d", saved.name, ts.epoch, ts.batch)

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # After an exception the state may be mid-step: no final save then.
        self.close(save=None if exc_type is None else False)
