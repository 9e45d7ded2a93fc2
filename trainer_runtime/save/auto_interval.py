"""``interval="auto"``: save as often as the job's own save cost and interruption rate call for.

A fixed interval is right for one preemption rate only: saving every 30 minutes wastes little
on a node that lives for days and loses a quarter of an hour per interruption on one that lives
for twenty minutes; saving every minute is the opposite mistake. The first-order optimum is
Young's and Daly's: with a checkpoint cost ``C`` (the time one save holds training) and a mean
time between interruptions ``M``, the interval between saves that loses the least time is
``sqrt(2 * C * M)`` (Young 1974, Daly 2006; exact enough while ``C`` is small next to ``M``).

Both inputs are measured, not guessed by the user. ``C`` is what this process's saves held
training: the whole save when synchronous, the call and the staging wait when asynchronous
(``SavedCheckpoint.held_s``); the estimate is the mean of the last few saves, so the interval
follows a checkpoint that grows or a disk that slows. ``M`` comes from the operator
(``RTJ_MTBI_SECONDS``: the job's own running time over its interruptions that rolled work back,
or a one-hour prior before the first); outside a cluster it is that prior. The result is clamped
within ``interval_min``/``interval_max`` and, for asynchronous saves, never below the wall time
of a commit (a save cannot start before the previous one committed without waiting or skipping).
The MTBI also grows while this process runs uninterrupted, as the operator's own figure would:
``M + t / (n + 1)`` after ``t`` seconds, ``n`` being the interruptions it was computed over
(``RTJ_INTERRUPTIONS``). Without that a job would keep the one-hour prior for its whole first
attempt, however long that attempt lives.

Rejected: a step-count interval derived from the time one (the step time varies with the data
and across ranks, so the ranks could not agree on it without communicating anyway), and letting
the operator compute the interval (it does not see the save cost, the runtime does).
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

from .. import envvars, events
from ..errors import ConfigError
from ..run import arguments

DEFAULT_MTBI_S = 3600.0
"""The prior mean time between interruptions: one hour, until the operator measured one."""
DEFAULT_SAVE_COST_S = 5.0
"""The save cost assumed before this process measured a save of its own."""
DEFAULT_MIN_S = 60.0
"""Default lower bound of the automatic interval."""
DEFAULT_MAX_S = 4 * 3600.0
"""Default upper bound of the automatic interval."""
COST_WINDOW = 5
"""Saves the cost estimate averages (the most recent)."""
MATERIAL_CHANGE = 0.2
"""A new interval is reported (an ``interval_chosen`` event) when it differs from the last
reported one by more than this fraction."""


def young_daly(save_cost_s: float, mtbi_s: float) -> float:
    """The Young-Daly interval ``sqrt(2 * C * M)`` in seconds; 0 for a free save."""
    if save_cost_s < 0 or mtbi_s <= 0:
        raise ValueError(
            f"young_daly(save_cost_s={save_cost_s}, mtbi_s={mtbi_s}): expected a cost >= 0 "
            "and a mean time between interruptions > 0"
        )
    return math.sqrt(2.0 * save_cost_s * mtbi_s)


def clamp(value: float, low: float, high: float) -> float:
    """``value`` within ``[low, high]``."""
    return min(max(value, low), high)


def _seconds(arg: str, value: float | timedelta | None, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{arg}={value!r}: expected a number of seconds > 0 or a timedelta")
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{arg}={value!r}: expected a number of seconds > 0 or a timedelta")
    return float(value)


@dataclass(frozen=True)
class AutoIntervalOptions:
    """The user's bounds of the automatic interval, in seconds (validated)."""

    min_s: float = DEFAULT_MIN_S
    max_s: float = DEFAULT_MAX_S

    @classmethod
    def resolve(
        cls, interval_min: float | timedelta | None, interval_max: float | timedelta | None
    ) -> AutoIntervalOptions:
        low = _seconds("interval_min", interval_min, DEFAULT_MIN_S)
        high = _seconds("interval_max", interval_max, max(DEFAULT_MAX_S, low))
        if low > high:
            raise ConfigError(
                f"interval_min={low:g}s is above interval_max={high:g}s: expected min <= max"
            )
        return cls(min_s=low, max_s=high)


def interruptions_from(env: Mapping[str, str]) -> int:
    """``RTJ_INTERRUPTIONS``, the count the operator's MTBI was computed over (0 when unset);
    a value that is not a whole number >= 0 is a ``ConfigError`` naming the variable."""
    raw = env.get(envvars.INTERRUPTIONS, "").strip()
    if not raw:
        return 0
    if not raw.isdigit():
        raise ConfigError(f"{envvars.INTERRUPTIONS}={raw!r}: expected a whole number >= 0")
    return int(raw)


def mtbi_from(env: Mapping[str, str]) -> tuple[float, str]:
    """The mean time between interruptions and where it came from: ``RTJ_MTBI_SECONDS``
    (``operator``) or the one-hour prior (``prior``). A value that is not a positive number is
    a ``ConfigError`` naming the variable."""
    if not env.get(envvars.MTBI_SECONDS, "").strip():
        return DEFAULT_MTBI_S, "prior"
    value = arguments.environment_seconds(
        envvars.MTBI_SECONDS, env, DEFAULT_MTBI_S, "a positive number of seconds", lambda s: s > 0
    )
    return value, "operator"


@dataclass
class Choice:
    """One decision of the rule, as its event reports it."""

    interval_s: float
    save_cost_s: float
    commit_s: float | None
    mtbi_s: float
    mtbi_source: str
    measured_saves: int
    clamped: str | None
    """``min``, ``max`` or ``commit`` when a bound decided the value, else None."""


