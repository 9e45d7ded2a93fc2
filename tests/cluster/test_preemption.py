"""Every preemption signal docs/operator.md lists, produced by the real control plane."""

from __future__ import annotations

import json
import time

from tools.kubeapi import MERGE, ApiError, env_of, unique
from tools.waiting import wait_for

from .scenario import (
    condition,
    last_interruption,
    node_of,
    start_running,
    wait_attempt,
    wait_events,
)


def test_node_deleted_resubmits_the_whole_gang_from_the_last_checkpoint(kube, ns, pool, operator):
    name = start_running(kube, ns, pool, operator, replicas=3)
    report = kube.report_progress(ns, f"{name}-a0-r0", "ep0-ba100", 100, current_step=130)
    wait_for(
        "checkpoint in status",
        lambda: (kube.status(ns, name).get("lastCommittedCheckpoint") or {}).get("step") == 100,
        10,
        on_timeout=operator.tail,
    )

    victim = node_of(kube, ns, name, 0, 1)
    on_victim = [r for r in range(3) if node_of(kube, ns, name, 0, r) == victim]
    kube.delete_node(victim)  # spot reclaim: the VM is gone, no kubelet reports anything
    pods = wait_attempt(kube, ns, name, 1, 3, op=operator)

    for rank, pod in enumerate(pods):
        env = env_of(pod)
        assert env["RTJ_ATTEMPT"] == "1" and env["RANK"] == str(rank)
        assert env["RTJ_RESUME_FROM"] == json.loads(report)["uri"]
        assert env["MASTER_ADDR"] == f"{name}-a1-r0.{name}"
    status = kube.status(ns, name)
    assert status["preemptions"] == 1 and status["failures"] == 0 and status["attempt"] == 1
    # The new gang is all-or-nothing too: a PodGroup of its own; attempt 0's is deleted.
    assert status["gangScheduling"] == "PodGroup"
    assert all(p["spec"].get("schedulingGroup") == {"podGroupName": f"{name}-a1"} for p in pods)
    groups = f"/apis/scheduling.k8s.io/v1alpha2/namespaces/{ns}/podgroups"
    assert kube.get(f"{groups}/{name}-a1") is not None
    # Deleted: gone, or held by a finalizer until its pods are (they were on the lost node).
    wait_for(
        "attempt 0's PodGroup deleted",
        lambda: (
            (g := kube.get(f"{groups}/{name}-a0")) is None or g["metadata"].get("deletionTimestamp")
        ),
        10,
        on_timeout=lambda: f"{kube.get(f'{groups}/{name}-a0')}",
    )
    hit = last_interruption(kube, ns, name)
    assert hit["cause"] == "NodeDeleted" and hit["node"] == victim
    assert hit["rank"] == on_victim[0]
    assert hit["lastCommittedStep"] == 100 and hit["stepsLost"] == 30
    # The surviving ranks of attempt 0 were told to stop (they get their grace period).
    wait_for(
        "attempt 0 ranks gone or terminating",
        lambda: all(
            p["metadata"].get("deletionTimestamp") or p["spec"]["nodeName"] == victim
            for p in kube.pods(ns, name, 0)
        ),
        20,
        on_timeout=operator.tail,
    )
    pool.add(1)
    wait_for(
        "attempt 1 running", lambda: kube.running(ns, name, 1, 3), 60, on_timeout=operator.tail
    )
    wait_for("phase Running", lambda: kube.status(ns, name).get("phase") == "Running", 20)
    wait_events(kube, ns, name, {"Preempted", "Resubmitted"})


def test_eviction_api(kube, ns, pool, operator):
    name = start_running(kube, ns, pool, operator)
    kube.evict(ns, f"{name}-a0-r0")
    wait_attempt(kube, ns, name, 1, 2, op=operator)
    hit = last_interruption(kube, ns, name)
    assert hit["cause"] == "Evicted" and hit["preemption"], hit
    assert kube.status(ns, name)["failures"] == 0


def test_noexecute_taint_eviction(kube, ns, pool, operator):
    name = start_running(kube, ns, pool, operator)
    node = node_of(kube, ns, name, 0, 1)
    kube.taint(node, "rtj-e2e/maintenance", "NoExecute", "now")
    wait_attempt(kube, ns, name, 1, 2, op=operator)
    hit = last_interruption(kube, ns, name)
    assert hit["cause"] == "TaintEviction" and hit["rank"] == 1, hit


