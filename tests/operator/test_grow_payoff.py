"""``grow.onlyWhenItPays``: the rule alone (decide/grow_payoff.py), then in the grow decision."""

from __future__ import annotations

from datetime import timedelta

import pytest

from rtj_operator.api.status_types import Activity, Goodput, JobStatus
from rtj_operator.decide.elastic import GrowAction
from rtj_operator.decide.grow_payoff import (
    GrowCost,
    grow_cost,
    survivors_first_pays,
    survivors_first_pays_for,
)
from rtj_operator.decide.mtbi import PRIOR_MTBI_SECONDS

from .fakes import T0
from .test_elastic import grow, lose_two_nodes, node, reasons, spot


def test_a_grow_pays_when_what_it_adds_before_the_next_loss_outweighs_its_pause():
    cost = GrowCost(pause_s=130.0, between_losses_s=600.0)
    # (t - s) x M > t x P: from 32 pods, 41 pays (9 x 600 = 5400 > 41 x 130 = 5330), 40 not
    assert not cost.pays(32, 40) and cost.pays(32, 41)
    assert cost.smallest_paying(32, 64) == 41
    assert cost.smallest_paying(32, 40) is None  # the full size is below what pays
    assert GrowCost(pause_s=1.0, between_losses_s=600.0).pays(63, 64)  # fast restarts: always
    never = GrowCost(pause_s=700.0, between_losses_s=600.0)  # a restart outlasts the gain
    assert not never.pays(1, 64) and never.smallest_paying(1, 64) is None


def account(**seconds: float) -> Goodput:
    return Goodput(since=T0, activity=Activity.TRAINING, activity_since=T0, **seconds)


def test_the_cost_comes_from_the_jobs_own_restarts_and_losses():
    status = JobStatus(
        preemptions=3,
        failures=1,
        goodput=account(training_seconds=4400.0, restarting_seconds=600.0, restarts=5),
    )
    cost = grow_cost(status)
    assert cost is not None and cost.pause_s == pytest.approx(120.0)
    assert cost.between_losses_s == pytest.approx((4400.0 + PRIOR_MTBI_SECONDS) / 5)


def test_before_any_restart_the_first_start_stands_for_one_and_before_that_nothing_is_held():
    first = grow_cost(JobStatus(goodput=account(starting_seconds=250.0)))
    assert first is not None and first.pause_s == 250.0
    assert first.between_losses_s == PRIOR_MTBI_SECONDS
    assert grow_cost(JobStatus(goodput=account())) is None
    assert grow_cost(JobStatus()) is None  # no account (an older operator's job)


def test_a_grow_that_does_not_pay_is_deferred_and_says_from_which_size_it_pays():
    slow = GrowCost(pause_s=400.0, between_losses_s=600.0)  # 2 -> 4: 2 x 600 < 4 x 400
    decision = grow(cost=slow)
    assert decision.action is GrowAction.NONE and decision.deferred
    assert "growing from 2 would stop the gang about 400s" in decision.message
    assert "no grow up to 4 pays" in decision.message
    assert decision.recheck_after == pytest.approx(5.0)
    assert grow(cost=GrowCost(pause_s=100.0, between_losses_s=600.0)).action is GrowAction.REQUEST
    assert grow(cost=None).action is GrowAction.REQUEST  # nothing measured: not held back
    off = grow(cost=slow, policy={"onlyWhenItPays": False})
    assert off.action is GrowAction.REQUEST and not off.deferred


def test_the_interval_and_the_settle_wait_come_before_the_payoff():
    slow = GrowCost(pause_s=400.0, between_losses_s=600.0)
    early = grow(cost=slow, now=T0 + timedelta(seconds=299))
    assert early.action is GrowAction.NONE and not early.deferred and early.message == ""


