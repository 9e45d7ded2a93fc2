"""Goodput of a training job on spot capacity, replayed over whole real traces by simulation.

    python benchmarks/goodput_sim.py --trace NAME [NAME ...] --nodes 4 16 64 256
        [--costs phases.json] [--json out.json] [--policies fixed elastic ...]

Why a simulator next to the on-cluster replay: the cluster replays minutes of a trace at a few
nodes with emulated steps; whether the product's recovery pays off at 64 or 256 GPU nodes over
two weeks of real capacity can only be computed. The two meet in the phase costs: the cluster
benchmark measures each recovery phase, ``--costs`` feeds them in here.

**Goodput** (docs/goodput.md) = samples in the newest COMMITTED checkpoint
at the end of the trace / the ideal, the integral of the nodes available (capped at the job's
full size) times the per-node rate of the full gang. Work rolled back does not count. The end
of the trace is the job's end: a gang training then saves, and saves in flight commit (without
that, each policy's last interval would be cut off, which favours the shortest). The
**ceiling** is the same integral counting only capacity at
or above ``minReplicas``: what no policy can beat.

The job: ``replicas`` = the scale (4, 16, 64, 256 nodes), data parallel with linear scaling (one
sample per node-second), state replicated on every node (HSDP/DDP), periodic asynchronous
checkpoints (a short blocking stage, a commit later), an emergency checkpoint on a spot notice.
A trace becomes the capacity of a gang of that size through ``spot_traces.scaled`` (the trace
capped at the size; beyond its own pool, independent pools side by side).
A lost node is a training rank whenever the gang has one there (pessimistic: room it left idle,
for instance a grow ``grow.onlyWhenItPays`` held back, never takes a loss in its place;
``--idle-lost-first`` is the optimistic bound), and the node that held the image before one
that did not.

Policies (each a small state machine over the same ledger, the same events):

- ``fixed``: trains only with every replica; any loss ends the gang, which cold-starts from the
  newest checkpoint once all replicas fit again;
- ``elastic``: today's product (operator/rtj_operator/decide/elastic.py): shrinks to what fits
  (at least ``minReplicas``, after waiting ``shrinkAfterSeconds`` for the full size) and grows
  back (no sooner than ``grow.minIntervalSeconds`` after the last size change, after a
  checkpoint it asks for); every size change ends the gang and cold-starts every rank;
- ``elastic-stay``, ``fixed-stay``: ``recovery.survivors: Stay`` as the product builds it
  (docs/survivors.md). The kept pods stay, but their agent restarts every worker, which loads
  the newest commit: after a loss without notice the kept pods first save the last finished
  step (each 1/K of the replica once it is ``RTJ_SURVIVOR_SPLIT_MIB`` or more, after they met;
  ``--survivor-save-alone``: one process writes it all, the product before), after a noticed one
  the gang saves on the node's shutdown; new pods start in standby while the gang trains, then
  join through the gang's save of the step it reached and the same restart. A restarted worker
  fetches the commit while it starts and the group forms (``--restart-fetch-after-group``:
  after, the product before). ``--switch-grows``: a grow switches the running workers in
  process (``recovery.inProcessSwitch``); ``--switch-noticed``: the same flag at a notice, the
  noticed ranks leave at the notice (below); ``--switch-lost``: the same flag after a loss, the
  kept ranks rejoin in process when the next attempt is only them (``ckpt.rejoin``);
  ``--in-process-switch``: all three. Otherwise a loss saves and restarts the workers;
- ``--switch-noticed`` (``recovery.inProcessSwitch`` at a notice, elastic ``*-stay`` only): the
  operator ends the attempt at the notice (plus ``notice_detect_s``): the ranks on the noticed
  nodes leave at the next step boundary and the kept ranks switch in process to the smaller
  gang (a re-form, no save, no restart, no step lost), when they are at least ``minReplicas``
  (else the loss is handled when it comes, as without the flag). The noticed nodes are not used
  from the notice on (tainted), so the gang trains smaller through the notice window; room
  elsewhere is taken as after a loss (survivors first); the loss itself interrupts nothing;
- ``elastic-warm``: survivors stay in process (torchft's design; the product's
  ``--in-process-switch`` comes close: it waits ``shrinkAfterSeconds`` and takes room after a
  loss only when that pays). A loss costs the survivors its detection and a re-formed process group
  (seconds) and at most the step in flight (none with a notice); new ranks start on their own
  (pod, image, runtime, state from their peers) while the gang trains on, then join in a
  re-form. Only a gang that lost every rank starts cold;
- ``fixed-warm``: the same recovery with every replica required (JobSet's in-place restart of
  healthy pods): it waits, holding its state, until the lost ranks are replaced.

The checkpoint interval is the product's automatic one, as the job runs: Young-Daly from the
blocking part of a save and the mean time between the losses that rolled the job back
(``Interval``).

Rejected: a simulation in time steps (a 2-week trace at 1 s steps times 256 nodes is slow and
blurs the order of events a few seconds apart); randomised notices (the share of losses that
get a notice is spread evenly over the losses, so every run gives the same figures).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from rtj_operator.api.spec_types import (
    GROW_MIN_INTERVAL_SECONDS,
    SHRINK_AFTER_SECONDS,
    PreemptionSignals,
)
from rtj_operator.decide.grow_payoff import GrowCost, survivors_first_pays
from rtj_operator.decide.manifests import hold_after_failed_collective
from trainer_runtime.save.auto_interval import DEFAULT_MAX_S, DEFAULT_MIN_S, clamp, young_daly
from trainer_runtime.save.survivor_group import DEFAULT_SPLIT_MIB

try:
    from benchmarks import spot_traces
    from benchmarks.auto_interval import operator_mtbi
except ImportError:  # run as a script: benchmarks/ is the script's folder
    import spot_traces  # type: ignore[no-redef]
    from auto_interval import operator_mtbi  # type: ignore[no-redef]

Trace = spot_traces.Trace
INF = math.inf
NODE_NOT_READY_SECONDS = PreemptionSignals().node_not_ready_seconds
"""``preemptionSignals.nodeNotReadySeconds``' default."""
POLICIES = ("fixed", "elastic", "elastic-stay", "fixed-stay", "elastic-warm", "fixed-warm")
GROW_RECHECK_S = 60.0
"""How soon a grow held back by ``grow.onlyWhenItPays`` is looked at again (the operator looks
at every pass, every 5 s; the cost and the gain change slowly)."""

PHASES = (
    "detected",
    "old_pods_gone",
    "pods_created",
    "bound",
    "container_started",
    "runtime_started",
    "process_group_formed",
    "checkpoint_fetched",
    "loaded",
    "first_step",
)


