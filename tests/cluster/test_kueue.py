"""The operator against a running Kueue (v0.17.0, ``hack/kueue``): gangs admitted whole, jobs
over quota waiting and then running one after the other, a preemption by a higher-priority
workload handled as a preemption, resumed from the checkpoint the ranks saved on SIGTERM, and an
elastic job sized by the queue's free quota.

The bed (``tools/kueuebed.py``, shared with ``make demo SCENARIO=kueue``) runs Kueue as a local
process (``tools/kueue.py``) on a control plane of its own (``<RTJ_TEST_CLUSTER_NAME>-kueue``),
not the session's shared one: its pod webhook (``failurePolicy: Fail``) sees every pod of the
cluster, and its API makes the operator choose the ``Kueue`` mechanism where the other suites
check what happens without it. The ranks are real processes on pod-runner nodes
(``tools/podrunner``), which honour scheduling gates: a rank runs only once Kueue has admitted
its gang and removed its gate.

Locally a missing build skips this module; with ``CI=true`` the build runs here if
``make tools`` has not (and fails loudly).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import IN_CI, TEST_CLUSTER_NAME, require, unique
from tools import kueue as kq
from tools.controlplane import CLUSTER_SH, ControlPlaneError, binaries_ready
from tools.kubeapi import POOL_LABEL, rtj
from tools.kueuebed import KueueBed
from tools.localstack import start_reference_run, training_command, weights_equal
from tools.waiting import wait_for
from trainer_runtime import events
from trainer_runtime.events import read_events

from .conftest import E2E_NAMESPACES, ROOT
from .scenario import condition, wait_events

SPOT_JOB = ROOT / "tests" / "e2e" / "manifests" / "spot-job.yaml"
"""The e2e story's job: its training command (``examples/train_deterministic.py``, 48 steps, a
checkpoint every 4) is the preemption test's, and its uninterrupted reference run the baseline."""


Bed = KueueBed
"""The Kueue test bed (``tools/kueuebed.py``)."""


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    """A control plane with Kueue, the operator and two 8-CPU pod-runner nodes."""
    require(CLUSTER_SH.exists(), f"{CLUSTER_SH} is missing")
    if not IN_CI:
        require(binaries_ready(), "control-plane binaries not built: run hack/cluster/build.sh")
        require(kq.built(), f"Kueue {kq.version()} not built: run hack/kueue/build.sh")
    else:
        kq.build()
    state = KueueBed(
        f"{TEST_CLUSTER_NAME}-kueue",
        tmp_path_factory.mktemp("kueue-bed"),
        namespaces=E2E_NAMESPACES,
        pool_label=POOL_LABEL,
        keep_cluster=os.environ.get("RTJ_TEST_KEEP_CLUSTER") == "1",
    )
    try:
        try:
            state.up(nodes=2, cpu="8", timeout=1800 if IN_CI else 540)
        except ControlPlaneError as err:
            pytest.fail(str(err))
        yield state
    finally:
        state.down(wait=30)
        if state.kueue is not None and state.operator is not None:
            print(f"\nKueue log: {state.kueue.log}\noperator log: {state.operator.log}")


@pytest.fixture
def ns(bed: Bed) -> Iterator[str]:
    """A fresh namespace served by the operator, deleted after the test (its ClusterQueue
    too)."""
    name = unique("rtj-e2e-kq")
    bed.kube.create_namespace(name)
    wait_for(
        "the default ServiceAccount",
        lambda: bed.kube.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        60,
    )
    time.sleep(0.2)
    yield name
    bed.kube.delete_namespace(name)
    kq.delete(bed.kube, kq.path_of("ClusterQueue", f"{name}-cq"))


def sleeper(seconds: float, cpu: str = "1") -> dict[str, Any]:
    """A rank that sleeps, then exits 0."""
    return {
        "terminationGracePeriodSeconds": 5,
        "containers": [
            {
                "name": "trainer",
                "image": "rtj-train:0.1.0",
                "command": ["python", "-c", f"import time; time.sleep({seconds})"],
                "resources": {"requests": {"cpu": cpu}},
            }
        ],
    }


