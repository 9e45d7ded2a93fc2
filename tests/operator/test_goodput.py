"""status.goodput: what spot costs a job, accounted across passes, interruptions and restarts."""

from __future__ import annotations

import copy
import json
from datetime import datetime, timedelta
from typing import Any

import pytest
import yaml

from rtj_operator.api import crdgen
from rtj_operator.api.envvars import PROGRESS_ANNOTATION
from rtj_operator.api.status_types import CheckpointRecord, JobStatus, Phase
from rtj_operator.api.timeutil import iso
from rtj_operator.decide import goodput, mtbi
from rtj_operator.decide.goodput import REFRESH_SECONDS, account, human_duration, open_account

from .fakes import T0, FakeCluster

ROOT = crdgen.REPO_ROOT
BUCKETS = (
    "startingSeconds",
    "trainingSeconds",
    "waitingForCapacitySeconds",
    "restartingSeconds",
    "backoffSeconds",
    "suspendedSeconds",
)


def commit(
    cluster: FakeCluster,
    name: str,
    step: int,
    *,
    current: int | None = None,
    at: datetime | None = None,
    rank: int = 0,
    attempt: int | None = None,
) -> None:
    """Rank ``rank`` reports a commit (8 samples a step) made at ``at`` (default: now)."""
    data: dict[str, Any] = {
        "checkpoint": name,
        "uri": f"s3://bucket/ckpt/train/{name}",
        "step": step,
        "epoch": 0,
        "sample": step * 8,
        "time": iso(at or cluster.now),
        "current_step": step if current is None else current,
    }
    pod = cluster.pod(rank, attempt)
    pod["metadata"]["annotations"][PROGRESS_ANNOTATION] = json.dumps(data)


def later(cluster: FakeCluster, seconds: float) -> None:
    """Let time pass without a pass of the operator."""
    cluster.now += timedelta(seconds=seconds)


def unschedulable(cluster: FakeCluster) -> None:
    """The scheduler finds no node for any pending rank of the current attempt."""
    for pod in cluster.current_pods():
        if pod["status"].get("phase") == "Pending":
            pod["status"]["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/1 nodes are available: 1 Insufficient cpu.",
                }
            ]


def account_of(cluster: FakeCluster) -> dict[str, Any]:
    acc = cluster.status["goodput"]
    # Every second since the account opened is in exactly one bucket (or the open interval).
    closed = sum(acc.get(b, 0.0) for b in BUCKETS)
    opened = datetime.fromisoformat(acc["since"].replace("Z", "+00:00"))
    until = datetime.fromisoformat(acc["activitySince"].replace("Z", "+00:00"))
    assert closed == pytest.approx((until - opened).total_seconds())
    return acc


