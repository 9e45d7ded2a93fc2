"""status.progress: percent, rate and ETA from rank 0's reports; RTJ_MTBI_SECONDS for each
attempt."""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timedelta
from typing import Any

import yaml

from rtj_operator.api import crdgen
from rtj_operator.api.envvars import INTERRUPTIONS, MTBI_SECONDS, PROGRESS_ANNOTATION
from rtj_operator.api.status_types import Activity, Goodput, JobStatus, PendingRollback, Phase
from rtj_operator.api.timeutil import iso
from rtj_operator.decide.job_progress import MIN_POINT_SPACING_SECONDS, RATE_WINDOW_SECONDS, update
from rtj_operator.decide.mtbi import PRIOR_MTBI_SECONDS, mtbi_seconds

from .fakes import T0, FakeCluster

ROOT = crdgen.REPO_ROOT


def live(
    cluster: FakeCluster,
    step: int,
    *,
    total: int | None = 1000,
    checkpoint: tuple[str, int] | None = None,
    at: datetime | None = None,
) -> None:
    """Rank 0 of the current attempt reports its step (8 samples a step) and the total."""
    data: dict[str, Any] = {
        "current_step": step,
        "current_sample": step * 8,
        "reported_at": iso(at or cluster.now),
    }
    if total is not None:
        data["total_steps"] = total
    if checkpoint is not None:
        name, at_step = checkpoint
        data.update(checkpoint=name, step=at_step, sample=at_step * 8, time=iso(cluster.now))
    cluster.pod(0)["metadata"]["annotations"][PROGRESS_ANNOTATION] = json.dumps(data)


def later(cluster: FakeCluster, seconds: float) -> None:
    cluster.now += timedelta(seconds=seconds)


def progress_of(cluster: FakeCluster) -> dict[str, Any]:
    return cluster.status["progress"]


def unschedulable(cluster: FakeCluster) -> None:
    for pod in cluster.current_pods():
        if pod["status"].get("phase") == "Pending":
            pod["status"]["conditions"] = [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
            ]


def test_progress_rate_and_eta_through_a_preemption_and_a_wait_for_capacity():
    cluster = FakeCluster.start(replicas=2)
    cluster.step()
    p = progress_of(cluster)
    assert p["state"] == "Starting" and p["eta"] == "Starting" and "etaSeconds" not in p

    cluster.schedule_and_run()
    live(cluster, 0)
    cluster.step(10)  # t=10: training, one report: no rate yet
    p = progress_of(cluster)
    assert p["state"] == "Training" and p["totalSteps"] == 1000 and p["percent"] == "0%"
    assert p["reason"] == "RateUnknown" and p["eta"] == "RateUnknown"

    later(cluster, 60)
    live(cluster, 70)
    cluster.step()  # t=70: 70 steps since the report at t=0
    p = progress_of(cluster)
    assert p["stepsPerSecond"] == 1.0 and p["samplesPerSecond"] == 8.0
    assert p["step"] == 70 and p["percent"] == "7%" and p["fraction"] == 0.07
    assert p["etaSeconds"] == 930.0 and p["eta"] == "15m30s" and "reason" not in p

    later(cluster, 30)
    live(cluster, 100, checkpoint=("ep0-ba100", 100))
    cluster.step()  # t=100
    assert progress_of(cluster)["eta"] == "15m"

    del cluster.nodes["node-1"]  # spot reclaim
    cluster.step(10)
    p = progress_of(cluster)
    assert cluster.status["attempt"] == 1 and p["state"] == "Restarting"
    assert "etaSeconds" not in p and p["eta"] == "Restarting" and p["reason"] == "Restarting"
    assert p["step"] == 100 and p["percent"] == "10%"  # the last commit while no gang trains

    unschedulable(cluster)
    cluster.step(5)
    p = progress_of(cluster)
    assert p["state"] == "WaitingForCapacity" and p["eta"] == "WaitingForCapacity"
    assert "etaSeconds" not in p

    cluster.schedule_and_run()
    cluster.step(1200)  # twenty minutes without a running gang
    live(cluster, 101)
    cluster.step(20)
    p = progress_of(cluster)
    # The previous gang's rate stands until this one reported twice; the wait is not in it.
    assert p["state"] == "Training" and p["attempt"] == 1 and len(p["window"]) == 1
    assert p["stepsPerSecond"] == 1.0 and p["etaSeconds"] == 899.0

    later(cluster, 30)
    live(cluster, 201)
    cluster.step()  # this gang: 100 steps in 50 s (its first report was 20 s ago)
    p = progress_of(cluster)
    assert p["stepsPerSecond"] == 2.0 and p["rateSeconds"] == 50.0
    assert p["etaSeconds"] == 399.5 and p["eta"] == "6m39s"

    for rank in (0, 1):
        cluster.terminate(rank, 0)
    cluster.step(5)
    p = progress_of(cluster)
    assert cluster.status["phase"] == "Succeeded"
    assert p["reason"] == "Succeeded" and p["eta"] == "Succeeded" and "etaSeconds" not in p


