"""All-or-nothing scheduling: the mechanism is chosen by API discovery and the queue name."""

from __future__ import annotations

import asyncio
import time

from rtj_operator.act.controller import Controller
from rtj_operator.act.kube_transport import ApiError
from rtj_operator.decide import gang, gang_mechanisms
from rtj_operator.decide.manifests import build_pod

from .fake_api import FakeApi
from .fakes import FakeCluster, job_body, make_job, make_node

KEY = ("ns", "train")


def sync(ctrl: Controller) -> None:
    async def run() -> None:
        await ctrl.sync(KEY, time.monotonic())
        await asyncio.gather(*ctrl.executor.events.tasks)

    asyncio.run(run())


def controller(native: bool, kueue: bool = False, **spec) -> tuple[Controller, FakeApi]:
    api = FakeApi()
    api.serves_pod_group_api = native
    api.serves_kueue_api = kueue
    api.put_job(job_body(replicas=3, **spec))
    api.nodes["node-0"] = make_node("node-0")
    return Controller(api, resync_seconds=0), api  # type: ignore[arg-type]


def test_discovery_picks_the_mechanism_and_a_queue_name_wins():
    assert gang.choose(make_job(), True) is gang.Mechanism.POD_GROUP
    assert gang.choose(make_job(), False) is gang.Mechanism.OPERATOR
    assert gang.choose(make_job(queueName="spot"), True, True) is gang.Mechanism.KUEUE
    assert gang.choose(make_job(queueName="spot"), True, False) is gang.Mechanism.POD_GROUP
    assert gang.choose(make_job(queueName="spot"), False, False) is gang.Mechanism.OPERATOR
    assert gang.serves_group({"kind": "APIGroup", "versions": [{"version": "v1beta1"}]})
    assert not gang.serves_group(None)
    assert gang.serves_pod_groups({"resources": [{"name": "podgroups"}]})
    assert not gang.serves_pod_groups({"resources": [{"name": "workloads"}]})
    assert not gang.serves_pod_groups(None)


def test_each_mechanism_is_one_implementation_found_again_from_its_pods_and_status():
    job = make_job(queueName="spot")
    for native, kueue in ((False, False), (True, False), (True, True)):
        mechanism = gang_mechanisms.choose(job, native, kueue)
        assert mechanism.name is gang.choose(job, native, kueue)
        pod = build_pod(job, 2, 0, resume_from="", quarantined=[])
        linked = mechanism.link_pod(pod, job, 2, 3)
        # An operator restarted mid-creation finishes the gang the way its first pods say.
        assert gang_mechanisms.of_pod(linked) is mechanism
        assert gang_mechanisms.of_status(mechanism.name.value) is mechanism
        group = mechanism.group(job, 2, 3, {})
        assert (group is not None) == (mechanism.name is gang.Mechanism.POD_GROUP)
        assert mechanism.keeps_pods == (mechanism.name is not gang.Mechanism.KUEUE)
    # A gang not yet created has no mechanism: nothing on its pods, its pods may be kept.
    assert gang_mechanisms.of_status(None).name is gang.Mechanism.OPERATOR


def test_native_gang_creates_the_pod_group_before_the_pods_and_links_them():
    ctrl, api = controller(native=True)
    sync(ctrl)
    creates = [c for c in api.calls if c.startswith("create")]
    assert creates.index("create PodGroup") < creates.index("create Pod")
    group = api.objects[api.pod_group_path("ns", "train-a0")]
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}
    assert group["spec"]["disruptionMode"] == "PodGroup"  # preempted whole
    assert group["metadata"]["ownerReferences"][0]["name"] == "train"
    pods = api.pods()
    assert len(pods) == 3
    assert all(p["spec"]["schedulingGroup"] == {"podGroupName": "train-a0"} for p in pods.values())
    assert api.job()["status"]["gangScheduling"] == "PodGroup"


def test_without_the_api_no_pod_group_and_no_link():
    ctrl, api = controller(native=False)
    sync(ctrl)
    assert "create PodGroup" not in api.calls
    assert all("schedulingGroup" not in p["spec"] for p in api.pods().values())
    assert api.job()["status"]["gangScheduling"] == "Operator"


def test_a_queue_name_labels_the_pods_for_kueue_pod_groups():
    ctrl, api = controller(native=True, kueue=True, queueName="spot-queue")
    sync(ctrl)
    assert "create PodGroup" not in api.calls
    for pod in api.pods().values():
        meta = pod["metadata"]
        assert meta["labels"][gang.KUEUE_QUEUE_LABEL] == "spot-queue"
        assert meta["labels"][gang.KUEUE_GROUP_LABEL] == "train-a0"
        assert meta["annotations"][gang.KUEUE_TOTAL_ANNOTATION] == "3"
        assert "schedulingGroup" not in pod["spec"]
    assert api.job()["status"]["gangScheduling"] == "Kueue"
    assert not [e for e in api.events if e[1] == "QueueNotServed"]


