"""The API server's floor under a mass reclaim: the writes of the new gangs, with nothing decided.

``mass_reclaim.py`` times the operator's new gangs after many nodes go at once. Each hit job
needs at least its new pods created and its status written, on the same API server that is
also serving the scheduler, kwok and the watches. This issues exactly those writes for as many
jobs, all at once from ``concurrency`` threads, in a scratch namespace, in one of two ways:

* ``measure`` (writes only): per job ``replicas`` pod POSTs (the pods name a scheduler that does
  not exist, so they stay Pending and cost no scheduling) and one ConfigMap POST standing for
  the status write. No reads, no PodGroup, no deletions, nothing for the cluster to react to.
* ``measure_reacting`` (with the cluster's reaction): each job first has a gang of ``replicas``
  pods running on the benchmark's kwok nodes; then, all at once, per job: the old gang's pods
  deleted, the new gang's pods created (the scheduler binds them and kwok runs them, as it does
  the operator's), and the ConfigMap. What a controller that knew every answer in advance
  would make the cluster do, without the lost nodes themselves.

Both take ``lost``, each job's count of lost ranks, for gangs whose survivors stay: then only
that many pods per job are deleted and created, and each of the others gets one PATCH (its
attempt label and a membership-sized annotation), as the operator relabels a kept pod. The kept
pods exist before the timing starts (Pending in the first way, running in the second).

No controller of those gangs can be faster on this API server than the first; none can make the
cluster do the work of a resubmission faster than the second (``docs/operator.md``).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tools.kubeapi import JSON, MERGE, Kube
from tools.kubestandins import POOL_LABEL
from tools.waiting import wait_for

NO_SCHEDULER = "rtj-bench-no-scheduler"
"""The pods' ``schedulerName``: none runs, so they stay Pending."""


def _pod(name: str, pool: str | None = None) -> dict[str, Any]:
    """A pod that stays Pending, or (``pool``) one the scheduler binds to the pool's nodes."""
    spec: dict[str, Any] = {"containers": [{"name": "trainer", "image": "registry.local/train:1"}]}
    if pool is None:
        spec["schedulerName"] = NO_SCHEDULER
    else:
        spec["nodeSelector"] = {POOL_LABEL: pool}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


Write = tuple[int, str, str, dict[str, Any] | None]
"""(job, method, path, body) of one request."""

RELABEL = {
    "metadata": {
        "labels": {"floor-attempt": "1"},
        "annotations": {"floor-membership": "x" * 300},
    }
}
"""A kept pod's relabel: about the size of the operator's (attempt label, membership)."""


def _gang_writes(
    ns: str, job: int, ranks: range, pool: str | None, attempt: int = 1
) -> list[Write]:
    """The new gang's pods of ``ranks`` and the status-sized ConfigMap of one job."""
    pods = f"/api/v1/namespaces/{ns}/pods"
    writes: list[Write] = [
        (job, "POST", pods, _pod(f"floor-{job:03d}-a{attempt}-{r}", pool)) for r in ranks
    ]
    status = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"floor-{job:03d}"}}
    writes.append((job, "POST", f"/api/v1/namespaces/{ns}/configmaps", status))
    return writes


def _relabels(ns: str, job: int, ranks: range) -> list[Write]:
    """One PATCH per kept pod (of attempt 0) of ``ranks``."""
    return [
        (job, "PATCH", f"/api/v1/namespaces/{ns}/pods/floor-{job:03d}-a0-{r}", RELABEL)
        for r in ranks
    ]


def _old_pods(ns: str, replicas: int, pool: str | None, first: list[int]) -> list[Write]:
    """Each job's attempt-0 pods from rank ``first[job]`` on (created before the timing)."""
    return [
        w
        for job, rank in enumerate(first)
        for w in _gang_writes(ns, job, range(rank, replicas), pool, attempt=0)
        if w[3] and w[3]["kind"] == "Pod"
    ]


def _issue(kube: Kube, writes: list[Write], jobs: int, concurrency: int) -> list[float]:
    """Issue ``writes`` all at once; seconds from the start to each job's last answer."""
    started = time.monotonic()

    def write(item: Write) -> tuple[int, float]:
        job, method, path, body = item
        kube.request(method, path, body=body, content_type=MERGE if method == "PATCH" else JSON)
        return job, time.monotonic() - started

    done = [0.0] * jobs
    with ThreadPoolExecutor(concurrency) as pool:
        # Each answer's time is returned, and the job's last one taken here: updating a shared
        # maximum from the threads could keep an earlier answer's time.
        for job, answered in pool.map(write, writes):
            done[job] = max(done[job], answered)
    return done


def measure(
    kube: Kube,
    ns: str,
    jobs: int,
    replicas: int,
    concurrency: int,
    *,
    lost: list[int] | None = None,
) -> list[float]:
    """Writes only: seconds from the start to each job's last write answered."""
    lost = lost or [replicas] * jobs
    kube.create_namespace(ns)
    try:
        _issue(kube, _old_pods(ns, replicas, None, lost), jobs, concurrency)
        writes: list[Write] = []
        for job in range(jobs):
            writes += _relabels(ns, job, range(lost[job], replicas))
            writes += _gang_writes(ns, job, range(lost[job]), None)
        return _issue(kube, writes, jobs, concurrency)
    finally:
        _remove(kube, ns)


def measure_reacting(
    kube: Kube,
    ns: str,
    jobs: int,
    replicas: int,
    concurrency: int,
    *,
    pool: str,
    lost: list[int] | None = None,
) -> list[float]:
    """With the cluster's reaction: seconds from the start to each job's last write answered
    (its lost ranks' pods deleted and created anew, its kept pods relabelled, its ConfigMap)."""
    lost = lost or [replicas] * jobs
    kube.create_namespace(ns)
    try:
        _issue(kube, _old_pods(ns, replicas, pool, [0] * jobs), jobs, concurrency)
        wait_for(
            f"{jobs * replicas} floor pods running",
            lambda: _running(kube, ns) == jobs * replicas,
            600,
            interval=1.0,
        )
        writes: list[Write] = []
        for job in range(jobs):
            writes += [
                (job, "DELETE", f"/api/v1/namespaces/{ns}/pods/floor-{job:03d}-a0-{r}", None)
                for r in range(lost[job])
            ]
            writes += _relabels(ns, job, range(lost[job], replicas))
            writes += _gang_writes(ns, job, range(lost[job]), pool)
        return _issue(kube, writes, jobs, concurrency)
    finally:
        _remove(kube, ns)


def _running(kube: Kube, ns: str) -> int:
    items = kube.req("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
    return sum(1 for p in items if (p.get("status") or {}).get("phase") == "Running")


def _remove(kube: Kube, ns: str) -> None:
    """Delete the scratch namespace and wait until it is gone."""
    try:
        kube.req("DELETE", f"/api/v1/namespaces/{ns}/pods", query={"gracePeriodSeconds": "0"})
    finally:
        kube.delete_namespace(ns)
        # Gone before the caller goes on: its deletion would load the next measurement.
        wait_for(
            f"namespace {ns} gone",
            lambda: kube.get(f"/api/v1/namespaces/{ns}") is None,
            600,
            interval=1.0,
        )
