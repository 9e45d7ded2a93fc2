"""Support objects (trainer identity, Service) are reconciled level-triggered on every pass, in
dependency order, before any pod; foreign objects are never written; every write that changes the
next decision is followed by a new decision."""

from __future__ import annotations

import asyncio

import pytest

from rtj_operator.act import job_reads
from rtj_operator.act.kube import ApiError, KubeApi
from rtj_operator.decide import support

from .fakes import FakeCluster, make_job, make_node, make_pod
from .test_controller import controller_with_job, sync

ROLE_PATH = KubeApi.rbac_path("ns", "roles", "train-trainer")
BINDING_PATH = KubeApi.rbac_path("ns", "rolebindings", "train-trainer")


def _refused_binding() -> ApiError:
    # What the API server answers while its authorizer has not seen the new Role yet.
    return ApiError(
        404, {"reason": "NotFound", "message": 'rolebindings "train-trainer" not found'}, "POST", ""
    )


def test_a_refused_rolebinding_creates_no_pod_and_the_retry_creates_it_first():
    ctrl, api = controller_with_job()
    api.fail_kind_once["RoleBinding"] = _refused_binding()
    with pytest.raises(ApiError):
        sync(ctrl)
    assert ROLE_PATH in api.objects and BINDING_PATH not in api.objects
    assert not api.pods()  # no rank runs without its identity
    sync(ctrl)
    assert BINDING_PATH in api.objects
    assert sorted(api.pods()) == ["train-a0-r0", "train-a0-r1"]
    creates = [c for c in api.calls if c.startswith("create")]
    assert creates.index("create RoleBinding") < creates.index("create Pod")


def test_the_retry_after_every_pod_exists_still_creates_the_missing_binding():
    """The original defect: pods created, binding refused, and the retry found nothing to do."""
    cluster = FakeCluster.start(replicas=2)
    plan = cluster.step()
    assert plan.creations
    del cluster.support["RoleBinding"]  # as if its creation had failed
    cluster.body["status"]["gangCreated"] = False  # and the operator died before the mark
    plan = cluster.step()
    assert not plan.creations
    assert [w.kind for w in plan.support] == ["RoleBinding"]
    assert cluster.status["gangCreated"]


def test_a_deleted_binding_is_recreated_while_the_gang_runs():
    cluster = FakeCluster.start(replicas=2)
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    assert cluster.status["phase"] == "Running"
    del cluster.support["RoleBinding"]
    plan = cluster.step(1)
    assert [w.kind for w in plan.support] == ["RoleBinding"]
    assert plan.status is None  # nothing else changes
    assert not cluster.step(1).support


def test_the_role_follows_the_attempt_before_the_new_pods_exist():
    cluster = FakeCluster.start(replicas=2)
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    del cluster.nodes["node-0"]
    plan = cluster.step(1)
    (update,) = plan.support
    assert update.kind == "Role" and update.update
    names = update.body["rules"][0]["resourceNames"]
    assert {p["metadata"]["name"] for p in plan.creations} <= set(names)


def test_the_service_follows_a_changed_master_port_before_the_new_pods_exist():
    """spec.masterPort is mutable and the next attempt's ranks rendezvous on the new port; the
    Service kept the port it was created with."""
    cluster = FakeCluster.start(replicas=2)
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    cluster.body["spec"]["masterPort"] = 23456
    del cluster.nodes["node-0"]
    plan = cluster.step(1)
    (update,) = [w for w in plan.support if w.kind == "Service"]
    assert update.update and update.patch == {
        "spec": {
            "ports": [{"name": "rendezvous", "port": 23456, "targetPort": 23456, "protocol": "TCP"}]
        }
    }
    env = {e["name"]: e.get("value") for e in plan.creations[0]["spec"]["containers"][0]["env"]}
    assert env["MASTER_PORT"] == "23456"
    assert not [w for w in cluster.step(1).support if w.kind == "Service"]


def test_no_trainer_identity_when_the_template_names_an_account():
    template = {
        "spec": {"serviceAccountName": "mine", "containers": [{"name": "trainer", "image": "i"}]}
    }
    cluster = FakeCluster.start(replicas=1, template=template)
    plan = cluster.step()
    assert [w.kind for w in plan.support] == ["Service"]


def foreign(kind: str) -> dict:
    return {"kind": kind, "metadata": {"name": "train-trainer", "namespace": "ns"}, "rules": []}


