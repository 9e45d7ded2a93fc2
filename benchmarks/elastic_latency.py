"""Elastic gangs on spot capacity: how fast a job shrinks and grows, and how much it trains.

    python benchmarks/elastic_latency.py --json OUT [--runs N] [--trace-seconds S]

On the local control plane (``hack/cluster/cluster.sh``, kwok nodes of 4 CPUs, ranks requesting
4 CPUs so one rank fills one node). Companion of ``operator_latency.py`` (same cluster access,
operator process and statistics).

* shrink: a 4-rank elastic job (``minReplicas: 2``, ``shrinkAfterSeconds: 0``) runs on 4 nodes;
  2 nodes are deleted. Measured: from just before the DELETEs to both pods of the 2-rank gang
  Running.
* grow: 2 nodes come back. Measured: from the node creations to all 4 pods of the next gang
  Running. kwok runs no trainer, so the benchmark plays rank 0's runtime in the progress
  annotation: a step past the resume point as soon as a gang is created (the operator asks no
  grow of a gang that has not trained since its resume, ``status.trainingSince``), and a fresh
  commit the moment a grow's notice appears (the time a real trainer needs for that checkpoint
  is its own save time, measured in ``benchmarks/checkpoint.py``). The nodes come back only once
  the operator has seen the shrunk gang train, so the figure is the grow of a gang that trains,
  not the wait for its first step.
* spot trace: the same scripted trace (4 nodes; 2 lost for half the trace; back) under a fixed
  4-rank job (the user's alternative: wait for capacity) and an elastic one, interleaved. The
  fraction of wall time during which a whole gang was Running is sampled every 0.1 s.

Each measurement is repeated ``--runs`` times (default 20): p50/p95/min/max in the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import interrupt  # first of the third-party imports: Ctrl-C during them ends quietly

sys.path.insert(0, str(Path(__file__).resolve().parent))

from operator_latency import (
    Bench,
    apply_crds,
    cluster_kubeconfig,
    log,
    start_operator,
    summary,
)

from rtj_operator.act.kube import KubeApi
from rtj_operator.api import names
from rtj_operator.api.timeutil import iso, utcnow
from tools.kubeapi import MERGE, POOL_LABEL, ApiError, Kube

CPU = "4"


def node(bench: Bench, name: str, pool: str) -> None:
    """A kwok node holding exactly one rank (not waited for: the grow is timed from here)."""
    bench.kube.make_node(name, pool, cpu=CPU, kwok=True)


def job(ns: str, name: str, pool: str, elastic: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": 4,
        "checkpoint": {"dir": "s3://bench"},
        "template": {
            "spec": {
                "nodeSelector": {POOL_LABEL: pool},
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "trainer",
                        "image": "registry.local/train:1",
                        "resources": {"requests": {"cpu": CPU}},
                    }
                ],
            }
        },
    }
    if elastic:
        spec["elastic"] = {
            "minReplicas": 2,
            "shrinkAfterSeconds": 0,
            "grow": {"minIntervalSeconds": 0},
        }
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def running_gang(bench: Bench, ns: str, name: str) -> tuple[int, int] | None:
    """(attempt, size) when every live pod of the current attempt runs, else None."""
    status = (bench.kube.req("GET", f"{KubeApi.job_path(ns, name)}").get("status")) or {}
    attempt, size = status.get("attempt"), status.get("gangSize")
    if attempt is None or not size or not status.get("gangCreated"):
        return None
    pods = bench.kube.req(
        "GET",
        f"/api/v1/namespaces/{ns}/pods",
        query={"labelSelector": f"{names.LABEL_JOB}={name},{names.LABEL_ATTEMPT}={attempt}"},
    )["items"]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    if len(live) == size and all(p["status"].get("phase") == "Running" for p in live):
        return attempt, size
    return None


class Runtime:
    """Plays rank 0's runtime in its progress annotation (kwok runs no trainer)."""

    def __init__(self) -> None:
        self.step = 100
        self.trained: set[int] = set()
        """Attempts whose rank 0 reported a step past its resume point."""

    def play(self, bench: Bench, ns: str, name: str) -> dict[str, Any]:
        """One look at the job: a new gang reports its first step after the resume (the runtime
        sends ``current_step`` alone before the attempt's first commit), a grow notice gets a
        fresh commit. Returns the job's status."""
        status = bench.kube.req("GET", KubeApi.job_path(ns, name)).get("status") or {}
        attempt = status.get("attempt")
        if attempt is None or not status.get("gangCreated"):
            return status
        if status.get("grow"):
            self.step += 10
            self._annotate(
                bench,
                ns,
                names.pod_name(name, attempt, 0),
                {
                    "checkpoint": f"ep0-ba{self.step}",
                    "uri": f"s3://bench/{name}/ep0-ba{self.step}",
                    "step": self.step,
                    "time": iso(utcnow()),
                    "current_step": self.step,
                },
            )
        elif attempt not in self.trained and "trainingSince" not in status:
            pod = names.pod_name(name, attempt, 0)
            if self._annotate(bench, ns, pod, {"current_step": self.step + 1}):
                self.trained.add(attempt)
        return status

    @staticmethod
    def _annotate(bench: Bench, ns: str, pod: str, report: dict[str, Any]) -> bool:
        report["reported_at"] = iso(utcnow())
        try:
            bench.kube.req(
                "PATCH",
                f"/api/v1/namespaces/{ns}/pods/{pod}",
                content_type=MERGE,
                body={"metadata": {"annotations": {"resumable.dev/progress": json.dumps(report)}}},
            )
        except ApiError as err:
            if not err.not_found:
                raise
            return False
        return True


