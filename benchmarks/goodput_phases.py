"""What the on-cluster goodput replay recorded, turned into figures: goodput, the ceiling, time
lost per cause, recovery phases per interruption, and the ranks' own count of steps lost.

Kept apart from ``goodput.py`` (which drives the cluster) so that every figure is a pure function
of plain records, checkable without a cluster, and so that the definitions sit in one place:

* **times** are seconds on the replay's clock (0 = the start of the trace window), converted
  from the product's own wall-clock timestamps; a Kubernetes timestamp in whole seconds (pod
  creation, ``PodScheduled``, ``startedAt``, ``finishedAt``) is read as the middle of its
  second (+0.5 s), so it is neither early nor late on average;
* **categories of capacity**: at every instant the job has ``usable = min(available, replicas)``
  nodes. They are *below its minimum* when fewer than it can train with are available
  (``replicas`` for a fixed gang, ``minReplicas`` for an elastic one: the ceiling's gap),
  otherwise *training* (the gang trains, at its size; what it leaves idle is *below the
  capacity*), *under notice* (enough nodes, but too few without a termination notice for a new
  gang to land on), *waiting* (an elastic job holding back for its full gang,
  ``shrinkAfterSeconds``) or *restarting* (everything else: detection, teardown, scheduling,
  start, load, first step);
* **phases** of a recovery, in ``goodput_sim.PHASES`` order, each the time from the milestone
  before it on the critical path (a running maximum: a milestone reached before the one ahead
  of it costs nothing), less the time in it spent waiting for capacity, which the simulator
  models itself.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

try:
    from benchmarks import spot_traces
    from benchmarks.goodput_sim import PHASES
except ImportError:  # run as a script: benchmarks/ is the script's folder
    import spot_traces  # type: ignore[no-redef]
    from goodput_sim import PHASES  # type: ignore[no-redef]

Trace = spot_traces.Trace
Obj = dict[str, Any]

SOURCES = {
    "detected": "status.interruptions[].time (the operator's observation)",
    "old_pods_gone": "old gang's containers' finishedAt; a lost node's pods at the loss",
    "pods_created": "status.attemptStartTime of the next attempt",
    "bound": "last rank's PodScheduled=True lastTransitionTime",
    "container_started": "last rank's containerStatuses startedAt",
    "runtime_started": "last rank's rtj-event started: process_started (the interpreter's start)",
    "process_group_formed": "last rank's rtj-event started (imports and rendezvous: one span)",
    "checkpoint_fetched": "last rank's rtj-event fetched",
    "loaded": "last rank's rtj-event resumed",
    "first_step": "rank 0's rtj-event first_step",
}
"""Where each phase's end comes from. The product has a timestamp for every phase but one
split: ``started`` comes after the imports AND the process group, so the imports (torch) are
counted in ``process_group_formed``, not in ``runtime_started``."""


def wall(stamp: str | None) -> float | None:
    """Epoch seconds of an RFC 3339 timestamp; a whole-second one at the middle of its second."""
    if not stamp:
        return None
    at = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    whole = "." not in stamp.split("T", 1)[-1]
    return at + 0.5 if whole else at


def median(values: Iterable[float | None]) -> float | None:
    """Median of the values that are there (None when none is)."""
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


# -- capacity: ideal, ceiling, categories -------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    """The job's state as the recorder saw it at ``t`` (holds until the next tick)."""

    t: float
    attempt: int
    phase: str
    size: int | None
    training: bool
    """The current attempt's gang has trained (``trainingSince``), or a warm join's kept pods
    train on until its switch (``membershipPendingSince``), and the phase is Running."""
    waiting: bool
    """An elastic attempt holding back for its full gang (Pending, ``capacityWaitSince``)."""