@dataclass(frozen=True)
class Phases:
    """Seconds each recovery phase of a cold gang restart takes, from the milestone before it
    (``detected`` from the loss). GPU-scale defaults; the cluster benchmark measures them."""

    detected: float = 30.0
    """A loss without notice seen: a collective's timeout, or the node's pods gone."""
    old_pods_gone: float = 15.0
    """The survivors' pods terminated (the runtime's emergency exit, then the kubelet)."""
    pods_created: float = 1.0
    bound: float = 3.0
    """Scheduled as a gang."""
    container_started: float = 5.0
    """With the image already on the node; a node without it also pays ``Model.image_pull_s``."""
    runtime_started: float = 20.0
    """Interpreter, torch and CUDA imported, the CUDA context made."""
    process_group_formed: float = 20.0
    """Rendezvous and NCCL communicators across the gang."""
    checkpoint_fetched: float = 56.0
    """A replica's state read from the store: 112 GB (a 7B model with Adam) at 2 GB/s."""
    loaded: float = 15.0
    first_step: float = 30.0
    """The first step after a start: compilation, allocator and data-loader warm-up."""


def load_phases(path: str | Path, base: Phases | None = None) -> tuple[Phases, list[str]]:
    """Phase costs from a JSON file, over ``base`` for the phases it does not name.

    Accepted: ``{"phases": {name: seconds, ...}}`` (other top-level keys ignored) or the phase
    map itself; a value may be ``{"p50": s}`` (or ``"median"``) as benchmarks write them. Values
    are each phase's own duration; with ``"cumulative": true`` they are seconds since the loss,
    and the durations are their differences in phase order. Returns the phases and the names
    the file set.
    """
    text = Path(path).read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}:1: a JSON object of phases was expected")
    table = doc.get("phases", doc)
    cumulative = bool(doc.get("cumulative", False))
    if not isinstance(table, dict):
        raise ValueError(f'{path}:1: "phases" is not an object of phase: seconds')
    values: dict[str, float] = {}
    for name, raw in table.items():
        if name == "cumulative" and table is doc:
            continue
        if name not in PHASES:
            raise ValueError(f"{path}: unknown phase {name!r}; the phases are {', '.join(PHASES)}")
        value = raw.get("p50", raw.get("median")) if isinstance(raw, dict) else raw
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"{path}: phase {name!r} is {raw!r}, not seconds (a number >= 0)")
        values[name] = float(value)
    if cumulative:
        previous, durations = 0.0, {}
        for name in (p for p in PHASES if p in values):
            if values[name] < previous:
                raise ValueError(
                    f"{path}: cumulative phase {name!r} at {values[name]} s comes before the "
                    f"phase above it ({previous} s)"
                )
            durations[name], previous = values[name] - previous, values[name]
        values = durations
    return replace(base or Phases(), **values), sorted(values)