def test_without_a_total_there_is_a_rate_but_no_percent_nor_eta():
    cluster = FakeCluster.start(replicas=1)
    cluster.step()
    cluster.schedule_and_run()
    live(cluster, 10, total=None)
    cluster.step(10)
    later(cluster, 20)
    live(cluster, 70, total=None)
    cluster.step()  # 60 steps since the report at t=0
    p = progress_of(cluster)
    assert p["stepsPerSecond"] == 2.0 and p["step"] == 70
    assert "percent" not in p and p["reason"] == "TotalUnknown" and p["eta"] == "TotalUnknown"


def test_the_window_keeps_reports_spaced_and_recent():
    status = JobStatus(phase=Phase.RUNNING, gang_created=True, training_since=T0, attempt=3)
    pod: dict[str, Any] = {"metadata": {"annotations": {}}}
    for second in range(0, 900, 2):  # a report every 2 s for 15 minutes, 3 steps a second
        at = T0 + timedelta(seconds=second)
        body = {"current_step": 3 * second, "total_steps": 10_000, "reported_at": iso(at)}
        pod["metadata"]["annotations"][PROGRESS_ANNOTATION] = json.dumps(body)
        update(status, pod, now=at)
    p = status.progress
    assert p is not None and p.attempt == 3 and p.state is Activity.TRAINING
    gaps = [(b.time - a.time).total_seconds() for a, b in itertools.pairwise(p.window)]
    assert min(gaps) >= MIN_POINT_SPACING_SECONDS
    assert (p.window[-1].time - p.window[0].time).total_seconds() <= RATE_WINDOW_SECONDS
    assert p.steps_per_second == 3.0 and p.samples_per_second is None


def test_a_pass_without_a_new_report_writes_nothing():
    cluster = FakeCluster.start(replicas=1)
    cluster.step()
    cluster.schedule_and_run()
    live(cluster, 10)
    cluster.step(10)
    later(cluster, 20)
    live(cluster, 30)
    cluster.step()
    cluster.step(5)  # the goodput account may still close its interval: let it
    assert cluster.step(5).status is None


def test_mtbi_is_the_prior_then_training_time_over_interruptions_that_rolled_work_back():
    assert mtbi_seconds(JobStatus()) == PRIOR_MTBI_SECONDS
    up = Goodput(
        since=T0,
        activity=Activity.TRAINING,
        activity_since=T0,
        starting_seconds=600,
        training_seconds=6600,
        restarting_seconds=0,
        waiting_for_capacity_seconds=50_000,  # no gang was up to be interrupted
    )
    # 6600 s trained (the 600 s starting exposed no work), never interrupted: (6600 + 3600) / 1.
    assert mtbi_seconds(JobStatus(goodput=up)) == 10_200
    # Two interruptions that rolled work back and one pending: (6600 + 3600) / 4.
    pending = PendingRollback(attempt=3, interrupted_at=T0, trained_since=T0, reached_step=5)
    rolled = up.model_copy(update={"rollbacks": 2, "pending_rollback": pending})
    assert mtbi_seconds(JobStatus(goodput=rolled, preemptions=3)) == 2550
    # Preemptions an emergency or survivor save covered (no rollback) do not count.
    assert mtbi_seconds(JobStatus(goodput=up, preemptions=5, failures=1)) == 10_200
    # Without a goodput account: preemptions and failures, (0 + 3600) / 4.
    assert mtbi_seconds(JobStatus(preemptions=2, failures=1)) == 900