def schedulable(capacity: Trace, noticed: Sequence[tuple[float, float]]) -> Trace:
    """The capacity a new gang can be scheduled on: the trace less the nodes under a termination
    notice (tainted at ``noticed[i][0]``, gone at ``noticed[i][1]``). The trace counts such a
    node until it goes, and a running gang keeps training on it, but no new pod lands there:
    a gang that must start while a node is under notice waits as if it were gone."""
    drops = [t for t, before, after in capacity.changes() if after < before]
    # A node goes a few milliseconds after the trace's change: its span ends at the change.
    noticed = [(a, max((t for t in drops if b - 1.0 <= t <= b), default=b)) for a, b in noticed]
    cuts = sorted({t for t, _ in capacity.points} | {t for span in noticed for t in span})
    cuts = [t for t in cuts if 0 <= t <= capacity.duration]
    points = [
        (t, max(0, capacity.available(t) - sum(1 for a, b in noticed if a <= t < b))) for t in cuts
    ]
    return Trace(f"{capacity.name} schedulable", capacity.source, tuple(points))


def ideal_node_seconds(capacity: Trace, replicas: int) -> float:
    """∫ min(available, replicas) dt over the window."""
    return capacity.node_seconds(cap=replicas)


def ceiling(capacity: Trace, replicas: int, need: int) -> float:
    """The share of the ideal node-time at which at least ``need`` nodes were available."""
    total = ideal_node_seconds(capacity, replicas)
    usable = sum(
        (t1 - t0) * min(n, replicas)
        for (t0, n), (t1, _) in itertools.pairwise(capacity.points)
        if n >= need
    )
    return usable / total if total else 0.0


def categorize(
    ticks: Sequence[Tick], capacity: Trace, replicas: int, need: int, free: Trace | None = None
) -> dict[str, float]:
    """Node-seconds of the window per category (module docstring), plus ``idle_s``: wall
    seconds the job did not train. A gang whose size exceeds the nodes available is not
    training, whatever its status says: a rank's node is gone and the loss not yet seen.
    ``free``: the schedulable capacity (``schedulable``); while the job does not train and
    enough nodes are there but too few are free of a notice, the time is ``under_notice``."""
    end = capacity.duration
    free = free or capacity
    cuts = sorted(
        {0.0, end, *(t for t, _ in capacity.points), *(t for t, _ in free.points)}
        | {k.t for k in ticks if k.t < end}
    )
    times = [k.t for k in ticks]
    out = dict.fromkeys(
        ("below_minimum", "under_notice", "waiting", "restarting", "training", "below_capacity"),
        0.0,
    )
    out["idle_s"] = 0.0
    for a, b in itertools.pairwise(c for c in cuts if 0 <= c <= end):
        avail = capacity.available(a)
        usable, dt = min(avail, replicas), b - a
        i = bisect.bisect_right(times, a) - 1
        tick = ticks[i] if i >= 0 else None
        size = (tick.size or 0) if tick else 0
        trains = tick is not None and tick.training and 0 < size <= avail
        if trains:
            out["training"] += size * dt
            out["below_capacity"] += max(0, usable - size) * dt
            continue
        out["idle_s"] += dt
        if avail < need:
            out["below_minimum"] += usable * dt
        elif free.available(a) < need:
            out["under_notice"] += usable * dt
        elif tick is not None and tick.waiting:
            out["waiting"] += usable * dt
        else:
            out["restarting"] += usable * dt
    return out


def waiting_spans(
    ticks: Sequence[Tick], capacity: Trace, need_of: int, end: float
) -> list[tuple[float, float]]:
    """Stretches when a gang of ``need_of`` nodes could not start: fewer available in
    ``capacity`` (pass the ``schedulable`` one), or the job holding back for its full gang.
    Used to take waits out of the phase costs."""
    cuts = sorted({0.0, end, *(t for t, _ in capacity.points), *(k.t for k in ticks)})
    times = [k.t for k in ticks]
    spans: list[tuple[float, float]] = []
    for a, b in itertools.pairwise(c for c in cuts if 0 <= c <= end):
        i = bisect.bisect_right(times, a) - 1
        held = i >= 0 and ticks[i].waiting
        if capacity.available(a) < need_of or held:
            if spans and spans[-1][1] == a:
                spans[-1] = (spans[-1][0], b)
            else:
                spans.append((a, b))
    return spans


def overlap(a: float, b: float, spans: Sequence[tuple[float, float]]) -> float:
    """Seconds of ``[a, b]`` inside ``spans``."""
    return sum(max(0.0, min(b, s1) - max(a, s0)) for s0, s1 in spans)


