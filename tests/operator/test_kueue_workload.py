"""Kueue from the operator's side: the Workload's admission as the job's ``Admitted``
condition, Kueue's stop of a pod read as a preemption, and the pod-group annotations."""

from __future__ import annotations

import asyncio
import time

from rtj_operator.act import kueue_reads
from rtj_operator.api.status_types import Cause
from rtj_operator.decide import gang, kueue_workload
from rtj_operator.decide.classify import Outcome

from .fakes import make_pod
from .test_classify import classify
from .test_gang import KEY, controller, sync

PENDING = {
    "status": {
        "conditions": [
            {
                "type": "QuotaReserved",
                "status": "False",
                "reason": "Pending",
                "message": "couldn't assign flavors to pod set main: insufficient quota for cpu "
                "in flavor default-flavor, request > maximum capacity (3 > 2)",
            }
        ]
    }
}
ADMITTED = {
    "status": {
        "admission": {"clusterQueue": "team-a"},
        "conditions": [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
            {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "ok"},
        ],
    }
}


def test_admission_of_a_workload():
    assert kueue_workload.admission(None) is None
    admitted, reason, message = kueue_workload.admission(PENDING)
    assert not admitted and reason == "Pending" and "insufficient quota for cpu" in message
    assert kueue_workload.admission(ADMITTED) == (True, "Admitted", "ok")
    assert kueue_workload.admission({"status": {}})[:2] == (False, "Pending")


def sync_requeue(ctrl) -> float | None:
    """One pass; the seconds after which it asks to be run again."""

    async def run() -> float | None:
        after = await ctrl.sync(KEY, time.monotonic())
        await asyncio.gather(*ctrl.executor.events.tasks)
        return after

    return asyncio.run(run())


def condition(api, kind):
    return next((c for c in api.job()["status"].get("conditions") or [] if c["type"] == kind), {})


def test_a_queued_gang_says_why_it_waits_then_that_it_was_admitted():
    ctrl, api = controller(native=True, kueue=True, queueName="spot-queue")
    sync(ctrl)
    path = kueue_reads.workload_path("ns", "train-a0")
    api.objects[path] = PENDING
    sync(ctrl)
    waits = condition(api, "Admitted")
    assert waits["status"] == "False" and waits["reason"] == "Pending"
    assert waits["message"].startswith("Workload train-a0 waits in Kueue queue spot-queue: ")
    assert "insufficient quota for cpu" in waits["message"]

    # Kueue's later words come without an event: the waiting gang reads its Workload again.
    assert sync_requeue(ctrl) == kueue_workload.RECHECK_SECONDS

    api.objects[path] = ADMITTED
    sync(ctrl)
    done = condition(api, "Admitted")
    assert done["status"] == "True" and done["reason"] == "Admitted"
    assert (
        done["message"]
        == "Kueue admitted Workload train-a0 of queue spot-queue in ClusterQueue team-a"
    )
    # Seen admitted: the Workload is not read again for this attempt (a stale pending copy
    # there would turn the condition back to False).
    api.objects[path] = PENDING
    sync(ctrl)
    assert condition(api, "Admitted")["status"] == "True"


def test_without_kueue_no_workload_is_read():
    ctrl, api = controller(native=True)
    sync(ctrl)
    sync(ctrl)
    assert not condition(api, "Admitted")


def test_kueue_stopping_a_pod_is_a_preemption_that_names_kueue():
    stop = {
        "type": "TerminationTarget",
        "status": "True",
        "reason": "WorkloadEvicted",
        "message": "Preempted to accommodate a workload (UID: u) due to prioritization in the "
        "ClusterQueue",
    }
    out = classify(make_pod(conditions=[stop], deleting=True, exit_code=143, phase="Failed"))
    assert out.outcome is Outcome.PREEMPTED and out.cause is Cause.KUEUE_EVICTION
    assert out.message.startswith("Kueue TerminationTarget WorkloadEvicted: Preempted")


def test_kueue_pods_are_not_retriable_in_their_group():
    ctrl, api = controller(native=True, kueue=True, queueName="spot-queue")
    sync(ctrl)
    for pod in api.pods().values():
        assert pod["metadata"]["annotations"][gang.KUEUE_RETRIABLE_ANNOTATION] == "false"