def wait_gang(
    bench: Bench, ns: str, name: str, *, size: int, after: int, timeout: float, runtime: Runtime
) -> tuple[float, int]:
    """When a gang of ``size`` of an attempt after ``after`` runs, and that attempt."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gang = running_gang(bench, ns, name)
        if gang and gang[1] == size and gang[0] > after:
            return time.monotonic(), gang[0]
        runtime.play(bench, ns, name)
        time.sleep(0.02)
    raise TimeoutError(f"{name}: no running gang of {size} after attempt {after}")


def wait_training(bench: Bench, ns: str, name: str, runtime: Runtime, timeout: float) -> None:
    """Until the operator has seen the current gang train since its resume."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "trainingSince" in runtime.play(bench, ns, name):
            return
        time.sleep(0.02)
    raise TimeoutError(f"{name}: the operator never saw the gang train (status.trainingSince)")


def measure_resizes(bench: Bench, ns: str, runs: int) -> dict[str, list[float]]:
    """``runs`` shrink/grow cycles of one elastic job."""
    pool = f"el-{uuid.uuid4().hex[:6]}"
    nodes = [f"{pool}-{i}" for i in range(4)]
    for n in nodes:
        node(bench, n, pool)
    name = f"el-{uuid.uuid4().hex[:6]}"
    bench.kube.req("POST", KubeApi.job_path(ns), body=job(ns, name, pool, elastic=True))
    runtime = Runtime()
    _, attempt = wait_gang(bench, ns, name, size=4, after=-1, timeout=120, runtime=runtime)
    shrink, grow = [], []
    for run in range(runs):
        gone, nodes = nodes[2:], nodes[:2]
        start = time.monotonic()
        for n in gone:
            bench.kube.delete_node(n)
        done, attempt = wait_gang(
            bench, ns, name, size=2, after=attempt, timeout=120, runtime=runtime
        )
        shrink.append(done - start)
        wait_training(bench, ns, name, runtime, timeout=60)
        back = [f"{pool}-r{run}-{i}" for i in range(2)]
        start = time.monotonic()
        for n in back:
            node(bench, n, pool)
        done, attempt = wait_gang(
            bench, ns, name, size=4, after=attempt, timeout=120, runtime=runtime
        )
        grow.append(done - start)
        nodes += back
        log(f"run {run + 1}/{runs}: shrink {shrink[-1]:.2f}s grow {grow[-1]:.2f}s")
    for n in nodes:
        bench.kube.delete_node(n)
    return {"shrink": shrink, "grow": grow}