@dataclass(frozen=True)
class Model:
    """Everything the simulation assumes besides the trace: GPU-scale defaults, each overridable
    from the command line, the phases from the cluster benchmark (``--costs``)."""

    phases: Phases = field(default_factory=Phases)
    image_pull_s: float = 120.0
    """A ~15 GB PyTorch/CUDA image onto a node that never ran the job (~125 MB/s)."""
    notice_detect_s: float = 2.0
    """A loss that came with a notice is known at once: only the pods' deletion is seen."""
    reform_s: float = 5.0
    """Survivors re-form their process group with a changed membership (elastic-warm)."""
    worker_start_s: float = 5.0
    """A worker the product's in-pod agent forks anew (``*-stay``): its CUDA context; the
    interpreter and torch are up already."""
    checkpoint_gb: float = 112.0
    """One replica's state (7B parameters: bf16 weights, fp32 master copy, Adam)."""
    peer_gbps: float = 12.5
    """A new rank's state from a surviving peer's memory (100 Gb/s)."""
    write_gbps: float = 1.0
    """Each node's write rate to the checkpoint store; a save writes 1/N of a replica a node."""
    save_block_s: float = 5.0
    """The part of a periodic save that stops training (staging to host memory)."""
    step_s: float = 2.0
    interval_s: float | None = None
    """Seconds between checkpoints; None: the product's automatic interval (``Interval``)."""
    notice_share: float = 0.5
    """The share of losses that come with a notice (spread evenly over the losses)."""
    notice_s: float = 120.0
    """How long before the loss a notice comes (AWS, where the traces come from: 2 minutes)."""
    min_fraction: float = 0.5
    """``minReplicas`` of the elastic policies, as a share of ``replicas`` (rounded up)."""
    shrink_after_s: float | None = None
    """``elastic.shrinkAfterSeconds``; None: the product's default, 60 s, and 0 with ``Stay``."""
    grow_min_interval_s: float | None = None
    """``grow.minIntervalSeconds``; None: the product's default, 300 s, and 0 when grows
    switch in process (``switch_grows``, ``recovery.inProcessSwitch``)."""
    loss_hold_s: float | None = None
    """How long a kept worker whose collective failed waits for its membership
    (``RTJ_LOSS_HOLD_SECONDS``); None: the operator's, ``REJOIN_SECONDS`` and the wait for the
    full gang, plus the node controller's grace and ``nodeNotReadySeconds``. A loss without
    notice seen later (``detected`` and that wait) finds the kept workers ended, unsaved: they
    restart from the newest commit."""
    idle_lost_first: bool = False
    """A lost node is an idle one (room the gang did not take) before a training rank: the
    optimistic bound. False: a training rank goes first (pessimistic; the default)."""
    grow_only_when_it_pays: bool = True
    """``grow.onlyWhenItPays`` (the operator's rule, ``rtj_operator.decide.grow_payoff``): an
    elastic gang grows only when the ranks it adds are expected to train, before its next loss,
    more than the grow's pause costs it; the job's mean restart and time between losses are
    those it went through so far, as the operator measures them."""
    survivor_save_split: bool = True
    """The survivors' save of a replica of ``RTJ_SURVIVOR_SPLIT_MIB`` or more is written in
    shares by every kept pod (``trainer_runtime/save/survivor_group.py``). False: by one
    process (the product before)."""
    restart_prefetch: bool = True
    """A worker restarted in place (``*-stay``) downloads the commit it resumes from while its
    gang forms: from the moment node rank 0's agent says the old gang's saves are over, as the
    workers start and the process group forms (``trainer_runtime/resume/warm_start.py``). False:
    only once the group formed (the product before)."""
    room_at_loss: str = "pays"
    """At a loss of a ``*-stay`` elastic gang that leaves room it can take at once (capacity it
    did not grow into, or a node back), ``pays`` (the product, ``decide/restore.py``): the kept
    ranks restart alone and the new ranks join warm (standby, then the join) when
    ``grow_payoff.survivors_first_pays`` says so from the gang's own history, else as ``cold``;
    ``cold`` (the product before 2026-12-06): the next attempt is as large as what fits, and the
    kept ranks wait for its new pods' cold start; ``warm``: always as ``pays`` does when it
    pays."""
    switch_grows: bool = False
    """A ``*-stay`` gang's grow switches the running workers in process
    (``recovery.inProcessSwitch``, trainer_runtime/switch.py): the new pods start in standby,
    then the gang pauses for a re-form (``reform_s``) and the state sent to the new ranks
    (``checkpoint_gb`` at ``peer_gbps``), no save, no restart. False: the kept workers save and
    restart (the product's default)."""
    switch_noticed: bool = False
    """``recovery.inProcessSwitch`` at a notice (an elastic ``*-stay`` gang): the noticed ranks
    leave at the notice (``notice_detect_s`` after it) and the kept ranks switch in process to
    the smaller gang (``reform_s``; no save, restart or lost step), when they are at least
    ``minReplicas``; the noticed nodes stay unused until they go, and their loss interrupts
    nothing. False, or too few kept ranks: the gang saves on the node's shutdown and restarts
    its workers at the loss."""
    switch_lost: bool = False
    """``recovery.inProcessSwitch`` after a loss (an elastic ``*-stay`` gang with replicated
    state; ``ckpt.rejoin``, trainer_runtime/run/rejoin.py): when the next attempt is only its
    kept ranks (at least ``minReplicas``; room joins warm later, or there is none), they re-form
    in process from the last finished step after the loss's detection and ``shrinkAfterSeconds``:
    a ``reform_s`` pause, no save, no restart. False, or new pods that start with the attempt:
    the kept ranks save and restart (``after_loss``)."""
    savers_meet_s: float = 5.0
    """The kept pods' savers meet: the membership reaches each kept pod, which forms a gloo
    group with the others over the new gang's store."""
    every_loss_interval: bool = False
    """The automatic interval counts every loss, also those a warm gang's survivors cover (the
    rule the product had before it counted only interruptions that rolled work back)."""
    state_replicated: bool = True
    """Every node holds a whole replica: a survivor can hand the state to a new rank, and a
    loss rolls back only the step in flight. False: a loss makes elastic-warm reload the newest
    checkpoint (its survivors still skip the cold start)."""

    def grow_interval_s(self) -> float:
        """``grow.minIntervalSeconds`` in force (``grow_min_interval_s``)."""
        if self.grow_min_interval_s is not None:
            return self.grow_min_interval_s
        return 0.0 if self.switch_grows else float(GROW_MIN_INTERVAL_SECONDS)

    def commit_s(self, nodes: int) -> float:
        """From a save's start to its commit: the stage, then each node's 1/N of a replica."""
        return self.save_block_s + self.checkpoint_gb / (max(nodes, 1) * self.write_gbps)

    def cold_start(self, pull: bool) -> float:
        """A new gang from pod creation to its first step done (old pods already gone)."""
        p = self.phases
        return (
            p.pods_created
            + p.bound
            + p.container_started
            + (self.image_pull_s if pull else 0.0)
            + p.runtime_started
            + p.process_group_formed
            + p.checkpoint_fetched
            + p.loaded
            + p.first_step
        )

    def join(self, pull: bool) -> float:
        """A new rank of a running gang, ready to join: its pod and runtime, the state from a
        peer (the re-form that admits it is ``reform_s``, paid by everyone)."""
        p = self.phases
        return (
            p.pods_created
            + p.bound
            + p.container_started
            + (self.image_pull_s if pull else 0.0)
            + p.runtime_started
            + self.checkpoint_gb / self.peer_gbps
        )

    def standby(self, pull: bool) -> float:
        """A new pod of the product's ``Stay`` (``*-stay``), started in standby until it is
        told the membership: pod, image, the agent's interpreter and torch; no state yet."""
        p = self.phases
        image = self.image_pull_s if pull else 0.0
        return p.pods_created + p.bound + p.container_started + image + p.runtime_started

    def restart(self) -> float:
        """The product's in-place restart (``*-stay``): every kept pod's agent forks new workers,
        which form the process group and load the newest commit (fetched from the store: a
        node holds its own share of a commit, not the whole), then take their first step. The
        fetch runs while the workers start and the group forms (``restart_prefetch``)."""
        p = self.phases
        forming = self.worker_start_s + p.process_group_formed
        if self.restart_prefetch:
            ready = max(forming, p.checkpoint_fetched)
        else:
            ready = forming + p.checkpoint_fetched
        return ready + p.loaded + p.first_step

    def survivor_save(self, kept: int) -> float:
        """After a loss without notice (``*-stay``), before the new workers start: the ``kept``
        pods meet and each writes 1/``kept`` of the last finished step at its node's rate, or
        one survivor writes the whole replica (a small one, or without the split)."""
        large = self.checkpoint_gb * 1000**3 >= DEFAULT_SPLIT_MIB * 2**20
        if self.survivor_save_split and large and kept > 1:
            return self.savers_meet_s + self.checkpoint_gb / (kept * self.write_gbps)
        return self.checkpoint_gb / self.write_gbps

    def shrink_after(self, *, stay: bool) -> float:
        """The wait for the full gang in force (spec_types.shrink_after_seconds)."""
        if self.shrink_after_s is not None:
            return self.shrink_after_s
        return 0.0 if stay else float(SHRINK_AFTER_SECONDS)

    def detect(self, noticed: bool) -> float:
        return self.notice_detect_s if noticed else self.phases.detected

    def hold_s(self, *, stay: bool) -> float:
        """The kept workers' wait for the membership after a failed collective in force
        (``decide/manifests.loss_hold_seconds``)."""
        if self.loss_hold_s is not None:
            return self.loss_hold_s
        return hold_after_failed_collective(self.shrink_after(stay=stay), NODE_NOT_READY_SECONDS)


class Interval:
    """The checkpoint interval as the job runs: the model's ``interval_s``, or the product's
    ``interval="auto"`` (the runtime's ``young_daly`` and default bounds, the operator's MTBI
    as ``auto_interval.operator_mtbi`` restates it): sqrt(2 x C x M), C the blocking part of a
    save, M = (the time the job trained + the one-hour prior) / (the losses counted + 1), within
    [60 s or a commit, 4 h]. Counted, as the operator counts them (rtj_operator/decide/mtbi.py):
    losses that rolled work back, not those survivors or a save covered, nor a grow; with
    ``every_loss_interval``, every loss that hit a gang (the rule before)."""

    def __init__(self, model: Model) -> None:
        if model.interval_s is not None and not model.interval_s > 0:
            raise ValueError(f"interval_s={model.interval_s}: must be above 0")
        self.fixed, self.block_s = model.interval_s, model.save_block_s
        self.every_loss = model.every_loss_interval
        self.trained_s = 0.0
        self.counted = 0

    def seconds(self, commit_s: float) -> float:
        if self.fixed is not None:
            return self.fixed
        every = young_daly(self.block_s, operator_mtbi(self.trained_s, self.counted))
        return clamp(every, max(DEFAULT_MIN_S, commit_s), DEFAULT_MAX_S)

    def loss(self, rolled_back: bool) -> None:
        """A loss hit a gang; ``rolled_back``: it sent the job back to its last commit."""
        if rolled_back or self.every_loss:
            self.counted += 1