# -- the work: trained, kept, rolled back -------------------------------------------------------


@dataclass
class AttemptWork:
    """What one attempt's ranks recorded in their ``--trace`` files."""

    attempt: int
    world: int
    resumed_at: int
    """Global samples at its resume."""
    last_sample: int
    last_batch: int | None
    """The step counter after its last step (None: it trained no step)."""
    samples_per_step: int | None = None


def read_work(records_by_rank: dict[int, list[Obj]]) -> dict[int, AttemptWork]:
    """Per attempt, from every rank's trace records (``examples/train_deterministic.py``
    ``--trace``): its resume point and the furthest step any of its ranks finished."""
    work: dict[int, AttemptWork] = {}
    for records in records_by_rank.values():
        current: AttemptWork | None = None
        for rec in records:
            if "resumed_at_sample" in rec:
                a = int(rec.get("attempt", 0))
                current = work.setdefault(
                    a,
                    AttemptWork(
                        a,
                        int(rec["world"]),
                        int(rec["resumed_at_sample"]),
                        int(rec["resumed_at_sample"]),
                        None,
                    ),
                )
            elif current is not None:
                current.last_sample = max(current.last_sample, int(rec["sample"]))
                current.last_batch = max(int(rec["batch"]), current.last_batch or 0)
                current.samples_per_step = len(rec.get("ids") or []) * current.world
    return work


def trained_in_window(work: dict[int, AttemptWork], start: dict[int, int], first: int) -> int:
    """Samples the ranks trained inside the window: each attempt from its resume (attempt
    ``first``, running when the window opened, from where it was then: ``start``) to its last
    step, counted by what the ranks recorded up to the window's end."""
    total = 0
    for a, w in work.items():
        if a < first:
            continue
        begin = start.get(a, w.resumed_at) if a == first else w.resumed_at
        total += max(0, w.last_sample - begin)
    return total


# -- interruptions and their phases -------------------------------------------------------------


@dataclass
class PodSeen:
    """One pod as the recorder saw it (window seconds)."""

    name: str
    attempt: int
    rank: int
    node: str | None = None
    created: float | None = None
    bound: float | None = None
    started: float | None = None
    finished: float | None = None
    gone: float | None = None
    """The first poll that did not list it any more."""


@dataclass
class Loss:
    """A node the replay took away: when (the trace's change; a noticed node's shutdown), which
    pool and slot, with a notice or not."""

    t: float
    node: str
    pool: str
    slot: int
    notice: bool
    tainted_at: float | None = None


@dataclass
class Recovery:
    """One interruption of a job, from the loss that caused it (or the operator's own restart:
    a grow, a re-shrink) to the next gang's first step."""

    attempt: int
    cause: str
    detected: float
    loss: Loss | None = None
    milestones: dict[str, float | None] = field(default_factory=dict)
    """Phase -> window seconds when it ended (None: not recorded)."""
    waits: list[tuple[float, float]] = field(default_factory=list)
    """Stretches in which the next gang could not start: too few nodes, or holding back."""
    next_size: int | None = None
    until: float | None = None
    """The window's end: how far an unfinished recovery is counted."""
    steps_lost_status: int | None = None
    steps_lost_ranks: int | None = None
    samples_lost_ranks: int | None = None
    outcome: str = ""
    """``trained`` (the next gang took a step), ``interrupted again`` (before it did) or
    ``not trained in the window``."""
    last_committed_step: int | None = None
    """The operator's last committed step when the attempt ended."""
    next_resumed_at_sample: int | None = None
    """Where the next gang's ranks resumed (global samples)."""

    @property
    def start(self) -> float:
        """The loss, or the operator's decision when no loss of ours caused it."""
        return self.loss.t if self.loss else self.detected

    @property
    def recovery_s(self) -> float | None:
        """Start to the next gang's first step (None: it took no step in the window)."""
        end = self.milestones.get("first_step")
        return None if end is None else end - self.start

    @property
    def waited_s(self) -> float:
        """Seconds of the recovery spent waiting for capacity or for the full gang."""
        end = self.milestones.get("first_step")
        if end is None:
            end = self.until if self.until is not None else self.start
        return overlap(self.start, end, self.waits)


