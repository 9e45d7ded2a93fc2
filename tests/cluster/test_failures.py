"""Real failures: counted, backed off, budget exhausted; a bad checkpoint quarantined."""

from __future__ import annotations

import time

from tools.kubeapi import MERGE, env_of, rtj, unique
from tools.waiting import wait_for

from .scenario import (
    condition,
    last_interruption,
    node_of,
    printed_row,
    start_running,
    wait_attempt,
    wait_events,
    wait_phase,
)


def test_failure_is_counted_and_backed_off(kube, ns, pool, operator):
    name = start_running(
        kube, ns, pool, operator, resumePolicy={"backoffBaseSeconds": 3, "backoffLimit": 5}
    )
    failed_at = time.monotonic()
    kube.end_container(ns, f"{name}-a0-r1", 1)
    wait_for(
        "failure recorded",
        lambda: kube.status(ns, name).get("failures") == 1,
        30,  # the first test of a session also waits for a cold operator and cluster
        on_timeout=operator.tail,
    )
    status = kube.status(ns, name)
    assert status["attempt"] == 1 and status["preemptions"] == 0
    assert status["restartAfter"] and status["phase"] == "Restarting"
    hit = last_interruption(kube, ns, name)
    assert hit["cause"] == "Failure" and hit["exitCode"] == 1 and not hit["preemption"]
    time.sleep(1.5)
    assert kube.pods(ns, name, 1) == []  # still backing off
    wait_attempt(kube, ns, name, 1, 2, op=operator, timeout=20)
    assert time.monotonic() - failed_at >= 2.9
    wait_events(kube, ns, name, {"RankFailed", "BackingOff", "Resubmitted"})


def test_failure_budget_exhausted(kube, ns, pool, operator):
    name = start_running(
        kube, ns, pool, operator, resumePolicy={"backoffBaseSeconds": 1, "backoffLimit": 1}
    )
    kube.end_container(ns, f"{name}-a0-r0", 2)
    wait_for(
        "attempt 1 running", lambda: kube.running(ns, name, 1, 2), 30, on_timeout=operator.tail
    )
    kube.end_container(ns, f"{name}-a1-r1", 137, reason="OOMKilled")
    wait_phase(kube, ns, name, "Failed", 20, op=operator)
    failed = condition(kube, ns, name, "Failed")
    assert failed["status"] == "True" and failed["reason"] == "BackoffLimitExceeded"
    assert "OOMKilled" in failed["message"]
    status = kube.status(ns, name)
    assert status["failures"] == 2 and status["completionTime"]
    wait_for(
        "the surviving rank stopped",
        lambda: all(
            p["metadata"].get("deletionTimestamp") or p["status"]["phase"] == "Failed"
            for p in kube.pods(ns, name, 1)
        ),
        20,
    )
    time.sleep(1)
    assert kube.pods(ns, name, 2) == []


def test_repeated_failure_after_resume_quarantines_the_checkpoint(kube, ns, pool, operator):
    name = start_running(
        kube,
        ns,
        pool,
        operator,
        resumePolicy={"backoffBaseSeconds": 0, "backoffLimit": 10, "quarantineThreshold": 2},
    )
    kube.report_progress(ns, f"{name}-a0-r0", "ep0-ba100", 100)
    wait_for(
        "first checkpoint",
        lambda: (kube.status(ns, name).get("lastCommittedCheckpoint") or {}).get("step") == 100,
        10,
    )
    kube.report_progress(ns, f"{name}-a0-r0", "ep0-ba200", 200)
    wait_for(
        "second checkpoint",
        lambda: (kube.status(ns, name).get("lastCommittedCheckpoint") or {}).get("step") == 200,
        10,
    )
    kube.delete_node(node_of(kube, ns, name, 0, 0))
    pool.add(1)
    for attempt in (1, 2):
        pods = wait_for(
            f"attempt {attempt} running",
            lambda a=attempt: kube.running(ns, name, a, 2),
            30,
            on_timeout=operator.tail,
        )
        assert env_of(pods[0])["RTJ_RESUME_FROM"] == "s3://ckpt/run/ep0-ba200"
        kube.end_container(ns, f"{name}-a{attempt}-r0", 1)  # crashes right after resuming
    pods = wait_attempt(kube, ns, name, 3, 2, op=operator)
    env = env_of(pods[0])
    assert env["RTJ_RESUME_FROM"] == "s3://ckpt/run/ep0-ba100"
    assert env["RTJ_QUARANTINED"] == "ep0-ba200"
    status = kube.status(ns, name)
    assert status["quarantinedCheckpoints"] == ["ep0-ba200"] and status["quarantined"] == 1
    assert status["failures"] == 2 and status["preemptions"] == 1
    wait_events(kube, ns, name, {"CheckpointQuarantined"})