class Ledger:
    """Training progress and checkpoints of one job, in samples (one per node-second).

    ``progress`` is the live state; ``committed`` the newest committed checkpoint's. A save
    captures ``progress`` when it begins and counts once its commit time has passed; a loss
    abandons every save not committed by then.
    """

    def __init__(self, every: Interval, block_s: float) -> None:
        self.every, self.block_s = every, block_s
        self.progress = self.committed = self.captured = 0.0
        self.pending: list[tuple[float, float]] = []
        self.clock = 0.0
        """When the interval counts from: the last save's start, or the workers' start."""
        self.blocked_until = 0.0
        self.rolled_back = 0.0
        self.saves = 0

    def train(self, t0: float, t1: float, nodes: int, commit_s: float) -> None:
        """Train ``nodes`` from ``t0`` to ``t1``, saving at the first moment of training at
        least one interval (wall time) after the clock, as the runtime does at a step."""
        self.every.trained_s += t1 - t0
        t = max(t0, self.blocked_until)
        while t < t1:
            due = max(t, self.clock + self.every.seconds(commit_s))
            end = min(t1, due)
            self.progress += (end - t) * nodes
            t = end
            if t >= due - 1e-9:
                self.save(t, commit_s)
                t = self.blocked_until

    def save(self, t: float, commit_s: float) -> float:
        """Begin a save of the live state at ``t``; returns when it commits."""
        self.captured = self.progress
        self.pending.append((t + commit_s, self.progress))
        self.clock = t
        self.blocked_until = t + self.block_s
        self.saves += 1
        return t + commit_s

    def settle(self, t: float) -> None:
        """Count the saves committed by ``t``."""
        left = []
        for at, samples in self.pending:
            if at <= t:
                self.committed = max(self.committed, samples)
            else:
                left.append((at, samples))
        self.pending = left

    def abandon_saves(self) -> None:
        self.pending = []

    def rollback(self) -> bool:
        """Back to the newest committed checkpoint (the gang restarts from it); whether that
        lost work."""
        self.abandon_saves()
        lost = self.progress - self.committed
        self.rolled_back += lost
        self.progress = self.captured = self.committed
        return lost > 1e-9

    def lose_step(self, samples: float) -> None:
        """The step in flight is lost; the live state is that of the step before (never older
        than the last save began from)."""
        kept = max(self.captured, self.progress - samples)
        self.rolled_back += self.progress - kept
        self.progress = kept


class Gang:
    """What every policy shares: the clock, the capacity, named timers, the ledger."""

    def __init__(self, model: Model, replicas: int, min_replicas: int, ledger: Ledger) -> None:
        self.model, self.replicas, self.min_replicas = model, replicas, min_replicas
        self.ledger = ledger
        self.now = 0.0
        self.avail = 0
        self.size = 0
        self.resume_at = 0.0
        self.pulled = 0
        """Available nodes that hold the image (pessimistically the first lost)."""
        self.timers: dict[str, float] = {}
        self.interruptions = 0
        self.cold_starts = 0
        self.reforms = 0
        self.losses = 0
        """Losses that hit a gang (the operator's preemptions)."""
        self.restarts = 0
        self.restarting_s = 0.0
        self.planned_restarts = 0
        self.planned_restarting_s = 0.0
        self.starting_s = 0.0
        """The first start's time (the operator's ``startingSeconds``)."""

    def training(self) -> bool:
        return False

    def restarted(self, pause: float, *, planned: bool = False) -> None:
        """A gang paused ``pause`` seconds to restart (the operator's ``restartingSeconds``
        and ``restarts``; ``planned``: for a grow, also its ``plannedRestartingSeconds`` and
        ``plannedRestarts``)."""
        self.restarts += 1
        self.restarting_s += pause
        if planned:
            self.planned_restarts += 1
            self.planned_restarting_s += pause

    def grow_pays(self, target: int) -> bool:
        """``grow.onlyWhenItPays`` as the operator decides it (``GrowCost``), from this gang's
        own history."""
        if not self.model.grow_only_when_it_pays:
            return True
        cost = GrowCost.measured(
            restarting_s=self.restarting_s,
            restarts=self.restarts,
            planned_restarting_s=self.planned_restarting_s,
            planned_restarts=self.planned_restarts,
            starting_s=self.starting_s,
            trained_s=self.ledger.every.trained_s,
            losses=self.losses,
        )
        return cost is None or cost.pays(self.size, target)

    def advance(self, t: float) -> None:
        """Train (if the gang is training) from the last event to ``t``."""
        if self.training():
            start = max(self.now, self.resume_at)
            if t > start:
                self.ledger.train(start, t, self.size, self.model.commit_s(self.size))
        self.ledger.settle(t)
        self.now = t

    def finish(self, t: float) -> None:
        """The trace ends as a job would: a training gang saves its progress at ``t`` (the
        runtime's final save) and every save in flight commits. Without it each policy's last
        interval of work would be cut off, which favours the shortest interval."""
        if self.training() and t >= self.resume_at:
            self.ledger.save(t, self.model.commit_s(self.size))
        self.ledger.settle(INF)

    def next_timer(self) -> float:
        return min(self.timers.values(), default=INF)

    def fire(self, t: float) -> None:
        name = min(self.timers, key=self.timers.__getitem__)
        del self.timers[name]
        getattr(self, f"on_{name}")(t)

    def capacity(self, before: int, after: int) -> None:
        self.avail = after
        self.pulled = min(self.pulled, after)

    def begin(self, t: float, avail: int) -> None:
        raise NotImplementedError

    def on_change(self, t: float, before: int, after: int, noticed: bool) -> None:
        raise NotImplementedError

    def on_notice(self, t: float, before: int, after: int) -> None:
        """A notice for the loss that will take the capacity from ``before`` to ``after``."""
        raise NotImplementedError


