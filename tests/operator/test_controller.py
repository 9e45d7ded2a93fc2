"""The side-effect layer against an in-memory API: ordering, CAS, routing, queue semantics."""

from __future__ import annotations

import asyncio
import time

import pytest

from rtj_operator.act import metrics
from rtj_operator.act.controller import Controller
from rtj_operator.act.executor import merge_patch
from rtj_operator.act.kube import ApiError, KubeApi
from rtj_operator.act.workqueue import WorkQueue
from rtj_operator.api import names
from tests.cluster import crashing_operator
from tests.cluster.crashing_operator import crashing_create, resubmitted_pod

from .fake_api import FakeApi
from .fakes import job_body, make_node

KEY = ("ns", "train")


def controller_with_job(**spec) -> tuple[Controller, FakeApi]:
    api = FakeApi()
    api.put_job(job_body(replicas=2, **spec))
    api.nodes["node-0"] = make_node("node-0")
    return Controller(api, resync_seconds=0), api  # type: ignore[arg-type]


def sync(ctrl: Controller) -> float | None:
    async def run():
        result = await ctrl.sync(KEY, time.monotonic())
        await asyncio.gather(*ctrl.executor.events.tasks)
        return result

    return asyncio.run(run())


def test_merge_patch_nulls_removed_keys_and_recurses():
    old = {"a": 1, "b": {"x": 1, "y": 2}, "c": [1], "gone": True}
    new = {"a": 1, "b": {"x": 1, "y": 3}, "c": [1, 2]}
    assert merge_patch(old, new) == {"gone": None, "b": {"y": 3}, "c": [1, 2]}
    assert merge_patch(new, new) == {}


def test_first_sync_creates_identity_service_and_pods_then_marks_the_gang():
    ctrl, api = controller_with_job()
    sync(ctrl)
    assert sorted(api.pods()) == ["train-a0-r0", "train-a0-r1"]
    kinds = [c for c in api.calls if c.startswith("create")]
    assert kinds[0] == "create ServiceAccount"  # before any pod: admission needs it
    assert {"create Service", "create RoleBinding", "create Pod"} <= set(kinds)
    status = api.job()["status"]
    assert status["gangCreated"] and status["attempt"] == 0
    assert [e[:2] for e in api.events] == [("Normal", "Started")]


def test_preemption_end_to_end_through_the_controller():
    ctrl, api = controller_with_job()
    sync(ctrl)
    api.run_pods("node-0")
    sync(ctrl)
    assert api.job()["status"]["phase"] == "Running"
    api.nodes.pop("node-0")
    ctrl.on_node_event("DELETED", make_node("node-0"))
    before = metrics.RESUBMISSION_LATENCY._sum.get()
    sync(ctrl)
    assert sorted(api.pods()) == ["train-a1-r0", "train-a1-r1"]
    status = api.job()["status"]
    assert status["attempt"] == 1 and status["preemptions"] == 1 and status["gangCreated"]
    assert metrics.RESUBMISSION_LATENCY._sum.get() > before
    # A second sync is a no-op: no duplicate gang.
    sync(ctrl)
    assert sorted(api.pods()) == ["train-a1-r0", "train-a1-r1"]


def test_stale_read_is_refused_and_retried_immediately():
    ctrl, api = controller_with_job()
    real_get = api.get_job

    async def stale_get(namespace, name):
        body = await real_get(namespace, name)
        body["metadata"]["resourceVersion"] = "stale"
        return body

    api.get_job = stale_get  # type: ignore[method-assign]
    assert sync(ctrl) == 0.0
    assert not api.pods()  # nothing acted on a decision that was not recorded


def test_pods_refused_by_admission_block_the_job_with_the_reason_until_they_are_created():
    """A 403 on pod creation (here a missing ServiceAccount) is fixed outside the job: the job
    says so in Blocked and one event, and the pass is retried until the pods are created."""
    ctrl, api = controller_with_job()
    refusal = 'pods "train-a0-r0" is forbidden: serviceaccount "mysa" not found'
    api.fail_creates_with = ApiError(403, {"reason": "Forbidden", "message": refusal}, "POST", "")
    for _ in range(2):
        with pytest.raises(ApiError):
            sync(ctrl)
        status = api.job()["status"]
        blocked = {c["type"]: c for c in status["conditions"]}["Blocked"]
        assert (blocked["status"], blocked["reason"]) == ("True", "PodCreationRefused")
        assert refusal in blocked["message"] and "attempt 0" in blocked["message"]
        assert not status.get("gangCreated") and status["phase"] != "Failed"
    assert [e[:2] for e in api.events] == [("Warning", "PodCreationRefused")]  # once
    api.fail_creates_with = None
    sync(ctrl)
    status = api.job()["status"]
    blocked = {c["type"]: c for c in status["conditions"]}["Blocked"]
    assert (blocked["status"], blocked["reason"]) == ("False", "PodsCreated")
    assert status["gangCreated"] and sorted(api.pods()) == ["train-a0-r0", "train-a0-r1"]