def test_each_cause_accumulates_over_start_train_node_loss_wait_restart_train_succeed():
    cluster = FakeCluster.start(replicas=2)
    cluster.step()  # t=0: the first gang is created
    acc = account_of(cluster)
    assert acc["since"] == iso(T0) and acc["activity"] == "Starting"
    assert acc["lost"] == "0s" and "percent" not in acc

    cluster.schedule_and_run()
    cluster.step(10)  # Running, but no step yet: still starting
    assert account_of(cluster)["activity"] == "Starting"
    cluster.report_step(0, 1)
    cluster.step(20)  # t=30: first progress
    acc = account_of(cluster)
    assert acc["activity"] == "Training" and acc["startingSeconds"] == 30

    later(cluster, 60)
    commit(cluster, "ep0-ba100", 100)
    cluster.step()  # t=90
    later(cluster, 60)
    commit(cluster, "ep0-ba200", 200)
    cluster.step()  # t=150: two commits, 800 samples in 60 s
    acc = account_of(cluster)
    assert acc["samplesPerSecond"] == pytest.approx(13.333)
    assert acc["fullSizeSamplesPerSecond"] == pytest.approx(13.333)
    assert acc["fullSizeRate"] == "Measured" and acc["committedSamples"] == 1600
    commit(cluster, "ep0-ba200", 200, current=260, at=T0 + timedelta(seconds=150))
    cluster.step(30)  # t=180: step 260 reached

    del cluster.nodes["node-1"]  # spot reclaim, seen at t=190
    cluster.step(10)
    acc = account_of(cluster)
    assert cluster.status["attempt"] == 1 and acc["activity"] == "Restarting"
    assert acc["trainingSeconds"] == 160
    assert acc["pendingRollback"]["reachedStep"] == 260
    assert acc["rolledBackSteps"] == 0  # settled once the next gang trains

    unschedulable(cluster)
    cluster.step(5)  # t=195: no room for the new gang
    assert account_of(cluster)["activity"] == "WaitingForCapacity"
    cluster.schedule_and_run()  # the node is back
    cluster.step(120)  # t=315
    acc = account_of(cluster)
    assert acc["activity"] == "Restarting" and acc["waitingForCapacitySeconds"] == 120
    cluster.report_step(0, 201)
    cluster.step(30)  # t=345: the new gang trains past ep0-ba200
    acc = account_of(cluster)
    assert acc["activity"] == "Training" and acc["restartingSeconds"] == 35
    assert "pendingRollback" not in acc
    assert acc["rolledBackSteps"] == 60 and acc["rolledBackSamples"] == 480
    assert acc["rollbacks"] == 1
    assert acc["rolledBackSeconds"] == 40  # from the commit at t=150 to the loss seen at t=190
    assert acc["lostSeconds"] == 120 + 35 + 40 and acc["lost"] == "3m15s"

    later(cluster, 60)
    commit(cluster, "ep0-ba300", 300)
    cluster.step()  # t=405
    later(cluster, 60)
    commit(cluster, "ep0-ba400", 400)
    cluster.step()  # t=465
    cluster.terminate(0, 0)
    cluster.terminate(1, 0)
    cluster.step(5)  # t=470
    acc = account_of(cluster)
    assert cluster.status["phase"] == "Succeeded" and acc["activity"] == "Ended"
    assert acc["startingSeconds"] == 30
    assert acc["trainingSeconds"] == 160 + 125
    assert acc["waitingForCapacitySeconds"] == 120
    assert acc["restartingSeconds"] == 35
    assert acc["backoffSeconds"] == 0
    assert acc["lostSeconds"] == 195
    # 3200 committed samples over 13.333/s for 470 s: 3200 / 6266.51 = 0.511
    assert acc["committedSamples"] == 3200
    assert acc["fraction"] == pytest.approx(3200 / (13.333 * 470), abs=1e-3)
    assert acc["percent"] == "51%"
    assert cluster.step(600).status is None  # the account is closed


def test_the_fraction_on_a_hand_computed_case():
    """Training from t=20, commits at t=60 (800 samples) and t=100 (1600): 20 samples/s at
    full size; at t=100 the ideal is 20 * 100 = 2000 samples, 1600 kept: 0.8."""
    cluster = FakeCluster.start(replicas=2)
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    cluster.report_step(0, 1)
    cluster.step(20)
    later(cluster, 40)
    commit(cluster, "ep0-ba100", 100)
    cluster.step()
    later(cluster, 40)
    commit(cluster, "ep0-ba200", 200)
    cluster.step()
    acc = account_of(cluster)
    assert acc["fullSizeSamplesPerSecond"] == 20
    assert acc["fraction"] == 0.8 and acc["percent"] == "80%"


def test_failure_backoff_is_its_own_cause():
    cluster = FakeCluster.start(
        replicas=2, resumePolicy={"backoffBaseSeconds": 10, "backoffMaxSeconds": 600}
    )
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    cluster.report_step(0, 5)
    cluster.step(10)
    cluster.terminate(1, 1)
    cluster.step(50)  # t=60: a failure, 10 s of backoff
    acc = account_of(cluster)
    assert acc["activity"] == "BackingOff" and acc["trainingSeconds"] == 50
    assert not cluster.step(5).creations
    assert cluster.step(5).creations  # t=70: the backoff is over
    acc = account_of(cluster)
    assert acc["backoffSeconds"] == 10 and acc["activity"] == "Restarting"
    # No checkpoint: all 50 s of its training are lost, and the 5 steps rank 0 reported
    # before its first commit (status.currentStep).
    cluster.schedule_and_run()
    cluster.report_step(0, 1)
    cluster.step(20)
    acc = account_of(cluster)
    assert acc["restartingSeconds"] == 20 and acc["rolledBackSteps"] == 5
    assert acc["rolledBackSeconds"] == 50 and acc["lostSeconds"] == 80


