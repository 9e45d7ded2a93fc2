"""All-or-nothing scheduling on the real control plane: what a queue name does without Kueue,
and a PodGroup name still held by a deleted job of the same name.

The local control plane serves the PodGroup API (hack/cluster/cluster.sh) and has no Kueue.
"""

from __future__ import annotations

import time

from tools.kubeapi import MERGE, rtj, unique
from tools.waiting import wait_for

from .scenario import condition, node_of, wait_events, wait_phase


def lift_gates(kube, ns: str, name: str) -> None:
    """Remove the scheduling gates of attempt 0's pods, as an admission controller would."""
    for pod in kube.pods(ns, name, 0):
        kube.req(
            "PATCH",
            f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}",
            content_type=MERGE,
            body={"spec": {"schedulingGates": None}},
        )


def test_a_queue_name_without_kueue_is_gang_scheduled_natively_and_says_so(
    kube, ns, pool, operator
):
    """Before: the pods got Kueue's labels, nothing gated them (no Kueue), three of four
    ranks bound and ran on the three nodes there were, no event said why, and status said
    gangScheduling Kueue."""
    pool.add(3, cpu="4")
    name = unique("queued")
    template = {
        "containers": [{"name": "trainer", "image": "x", "resources": {"requests": {"cpu": "4"}}}]
    }
    kube.create_job(rtj(name, ns, pool.name, 4, queueName="team-a", template_spec=template))
    wait_events(kube, ns, name, {"QueueNotServed"})
    warning = next(e for e in kube.events(ns, name) if e["reason"] == "QueueNotServed")
    assert warning["type"] == "Warning"
    assert "spec.queueName team-a" in warning["message"] and "kueue.x-k8s.io" in warning["message"]
    assert kube.status(ns, name)["gangScheduling"] == "PodGroup"
    pods = wait_for("4 pods", lambda: p if len(p := kube.pods(ns, name, 0)) == 4 else None, 20)
    for pod in pods:
        assert not any(k.startswith("kueue.x-k8s.io/") for k in pod["metadata"]["labels"])
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": f"{name}-a0"}
    time.sleep(3)  # the scheduler has had its chance: all-or-nothing binds none of the 4
    assert not [p["metadata"]["name"] for p in kube.pods(ns, name, 0) if p["spec"].get("nodeName")]

    pool.add(1, cpu="4")
    wait_phase(kube, ns, name, "Running", 30, op=operator)


HOLD = "rtj-e2e/hold"
"""Holds a PodGroup the way scheduling.k8s.io/podgroup-protection does while its pods exist."""


def hold(kube, path: str, held: bool) -> None:
    """Add or remove the HOLD finalizer (a held group blocks its namespace's deletion)."""
    group = kube.get(path)
    if group is None:
        return
    finalizers = [f for f in group["metadata"].get("finalizers") or [] if f != HOLD]
    body = {"metadata": {"finalizers": [*finalizers, HOLD] if held else finalizers}}
    kube.req("PATCH", path, content_type=MERGE, body=body)


def test_a_job_recreated_while_the_deleted_jobs_pod_group_remains_waits_for_it(
    kube, ns, pool, operator
):
    """Before: the new job's create of <job>-a0 answered 409, passed for its own group, and its
    pods joined the deleted job's group, which was about to go (pods not bound by then would
    wait for a group that no longer exists)."""
    pool.add(2)
    name = unique("again")
    kube.create_job(rtj(name, ns, pool.name, 2))
    wait_for(
        "attempt 0 running", lambda: kube.running(ns, name, 0, 2), 60, on_timeout=operator.tail
    )
    old_group = f"/apis/scheduling.k8s.io/v1alpha2/namespaces/{ns}/podgroups/{name}-a0"
    hold(kube, old_group, True)
    try:
        kube.delete_job(ns, name)
        wait_for("the old pods gone", lambda: not kube.pods(ns, name), 60)
        wait_for(
            "the old PodGroup deleting",
            lambda: ((kube.get(old_group) or {}).get("metadata") or {}).get("deletionTimestamp"),
            30,
        )
        uid = kube.create_job(rtj(name, ns, pool.name, 2))["metadata"]["uid"]
        blocked = wait_for(
            "Blocked=True",
            lambda: (
                c if (c := condition(kube, ns, name, "Blocked")).get("status") == "True" else None
            ),
            30,
            on_timeout=lambda: f"{kube.status(ns, name)}\n{operator.tail()}",
        )
        assert blocked["reason"] == "NameConflict"
        assert f"PodGroup {name}-a0" in blocked["message"]
        wait_events(kube, ns, name, {"NameConflict"})
        assert not kube.pods(ns, name) and kube.status(ns, name)["phase"] == "Pending"
    finally:
        hold(kube, old_group, False)
    wait_for(
        "attempt 0 of the new job running",
        lambda: kube.running(ns, name, 0, 2),
        60,
        on_timeout=lambda: f"{kube.status(ns, name)}\n{operator.tail()}",
    )
    group = kube.get(old_group)
    assert group is not None and group["metadata"]["ownerReferences"][0]["uid"] == uid
    assert condition(kube, ns, name, "Blocked")["status"] == "False"


