"""Elastic sizing under Kueue quota: how many pods a ClusterQueue's free quota holds, the job's
own gangs counted as free, and the controller reading the queue behind ``spec.queueName``."""

from __future__ import annotations

from typing import Any

from rtj_operator.act import kueue_reads
from rtj_operator.act.kube import ApiError
from rtj_operator.decide import gang, kueue_quota

from .fake_api import FakeApi
from .fakes import make_node, make_pod
from .test_gang import sync

CPU = {"cpu": 1.0}


def queue(
    quota: dict[str, str],
    reserved: dict[str, str] | None = None,
    *,
    flavor: str = "default-flavor",
    cohort: str = "",
    borrowing: dict[str, str] | None = None,
    status_key: str = "flavorsReservation",
) -> dict[str, Any]:
    """A ClusterQueue of one resource group and one flavor, with what is reserved in it."""
    resources = []
    for name, nominal in quota.items():
        entry: dict[str, Any] = {"name": name, "nominalQuota": nominal}
        if borrowing and name in borrowing:
            entry["borrowingLimit"] = borrowing[name]
        resources.append(entry)
    spec: dict[str, Any] = {
        "resourceGroups": [
            {"coveredResources": list(quota), "flavors": [{"name": flavor, "resources": resources}]}
        ]
    }
    if cohort:
        spec["cohortName"] = cohort
    status = {
        status_key: [
            {
                "name": flavor,
                "resources": [{"name": k, "total": v} for k, v in (reserved or {}).items()],
            }
        ]
    }
    return {"spec": spec, "status": status}


def test_free_quota_divided_by_the_pods_requests():
    assert kueue_quota.pods_that_fit(queue({"cpu": "2"}), CPU) == 2
    assert kueue_quota.pods_that_fit(queue({"cpu": "2"}, {"cpu": "1"}), CPU) == 1
    assert kueue_quota.pods_that_fit(queue({"cpu": "2"}, {"cpu": "2"}), CPU) == 0
    assert kueue_quota.pods_that_fit(queue({"cpu": "2500m"}), {"cpu": 0.5}) == 5
    # Usage when there is no reservation figure (older Kueue status).
    assert (
        kueue_quota.pods_that_fit(queue({"cpu": "3"}, {"cpu": "1"}, status_key="flavorsUsage"), CPU)
        == 2
    )


def test_the_scarcest_resource_sets_the_count():
    cq = queue({"cpu": "8", "memory": "4Gi"}, {"memory": "1Gi"})
    assert kueue_quota.pods_that_fit(cq, {"cpu": 1.0, "memory": 2**30}) == 3


def test_the_jobs_own_gang_counts_as_free():
    """A gang of 2 admitted in a queue of 3 may grow to 3: its own quota comes back to it."""
    assert kueue_quota.pods_that_fit(queue({"cpu": "3"}, {"cpu": "2"}), CPU, own_pods=2) == 3
    # Someone else's reservation beyond the nominal quota (borrowing) leaves nothing free.
    assert kueue_quota.pods_that_fit(queue({"cpu": "2"}, {"cpu": "4"}), CPU, own_pods=1) == 1


def test_a_pods_quota_counts_one_per_pod():
    cq = queue({"cpu": "10", "pods": "2"})
    assert kueue_quota.pods_that_fit(cq, CPU) == 2
    assert kueue_quota.pods_that_fit(cq, {}) == 2


def test_no_bound_without_requests_or_for_a_resource_the_queue_does_not_cover():
    assert kueue_quota.pods_that_fit(queue({"cpu": "2"}), {}) is None
    assert kueue_quota.pods_that_fit(queue({"cpu": "2"}), {"cpu": 1.0, "nvidia.com/gpu": 1}) is None


def test_in_a_cohort_the_borrowing_limit_adds_and_no_limit_means_no_bound():
    cq = queue({"cpu": "1"}, cohort="team", borrowing={"cpu": "2"})
    assert kueue_quota.pods_that_fit(cq, CPU) == 3
    assert kueue_quota.pods_that_fit(queue({"cpu": "0"}, cohort="team"), CPU) is None


def test_the_best_flavor_of_a_group_holds_the_gang():
    cq = queue({"cpu": "1"})
    cq["spec"]["resourceGroups"][0]["flavors"].append(
        {"name": "big", "resources": [{"name": "cpu", "nominalQuota": "4"}]}
    )
    cq["status"]["flavorsReservation"].append(
        {"name": "big", "resources": [{"name": "cpu", "total": "1"}]}
    )
    assert kueue_quota.pods_that_fit(cq, CPU) == 3


