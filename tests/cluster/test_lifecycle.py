"""Success, suspend/resume, the delete cascade, and the exact pod contract on a real server."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request

from rtj_operator.api import envvars
from tools.kubeapi import MERGE, env_of, rtj, unique
from tools.waiting import wait_for

from .scenario import (
    condition,
    kubectl_binary,
    node_of,
    start_running,
    wait_attempt,
    wait_events,
    wait_phase,
)


def test_success_when_every_rank_exits_zero(kube, ns, pool, operator):
    name = start_running(kube, ns, pool, operator)
    kube.end_container(
        ns,
        f"{name}-a0-r0",
        0,
        reason="Completed",
        message='{"checkpoint": "final", "step": 1000, "uri": "s3://ckpt/x"}',
    )
    time.sleep(1)
    assert kube.status(ns, name)["phase"] == "Running"
    kube.end_container(ns, f"{name}-a0-r1", 0, reason="Completed")
    wait_phase(kube, ns, name, "Succeeded", 10, op=operator)
    status = kube.status(ns, name)
    assert status["completionTime"] and status["lastCommittedCheckpoint"]["step"] == 1000
    assert condition(kube, ns, name, "Succeeded")["status"] == "True"
    assert len(kube.pods(ns, name, 0)) == 2  # kept for their logs


def test_suspend_deletes_the_gang_keeps_state_and_resume_continues(kube, ns, pool, operator):
    name = start_running(kube, ns, pool, operator)
    kube.report_progress(ns, f"{name}-a0-r1", "ep1-ba10", 10)
    wait_for("checkpoint", lambda: kube.status(ns, name).get("lastCommittedCheckpoint"), 10)
    kube.patch_job(ns, name, {"suspend": True})
    wait_phase(kube, ns, name, "Suspended", 10, op=operator)
    wait_for("gang deleted", lambda: kube.pods(ns, name) == [], 20, on_timeout=operator.tail)
    status = kube.status(ns, name)
    assert status["lastCommittedCheckpoint"]["name"] == "ep1-ba10"
    assert status["preemptions"] == 0 and status["failures"] == 0
    kube.patch_job(ns, name, {"suspend": False})
    pods = wait_attempt(kube, ns, name, 1, 2, op=operator)
    assert env_of(pods[0])["RTJ_RESUME_FROM"] == "s3://ckpt/run/ep1-ba10"
    wait_for("Running", lambda: kube.status(ns, name).get("phase") == "Running", 30)


def test_resuming_a_gang_suspended_mid_creation_counts_no_preemption(kube, ns, pool, operator):
    """A full quota lets one of two ranks be created; the user suspends, frees the quota and
    resumes while that rank still terminates. The next attempt gets new names: taking the
    terminating pod for the resumed gang's rank ended the gang at once as a preemption."""
    pool.add(2)
    quota = f"/api/v1/namespaces/{ns}/resourcequotas"
    kube.req(
        "POST",
        quota,
        body={"metadata": {"name": "one-pod"}, "spec": {"hard": {"count/pods": "1"}}},
    )
    wait_for(
        "quota counted",
        lambda: ((kube.get(f"{quota}/one-pod") or {}).get("status") or {}).get("hard"),
        20,
    )
    name = unique("job")
    kube.create_job(rtj(name, ns, pool.name, 2))
    wait_for(
        "PodCreationRefused",
        lambda: condition(kube, ns, name, "Blocked").get("reason") == "PodCreationRefused",
        30,
        on_timeout=operator.tail,
    )
    (created,) = kube.pods(ns, name, 0)  # whichever rank got the quota's one pod
    rank0 = created["metadata"]["name"]
    hold = {"metadata": {"finalizers": ["rtj-e2e/hold"]}}  # a long grace period, made visible
    kube.req("PATCH", f"/api/v1/namespaces/{ns}/pods/{rank0}", content_type=MERGE, body=hold)
    kube.patch_job(ns, name, {"suspend": True})
    wait_for(
        "rank 0 terminating",
        lambda: ((kube.pod(ns, rank0) or {}).get("metadata") or {}).get("deletionTimestamp"),
        20,
        on_timeout=operator.tail,
    )
    kube.req("DELETE", f"{quota}/one-pod")
    kube.patch_job(ns, name, {"suspend": False})
    wait_for(
        "attempt 1 running", lambda: kube.running(ns, name, 1, 2), 30, on_timeout=operator.tail
    )
    status = kube.status(ns, name)
    assert status["preemptions"] == 0 and status["failures"] == 0, status
    assert not status.get("interruptions"), status
    kube.req(
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{rank0}",
        content_type=MERGE,
        body={"metadata": {"finalizers": None}},
    )


