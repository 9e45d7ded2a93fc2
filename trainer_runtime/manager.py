"""CheckpointManager: the runtime's public face inside a training loop.

It owns the save schedule, the commit protocol (every rank's file durable, then the manifest,
then the pointer and links), retention, async saves and autoresume. Everything it needs to know
inside a managed pod comes from the environment (``envvars``); explicit arguments win.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import os
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from . import envvars, events, naming, rejection, resume
from . import state as state_mod
from .atomic import makedirs_durable, write_bytes_atomic
from .commit import write_and_commit
from .config import AsyncPolicy, Settings
from .dist import Coordinator
from .errors import (
    ConfigError,
    CorruptCheckpointError,
    NoCheckpointError,
    OverwriteError,
    SaveFailedError,
    WorldSizeMismatchError,
)
from .layout import RunFolder
from .manifest import MANIFEST_NAME, Manifest
from .objectstore.errors import ChecksumMismatchError, ObjectNotFoundError
from .preemption import DEFAULT_EXIT_CODE, PreemptionWatcher
from .progress import ProgressReporter
from .remote import RemoteBackend
from .reporting import report_commit
from .resume import QUARANTINE_REASON, Decision
from .retention import select_for_deletion
from .sampler import ResumableSampler
from .sharded.checkpointer import check_files_present
from .sharded.engine import MODEL_KEY, ShardedEngine
from .shutdown import ExitWatchdog, ShutdownDeadline, exit_now
from .timestamp import Event, IntervalFn, Timestamp
from .verified_load import VerifiedFile, read_verified, read_whole

log = logging.getLogger("trainer_runtime")
RUNTIME_KEY = "_trainer_runtime"
"""Key in the saved extras for the runtime's own bookkeeping (hidden from users)."""


@dataclass
class ResumeResult:
    """What ``resume()`` did: where the state came from and the restored position."""

    source: Literal["fresh", "checkpoint", "remote", "load_path"]
    path: str | None
    timestamp: Timestamp
    fallbacks: list[str] = field(default_factory=list)
    """One line per newer checkpoint that was passed over, with the reason."""