def gone_at(pod: PodSeen, losses: dict[str, Loss]) -> float | None:
    """When a pod stopped holding its node: the first of its container's end, its node's loss
    (a reclaimed node reports nothing) and the first poll without it."""
    lost = losses.get(pod.node or "")
    found = [x for x in (pod.finished, pod.gone, lost.t if lost else None) if x is not None]
    return min(found) if found else None


def _last(values: Iterable[float | None]) -> float | None:
    """The latest of values that must all be there (None if any is missing or none is given)."""
    found = list(values)
    if not found or any(v is None for v in found):
        return None
    return max(v for v in found if v is not None)


def milestones(
    old: Sequence[PodSeen],
    new: Sequence[PodSeen],
    *,
    detected: float,
    created: float | None,
    runtime: dict[str, list[float | None]],
    losses: dict[str, Loss],
) -> dict[str, float | None]:
    """The end of each phase of one recovery (window seconds). ``runtime``: per runtime
    milestone (``runtime_started``, ``process_group_formed``, ``checkpoint_fetched``,
    ``loaded``, ``first_step``) the times the ranks recorded; the gang is as late as its last
    rank (``first_step`` is rank 0's alone). Old pods the new gang keeps
    (``recovery.survivors: Stay``) never go: the old gang is gone when the others are, at
    detection when none goes."""
    if created is None:
        created = min((p.created for p in new if p.created is not None), default=None)
    staying = {p.name for p in new}
    leaving = [p for p in old if p.name not in staying]
    marks: dict[str, float | None] = {
        "detected": detected,
        "old_pods_gone": _last(gone_at(p, losses) for p in leaving) if leaving else detected,
        "pods_created": created,
        "bound": _last(p.bound for p in new),
        "container_started": _last(p.started for p in new),
    }
    for name in PHASES[5:]:
        values = runtime.get(name) or []
        expected = 1 if name == "first_step" else len(new)
        marks[name] = _last(values) if len(values) >= expected else None
    return marks


def phase_costs(recovery: Recovery) -> dict[str, float]:
    """Each phase's own cost on the critical path (a running maximum from the recovery's start),
    less its time inside the recovery's waits; phases after a missing milestone are left out."""
    out: dict[str, float] = {}
    at = recovery.start
    for name in PHASES:
        end = recovery.milestones.get(name)
        if end is None:
            break
        end = max(at, end)
        out[name] = max(0.0, end - at - overlap(at, end, recovery.waits))
        at = end
    return out


def phase_table(recoveries: Sequence[Recovery]) -> dict[str, Obj]:
    """Per phase, over the recoveries: the median own cost (``p50``, what ``goodput_sim.py
    --costs`` reads), the median seconds since the start as recorded (waits included), how many
    recoveries reached it, and where its timestamp comes from."""
    since: dict[str, list[float]] = {p: [] for p in PHASES}
    costs: dict[str, list[float]] = {p: [] for p in PHASES}
    for r in recoveries:
        for name, end in r.milestones.items():
            if end is not None:
                since[name].append(end - r.start)
        for name, cost in phase_costs(r).items():
            costs[name].append(cost)
    return {
        name: {
            "p50": None if not costs[name] else round(statistics.median(costs[name]), 3),
            "since_start_p50": None
            if not since[name]
            else round(statistics.median(since[name]), 3),
            "n": len(costs[name]),
            "source": SOURCES[name],
        }
        for name in PHASES
    }


# -- the operator's stepsLost against the ranks' own count --------------------------------------