def test_a_foreign_role_is_never_written_and_blocks_the_job_with_a_condition():
    cluster = FakeCluster.start(replicas=2)
    cluster.support["Role"] = foreign("Role")
    plan = cluster.step()
    assert not plan.creations and not cluster.pods
    assert plan.support == []  # no binding is ever made to someone else's Role
    assert cluster.support["Role"]["rules"] == []  # untouched
    blocked = {c["type"]: c for c in cluster.status["conditions"]}["Blocked"]
    assert blocked["status"] == "True" and blocked["reason"] == "NameConflict"
    assert "Role train-trainer already exists in namespace" in blocked["message"]
    assert "and is not controlled by this job" in blocked["message"]
    assert "serviceAccountName" in blocked["message"]
    assert plan.requeue_after is not None
    assert [e.reason for e in plan.events] == ["NameConflict"]
    assert cluster.step(5).events == []  # said once

    del cluster.support["Role"]  # the user removes it
    plan = cluster.step(5)
    assert plan.creations
    blocked = {c["type"]: c for c in cluster.status["conditions"]}["Blocked"]
    assert blocked["status"] == "False"


def test_an_object_of_an_earlier_job_of_the_same_name_is_foreign():
    job = make_job()
    stale = support.desired(job, 0)["Service"]
    stale["metadata"]["ownerReferences"][0]["uid"] = "uid-of-a-deleted-job"
    decision = support.decide(job, 0, {"Service": stale})
    assert decision.conflicts == ["Service train"] and not decision.ready


def test_a_pod_name_held_by_a_deleted_job_of_the_same_name_blocks_instead_of_a_preemption():
    """A job re-created while the pods of its deleted namesake still terminate: their names are
    the new attempt's. Creating over them answers 409, which passed for the job's own pods, so
    the new job counted a preemption that never happened and jumped to attempt 1 (possibly
    beside a gang orphaned by ``--cascade=orphan`` writing the same run)."""
    cluster = FakeCluster.start(replicas=2)
    old = make_pod(rank=0, uid="uid-of-a-deleted-job", deleting=True)
    cluster.pods[old["metadata"]["name"]] = old
    plan = cluster.step()
    assert not plan.creations
    st = cluster.status
    assert st["attempt"] == 0 and st["preemptions"] == 0 and not st.get("gangCreated")
    assert st["phase"] == "Pending" and not st.get("interruptions")
    blocked = {c["type"]: c for c in st["conditions"]}["Blocked"]
    assert blocked["status"] == "True" and blocked["reason"] == "NameConflict"
    assert "Pod train-a0-r0" in blocked["message"]
    assert "serviceAccountName" not in blocked["message"]
    assert [e.reason for e in plan.events] == ["NameConflict"]
    assert "train-a0-r0" not in {d.name for d in plan.deletions}  # never touched

    del cluster.pods["train-a0-r0"]  # its grace period ended
    plan = cluster.step(5)
    assert [p["metadata"]["name"] for p in plan.creations] == ["train-a0-r0", "train-a0-r1"]
    st = cluster.status
    assert st["attempt"] == 0 and st["preemptions"] == 0 and st["gangCreated"]
    assert {c["type"]: c for c in st["conditions"]}["Blocked"]["status"] == "False"


def test_the_conflict_message_agrees_with_the_number_of_objects():
    cluster = FakeCluster.start(replicas=2)
    for rank in (0, 1):
        old = make_pod(rank=rank, uid="uid-of-a-deleted-job", deleting=True)
        cluster.pods[old["metadata"]["name"]] = old
    cluster.step()
    blocked = {c["type"]: c for c in cluster.status["conditions"]}["Blocked"]
    assert "Pod train-a0-r0, Pod train-a0-r1 already exist in namespace" in blocked["message"]
    assert "and are not controlled by this job" in blocked["message"]


def test_marking_the_gang_created_is_followed_by_a_new_decision():
    """A restart mid-creation: every pod exists and runs; the pass that only marks the gang
    created asks to run again at once, and that pass sets Running (no periodic resync)."""
    ctrl, api = controller_with_job()
    for rank in range(2):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"train-a0-r{rank}",
                "namespace": "ns",
                "labels": {
                    "resumable.dev/job-name": "train",
                    "resumable.dev/attempt": "0",
                    "resumable.dev/rank": str(rank),
                },
                "ownerReferences": [{"uid": "uid-1234", "controller": True}],
            },
            "spec": {"containers": [{"name": "trainer"}]},
        }
        asyncio.run(api.create(KubeApi.core_path("ns", "pods"), pod))
    api.run_pods("node-0")
    api.nodes["node-0"] = make_node("node-0")
    assert sync(ctrl) == 0.0
    assert api.job()["status"]["gangCreated"]
    assert api.job()["status"]["phase"] == "Pending"
    sync(ctrl)
    assert api.job()["status"]["phase"] == "Running"