def spot_trace(bench: Bench, ns: str, elastic: bool, seconds: float) -> float:
    """Fraction of ``seconds`` a whole gang ran, with 2 of 4 nodes lost from 25% to 75%."""
    pool = f"tr-{uuid.uuid4().hex[:6]}"
    nodes = [f"{pool}-{i}" for i in range(4)]
    for n in nodes:
        node(bench, n, pool)
    name = f"tr-{'e' if elastic else 'f'}-{uuid.uuid4().hex[:6]}"
    bench.kube.req("POST", KubeApi.job_path(ns), body=job(ns, name, pool, elastic))
    runtime = Runtime()
    wait_gang(bench, ns, name, size=4, after=-1, timeout=120, runtime=runtime)
    start = time.monotonic()
    training = samples = 0
    lost = returned = False
    while (now := time.monotonic() - start) < seconds:
        if not lost and now >= seconds * 0.25:
            for n in nodes[2:]:
                bench.kube.delete_node(n)
            lost = True
        if not returned and now >= seconds * 0.75:
            nodes = nodes[:2] + [f"{pool}-back-{i}" for i in range(2)]
            for n in nodes[2:]:
                node(bench, n, pool)
            returned = True
        samples += 1
        training += running_gang(bench, ns, name) is not None
        runtime.play(bench, ns, name)
        time.sleep(0.1)
    bench.kube.req("DELETE", KubeApi.job_path(ns, name))
    for n in nodes:
        bench.kube.delete_node(n)
    return training / samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=20, help="resize cycles (default 20)")
    parser.add_argument("--traces", type=int, default=3, help="trace pairs (default 3)")
    parser.add_argument("--trace-seconds", type=float, default=40.0)
    parser.add_argument("--keep-cluster", action="store_true")
    args = parser.parse_args(argv)
    kubeconfig, plane = cluster_kubeconfig(args.keep_cluster)
    kube = Kube(kubeconfig)
    bench = Bench(kube, kubeconfig, uuid.uuid4().hex[:6])
    apply_crds(kube)
    ns = f"rtj-bench-el-{bench.tag}"
    kube.create_namespace(ns)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    operator = start_operator(bench.kubeconfig, "rtj-bench-el-*", args.json.with_suffix(".log"))
    try:
        time.sleep(3)
        resizes = measure_resizes(bench, ns, args.runs)
        fixed, elastic = [], []
        for i in range(args.traces):  # interleaved, so drift hits both the same
            fixed.append(spot_trace(bench, ns, False, args.trace_seconds))
            elastic.append(spot_trace(bench, ns, True, args.trace_seconds))
            log(f"trace {i + 1}: fixed {fixed[-1]:.2f}, elastic {elastic[-1]:.2f}")
    finally:
        operator.terminate()
        operator.wait(10)
        if plane is not None and not args.keep_cluster:
            plane.down()
    report = {
        "benchmark": "elastic_latency",
        "time": iso(utcnow()),
        "what": "seconds from 2 of 4 nodes deleted to the 2-rank gang Running (shrink, "
        "shrinkAfterSeconds 0) and from 2 nodes added to the 4-rank gang Running (grow, the "
        "requested checkpoint answered at once, the shrunk gang seen training before the nodes "
        "came back); fraction of a scripted spot trace (half of "
        "the capacity lost for the middle half) during which a whole gang ran",
        "shrink": {**summary(resizes["shrink"]), "min_s": round(min(resizes["shrink"]), 4)},
        "grow": {**summary(resizes["grow"]), "min_s": round(min(resizes["grow"]), 4)},
        "trace_seconds": args.trace_seconds,
        "training_fraction": {
            "fixed": summary(fixed),
            "elastic": summary(elastic),
        },
    }
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    s, g = report["shrink"], report["grow"]
    log(
        f"shrink p50 {s['p50_s']:.2f}s p95 {s['p95_s']:.2f}s; grow p50 {g['p50_s']:.2f}s "
        f"p95 {g['p95_s']:.2f}s; training fraction fixed "
        f"{report['training_fraction']['fixed']['p50_s']:.2f} vs elastic "
        f"{report['training_fraction']['elastic']['p50_s']:.2f}"
    )
    return 0


if __name__ == "__main__":
    interrupt.run(main)