class ColdGang(Gang):
    """Every membership change ends the gang; the next one cold-starts every rank from the
    newest checkpoint (``fixed``: ``min_replicas == replicas``; ``elastic``: the product)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.state = "down"
        self.waiting_since = 0.0
        self.last_change = -INF
        self.grown = False

    def training(self) -> bool:
        return self.state == "running"

    def begin(self, t: float, avail: int) -> None:
        self.avail = avail
        self.try_start(t)

    def on_change(self, t: float, before: int, after: int, noticed: bool) -> None:
        self.capacity(before, after)
        if after < before:
            hit = after < self.size or (self.size > 0 and not self.model.idle_lost_first)
            if self.state != "down" and hit:
                self.interrupt(t, noticed)
        elif self.state == "down":
            self.try_start(t)
        elif self.state == "running":
            self.want_grow(t)

    def on_notice(self, t: float, before: int, after: int) -> None:
        # The runtime saves at once on a notice (RTJ_NOTICE_FILE); it counts if it commits
        # before the node goes.
        hit = after < self.size or (after < self.avail and not self.model.idle_lost_first)
        if self.state == "running" and hit:
            self.ledger.save(t, self.model.commit_s(self.size))

    def interrupt(self, t: float, noticed: bool) -> None:
        self.interruptions += self.state == "running"
        self.losses += 1
        self.ledger.every.loss(self.ledger.rollback())
        self.state, self.size, self.grown = "down", 0, False
        self.timers.clear()
        detect = self.model.detect(noticed)
        self.waiting_since = t + detect
        self.timers["teardown"] = t + detect + self.model.phases.old_pods_gone

    def try_start(self, t: float) -> None:
        if "teardown" in self.timers:
            return
        fit = min(self.avail, self.replicas)
        waited = self.grown or t >= self.waiting_since + self.model.shrink_after(stay=False)
        if fit >= self.replicas or (fit >= self.min_replicas and waited):
            self.start(t, fit)
        elif fit >= self.min_replicas:
            self.timers["shrink"] = self.waiting_since + self.model.shrink_after(stay=False)

    def start(self, t: float, size: int) -> None:
        pull = size > self.pulled
        self.pulled = max(self.pulled, size)
        first, grow = self.cold_starts == 0, self.grown
        self.state, self.size, self.last_change, self.grown = "starting", size, t, False
        self.cold_starts += 1
        self.timers.pop("shrink", None)
        self.timers["ready"] = t + self.model.cold_start(pull)
        if first:
            self.starting_s = self.model.cold_start(pull)
        else:
            pause = self.model.phases.old_pods_gone + self.model.cold_start(pull)
            self.restarted(pause, planned=grow)

    def on_teardown(self, t: float) -> None:
        self.try_start(t)

    def on_shrink(self, t: float) -> None:
        if self.state == "down":
            self.try_start(t)

    def on_ready(self, t: float) -> None:
        self.state, self.resume_at = "running", t
        self.ledger.clock = t
        self.want_grow(t)

    def want_grow(self, t: float) -> None:
        growing = "grow" in self.timers or "grow_commit" in self.timers
        if self.size < self.replicas and self.avail > self.size and not growing:
            self.timers["grow"] = max(t, self.last_change + self.model.grow_interval_s())

    def on_grow(self, t: float) -> None:
        # The operator asks for a checkpoint and resubmits only once it committed.
        if self.state == "running" and self.avail > self.size:
            if not self.grow_pays(min(self.avail, self.replicas)):
                self.timers["grow"] = t + GROW_RECHECK_S
                return
            commit_at = self.ledger.save(t, self.model.commit_s(self.size))
            self.timers["grow_commit"] = commit_at

    def on_grow_commit(self, t: float) -> None:
        if self.state != "running" or self.avail <= self.size:
            return  # capacity went again: the grow is abandoned, the gang trains on
        self.ledger.rollback()
        self.state, self.size, self.grown = "down", 0, True
        self.timers["teardown"] = t + self.model.phases.old_pods_gone


class WarmGang(Gang):
    """Survivors stay and keep their state; only new ranks start, while the gang trains on
    (``elastic-warm``; ``fixed-warm`` with ``min_replicas == replicas``)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.joining: list[list[Any]] = []
        """``[ready_at, ranks, cold]`` of each batch of new ranks still starting."""

    def training(self) -> bool:
        return self.size >= max(self.min_replicas, 1)

    def begin(self, t: float, avail: int) -> None:
        self.avail = avail
        self.add_joiners(t)

    def joining_ranks(self) -> int:
        return sum(batch[1] for batch in self.joining)

    def on_change(self, t: float, before: int, after: int, noticed: bool) -> None:
        self.capacity(before, after)
        if after > before:
            self.add_joiners(t)
            return
        hit = self.ranks_lost(before - after, after)
        self.drop_joiners(max(self.size - hit + self.joining_ranks() - after, 0))
        if hit:
            self.lose(t, hit, noticed)
            self.add_joiners(t)  # room the gang had not taken, now that it re-forms

    def on_notice(self, t: float, before: int, after: int) -> None:
        # Survivors holding a replica need no save; a gang about to lose every rank (or whose
        # state is not replicated) saves as the product does.
        lost = self.ranks_lost(self.avail - after, after)
        alone = lost >= self.size or not self.model.state_replicated
        if self.training() and lost > 0 and alone:
            self.ledger.save(t, self.model.commit_s(self.size))

    def ranks_lost(self, gone: int, after: int) -> int:
        """How many of the ``gone`` nodes were training ranks: all that can be, first
        (pessimistic), or with ``idle_lost_first`` only those the room left cannot hold."""
        if self.model.idle_lost_first:
            return min(max(self.size + self.joining_ranks() - after, 0), self.size)
        return min(gone, self.size)

    def lose(self, t: float, ranks: int, noticed: bool) -> None:
        m = self.model
        in_step = self.training() and t >= self.resume_at
        self.interruptions += in_step
        self.losses += 1
        self.ledger.abandon_saves()
        self.size -= ranks
        if self.size == 0:
            self.ledger.every.loss(self.ledger.rollback())
        elif m.state_replicated:
            if in_step and not noticed:
                self.ledger.lose_step(m.step_s * (self.size + ranks))
            self.ledger.every.loss(False)
            self.reforms += 1
            seen = t + m.detect(noticed)
            pause = self.after_loss(seen, noticed)
            self.restarted(m.detect(noticed) + pause)
            self.resume_at = max(self.resume_at, seen + pause)
        else:
            self.ledger.every.loss(self.ledger.rollback())
            self.reforms += 1
            reload = m.phases.checkpoint_fetched + m.phases.loaded
            self.resume_at = max(self.resume_at, t + m.detect(noticed) + m.reform_s + reload)

    def on_grow(self, t: float) -> None:
        self.add_joiners(t)

    def after_loss(self, seen: float, noticed: bool) -> float:
        """From the loss's detection (at ``seen``) until the survivors train again (state
        replicated)."""
        return self.model.reform_s

    def join_cost(self, pull: bool) -> float:
        """From the capacity's return until a new rank of a running gang can join."""
        return self.model.join(pull)

    def switch(self, t: float) -> float:
        """The pause of the running gang when new ranks join it at ``t``."""
        return self.model.reform_s

    def add_joiners(self, t: float, *, restore: bool = False) -> None:
        """Start new ranks for the room the gang has not taken (``restore``: the room a loss
        left, which the operator takes whether or not a grow would pay)."""
        want = min(self.avail, self.replicas) - self.size - self.joining_ranks()
        if want <= 0:
            return
        members = self.size + self.joining_ranks() + want
        elastic = self.min_replicas < self.replicas
        if self.training() and elastic and not restore and not self.grow_pays(members):
            self.timers["grow"] = t + GROW_RECHECK_S
            return
        pull = members > self.pulled
        self.pulled = max(self.pulled, members)
        cold = self.size == 0
        cost = self.model.cold_start(pull) if cold else self.join_cost(pull)
        if cold and self.cold_starts == 0:
            self.starting_s = cost
        self.joining.append([t + cost, want, cold])
        self.timers["join"] = min(batch[0] for batch in self.joining)

    def drop_joiners(self, ranks: int) -> None:
        while ranks > 0 and self.joining:
            batch = self.joining[-1]
            taken = min(ranks, batch[1])
            batch[1] -= taken
            ranks -= taken
            if batch[1] == 0:
                self.joining.pop()
        if self.joining:
            self.timers["join"] = min(batch[0] for batch in self.joining)
        else:
            self.timers.pop("join", None)

    def on_join(self, t: float) -> None:
        p = self.model.phases
        for batch in sorted(b for b in self.joining if b[0] <= t):
            if self.size == 0 and not batch[2]:
                # Its peers all went while it started: it reads the checkpoint instead.
                batch[0], batch[2] = (
                    t + p.checkpoint_fetched + p.loaded + p.process_group_formed,
                    True,
                )
                continue
            self.joining.remove(batch)
            if self.size == 0:
                self.ledger.rollback()
                self.cold_starts += 1
                self.resume_at = self.ledger.clock = t
            else:
                self.reforms += 1
                pause = self.switch(t)
                self.restarted(pause, planned=True)
                self.resume_at = max(self.resume_at, t + pause)
            self.size += batch[1]
        if self.joining:
            self.timers["join"] = min(batch[0] for batch in self.joining)