def ranks_lost(
    work: dict[int, AttemptWork], attempt: int, resumed_by: int
) -> tuple[int | None, int | None]:
    """Steps (in the ended attempt's own step units) and samples its ranks had trained past the
    point the next gang resumed from: what the interruption rolled back, from the ranks' own
    records. Counted in samples first: after a change of global batch (an elastic gang that
    keeps its per-rank batch) the step counter is rescaled, so steps saved by another gang size
    are in other units."""
    ended, nxt = work.get(attempt), work.get(resumed_by)
    if ended is None or nxt is None or ended.last_batch is None:
        return None, None
    samples = max(0, ended.last_sample - nxt.resumed_at)
    per = ended.samples_per_step
    return (samples // per if per else None), samples


# -- elastic questions --------------------------------------------------------------------------


def partial_starts(
    sizes: Sequence[Obj],
    capacity: Trace,
    replicas: int,
    first_steps: dict[int, float | None],
    end: float,
) -> list[Obj]:
    """Each gang started below ``replicas``: its size, the nodes available when it was created,
    and the most available before its first step (more than its size: it started small while
    capacity was still coming back)."""
    out = []
    for rec in sizes:
        size, t0 = int(rec["size"]), rec["t"]
        if size >= replicas or t0 is None or not 0 <= t0 <= end:
            continue
        t1 = first_steps.get(int(rec["attempt"])) or end
        points = [n for t, n in capacity.points if t0 < t <= t1]
        most = max([capacity.available(t0), *points])
        out.append(
            {
                "attempt": int(rec["attempt"]),
                "size": size,
                "created_s": round(t0, 2),
                "available_at_creation": capacity.available(t0),
                "most_available_before_first_step": min(most, replicas),
                "capacity_still_returning": min(most, replicas) > size,
            }
        )
    return out


def grows_untrained(
    interruptions: Sequence[Obj], first_steps: dict[int, float | None], work: dict[int, AttemptWork]
) -> list[Obj]:
    """Each grow, and whether the gang it ended had trained (a first step seen by the operator,
    and steps past its resume in its ranks' records)."""
    out = []
    for item in interruptions:
        if item.get("cause") != "Grow":
            continue
        a = int(item["attempt"])
        w = work.get(a)
        trained = None if w is None else w.last_sample - w.resumed_at
        out.append(
            {
                "attempt": a,
                "grown_at_s": round(item["t"], 2),
                "first_step_s": None if first_steps.get(a) is None else round(first_steps[a], 2),  # type: ignore[arg-type]
                "samples_trained": trained,
                "had_trained": bool(first_steps.get(a) is not None and (trained or 0) > 0),
            }
        )
    return out


# -- the product's own account (status.goodput) -------------------------------------------------

ACCOUNT_FIELDS = {
    "Starting": "startingSeconds",
    "Training": "trainingSeconds",
    "WaitingForCapacity": "waitingForCapacitySeconds",
    "Restarting": "restartingSeconds",
    "BackingOff": "backoffSeconds",
    "Suspended": "suspendedSeconds",
}
"""``status.goodput.activity`` -> the field its open interval is added to."""


def account_at(account: Obj | None, now: float) -> dict[str, float]:
    """The operator's account (``status.goodput``) as of ``now`` (epoch seconds): its closed
    durations plus the open interval of the current activity, and its committed samples."""
    if not account:
        return {}
    out = {f: float(account.get(f) or 0.0) for f in ACCOUNT_FIELDS.values()}
    out["rolledBackSeconds"] = float(account.get("rolledBackSeconds") or 0.0)
    out["rolledBackSamples"] = float(account.get("rolledBackSamples") or 0.0)
    out["committedSamples"] = float(account.get("committedSamples") or 0.0)
    since = wall(account.get("activitySince"))
    field_name = ACCOUNT_FIELDS.get(str(account.get("activity")))
    if field_name and since is not None:
        out[field_name] += max(0.0, now - since)
    return out


def account_window(before: Obj | None, after: Obj | None, t0: float, t1: float) -> Obj:
    """What the operator's account says of the window ``[t0, t1]``: each figure's change, and
    its goodput over the window as it defines it (committed samples over the full-size rate
    times the elapsed time: dedicated nodes, not the capacity the trace gave)."""
    a, b = account_at(before, t0), account_at(after, t1)
    if not a or not b:
        return {}
    delta = {k: round(b[k] - a[k], 1) for k in b}
    rate = (after or {}).get("fullSizeSamplesPerSecond")
    fraction = delta["committedSamples"] / (rate * (t1 - t0)) if rate else None
    return {
        "delta": delta,
        "full_size_rate": rate,
        "rate_source": (after or {}).get("fullSizeRate"),
        "window_fraction": None if fraction is None else round(fraction, 4),
        "lifetime_percent": (after or {}).get("percent"),
    }