def test_invalid_pod_template_fails_the_job_with_the_servers_message():
    ctrl, api = controller_with_job()
    api.fail_creates_with = ApiError(
        422,
        {"reason": "Invalid", "message": "spec.containers[0].image: Required value"},
        "POST",
        "pods",
    )
    sync(ctrl)
    status = api.job()["status"]
    assert status["phase"] == "Failed"
    failed = {c["type"]: c for c in status["conditions"]}["Failed"]
    assert failed["reason"] == "InvalidPodTemplate" and "image" in failed["message"]


def test_routing_kicks_only_the_jobs_on_a_changed_node():
    ctrl, _ = controller_with_job()
    ctrl.queue.kick(KEY)  # kopf reported the job
    kicked: list = []
    ctrl.queue.kick = lambda key, delay=0.0: kicked.append(key)  # type: ignore[method-assign]
    pod = {
        "metadata": {
            "name": "train-a0-r0",
            "namespace": "ns",
            "labels": {"resumable.dev/job-name": "train"},
        },
        "spec": {"nodeName": "node-0"},
    }
    ctrl.on_pod_event("ADDED", pod)
    kicked.clear()
    ctrl.on_node_event(None, make_node("node-0"))
    assert kicked == [KEY]  # first sight of the node
    kicked.clear()
    heartbeat = make_node("node-0")
    heartbeat["status"]["conditions"][0]["lastHeartbeatTime"] = "later"
    ctrl.on_node_event("MODIFIED", heartbeat)
    assert kicked == []  # heartbeats change nothing
    ctrl.on_node_event("MODIFIED", make_node("node-0", taints=[{"key": "k"}]))
    assert kicked == [KEY]
    ctrl.on_node_event("MODIFIED", make_node("node-9", taints=[{"key": "k"}]))
    assert kicked == [KEY]  # no rank there
    ctrl.on_pod_event("DELETED", pod)
    kicked.clear()
    ctrl.on_node_event("DELETED", make_node("node-0"))
    assert kicked == []


def test_echo_of_the_operators_own_status_write_is_not_a_kick():
    ctrl, api = controller_with_job()
    sync(ctrl)
    kicked: list = []
    ctrl.queue.kick = lambda key, delay=0.0: kicked.append(key)  # type: ignore[method-assign]
    ctrl.on_job_event("MODIFIED", api.job())
    assert kicked == []
    ctrl.on_job_event(
        "MODIFIED", {**api.job(), "metadata": {**api.job()["metadata"], "resourceVersion": "999"}}
    )
    assert kicked == [KEY]


def test_workqueue_serialises_a_key_and_coalesces_kicks():
    async def scenario():
        running = 0
        peak = 0
        runs = []

        async def worker(key, first_kick):
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            runs.append(key)
            await asyncio.sleep(0.02)
            running -= 1

        queue = WorkQueue(worker, concurrency=4)
        queue.start()
        queue.kick(KEY)
        await asyncio.sleep(0.005)
        for _ in range(10):
            queue.kick(KEY)  # while running: exactly one more run
        await asyncio.sleep(0.1)
        await queue.stop()
        return peak, runs

    peak, runs = asyncio.run(scenario())
    assert peak == 1 and len(runs) == 2


def test_workqueue_delays_requeues_and_retries_failures():
    async def scenario():
        times = []

        async def worker(key, first_kick):
            times.append(time.monotonic())
            if len(times) == 1:
                raise RuntimeError("boom")
            if len(times) == 2:
                return 0.05
            return None

        queue = WorkQueue(worker, concurrency=1)
        queue.start()
        queue.kick(KEY)
        await asyncio.sleep(0.6)
        await queue.stop()
        return times

    times = asyncio.run(scenario())
    assert len(times) == 3
    assert times[1] - times[0] >= 0.15  # retry backoff
    assert times[2] - times[1] >= 0.04  # requested requeue


def test_crash_point_fires_only_for_pods_of_a_resubmitted_gang():
    pod = "/api/v1/namespaces/ns/pods"
    assert not resubmitted_pod(pod, {"metadata": {"labels": {names.LABEL_ATTEMPT: "0"}}})
    assert resubmitted_pod(pod, {"metadata": {"labels": {names.LABEL_ATTEMPT: "1"}}})
    assert resubmitted_pod(pod, {"metadata": {"labels": {names.LABEL_ATTEMPT: "12"}}})
    assert not resubmitted_pod(pod, {"metadata": {}})
    other = "/api/v1/namespaces/ns/services"
    assert not resubmitted_pod(other, {"metadata": {"labels": {names.LABEL_ATTEMPT: "3"}}})