def test_through_the_state_machine_a_deferred_grow_is_said_and_comes_once_it_pays():
    cluster = lose_two_nodes(
        spot(minReplicas=2, shrinkAfterSeconds=0, grow={"minIntervalSeconds": 30})
    )
    cluster.schedule_and_run()  # the shrunk gang's pods
    cluster.step(1)
    cluster.report_step(0, 101)
    cluster.step(1)
    goodput = cluster.status["goodput"]
    assert goodput["restarts"] == 1  # the gang that trained was interrupted once
    assert goodput.get("plannedRestarts", 0) == 0  # by a loss: not a planned restart
    assert goodput.get("plannedRestartingSeconds", 0) == 0 < goodput["restartingSeconds"]
    goodput["restartingSeconds"] = 2000.0  # restarts as slow as a big model's

    cluster.nodes["node-4"] = node("node-4")
    cluster.nodes["node-5"] = node("node-5")
    plan = cluster.step(31)
    assert not plan.notices and "GrowDeferred" in reasons(plan)
    deferred = cluster.status["growDeferred"]
    assert "room for 4 of 4 pods" in deferred and "about 2000s" in deferred
    plan = cluster.step(5)
    assert not plan.notices and "GrowDeferred" not in reasons(plan)  # said once

    cluster.status["goodput"]["restartingSeconds"] = 60.0
    plan = cluster.step(5)
    assert "GrowRequested" in reasons(plan) and len(plan.notices) == 2
    assert "growDeferred" not in cluster.status

    # The grow's own restart is accounted apart: from then on it is the pause the rule weighs.
    cluster.report(0, "ep0-ba130", 130, current=130)
    plan = cluster.step(1)
    assert "Grown" in reasons(plan)
    cluster.schedule_and_run()
    cluster.step(20)
    cluster.report_step(0, 131)
    cluster.step(1)  # the grown gang trains: its restart took 21 s
    goodput = cluster.status["goodput"]
    assert goodput["restarts"] == 2 and goodput["plannedRestarts"] == 1
    assert goodput["plannedRestartingSeconds"] == pytest.approx(21.0)
    assert goodput["restartingSeconds"] == pytest.approx(60.0 + 21.0)  # the loss's is not in it
    cost = grow_cost(JobStatus.model_validate(cluster.status))
    assert cost is not None and cost.pause_s == pytest.approx(21.0)


def test_a_grows_own_pause_is_weighed_once_one_was_measured():
    """A loss's restart waits for its detection and the survivors' save, which a grow does not
    pay: once the job measured a grow's pause, that is ``P``."""
    losses_only = account(restarting_seconds=900.0, restarts=3)
    assert grow_cost(JobStatus(goodput=losses_only)).pause_s == pytest.approx(300.0)
    grown = account(
        restarting_seconds=960.0,
        restarts=4,
        planned_restarting_seconds=60.0,
        planned_restarts=1,
    )
    assert grow_cost(JobStatus(goodput=grown)).pause_s == pytest.approx(60.0)


def test_survivors_go_first_when_training_through_a_cold_start_outweighs_one_more_pause():
    """kept x (C - P) > size x P, C the job's first start, P its mean grow pause."""
    gpu = {"starting_s": 150.0, "planned_restarting_s": 101.0, "planned_restarts": 1}
    assert not survivors_first_pays(kept=63, size=64, **gpu)  # a join that restarts: minutes
    switched = {"starting_s": 150.0, "planned_restarting_s": 28.0, "planned_restarts": 2}
    assert survivors_first_pays(kept=63, size=64, **switched)  # 63 x 136 > 64 x 14
    local = {"starting_s": 12.0, "planned_restarting_s": 1.5, "planned_restarts": 1}
    assert survivors_first_pays(kept=3, size=4, **local)
    # Nothing measured yet (no grow, or no first start): go first.
    assert survivors_first_pays(kept=1, size=4, **{**gpu, "planned_restarts": 0})
    assert survivors_first_pays_for(JobStatus(), 3, 4)
    measured = JobStatus(
        goodput=account(
            starting_seconds=150.0, planned_restarting_seconds=101.0, planned_restarts=1
        )
    )
    assert not survivors_first_pays_for(measured, 3, 4)