def test_a_queue_name_without_kueue_is_set_aside_with_a_warning():
    """Without Kueue nothing gates the labelled pods: they were scheduled one by one, with
    no event, while status.gangScheduling said Kueue."""
    ctrl, api = controller(native=True, queueName="spot-queue")
    sync(ctrl)
    assert "create PodGroup" in api.calls
    for pod in api.pods().values():
        assert not any(k.startswith("kueue.x-k8s.io/") for k in pod["metadata"]["labels"])
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": "train-a0"}
    assert api.job()["status"]["gangScheduling"] == "PodGroup"
    warnings = [e for e in api.events if e[1] == "QueueNotServed"]
    assert len(warnings) == 1
    assert "spec.queueName spot-queue" in warnings[0][2] and "PodGroup" in warnings[0][2]


def test_an_operator_restarted_mid_creation_finishes_the_gang_under_the_same_mechanism():
    """The first instance created pods without a PodGroup (it did not see the API); the next
    one sees it, but must not put the missing pods into a group the others never joined."""
    ctrl, api = controller(native=False)
    sync(ctrl)
    last = next(path for path in sorted(api.objects) if path.endswith("/pods/train-a0-r2"))
    del api.objects[last]  # killed before its last pod
    api.job()["status"]["gangCreated"] = False
    api.serves_pod_group_api = True
    api.calls.clear()
    sync(Controller(api, resync_seconds=0))  # type: ignore[arg-type]
    assert api.calls.count("create Pod") == 1
    assert "create PodGroup" not in api.calls
    assert not any(p["spec"].get("schedulingGroup") for p in api.pods().values())


def test_every_attempt_after_an_interruption_gets_its_own_pod_group():
    """A lost node ends attempt 0 and starts attempt 1 in the same pass: attempt 1 is gang
    scheduled by a PodGroup of its own too, and attempt 0's group is deleted."""
    ctrl, api = controller(native=True)
    sync(ctrl)
    api.run_pods("node-0")
    sync(ctrl)
    api.nodes.pop("node-0")
    ctrl.on_node_event("DELETED", make_node("node-0"))
    sync(ctrl)
    status = api.job()["status"]
    assert status["attempt"] == 1 and status["gangScheduling"] == "PodGroup"
    pods = api.pods()
    assert sorted(pods) == ["train-a1-r0", "train-a1-r1", "train-a1-r2"]
    assert all(p["spec"]["schedulingGroup"] == {"podGroupName": "train-a1"} for p in pods.values())
    assert api.pod_group_path("ns", "train-a1") in api.objects
    assert api.pod_group_path("ns", "train-a0") not in api.objects


