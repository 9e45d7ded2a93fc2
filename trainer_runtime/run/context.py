"""What the parts of ``CheckpointManager`` share: the run (where, who, with what) and its
live position.

The manager is a facade over a saver (``save/policy.py``), a loader (``resume/restore.py``) and a
resumer (``resume/flow.py``). Each needs the same few facts (rank, coordination channels, run
folder, object store, engine, settings) and reads or replaces the same live position (timestamp,
metrics, extras). They get them here, as one ``RunContext`` object, rather than as references back
to the manager: a part can be built and tested without a manager, and what it may touch is spelled
out. (Rejected: passing the manager itself to every part, which makes every attribute of it part of
every part's interface; and copying the position into each part, which would let resume replace a
timestamp the saver still held.)
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CheckpointError, ConfigError
from ..pod import membership
from ..pod.progress import ProgressReporter
from ..remote import as_backend
from ..run_folder.layout import RunFolder
from ..save.fence import Fence
from ..save.rank_contents import Components, unwrap
from ..sharded.engine import ShardedEngine
from ..timestamp import Timestamp
from .config import Settings, locate_run
from .dist import Coordinator
from .gang_sockets import GangSockets

if TYPE_CHECKING:
    from ..remote import CoreBackend, RemoteBackend
    from ..sampler import ResumableSampler
    from ..save.manifest import Manifest

log = logging.getLogger("trainer_runtime")


@dataclass(frozen=True)
class Rank0Outcome:
    """What ``RunContext.on_rank0`` gives every rank."""

    value: Any
    error: str | None
    """Rank 0's failure as ``"<type>: <message>"``, on every rank; None when it succeeded."""
    raised: Exception | None
    """Rank 0's own exception, on rank 0 only."""


RUNTIME_KEY = "_trainer_runtime"
"""Key in the saved extras for the runtime's own bookkeeping (hidden from users)."""


@dataclass
class Position:
    """The live training position and the user's metrics and extras.

    Resume replaces the timestamp object; everyone reads it through this holder, so nobody
    keeps a stale one.
    """

    timestamp: Timestamp = field(default_factory=Timestamp)
    metrics: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)
    last_global_batch: int | None = None
    """The global batch size the last ``batch_end`` reported (saved for resume's rescaling)."""
    last_saved_key: tuple | None = None
    _clock_start: float = field(default_factory=time.monotonic)
    _wall_base: float = 0.0

    def key(self) -> tuple:
        """What makes two saves the same save: epoch, batch and sample."""
        return self.key_of(self.timestamp)

    @staticmethod
    def key_of(ts: Timestamp) -> tuple:
        return (ts.epoch, ts.batch, ts.sample)

    def mark_saved(self, committed: Timestamp | None = None) -> None:
        """A checkpoint of ``committed`` (default: the live position) is on disk: a save at
        that position would only copy it. Only a commit (or a resume) marks a position saved,
        so a failed save is retried by the next ``save()`` or ``close()``."""
        self.last_saved_key = self.key_of(self.timestamp if committed is None else committed)

    def wall_time(self) -> float:
        """Training seconds so far, across attempts (resume restores the saved total)."""
        return self._wall_base + (time.monotonic() - self._clock_start)

    def restart_clock(self) -> None:
        """Continue the wall clock from the (just restored) timestamp's total."""
        self._wall_base = self.timestamp.wall_time
        self._clock_start = time.monotonic()

    def count_batch(self, num_samples: int | None) -> Timestamp:
        """Count one finished batch of ``num_samples`` global samples (None: not counted;
        ``batch_end`` has checked it with ``global_batch``); returns the position before it."""
        before = self.timestamp.copy()
        ts = self.timestamp
        ts.batch += 1
        ts.batch_in_epoch += 1
        ts.sample += num_samples or 0
        ts.sample_in_epoch += num_samples or 0
        ts.wall_time = self.wall_time()
        if num_samples is not None:
            self.last_global_batch = num_samples
        return before

    def count_epoch(self) -> Timestamp:
        """Count one finished epoch; returns the position before it."""
        before = self.timestamp.copy()
        ts = self.timestamp
        ts.epoch += 1
        ts.batch_in_epoch = 0
        ts.sample_in_epoch = 0
        ts.wall_time = self.wall_time()
        return before