def test_ranks_held_by_scheduling_gates_say_so_until_the_gates_go(kube, ns, pool, operator):
    """Before: gated ranks (Kueue's admission gate while the queue holds the gang, or the
    template's own) left the job Pending with no PodsScheduled condition and nothing saying why."""
    pool.add(2)
    name = unique("gated")
    gate = "example.com/approval"
    kube.create_job(
        rtj(name, ns, pool.name, 2, template_spec={"schedulingGates": [{"name": gate}]})
    )
    cond = wait_for(
        "PodsScheduled=False",
        lambda: (
            c
            if (c := condition(kube, ns, name, "PodsScheduled")).get("status") == "False"
            else None
        ),
        30,
        on_timeout=lambda: f"{kube.status(ns, name)}\n{operator.tail()}",
    )
    assert cond["reason"] == "SchedulingGated"
    assert "2 of 2 ranks cannot be scheduled" in cond["message"] and gate in cond["message"]
    assert kube.status(ns, name)["phase"] == "Pending"

    lift_gates(kube, ns, name)
    wait_phase(kube, ns, name, "Running", 30, op=operator)
    wait_for(
        "PodsScheduled=True",
        lambda: condition(kube, ns, name, "PodsScheduled").get("status") == "True",
        10,
        on_timeout=lambda: f"{kube.status(ns, name)}",
    )


def test_an_elastic_gang_held_by_scheduling_gates_is_not_reshrunk(kube, ns, pool, operator):
    """Before: 5 s after its pods were created (shrinkAfterSeconds 0) the gated 4-rank gang was
    ended as Unschedulable and resubmitted at 3, then 2: under Kueue each new gang queues anew."""
    pool.add(4)
    name = unique("gated")
    gate = "example.com/approval"
    kube.create_job(
        rtj(
            name,
            ns,
            pool.name,
            4,
            elastic={"minReplicas": 2, "shrinkAfterSeconds": 0},
            template_spec={"schedulingGates": [{"name": gate}]},
        )
    )
    wait_for(
        "PodsScheduled=False",
        lambda: condition(kube, ns, name, "PodsScheduled").get("reason") == "SchedulingGated",
        30,
        on_timeout=lambda: f"{kube.status(ns, name)}\n{operator.tail()}",
    )
    time.sleep(10)  # twice the shortest re-shrink wait (5 s)
    status = kube.status(ns, name)
    assert status["attempt"] == 0 and status["gangSize"] == 4 and not status["interruptions"]
    lift_gates(kube, ns, name)
    wait_phase(kube, ns, name, "Running", 30, op=operator)
    assert kube.status(ns, name)["gangSize"] == 4


def test_a_pod_group_the_job_does_not_control_is_never_deleted_by_its_next_attempt(
    kube, ns, pool, operator
):
    """Before: creating attempt 1 deleted the PodGroup ``<job>-a0`` by name, whoever owned it."""
    pool.add(3)
    name = unique("group")
    kube.create_job(rtj(name, ns, pool.name, 2))
    wait_for(
        "attempt 0 running", lambda: kube.running(ns, name, 0, 2), 60, on_timeout=operator.tail
    )
    path = f"/apis/scheduling.k8s.io/v1alpha2/namespaces/{ns}/podgroups/{name}-a0"
    kube.req("PATCH", path, content_type=MERGE, body={"metadata": {"finalizers": None}})
    kube.req("DELETE", path)
    wait_for("the job's own group gone", lambda: kube.get(path) is None, 30)
    foreign = {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": f"{name}-a0", "namespace": ns},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}},
    }
    uid = kube.req(
        "POST", f"/apis/scheduling.k8s.io/v1alpha2/namespaces/{ns}/podgroups", body=foreign
    )["metadata"]["uid"]
    kube.delete_node(node_of(kube, ns, name, 0, 0))
    wait_for(
        "attempt 1 running",
        lambda: kube.running(ns, name, 1, 2),
        60,
        on_timeout=lambda: f"{kube.status(ns, name)}\n{operator.tail()}",
    )
    own = kube.get(f"/apis/scheduling.k8s.io/v1alpha2/namespaces/{ns}/podgroups/{name}-a1")
    assert own is not None and own["metadata"]["ownerReferences"][0]["controller"]
    held = kube.get(path)
    assert held is not None and held["metadata"]["uid"] == uid, held
    assert not held["metadata"].get("deletionTimestamp"), held
    kube.req("DELETE", path)


