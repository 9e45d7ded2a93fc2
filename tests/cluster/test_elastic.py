"""Elastic gangs and all-or-nothing scheduling on the real control plane (kwok nodes).

The nodes' kubelets are kwok's, so the ranks do not train here: where the runtime would report a
commit, the test writes the same progress annotation the runtime writes (Kube.report_progress).
"""

from __future__ import annotations

import time
from typing import Any

from tools.kubeapi import MERGE, ApiError, rtj, unique
from tools.waiting import wait_for

from .scenario import condition, wait_events

CPU = {"requests": {"cpu": "4"}}
"""One rank fills one 4-CPU node, so the nodes of the pool are the gang's capacity."""


def template(**extra: Any) -> dict[str, Any]:
    return {
        "containers": [{"name": "trainer", "image": "registry.local/train:1", "resources": CPU}],
        **extra,
    }


def gang_on(kube, ns: str, name: str, attempt: int, size: int) -> list[dict[str, Any]] | None:
    pods = [p for p in kube.pods(ns, name, attempt) if not p["metadata"].get("deletionTimestamp")]
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    return running if len(running) == size == len(pods) else None


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


def shrink_four_to_two(kube, ns: str, name: str, operator, **progress: int) -> None:
    """The job ``name`` (4 ranks, ``minReplicas`` 2) runs, commits step 100 (with ``progress``
    in the same report), loses two nodes and runs on as the 2 ranks of attempt 1."""
    wait_for("4 ranks running", lambda: gang_on(kube, ns, name, 0, 4), 60, on_timeout=operator.tail)
    kube.report_progress(ns, f"{name}-a0-r0", "ep0-ba100", 100, **progress)
    wait_for(
        "checkpoint 100",
        lambda: (kube.status(ns, name).get("lastCommittedCheckpoint") or {}).get("step") == 100,
        20,
    )
    for node in [p["spec"]["nodeName"] for p in kube.pods(ns, name, 0)][2:]:
        kube.delete_node(node)
    wait_for("shrunk to 2", lambda: gang_on(kube, ns, name, 1, 2), 40, on_timeout=operator.tail)


def test_shrinks_to_the_nodes_left_then_grows_back_after_a_checkpoint(kube, ns, pool, operator):
    pool.add(4, cpu="4")
    name = unique("elastic")
    elastic = {"minReplicas": 2, "shrinkAfterSeconds": 5, "grow": {"minIntervalSeconds": 0}}
    kube.create_job(rtj(name, ns, pool.name, 4, template_spec=template(), elastic=elastic))
    wait_for("4 ranks running", lambda: gang_on(kube, ns, name, 0, 4), 60, on_timeout=operator.tail)
    status = kube.status(ns, name)
    assert status["gangSize"] == 4 and status["worldSize"] == 4
    kube.report_progress(ns, f"{name}-a0-r0", "ep0-ba100", 100, current_step=120)
    wait_for(
        "checkpoint seen",
        lambda: (kube.status(ns, name).get("lastCommittedCheckpoint") or {}).get("step") == 100,
        20,
    )

    victims = [p["spec"]["nodeName"] for p in kube.pods(ns, name, 0)][2:]
    lost_at = time.monotonic()
    for node in victims:
        kube.delete_node(node)  # spot reclaim with no spare capacity
    pods = wait_for(
        "2 ranks running",
        lambda: gang_on(kube, ns, name, 1, 2),
        40,
        on_timeout=lambda: f"{kube.status(ns, name)}\n{operator.tail()}",
    )
    assert time.monotonic() - lost_at <= 5 + 5 + 2  # the wait + 5 s (+ kwok's start)
    env = env_of(pods[0])
    assert env["WORLD_SIZE"] == "2" and env["RTJ_RESUME_FROM"].endswith("/ep0-ba100")
    status = kube.status(ns, name)
    assert status["gangSize"] == 2 and status["preemptions"] == 1 and status["failures"] == 0
    full, shrunk = status["sizeHistory"]
    assert (full["size"], shrunk["size"], shrunk["reason"]) == (4, 2, "Shrunk")
    assert shrunk["stepsLost"] == 20
    wait_events(kube, ns, name, {"WaitingForCapacity", "Shrunk"})

    def grow_notices() -> list[bool]:
        return [
            "resumable.dev/grow"
            in (p["metadata"].get("annotations") or {}).get("resumable.dev/preemption-notice", "")
            for p in kube.pods(ns, name, 1)
        ]

    # Room for the full gang, but the shrunk gang has not trained since its resume (its ranks
    # could still be loading the checkpoint): no grow is asked of it, however long it runs.
    pool.add(2, cpu="4")
    time.sleep(6)  # a node change wakes the operator at once; it also looks every 5 s
    status = kube.status(ns, name)
    assert not any(grow_notices()), operator.tail()
    assert "grow" not in status and "trainingSince" not in status, status
    assert status["attempt"] == 1 and status["gangSize"] == 2
    # Rank 0 reports a step past the checkpoint it resumed from: the gang trains, it may grow.
    kube.report_progress(ns, f"{name}-a1-r0", "ep0-ba100", 100, current_step=101)
    wait_for(
        "the grow's notice",
        lambda: (notices := grow_notices()) and all(notices),
        30,
        on_timeout=lambda: f"{kube.status(ns, name)}\n{operator.tail()}",
    )
    assert "trainingSince" in kube.status(ns, name)
    time.sleep(2)
    assert kube.status(ns, name)["attempt"] == 1  # no restart before the checkpoint commits
    kube.report_progress(ns, f"{name}-a1-r0", "ep0-ba140", 140)
    pods = wait_for(
        "4 ranks again",
        lambda: gang_on(kube, ns, name, 2, 4),
        40,
        on_timeout=lambda: f"{kube.status(ns, name)}\n{operator.tail()}",
    )
    env = env_of(pods[0])
    assert env["WORLD_SIZE"] == "4" and env["RTJ_RESUME_FROM"].endswith("/ep0-ba140")
    status = kube.status(ns, name)
    assert status["preemptions"] == 1 and status["failures"] == 0
    assert status["interruptions"][-1]["cause"] == "Grow"
    last = status["sizeHistory"][-1]
    assert last["size"] == 4 and last["reason"] == "Grown" and last["stepsLost"] == 0
    wait_events(kube, ns, name, {"GrowRequested", "Growing", "Grown"})