def queued_job(bed: Bed, ns: str, name: str, replicas: int, spec: dict[str, Any], **extra: Any):
    """A job of the bed's pool submitted to the namespace's LocalQueue ``queue``."""
    body = rtj(name, ns, bed.pool, replicas, queueName="queue", template_spec=spec, **extra)
    return bed.kube.create_job(body)


def workload_of(bed: Bed, ns: str, group: str) -> dict[str, Any] | None:
    """The Workload Kueue made for a pod group (named after the group's pods' owner)."""
    for wl in kq.workloads(bed.kube, ns):
        labels = wl["metadata"].get("labels") or {}
        if labels.get("kueue.x-k8s.io/pod-group-name") == group or wl["metadata"]["name"] == group:
            return wl
    return None


def gates(pod: dict[str, Any]) -> list[str]:
    """The pod's scheduling gates."""
    return [g["name"] for g in (pod["spec"].get("schedulingGates") or [])]


def diagnostics(bed: Bed, ns: str, *jobs: str) -> str:
    """What to look at on a timeout: the jobs' status, pods, Workloads, the logs' tails."""
    lines = []
    for job in jobs:
        lines.append(f"{job}: {bed.kube.status(ns, job)}")
        for pod in bed.kube.pods(ns, job):
            lines.append(
                f"  {pod['metadata']['name']}: {pod['status'].get('phase')} "
                f"node={pod['spec'].get('nodeName')} gates={gates(pod)}"
            )
    for wl in kq.workloads(bed.kube, ns):
        conds = {c["type"]: (c["status"], c.get("message")) for c in wl["status"]["conditions"]}
        lines.append(f"workload {wl['metadata']['name']}: {conds}")
    assert bed.operator is not None and bed.kueue is not None
    lines += ["operator:", bed.operator.tail(20), "kueue:", bed.kueue.tail(10)]
    return "\n".join(lines)


def test_a_gang_is_admitted_as_one_workload_whole(bed: Bed, ns: str) -> None:
    """Three ranks, one Workload with one pod set of three, and no rank ungated before the
    others: the quota holds the whole gang or none of it."""
    kq.ensure_queue(bed.kube, ns, {"cpu": "3"})
    name = unique("gang")
    queued_job(bed, ns, name, 3, sleeper(20))
    group = f"{name}-a0"
    wl = wait_for(
        "the gang's Workload admitted",
        lambda: w if kq.admitted(w := workload_of(bed, ns, group)) else None,
        60,
        on_timeout=lambda: diagnostics(bed, ns, name),
    )
    (pod_set,) = wl["spec"]["podSets"]
    assert pod_set["count"] == 3, wl["spec"]["podSets"]
    assert len(kq.workloads(bed.kube, ns)) == 1
    assert bed.kube.status(ns, name)["gangScheduling"] == "Kueue"
    pods = wait_for(
        "all three ranks running",
        lambda: bed.kube.running(ns, name, 0, 3),
        60,
        on_timeout=lambda: diagnostics(bed, ns, name),
    )
    for pod in pods:
        assert not gates(pod)
        labels, notes = pod["metadata"]["labels"], pod["metadata"]["annotations"]
        assert labels["kueue.x-k8s.io/queue-name"] == "queue"
        assert labels["kueue.x-k8s.io/pod-group-name"] == group
        assert notes["kueue.x-k8s.io/pod-group-total-count"] == "3"
    # Ungated together: every rank's PodScheduled turned True after the Workload's admission.
    admitted_at = kq.condition(wl, "Admitted")["lastTransitionTime"]
    for pod in pods:
        scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
        assert scheduled["lastTransitionTime"] >= admitted_at