@dataclass
class AutoInterval:
    """Decides when the next save is due, by time, and re-evaluates at every measured save."""

    options: AutoIntervalOptions
    mtbi_s: float
    """The MTBI when this process started."""
    mtbi_source: str = "prior"
    interruptions: int = 0
    """The interruptions ``mtbi_s`` was computed over (its growth while this process lives)."""
    started_at: float | None = None
    """This process's first look at the clock."""
    now: float | None = None
    """The clock at the last look (``due``)."""
    holds: deque[float] = field(default_factory=lambda: deque(maxlen=COST_WINDOW))
    commits: deque[float] = field(default_factory=lambda: deque(maxlen=COST_WINDOW))
    last_save_at: float | None = None
    reported_s: float | None = None

    @property
    def mtbi_now(self) -> float:
        """The MTBI with this process's own time up counted in: ``M + t / (n + 1)``."""
        if self.started_at is None or self.now is None:
            return self.mtbi_s
        return self.mtbi_s + max(self.now - self.started_at, 0.0) / (self.interruptions + 1)

    def choose(self) -> Choice:
        """The interval the measurements so far call for."""
        cost = sum(self.holds) / len(self.holds) if self.holds else DEFAULT_SAVE_COST_S
        commit = max(self.commits) if self.commits else None
        mtbi = self.mtbi_now
        ideal = young_daly(cost, mtbi)
        low = self.options.min_s
        floor = "min"
        if commit is not None and commit > low:
            low, floor = min(commit, self.options.max_s), "commit"
        value = clamp(ideal, low, self.options.max_s)
        clamped = None
        if value != ideal:
            clamped = "max" if value == self.options.max_s and ideal > value else floor
        return Choice(
            interval_s=value,
            save_cost_s=cost,
            commit_s=commit,
            mtbi_s=mtbi,
            mtbi_source=self.mtbi_source,
            measured_saves=len(self.holds),
            clamped=clamped,
        )

    @property
    def interval_s(self) -> float:
        return self.choose().interval_s

    def record(self, held_s: float, commit_s: float | None) -> None:
        """One save's measurements: what it held training, and its commit's wall time."""
        self.holds.append(max(0.0, float(held_s)))
        if commit_s is not None:
            self.commits.append(max(0.0, float(commit_s)))

    def to_report(self) -> Choice | None:
        """The current choice when it is the first or differs materially from the last one
        reported (then it becomes the reported one); else None."""
        choice = self.choose()
        last = self.reported_s
        if last is not None and abs(choice.interval_s - last) <= MATERIAL_CHANGE * last:
            return None
        self.reported_s = choice.interval_s
        return choice

    def look(self, now: float) -> None:
        """Move the clock (the first look starts it)."""
        if self.started_at is None:
            self.started_at = now
        if self.last_save_at is None:
            self.last_save_at = now
        self.now = now

    def saved(self, now: float) -> None:
        """A save began now: the next one is due an interval later."""
        self.look(now)
        self.last_save_at = now

    def due(self, now: float) -> bool:
        """Whether an interval has passed since the last save (or the start)."""
        first = self.started_at is None
        self.look(now)
        if first:
            return False
        assert self.last_save_at is not None
        return now - self.last_save_at >= self.interval_s


class _Saved(Protocol):
    @property
    def held_s(self) -> float: ...
    @property
    def duration_s(self) -> float: ...


class _Agree(Protocol):
    def max_ints(self, values: list[int]) -> list[int]: ...


class AutoSchedule:
    """The manager's side of ``interval="auto"``: feeds each committed save's costs to the rule,
    says at each step whether every rank saves now, and reports the choices (rank 0).

    Every rank keeps its own clock and measurements; whether a save is due is agreed with one
    element-wise max over the coordination group at each step (a rank that is due makes all of
    them save at the same step, as a collective save needs). One process: no communication.
    """

    def __init__(
        self,
        options: AutoIntervalOptions,
        *,
        rank: int,
        coord: _Agree,
        environ: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        env = os.environ if environ is None else environ
        mtbi, source = mtbi_from(env)
        count = interruptions_from(env) if source == "operator" else 0
        self.rule = AutoInterval(options, mtbi, source, interruptions=count)
        self.rank, self.coord, self.clock = rank, coord, clock
        self._seen = 0
        self.report("start")

    @property
    def interval_s(self) -> float:
        """The interval now in force, in seconds."""
        return self.rule.interval_s

    def report(self, reason: str) -> None:
        choice = self.rule.to_report()
        if choice is not None and self.rank == 0:
            events.interval_chosen(
                rank=0,
                interval_s=choice.interval_s,
                reason=reason,
                save_cost_s=choice.save_cost_s,
                commit_s=choice.commit_s,
                mtbi_s=choice.mtbi_s,
                mtbi_source=choice.mtbi_source,
                measured_saves=choice.measured_saves,
                clamped=choice.clamped,
            )

    def observe(self, saved: Sequence[_Saved]) -> None:
        """Record the saves committed since the last call (``Saver.saved``, oldest first)."""
        fresh = saved[self._seen :]
        self._seen = len(saved)
        for one in fresh:
            self.rule.record(one.held_s, one.duration_s)
        if fresh:
            self.report("measured")

    def due(self) -> bool:
        """Whether every rank saves at this step (a collective on more than one rank)."""
        local = self.rule.due(self.clock())
        return bool(self.coord.max_ints([int(local)])[0])

    def saving(self) -> None:
        """A save starts now (also one the interval did not ask for: a notice's)."""
        self.rule.saved(self.clock())
