"""The agent's loop: run the pod's workers, and re-form them in place when the membership changes.

The operator announces each new membership of the gang by rewriting one annotation on every
pod that stays (``pod/membership.py``); the kubelet (or the local pod runner) refreshes its
downward-API file, which this loop reads every ``poll_s``. On a newer epoch it stops the
workers (a collective emergency save first when every old member is alive, ``stop: save``;
at once when one is gone, ``stop: kill``: a save would wait on the lost rank) and starts new
ones with the new ranks, world size, rendezvous address, checkpoint and epoch. The pod, its
node, its image, its interpreter and ``import torch`` all stay; that is the restart this
avoids. A pod the new membership leaves out (``stop: leave``, its node announced for
termination) ends once its workers left the gang. Workers that can switch in process take
``stop: switch`` and ``stop: rejoin`` (after a loss, ``rejoin_watch.py``) without ending.

When a worker ends with an error before any new membership came (its collective failed because
a peer was lost), the others are stopped and the loop waits ``rejoin_s`` for one. None coming
means the operator chose to replace the whole gang, or the failure was the script's own: the
agent then exits with the worker's code, and the operator's failure handling sees exactly what
it would have seen without the agent. SIGTERM to the agent goes to the workers, which save and
exit; the agent exits with their code and restarts nothing.
"""

from __future__ import annotations

import logging
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .. import envvars, events, io_progress, switch
from ..errors import ConfigError
from ..pod import membership
from ..pod.membership import Membership
from ..run.announce import announce
from . import preload, rendezvous_store, standby, worker
from .command import WorkerCommand
from .rejoin_watch import PendingRejoin, next_step

log = logging.getLogger("trainer_runtime.agent")

IN_PROCESS = (membership.STOP_SWITCH, membership.STOP_REJOIN)
"""The stops the workers may take in process (``switch.py``, ``run/rejoin.py``)."""
PROGRESS_EVERY_S = 10.0
"""How often the agent says how far a long survivor's save has come."""


@dataclass
class AgentSettings:
    command: WorkerCommand
    nproc_per_node: int
    base_env: dict[str, str]
    membership_file: str | None
    rejoin_s: float = 30.0
    stop_grace_s: float = 30.0
    poll_s: float = 0.05
    standby: bool = False
    """Start no worker before a membership of the initial epoch or newer (``standby.py``)."""
    survivor_save_s: float = 120.0
    """How long a worker named to save the last finished step from memory (``save/survivor.py``)
    may go without moving a byte before it is killed; a save that keeps moving bytes is waited
    for however long it takes."""
    preload: tuple[str, ...] = ()
    """Modules imported for the workers' next fork (``preload.py``)."""