@dataclass
class SavedCheckpoint:
    name: str
    path: Path
    timestamp: Timestamp
    duration_s: float


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


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
        cfg = Settings.resolve(
            folder=folder,
            filename=filename,
            latest_filename=latest_filename,
            run_name=run_name,
            interval=interval,
            num_checkpoints_to_keep=num_checkpoints_to_keep,
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
            notice_file=notice_file,
            grace_period_s=grace_period_s,
            upload_flush_timeout_s=upload_flush_timeout_s,
            final_save=final_save,
        )
        self.settings = cfg
        self.interval = cfg.interval
        self.templates = cfg.templates
        self.components = state_mod.Components(
            model=model,
            optimizers=state_mod.named(optimizer, "optimizer"),
            schedulers=state_mod.named(scheduler, "scheduler"),
            scaler=scaler,
            stateful={**(stateful or {}), **({"sampler": sampler} if sampler else {})},
        )
        self.sampler = sampler
        self.ignore_data_position = cfg.ignore_data_position
        self.data_skip_steps = cfg.data_skip_steps
        self.elastic = cfg.elastic
        self.global_batch_size = cfg.global_batch_size
        # Two channels: the training thread's (resume, per-step preemption agreement) and the
        # commit channel, used by whichever thread persists a save. Sharing one gloo group
        # between threads would interleave collectives differently on different ranks.
        self.coord = Coordinator(coordination_timeout)
        self.commit_coord = Coordinator(coordination_timeout)
        self.rank, self.world_size = self.coord.rank, self.coord.world_size

        run_name = cfg.run_name
        if run_name is None:  # a throwaway run (autoresume=False): one name for every rank
            run_name = self.coord.broadcast(
                f"run-{datetime.now(UTC):%Y%m%d-%H%M%S}-{os.urandom(3).hex()}"
            )
        self.run_name = run_name
        rendered = self.templates.render_folder(run_name)
        if _is_remote(rendered):
            if remote is not None:
                raise ConfigError("pass either an s3:// folder or remote=..., not both")
            self.run_dir = _staging_dir(rendered, local_folder)
            remote = _open_s3(
                rendered,
                rank=self.rank,
                world_size=self.world_size,
                keep_local=num_local_checkpoints_to_keep,
                keep_remote=num_remote_checkpoints_to_keep,
            )
        else:
            self.run_dir = Path(rendered)
        self.folder = RunFolder(self.run_dir)

        self.num_checkpoints_to_keep = cfg.num_checkpoints_to_keep
        self.weights_only = cfg.weights_only
        self.overwrite = cfg.overwrite
        self.autoresume = cfg.autoresume
        self.resume_from = cfg.resume_from
        self.load_path = cfg.load_path
        self.load_weights_only = cfg.load_weights_only
        self.load_strict = cfg.load_strict
        self.load_ignore_keys = cfg.load_ignore_keys
        self.async_save = cfg.async_save
        self.async_policy: AsyncPolicy = cfg.async_policy
        self.trusted_pickle = cfg.trusted_pickle
        self.quarantined = set(cfg.quarantined)
        self.remote = remote
        self.grace_period_s = cfg.grace_period_s
        self.preemption_exit_code = preemption_exit_code
        self.final_save = cfg.final_save
        self.upload_flush_timeout_s = cfg.upload_flush_timeout_s
        """None: the remote's own bound (120 s) at close, what is left of the grace period
        on the emergency path."""
        self.preemption = PreemptionWatcher(
            notice_file=cfg.notice_file, handle_sigterm=handle_sigterm
        )
        self._notices_handled = 0
        self._remote_rejected: list[tuple[str, str]] = []
        self._verified: tuple[str, list[VerifiedFile]] | None = None
        """(checkpoint, this rank's files) read while resume verified it, kept for the load."""
        self._loaded: str | None = None
        """Version-2 checkpoint resume loaded while choosing it (verification is the load)."""
        self.progress = ProgressReporter() if self.rank == 0 else None

        self.timestamp = Timestamp()
        self.metrics: dict[str, Any] = {}
        self.extras: dict[str, Any] = {}
        self.saved: list[SavedCheckpoint] = []
        self.skipped_saves = 0
        self._last_saved_key: tuple | None = None
        self._last_global_batch: int | None = global_batch_size
        self._checked_newer = False
        self._clock_start = time.monotonic()
        self._wall_base = 0.0

        self._executor: ThreadPoolExecutor | None = None
        self.engine = ShardedEngine(
            # DDP/compile wrappers off: keys are the plain model's (FSDP2 adds no wrapper)
            dataclasses.replace(
                self.components, model=None if model is None else state_mod.unwrap(model)
            ),
            self.coord,
            commit_coord=self.commit_coord,
            trusted_pickle=trusted_pickle,
        )
        self._pending: Future[SavedCheckpoint] | None = None
        self._pending_name: str | None = None
        self._snapshot_done: threading.Event | None = None
        self._hook: Any = None
        self._closed = False

        self._prepare_folder()

    # ------------------------------------------------------------------ setup
    def _prepare_folder(self) -> None:
        """Fail now, not at the first save, if the folder is unusable or someone else's."""
        try:
            makedirs_durable(self.run_dir)
            probe = self.run_dir / f".write-probe-{self.rank}-{os.getpid()}"
            write_bytes_atomic(probe, b"ok")
            probe.unlink()
        except OSError as exc:
            blocker = _file_in_the_way(self.run_dir)
            if blocker is not None:
                raise ConfigError(
                    f"checkpoint folder {str(self.run_dir)!r} cannot be created: "
                    f"{str(blocker)!r} is a file, not a folder; pass folder= a folder path"
                ) from exc
            raise ConfigError(
                f"checkpoint folder {str(self.run_dir)!r} is not writable: {exc.strerror or exc}"
            ) from exc
        foreign = sorted({m.run_name for m in self.folder.committed()} - {self.run_name})
        if foreign and not self.overwrite:
            raise OverwriteError(
                f"checkpoint folder {str(self.run_dir)!r} holds checkpoints of other run(s) "
                f"{', '.join(foreign)}; use another folder or run_name, or pass overwrite=True"
            )

    # ------------------------------------------------------------------ progress
    def _values(self) -> dict[str, Any]:
        ts = self.timestamp
        return {
            "run_name": self.run_name,
            "world_size": self.world_size,
            "rank": self.rank,
            "local_rank": self.coord.local_rank,
            "epoch": ts.epoch,
            "batch": ts.batch,
            "sample": ts.sample,
            "batch_in_epoch": ts.batch_in_epoch,
            "sample_in_epoch": ts.sample_in_epoch,
        }

    def _wall_time(self) -> float:
        return self._wall_base + (time.monotonic() - self._clock_start)

    def batch_end(self, num_samples: int | None = None) -> SavedCheckpoint | None:
        """Count one finished batch and save if the interval (or a preemption) says so.

        ``num_samples`` is the *global* batch size: the samples all ranks consumed together.
        """
        self._raise_background_failure()
        self._release_hook_if_done()
        if num_samples is None and self.interval.needs_samples:
            raise ConfigError(
                "interval counts samples, so batch_end() needs num_samples= (the global batch size)"
            )
        before = self.timestamp.copy()
        ts = self.timestamp
        ts.batch += 1
        ts.batch_in_epoch += 1
        ts.sample += num_samples or 0
        ts.sample_in_epoch += num_samples or 0
        ts.wall_time = self._wall_time()
        if num_samples is not None:
            self._last_global_batch = num_samples
        if self.sampler is not None:
            self.sampler.advance(num_samples)
        if self.progress is not None:
            self.progress.step(ts.batch)
        return self._loop_point(before, Event.BATCH_END)

    def epoch_end(self) -> SavedCheckpoint | None:
        self._raise_background_failure()
        before = self.timestamp.copy()
        ts = self.timestamp
        ts.epoch += 1
        ts.batch_in_epoch = 0
        ts.sample_in_epoch = 0
        ts.wall_time = self._wall_time()
        if self.sampler is not None:
            self.sampler.set_epoch(ts.epoch)
        return self._loop_point(before, Event.EPOCH_END)

    def _loop_point(self, before: Timestamp, event: Event) -> SavedCheckpoint | None:
        """Shared tail of batch_end/epoch_end: preemption first, then the save schedule."""
        saved = self._handle_preemption()
        if self.interval.should_save(self.timestamp, before, event):
            return self.save() or saved
        return saved

    # ------------------------------------------------------------------ preemption
    def _handle_preemption(self) -> SavedCheckpoint | None:
        """At a step boundary: agree with every rank on SIGTERM / notices, then act."""
        local = [1 if self.preemption.terminating else 0, self.preemption.poll_notice()]
        terminating, notices = self.coord.max_ints(local)
        if terminating:
            self._emergency_exit()
        if notices > self._notices_handled:
            self._notices_handled = notices
            log.warning("preemption notice: saving now and training on")
            events.notice(
                rank=self.rank, content=self.preemption.last_notice, step=self.timestamp.batch
            )
            return self.save(blocking=True)
        return None

    def _emergency_exit(self) -> None:
        """Save, give uploads what is left of the grace period, exit 143 before the SIGKILL."""
        deadline = ShutdownDeadline(
            self.preemption.sigterm_at or time.monotonic(), self.grace_period_s
        )
        watchdog = ExitWatchdog(deadline, self.preemption_exit_code)
        log.warning(
            "SIGTERM: saving at batch %d before exiting (exit within %.1fs of the signal: "
            "grace period %.0fs minus a %.1fs margin)",
            self.timestamp.batch,
            deadline.exit_by - deadline.signalled_at,
            deadline.grace_period_s,
            deadline.margin_s,
        )
        events.sigterm(
            rank=self.rank, step=self.timestamp.batch, grace_period_s=deadline.grace_period_s
        )
        saved = None
        saved_after = None
        try:
            self.wait()
            saved = self.save(blocking=True)
            saved_after = deadline.since_signal()
            upload_first = getattr(self.remote, "upload_first", None)
            if saved is not None and upload_first is not None:
                upload_first(saved.name)
        finally:
            budget = deadline.upload_budget()
            if self.upload_flush_timeout_s is not None:
                budget = min(budget, self.upload_flush_timeout_s)
            self.close(save=False, upload_timeout_s=budget)
        where = saved.name if saved else "the checkpoint already saved at this step"
        log.warning(
            "emergency save %s done %.2fs after SIGTERM (grace period %.0fs)",
            where,
            saved_after if saved_after is not None else 0.0,
            deadline.grace_period_s,
        )
        events.emergency_saved(
            rank=self.rank,
            checkpoint=saved.name if saved else None,
            step=self.timestamp.batch,
            seconds=saved_after,
            grace_period_s=deadline.grace_period_s,
        )
        log.warning(
            "exiting %.2fs after SIGTERM (uploads flushed or left for the next attempt)",
            deadline.since_signal(),
        )
        if saved_after is not None and saved_after > 0.8 * deadline.grace_period_s:
            log.warning(
                "the emergency save took %.0f%% of the grace period: raise "
                "terminationGracePeriodSeconds or save more often",
                100 * saved_after / deadline.grace_period_s,
            )
        watchdog.cancel()
        if getattr(self.remote, "transfers_stuck", lambda: False)():
            exit_now(self.preemption_exit_code)  # SystemExit would wait for the stuck thread
        raise SystemExit(self.preemption_exit_code)

    # ------------------------------------------------------------------ saving
    def save(self, *, blocking: bool | None = None) -> SavedCheckpoint | None:
        """Save now. Async managers return None at once and commit in the background."""
        self._raise_background_failure()
        if self._closed:
            raise SaveFailedError("save() called after close()")
        self.timestamp.wall_time = self._wall_time()
        key = tuple(self.timestamp.to_dict()[k] for k in ("epoch", "batch", "sample"))
        if key == self._last_saved_key:
            return None  # nothing new since the last save
        use_async = self.async_save if blocking is None else not blocking
        if self._pending is not None and not self._pending.done():
            if use_async and self.async_policy == "skip":
                self.skipped_saves += 1
                log.info(
                    "save at batch %d skipped: previous save %s still persisting",
                    self.timestamp.batch,
                    self._pending_name,
                )
                return None
            self.wait()
        self._check_newer_checkpoints()
        started = time.monotonic()
        checkpoint, _ = self.templates.render_checkpoint(self._values())
        if checkpoint in self.quarantined:
            # Same position as a quarantined checkpoint: a new name, or resume would skip it.
            checkpoint = f"{checkpoint}-a{_env(envvars.ATTEMPT) or os.getpid()}"
        latest = self.templates.render_latest(self._values())
        # Live tensor references plus this rank's small state, already serialized.
        data = self.engine.capture(
            timestamp=self.timestamp.to_dict(),
            run_name=self.run_name,
            metrics=dict(self.metrics),
            extras={**self.extras, RUNTIME_KEY: {"global_batch_size": self._last_global_batch}},
            weights_only=self.weights_only,
        )
        ts = self.timestamp.copy()
        self._last_saved_key = key
        if not use_async:  # written before training continues: no copy needed
            return self._persist(
                state=data,
                staged_keys=None,
                ts=ts,
                checkpoint=checkpoint,
                latest=latest,
                started=started,
            )
        data = self._copy_buffers(data)
        done = threading.Event()
        self._snapshot_done = done
        self._hook = register_optimizer_step_pre_hook(lambda *_: _wait_quietly(done))
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="rtj-save")

        def background() -> SavedCheckpoint:
            try:  # at full priority: the next optimizer step may be waiting for this copy
                snapshot, keys = self.engine.stage(data)
            finally:
                done.set()
            _yield_cpu_to_training()
            return self._persist(
                state=snapshot,
                staged_keys=keys,
                ts=ts,
                checkpoint=checkpoint,
                latest=latest,
                started=started,
            )

        self._pending_name = checkpoint
        self._pending = self._executor.submit(background)
        self._pending.add_done_callback(self._note_failure)
        return None

    def _copy_buffers(self, data: dict[str, Any]) -> dict[str, Any]:
        """Copy the model's buffers now: the forward pass (BatchNorm statistics) changes them
        before the next ``optimizer.step()``, the point where staging is waited for."""
        model = self.components.model
        if model is None or MODEL_KEY not in data:
            return data
        ptrs = {_storage(b) for b in model.buffers()}
        if not ptrs:
            return data
        tree = dict(data)
        tree[MODEL_KEY] = {
            k: v.clone() if isinstance(v, torch.Tensor) and _storage(v) in ptrs else v
            for k, v in data[MODEL_KEY].items()
        }
        return tree

    def _note_failure(self, fut: Future[SavedCheckpoint]) -> None:
        """Log at once; the error itself is raised by the next call into the manager."""
        exc = fut.exception()
        if exc is not None:
            log.error("background save failed (raised at the next call): %s", exc)

    def _raise_background_failure(self) -> None:
        fut = self._pending
        if fut is None or not fut.done():
            return
        self._pending = None
        exc = fut.exception()
        if exc is not None:
            raise SaveFailedError(f"a background save failed: {exc}") from exc

    def _release_hook_if_done(self) -> None:
        if (
            self._hook is not None
            and self._snapshot_done is not None
            and self._snapshot_done.is_set()
        ):
            self._hook.remove()
            self._hook = None

    def wait_for_snapshot(self) -> None:
        """Block until an async save has copied the state (before editing weights by hand)."""
        if self._snapshot_done is not None:
            self._snapshot_done.wait()
        self._release_hook_if_done()

    def wait(self) -> None:
        """Block until any background save has committed; raise if it failed."""
        if self._pending is not None:
            self._pending.exception()  # waits without raising
        self._release_hook_if_done()
        self._raise_background_failure()

    def _check_newer_checkpoints(self) -> None:
        if self._checked_newer:
            return
        newer = [
            m
            for m in self.folder.committed()
            if m.timestamp.sort_key()[:3] > self.timestamp.sort_key()[:3]
        ]
        if newer and not self.overwrite:
            top = newer[0]
            raise OverwriteError(
                f"{str(self.run_dir)!r} holds checkpoint {top.name} (batch {top.timestamp.batch}) "
                f"newer than the current position (batch {self.timestamp.batch}); resume from "
                "it (autoresume=True) or pass overwrite=True to discard newer checkpoints"
            )
        self.coord.barrier()
        if newer and self.rank == 0:
            for m in newer:
                log.warning("overwrite=True: uncommitting newer checkpoint %s", m.name)
                self.folder.uncommit(m.name)
        self.coord.barrier()
        self._checked_newer = True

    def _persist(
        self,
        *,
        state: dict[str, Any],
        staged_keys: set[str] | None,
        ts: Timestamp,
        checkpoint: str,
        latest: str | None,
        started: float,
    ) -> SavedCheckpoint:
        manifest = write_and_commit(
            self.engine,
            self.folder,
            state=state,
            staged_keys=staged_keys,
            name=checkpoint,
            run_name=self.run_name,
            timestamp=ts,
            weights_only=self.weights_only,
            latest_link=latest,
            started=started,
        )
        saved = SavedCheckpoint(
            checkpoint, self.folder.path(checkpoint), ts, manifest.save_duration_s
        )
        self.saved.append(saved)
        if self.remote is not None:
            self.remote.submit(self.run_dir, manifest, self.rank)
        if self.rank == 0:
            record = report_commit(manifest, self._uri(checkpoint))
            if self.progress is not None:
                self.progress.committed(record)
            events.committed(manifest, str(record["uri"]), rank=self.rank)
        self._apply_retention()
        return saved

    def _uri(self, checkpoint: str) -> str:
        if self.remote is not None:
            return self.remote.uri_for(checkpoint)
        return str(self.run_dir / checkpoint)

    def _apply_retention(self) -> None:
        if self.num_checkpoints_to_keep == -1:
            return
        protected = set() if self.remote is None else self.remote.pending()
        if (
            self._pending_name is not None
            and self._pending is not None
            and not self._pending.done()
        ):
            protected.add(self._pending_name)
        views = self.commit_coord.all_gather((protected, [m.name for m in self.folder.committed()]))
        keep_out = set().union(*(p for p, _ in views))
        listing = views[0][1]  # rank 0's view, newest first, decides for everyone
        doomed = select_for_deletion(listing, keep=self.num_checkpoints_to_keep, protected=keep_out)
        if not doomed:
            return
        for name in doomed:
            self.folder.uncommit(name)
        self.commit_coord.barrier()
        for name in doomed:
            self.folder.remove_tree(name)
        log.info("retention removed %s", ", ".join(doomed))

    # ------------------------------------------------------------------ loading
    def resume(self) -> ResumeResult:
        """Restore the newest state this run may continue from.

        Order: the newest checkpoint in the run folder that verifies on every rank (older ones
        when newer are torn, incomplete or quarantined), then the object store, then
        ``load_path``, else a fresh start.
        """
        fallbacks: list[str] = []
        if self.autoresume:
            if self.resume_from:
                log.info(
                    "resume hint %s (the newest valid checkpoint of %s is used)",
                    self.resume_from,
                    self.run_dir,
                )
            decision = self._agree()
            fallbacks = decision.fallbacks
            self._set_aside(decision)
            if decision.chosen is not None:
                path = self.folder.path(decision.chosen)
                verified, self._verified = self._verified, None
                if self._loaded == decision.chosen:  # version 2: loaded while choosing
                    self._loaded = None
                    return self._resumed("checkpoint", str(path), fallbacks)
                self._load_checkpoint_dir(
                    path,
                    weights_only=False,
                    strict=self.load_strict,
                    ignore_keys=self.load_ignore_keys,
                    files=verified[1] if verified and verified[0] == decision.chosen else None,
                )
                return self._resumed("checkpoint", str(path), fallbacks)
            if self.remote is not None:
                fetched = self._fetch_remote_agreed()
                if self.rank == 0:
                    chosen = None if fetched is None else Manifest.read(fetched).timestamp
                    self._reject_remote(self._remote_rejected, chosen)
                if fetched is not None:
                    self._load_checkpoint_dir(
                        fetched,
                        weights_only=False,
                        strict=self.load_strict,
                        ignore_keys=self.load_ignore_keys,
                    )
                    return self._resumed("remote", str(fetched), fallbacks)
        if self.load_path:
            self.load(
                self.load_path,
                weights_only=self.load_weights_only,
                strict=self.load_strict,
                ignore_keys=self.load_ignore_keys,
            )
            if self.load_weights_only:
                self.timestamp = Timestamp()
            return self._resumed("load_path", self.load_path, fallbacks)
        log.info("starting run %s from scratch (no checkpoint to resume)", self.run_name)
        events.fresh(rank=self.rank, run=self.run_name, world_size=self.world_size)
        self._resubmit_unsynced()
        return ResumeResult("fresh", None, self.timestamp, fallbacks)

    def _fetch_remote_agreed(self) -> Path | None:
        """Rank 0 picks the newest valid remote checkpoint; every rank fetches that one."""
        assert self.remote is not None
        exclude = set(self.quarantined)
        self._remote_rejected = [(q, QUARANTINE_REASON) for q in sorted(self.quarantined)]
        while True:
            found = self.coord.broadcast(
                self.remote.find_newest(exclude=exclude) if self.rank == 0 else None
            )
            if found is None:
                return None
            name, saved_world = found
            path, problem = None, None
            try:  # every file: version 2 spreads each rank's state over all of them
                path = self.remote.fetch(name, self.run_dir, None)
            except (ObjectNotFoundError, ChecksumMismatchError) as exc:
                problem = ("broken", str(exc))
            except Exception as exc:  # the store failed: no silent fresh start
                problem = ("fatal", f"{type(exc).__name__}: {exc}")
            problems = [p for p in self.coord.all_gather(problem) if p is not None]
            fatal = [why for kind, why in problems if kind == "fatal"]
            if fatal:
                raise NoCheckpointError(f"cannot fetch remote checkpoint {name}: {fatal[0]}")
            if not problems:
                assert path is not None
                manifest = Manifest.read(path)
                if not manifest.sharded and saved_world != self.world_size and not self.elastic:
                    raise WorldSizeMismatchError(
                        f"newest remote checkpoint {name} was saved by {saved_world} rank(s) "
                        f"but {self.world_size} are resuming it; pass elastic=True or restart "
                        f"with WORLD_SIZE={saved_world}"
                    )
                return path
            log.warning(
                "remote checkpoint %s is broken (%s); trying an older one", name, problems[0][1]
            )
            exclude.add(name)
            self._remote_rejected.append((name, str(problems[0][1])))

    def _agree(self) -> Decision:
        views = self.coord.all_gather(resume.list_view(self.folder, self.quarantined))

        def verify_everywhere(name: str) -> str | None:
            manifest = Manifest.read(self.folder.path(name))
            if manifest.sharded:  # verified while loading: a failure leaves the state as it was
                reason = self._try_load_sharded(
                    self.folder.path(name),
                    manifest,
                    weights_only=False,
                    strict=self.load_strict,
                    ignore_keys=self.load_ignore_keys,
                )
                self._loaded = name if reason is None else None
                return reason
            # Version 1: the verifying read is also the loading read (buffers kept for it).
            files = self._read_rank_files(self.folder.path(name), manifest, weights_only=False)
            self._verified = (name, files) if not isinstance(files, str) else None
            reasons = self.coord.all_gather(files if isinstance(files, str) else None)
            bad = [(r, why) for r, why in enumerate(reasons) if why]
            if bad:
                self._verified = None
            return None if not bad else "; ".join(why for _, why in bad)

        decision = resume.decide(
            resume.merge(views), self.world_size, verify_everywhere, elastic=self.elastic
        )
        if self.rank == 0:
            for line in decision.fallbacks:
                log.warning("not resuming from %s", line)
        if decision.world_size_conflict is not None:
            name, saved_ws = decision.world_size_conflict
            raise WorldSizeMismatchError(
                f"newest checkpoint {name} in {str(self.run_dir)!r} was saved by {saved_ws} "
                f"rank(s) but {self.world_size} are resuming it; restart with WORLD_SIZE="
                f"{saved_ws}, or start a new run"
            )
        return decision

    def _set_aside(self, decision: Decision) -> None:
        """Move the checkpoints resume passed over into ``rejected/`` and delete leftovers
        (``rejection.py``), locally and in the bucket, so they do not block the run. Rank 0
        first (a shared folder), then each other rank on its own disk; every rank takes part
        in the barriers, since the decision is the same everywhere."""
        chosen = (
            None if decision.chosen is None else Manifest.read(self.folder.path(decision.chosen))
        )
        for turn in ("rank 0", "others"):
            if (self.rank == 0) == (turn == "rank 0"):
                for name, why in decision.rejected:
                    rejection.move_aside(self.folder, name, why)
                for name, why in decision.leftovers:
                    rejection.remove_leftover(self.folder, name, why)
                if self.rank == 0:
                    self._repoint(chosen, {n for n, _ in decision.rejected})
                if self.rank == 0 and chosen is not None:
                    # Without a local choice the bucket decides (_fetch_remote_agreed), and
                    # rejects what it passes over itself.
                    quarantined = [(q, QUARANTINE_REASON) for q in sorted(self.quarantined)]
                    self._reject_remote([*decision.rejected, *quarantined], chosen.timestamp)
            self.coord.barrier()

    def _repoint(self, chosen: Manifest | None, rejected: set[str]) -> None:
        stale = rejection.repoint(self.folder, chosen)
        if stale is not None and stale not in rejected:
            log.warning(
                "latest.json named %s, which is not a valid checkpoint in %s; it now names %s "
                "(resume lists the folder and does not trust the pointer)",
                stale,
                self.run_dir,
                chosen.name if chosen is not None else "nothing",
            )

    def _reject_remote(self, rejected: list[tuple[str, str]], chosen: Timestamp | None) -> None:
        """Uncommit, in the bucket, rejected checkpoints newer than the resume position."""
        reject = getattr(self.remote, "reject", None)
        if reject is None or not rejected:
            return
        for name, why in dict(rejected).items():
            try:
                reject(name, why, newer_than=chosen or Timestamp())
            except Exception as exc:  # the store is down: the run still goes on
                log.warning(
                    "object store: could not set rejected checkpoint %s aside: %s", name, exc
                )

    def _resubmit_unsynced(self) -> None:
        """Queue local checkpoints a killed attempt committed but never uploaded."""
        resubmit = getattr(self.remote, "resubmit_unsynced", None)
        if resubmit is not None:
            queued = resubmit(self.run_dir)
            if queued:
                log.info("re-uploading local checkpoints the store lacks: %s", ", ".join(queued))

    def _resumed(self, source: Any, path: str, fallbacks: list[str]) -> ResumeResult:
        self._resubmit_unsynced()
        self._wall_base = self.timestamp.wall_time
        self._clock_start = time.monotonic()
        self._mark_state_as_saved()
        log.info(
            "resumed run %s from %s at epoch %d batch %d",
            self.run_name,
            path,
            self.timestamp.epoch,
            self.timestamp.batch,
        )
        events.resumed(
            rank=self.rank,
            run=self.run_name,
            source=source,
            path=path,
            uri=self._uri(Path(path).name) if source == "remote" else path,
            step=self.timestamp.batch,
            epoch=self.timestamp.epoch,
            fallbacks=fallbacks,
            world_size=self.world_size,
        )
        return ResumeResult(source, path, self.timestamp.copy(), fallbacks)

    def _mark_state_as_saved(self) -> None:
        """The live state equals a checkpoint on disk: a save now would only copy it."""
        self._last_saved_key = tuple(
            self.timestamp.to_dict()[k] for k in ("epoch", "batch", "sample")
        )

    def load(
        self,
        path: str | os.PathLike[str],
        *,
        weights_only: bool = False,
        strict: bool = True,
        ignore_keys: Sequence[str] = (),
    ) -> None:
        """Load a checkpoint folder (verified against its manifest), a run folder (its newest
        valid checkpoint) or a single checkpoint file (unverified)."""
        if _is_remote(str(path)):
            path = self._fetch_remote_load_path(str(path), weights_only)
        p = Path(path)
        if p.is_file():
            whole = read_whole(p)
            self._restore(
                whole.load(trusted=self.trusted_pickle),
                weights_only=weights_only,
                strict=strict,
                ignore_keys=ignore_keys,
            )
            whole.release_unused()
            return
        if (p / MANIFEST_NAME).exists():
            self._load_checkpoint_dir(
                p, weights_only=weights_only, strict=strict, ignore_keys=ignore_keys
            )
            return
        if p.is_dir():
            folder = RunFolder(p)
            for m in folder.committed():
                if m.sharded:
                    reason = self._try_load_sharded(
                        p / m.name,
                        m,
                        weights_only=weights_only,
                        strict=strict,
                        ignore_keys=ignore_keys,
                    )
                    if reason is None:
                        return
                    log.warning("load path: skipping %s: %s", m.name, reason)
                    continue
                files = self._read_rank_files(p / m.name, m, weights_only=weights_only)
                if not isinstance(files, str):
                    self._load_checkpoint_dir(
                        p / m.name,
                        weights_only=weights_only,
                        strict=strict,
                        ignore_keys=ignore_keys,
                        files=files,
                    )
                    return
                log.warning("load path: skipping %s: %s", m.name, files)
        raise NoCheckpointError(f"load path {str(path)!r} holds no checkpoint that verifies")

    def _fetch_remote_load_path(self, uri: str, weights_only: bool) -> Path:
        from .objectstore.resolver import fetch_load_path  # noqa: PLC0415 - boto3 on use
        from .objectstore.store import open_store  # noqa: PLC0415

        store, _ = open_store(uri, arg="load_path", write=False)
        local = self.run_dir.parent / ".load-path" / uri.removeprefix("s3://").replace("/", "_")
        # Every file: a version-2 checkpoint's state is spread over all its files.
        return fetch_load_path(store, uri, local, ranks=None)

    def _source_rank(self, manifest: Manifest, weights_only: bool) -> int:
        """Which saved rank's file this rank loads."""
        if manifest.world_size == self.world_size:
            return self.rank
        if weights_only:
            return 0  # model weights are replicated across data-parallel ranks
        if self.elastic:
            # Data-parallel state is replicated; the data position is global (sampler.py).
            return self.rank % manifest.world_size
        raise WorldSizeMismatchError(
            f"checkpoint {manifest.name} was saved by {manifest.world_size} rank(s) but "
            f"{self.world_size} are loading it; pass elastic=True (data-parallel training with "
            f"ResumableSampler), load it with weights_only=True, or resume with "
            f"WORLD_SIZE={manifest.world_size}"
        )

    def _read_rank_files(
        self, folder: Path, manifest: Manifest, *, weights_only: bool
    ) -> list[VerifiedFile] | str:
        """This rank's files of a checkpoint, each read once and checked against the manifest;
        a reason instead when one does not verify (then nothing is deserialized)."""
        rank = self._source_rank(manifest, weights_only)
        files: list[VerifiedFile] = []
        for entry in manifest.files_for_rank(rank):
            got = read_verified(folder, entry)
            if isinstance(got, str):
                return got
            files.append(got)
        return files

    def _load_checkpoint_dir(
        self,
        folder: Path,
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
        files: list[VerifiedFile] | None = None,
    ) -> None:
        """``files``: this rank's files the caller has already read and verified (resume
        does, while choosing the checkpoint); otherwise they are read and verified here. Every
        file verifies before the first one touches the live state."""
        manifest = Manifest.read(folder)
        if manifest.sharded:
            reason = self._try_load_sharded(
                folder, manifest, weights_only=weights_only, strict=strict, ignore_keys=ignore_keys
            )
            if reason is not None:
                raise NoCheckpointError(f"checkpoint {folder} does not load: {reason}")
            return
        if files is None:
            got = self._read_rank_files(folder, manifest, weights_only=weights_only)
            if isinstance(got, str):
                raise NoCheckpointError(f"checkpoint {folder} does not verify: {got}")
            files = got
        for verified in files:
            self._restore(
                verified.load(trusted=self.trusted_pickle),
                weights_only=weights_only or manifest.weights_only,
                strict=strict,
                ignore_keys=ignore_keys,
            )
            # Module weights now live in the parameters; their pages in the buffer are unused.
            verified.release_unused()

    def _try_load_sharded(
        self,
        folder: Path,
        manifest: Manifest,
        *,
        weights_only: bool,
        strict: bool,
        ignore_keys: Sequence[str],
    ) -> str | None:
        """Load a version-2 checkpoint on every rank (collective); the reason when it cannot
        be used, the same on every rank (then the live state is untouched).

        Every rank first checks that every file is present with its recorded size (no read:
        content is verified chunk by chunk during the load); a rank that lacks a file (node-
        local disks without an object store) names it in the reason.
        """
        problems = self.coord.all_gather(check_files_present(folder, manifest))
        missing = [f"rank {r} lacks {why}" for r, why in enumerate(problems) if why]
        if missing:
            return "; ".join(missing)
        keys = self._ignored_keys(ignore_keys)
        try:
            saved, report = self.engine.load(
                folder, manifest, weights_only=weights_only, strict=strict, ignore_keys=keys
            )
        except CorruptCheckpointError as exc:
            return str(exc)
        log.info(
            "loaded %s (saved by %d rank(s); rank state of saved rank %d, rng %s) in %.2fs",
            folder,
            report.saved_world_size,
            report.source_rank,
            report.rng,
            report.seconds,
        )
        self._apply_saved(saved, weights_only=weights_only or manifest.weights_only)
        return None

    def _ignored_keys(self, ignore_keys: Sequence[str]) -> list[str]:
        keys = list(ignore_keys)
        if self.ignore_data_position and self.sampler is not None:
            keys.append("state/stateful/sampler")
        return keys

    def _restore(
        self, data: dict[str, Any], *, weights_only: bool, strict: bool, ignore_keys: Sequence[str]
    ) -> None:
        """Restore one version-1 rank file's contents."""
        saved = state_mod.restore(
            self.components,
            data,
            weights_only=weights_only,
            strict=strict,
            ignore_keys=self._ignored_keys(ignore_keys),
        )
        self._apply_saved(saved, weights_only=weights_only)

    def _apply_saved(self, saved: dict[str, Any], *, weights_only: bool) -> None:
        """The runtime's own part of a restored state: position, metrics, extras."""
        if weights_only:
            return
        if "timestamp" in saved:
            self.timestamp = Timestamp.from_dict(saved["timestamp"])
        self.metrics = dict(saved.get("metrics", {}))
        self.extras = dict(saved.get("extras", {}))
        runtime = self.extras.pop(RUNTIME_KEY, None) or {}
        self._apply_data_overrides(runtime.get("global_batch_size"))
        self._roll_over_finished_epoch()
        self._mark_state_as_saved()

    def _roll_over_finished_epoch(self) -> None:
        """A checkpoint taken after an epoch's last batch (before ``epoch_end()``) resumes at
        the start of the next epoch: the rest of the saved epoch holds no batch, and loops
        that expect at least one batch per epoch would fail on every relaunch."""
        if self.sampler is None or len(self.sampler) > 0:
            return
        ts = self.timestamp
        finished = ts.epoch
        ts.epoch += 1
        ts.batch_in_epoch = ts.sample_in_epoch = 0
        self.sampler.set_epoch(ts.epoch)
        log.info(
            "the checkpoint ends epoch %d (no data left in it): resuming at the start of epoch %d",
            finished,
            ts.epoch,
        )

    def _apply_data_overrides(self, saved_global_batch: int | None) -> None:
        """Changed dataset or batch size: MindSpore-style overrides of the data position."""
        ts = self.timestamp
        if self.ignore_data_position:
            ts.batch_in_epoch = ts.sample_in_epoch = 0
            if self.sampler is not None:
                self.sampler.epoch, self.sampler.offset = ts.epoch, 0
            log.info(
                "ignore_data_position: data restarts at the start of epoch %d, "
                "weights and step kept",
                ts.epoch,
            )
        if self.data_skip_steps and self.sampler is not None:
            self.sampler.advance(
                self.data_skip_steps * self.sampler.batch_size * self.sampler.num_replicas
            )
            log.info("data_skip_steps: skipped %d steps of data", self.data_skip_steps)
        new = self.global_batch_size
        if new and saved_global_batch and new != saved_global_batch:
            ts.batch = ts.sample // new
            ts.batch_in_epoch = ts.sample_in_epoch // new
            log.info(
                "global batch size %d -> %d: step counter rescaled to %d",
                saved_global_batch,
                new,
                ts.batch,
            )

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
            if self.final_save if save is None else save:
                self._save_final()
        finally:
            self._closed = True
            self.preemption.close()
            if self.progress is not None:
                self.progress.close()
            try:
                self.wait()
            finally:
                if self._executor is not None:
                    self._executor.shutdown(wait=True)
                try:
                    self._close_remote(upload_timeout_s)
                finally:
                    self._release_groups()

    def _release_groups(self) -> None:
        """Destroy both coordination groups, once no save thread of this rank can use them."""
        if self._pending is not None and not self._pending.done():
            return  # still persisting (close interrupted): leave them to the process's end
        self.coord.close()
        self.commit_coord.close()

    def _save_final(self) -> None:
        ts = self.timestamp
        if ts.batch == 0 and ts.epoch == 0 and ts.sample == 0:
            return  # nothing trained: no checkpoint of the initial state
        saved = self.save(blocking=True)
        if saved is not None:
            log.info("final checkpoint %s at epoch %d batch %d", saved.name, ts.epoch, ts.batch)

    def _close_remote(self, timeout_s: float | None) -> None:
        if self.remote is None:
            return
        timeout = self.upload_flush_timeout_s if timeout_s is None else timeout_s
        close = self.remote.close
        if timeout is None or "timeout_s" not in inspect.signature(close).parameters:
            close()  # a RemoteBackend with the minimal protocol bounds its flush itself
        else:
            close(timeout_s=timeout)  # type: ignore[call-arg]

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # After an exception the state may be mid-step: no final save then.
        self.close(save=None if exc_type is None else False)


