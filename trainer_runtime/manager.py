"""CheckpointManager: the runtime's public face inside a training loop.

A facade: it counts the loop (``batch_end``/``epoch_end``), asks the save schedule and the
preemption watcher at each step boundary, and hands the work to parts with one job each:

- ``run/config.py``: constructor arguments and environment, validated once; the run's location;
- ``save/policy.py``: sync and async saves (staging, background persist, failure propagation);
- ``save/commit.py``: the commit protocol (every rank's files, then the manifest, then the pointer);
- ``resume/flow.py`` and ``resume/restore.py``: choosing the checkpoint to continue from, and
  loading it;
- ``save/emergency.py``: the response to a preemption notice or SIGTERM.

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
from types import TracebackType
from typing import Any

from torch import nn

from . import events
from .errors import ConfigError
from .pod import peer_loss
from .pod.preemption import DEFAULT_EXIT_CODE, PreemptionWatcher
from .pod.progress import TotalWork
from .remote import RemoteBackend
from .resume.flow import Resumer, ResumeResult
from .resume.restore import Loader
from .run import arguments
from .run.config import AsyncPolicy, Settings
from .run.context import RunContext, global_batch
from .run.rejoin import rejoin
from .run.setup import release, set_up
from .run.switch_in_place import leave_in_place, switch_in_place
from .sampler import ResumableSampler
from .save import naming
from .save.auto_interval import AutoSchedule
from .save.emergency import PreemptionResponse
from .save.policy import SavedCheckpoint, Saver
from .save.rank_contents import Components
from .save.survivor import SurvivorSave
from .switch import SwitchWatch
from .timestamp import Event, IntervalFn, SaveInterval, Timestamp

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

    # Set by the constructor (manager_setup.set_up), in this order.
    settings: Settings
    components: Components
    interval: SaveInterval
    sampler: ResumableSampler | None
    preemption: PreemptionWatcher
    _ctx: RunContext
    """The run, its channels, its live position: what every part shares (run/context.py). The
    constructor copies its names to the manager (coord, commit_coord, rank, world_size,
    run_name, run_dir, folder, remote, engine, progress)."""
    saver: Saver
    loader: Loader
    resumer: Resumer
    _response: PreemptionResponse
    _closed: bool
    _survivor: SurvivorSave | None
    """Saves the last finished step from memory if a rank is lost (save/survivor.py)."""
    switch_watch: SwitchWatch | None
    """The agent's requests to switch in process (``in_process_switch=True``; switch.py)."""
    _arguments: dict[str, Any]
    """The constructor's arguments: a switch builds the parts again from them."""
    total_work: TotalWork
    """The job's total steps, reported beside the current step (pod/progress.py)."""
    auto_interval: AutoSchedule | None
    """``interval="auto"``'s schedule (save/auto_interval.py); None for other intervals."""
    _resumed_at: float | None
    """When ``resume()`` ended, until the first step after it (its event)."""

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
        in_process_switch: bool = False,
    ) -> None:
        set_up(self, {k: v for k, v in locals().items() if k != "self"})  # run/setup.py

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
        if self._survivor is not None:
            self._survivor.boundary()
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
        if self._survivor is not None:
            self._survivor.boundary()
        self._collect_background_failure()
        return self._loop_point(before, Event.EPOCH_END)

    def rejoin(self, exc: BaseException) -> None:
        """Hand a failed step's exception here (``except Exception as exc: ckpt.rejoin(exc)``,
        beside ``except MembershipSwitched``): after a rank lost without notice the survivors
        re-form the gang in process and return, to train on as after ``MembershipSwitched``;
        anything else, or a loss that cannot be taken in process, raises ``exc`` again
        (run/rejoin.py, docs/survivors.md)."""
        rejoin(self, exc)

    def _collect_background_failure(self) -> None:
        """Raise a background save's failure; after SIGTERM, log it instead: the emergency
        save this step makes writes the same state, and raising would skip it."""
        if self.preemption.terminating:
            self.saver.retry_after_failure("SIGTERM: the emergency save", block=False)
        else:
            self.saver.raise_background_failure()

    def _loop_point(self, before: Timestamp, event: Event) -> SavedCheckpoint | None:
        """Shared tail of batch_end/epoch_end: preemption first, then an in-process switch
        (raised as ``MembershipSwitched``), then the save schedule."""
        saved = self._response.at_step_boundary(self.timestamp.batch)
        request = self._response.switch_request
        if request is not None and request.leave:
            leave_in_place(self, request)  # ends the process
        if request is not None:
            raise switch_in_place(self, request)
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
        if self._survivor is not None:
            self._survivor.close()
        try:
            if self.settings.final_save if save is None else save:
                self._save_final()
        finally:
            self._closed = True
            release(self, upload_timeout_s)  # run/setup.py: set_up's parts, in order

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

    def __exit__(
        self, exc_type: object, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None and self._survivor is not None:
            self._survivor.hold(exc)  # a lost rank: this one may be named to save (survivor_save)
        elif exc is not None:
            peer_loss.failed(exc)  # a failed collective is reported before the worker ends
        # After an exception the state may be mid-step: no final save then.
        self.close(save=None if exc_type is None else False)