def kueue_pod(group: str, total: int, *, gated: bool = False, phase: str = "Running"):
    pod = make_pod(phase=phase)
    pod["metadata"].setdefault("labels", {})[gang.KUEUE_GROUP_LABEL] = group
    pod["metadata"].setdefault("annotations", {})[gang.KUEUE_TOTAL_ANNOTATION] = str(total)
    if gated:
        pod["spec"]["schedulingGates"] = [{"name": kueue_quota.ADMISSION_GATE}]
    return pod


def test_own_pods_are_the_admitted_groups_with_a_live_pod():
    pods = [
        kueue_pod("j-a0", 2),
        kueue_pod("j-a0", 2),  # one group, counted once at its total
        kueue_pod("j-a1", 3, gated=True),  # not admitted: holds no quota
        kueue_pod("j-a2", 4, phase="Succeeded"),
        make_pod(),  # not a Kueue pod
    ]
    assert kueue_quota.own_pods(pods) == 2
    assert kueue_quota.own_pods([]) == 0


def test_room_is_none_without_a_cluster_queue():
    spec = {"containers": [{"name": "t", "resources": {"requests": {"cpu": "1"}}}]}
    assert kueue_quota.room(None, spec, []) is None
    assert kueue_quota.room(queue({"cpu": "2"}), spec, []) == 2


# -- the controller ----------------------------------------------------------------------------

TEMPLATE = {
    "spec": {"containers": [{"name": "trainer", "image": "img", "resources": {"requests": CPU}}]}
}


def elastic_controller(cq: dict[str, Any] | None, **spec: Any):
    from rtj_operator.act.controller import Controller

    from .fakes import job_body

    api = FakeApi()
    api.serves_pod_group_api = True
    api.serves_kueue_api = True
    body = job_body(
        replicas=3,
        queueName="team",
        elastic={"minReplicas": 2, "shrinkAfterSeconds": 0},
        **spec,
    )
    body["spec"]["template"] = TEMPLATE
    api.put_job(body)
    ctrl = Controller(api, resync_seconds=0)  # type: ignore[arg-type]
    for i in range(4):
        node = make_node(f"node-{i}")
        node["status"]["allocatable"] = {"cpu": "8", "pods": "110"}
        api.nodes[f"node-{i}"] = node
        ctrl.on_node_event("ADDED", node)
    api.objects[kueue_reads.local_queue_path("ns", "team")] = {"spec": {"clusterQueue": "cq"}}
    if cq is not None:
        api.objects[kueue_reads.cluster_queue_path("cq")] = cq
    return ctrl, api


def start(ctrl) -> None:
    """Two passes: the support objects, then the gang."""
    sync(ctrl)
    sync(ctrl)


def test_an_elastic_job_starts_at_what_its_queues_quota_holds():
    ctrl, api = elastic_controller(queue({"cpu": "2"}))
    start(ctrl)
    status = api.job()["status"]
    assert status["gangSize"] == 2, status
    assert len(api.pods()) == 2


def test_the_full_gang_when_the_quota_holds_it():
    ctrl, api = elastic_controller(queue({"cpu": "3"}))
    start(ctrl)
    assert api.job()["status"]["gangSize"] == 3


def test_below_min_replicas_of_quota_the_job_waits():
    ctrl, api = elastic_controller(queue({"cpu": "1"}))
    start(ctrl)
    status = api.job()["status"]
    assert not api.pods() and status["phase"] == "Pending", status
    capacity = next(c for c in status["conditions"] if c["type"] == "CapacityAvailable")
    assert capacity["reason"] == "MinReplicasUnreachable", capacity


def test_without_the_queue_objects_node_room_alone_decides():
    ctrl, api = elastic_controller(None)
    start(ctrl)
    assert api.job()["status"]["gangSize"] == 3


def test_without_permission_to_read_queues_node_room_alone_decides(caplog):
    ctrl, api = elastic_controller(queue({"cpu": "2"}))
    real = api.get_object

    async def forbidden(path: str):
        if "/localqueues/" in path:
            raise ApiError(403, {"reason": "Forbidden", "message": "no"}, "GET", path)
        return await real(path)

    api.get_object = forbidden  # type: ignore[method-assign]
    kueue_reads._queues_forbidden_said = False
    start(ctrl)
    assert api.job()["status"]["gangSize"] == 3
    assert "cannot read Kueue LocalQueues or ClusterQueues" in caplog.text


def test_a_fixed_size_job_does_not_read_the_queue():
    ctrl, api = elastic_controller(queue({"cpu": "2"}))
    api.job()["spec"].pop("elastic")
    start(ctrl)
    assert len(api.pods()) == 3