def test_crash_point_names_are_checked():
    with pytest.raises(ValueError, match="--crash-at: expected one of after-status"):
        crashing_create(KubeApi.create, "after-stauts")


def test_mid_creation_crash_lets_exactly_one_pod_through(monkeypatch):
    """The wrapped client creates one resubmitted pod, holds the others, then exits."""
    created: list[str] = []
    exits: list[int] = []

    async def real(_self, path, body, **_kw):
        await asyncio.sleep(0.01)
        created.append(body["metadata"]["name"])
        return True

    def fake_exit(point):
        exits.append(1)
        raise asyncio.CancelledError

    monkeypatch.setattr(crashing_operator, "_exit", fake_exit)
    create = crashing_create(real, "mid-creation")
    pods = [
        {"metadata": {"name": f"j-a1-r{i}", "labels": {names.LABEL_ATTEMPT: "1"}}} for i in range(3)
    ]

    async def scenario():
        tasks = [asyncio.ensure_future(create(None, "/api/v1/namespaces/n/pods", p)) for p in pods]
        await asyncio.wait(tasks, timeout=0.5)
        for task in tasks:
            task.cancel()

    asyncio.run(scenario())
    assert created == ["j-a1-r0"] and exits == [1]


@pytest.mark.parametrize("argv", [["-A"], ["-n", "a", "-n", "b*"]])
def test_cli_scopes(argv):
    from rtj_operator.__main__ import parse_args

    args = parse_args([*argv, "--metrics-port", "9090", "--liveness", "http://0.0.0.0:8080/h"])
    assert args.all_namespaces or args.namespace == ["a", "b*"]
    assert args.metrics_port == 9090


def test_cli_needs_a_scope():
    from rtj_operator.__main__ import parse_args

    with pytest.raises(SystemExit):
        parse_args([])


def test_every_failed_reconcile_is_counted_by_kind():
    """``rtj_reconcile_errors_total`` counts the reconciles the queue retries, not only
    conflicts: an operator refused everything by RBAC must not show zero errors."""
    ctrl, api = controller_with_job()

    async def refused(namespace, name):
        raise ApiError(403, {"reason": "Forbidden"}, "GET", "/apis/resumable.dev/v1alpha1/x")

    api.get_job = refused  # type: ignore[method-assign]

    def count(kind):
        return metrics.REGISTRY.get_sample_value("rtj_reconcile_errors_total", {"kind": kind}) or 0

    before = count("forbidden")
    with pytest.raises(ApiError):
        asyncio.run(ctrl.queue.worker(KEY, time.monotonic()))  # what the queue retries
    assert count("forbidden") == before + 1

    from rtj_operator.act.controller import error_kind

    assert error_kind(ApiError(503, None, "GET", "/")) == "server"
    assert error_kind(ApiError(400, None, "GET", "/")) == "api"
    assert error_kind(ConnectionResetError()) == "connection"
    assert error_kind(KeyError("x")) == "unexpected"


def hand_made_pod(name: str) -> dict:
    """A pod with a rank's name but none of the job's labels or its ownerReference."""
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": f"hand-{name}", "labels": {}},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running"},
    }


def test_a_hand_made_pod_under_a_rank_name_blocks_the_job_and_is_never_touched():
    """Its create answered 409 and the gang counted as created with that pod as rank 1."""
    ctrl, api = controller_with_job()
    path = KubeApi.core_path("ns", "pods", "train-a0-r1")
    api.objects[path] = hand_made_pod("train-a0-r1")
    sync(ctrl)
    status = api.job()["status"]
    assert not status.get("gangCreated") and "train-a0-r0" not in api.pods()
    blocked = {c["type"]: c for c in status["conditions"]}["Blocked"]
    assert blocked["reason"] == "NameConflict" and "Pod train-a0-r1" in blocked["message"]
    assert api.objects[path]["metadata"]["uid"] == "hand-train-a0-r1"
    assert "delete_pod" not in api.calls

    del api.objects[path]
    sync(ctrl)
    sync(ctrl)
    status = api.job()["status"]
    assert status["gangCreated"] and sorted(api.pods()) == ["train-a0-r0", "train-a0-r1"]