def test_a_fixed_gang_with_room_for_three_of_four_binds_no_pod(kube, ns, pool, operator):
    pool.add(3, cpu="4")
    name = unique("gang")
    kube.create_job(rtj(name, ns, pool.name, 4, template_spec=template()))
    cond = wait_for(
        "PodsScheduled=False",
        lambda: (
            c
            if (c := condition(kube, ns, name, "PodsScheduled")).get("status") == "False"
            else None
        ),
        40,
        on_timeout=lambda: f"{kube.status(ns, name)}\n{operator.tail()}",
    )
    # Ours says how the gang is held back; the scheduler's own reason follows it.
    assert f"PodGroup {name}-a0 binds no pod until all 4 fit" in cond["message"]
    assert "gang" in cond["message"].split("): ", 1)[1] or "Insufficient" in cond["message"]
    assert kube.status(ns, name)["gangScheduling"] == "PodGroup"
    time.sleep(3)
    pods = kube.pods(ns, name, 0)
    assert len(pods) == 4
    assert not [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]


def test_min_replicas_unreachable_waits_pending_and_never_fails(kube, ns, pool, operator):
    pool.add(1, cpu="4")
    name = unique("short")
    elastic = {"minReplicas": 2, "shrinkAfterSeconds": 1}
    kube.create_job(rtj(name, ns, pool.name, 3, template_spec=template(), elastic=elastic))
    wait_for(
        "MinReplicasUnreachable",
        lambda: (
            condition(kube, ns, name, "CapacityAvailable").get("reason") == "MinReplicasUnreachable"
        ),
        30,
        on_timeout=lambda: f"{kube.status(ns, name)}\n{operator.tail()}",
    )
    time.sleep(6)
    status = kube.status(ns, name)
    assert status["phase"] == "Pending" and status["preemptions"] == 0 and status["failures"] == 0
    assert not kube.pods(ns, name)
    wait_events(kube, ns, name, {"WaitingForCapacity"})
    pool.add(1, cpu="4")
    pods = wait_for("2 ranks", lambda: gang_on(kube, ns, name, 0, 2), 40, on_timeout=operator.tail)
    assert env_of(pods[0])["WORLD_SIZE"] == "2"


def test_the_api_server_refuses_an_impossible_range(kube, ns, pool, operator):
    def refused(**spec: Any) -> str:
        try:
            kube.create_job(rtj(unique("bad"), ns, pool.name, 4, **spec))
        except ApiError as err:
            assert err.status == 422, err
            return err.message
        raise AssertionError(f"accepted {spec}")

    message = refused(elastic={"minReplicas": 5})
    assert "spec.elastic.minReplicas" in message
    assert "must not exceed replicas" in message
    assert "spec.elastic.minReplicas" in refused(elastic={"minReplicas": 0})
    assert "spec.queueName" in refused(queueName="Not A Queue")