def test_suspending_a_job_whose_pods_are_refused_settles_blocked(kube, ns, pool, operator):
    """A pod refused by admission (its ServiceAccount does not exist yet) makes the job Blocked,
    "...; retrying". Suspended, the job creates nothing and retries nothing: Blocked stayed True
    with "retrying" all the same. Resumed, the refusal shows again until the account exists."""
    pool.add(2)
    name = unique("refused")
    kube.create_job(rtj(name, ns, pool.name, 2, template_spec={"serviceAccountName": "later"}))

    def blocked() -> dict:
        return condition(kube, ns, name, "Blocked")

    wait_for(
        "PodCreationRefused",
        lambda: blocked().get("reason") == "PodCreationRefused",
        30,
        on_timeout=operator.tail,
    )
    assert blocked()["status"] == "True" and "retrying" in blocked()["message"]
    kube.patch_job(ns, name, {"suspend": True})
    wait_phase(kube, ns, name, "Suspended", 20, op=operator)
    assert blocked() == {}, kube.status(ns, name)  # absent, as while nothing is stuck
    kube.patch_job(ns, name, {"suspend": False})
    wait_for(
        "refused again once resumed",
        lambda: blocked().get("status") == "True",
        30,
        on_timeout=operator.tail,
    )
    assert blocked()["reason"] == "PodCreationRefused"
    kube.req(
        "POST", f"/api/v1/namespaces/{ns}/serviceaccounts", body={"metadata": {"name": "later"}}
    )
    wait_for(
        "running once the account exists",
        lambda: kube.status(ns, name).get("phase") == "Running",
        60,
        on_timeout=operator.tail,
    )
    assert blocked()["status"] == "False" and blocked()["reason"] == "PodsCreated"


def test_deleting_the_job_removes_everything_it_owns(kube, ns, pool, operator):
    name = start_running(kube, ns, pool, operator)
    owned = [
        f"/api/v1/namespaces/{ns}/services/{name}",
        f"/api/v1/namespaces/{ns}/serviceaccounts/{name}-trainer",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/{name}-trainer",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings/{name}-trainer",
    ]
    for path in owned:
        assert kube.get(path) is not None, path
    kube.delete_job(ns, name)
    wait_for("pods garbage-collected", lambda: kube.pods(ns, name) == [], 60)
    for path in owned:
        wait_for(f"{path} garbage-collected", lambda p=path: kube.get(p) is None, 60)


def test_a_job_recreated_while_its_namesakes_pods_terminate_waits_for_them(
    kube, ns, pool, operator
):
    """kubectl delete, then apply again: the deleted job's ranks still use their grace period
    under the names of the new job's first attempt. The new job waits Blocked (NameConflict)
    instead of counting a preemption for pods that were never its own."""
    name = start_running(kube, ns, pool, operator)
    old_rank0 = f"{name}-a0-r0"
    hold = {"metadata": {"finalizers": ["rtj-e2e/hold"]}}  # a long grace period, made visible
    kube.req("PATCH", f"/api/v1/namespaces/{ns}/pods/{old_rank0}", content_type=MERGE, body=hold)
    kube.delete_job(ns, name)
    wait_for("job gone", lambda: kube.job(ns, name) is None, 30)
    kube.create_job(rtj(name, ns, pool.name, 2))
    wait_for(
        "Blocked by the old pod",
        lambda: condition(kube, ns, name, "Blocked").get("reason") == "NameConflict",
        20,
        on_timeout=operator.tail,
    )
    assert f"Pod {old_rank0}" in condition(kube, ns, name, "Blocked")["message"]
    status = kube.status(ns, name)
    assert status["attempt"] == 0 and status["preemptions"] == 0, status
    assert not status.get("interruptions"), status
    kube.req(
        "PATCH",
        f"/api/v1/namespaces/{ns}/pods/{old_rank0}",
        content_type=MERGE,
        body={"metadata": {"finalizers": None}},
    )
    wait_for(
        "the new job's attempt 0 running",
        lambda: kube.running(ns, name, 0, 2),
        30,
        on_timeout=operator.tail,
    )
    status = kube.status(ns, name)
    assert status["attempt"] == 0 and status["preemptions"] == 0, status
    assert condition(kube, ns, name, "Blocked")["status"] == "False"