@dataclass
class Supervisor:
    settings: AgentSettings
    initial: Membership
    clock: Callable[[], float] = time.monotonic
    workers: list[worker.Worker] = field(default_factory=list)
    current: Membership | None = None
    terminating: bool = False
    unreadable: str | None = None
    """The last problem with the membership file, said once (the file is read every poll)."""
    markers: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rtj-agent-")))
    """Where each worker says it can save from memory (``RTJ_SURVIVOR_SAVE_FILE``)."""
    store: rendezvous_store.StoreKeeper | None = None
    """The rendezvous store this pod serves while it is node rank 0 (``rendezvous_store.py``)."""
    rejoining: PendingRejoin | None = None
    """A loss handed to the workers in process (``stop: rejoin``) and when, until they claim it."""
    formed_epoch: int = -1
    """The epoch of the gang the workers formed last: started in, or asked to rejoin (a switch
    asked for is not counted: a loss may come before they take it)."""

    def run(self) -> int:
        """Supervise the workers until they end; the exit code of the pod's command."""
        try:
            return self._supervise()
        finally:
            if self.store is not None:
                self.store.stop()
            shutil.rmtree(self.markers, ignore_errors=True)

    def _supervise(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        if self.settings.standby:
            preload.preload(self.settings.preload)  # a spare is warm with them loaded
            standby.announce_ready(self.settings.base_env, self.initial.epoch)
            first = standby.wait_for_membership(
                self.initial,
                lambda epoch: self._newer_membership(at_least=epoch),
                lambda: self.terminating,
                self.settings.poll_s,
            )
            if first is None:
                return 128 + signal.SIGTERM  # deleted while it waited: nothing ran
            if first.leaves:
                _say(f"agent: membership epoch {first.epoch} leaves this standby pod out")
                return 0
            self._announce(first, stop="standby", stopped_s=0.0, how="workers started warm")
            self._serve_store(first)
            self._start(first, changed=True)
        else:
            newer = self._newer_membership()
            chosen = newer or self.initial
            self._serve_store(chosen)
            self._start(chosen, changed=newer is not None)
            # For the restarts in place; the first workers import what they use themselves.
            preload.preload(self.settings.preload)
        while True:
            time.sleep(self.settings.poll_s)
            codes = [w.poll() for w in self.workers]
            if not self.terminating:
                newer = self._newer_membership()
                if newer is not None:
                    if newer.leaves:
                        return self._leave(newer)
                    if newer.stop in IN_PROCESS and self._can_switch():
                        self._switch(newer)
                    else:
                        self._restart(newer)
                    continue
            if self._restarted_after_rejoin(codes):
                continue
            failed = [code for code in codes if code not in (None, 0)]
            if failed and not self.terminating:
                code = self._after_failure(failed[0])
                if code is not None:
                    return code
                continue
            if all(code is not None for code in codes):
                return max(code or 0 for code in codes)

    # ------------------------------------------------------------------ membership changes
    def _newer_membership(self, at_least: int | None = None) -> Membership | None:
        """The membership file's, when newer than the current one (or of epoch ``at_least`` or
        more); None otherwise, and while the file is missing, empty or unreadable."""
        if not self.settings.membership_file:
            return None
        try:
            found = membership.read(self.settings.membership_file)
        except (ConfigError, OSError) as exc:
            if str(exc) != self.unreadable:
                log.warning("agent: %s", exc)
                self.unreadable = str(exc)
            return None
        self.unreadable = None
        floor = (self.current or self.initial).epoch + 1 if at_least is None else at_least
        return found if found is not None and found.epoch >= floor else None

    def _replace_store(self, new: Membership) -> rendezvous_store.StoreKeeper | None:
        """Serve ``new``'s store (node rank 0) before anything else, so the new gang's early
        ranks find it up; the old store, for the caller to stop once its workers are done with
        it (None: there was none, or it was at the same address and is stopped already)."""
        old_store, self.store = self.store, None
        if old_store is not None and old_store.port == new.master_port:
            # The new gang's rendezvous is at the old one's address: replace the store before
            # anything else. A new member that arrives while the old store still answers there
            # (a warm spare starts at once; the old workers' save may take minutes) would read
            # the old gang's keys, try to connect to its dead ranks, and hang the new gang.
            # The old workers no longer need it: their process group is formed.
            old_store.stop()
            old_store = None
        self._serve_store(new)
        return old_store

    def _restart(self, new: Membership, *, why: str = "") -> None:
        """Stop the workers and start ``new``'s; ``why``: ``new`` was handed over in process
        already (its store is served) and the workers did not take it."""
        began = self.clock()
        old_store = None if why else self._replace_store(new)
        if new.stop in membership.LOSS_STOPS and new.node_rank < new.savers:
            self._let_survivor_save()
        # stop: switch where a worker cannot switch: every old member is alive, so it saves
        self._stop(save=new.stop in (membership.STOP_SAVE, membership.STOP_SWITCH))
        if old_store is not None:
            old_store.stop()
        stopped_s = self.clock() - began
        self._announce(
            new,
            stop=new.stop,
            stopped_s=stopped_s,
            how=f"{why}workers restarted in place ({stopped_s:.2f} s to stop the old ones)",
        )
        self._start(new, changed=True)

    def _can_switch(self) -> bool:
        """Whether every worker runs and said it can switch in process (``switch.py``)."""
        return bool(self.workers) and all(
            w.poll() is None and switch.can_switch(self._switch_file(lr))
            for lr, w in enumerate(self.workers)
        )

    def _switch(self, new: Membership) -> None:
        """Hand the new membership to the running workers, which switch to it in process at a
        step boundary they agree on; the new gang's store is served first (node rank 0)."""
        old_store = self._replace_store(new)
        if self.store is not None:
            self.store.settle()  # no worker saves on the way: nothing to wait for
        # A rejoin forms at once, with no step agreed first: never at the old gang's store.
        rendezvous_store.meet_gang_store(new, self.settings.rejoin_s, lambda: not self.terminating)
        after_loss = new.stop == membership.STOP_REJOIN
        for local_rank in range(len(self.workers)):
            env = self._worker_environment(new, local_rank, changed=True)
            env.pop(envvars.PEER_STATE, None)  # these hold the state
            request = switch.SwitchRequest(new.epoch, env, after_loss=after_loss)
            switch.write_request(self._switch_file(local_rank), request)
        if old_store is not None:
            old_store.stop()
        if after_loss:
            lost = (self.formed_epoch, (self.current or self.initial).epoch)
            self.rejoining = PendingRejoin(new, self.clock(), lost)
            self.formed_epoch = new.epoch  # a failed rejoin restarts them (_start sets it)
        self.current = new
        how = "rejoin" if after_loss else "switch"
        self._announce(new, stop=new.stop, stopped_s=0.0, how=f"workers asked to {how} in process")

    def _restarted_after_rejoin(self, codes: list[int | None]) -> bool:
        """Whether a loss handed over in process failed and the workers were restarted
        (``rejoin_watch.py``)."""
        if self.rejoining is None:
            return False  # the loop's usual case: nothing handed over
        files = [self._switch_file(lr) for lr in range(len(self.workers))]
        self.rejoining, restart = next_step(self.rejoining, codes, files, self.clock())
        if restart is not None:
            self._restart(restart, why="workers did not rejoin in process; ")
        return restart is not None

    def _leave(self, new: Membership) -> int:
        """This pod is not in ``new`` (``stop: leave``): its workers leave in process at the step
        boundary every rank agrees on and end with 0, while the others switch to the smaller gang;
        workers that cannot switch save with the others (whose agents restart theirs) and end.
        The agent ends with them: 0, or a worker's own error code."""
        old_rank = (self.current or self.initial).node_rank * self.settings.nproc_per_node
        in_process = self._can_switch()
        if in_process:
            request = switch.SwitchRequest(new.epoch, {}, leave=True)
            for local_rank in range(len(self.workers)):
                switch.write_request(self._switch_file(local_rank), request)
        _say(
            f"agent: membership epoch {new.epoch}: {new.nnodes} pods without this one; its workers "
            + ("leave in process" if in_process else "save with the others and end")
        )
        events.membership(
            rank=old_rank,
            epoch=new.epoch,
            nnodes=new.nnodes,
            node_rank=-1,
            stop=new.stop,
            stop_s=0.0,
        )
        self.current = new
        if not in_process:
            self._stop(save=True)
        while any(w.poll() is None for w in self.workers):
            time.sleep(self.settings.poll_s)
        codes = [w.poll() or 0 for w in self.workers]
        own_error = [c for c in codes if c not in (0, 128 + signal.SIGTERM, -signal.SIGKILL)]
        return own_error[0] if own_error and in_process else 0

    def _announce(self, new: Membership, *, stop: str, stopped_s: float, how: str) -> None:
        announce_membership(new, self.settings.nproc_per_node, stop, stopped_s, how)

    def _after_failure(self, code: int) -> int | None:
        """A worker failed: stop the rest, wait for a new membership; the exit code when none
        came (None: restarted)."""
        self._stop(save=False)
        deadline = self.clock() + self.settings.rejoin_s
        _say(
            f"agent: a worker exited with {code}; waiting up to {self.settings.rejoin_s:g} s "
            "for a new membership"
        )
        while self.clock() < deadline and not self.terminating:
            newer = self._newer_membership()
            if newer is not None:
                self._restart(newer)
                return None
            time.sleep(self.settings.poll_s)
        return code

    def _let_survivor_save(self) -> None:
        """Wait for this pod's save of the last finished step, if it makes one (below)."""
        first = self.workers[0] if self.workers else None
        let_survivor_save(first, self._marker(0), self.settings, self.clock)

    # ------------------------------------------------------------------ workers
    def _marker(self, local_rank: int) -> Path:
        return self.markers / f"survivor-{local_rank}"

    def _switch_file(self, local_rank: int) -> Path:
        return self.markers / f"switch-{local_rank}"

    def _serve_store(self, chosen: Membership) -> None:
        """Node rank 0 serves the membership's rendezvous store from now on (one try: a port
        that cannot be bound now will not be on a retry, and rank 0's worker then serves it)."""
        if chosen.node_rank == 0:
            self.store = rendezvous_store.start(chosen.master_port, chosen.epoch)

    def _start(self, chosen: Membership, *, changed: bool) -> None:
        """Start ``chosen``'s workers; ``self.store`` is its rendezvous store when this pod
        serves it (``_serve_store`` came first). ``changed``: a membership read from the file,
        which the old gang's saves came before (the store says when they are over, and the
        workers' download at import waits for that: ``MEMBERSHIP_CHANGED``). The operator says
        the same in the pod's environment of a new pod that joins kept ones."""
        self.current = chosen
        self.formed_epoch = chosen.epoch
        if self.store is not None:
            self.store.settle()  # this pod's old workers are gone: their saves are over
        rendezvous_store.meet_gang_store(
            chosen, self.settings.rejoin_s, lambda: not self.terminating
        )
        changed = changed or self.settings.base_env.get(envvars.MEMBERSHIP_CHANGED) == "1"
        self.workers = []
        for local_rank in range(self.settings.nproc_per_node):
            self._marker(local_rank).unlink(missing_ok=True)
            for stale in switch.agent_files(self._switch_file(local_rank)):
                stale.unlink(missing_ok=True)
            env = {
                **self.settings.base_env,
                **self._worker_environment(chosen, local_rank, changed),
            }
            self.workers.append(worker.start(self.settings.command, env, local_rank))

    def _worker_environment(
        self, chosen: Membership, local_rank: int, changed: bool
    ) -> dict[str, str]:
        """What a worker of ``chosen`` gets besides the pod's own environment: its ranks and
        rendezvous, and the agent's files and flags."""
        return (
            {
                **chosen.worker_environment(self.settings.nproc_per_node, local_rank),
                envvars.SURVIVOR_SAVE_FILE: str(self._marker(local_rank)),
                envvars.SWITCH_FILE: str(self._switch_file(local_rank)),
                envvars.MEMBERSHIP_CHANGED: "1" if changed else "0",
            }
            | ({envvars.USE_AGENT_STORE: str(True)} if self.store is not None else {})
            | ({envvars.PEER_STATE: "1"} if chosen.stop in IN_PROCESS else {})
        )

    def _stop(self, *, save: bool) -> None:
        stop_workers(self.workers, self.settings, self.clock, save=save)

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.terminating = True
        for w in self.workers:
            w.signal(signal.SIGTERM)


def stop_workers(
    workers: list[worker.Worker],
    settings: AgentSettings,
    clock: Callable[[], float],
    *,
    save: bool,
) -> None:
    """End every worker: SIGTERM and up to ``stop_grace_s`` to save, or SIGKILL at once."""
    if save:
        for w in workers:
            w.signal(signal.SIGTERM)
        deadline = clock() + settings.stop_grace_s
        while clock() < deadline and any(w.poll() is None for w in workers):
            time.sleep(settings.poll_s)
    for w in workers:
        w.signal(signal.SIGKILL)
    while any(w.poll() is None for w in workers):
        time.sleep(0.01)


def let_survivor_save(
    first: worker.Worker | None,
    marker: Path,
    settings: AgentSettings,
    clock: Callable[[], float],
) -> None:
    """A rank was lost and this pod is one of the new gang's savers (node rank 0, or any kept
    pod when the save is split): its local rank 0 worker (``first``), if it said it can through
    its ``marker``, saves the last finished step from memory (or its share of it) and ends by
    itself (``save/survivor.py``); wait for that as long as the save moves bytes (it says how
    many through its marker), and at most ``survivor_save_s`` without one. A worker that does
    not save removes its marker (a small state is saved by node rank 0 alone)."""
    if first is None or first.poll() is not None or not marker.exists():
        return
    began = said = clock()
    stall = io_progress.Stall(saver_bytes(marker), began)
    while first.poll() is None and marker.exists():
        time.sleep(settings.poll_s)
        now = clock()
        if stall.seconds(saver_bytes(marker), now) >= settings.survivor_save_s:
            log.warning(
                "agent: the worker saving from memory moved no byte for %.0f s "
                "(RTJ_SURVIVOR_SAVE_SECONDS); it is stopped",
                settings.survivor_save_s,
            )
            return
        if now - said >= PROGRESS_EVERY_S:
            said = now
            _say(
                f"agent: the survivor's save goes on: {stall.count / 2**20:.0f} MiB written or "
                f"uploaded in {now - began:.0f} s"
            )
    if first.poll() is not None:  # else it said it does not save: it is stopped with the rest
        _say(f"agent: the survivor's save ended after {clock() - began:.2f} s")


def saver_bytes(marker: Path) -> int:
    """The bytes a saving worker says it has moved (its marker: ``<pid> [<bytes>]``); 0 before
    it says any, or once the marker is gone (the count only grows while it is there)."""
    try:
        fields = marker.read_text().split()
    except OSError:
        return 0
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0


def announce_membership(
    new: Membership, nproc_per_node: int, stop: str, stopped_s: float, how: str
) -> None:
    """Say a new membership and how this pod's workers took it (log line and event)."""
    _say(
        f"agent: membership epoch {new.epoch}: {new.nnodes} pods, this one node rank "
        f"{new.node_rank}; {how}"
    )
    events.membership(
        rank=new.node_rank * nproc_per_node,
        epoch=new.epoch,
        nnodes=new.nnodes,
        node_rank=new.node_rank,
        stop=stop,
        stop_s=stopped_s,
    )


def _say(text: str) -> None:
    announce(log, logging.WARNING, "%s", text, speak=True)