def test_unschedulable_ranks_surface_the_schedulers_reason():
    cluster = FakeCluster.start(replicas=2)
    cluster.step()
    for pod in cluster.pods.values():
        pod["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
            }
        ]
    cluster.step(1)
    sched = {c["type"]: c for c in cluster.status["conditions"]}["PodsScheduled"]
    assert sched["status"] == "False" and sched["reason"] == "Unschedulable"
    assert "2 of 2 ranks" in sched["message"] and "Insufficient nvidia.com/gpu" in sched["message"]
    cluster.schedule_and_run()
    cluster.step(1)
    conds = {c["type"]: c for c in cluster.status["conditions"]}
    assert conds["PodsScheduled"]["status"] == "True"
    assert cluster.status["phase"] == "Running"


def test_events_of_a_recorded_decision_are_posted_even_when_a_support_write_fails():
    ctrl, api = controller_with_job()
    sync(ctrl)
    api.run_pods("node-0")
    sync(ctrl)
    api.events.clear()
    api.nodes.pop("node-0")
    ctrl.on_node_event("DELETED", make_node("node-0"))
    api.fail_kind_once["Role"] = ApiError(500, {"message": "etcd hiccup"}, "PATCH", "roles")
    with pytest.raises(ApiError):
        sync(ctrl)  # the preemption is recorded, the Role update for attempt 1 fails
    assert api.job()["status"]["attempt"] == 1 and not api.pods().keys() & {"train-a1-r0"}
    reasons = [e[1] for e in api.events]
    assert "Preempted" in reasons and "Resubmitted" not in reasons
    sync(ctrl)
    reasons = [e[1] for e in api.events]
    assert reasons.count("Preempted") == 1 and reasons.count("Resubmitted") == 1


def test_suspending_settles_the_conditions_of_a_gang_that_no_longer_exists():
    """After a suspend, `kubectl describe` said "2 of 2 ranks cannot be scheduled" and
    "node ... is about to go" about pods that were deleted."""
    cluster = FakeCluster.start(replicas=2)
    cluster.step()
    cluster.pods["train-a0-r1"]["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no"}
    ]
    cluster.pods["train-a0-r0"]["spec"]["nodeName"] = "node-0"
    cluster.pods["train-a0-r0"]["status"]["phase"] = "Running"
    cluster.nodes["node-0"] = make_node(
        "node-0", taints=[{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]
    )
    cluster.step(1)
    conds = {c["type"]: c for c in cluster.status["conditions"]}
    assert conds["PodsScheduled"]["status"] == "False"
    assert conds["PreemptionNotice"]["status"] == "True"
    cluster.body["spec"]["suspend"] = True
    cluster.step(1)
    conds = {c["type"]: c for c in cluster.status["conditions"]}
    assert cluster.status["phase"] == "Suspended"
    assert "PodsScheduled" not in conds
    assert conds["PreemptionNotice"]["status"] == "False"
    assert conds["PreemptionNotice"]["reason"] == "Suspended"
    assert conds["Suspended"]["status"] == "True"


def test_a_backoff_does_not_report_the_ended_attempts_ranks_as_unschedulable():
    """Rank 0 ran and failed while rank 1 waited for a node: during the backoff that follows,
    the job said "1 of 2 ranks cannot be scheduled ... rank 1 (train-a0-r1)" about a pod that
    was deleted, and after a gang that had bound, "every rank of attempt 0 is bound"."""
    cluster = FakeCluster.start(replicas=2, resumePolicy={"backoffBaseSeconds": 60})
    cluster.step()
    cluster.pods["train-a0-r0"]["spec"]["nodeName"] = "node-0"
    cluster.pods["train-a0-r0"]["status"]["phase"] = "Running"
    cluster.pods["train-a0-r1"]["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no"}
    ]
    cluster.step(1)
    assert {c["type"]: c for c in cluster.status["conditions"]}["PodsScheduled"]["status"] == (
        "False"
    )
    cluster.terminate(0, 1)
    cluster.step(1)
    st = cluster.status
    assert st["phase"] == "Restarting" and st["attempt"] == 1 and st["restartAfter"]
    assert "PodsScheduled" not in {c["type"] for c in st["conditions"]}

    cluster.step(60)  # attempt 1 is created, binds and runs; its rank 0 fails too
    cluster.schedule_and_run()
    cluster.step(1)
    assert cluster.status["phase"] == "Running"
    cluster.terminate(0, 1)
    cluster.step(1)
    assert cluster.status["phase"] == "Restarting"
    assert "PodsScheduled" not in {c["type"] for c in cluster.status["conditions"]}


ACCOUNT_PATH = KubeApi.core_path("ns", "serviceaccounts", "train-trainer")


def support_reads(api) -> int:
    return sum(1 for p in api.read_paths if "/serviceaccounts/" in p)


def counting_controller():
    """A controller with a job, whose API records the path of every object read by path."""
    ctrl, api = controller_with_job()
    api.read_paths = []
    real_get = api.get_object

    async def counted(path):
        api.read_paths.append(path)
        return await real_get(path)

    api.get_object = counted
    return ctrl, api