def test_a_hand_made_pod_under_a_name_of_the_next_attempt_is_never_taken_for_its_rank():
    """The pass that ends attempt 0 creates attempt 1's pods: a 409 there passed for the
    rank's own pod too."""
    ctrl, api = controller_with_job()
    sync(ctrl)
    api.run_pods("node-0")
    sync(ctrl)
    path = KubeApi.core_path("ns", "pods", "train-a1-r0")
    api.objects[path] = hand_made_pod("train-a1-r0")
    api.nodes.pop("node-0")
    ctrl.on_node_event("DELETED", make_node("node-0"))
    sync(ctrl)
    assert api.job()["status"]["attempt"] == 1 and not api.job()["status"].get("gangCreated")
    sync(ctrl)
    status = api.job()["status"]
    blocked = {c["type"]: c for c in status["conditions"]}["Blocked"]
    assert blocked["reason"] == "NameConflict" and "Pod train-a1-r0" in blocked["message"]
    assert not status.get("gangCreated")
    assert api.objects[path]["metadata"]["uid"] == "hand-train-a1-r0"
    assert not any(e[1] == "Resubmitted" for e in api.events)


def _blocked(api: FakeApi) -> dict:
    conditions = (api.job().get("status") or {}).get("conditions") or []
    return next(c for c in conditions if c["type"] == "Blocked")


def _invalid_events(api: FakeApi) -> list[str]:
    return [m for t, r, m in api.events if (t, r) == ("Warning", "InvalidSpec")]


def test_a_spec_that_does_not_parse_is_reported_once_per_generation_and_no_pod_is_touched():
    """Past a CRD without the rule (or CEL not enforced): the job says which field is wrong."""
    ctrl, api = controller_with_job()
    sync(ctrl)
    api.run_pods("node-0")
    sync(ctrl)
    pods_before = {n: p["metadata"]["uid"] for n, p in api.pods().items()}
    job = api.job()
    job["spec"]["containerName"] = "nope"
    job["metadata"]["generation"] = 2
    api.events.clear()
    api.calls.clear()
    assert sync(ctrl) is None
    sync(ctrl)
    blocked = _blocked(api)
    assert (blocked["status"], blocked["reason"], blocked["observedGeneration"]) == (
        "True",
        "InvalidSpec",
        2,
    )
    assert "spec: containerName must name one of template.spec.containers" in blocked["message"]
    assert _invalid_events(api) == [blocked["message"]]
    assert {n: p["metadata"]["uid"] for n, p in api.pods().items()} == pods_before
    # Its pods are listed beside the job's read (before it is parsed), and never written.
    assert not {"delete_pod", "annotate_pod", "relabel_pod", "create Pod"} & set(api.calls)
    assert api.job()["status"]["phase"] == "Running"  # the rest of the status stays

    # A restarted operator reads the condition: still no second event for this generation.
    fresh = Controller(api, resync_seconds=0)  # type: ignore[arg-type]
    sync(fresh)
    assert len(_invalid_events(api)) == 1

    # A new generation that is still wrong is reported again, naming the new field.
    job = api.job()
    job["spec"]["resumePolicy"] = {"backoffBaseSeconds": 700}
    job["metadata"]["generation"] = 3
    sync(ctrl)
    assert len(_invalid_events(api)) == 2
    assert "spec.resumePolicy: backoffBaseSeconds must not exceed" in _blocked(api)["message"]

    # Fixed: reconciled again, and Blocked turns False.
    job = api.job()
    del job["spec"]["containerName"], job["spec"]["resumePolicy"]
    job["metadata"]["generation"] = 4
    sync(ctrl)
    blocked = _blocked(api)
    assert (blocked["status"], blocked["reason"]) == ("False", "SpecValid")
    assert len(_invalid_events(api)) == 2


def test_an_unparsable_job_with_a_malformed_status_is_reported_without_crashing():
    ctrl, api = controller_with_job()
    api.job()["spec"]["replicas"] = 0
    api.job()["status"] = {"attempt": "not a number", "conditions": ["junk", {"type": "Running"}]}
    sync(ctrl)
    sync(ctrl)
    status = api.job()["status"]
    assert status["conditions"][0] == {"type": "Running"}  # what was a condition stays
    message = _blocked(api)["message"]
    assert "spec.replicas: Input should be greater than or equal to 1" in message
    assert "status.attempt" in message
    assert _invalid_events(api) == [message]
    assert not api.pods()


def test_an_unparsable_job_whose_status_write_is_refused_still_gets_one_event():
    ctrl, api = controller_with_job(containerName="nope")

    async def refuse(*args, **kwargs):
        raise ApiError(422, {"reason": "Invalid"}, "PATCH", "status")

    api.patch_job_status = refuse  # type: ignore[method-assign]
    sync(ctrl)
    sync(ctrl)
    assert len(_invalid_events(api)) == 1
    assert not api.pods()