class StayGang(WarmGang):
    """``recovery.survivors: Stay`` as the product builds it (``elastic-stay``, ``fixed-stay``):
    kept pods stay, but their agent restarts every worker, and the new workers load the newest
    commit. A loss without notice first waits for one survivor's save of the last finished
    step, a noticed one for the gang's save on the node's shutdown; a join waits for the
    running gang's save of the step it reached (``stop: save``); new pods start in standby
    meanwhile. An elastic gang left below its full size first waits ``shrinkAfterSeconds``
    for the lost capacity, as any elastic attempt does, before the kept pods are told the new
    membership (capacity back within that wait gets new pods at once); once it trains, it grows
    no sooner than ``grow.minIntervalSeconds`` after it resumed."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.restoring = False
        """A loss left room that joins warm (``after_loss``): the ``add_joiners`` right after the
        loss (``on_change``) takes it at once."""
        self.tainted = 0
        """Nodes still in the trace whose notice made their ranks leave (``switch_noticed``):
        the gang sees the capacity without them until they go."""
        self.noticed: list[int] = []
        """Per notice whose loss is still to come, in order: the nodes it tainted (0: the loss
        is handled when it comes)."""
        self.leaving: list[tuple[float, int]] = []
        """``(at, ranks)`` of each leave at a notice still to come (``on_leave``)."""

    def on_change(self, t: float, before: int, after: int, noticed: bool) -> None:
        """A change of the trace as the gang sees it, without the tainted nodes: the loss of
        nodes whose ranks left at its notice changes nothing."""
        gone = self.noticed.pop(0) if noticed and self.noticed else 0
        seen_before = before - self.tainted
        self.tainted -= gone
        seen_after = after - self.tainted
        if seen_after == seen_before:
            self.capacity(seen_before, seen_after)
            return
        super().on_change(t, seen_before, seen_after, noticed)

    def on_notice(self, t: float, before: int, after: int) -> None:
        """With ``switch_noticed``, in an elastic gang with replicated state whose kept ranks
        are ``minReplicas`` or more: the noticed nodes are tainted at once (new pods meant for
        them go) and their ranks leave ``notice_detect_s`` later (``on_leave``). Otherwise as
        without the flag: the loss is handled when it comes."""
        m = self.model
        gone = max(min(before - after, self.avail), 0)
        hit = self.ranks_lost(gone, self.avail - gone)
        kept = self.size - hit - sum(ranks for _, ranks in self.leaving)
        elastic = self.min_replicas < self.replicas and m.state_replicated
        if not (m.switch_noticed and elastic and self.size > 0 and kept >= self.min_replicas):
            self.noticed.append(0)
            super().on_notice(t, before, after)
            return
        self.noticed.append(gone)
        self.tainted += gone
        self.capacity(self.avail, self.avail - gone)
        self.drop_joiners(max(self.size - hit + self.joining_ranks() - self.avail, 0))
        if hit:
            self.leaving.append((t + m.notice_detect_s, hit))
            self.timers["leave"] = self.leaving[0][0]

    def on_leave(self, t: float) -> None:
        """The ranks on noticed nodes leave at a step boundary and the kept ranks switch in
        process to the smaller gang: a re-form, no save, no restart, no step lost (a save in
        flight commits: the switch waits for it, not modelled, as at a grow). Room the gang can
        take is taken as after a loss (``room_joins_warm``)."""
        m = self.model
        ranks = min(sum(r for at, r in self.leaving if at <= t), self.size)
        self.leaving = [(at, r) for at, r in self.leaving if at > t]
        if self.leaving:
            self.timers["leave"] = self.leaving[0][0]
        if ranks == 0:
            return
        self.interruptions += self.training() and t >= self.resume_at
        self.losses += 1
        self.ledger.every.loss(False)
        self.reforms += 1
        self.size -= ranks
        self.restarted(m.reform_s)
        self.resume_at = max(self.resume_at, t + m.reform_s)
        extra = min(self.avail, self.replicas) - self.size - self.joining_ranks()
        if extra > 0:
            self.restoring = self.room_joins_warm(extra)
            self.add_joiners(t)

    def add_joiners(self, t: float, *, restore: bool = False) -> None:
        if self.restoring:
            self.restoring = False
            super().add_joiners(t, restore=True)
            return
        elastic = self.min_replicas < self.replicas
        grow_at = self.resume_at + self.model.grow_interval_s()
        if elastic and self.size > 0 and self.resume_at <= t < grow_at:
            self.timers["grow"] = grow_at
            return
        super().add_joiners(t)

    def on_grow(self, t: float) -> None:
        self.add_joiners(t)

    def after_loss(self, seen: float, noticed: bool) -> float:
        """The kept ranks' save and restart. Room the gang can take at once is left to
        ``add_joiners`` (standby pods, then a warm join) where ``room_joins_warm`` says so;
        otherwise the operator's next attempt is as large as what fits, its new pods start
        cold with it, and the kept ranks wait for them. (A noticed loss whose ranks left at the
        notice, ``switch_noticed``, never comes here.) With ``switch_lost`` the kept ranks rejoin
        in process instead, when no new pod starts with them (``rejoins``)."""
        m = self.model
        wait = m.shrink_after(stay=True) if self.avail < self.replicas else 0.0
        gave_up = not noticed and m.phases.detected + wait > m.hold_s(stay=True)
        if self.rejoins() and not gave_up:
            extra = min(self.avail, self.replicas) - self.size - self.joining_ranks()
            self.restoring = extra > 0
            return wait + m.reform_s
        if gave_up:  # the kept workers ended unsaved: their agents restart them from the commit
            self.ledger.rollback()
            pause = wait + m.restart()
            self.ledger.clock = seen + pause
        else:
            save = m.commit_s(self.size) if noticed else m.survivor_save(self.size)
            pause = wait + self.restart_from_save(seen + wait, save)
        extra = min(self.avail, self.replicas) - self.size - self.joining_ranks()
        self.restoring = extra > 0 and self.room_joins_warm(extra)
        if extra > 0 and self.min_replicas < self.replicas and not self.restoring:
            members = self.size + self.joining_ranks() + extra
            pull = members > self.pulled
            self.pulled = max(self.pulled, members)
            pause = max(pause, wait + m.cold_start(pull))
            self.ledger.clock = seen + pause
            self.size += extra
            self.timers.pop("grow", None)
        return pause

    def rejoins(self) -> bool:
        """Whether the kept ranks rejoin in process after a loss (``switch_lost``): an elastic
        gang with replicated state whose kept ranks are ``minReplicas`` or more, and whose next
        attempt is only them (the operator's ``stop: rejoin``), so room it can take at once
        joins warm afterwards (``room_joins_warm``), or there is none."""
        m = self.model
        elastic = self.min_replicas < self.replicas and m.state_replicated
        if not (m.switch_lost and elastic and self.size >= self.min_replicas):
            return False
        extra = min(self.avail, self.replicas) - self.size - self.joining_ranks()
        return extra <= 0 or self.room_joins_warm(extra)

    def room_joins_warm(self, extra: int) -> bool:
        """Whether the ``extra`` pods the room at a loss holds join warm after the kept ranks
        restart alone (``room_at_loss``; the operator's ``elastic.survivors_first``)."""
        mode = self.model.room_at_loss
        elastic = self.min_replicas < self.replicas
        if mode == "cold" or not elastic or self.size < self.min_replicas:
            return False
        return mode == "warm" or survivors_first_pays(
            kept=self.size,
            size=self.size + self.joining_ranks() + extra,
            starting_s=self.starting_s,
            planned_restarting_s=self.planned_restarting_s,
            planned_restarts=self.planned_restarts,
        )

    def join_cost(self, pull: bool) -> float:
        return self.model.standby(pull)

    def switch(self, t: float) -> float:
        m = self.model
        if m.switch_grows and self.min_replicas < self.replicas:  # the CRD: elastic only
            return m.reform_s + m.checkpoint_gb / m.peer_gbps
        return self.restart_from_save(t, m.commit_s(self.size))

    def restart_from_save(self, t: float, save_s: float) -> float:
        """A save of the live state begun at ``t`` that commits ``save_s`` later, then every
        worker restarted from it; the new workers' interval counts from their start."""
        self.ledger.save(t, save_s)
        pause = save_s + self.model.restart()
        self.ledger.clock = t + pause
        return pause


@dataclass(frozen=True)
class Result:
    """One policy at one scale over one trace."""

    trace: str
    policy: str
    nodes: int
    min_replicas: int
    goodput: float
    ceiling: float
    kept_node_h: float
    ideal_node_h: float
    rolled_back_node_h: float
    interruptions: int
    """Losses that hit a training gang."""
    cold_starts: int
    reforms: int
    interval_s: float
    """The checkpoint interval in force at the end of the trace."""


def events(capacity: Trace, model: Model) -> list[tuple[float, int, str, int, int, bool]]:
    """The trace's changes, and a notice ``notice_s`` before each loss that gets one: the
    ``notice_share`` of losses, spread evenly (loss ``i`` when ``floor((i+1)s) > floor(i s)``)."""
    out: list[tuple[float, int, str, int, int, bool]] = []
    losses = 0
    share = model.notice_share
    for t, before, after in capacity.changes():
        noticed = False
        if after < before:
            noticed = math.floor((losses + 1) * share + 1e-9) > math.floor(losses * share + 1e-9)
            losses += 1
            if noticed:
                out.append((max(0.0, t - model.notice_s), 0, "notice", before, after, True))
        out.append((t, 1, "change", before, after, noticed))
    out.sort(key=lambda e: (e[0], e[1]))
    return out


def min_replicas(policy: str, replicas: int, model: Model) -> int:
    if policy.startswith("fixed"):
        return replicas
    return max(1, min(replicas, math.ceil(model.min_fraction * replicas - 1e-9)))


def simulate(capacity: Trace, replicas: int, policy: str, model: Model) -> Result:
    """Replay ``capacity`` (already scaled to the job) under ``policy``."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: one of {', '.join(POLICIES)}")
    least = min_replicas(policy, replicas, model)
    ledger = Ledger(Interval(model), model.save_block_s)
    machine = {"warm": WarmGang, "stay": StayGang}.get(policy.rsplit("-", 1)[-1], ColdGang)
    gang = machine(model, replicas, least, ledger)
    gang.begin(0.0, min(capacity.points[0][1], replicas))
    end = capacity.duration
    queue = events(capacity, model)
    i = 0
    while True:
        te = queue[i][0] if i < len(queue) else INF
        tt = gang.next_timer()
        t = min(te, tt)
        if t >= end:
            break
        gang.advance(t)
        if tt <= te:
            gang.fire(t)
            continue
        _, _, kind, before, after, noticed = queue[i]
        i += 1
        if kind == "notice":
            gang.on_notice(t, min(before, replicas), min(after, replicas))
        else:
            gang.on_change(t, min(before, replicas), min(after, replicas), noticed)
    gang.advance(end)
    gang.finish(end)
    ideal = capacity.node_seconds(cap=replicas)
    usable = sum(
        (t1 - t0) * min(n, replicas)
        for (t0, n), (t1, _) in itertools.pairwise(capacity.points)
        if min(n, replicas) >= least
    )
    return Result(
        trace=capacity.name,
        policy=policy,
        nodes=replicas,
        min_replicas=least,
        goodput=ledger.committed / ideal if ideal else 0.0,
        ceiling=usable / ideal if ideal else 0.0,
        kept_node_h=ledger.committed / 3600,
        ideal_node_h=ideal / 3600,
        rolled_back_node_h=ledger.rolled_back / 3600,
        interruptions=gang.interruptions,
        cold_starts=gang.cold_starts,
        reforms=gang.reforms,
        interval_s=ledger.every.seconds(model.commit_s(replicas)),
    )


def run(
    trace: Trace,
    nodes: Sequence[int],
    model: Model,
    policies: Sequence[str] = POLICIES,
    scaling: str = "tile",
) -> list[Result]:
    """Every policy at every scale: the trace scaled to each size (``spot_traces.scaled``, or
    ``proportional``), then replayed whole."""
    results = []
    for size in nodes:
        if scaling == "tile":
            capacity = spot_traces.scaled(trace, size)
        else:
            capacity = spot_traces.proportional(trace, size)
        results.extend(simulate(capacity, size, policy, model) for policy in policies)
    return results


def table(results: Sequence[Result]) -> str:
    """The results as a fixed-width table, one row per scale and policy."""
    head = (
        f"{'nodes':>5} {'policy':<13} {'min':>4} {'goodput':>7} {'ceiling':>7} "
        f"{'losses':>6} {'cold':>5} {'reforms':>7} {'rolled back':>11} {'ckpt every':>10}"
    )
    rows = [head]
    for r in results:
        back = r.rolled_back_node_h / r.ideal_node_h if r.ideal_node_h else 0.0
        rows.append(
            f"{r.nodes:>5} {r.policy:<13} {r.min_replicas:>4} {r.goodput:>7.3f} "
            f"{r.ceiling:>7.3f} {r.interruptions:>6} {r.cold_starts:>5} {r.reforms:>7} "
            f"{back:>10.1%} {r.interval_s:>9.0f}s"
        )
    return "\n".join(rows)


def markdown(results: Sequence[Result]) -> str:
    """The results as a Markdown table: a row per policy, a column per scale, each cell
    ``goodput (ceiling)`` (what docs/goodput.md shows)."""
    sizes = sorted({r.nodes for r in results})
    cells = {(r.policy, r.nodes): f"{r.goodput:.3f} ({r.ceiling:.3f})" for r in results}
    policies = [p for p in POLICIES if any(r.policy == p for r in results)]
    rows = [
        "| policy | " + " | ".join(f"{n} nodes" for n in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    rows += [f"| {p} | " + " | ".join(cells[p, n] for n in sizes) + " |" for p in policies]
    return "\n".join(rows)


def _model_from_args(args: argparse.Namespace) -> tuple[Model, list[str]]:
    phases = Phases(checkpoint_fetched=args.checkpoint_gb / args.fetch_gbps)
    measured: list[str] = []
    if args.costs:
        phases, measured = load_phases(args.costs, phases)
    overrides = {
        f.name: getattr(args, f.name)
        for f in fields(Model)
        if f.name != "phases" and getattr(args, f.name, None) is not None
    }
    overrides["state_replicated"] = not args.not_replicated
    overrides["every_loss_interval"] = args.every_loss_interval
    overrides["grow_only_when_it_pays"] = not args.grow_always
    overrides["idle_lost_first"] = args.idle_lost_first
    overrides["survivor_save_split"] = not args.survivor_save_alone
    overrides["restart_prefetch"] = not args.restart_fetch_after_group
    overrides["switch_grows"] = args.switch_grows or args.in_process_switch
    overrides["switch_noticed"] = args.switch_noticed or args.in_process_switch
    overrides["switch_lost"] = args.switch_lost or args.in_process_switch
    return Model(phases=phases, **overrides), measured


def _model_options(parser: argparse.ArgumentParser) -> None:
    """The options that change the ``Model``: the switches, then every float field by name."""
    parser.add_argument(
        "--not-replicated", action="store_true", help="state sharded, not replicated"
    )
    parser.add_argument(
        "--idle-lost-first",
        action="store_true",
        help="a lost node is an idle one before a training rank (the optimistic bound)",
    )
    parser.add_argument(
        "--grow-always",
        action="store_true",
        help="grow at every return of capacity (grow.onlyWhenItPays: false)",
    )
    parser.add_argument(
        "--survivor-save-alone",
        action="store_true",
        help="one survivor writes the whole replica after a loss (the product before the split)",
    )
    parser.add_argument(
        "--restart-fetch-after-group",
        action="store_true",
        help="a worker restarted in place fetches only once its gang formed (the product before)",
    )
    parser.add_argument(
        "--room-at-loss",
        choices=("pays", "cold", "warm"),
        help="at a loss with room, a Stay gang's kept ranks go on alone and the new ranks join "
        "warm when it pays (the product), never (cold: they wait for the new pods) or always",
    )
    parser.add_argument(
        "--switch-grows",
        action="store_true",
        help="a Stay gang's grows switch the running workers in process (recovery.inProcessSwitch)",
    )
    parser.add_argument(
        "--switch-noticed",
        action="store_true",
        help="recovery.inProcessSwitch at a notice: the noticed ranks leave at the notice and "
        "the kept ranks switch in process (elastic Stay gangs keeping minReplicas)",
    )
    parser.add_argument(
        "--switch-lost",
        action="store_true",
        help="recovery.inProcessSwitch after a loss: the kept ranks rejoin in process "
        "(ckpt.rejoin; elastic Stay gangs keeping minReplicas, no new pod with them)",
    )
    parser.add_argument(
        "--in-process-switch",
        action="store_true",
        help="recovery.inProcessSwitch whole: --switch-grows, --switch-noticed, --switch-lost",
    )
    parser.add_argument(
        "--every-loss-interval",
        action="store_true",
        help="the automatic interval counts every loss, also those survivors cover",
    )
    for f in fields(Model):
        if f.type in ("float", "float | None"):
            unset = {
                "interval_s": "automatic",
                "shrink_after_s": "60, 0 with Stay",
                "grow_min_interval_s": "300, 0 with the in-process switch",
                "loss_hold_s": "the operator's, 140 with Stay",
            }
            default = unset.get(f.name, f.default) if f.default is None else f.default
            parser.add_argument(
                f"--{f.name.replace('_', '-')}", type=float, dest=f.name, help=f"default {default}"
            )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", nargs="+", required=True, help="spot_traces names, or 'all'")
    parser.add_argument("--nodes", type=int, nargs="+", default=[4, 16, 64, 256])
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--costs", help="JSON of measured phase seconds (load_phases)")
    parser.add_argument("--json", help="write every result and the model here")
    parser.add_argument("--scaling", choices=("tile", "proportional"), default="tile")
    parser.add_argument("--markdown", action="store_true", help="Markdown tables, not text")
    parser.add_argument("--fetch-gbps", type=float, default=2.0, help="store read, GB/s a node")
    _model_options(parser)
    args = parser.parse_args(argv)
    if args.checkpoint_gb is None:
        args.checkpoint_gb = Model.checkpoint_gb
    model, measured = _model_from_args(args)
    names = spot_traces.available_traces() if args.trace == ["all"] else args.trace
    missing = sorted(set(spot_traces.known_traces()) - set(spot_traces.available_traces()))
    if args.trace == ["all"] and missing:
        print(f"not here (spot_traces.py fetch): {', '.join(missing)}", file=sys.stderr)
    print(f"phases (s): {asdict(model.phases)}")
    print(f"  from {args.costs}: {', '.join(measured) or 'none'}" if args.costs else "  defaults")
    print(
        f"cold restart {model.cold_start(False):.0f} s (+{model.image_pull_s:.0f} s image pull on "
        f"a new node), warm join {model.join(True):.0f} s, re-form {model.reform_s:.0f} s, "
        f"notice on {model.notice_share:.0%} of losses {model.notice_s:.0f} s ahead"
    )
    out: list[dict[str, Any]] = []
    for name in names:
        trace = spot_traces.load(name)
        print(f"\n{name}  ({trace.source}, {trace.duration / 3600:.1f} h, scaling: {args.scaling})")
        results = run(trace, args.nodes, model, args.policies, args.scaling)
        print(markdown(results) if args.markdown else table(results))
        out.extend({"trace_name": name, **asdict(r)} for r in results)
    if args.json:
        doc = {"model": asdict(model), "phases_measured": measured, "results": out}
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
