"""Save the last finished step from a survivor's memory when a rank is lost without notice.

A rank lost without notice (its node gone, its process killed) takes every step since the last
commit with it: the other ranks' collectives fail or hang, and the gang resumes from the newest
commit. But in data-parallel training every rank holds the whole state, and from one
``batch_end`` until the next ``optimizer.step()`` begins that state is exactly what a save at that
``batch_end`` would have written. The survivors still hold the last finished step; one of them
writes it, and the new gang loses at most the step that was running.

How, in each worker that ``CheckpointManager`` arms under the in-pod agent:

- **the boundary**: at every ``batch_end`` and ``epoch_end``, once the step is counted and before
  any collective, the manager captures what a save there would write: references to the
  parameters and optimizer state (they stay as they are until the next ``optimizer.step()``),
  copies of the buffers (the forward pass changes them), and the small state serialized (RNG,
  sampler, schedulers, stateful objects, the position). A step pre-hook on every optimizer marks
  the boundary stale from the moment the next update begins.
- **who saves**: the operator gives the pods it keeps the new membership with ``stop: kill``, and
  kept pods take the new gang's first ranks (``savers`` of them hold the state). The local rank 0
  worker of the pod that becomes node rank 0 saves; every other worker just ends. A large state
  is saved in shares by the local rank 0 worker of every saver instead (``survivor_group``: they
  form a group of their own and agree on the step first). So no two survivors write the same
  bytes, and no vote is needed among processes whose group is broken.
- **the save**: a thread of the worker watches the membership file. When a membership names
  this worker, the thread stops the training thread at its next optimizer step or boundary (if
  it still runs: a lost node's processes may be cut off rather than dead), writes the boundary
  as a one-process checkpoint (format version 2 at world size 1, which loads at any world size as
  an elastic resume does) through the usual commit, fenced at the *new* epoch (it writes for the
  new gang, whose workers its agent starts only after it), uploads it when the run is in an
  object store, and ends the process. Its agent waits ``RTJ_SURVIVOR_SAVE_SECONDS`` (120 by
  default) for that before it starts the new workers, which resume from it as from any commit.
- **the failed collective**: the training thread usually learns of the loss first, from a
  collective that fails (a peer's connection closed). Such an exception then waits, up to
  ``RTJ_LOSS_HOLD_SECONDS`` (default ``RTJ_REJOIN_SECONDS``), for the membership instead of
  ending the process at once, so the watching thread can act: in ``CheckpointManager.__exit__``
  or, for a script without ``with``, at exit (the exception seen through ``sys.excepthook``).
  Any other exception ends the process at once, as before: a script's own error may be in the
  state itself.

Nothing is saved, and the gang resumes from the newest commit as before, when: the state is
sharded (DTensor parameters, FSDP: no rank holds it whole); an optimizer is not a
``torch.optim.Optimizer`` (no step hook); the update of the running step had begun and does not
reach its boundary within ``BOUNDARY_WAIT_S``; the boundary is the newest commit already; the run
is not under the agent, or ``RTJ_SURVIVOR_SAVE=0``. Per-rank state other than the saver's own (the
RNG streams of the other ranks, batches they hold in ``Prefetched``) is restored as at a change
of world size (``rng.derived``). (Rejected: every survivor writing its copy to its own disk and
the new gang choosing one: the ranks without it would need it sent, and two writers of one name
need a lock that stores do not offer alike.) A script that hands the failure to
``CheckpointManager.rejoin`` goes on in process instead (``run/rejoin.py``; the membership's
``stop: rejoin``): the training thread claims the loss, and this watch saves only when it does not.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import logging
import os
import pickle
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch.utils._pytree import tree_map

from .. import envvars, events, io_progress
from ..errors import ConfigError
from ..pod import membership, peer_loss
from ..pod.peer_loss import collective_failure
from ..pod.progress import report_commit_once
from ..pod.reporting import report_commit
from ..run import arguments
from ..run.announce import announce
from ..run.dist import Coordinator
from ..sharded.engine import ShardedEngine
from ..sharded.keys import RANKS_KEY
from ..sharded.staging import copy_buffers
from ..timestamp import Timestamp
from . import survivor_group
from .commit import write_and_commit
from .manifest import Manifest
from .policy import position_record
from .rejoin_claim import RejoinClaim

if TYPE_CHECKING:
    from ..remote import RemoteBackend
    from ..run.context import RunContext

log = logging.getLogger("trainer_runtime")

DEFAULT_WAIT_S = 120.0
"""``RTJ_SURVIVOR_SAVE_SECONDS``: how long the save may go without moving a byte (written or
uploaded) before the agent kills the worker; a save that keeps moving bytes is waited for."""
HEARTBEAT_S = 0.5
"""How often the saver tells the agent how many bytes it has moved (through the marker)."""
DEFAULT_HOLD_S = 30.0
"""``RTJ_REJOIN_SECONDS``' default (the agent's): how long the savers' group may take to form
(``form_s``: every saver is alive and asked by then). A failed collective waits
``RTJ_LOSS_HOLD_SECONDS`` (``hold_s``; default: the same) for the membership: as long as the
operator may take to see the loss (a node that died silently: NotReady, then
``nodeNotReadySeconds``)."""
BOUNDARY_WAIT_S = 5.0
"""How long the save waits for a step whose update had begun to reach its ``batch_end``."""
POLL_S = 0.05


class Boundary(NamedTuple):
    """A step boundary as captured: the small state pickled, the tensors (live references, the
    buffers copied), and the position."""

    small: bytes
    tensors: dict[str, Any]
    at: Timestamp


def why_not_replicated(ctx: RunContext) -> str | None:
    """Why this run's state cannot be saved by one rank (None: every rank holds all of it)."""
    comps = ctx.components
    if comps.model is None:
        return "no model is registered"
    dtensor = getattr(getattr(torch.distributed, "tensor", None), "DTensor", None)
    if dtensor is not None and any(isinstance(p, dtensor) for p in comps.model.parameters()):
        return "the parameters are sharded (DTensor): no rank holds them whole"
    for name, opt in comps.optimizers.items():
        if not isinstance(opt, torch.optim.Optimizer):
            return f"optimizer {name!r} is not a torch.optim.Optimizer (no step hook)"
        if type(opt).__name__ == "ZeroRedundancyOptimizer":
            return f"optimizer {name!r} shards its state over the ranks"
    return None