def _file_in_the_way(path: Path) -> Path | None:
    """The nearest existing non-folder on the way to ``path`` (itself included), if any."""
    for p in [path, *path.parents]:
        if p.exists() or p.is_symlink():
            return None if p.is_dir() else p
    return None


def _is_remote(location: str) -> bool:
    return "://" in location


def _staging_dir(run_uri: str, local_folder: str | os.PathLike[str] | None) -> Path:
    """Where checkpoints of an s3:// run are committed locally before upload."""
    if local_folder is not None:
        return Path(local_folder)
    base = _env(envvars.LOCAL_CHECKPOINT_DIR) or os.path.join(
        tempfile.gettempdir(), "rtj-checkpoints"
    )
    scheme, _, rest = run_uri.partition("://")
    return Path(base) / scheme / rest.strip("/")


def _open_s3(run_uri: str, **kw: Any) -> RemoteBackend:
    """Build the object-store backend; bad URI, bucket or credentials fail here, at once."""
    from .objectstore.backend import S3Backend  # noqa: PLC0415 - boto3 only for s3://

    root, _, leaf = run_uri.rstrip("/").rpartition("/")
    if not leaf or root.endswith(":/"):
        raise ConfigError(
            f"folder={run_uri!r}: expected s3://bucket/prefix/{{run_name}} (a run folder inside "
            "a bucket)"
        )
    try:
        return S3Backend(root, leaf, arg="folder", **kw)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _yield_cpu_to_training() -> None:
    """Lower this thread's CPU priority (Linux: per-thread nice) for the rest of its life:
    after the snapshot, writing and hashing should not slow training down."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


def _wait_quietly(event: threading.Event) -> None:
    """Optimizer pre-step hooks must return None."""
    event.wait()


def _storage(t: torch.Tensor) -> int:
    return state_mod.local_tensor(t).untyped_storage().data_ptr()