def priority_class(kube, name: str, value: int) -> None:
    kube.req(
        "POST",
        "/apis/scheduling.k8s.io/v1/priorityclasses",
        body={
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
        },
    )


def test_a_gang_of_higher_priority_preempts_a_whole_gang_not_one_rank(kube, ns, pool, operator):
    """The PodGroup says ``disruptionMode: PodGroup`` with the template's priority class, so
    the scheduler's workload-aware preemption takes the whole low-priority gang as one victim:
    both of its ranks go for the one node the high-priority rank needs, none is left running
    alone, and the operator counts a preemption (never a failure) for each attempt it ended."""
    low, high = unique("low"), unique("high")
    priority_class(kube, low, 10)
    priority_class(kube, high, 1000)
    try:
        pool.add(2, cpu="4")

        def template(priority: str) -> dict:
            return {
                "priorityClassName": priority,
                "containers": [
                    {"name": "trainer", "image": "x", "resources": {"requests": {"cpu": "4"}}}
                ],
            }

        victim = unique("victim")
        kube.create_job(rtj(victim, ns, pool.name, 2, template_spec=template(low)))
        wait_phase(kube, ns, victim, "Running", 30, op=operator)
        group = kube.get(f"/apis/scheduling.k8s.io/v1alpha2/namespaces/{ns}/podgroups/{victim}-a0")
        assert group["spec"]["disruptionMode"] == "PodGroup"
        assert group["spec"]["priorityClassName"] == low
        ranks = {p["metadata"]["name"] for p in kube.pods(ns, victim, 0)}

        urgent = unique("urgent")
        kube.create_job(rtj(urgent, ns, pool.name, 1, template_spec=template(high)))
        wait_phase(kube, ns, urgent, "Running", 60, op=operator)

        def state() -> str:
            """What the cluster and the operator say, when the count does not come."""
            pods = kube.req("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
            events = kube.req("GET", f"/api/v1/namespaces/{ns}/events")["items"]
            return "\n".join(
                [f"status of {victim}: {kube.status(ns, victim)}"]
                + [
                    f"pod {p['metadata']['name']}: {p['status'].get('phase')} on "
                    f"{p['spec'].get('nodeName')} deleting={p['metadata'].get('deletionTimestamp')}"
                    for p in pods
                ]
                + [
                    f"event {e['involvedObject']['name']} {e.get('reason')}: {e.get('message')}"
                    for e in events
                ]
                + [operator.tail()]
            )

        wait_for(
            "the preemption counted",
            lambda: kube.status(ns, victim).get("preemptions"),
            45,  # past the operator's resync (30 s here), should a pod event be missed
            on_timeout=state,
        )

        def preempted() -> dict[str, str]:
            """The scheduler's Preempted events of the victim's ranks, by pod (it posts them on
            its own schedule, which can come after the operator counted the preemption)."""
            events = kube.req("GET", f"/api/v1/namespaces/{ns}/events")["items"]
            return {
                e["involvedObject"]["name"]: e.get("message") or ""
                for e in events
                if e.get("reason") == "Preempted" and e["involvedObject"]["name"] in ranks
            }

        # The whole gang, not one rank: the scheduler says it preempted the pod group. (It may
        # post no event for a rank that the operator deleted first, resubmitting the gang.)
        wait_for("a rank's Preempted event", preempted, 15, on_timeout=state)
        said = preempted()
        assert all("by podgroup" in message for message in said.values()), (said, state())
        status = kube.status(ns, victim)
        # Every attempt ended by a preemption, none by a failure. Normally one: a resubmitted
        # gang that the scheduler places before the urgent rank binds is preempted once more.
        assert status["failures"] == 0 and status["attempt"] == status["preemptions"], state()
    finally:
        for name in (low, high):
            kube.req("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