def test_a_gang_larger_than_the_quota_is_never_partly_admitted(bed: Bed, ns: str) -> None:
    """Quota for 2 of 3 ranks: no rank runs, every rank keeps Kueue's gate, and the job says
    it waits for the queue; raising the quota to 3 starts all three together."""
    cq, _ = kq.ensure_queue(bed.kube, ns, {"cpu": "2"})
    name = unique("big")
    queued_job(bed, ns, name, 3, sleeper(10))
    wl = wait_for(
        "the Workload pending",
        lambda: (
            w
            if kq.condition(w := workload_of(bed, ns, f"{name}-a0"), "QuotaReserved").get("status")
            == "False"
            else None
        ),
        60,
        on_timeout=lambda: diagnostics(bed, ns, name),
    )
    assert "insufficient" in kq.condition(wl, "QuotaReserved")["message"], wl["status"]
    cond = wait_for(
        "PodsScheduled=False",
        lambda: c if (c := condition(bed.kube, ns, name, "PodsScheduled")).get("status") else None,
        30,
        on_timeout=lambda: diagnostics(bed, ns, name),
    )
    assert cond["reason"] == "SchedulingGated", cond
    assert kq.ADMISSION_GATE in cond["message"] and "queue queue" in cond["message"], cond
    # Why it waits, in Kueue's words, with the queue's name.
    admitted = wait_for(
        "Admitted=False with Kueue's message",
        lambda: (
            c
            if "insufficient" in (c := condition(bed.kube, ns, name, "Admitted")).get("message", "")
            else None
        ),
        30,
        on_timeout=lambda: diagnostics(bed, ns, name),
    )
    assert admitted["status"] == "False" and admitted["reason"] == "Pending", admitted
    assert f"Workload {name}-a0 waits in Kueue queue queue" in admitted["message"], admitted
    assert "insufficient quota for cpu" in admitted["message"], admitted
    time.sleep(3)
    pods = bed.kube.pods(ns, name, 0)
    assert len(pods) == 3 and all(kq.ADMISSION_GATE in gates(p) for p in pods), pods
    assert not [p for p in pods if p["spec"].get("nodeName")]

    kq.apply(bed.kube, kq.cluster_queue(cq, {"cpu": "3"}, namespace=ns))
    wait_for(
        "all three ranks running",
        lambda: bed.kube.running(ns, name, 0, 3),
        60,
        on_timeout=lambda: diagnostics(bed, ns, name),
    )
    wait_for(
        "Admitted=True",
        lambda: condition(bed.kube, ns, name, "Admitted").get("status") == "True",
        30,
        on_timeout=lambda: diagnostics(bed, ns, name),
    )
    assert f"ClusterQueue {cq}" in condition(bed.kube, ns, name, "Admitted")["message"]


def test_two_jobs_competing_for_one_quota_run_one_after_the_other(bed: Bed, ns: str) -> None:
    """Quota for one 2-rank gang: the second job waits (gated, its Workload pending) while the
    first runs, and starts when the first has succeeded and released the quota."""
    kq.ensure_queue(bed.kube, ns, {"cpu": "2"})
    first, second = unique("first"), unique("second")
    queued_job(bed, ns, first, 2, sleeper(8))
    wait_for(
        f"{first} running",
        lambda: bed.kube.running(ns, first, 0, 2),
        60,
        on_timeout=lambda: diagnostics(bed, ns, first),
    )
    queued_job(bed, ns, second, 2, sleeper(2))
    wait_for(
        f"{second}'s Workload pending",
        lambda: (
            kq.condition(workload_of(bed, ns, f"{second}-a0"), "QuotaReserved").get("status")
            == "False"
        ),
        30,
        on_timeout=lambda: diagnostics(bed, ns, first, second),
    )
    assert bed.kube.status(ns, second).get("phase") == "Pending"
    assert all(kq.ADMISSION_GATE in gates(p) for p in bed.kube.pods(ns, second, 0))
    wait_for(
        f"{second} succeeded",
        lambda: bed.kube.status(ns, second).get("phase") == "Succeeded",
        90,
        on_timeout=lambda: diagnostics(bed, ns, first, second),
    )
    done = bed.kube.status(ns, first)
    assert done["phase"] == "Succeeded", done
    # One after the other: the second gang started only after the first one's ranks ended.
    first_end = max(
        s["state"]["terminated"]["finishedAt"]
        for p in bed.kube.pods(ns, first, 0)
        for s in p["status"]["containerStatuses"]
    )
    second_start = min(
        s["state"]["terminated"]["startedAt"]
        for p in bed.kube.pods(ns, second, 0)
        for s in p["status"]["containerStatuses"]
    )
    assert second_start >= first_end, (first_end, second_start)
    assert done["failures"] == 0 and bed.kube.status(ns, second)["failures"] == 0


