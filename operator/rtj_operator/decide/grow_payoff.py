"""Whether growing a running elastic gang pays for the pause it costs (``grow.onlyWhenItPays``).

A grow stops every running rank: the gang saves, its workers restart at the larger size, load
and warm up. On a small cluster that is a second or two; with a GPU-scale model it is minutes
(process groups, a multi-GB load, compilation). The pods a grow adds then train only until the
gang's next interruption, which stops every rank anyway. So a grow from ``s`` to ``t`` pods pays
when the work the ``t - s`` new pods add before that interruption is more than the work the pause
costs the gang:

    (t - s) x (M - P) > s x P,  that is  (t - s) x M > t x P

with ``M`` the job's mean time between interruptions and ``P`` its mean pause per restart. Both
come from the job's own history in its goodput account:

- ``M = (trainingSeconds + 1 h) / (preemptions + failures + 1)``: every loss counts here (a loss
  stops the gang whether or not a save covered it), unlike the checkpoint interval's MTBI
  (mtbi.py), which counts only losses that rolled work back; the one-hour prior is the same;
- ``P = plannedRestartingSeconds / plannedRestarts``: the pause of the job's grows and
  re-shrinks, which is what a grow costs (a loss's restart also waits for its detection and the
  survivors' save, which a grow does not). Before one was measured, ``restartingSeconds /
  restarts`` (every restart of a gang that had trained), and before any, the job's first start
  (``startingSeconds``), which is a cold start and so no less than a restart. With none of them
  measured, a grow is not held back.

Measured on replayed spot traces (benchmarks/goodput_sim.py, which calls ``GrowCost``;
docs/goodput.md): with GPU-scale costs, the rule kept 0-6 points more of the ideal than growing
at every return at 64 nodes with survivors staying (8-17 without), up to 10 (21) at 256 nodes;
at 16 nodes it moved goodput by -1.1 to +0.6 points (-2.0 to +3.2), at 4 nodes not at all.
Weighing the mean of every restart instead of the grows' own cost recovery in process up to 4
points at 256 nodes: a loss's restart includes its detection and the survivors' save.

Rejected: a fixed, larger ``grow.minIntervalSeconds`` (the best value differed by trace from 30
minutes to never; the rule adapts to each job's own losses and restart cost), and the expected
lifetime of the returning nodes (not observable by the operator: nodes carry no history).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..api.status_types import JobStatus
from .mtbi import smoothed_mean_seconds


@dataclass(frozen=True)
class GrowCost:
    """What a grow costs and how long its gain lasts, as the job measured them."""

    pause_s: float
    """The job's mean pause per restart (or its first start's time)."""
    between_losses_s: float
    """The job's mean time between interruptions (every loss)."""

    @classmethod
    def measured(
        cls,
        *,
        restarting_s: float,
        restarts: int,
        starting_s: float,
        trained_s: float,
        losses: int,
        planned_restarting_s: float = 0.0,
        planned_restarts: int = 0,
    ) -> GrowCost | None:
        """From a job's history: the mean planned restart (a grow's own pause; the mean of every
        restart before one, the first start before any), the smoothed time between losses; None
        when nothing was measured."""
        if planned_restarts > 0:
            pause = planned_restarting_s / planned_restarts
        else:
            pause = restarting_s / restarts if restarts > 0 else starting_s
        if pause <= 0:
            return None
        return cls(pause_s=pause, between_losses_s=smoothed_mean_seconds(trained_s, losses))

    def pays(self, size: int, target: int) -> bool:
        """Whether growing from ``size`` to ``target`` pods pays: ``(t - s) x M > t x P``."""
        return (target - size) * self.between_losses_s > target * self.pause_s

    def smallest_paying(self, size: int, full: int) -> int | None:
        """The fewest pods, up to ``full``, a grow from ``size`` must reach to pay; None when
        no grow up to ``full`` pays."""
        room = self.between_losses_s - self.pause_s
        if room <= 0:
            return None
        target = max(size + 1, math.floor(size * self.between_losses_s / room) + 1)
        return target if target <= full else None

    def explain(self, size: int, target: int, full: int) -> str:
        needed = self.smallest_paying(size, full)
        pays_from = f"pays from {needed} pods" if needed else f"no grow up to {full} pays"
        return (
            f"room for {target} of {full} pods, but growing from {size} would stop the gang about "
            f"{self.pause_s:.0f}s (its mean restart) for {target - size} more pods until its next "
            f"interruption (mean {self.between_losses_s:.0f}s apart): a grow {pays_from} "
            "(grow.onlyWhenItPays)"
        )


def survivors_first_pays(
    *,
    kept: int,
    size: int,
    starting_s: float,
    planned_restarting_s: float,
    planned_restarts: int,
) -> bool:
    """Whether a loss that leaves room for ``size`` pods should start its ``kept`` pods alone
    and let the new ones join when warm (restore.py): the kept pods train through the new pods'
    cold start ``C`` (the job's first start, ``startingSeconds``), and the whole gang pauses once
    more when they join (``P``, the job's mean grow pause): ``kept x (C - P) > size x P``. With
    a join that restarts every worker at GPU scale (minutes) it does not pay; with the
    in-process switch, or restarts of seconds, it does. Yes before both are measured."""
    if planned_restarts == 0 or starting_s <= 0:
        return True
    pause = planned_restarting_s / planned_restarts
    return kept * (starting_s - pause) > size * pause


def survivors_first_pays_for(status: JobStatus, kept: int, size: int) -> bool:
    """``survivors_first_pays`` from the job's goodput account (yes without one)."""
    account = status.goodput
    if account is None:
        return True
    return survivors_first_pays(
        kept=kept,
        size=size,
        starting_s=account.starting_seconds,
        planned_restarting_s=account.planned_restarting_seconds,
        planned_restarts=account.planned_restarts,
    )


def grow_cost(status: JobStatus) -> GrowCost | None:
    """The job's ``GrowCost``; None before anything is measured (or without a goodput account)."""
    account = status.goodput
    if account is None:
        return None
    return GrowCost.measured(
        restarting_s=account.restarting_seconds,
        restarts=account.restarts,
        planned_restarting_s=account.planned_restarting_seconds,
        planned_restarts=account.planned_restarts,
        starting_s=account.starting_seconds,
        trained_s=account.training_seconds,
        losses=status.preemptions + status.failures,
    )