def test_a_gang_that_does_not_fit_after_all_is_resubmitted_smaller(kube, ns, pool, operator):
    nodes = pool.add(4, cpu="4")
    # Another workload fills one node: the operator's capacity count (which does not subtract
    # foreign pods) still says 4 ranks fit, so the gang starts at 4 and its PodGroup binds none.
    kube.req(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        body={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "another-workload"},
            "spec": {
                "nodeName": nodes[3],
                "containers": [{"name": "c", "image": "registry.local/other:1", "resources": CPU}],
            },
        },
    )
    name = unique("overcount")
    elastic = {"minReplicas": 2, "shrinkAfterSeconds": 5}
    kube.create_job(rtj(name, ns, pool.name, 4, template_spec=template(), elastic=elastic))
    pods = wait_for(
        "3 ranks running",
        lambda: gang_on(kube, ns, name, 1, 3),
        60,
        on_timeout=lambda: f"{kube.status(ns, name)}\n{operator.tail()}",
    )
    assert env_of(pods[0])["WORLD_SIZE"] == "3"
    assert nodes[3] not in {p["spec"]["nodeName"] for p in pods}
    status = kube.status(ns, name)
    assert status["gangSize"] == 3 and status["preemptions"] == 0 and status["failures"] == 0
    (interruption,) = status["interruptions"]
    assert interruption["cause"] == "Unschedulable" and interruption["preemption"] is False
    assert "only 0 of 4 pods were scheduled within 5s" in interruption["message"]
    history = [(h["size"], h["reason"]) for h in status["sizeHistory"]]
    assert history == [(4, "FullSize"), (3, "Shrunk")], history
    assert not [p for p in kube.pods(ns, name, 0) if p["spec"].get("nodeName")]
    wait_events(kube, ns, name, {"Shrunk"})


def test_a_grow_that_would_not_pay_is_deferred_and_said_until_it_pays(kube, ns, pool, operator):
    """``grow.onlyWhenItPays`` through the real API: the goodput account's restart time (made
    large in the status, as a GPU-scale job's restarts are) holds the grow back, the event and
    ``status.growDeferred`` say why (the CRD's schema keeps both new status fields), and once
    restarts are cheap the grow is asked for."""
    pool.add(4, cpu="4")
    name = unique("payoff")
    elastic = {"minReplicas": 2, "shrinkAfterSeconds": 5, "grow": {"minIntervalSeconds": 0}}
    kube.create_job(rtj(name, ns, pool.name, 4, template_spec=template(), elastic=elastic))
    shrink_four_to_two(kube, ns, name, operator, current_step=120)
    kube.report_progress(ns, f"{name}-a1-r0", "ep0-ba100", 100, current_step=101)
    wait_for("the gang trains", lambda: "trainingSince" in kube.status(ns, name), 20)
    assert kube.status(ns, name)["goodput"]["restarts"] == 1

    def set_restart_time(seconds: float) -> None:
        kube.request(
            "PATCH",
            kube.job_path(ns, name) + "/status",
            content_type=MERGE,
            body={"status": {"goodput": {"restartingSeconds": seconds}}},
        )

    def grow_notices() -> list[bool]:
        return [
            "resumable.dev/grow"
            in (p["metadata"].get("annotations") or {}).get("resumable.dev/preemption-notice", "")
            for p in kube.pods(ns, name, 1)
        ]

    set_restart_time(100000.0)
    pool.add(2, cpu="4")
    deferred = wait_for(
        "the grow deferred",
        lambda: kube.status(ns, name).get("growDeferred"),
        30,
        on_timeout=lambda: f"{kube.status(ns, name)}\n{operator.tail()}",
    )
    assert "room for 4 of 4 pods" in deferred and "grow.onlyWhenItPays" in deferred, deferred
    wait_events(kube, ns, name, {"GrowDeferred"})
    time.sleep(6)  # the operator looks every 5 s: still held back
    assert not any(grow_notices()) and "grow" not in kube.status(ns, name)

    set_restart_time(1.0)
    wait_for(
        "the grow's notice",
        lambda: (notices := grow_notices()) and all(notices),
        30,
        on_timeout=lambda: f"{kube.status(ns, name)}\n{operator.tail()}",
    )
    assert "growDeferred" not in kube.status(ns, name)