def trainer(bed: Bed, name: str) -> dict[str, Any]:
    """A real training rank (the e2e story's command, steps of about 0.5 s): it saves on SIGTERM
    and resumes from the newest checkpoint; rank 0 writes the final weights."""
    command = [
        a for a in training_command(SPOT_JOB) if not a.startswith(("--out=", "--step-sleep="))
    ]
    return {
        "terminationGracePeriodSeconds": 20,
        "containers": [
            {
                "name": "trainer",
                "image": "rtj-train:0.1.0",
                "workingDir": "/app",
                "command": [*command, "--step-sleep=0.5", f"--out={bed.workdir / 'out'}/{name}.pt"],
                "resources": {"requests": {"cpu": "1"}},
            }
        ],
    }


def test_a_kueue_preemption_is_a_preemption_and_resumes_from_the_sigterm_save(
    bed: Bed, ns: str
) -> None:
    """A higher-priority workload takes the quota of a running 2-rank job: Kueue evicts the
    gang's Workload and deletes its pods, the ranks save on SIGTERM, the operator records a
    preemption (no failure) that names Kueue, the next attempt waits in the queue, and once the
    quota is free again it resumes at the step the SIGTERM save committed and ends with the
    weights of an uninterrupted run, bit for bit."""
    reference = start_reference_run(SPOT_JOB, bed.workdir / f"reference-{ns}")
    kq.ensure_queue(bed.kube, ns, {"cpu": "2"})
    kq.apply(bed.kube, kq.workload_priority_class("rtj-kq-high", 1000))
    name = unique("victim")
    (bed.workdir / "out").mkdir(exist_ok=True)
    queued_job(bed, ns, name, 2, trainer(bed, name), checkpoint={"dir": str(bed.workdir / "ckpt")})
    wait_for(
        "a committed checkpoint",
        lambda: bed.kube.status(ns, name).get("lastCommittedCheckpoint"),
        120,
        on_timeout=lambda: diagnostics(bed, ns, name),
    )
    preemptor = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "preemptor",
            "labels": {
                "kueue.x-k8s.io/queue-name": "queue",
                "kueue.x-k8s.io/priority-class": "rtj-kq-high",
            },
        },
        "spec": {
            **sleeper(12, cpu="2"),
            "restartPolicy": "Never",
            "nodeSelector": {POOL_LABEL: bed.pool},
        },
    }
    bed.kube.req("POST", f"/api/v1/namespaces/{ns}/pods", body=preemptor)
    status = wait_for(
        "the interruption recorded",
        lambda: s if (s := bed.kube.status(ns, name)).get("interruptions") else None,
        60,
        on_timeout=lambda: diagnostics(bed, ns, name),
    )
    (interruption,) = status["interruptions"]
    assert interruption["preemption"] is True and interruption["attempt"] == 0, interruption
    assert interruption["cause"] == "KueueEviction", interruption
    assert "Kueue TerminationTarget WorkloadEvicted" in interruption["message"], interruption
    assert "Preempted" in interruption["message"], interruption
    assert status["failures"] == 0 and status["preemptions"] == 1, status
    wait_events(bed.kube, ns, name, {"Preempted"})  # posted after the status write
    event = next(e for e in bed.kube.events(ns, name) if e["reason"] == "Preempted")
    assert "Kueue" in event["message"], event

    # The next attempt queues behind the preemptor, then runs when its quota is free again.
    queued = wait_for(
        "attempt 1's pods",
        lambda: p if len(p := bed.kube.pods(ns, name, 1)) == 2 else None,
        30,
        on_timeout=lambda: diagnostics(bed, ns, name),
    )
    if (bed.kube.pod(ns, "preemptor") or {}).get("status", {}).get("phase") == "Running":
        assert all(kq.ADMISSION_GATE in gates(p) for p in queued), [gates(p) for p in queued]
    wait_for(
        "the preemptor succeeded",
        lambda: (bed.kube.pod(ns, "preemptor") or {}).get("status", {}).get("phase") == "Succeeded",
        90,
        on_timeout=lambda: diagnostics(bed, ns, name),
    )
    wait_for(
        f"{name} succeeded",
        lambda: bed.kube.status(ns, name).get("phase") == "Succeeded",
        180,
        on_timeout=lambda: diagnostics(bed, ns, name),
    )
    final = bed.kube.status(ns, name)
    assert final["attempt"] == 1 and final["failures"] == 0, final
    saved = {}
    for rank in (0, 1):
        log = bed.pod_log(ns, f"{name}-a0-r{rank}")
        emergency = read_events(log, events.EMERGENCY_SAVED)
        assert emergency, f"rank {rank} did not save on SIGTERM:\n{log[-2000:]}"
        saved[rank] = emergency[-1]["checkpoint"]
    assert saved[0] == saved[1], saved
    steps = dict(
        (e["checkpoint"], int(e["step"]))
        for e in read_events(bed.pod_log(ns, f"{name}-a0-r0"), events.COMMITTED)
    )
    resumed = read_events(bed.pod_log(ns, f"{name}-a1-r0"), events.RESUMED)
    assert resumed and int(resumed[-1]["step"]) == steps[saved[0]], (resumed, steps, saved)
    try:
        equal, why = weights_equal(reference.wait(), bed.workdir / "out" / f"{name}.pt")
    finally:
        reference.kill()
    assert equal, f"final weights differ from the uninterrupted run: {why}"