def test_every_attempt_gets_the_mtbi_in_its_environment():
    """Counting the interruption the pass that creates the gang has just seen (the attempt
    after a preemption knows of it, as a pending rollback)."""
    cluster = FakeCluster.start(replicas=2)
    cluster.step()
    assert cluster.env(0)[MTBI_SECONDS] == str(round(PRIOR_MTBI_SECONDS))
    assert cluster.env(0)[INTERRUPTIONS] == "0"
    for attempt in (1, 2):
        cluster.schedule_and_run()
        live(cluster, 1)
        cluster.step(10)
        cluster.step(1800)
        del cluster.nodes[cluster.pod(1)["spec"]["nodeName"]]
        before = JobStatus.model_validate(cluster.status)
        cluster.step(10)
        assert cluster.status["attempt"] == attempt
        after = JobStatus.model_validate(cluster.status).goodput
        assert before.goodput is not None and after is not None
        assert after.pending_rollback is not None
        # Up time as the pass found it (the pass closes more after the gang is made), the
        # losses as the pass counted them.
        losses = {"rollbacks": after.rollbacks, "pending_rollback": after.pending_rollback}
        seen = before.model_copy(update={"goodput": before.goodput.model_copy(update=losses)})
        assert cluster.env(0, attempt)[MTBI_SECONDS] == str(round(mtbi_seconds(seen)))
        # Each gang reached step 1 and committed nothing: each loss rolled work back.
        assert cluster.env(0, attempt)[INTERRUPTIONS] == str(attempt)
    # The second gang's pods knew of both losses: (trained + prior) / 3.
    up = seen.goodput
    assert up is not None and up.rollbacks == 1 and up.training_seconds > 0
    expected = (up.training_seconds + PRIOR_MTBI_SECONDS) / 3
    assert float(cluster.env(0, 2)[MTBI_SECONDS]) == round(expected)


def test_the_columns_and_the_status_block_are_in_the_generated_crd():
    (crd,) = yaml.safe_load_all((ROOT / crdgen.CRD_FILE).read_text())
    version = crd["spec"]["versions"][0]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert columns["Progress"]["jsonPath"] == ".status.progress.percent"
    assert columns["ETA"]["jsonPath"] == ".status.progress.eta"
    assert not columns["Progress"].get("priority") and not columns["ETA"].get("priority")
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names.index("Lost") < names.index("Progress") < names.index("ETA") < names.index("Age")
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    fields = status["progress"]["properties"]
    for field in ("state", "reason", "step", "totalSteps", "percent", "stepsPerSecond", "eta"):
        assert fields[field].get("description"), field
    assert fields["etaSeconds"]["type"] == "number"


def test_steps_at_risk_are_the_steps_since_the_last_commit():
    cluster = FakeCluster.start(replicas=2)
    cluster.step()
    cluster.schedule_and_run()
    cluster.step(1)
    assert cluster.status.get("stepsAtRisk") is None  # nothing reported yet
    cluster.report(0, "ep0-ba100", 100, current=130)
    cluster.step(1)
    assert cluster.status["stepsAtRisk"] == 30
    assert cluster.status["lastCommittedCheckpoint"]["step"] == 100
    cluster.report(0, "ep0-ba130", 130, current=131)
    cluster.step(1)
    assert cluster.status["stepsAtRisk"] == 1