def test_training_exit_zero_succeeds_even_when_a_sidecar_fails_the_pod(kube, ns, pool, operator):
    """Classification's first row: the training container's exit 0 is a success. A sidecar
    that exits 1 when the training ends leaves its pod Failed, which is no reason to run a
    finished training again."""
    sidecar = {"name": "log-shipper", "image": "registry.local/shipper:1"}
    trainer = {"name": "trainer", "image": "registry.local/train:1"}
    name = start_running(kube, ns, pool, operator, template_spec={"containers": [trainer, sidecar]})
    for rank, sidecar_code in ((0, 1), (1, 0)):
        kube.end_containers(ns, f"{name}-a0-r{rank}", {"trainer": 0, "log-shipper": sidecar_code})
    wait_phase(kube, ns, name, "Succeeded", 10, op=operator)
    status = kube.status(ns, name)
    assert status["failures"] == 0 and status["attempt"] == 0, status


def test_a_rank_that_crashes_because_its_peers_node_died_silently_is_a_preemption(
    kube, ns, pool, operator
):
    """preemptionSignals.failureSettleSeconds: rank 0 exits 1 at once (its gloo peer went),
    while rank 1's node dies without its Node being deleted and turns NotReady only later."""
    name = start_running(
        kube,
        ns,
        pool,
        operator,
        preemptionSignals={"failureSettleSeconds": 60, "nodeNotReadySeconds": 60},
        resumePolicy={"backoffBaseSeconds": 1},
    )
    peer_node = node_of(kube, ns, name, 0, 1)
    kube.end_container(ns, f"{name}-a0-r0", 1)
    time.sleep(3)  # within the wait: nothing is counted yet
    status = kube.status(ns, name)
    assert status["attempt"] == 0 and not status.get("failures"), status
    kube.stop_kubelet(peer_node)  # its heartbeats stop; the node controller says NotReady
    wait_attempt(kube, ns, name, 1, 2, op=operator)
    status = kube.status(ns, name)
    assert status.get("failures", 0) == 0 and status["preemptions"] == 1, status
    hit = last_interruption(kube, ns, name)
    assert hit["preemption"] and hit["cause"] == "NodeNotReady" and hit["rank"] == 0, hit


def test_without_node_trouble_the_settled_failure_counts_after_the_wait(kube, ns, pool, operator):
    name = start_running(
        kube,
        ns,
        pool,
        operator,
        preemptionSignals={"failureSettleSeconds": 4},
        resumePolicy={"backoffBaseSeconds": 1},
    )
    ended = time.monotonic()
    kube.end_container(ns, f"{name}-a0-r1", 1)
    wait_for(
        "failure recorded",
        lambda: kube.status(ns, name).get("failures") == 1,
        30,
        on_timeout=operator.tail,
    )
    assert time.monotonic() - ended >= 2.9  # 4 s from finishedAt, which has whole seconds
    hit = last_interruption(kube, ns, name)
    assert hit["cause"] == "Failure" and not hit["preemption"] and hit["rank"] == 1, hit