def capture(ctx: RunContext) -> tuple[bytes, dict[str, Any]]:
    """What a save at the current position writes: this rank's small state, pickled (a
    snapshot: ``state_dict()`` may hand out live objects; the checks of a saved state are left
    to the save, where a refusal is said), and the tensor state with live references
    (``ShardedEngine.capture_unserialized``)."""
    small, tensors = ctx.engine.capture_unserialized(
        **position_record(ctx), weights_only=ctx.settings.weights_only
    )
    return pickle.dumps(small, protocol=pickle.HIGHEST_PROTOCOL), tensors


class SurvivorSave:
    """One worker's boundary, its watch on the membership file, and the save it may make."""

    def __init__(
        self,
        ctx: RunContext,
        *,
        marker: Path,
        membership_file: Path,
        epoch: int,
        wait_s: float,
        hold_s: float,
        form_s: float = DEFAULT_HOLD_S,
        split_from: int = survivor_group.DEFAULT_SPLIT_MIB << 20,
        terminating: Callable[[], bool] = lambda: False,
        cut: Callable[[], object] = lambda: None,
    ) -> None:
        self.ctx = ctx
        self.marker = marker
        self.membership_file = membership_file
        self.epoch = epoch
        self.wait_s = wait_s
        self.hold_s, self.form_s = hold_s, form_s
        self.split_from = split_from
        """From this many bytes of state the save is made in shares (``survivor_group``)."""
        self.terminating = terminating
        self._cond = threading.Condition()
        self._boundary: Boundary | None = None
        self._boundary_ready: Any = None
        """A CUDA event recorded at the boundary, when the model is on a CUDA device."""
        model = ctx.components.model
        self._cuda = model is not None and any(p.is_cuda for p in model.parameters())
        self._stepped = False
        """The update of the step after the boundary has begun."""
        self._frozen = False
        """The save has begun: the training thread may not update the weights any more."""
        self._saving = threading.Event()
        self._done = threading.Event()
        """A newer membership came and did not name this worker (or the manager closed)."""
        self._failure: BaseException | None = None
        self._hooks: list[Any] = []
        self._previous_hook: Any = None
        self._thread: threading.Thread | None = None
        self.rejoin = RejoinClaim(cut)
        """A loss taken in process by the training thread, or saved from here (``stop: rejoin``)."""

    # ------------------------------------------------------------------ arming
    @classmethod
    def arm(
        cls,
        ctx: RunContext,
        terminating: Callable[[], bool],
        cut: Callable[[], object] = lambda: None,
    ) -> SurvivorSave | None:
        """A started ``SurvivorSave`` for a worker under the agent whose state every rank holds;
        None otherwise (said once, by rank 0, when only the state stands in the way)."""
        environ = os.environ
        marker = environ.get(envvars.SURVIVOR_SAVE_FILE, "").strip()
        watched = environ.get(envvars.MEMBERSHIP_FILE, "").strip()
        epoch = membership.epoch_from(environ)
        if not marker or not watched or epoch is None or ctx.world_size < 2:
            return None  # not under the agent, or alone: nobody else to lose
        if environ.get(envvars.SURVIVOR_SAVE, "").strip() == "0":
            return None
        reason = why_not_replicated(ctx)
        if reason is not None:
            if ctx.rank == 0:
                log.info("no save from a survivor's memory after a loss: %s", reason)
            return None
        guard = cls(
            ctx,
            marker=Path(marker),
            membership_file=Path(watched),
            epoch=epoch,
            **_waits(environ),
            split_from=survivor_group.split_from_bytes(environ),
            terminating=terminating,
            cut=cut,
        )
        guard._start()
        return guard

    def _start(self) -> None:
        for opt in self.ctx.components.optimizers.values():
            self._hooks.append(opt.register_step_pre_hook(self._before_step))
        self._previous_hook = sys.excepthook
        sys.excepthook = self._excepthook
        atexit.register(self._at_exit)
        self._thread = threading.Thread(target=self._watch, name="rtj-survivor-save", daemon=True)
        self._thread.start()
        self.marker.write_text(f"{os.getpid()}\n")  # the agent waits for this worker's save

    def close(self) -> None:
        """The training ended by itself (``close()``), or switched in process: nothing to save
        from this watch any more. The watching thread is let finish its poll first, so it
        cannot remove the marker after a new watch wrote it."""
        self._done.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0 + POLL_S)
        with contextlib.suppress(OSError):
            self.marker.unlink()
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_hook
        atexit.unregister(self._at_exit)

    # ------------------------------------------------------------------ the training thread
    def boundary(self) -> None:
        """Called at each step boundary, after the step is counted, before any collective."""
        small, tensors = capture(self.ctx)
        tensors = copy_buffers(self.ctx.components.model, tensors)
        at = self.ctx.position.timestamp.copy()
        ready = None
        if self._cuda:  # the optimizer's kernels of this step, queued before this point
            ready = torch.cuda.Event()
            ready.record()
        with self._cond:
            self._boundary, self._stepped = Boundary(small, tensors, at), False
            self._boundary_ready = ready
            self._cond.notify_all()
            self._park_if_frozen()

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        with self._cond:
            self._park_if_frozen()
            self._stepped = True

    def _park_if_frozen(self) -> None:
        """Holding the condition: wait for good once the save has begun (it ends the process)."""
        while self._frozen:
            self._cond.wait()

    def claim_rejoin(self) -> tuple[bool, Boundary | None]:
        """The training thread takes a loss in process (``run/rejoin.py``): whether it may (no
        save from memory began), and the boundary when no update began since."""
        if not self.rejoin.take():
            return False, None
        with self._cond:
            return True, (None if self._stepped else self._boundary)

    def hold(self, exc: BaseException | None) -> None:
        """After ``exc`` ended the training loop: when it is a failed collective, wait (up to
        ``hold_s``) for the membership, so that this worker, if it is the one named, can save
        before the process ends."""
        self.rejoin.refuse()  # the loop ended: no rejoin in process any more
        if self._done.is_set() or not collective_failure(exc):
            return
        peer_loss.report(os.environ, self.epoch)  # the operator may not know of the loss yet
        announce(
            log,
            logging.WARNING,
            "a collective failed (%s); waiting up to %.0f s for the gang's new membership: "
            "this rank holds the state of step %s",
            " ".join(str(exc).split())[:200],
            self.hold_s,
            "?" if self._boundary is None else self._boundary.at.batch,
            speak=self.ctx.coord.local_rank == 0,
        )
        deadline = time.monotonic() + self.hold_s
        while not self._done.is_set() and not self.terminating():
            if time.monotonic() > deadline and not self._saving.is_set():
                log.warning("no new membership within %.0f s: ending", self.hold_s)
                return
            time.sleep(POLL_S)

    def _excepthook(
        self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        self._failure = exc
        (self._previous_hook or sys.__excepthook__)(kind, exc, tb)

    def _at_exit(self) -> None:
        self.hold(self._failure)

    # ------------------------------------------------------------------ the watching thread
    def _watch(self) -> None:
        while not self._done.is_set():
            try:
                new = membership.read(self.membership_file)
            except (ConfigError, OSError):  # the agent says what is wrong with the file
                new = None
            if new is not None and new.epoch > self.epoch:
                if self._named(new):
                    self._save_and_exit(new)
                with contextlib.suppress(OSError):  # the agent no longer waits for a save
                    self.marker.unlink()
                self._done.set()
                return
            time.sleep(POLL_S)

    def _named(self, new: membership.Membership) -> bool:
        """Whether this worker saves for ``new``: node rank 0's local rank 0, and with a split
        save every saver's (``survivor_group``)."""
        if new.stop == membership.STOP_REJOIN and self.rejoin.awaited():
            return False  # the training thread rejoins in process (run/rejoin.py)
        if new.stop not in membership.LOSS_STOPS or self.ctx.coord.local_rank != 0:
            return False
        return new.node_rank == 0 or (
            new.node_rank < new.savers and survivor_group.splits(self.ctx, new, self.split_from)
        )

    @property
    def stall_s(self) -> float:
        """How long the saver's own upload may go without moving a byte: a little less than
        the agent's bound, so the saver says why before it would be killed."""
        return max(1.0, self.wait_s - 2.0)

    def _reached(self) -> tuple[Any, Any, str | None]:
        """Stop the training thread at its next optimizer step or boundary; the boundary it
        holds, its CUDA event, and why it is not saved (None: it is)."""
        with self._cond:
            self._frozen = True
            reached = self._cond.wait_for(lambda: not self._stepped, BOUNDARY_WAIT_S)
            boundary, ready = self._boundary, self._boundary_ready
        if not reached or boundary is None:
            return boundary, ready, "the running step had begun updating the weights"
        if self.ctx.position.key_of(boundary.at) == self.ctx.position.last_saved_key:
            return boundary, ready, "the last finished step is the newest commit already"
        return boundary, ready, None

    def _savers_group(self, new: membership.Membership, key: Any) -> Coordinator | None:
        """The savers' group when the save for ``new`` is made in shares and every saver holds
        the step ``key`` names; None: node rank 0 saves alone (``survivor_group``)."""
        if not survivor_group.splits(self.ctx, new, self.split_from):
            return None
        coord = survivor_group.form(new, self.form_s)
        if coord is None or not survivor_group.agree(coord, key):
            return None
        return coord

    def _write(
        self, boundary: Any, ready: Any, new: membership.Membership, coord: Coordinator | None
    ) -> str:
        """Write ``boundary`` for ``new``, with the savers of ``coord`` or alone; a shared save
        that fails is made again by node rank 0 alone."""
        small, tensors, at = boundary
        if ready is not None:
            tensors = host_copy(tensors, ready)
        with heartbeat(self.marker):
            try:
                return write_boundary(
                    self.ctx, small, tensors, at, epoch=new.epoch, stall_s=self.stall_s, coord=coord
                )
            except Exception as exc:
                if coord is None or coord.rank != 0:
                    raise
                log.warning("the shared save failed (%s): node rank 0 saves alone", exc)
            return write_boundary(
                self.ctx, small, tensors, at, epoch=new.epoch, stall_s=self.stall_s
            )

    def _save_and_exit(self, new: membership.Membership) -> None:
        self._saving.set()
        began = time.monotonic()
        code, name, why_not, step = 0, None, None, -1
        try:
            boundary, ready, why_not = self._reached()
            if boundary is not None:
                step = boundary.at.batch
            key = None if why_not else self.ctx.position.key_of(boundary.at)
            coord = self._savers_group(new, key)
            if coord is None and new.node_rank != 0:
                why_not = why_not or "the savers did not save together: node rank 0 saves alone"
            elif why_not is None:
                name = self._write(boundary, ready, new, coord)
        except Exception as exc:  # said, and the process ends either way
            why_not, code = f"the save failed: {type(exc).__name__}: {exc}", 1
        seconds = time.monotonic() - began
        if name is not None:
            announce(
                log,
                logging.WARNING,
                "saved step %d from this survivor's memory as %s in %.2f s (membership %d)",
                step,
                name,
                seconds,
                new.epoch,
                speak=True,
            )
        else:
            log.warning("no save from this survivor's memory: %s", why_not)
        events.survivor_saved(
            rank=self.ctx.rank,
            checkpoint=name,
            step=step,
            seconds=seconds,
            epoch=new.epoch,
            why_not=why_not,
        )
        if self.ctx.progress is not None:
            self.ctx.progress.close()
        with contextlib.suppress(OSError):
            self.marker.unlink()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def write_boundary(
    ctx: RunContext,
    small: bytes,
    tensors: dict[str, Any],
    at: Timestamp,
    *,
    epoch: int,
    stall_s: float,
    coord: Coordinator | None = None,
) -> str:
    """Write and commit a boundary for membership ``epoch``: as this process alone, or with the
    other savers of ``coord`` (``survivor_group``: each writes a share, under its rank). In a
    run with an object store, upload this process's files, for as long as the upload moves bytes
    (it is given up after ``stall_s`` without one). Returns the checkpoint's name."""
    coord = coord or Coordinator.solo(ctx.coord.local_rank)
    engine = ShardedEngine(ctx.components, coord, trusted_pickle=ctx.settings.trusted_pickle)
    tree = {key: value for key, value in tensors.items() if key != RANKS_KEY}
    small_state = pickle.loads(small)  # noqa: S301 - ours
    tree[RANKS_KEY] = {str(coord.rank): engine.serialize_small(small_state)}
    fence = None if ctx.fence is None else dataclasses.replace(ctx.fence, epoch=epoch)
    if fence is not None and coord.rank == 0:
        fence.claim()  # the old gang (this worker's own epoch) commits nothing from now on
    # one name for every saver, chosen after the claim (the broadcast is also the barrier)
    name = coord.broadcast(_unused_name(ctx, at) if coord.rank == 0 else None)

    def report(manifest: Manifest) -> None:
        uri = ctx.remote.uri_for(name) if ctx.remote else str(ctx.run_dir / name)
        record = report_commit(manifest, uri, world_size=ctx.world_size)
        if ctx.progress is not None:
            ctx.progress.committed(record)
        elif coord.rank == 0:  # this process was not rank 0: that rank's node may be the one lost
            report_commit_once(record)
        events.committed(manifest, str(record["uri"]), rank=ctx.rank, held_s=0.0)

    with warnings.catch_warnings():  # DCP says it saves in a single process: it is meant
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        manifest = write_and_commit(
            engine,
            ctx.folder,
            state=tree,
            name=name,
            run_name=ctx.run_name,
            timestamp=at,
            weights_only=ctx.settings.weights_only,
            latest_link=None,
            started=time.monotonic(),
            on_commit=report,
            fence=fence,
        )
    if ctx.remote is not None:
        # The bucket's fence is checked against this process's epoch: it writes for the new
        # gang now (the old one can no longer commit there either, once that gang starts).
        os.environ[envvars.MEMBERSHIP_EPOCH] = str(epoch)
        ctx.remote.submit(ctx.run_dir, manifest, coord.rank)
        ctx.remote.upload_first(name)
        await_upload(ctx.remote, name, stall_s)
        if name in ctx.remote.pending():
            raise TimeoutError(f"{name} is committed locally but its upload did not finish")
    return name


@contextlib.contextmanager
def heartbeat(marker: Path) -> Iterator[None]:
    """While the save runs, tell the agent through ``marker`` how many bytes this process has
    moved (``<pid> <bytes>``, ``io_progress``): it waits for the save as long as the count grows
    (``agent/supervisor.py``)."""
    stop = threading.Event()
    tmp = marker.with_name(marker.name + ".beat")

    def beat() -> None:
        while True:
            with contextlib.suppress(OSError):  # no fsync: the agent reads it while it runs
                tmp.write_text(f"{os.getpid()} {io_progress.total()}\n")
                tmp.replace(marker)
            if stop.wait(HEARTBEAT_S):
                return

    thread = threading.Thread(target=beat, name="rtj-survivor-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def await_upload(remote: RemoteBackend, name: str, stall_s: float) -> None:
    """Wait until ``name`` is uploaded, for as long as this process moves bytes; then close the
    remote (what else is queued gets a second at most: the new gang needs only ``name``)."""
    stall = io_progress.Stall(io_progress.total(), time.monotonic())
    while name in remote.pending():
        time.sleep(POLL_S)
        if stall.seconds(io_progress.total(), time.monotonic()) > stall_s:
            break
    remote.close(timeout_s=1.0)


def _unused_name(ctx: RunContext, at: Timestamp) -> str:
    """The checkpoint name of position ``at``, or a variant no folder of the run has."""
    base = ctx.settings.templates.render_checkpoint(ctx.template_values(at))[0]
    variants = itertools.chain(
        [base, f"{base}-ba{at.batch}"], (f"{base}-ba{at.batch}-{n}" for n in itertools.count(2))
    )
    quarantined = set(ctx.settings.quarantined)
    return next(v for v in variants if v not in quarantined and not ctx.folder.path(v).exists())


def host_copy(tree: Any, ready: torch.cuda.Event) -> Any:
    """``tree`` with its CUDA tensors copied to host memory on a stream of their own that waits
    only for ``ready`` (recorded at the boundary). The default stream may be stuck behind a
    collective that never ends (NCCL waits for a lost peer until its timeout), and a copy
    queued there would wait with it."""
    stream = torch.cuda.Stream()
    stream.wait_event(ready)
    with torch.cuda.stream(stream):
        out = tree_map(
            lambda t: t.to("cpu") if isinstance(t, torch.Tensor) and t.is_cuda else t, tree
        )
    stream.synchronize()
    return out


def _waits(environ: Any) -> dict[str, float]:
    """``SurvivorSave``'s waits from the agent's environment: ``wait_s``, ``hold_s``, ``form_s``."""
    rejoin_s = _seconds(environ, envvars.REJOIN_SECONDS, DEFAULT_HOLD_S)
    return {
        "wait_s": _seconds(environ, envvars.SURVIVOR_SAVE_SECONDS, DEFAULT_WAIT_S),
        "hold_s": _seconds(environ, envvars.LOSS_HOLD_SECONDS, rejoin_s),
        "form_s": rejoin_s,
    }


def _seconds(environ: Any, name: str, default: float) -> float:
    return arguments.environment_seconds(
        name, environ, default, "a number of seconds >= 0", lambda s: s >= 0
    )