def test_a_pod_group_of_another_job_blocks_the_attempt_until_it_is_gone():
    ctrl, api = controller(native=True)
    path = api.pod_group_path("ns", "train-a0")
    api.objects[path] = {
        "metadata": {
            "name": "train-a0",
            "namespace": "ns",
            "deletionTimestamp": "2026-01-01T00:00:00Z",
            "ownerReferences": [{"uid": "uid-of-a-deleted-job", "controller": True}],
        },
        "spec": {"schedulingPolicy": {"gang": {"minCount": 5}}},
    }
    sync(ctrl)
    assert not api.pods() and "create PodGroup" not in api.calls
    blocked = {c["type"]: c for c in api.job()["status"]["conditions"]}["Blocked"]
    assert blocked["reason"] == "NameConflict" and "PodGroup train-a0" in blocked["message"]

    del api.objects[path]
    sync(ctrl)
    assert len(api.pods()) == 3
    assert api.objects[path]["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}


def foreign_pod_group(name: str) -> dict:
    """A PodGroup that no job controls (made by hand)."""
    return {
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ns", "uid": f"foreign-{name}"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 1}}},
    }


def test_the_previous_attempts_pod_group_is_deleted_only_when_the_job_controls_it():
    """Attempt 1's creation deleted ``train-a0`` by name, whoever owned it."""
    ctrl, api = controller(native=True)
    sync(ctrl)
    api.run_pods("node-0")
    sync(ctrl)
    path = api.pod_group_path("ns", "train-a0")
    api.objects[path] = foreign_pod_group("train-a0")  # the job's own was replaced by hand
    api.nodes.pop("node-0")
    ctrl.on_node_event("DELETED", make_node("node-0"))
    sync(ctrl)
    assert api.job()["status"]["attempt"] == 1 and len(api.pods()) == 3
    assert api.objects[path]["metadata"]["uid"] == "foreign-train-a0"


def test_a_pod_group_of_the_next_attempts_name_held_by_hand_is_never_joined():
    """The pass that ends attempt 0 creates attempt 1's group: a 409 passed for the job's own
    group and attempt 1's pods joined the foreign one."""
    ctrl, api = controller(native=True)
    sync(ctrl)
    api.run_pods("node-0")
    sync(ctrl)
    path = api.pod_group_path("ns", "train-a1")
    api.objects[path] = foreign_pod_group("train-a1")
    api.nodes.pop("node-0")
    ctrl.on_node_event("DELETED", make_node("node-0"))
    sync(ctrl)
    status = api.job()["status"]
    assert status["attempt"] == 1 and not status.get("gangCreated") and not api.pods()
    sync(ctrl)
    blocked = {c["type"]: c for c in api.job()["status"]["conditions"]}["Blocked"]
    assert blocked["reason"] == "NameConflict" and "PodGroup train-a1" in blocked["message"]
    assert api.objects[path]["metadata"]["uid"] == "foreign-train-a1" and not api.pods()


def scheduled(pod: dict, status: str, at: str, *, node: str | None = None) -> None:
    """Give ``pod`` the scheduler's PodScheduled condition (and a node when bound)."""
    condition = {"type": "PodScheduled", "status": status, "lastTransitionTime": at}
    if status == "False":
        condition["reason"] = "Unschedulable"
        condition["message"] = "0/3 nodes are available: 3 Insufficient cpu."
    pod["spec"]["nodeName"] = node
    pod["status"]["conditions"] = [condition]


def pods_scheduled_message(bound_at: str, refused_at: str, bound: int = 2) -> str:
    """A 3-rank PodGroup gang with its first ``bound`` ranks bound at ``bound_at`` and the
    others refused at ``refused_at``: the PodsScheduled message."""
    cluster = FakeCluster.start(replicas=3)
    cluster.native_gang = True
    cluster.step()
    assert cluster.status["gangScheduling"] == "PodGroup"
    for rank in range(3):
        if rank < bound:
            scheduled(cluster.pod(rank), "True", bound_at, node=f"node-{rank}")
        else:
            scheduled(cluster.pod(rank), "False", refused_at)
    cluster.step(1)
    condition = next(c for c in cluster.status["conditions"] if c["type"] == "PodsScheduled")
    assert condition["status"] == "False" and condition["reason"] == "Unschedulable"
    return condition["message"]


def test_ranks_bound_by_a_scheduler_that_ignores_the_pod_group_are_reported():
    """A cluster serving the PodGroup API with the scheduler's GangScheduling gate off binds the
    ranks one by one: the message said the PodGroup binds no pod until all fit while 2 of 3 were
    bound."""
    message = pods_scheduled_message("2030-01-01T12:00:00Z", "2030-01-01T12:00:00Z")
    assert message.startswith("1 of 3 ranks cannot be scheduled and 2 are bound"), message
    assert "does not enforce the PodGroup" in message and "GangScheduling" in message
    assert "binds no pod until" not in message
    one = pods_scheduled_message("2030-01-01T12:00:00Z", "2030-01-01T12:00:00Z", bound=1)
    assert one.startswith("2 of 3 ranks cannot be scheduled and 1 is bound although"), one


def test_ranks_bound_after_the_refusal_are_the_gang_binding_now():
    """An enforcing scheduler binds the gang after the refusals it made while room lacked: a
    pass between two of its bindings says nothing of non-enforcement."""
    message = pods_scheduled_message("2030-01-01T12:00:07Z", "2030-01-01T12:00:00Z")
    assert "binds no pod until all 3 fit" in message and "does not enforce" not in message


def test_a_cluster_that_refuses_whole_gang_preemption_gets_the_group_without_it():
    """An API server that validates the PodGroup strictly without WorkloadAwarePreemption
    refuses ``disruptionMode``: the group is created without it, and later ones too."""
    ctrl, api = controller(native=True)
    refusal = "PodGroup.scheduling.k8s.io is invalid: spec.disruptionMode: Forbidden: disabled"
    api.fail_kind_once["PodGroup"] = ApiError(
        422, {"reason": "Invalid", "message": refusal}, "POST", ""
    )
    sync(ctrl)
    group = api.objects[api.pod_group_path("ns", "train-a0")]
    assert "disruptionMode" not in group["spec"]
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 3}}
    assert len(api.pods()) == 3
    assert ctrl.executor.pod_groups.whole_gang_preemption is False