def test_a_gang_on_borrowed_quota_that_is_reclaimed_is_preempted_and_comes_back(
    bed: Bed, ns: str
) -> None:
    """A job runs on quota borrowed from a ClusterQueue of its cohort; a job of the lender's
    queue reclaims it: Kueue evicts the borrower's gang, the operator records a preemption and no
    failure, and the next attempt runs once the lender's job is done."""
    cohort = f"{ns}-cohort"
    borrow, _ = kq.ensure_queue(bed.kube, ns, {"cpu": "0"}, name=f"{ns}-borrow", cohort=cohort)
    lend, _ = kq.ensure_queue(bed.kube, ns, {"cpu": "2"}, name=f"{ns}-lend", cohort=cohort)
    try:
        victim, lender = unique("borrower"), unique("lender")
        bed.kube.create_job(
            rtj(victim, ns, bed.pool, 2, queueName=borrow, template_spec=sleeper(15))
        )
        wait_for(
            f"{victim} running on borrowed quota",
            lambda: bed.kube.running(ns, victim, 0, 2),
            60,
            on_timeout=lambda: diagnostics(bed, ns, victim),
        )
        wait_for(  # the ClusterQueue's status is written a moment after the admission
            f"ClusterQueue {borrow} borrowing 2 cpu",
            lambda: (
                bed.kube.get(kq.path_of("ClusterQueue", borrow))["status"]["flavorsUsage"][0][
                    "resources"
                ][0]["borrowed"]
                == "2"
            ),
            30,
            on_timeout=lambda: str(bed.kube.get(kq.path_of("ClusterQueue", borrow))["status"]),
        )
        bed.kube.create_job(rtj(lender, ns, bed.pool, 2, queueName=lend, template_spec=sleeper(4)))
        status = wait_for(
            f"{victim}'s interruption recorded",
            lambda: s if (s := bed.kube.status(ns, victim)).get("interruptions") else None,
            60,
            on_timeout=lambda: diagnostics(bed, ns, victim, lender),
        )
        (interruption,) = status["interruptions"]
        assert interruption["preemption"] is True, interruption
        assert "Kueue TerminationTarget WorkloadEvicted" in interruption["message"], interruption
        assert "reclamation within the cohort" in interruption["message"], interruption
        for job in (lender, victim):
            wait_for(
                f"{job} succeeded",
                lambda j=job: bed.kube.status(ns, j).get("phase") == "Succeeded",
                120,
                on_timeout=lambda: diagnostics(bed, ns, victim, lender),
            )
        final = bed.kube.status(ns, victim)
        assert final["attempt"] == 1 and final["failures"] == 0 and final["preemptions"] == 1
    finally:
        for name in (borrow, lend):
            kq.delete(bed.kube, kq.path_of("ClusterQueue", name))


