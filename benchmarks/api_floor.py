"""The API server's floor under a mass reclaim: the writes of the new gangs, with nothing decided.

``mass_reclaim.py`` times the operator's new gangs after many nodes go at once. Each hit job
needs at least its new pods created and its status written, on the same API server that is
also serving the scheduler, kwok and the watches. This issues exactly those writes for as many
jobs, all at once from ``concurrency`` threads, in a scratch namespace: per job ``replicas`` pod
POSTs (the pods name a scheduler that does not exist, so they stay Pending and cost no
scheduling) and one ConfigMap POST standing for the status write. No reads, no PodGroup, no
deletions of the old pods, no decisions: no controller of those gangs can be faster on this API
server, so a target below this floor cannot be met here (``docs/operator.md``).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tools.kubeapi import Kube
from tools.waiting import wait_for

NO_SCHEDULER = "rtj-bench-no-scheduler"
"""The pods' ``schedulerName``: none runs, so they stay Pending."""


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": NO_SCHEDULER,
            "containers": [{"name": "trainer", "image": "registry.local/train:1"}],
        },
    }


def measure(kube: Kube, ns: str, jobs: int, replicas: int, concurrency: int) -> list[float]:
    """Seconds from the start to each job's last write answered (one sample per job)."""
    kube.create_namespace(ns)
    writes: list[tuple[int, str, dict[str, Any]]] = []
    for job in range(jobs):
        for rank in range(replicas):
            writes.append((job, "pods", _pod(f"floor-{job:03d}-{rank}")))
        status = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"floor-{job:03d}"}}
        writes.append((job, "configmaps", status))
    started = time.monotonic()

    def write(item: tuple[int, str, dict[str, Any]]) -> tuple[int, float]:
        job, plural, body = item
        kube.request("POST", f"/api/v1/namespaces/{ns}/{plural}", body=body)
        return job, time.monotonic() - started

    done = [0.0] * jobs
    try:
        with ThreadPoolExecutor(concurrency) as pool:
            # Each answer's time is returned, and the job's last one taken here: updating a
            # shared maximum from the threads could keep an earlier answer's time.
            for job, answered in pool.map(write, writes):
                done[job] = max(done[job], answered)
    finally:
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
    return done