def test_an_operator_restart_mid_wait_keeps_the_open_interval():
    cluster = FakeCluster.start(replicas=2)
    cluster.step()
    unschedulable(cluster)
    cluster.step(2)
    acc = account_of(cluster)
    assert acc["activity"] == "WaitingForCapacity" and acc["activitySince"] == iso(cluster.now)
    # The operator goes away for an hour; a new one starts from what the API server stored.
    stored = json.loads(json.dumps(cluster.body))
    restarted = FakeCluster(
        body=stored,
        pods=copy.deepcopy(cluster.pods),
        nodes=copy.deepcopy(cluster.nodes),
        now=cluster.now,
        support=copy.deepcopy(cluster.support),
    )
    restarted.schedule_and_run()
    restarted.step(3600)
    acc = account_of(restarted)
    assert acc["since"] == iso(T0) and acc["startingSeconds"] == 2
    assert acc["waitingForCapacitySeconds"] == 3600 and acc["lost"] == "1h"


def test_a_quiet_pass_writes_nothing_until_the_open_interval_is_a_minute_old():
    cluster = FakeCluster.start(replicas=2)
    cluster.step()
    unschedulable(cluster)
    cluster.step(1)
    assert cluster.step(REFRESH_SECONDS - 1).status is None
    plan = cluster.step(1)
    assert plan.status is not None and plan.status.goodput is not None
    assert plan.status.goodput.waiting_for_capacity_seconds == REFRESH_SECONDS
    assert plan.status.model_dump(exclude={"goodput"}) == cluster.job.status.model_dump(
        exclude={"goodput"}
    )