def test_a_failure_backoff_and_a_suspend_during_it_show_no_gang(
    kube, kubeconfig, ns, pool, operator
):
    """Before: during the backoff ``status.gangScheduling`` still named the ended attempt's
    mechanism; suspended then, the Suspended event said "deleting the gang" with no pod left,
    and ``kubectl get rtj`` showed SIZE 2 for the Suspended job."""
    name = start_running(kube, ns, pool, operator, resumePolicy={"backoffBaseSeconds": 120})
    assert printed_row(kubeconfig, ns, name)["SIZE"] == "2"
    assert kube.status(ns, name)["gangScheduling"] == "PodGroup"
    kube.end_container(ns, f"{name}-a0-r1", 1)
    wait_for(
        "the backoff",
        lambda: kube.status(ns, name).get("restartAfter"),
        30,
        on_timeout=operator.tail,
    )
    status = kube.status(ns, name)
    assert status["phase"] == "Restarting" and status["attempt"] == 1
    assert "gangScheduling" not in status and "gangSize" not in status, status
    assert printed_row(kubeconfig, ns, name)["SIZE"] == ""

    kube.patch_job(ns, name, {"suspend": True})
    wait_phase(kube, ns, name, "Suspended", 10, op=operator)
    wait_events(kube, ns, name, {"Suspended"})
    event = next(e for e in kube.events(ns, name) if e["reason"] == "Suspended")
    assert "deleting" not in event["message"] and "no gang exists" in event["message"], event
    assert printed_row(kubeconfig, ns, name)["SIZE"] == ""
    assert kube.status(ns, name)["restartAfter"] == status["restartAfter"]


def container_state(kube, ns: str, pod: str, phase: str, state: dict) -> None:
    """Report the training container's state as its kubelet would (status subresource)."""
    kube.req(
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{pod}/status",
        content_type=MERGE,
        body={
            "status": {
                "phase": phase,
                "containerStatuses": [
                    {
                        "name": "trainer",
                        "image": "registry.local/train:1",
                        "imageID": "",
                        "ready": phase == "Running",
                        "restartCount": 0,
                        "state": state,
                    }
                ],
            }
        },
    )


def test_an_image_that_cannot_be_pulled_waits_and_counts_nothing(kube, ns, pool, operator):
    """docs/operator.md: a rank whose image cannot be pulled is neither a preemption nor a
    failure; the job waits with its pods until the kubelet pulls the image."""
    pool.add(2, kwok=False)  # Ready nodes no kubelet runs pods on: the test reports for it
    name = unique("image")
    # Without heartbeats the nodes turn Unknown after the node controller's grace period: a
    # slow run must not see that as node trouble.
    signals = {"nodeNotReadySeconds": 3600}
    kube.create_job(rtj(name, ns, pool.name, 2, preemptionSignals=signals))
    pods = wait_for(
        "both ranks bound",
        lambda: (
            p
            if len(p := [x for x in kube.pods(ns, name, 0) if x["spec"].get("nodeName")]) == 2
            else None
        ),
        30,
        on_timeout=operator.tail,
    )
    pulling = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x"'}}
    for pod in pods:
        container_state(kube, ns, pod["metadata"]["name"], "Pending", pulling)
    time.sleep(3)  # the pod events have been reconciled
    status = kube.status(ns, name)
    assert status["phase"] == "Pending" and status["attempt"] == 0, status
    assert status["preemptions"] == 0 and status["failures"] == 0, status
    assert not status.get("interruptions"), status
    assert all(not p["metadata"].get("deletionTimestamp") for p in kube.pods(ns, name, 0))

    started = {"running": {"startedAt": "2030-01-01T00:00:00Z"}}
    for pod in pods:
        container_state(kube, ns, pod["metadata"]["name"], "Running", started)
    wait_phase(kube, ns, name, "Running", 20, op=operator)
    assert kube.status(ns, name)["attempt"] == 0