def test_a_clean_read_of_the_support_objects_stands_in_until_it_is_old_or_a_pass_writes(
    monkeypatch,
):
    """While a gang runs, its pods' events wake the job again and again; the four support GETs
    of each pass were most of the operator's requests in a mass reclaim. A read that found every
    object, each the job's own, is reused for ``SUPPORT_RECHECK_S``; a pass that writes one, or
    fails, reads again."""
    ctrl, api = counting_controller()
    clock = [1000.0]
    monkeypatch.setattr(job_reads.time, "monotonic", lambda: clock[0])
    sync(ctrl)  # creates the support objects and the gang: nothing kept (it wrote them)
    assert support_reads(api) == 1 and sorted(api.pods()) == ["train-a0-r0", "train-a0-r1"]
    sync(ctrl)  # reads them back, all the job's own: kept
    sync(ctrl)
    sync(ctrl)
    assert support_reads(api) == 2
    # Deleted by hand while the gang runs: seen once the kept read is old.
    del api.objects[ACCOUNT_PATH]
    sync(ctrl)
    assert ACCOUNT_PATH not in api.objects and support_reads(api) == 2
    clock[0] += job_reads.SUPPORT_RECHECK_S
    sync(ctrl)
    assert support_reads(api) == 3 and ACCOUNT_PATH in api.objects  # made again
    sync(ctrl)  # that pass wrote: this one reads again, and keeps it
    sync(ctrl)
    assert support_reads(api) == 4
    # A pass that fails reads again: its failure may be what a missing object caused.
    api.run_pods()  # the next pass writes the phase Running, and no support object
    real_patch = api.patch_job_status

    async def refused(*args, **kwargs):
        api.patch_job_status = real_patch
        raise ApiError(500, {"message": "etcd timeout"}, "PATCH", "status")

    api.patch_job_status = refused
    with pytest.raises(ApiError):
        sync(ctrl)
    assert support_reads(api) == 4
    sync(ctrl)
    assert support_reads(api) == 5 and api.job()["status"]["phase"] == "Running"


def test_a_kept_read_takes_in_the_roles_update_of_a_resubmission(monkeypatch):
    """Each attempt moves the Role's pod names (one PATCH): the kept read takes in what was
    written, so the passes after a resubmission neither read the support objects again nor
    write the Role a second time."""
    ctrl, api = counting_controller()
    monkeypatch.setattr(job_reads.time, "monotonic", lambda: 1000.0)
    sync(ctrl)
    sync(ctrl)  # read back, kept
    api.run_pods()
    sync(ctrl)
    assert support_reads(api) == 2 and api.job()["status"]["phase"] == "Running"
    del api.nodes["node-0"]  # the gang's node is gone: attempt 1
    api.nodes["node-1"] = make_node("node-1")
    api.calls.clear()
    sync(ctrl)
    assert api.calls.count("merge_patch") == 1 and api.job()["status"]["attempt"] == 1
    role = api.objects[ROLE_PATH]["rules"][0]["resourceNames"]
    assert "train-a1-r0" in role
    sync(ctrl)
    sync(ctrl)
    assert support_reads(api) == 2  # none since the resubmission
    assert api.calls.count("merge_patch") == 1  # the Role is not written again


def test_a_refused_decision_deletes_and_creates_no_pod_though_its_preparations_went_beside_it():
    """The support objects (and the attempt's group) are written beside the status, not after
    it. When the status write is refused, no pod is deleted or created, and the next pass
    decides again from fresh reads and creates the gang."""
    ctrl, api = controller_with_job()
    sync(ctrl)
    api.run_pods()
    sync(ctrl)
    before = {n: p["metadata"]["uid"] for n, p in api.pods().items()}
    del api.nodes["node-0"]  # the gang's node is gone: the next pass decides attempt 1
    api.nodes["node-1"] = make_node("node-1")
    real_patch = api.patch_job_status

    async def refused(*args, **kwargs):
        api.patch_job_status = real_patch
        raise ApiError(409, {"reason": "Conflict"}, "PATCH", "status")

    api.patch_job_status = refused
    api.calls.clear()
    assert sync(ctrl) == 0.0  # decide again at once
    assert {n: p["metadata"]["uid"] for n, p in api.pods().items()} == before
    assert not {"delete_pod", "create Pod"} & set(api.calls)
    assert api.job()["status"]["attempt"] == 0
    sync(ctrl)
    assert api.job()["status"]["attempt"] == 1 and api.job()["status"]["gangCreated"]
    assert {"train-a1-r0", "train-a1-r1"} <= set(api.pods())
    role = api.objects[ROLE_PATH]["rules"][0]["resourceNames"]
    assert "train-a1-r0" in role