def test_an_emergency_save_in_the_grace_period_is_not_rolled_back():
    cluster = FakeCluster.start(replicas=2)
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    cluster.report_step(0, 1)
    cluster.step(10)
    commit(cluster, "ep0-ba100", 100, current=150)
    cluster.step(30)
    old = copy.deepcopy(cluster.pod(0))
    cluster.pod(1)["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    ]
    cluster.step(5)  # the eviction is seen at once; the ranks get SIGTERM and save
    assert cluster.status["interruptions"][-1]["stepsLost"] == 50
    old["metadata"]["deletionTimestamp"] = iso(cluster.now)
    cluster.pods[old["metadata"]["name"]] = old
    commit(cluster, "ep0-ba152", 152, attempt=0)
    cluster.step(3)  # the old rank 0's emergency save, reported from its grace period
    cluster.schedule_and_run()
    cluster.report_step(0, 153)
    cluster.step(30)
    acc = account_of(cluster)
    assert acc["rolledBackSteps"] == 0 and acc["rolledBackSeconds"] == 0
    # Covered by the save: the automatic interval's MTBI does not count it.
    assert acc["rollbacks"] == 0
    assert mtbi.interruptions(JobStatus.model_validate(cluster.status)) == 0


def test_only_unplanned_interruptions_that_lost_work_count_as_rollbacks():
    """The automatic interval's MTBI counts them (mtbi.py): a grow that lost steps is planned,
    a preemption that lost steps counts, settled or pending."""
    status = JobStatus(gang_created=True, training_since=T0, current_step=120)
    open_account(status, T0)
    status.last_committed_checkpoint = CheckpointRecord(name="ep0-ba100", step=100, attempt=0)
    goodput.note_interruption(status, T0, unplanned=False)  # a grow 20 steps past the commit
    assert mtbi.interruptions(status) == 0
    status.attempt, status.current_step = 1, 130
    goodput.note_interruption(status, T0, unplanned=True)  # a preemption 30 steps past it
    assert status.goodput is not None and status.goodput.rolled_back_steps == 20
    assert status.goodput.rollbacks == 0 and mtbi.interruptions(status) == 1  # pending
    status.attempt = 2
    goodput.note_interruption(status, T0, unplanned=True)
    assert status.goodput.rollbacks == 1 and mtbi.interruptions(status) == 2


def test_suspended_time_is_neither_lost_nor_in_the_fraction():
    cluster = FakeCluster.start(replicas=2)
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    cluster.report_step(0, 1)
    cluster.step(20)
    later(cluster, 40)
    commit(cluster, "ep0-ba100", 100)
    cluster.step()
    later(cluster, 40)
    commit(cluster, "ep0-ba200", 200)
    cluster.step()  # t=100: 0.8, as in the hand-computed case
    cluster.body["spec"]["suspend"] = True
    cluster.step()
    assert account_of(cluster)["activity"] == "Suspended"
    cluster.body["spec"]["suspend"] = False
    cluster.step(1000)
    acc = account_of(cluster)
    assert acc["suspendedSeconds"] == 1000 and acc["lostSeconds"] == 0
    assert acc["fraction"] == 0.8


def status_with(records: list[tuple[int, int, float]], *, size: int, attempt: int = 0) -> JobStatus:
    """A running gang of ``size`` pods whose commits were (step, sample, seconds after T0)."""
    known = [
        CheckpointRecord(
            name=f"ck{step}",
            step=step,
            sample=sample,
            time=iso(T0 + timedelta(seconds=at)),
            attempt=attempt,
        )
        for step, sample, at in records
    ]
    return JobStatus(
        phase=Phase.RUNNING,
        attempt=attempt,
        gang_created=True,
        gang_size=size,
        training_since=T0,
        known_checkpoints=known,
        last_committed_checkpoint=max(known, key=lambda r: r.sample or 0),
    )


def test_a_shrunk_gang_scales_its_rate_until_a_full_gang_measures_one():
    shrunk = status_with([(10, 160, 10), (20, 320, 30)], size=2)  # 8/s at 2 of 4 pods
    open_account(shrunk, T0)
    account(shrunk, JobStatus(), replicas=4, now=T0 + timedelta(seconds=40))
    acc = shrunk.goodput
    assert acc is not None and acc.samples_per_second == 8
    assert acc.full_size_samples_per_second == 16 and acc.full_size_rate == "Scaled"

    full = status_with([(30, 480, 50), (40, 640, 55)], size=4, attempt=1)  # 32/s at 4
    full.goodput = acc
    account(full, JobStatus(), replicas=4, now=T0 + timedelta(seconds=60))
    assert acc.full_size_samples_per_second == 32 and acc.full_size_rate == "Measured"

    again = status_with([(50, 800, 70), (60, 960, 90)], size=2, attempt=2)  # 8/s at 2
    again.goodput = acc
    account(again, JobStatus(), replicas=4, now=T0 + timedelta(seconds=100))
    assert acc.samples_per_second == 8
    assert acc.full_size_samples_per_second == 32 and acc.full_size_rate == "Measured"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (45.9, "45s"), (60, "1m"), (725, "12m5s"), (3900, "1h5m"), (183600, "2d3h")],
)
def test_human_durations(seconds: float, text: str):
    assert human_duration(seconds) == text


def test_the_columns_and_the_status_block_are_in_the_generated_crd():
    (crd,) = yaml.safe_load_all((ROOT / crdgen.CRD_FILE).read_text())
    version = crd["spec"]["versions"][0]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert columns["Goodput"]["jsonPath"] == ".status.goodput.percent"
    assert columns["Lost"]["jsonPath"] == ".status.goodput.lost"
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names.index("Step") < names.index("Goodput") < names.index("Lost") < names.index("Age")
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    fields = status["goodput"]["properties"]
    for field in (
        "since",
        "activity",
        "trainingSeconds",
        "waitingForCapacitySeconds",
        "restartingSeconds",
        "backoffSeconds",
        "rolledBackSteps",
        "rolledBackSamples",
        "rollbacks",
        "committedSamples",
        "samplesPerSecond",
        "fraction",
    ):
        assert fields[field].get("description"), field