def test_termination_taint_sends_a_notice_and_restarts_only_when_the_node_goes(
    kube, ns, pool, operator
):
    name = start_running(kube, ns, pool, operator)
    node = node_of(kube, ns, name, 0, 0)
    kube.taint(node, "ToBeDeletedByClusterAutoscaler", "NoSchedule", str(int(time.time())))
    pod = f"{name}-a0-r0"
    notice = wait_for(
        "notice annotation",
        lambda: (
            (kube.pod(ns, pod) or {})
            .get("metadata", {})
            .get("annotations", {})
            .get("resumable.dev/preemption-notice")
        ),
        10,
        on_timeout=operator.tail,
    )
    data = json.loads(notice)
    assert data["reason"] == "ToBeDeletedByClusterAutoscaler" and data["node"] == node
    assert data["time"]
    other = kube.pod(ns, f"{name}-a0-r1")
    assert "resumable.dev/preemption-notice" not in (other["metadata"].get("annotations") or {})
    assert condition(kube, ns, name, "PreemptionNotice")["status"] == "True"
    time.sleep(2)
    assert kube.status(ns, name)["attempt"] == 0  # a notice alone restarts nothing
    wait_events(kube, ns, name, {"PreemptionNotice"})
    kube.delete_node(node)
    wait_attempt(kube, ns, name, 1, 2, op=operator)
    assert last_interruption(kube, ns, name)["cause"] == "NodeDeleted"


def test_a_withdrawn_termination_taint_empties_the_notice_and_a_new_one_is_sent(
    kube, ns, pool, operator
):
    """A cancelled scale-down: the taint goes, the notice file empties; when the node is
    announced again the rank gets a fresh notice (the runtime acts only on new content)."""
    name = start_running(kube, ns, pool, operator)
    node = node_of(kube, ns, name, 0, 0)
    pod = f"{name}-a0-r0"

    def notice() -> str | None:
        annotations = ((kube.pod(ns, pod) or {}).get("metadata") or {}).get("annotations") or {}
        return annotations.get("resumable.dev/preemption-notice")

    kube.taint(node, "ToBeDeletedByClusterAutoscaler", "NoSchedule", "1")
    first = wait_for("notice", notice, 10, on_timeout=operator.tail)
    kube.req("PATCH", f"/api/v1/nodes/{node}", content_type=MERGE, body={"spec": {"taints": []}})
    wait_for("notice withdrawn", lambda: notice() == "", 10, on_timeout=operator.tail)
    assert condition(kube, ns, name, "PreemptionNotice")["status"] == "False"
    kube.taint(node, "ToBeDeletedByClusterAutoscaler", "NoSchedule", "2")
    second = wait_for("new notice", notice, 10, on_timeout=operator.tail)
    assert second != first and json.loads(second)["node"] == node
    assert kube.status(ns, name)["attempt"] == 0  # notices alone restart nothing


def test_out_of_service_taint_notices_then_the_eviction_restarts(kube, ns, pool, operator):
    name = start_running(kube, ns, pool, operator)
    node = node_of(kube, ns, name, 0, 1)
    kube.taint(node, "node.kubernetes.io/out-of-service", "NoExecute", "nodeshutdown")
    wait_attempt(kube, ns, name, 1, 2, op=operator)
    hit = last_interruption(kube, ns, name)
    assert hit["preemption"] and hit["cause"] in ("TaintEviction", "PodDeleted", "PodRemoved"), hit


def test_scheduler_preemption_by_a_higher_priority_class(kube, ns, pool, operator):
    name = start_running(
        kube,
        ns,
        pool,
        operator,
        replicas=2,
        cpu="4",
        template_spec={
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.local/train:1",
                    "resources": {"requests": {"cpu": "3"}},
                }
            ]
        },
    )
    high = unique("rtj-e2e-high")
    kube.apply(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": high},
            "value": 1000000,
        }
    )
    try:
        urgent = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "urgent"},
            "spec": {
                "priorityClassName": high,
                "nodeSelector": {"rtj-e2e/pool": pool.name},
                "containers": [
                    {"name": "c", "image": "x", "resources": {"requests": {"cpu": "3"}}}
                ],
            },
        }

        def create_urgent() -> bool | None:
            # The Priority admission plugin reads PriorityClasses from an informer cache: a
            # class created a moment ago can still be unknown to it ("no PriorityClass").
            try:
                kube.req("POST", f"/api/v1/namespaces/{ns}/pods", body=urgent)
            except ApiError as err:
                if "no PriorityClass" in str(err):
                    return None
                raise
            return True

        wait_for("the API server to admit a pod of the new PriorityClass", create_urgent, 30)
        wait_attempt(kube, ns, name, 1, 2, op=operator)
        hit = last_interruption(kube, ns, name)
        assert hit["cause"] == "SchedulerPreemption" and hit["preemption"], hit
    finally:
        kube.req("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{high}")


def test_node_not_ready_past_the_grace_period(kube, ns, pool, operator):
    name = start_running(kube, ns, pool, operator, preemptionSignals={"nodeNotReadySeconds": 2})
    node = node_of(kube, ns, name, 0, 0)
    started = time.monotonic()
    kube.stop_kubelet(node)
    wait_attempt(kube, ns, name, 1, 2, op=operator)
    assert time.monotonic() - started >= 2
    hit = last_interruption(kube, ns, name)
    assert hit["cause"] == "NodeNotReady" and hit["node"] == node, hit