@dataclass
class RunContext:
    """One run as every part of the manager sees it (built once, by the manager)."""

    settings: Settings
    coord: Coordinator
    """The training thread's channel (resume, per-step preemption agreement)."""
    commit_coord: Coordinator
    """The channel of whichever thread persists a save (never shared between threads)."""
    run_name: str
    run_dir: Path
    folder: RunFolder
    remote: RemoteBackend | None
    engine: ShardedEngine
    components: Components
    sampler: ResumableSampler | None
    progress: ProgressReporter | None
    position: Position = field(default_factory=Position)
    fence: Fence | None = None
    """The run's fence for this gang's membership epoch (None outside a managed gang)."""

    @property
    def rank(self) -> int:
        return self.coord.rank

    @property
    def world_size(self) -> int:
        return self.coord.world_size

    def template_values(self, at: Timestamp | None = None) -> dict[str, Any]:
        """What the name templates may use (docs/runtime.md), at ``at`` (default: the
        current position)."""
        ts = self.position.timestamp if at is None else at
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

    def on_rank0(self, work: Callable[[], Any]) -> Rank0Outcome:
        """Rank 0 runs ``work`` and every rank gets its value, or the text of its error, at the
        same moment (collective): a failure on rank 0 never leaves the others waiting in a
        collective until rank 0's exit or the coordination timeout."""
        value: Any = None
        raised: Exception | None = None
        if self.rank == 0:
            try:
                value = work()
            except Exception as exc:  # the same outcome on every rank, never a hang
                raised = exc
        error = None if raised is None else f"{type(raised).__name__}: {raised}"
        value, error = self.coord.broadcast((value, error))
        return Rank0Outcome(value, error, raised)

    def remote_committed(self, *, required: bool = True) -> list[Manifest]:
        """The object store's committed checkpoints of this run, newest first, as rank 0 lists
        them (every rank gets the same list; empty without a store). Collective. When the
        store cannot be listed, every rank raises (``required``, after the listing's retries)
        or, after one attempt (the training loop is waiting: a first save's check), logs it
        and gets []."""
        remote = self.remote
        if remote is None:
            return []
        got = self.on_rank0(lambda: remote.committed(attempts=None if required else 1))
        error = got.error
        if error is None:
            return got.value
        if required:
            raise CheckpointError(f"cannot list the object store's checkpoints: {error}")
        log.warning("cannot list the object store's checkpoints (%s); going on without", error)
        return []


def open_run(
    settings: Settings,
    components: Components,
    *,
    sampler: ResumableSampler | None,
    remote: CoreBackend | RemoteBackend | None,
    local_folder: str | os.PathLike[str] | None,
    keep_local: int | None,
    keep_remote: int,
    coordination_timeout: timedelta,
    sockets: GangSockets | None = None,
) -> RunContext:
    """Join the ranks, agree on the run's name, locate its folder (and object store) and
    build the engine: everything the manager's parts share, in that order. The coordination
    groups' connections are added to ``sockets`` (``gang_sockets``)."""
    # Two channels: the training thread's (resume, per-step preemption agreement) and the
    # commit channel, used by whichever thread persists a save. Sharing one gloo group
    # between threads would interleave collectives differently on different ranks.
    with (sockets or GangSockets()).forming():
        coord = Coordinator(coordination_timeout)
        commit_coord = Coordinator(coordination_timeout)
    run_name = settings.run_name
    if run_name is None:  # a throwaway run (autoresume=False): one name for every rank
        run_name = coord.broadcast(f"run-{datetime.now(UTC):%Y%m%d-%H%M%S}-{os.urandom(3).hex()}")
    run_dir, remote = locate_run(
        settings.templates.render_folder(run_name),
        remote=remote,
        local_folder=local_folder,
        rank=coord.rank,
        world_size=coord.world_size,
        keep_local=keep_local,
        keep_remote=keep_remote,
        arg=settings.folder_arg,
    )
    model = components.model
    engine = ShardedEngine(
        # DDP/compile wrappers off: keys are the plain model's (FSDP2 adds no wrapper)
        dataclasses.replace(components, model=None if model is None else unwrap(model)),
        coord,
        commit_coord=commit_coord,
        trusted_pickle=settings.trusted_pickle,
    )
    return RunContext(
        settings=settings,
        coord=coord,
        commit_coord=commit_coord,
        run_name=run_name,
        run_dir=run_dir,
        folder=RunFolder(run_dir),
        remote=as_backend(remote),  # one contract, whatever the user's object offers
        engine=engine,
        components=components,
        sampler=sampler,
        progress=ProgressReporter() if coord.rank == 0 else None,
        position=Position(last_global_batch=settings.global_batch_size),
        fence=_fence(run_dir),
    )


def _fence(run_dir: Path) -> Fence | None:
    """The fence for ``RTJ_MEMBERSHIP_EPOCH`` (save/fence.py); None when the variable is unset."""
    epoch = membership.epoch_from(os.environ)
    return None if epoch is None else Fence(run_dir, epoch)


def global_batch(num_samples: object) -> int | None:
    """``batch_end(num_samples=...)`` checked: None, or a whole number >= 0 as a Python int
    (NumPy's and other integer types included, as every count argument takes them)."""
    if num_samples is None:
        return None
    whole = isinstance(num_samples, numbers.Integral) and not isinstance(num_samples, bool)
    if not whole or num_samples < 0:
        raise ConfigError(
            "batch_end(num_samples=...) must be an int >= 0 (the global batch size), got "
            f"{num_samples!r}"
        )
    return int(num_samples)