def elastic_trainer(bed: Bed, name: str) -> dict[str, Any]:
    """An elastic training rank (``--elastic``: it resumes at another world size): 12 samples
    per optimizer step at 2 or 3 ranks, 100 steps of about 0.3 s, a checkpoint every 4."""
    return {
        "terminationGracePeriodSeconds": 20,
        "containers": [
            {
                "name": "trainer",
                "image": "rtj-train:0.1.0",
                "workingDir": "/app",
                "command": [
                    "python",
                    "/app/examples/train_deterministic.py",
                    "--elastic",
                    "--epochs=1",
                    "--dataset-size=1200",
                    "--batch-size=2",
                    "--global-batch-size=12",
                    "--interval=4ba",
                    "--workers=0",
                    "--step-sleep=0.3",
                    f"--out={bed.workdir / 'out'}/{name}.pt",
                ],
                "resources": {"requests": {"cpu": "1"}},
            }
        ],
    }


def test_an_elastic_job_starts_at_what_the_quota_holds_and_grows_when_it_frees(
    bed: Bed, ns: str
) -> None:
    """Quota for 2 pods, an elastic job of 3 with minReplicas 2, and node room for 16: the job
    starts at 2 (its Workload admitted with 2 pods) instead of waiting in the queue for 3; once
    the quota holds 3 it grows to 3 through a checkpoint, with no failure counted."""
    cq, _ = kq.ensure_queue(bed.kube, ns, {"cpu": "2"})
    name = unique("elastic")
    (bed.workdir / "out").mkdir(exist_ok=True)
    queued_job(
        bed,
        ns,
        name,
        3,
        elastic_trainer(bed, name),
        checkpoint={"dir": str(bed.workdir / "ckpt")},
        elastic={
            "minReplicas": 2,
            "shrinkAfterSeconds": 0,
            "grow": {"minIntervalSeconds": 5, "settleSeconds": 0, "checkpointTimeoutSeconds": 60},
        },
    )
    wait_for(
        "two ranks running",
        lambda: bed.kube.running(ns, name, 0, 2),
        90,
        on_timeout=lambda: diagnostics(bed, ns, name),
    )
    status = bed.kube.status(ns, name)
    assert status["gangSize"] == 2 and status["gangScheduling"] == "Kueue", status
    assert len(bed.kube.pods(ns, name, 0)) == 2
    wl = workload_of(bed, ns, f"{name}-a0")
    assert kq.admitted(wl) and wl["spec"]["podSets"][0]["count"] == 2, wl
    wait_for(
        "a committed checkpoint at 2 ranks",
        lambda: bed.kube.status(ns, name).get("lastCommittedCheckpoint"),
        120,
        on_timeout=lambda: diagnostics(bed, ns, name),
    )

    kq.apply(bed.kube, kq.cluster_queue(cq, {"cpu": "3"}, namespace=ns))
    grown = wait_for(
        "the job grown to 3 ranks, all running",
        lambda: (
            s
            if (s := bed.kube.status(ns, name)).get("gangSize") == 3
            and s.get("attempt", 0) >= 1
            and bed.kube.running(ns, name, s["attempt"], 3)
            else None
        ),
        180,
        on_timeout=lambda: diagnostics(bed, ns, name),
    )
    assert grown["failures"] == 0 and grown["preemptions"] == 0, grown
    causes = [i["cause"] for i in grown["interruptions"]]
    assert causes == ["Grow"], grown["interruptions"]
    sizes = [(r["attempt"], r["size"]) for r in grown["sizeHistory"]]
    assert sizes[0] == (0, 2) and sizes[-1] == (grown["attempt"], 3), sizes
    grown_wl = workload_of(bed, ns, f"{name}-a{grown['attempt']}")
    assert kq.admitted(grown_wl) and grown_wl["spec"]["podSets"][0]["count"] == 3, grown_wl