def test_pods_service_and_rbac_follow_the_contract(kube, ns, pool, operator):
    name = start_running(kube, ns, pool, operator, replicas=2, runName="llama")
    pods = kube.pods(ns, name, 0)
    for rank, pod in enumerate(pods):
        meta, spec = pod["metadata"], pod["spec"]
        assert meta["labels"]["resumable.dev/job-name"] == name
        assert meta["labels"]["resumable.dev/attempt"] == "0"
        assert meta["labels"]["resumable.dev/rank"] == str(rank)
        owner = meta["ownerReferences"][0]
        assert owner["kind"] == "ResumableTrainingJob" and owner["controller"]
        assert spec["hostname"] == meta["name"] and spec["subdomain"] == name
        assert spec["serviceAccountName"] == f"{name}-trainer"
        env = env_of(pod)
        assert set(envvars.ALL_RTJ) <= env.keys() and set(envvars.TORCH) <= env.keys()
        assert env["RTJ_RUN_NAME"] == "llama" and env["RTJ_RESUME_FROM"] == ""
        assert env["WORLD_SIZE"] == "2" and env["RTJ_NAMESPACE"] == ns
        container = spec["containers"][0]
        assert container["terminationMessagePolicy"] == "File"
        assert env["RTJ_REPORT_FILE"] == container["terminationMessagePath"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        field = volumes["rtj-preemption-notice"]["downwardAPI"]["items"][0]["fieldRef"]
        assert field["fieldPath"] == "metadata.annotations['resumable.dev/preemption-notice']"
    svc = kube.get(f"/api/v1/namespaces/{ns}/services/{name}")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    role = kube.get(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/{name}-trainer")
    assert role["rules"][0]["resourceNames"] == [f"{name}-a0-r0", f"{name}-a0-r1"]
    kube.delete_node(node_of(kube, ns, name, 0, 0))
    wait_attempt(kube, ns, name, 1, 2, op=operator)
    wait_for(
        "role follows the attempt",
        lambda: (
            kube.get(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/{name}-trainer")[
                "rules"
            ][0]["resourceNames"]
            == [f"{name}-a0-r0", f"{name}-a0-r1", f"{name}-a1-r0", f"{name}-a1-r1"]
        ),
        10,
    )


def test_a_template_copied_from_a_pod_brings_no_progress_report_or_notice(kube, ns, pool, operator):
    """A template made from `kubectl get pod -o yaml` carries that pod's annotations: its
    progress report became every new pod's, and the job recorded it as a commit of its own gang
    (lastCommittedCheckpoint ep9-ba900, the resume point of the next attempt)."""
    pool.add(2)
    name = unique("copied")
    body = rtj(name, ns, pool.name, 2)
    copied = {
        "resumable.dev/progress": json.dumps(
            {"checkpoint": "ep9-ba900", "uri": "s3://ckpt/other/ep9-ba900", "step": 900}
        ),
        "resumable.dev/preemption-notice": json.dumps({"reason": "copied"}),
        "team": "vision",
    }
    body["spec"]["template"]["metadata"] = {"annotations": copied}
    kube.create_job(body)
    wait_for(
        "attempt 0 running", lambda: kube.running(ns, name, 0, 2), 60, on_timeout=operator.tail
    )
    wait_phase(kube, ns, name, "Running", 30, op=operator)
    for pod in kube.pods(ns, name, 0):
        annotations = pod["metadata"].get("annotations") or {}
        assert annotations.get("team") == "vision", annotations
        assert "resumable.dev/progress" not in annotations, annotations
        assert not annotations.get("resumable.dev/preemption-notice"), annotations
    assert "lastCommittedCheckpoint" not in kube.status(ns, name)


def test_a_changed_master_port_reaches_the_service_with_the_next_attempt(kube, ns, pool, operator):
    """spec.masterPort is mutable: the next attempt's ranks got the new MASTER_PORT while the
    headless Service kept the port it was created with."""
    name = start_running(kube, ns, pool, operator)
    service = f"/api/v1/namespaces/{ns}/services/{name}"
    assert [p["port"] for p in kube.get(service)["spec"]["ports"]] == [29500]
    kube.patch_job(ns, name, {"masterPort": 23456})
    kube.delete_node(node_of(kube, ns, name, 0, 0))
    pods = wait_attempt(kube, ns, name, 1, 2, op=operator)
    assert env_of(pods[0])["MASTER_PORT"] == "23456"
    ports = kube.get(service)["spec"]["ports"]
    assert [(p["name"], p["port"], p["targetPort"]) for p in ports] == [
        ("rendezvous", 23456, 23456)
    ]


def test_kubectl_short_name_printer_columns_and_metrics(kube, kubeconfig, ns, pool, operator):
    name = start_running(kube, ns, pool, operator)
    kube.delete_node(node_of(kube, ns, name, 0, 0))
    wait_attempt(kube, ns, name, 1, 2, op=operator)
    kubectl = kubectl_binary()
    if kubectl:
        out = subprocess.run(
            [kubectl, "--kubeconfig", kubeconfig, "-n", ns, "get", "rtj"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        header, row = out.splitlines()[:2]
        assert header.split() == [
            "NAME",
            "PHASE",
            "ATTEMPT",
            "PREEMPTIONS",
            "FAILURES",
            "SIZE",
            "STEP",
            "GOODPUT",
            "LOST",
            "PROGRESS",
            "ETA",
            "AGE",
        ]
        assert row.split()[0] == name and row.split()[2] == "1" and row.split()[3] == "1"
        assert row.split()[5] == "2"  # the gang's size
    with urllib.request.urlopen(operator.metrics, timeout=5) as response:  # noqa: S310
        text = response.read().decode()
    assert 'rtj_interruptions_total{cause="NodeDeleted",kind="preemption"}' in text
    assert "rtj_preemption_to_resubmission_seconds_count" in text
    assert 'rtj_resubmissions_total{reason="preemption"}' in text
    assert "rtj_jobs{phase=" in text


def hand_made_pod(kube, ns: str, name: str) -> str:
    """Create a pod with a rank's name but none of the job's labels (held by a scheduling gate,
    so it never runs); returns its uid."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "schedulingGates": [{"name": "example.com/by-hand"}],
            "containers": [{"name": "c", "image": "registry.local/other:1"}],
        },
    }
    return kube.req("POST", f"/api/v1/namespaces/{ns}/pods", body=body)["metadata"]["uid"]


def wait_blocked_by(kube, ns: str, name: str, pod: str, op) -> None:
    """Wait until the job is Blocked (NameConflict) naming ``Pod <pod>``."""
    wait_for(
        f"Blocked naming {pod}",
        lambda: f"Pod {pod}" in condition(kube, ns, name, "Blocked").get("message", ""),
        30,
        on_timeout=lambda: f"{kube.status(ns, name)}\n{op.tail()}",
    )
    blocked = condition(kube, ns, name, "Blocked")
    assert blocked["status"] == "True" and blocked["reason"] == "NameConflict", blocked


def test_a_hand_made_pod_under_a_rank_name_blocks_the_job_and_is_never_touched(
    kube, ns, pool, operator
):
    """Before: the pod, lacking the job's labels, was invisible to the operator; the rank's
    create answered 409 and the gang counted as created with that pod as its rank, which the
    next pass found missing and counted as a preemption (PodRemoved)."""
    pool.add(2)
    name = unique("byhand")
    foreign = f"{name}-a0-r1"
    uid = hand_made_pod(kube, ns, foreign)
    kube.create_job(rtj(name, ns, pool.name, 2))
    wait_blocked_by(kube, ns, name, foreign, operator)
    time.sleep(2)  # a pass or two more: nothing is adopted, deleted or counted meanwhile
    status = kube.status(ns, name)
    assert status["phase"] == "Pending" and not status.get("gangCreated"), status
    assert status["preemptions"] == 0 and not status.get("interruptions"), status
    held = kube.pod(ns, foreign)
    assert held["metadata"]["uid"] == uid and not held["metadata"].get("deletionTimestamp")
    wait_events(kube, ns, name, {"NameConflict"})
    kube.req("DELETE", f"/api/v1/namespaces/{ns}/pods/{foreign}")
    wait_for(
        "attempt 0 running once the name is free",
        lambda: kube.running(ns, name, 0, 2),
        40,
        on_timeout=lambda: f"{kube.status(ns, name)}\n{operator.tail()}",
    )
    assert kube.status(ns, name)["preemptions"] == 0

    # The next attempt's name, taken while attempt 0 runs: the pass that ends attempt 0
    # creates attempt 1's pods at once.
    foreign = f"{name}-a1-r0"
    uid = hand_made_pod(kube, ns, foreign)
    kube.delete_node(node_of(kube, ns, name, 0, 1))
    wait_blocked_by(kube, ns, name, foreign, operator)
    status = kube.status(ns, name)
    assert status["attempt"] == 1 and not status.get("gangCreated"), status
    held = kube.pod(ns, foreign)
    assert held["metadata"]["uid"] == uid and not held["metadata"].get("deletionTimestamp")
    assert not held["metadata"].get("ownerReferences")
    kube.req("DELETE", f"/api/v1/namespaces/{ns}/pods/{foreign}")
    pool.add(1)
    wait_for(
        "attempt 1 running once the name is free",
        lambda: kube.running(ns, name, 1, 2),
        40,
        on_timeout=lambda: f"{kube.status(ns, name)}\n{operator.tail()}",
    )
    assert kube.status(ns, name)["preemptions"] == 1
