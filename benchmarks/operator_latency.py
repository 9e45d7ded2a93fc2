"""Preemption-to-resubmission latency of the operator, against the built-in Job controller.

    python benchmarks/operator_latency.py --json OUT [--quick] [--preemptions N] [--baseline N]
    python benchmarks/operator_latency.py --mass-reclaim --json OUT [--jobs 200] [--nodes 60]
        [--delete 10] [--rounds 3]   (benchmarks/mass_reclaim.py: many jobs hit at once)

On the local control plane (``hack/cluster/cluster.sh``; or the cluster named by KUBECONFIG):

* operator: a 4-rank ResumableTrainingJob on fake (kwok) nodes; N times, the node of one rank is
  deleted (a spot reclaim). Measured: from just before the node DELETE is sent to the moment a
  watch on the namespace has seen every pod of the next attempt created (ADDED events).
* baseline: what users have today. M single-pod batch/v1 Jobs, each pod on its own node; the
  nodes are deleted the same way and the Job controller's replacement pod is timed the same
  way. The Job controller acts only after PodGC has failed the orphaned pod, which is the point.

* restart: the operator with peering on is SIGKILLed (its peering record stays, as after a
  crash), a node of the gang is deleted, and the operator is started again; from the moment it
  is up (liveness answers; also reported from the process spawn) to the whole next gang
  created. Two identity schemes, interleaved, at one fixed priority: the stable identity the
  chart uses now (the pod name, 15 s record lifetime) and the baseline of a new identity per
  process with kopf's 60 s lifetime (what ran before), which waits for the dead record of the
  same priority to expire (with random priorities, as before, half the restarts wait).

The JSON holds every sample, p50/p95/max per side, their ratios, and whether the targets
(p50 <= 0.5 s, p95 <= 1 s) are met. Both sides are timed by the same watch code.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import interrupt  # first of the third-party imports: Ctrl-C during them ends quietly

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT))


from rtj_operator.api import names  # noqa: E402
from rtj_operator.api.timeutil import iso, utcnow  # noqa: E402
from tools.controlplane import ControlPlane  # noqa: E402
from tools.kubeapi import MERGE, Kube, rtj  # noqa: E402

REPLICAS = 4
TARGET_P50 = 0.5
TARGET_P95 = 1.0


def log(message: str) -> None:
    """Progress on stderr."""
    sys.stderr.write(f"[bench] {message}\n")
    sys.stderr.flush()


def percentile(samples: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100])."""
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(samples: list[float]) -> dict[str, Any]:
    """Statistics of one side."""
    return {
        "samples_s": [round(s, 4) for s in samples],
        "count": len(samples),
        "p50_s": round(percentile(samples, 50), 4),
        "p95_s": round(percentile(samples, 95), 4),
        "max_s": round(max(samples), 4) if samples else None,
        "mean_s": round(sum(samples) / len(samples), 4) if samples else None,
    }


def wait(what: str, check: Any, timeout: float, interval: float = 0.02) -> Any:
    """Poll until truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


class PodWatch(threading.Thread):
    """Records when each pod of a namespace is first seen (a watch's ADDED event), and when it
    was first seen carrying each attempt label (ADDED or MODIFIED: a pod that survivors keep is
    relabelled into the next attempt, not created)."""

    def __init__(self, api: Kube, namespace: str):
        super().__init__(daemon=True)
        self.api, self.namespace = api, namespace
        self.first_seen: dict[str, float] = {}
        self.in_attempt: dict[tuple[str, int], dict[str, float]] = {}
        self.ready = threading.Event()
        self.stopped = False

    def run(self) -> None:
        """Follow the watch, re-establishing it when the server ends it."""
        while not self.stopped:
            listed = self.api.request("GET", f"/api/v1/namespaces/{self.namespace}/pods")
            now = time.monotonic()
            for pod in listed.get("items", []):
                self.first_seen.setdefault(pod["metadata"]["name"], now)
                self._record_attempt(pod, now)
            version = listed["metadata"]["resourceVersion"]
            response = self.api.open_watch(
                f"/api/v1/namespaces/{self.namespace}/pods",
                {"resourceVersion": version},
                timeout_s=600,
                read_timeout_s=None,
            )
            self.ready.set()
            buffer = b""
            for chunk in response.stream(4096):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        now = time.monotonic()
                        if event["type"] == "ADDED":
                            self.first_seen.setdefault(event["object"]["metadata"]["name"], now)
                        self._record_attempt(event["object"], now)
                if self.stopped:
                    break
            response.release_conn()

    def _record_attempt(self, pod: dict[str, Any], now: float) -> None:
        labels = pod["metadata"].get("labels") or {}
        job, attempt = labels.get(names.LABEL_JOB), labels.get(names.LABEL_ATTEMPT)
        if job is not None and attempt is not None and not pod["metadata"].get("deletionTimestamp"):
            gang = self.in_attempt.setdefault((job, int(attempt)), {})
            gang.setdefault(pod["metadata"]["name"], now)

    def gang_seen(self, job: str, attempt: int, size: int) -> float | None:
        """When ``size`` pods had been seen carrying ``job``'s ``attempt`` label (created with it,
        or relabelled into it), once that many had."""
        times = sorted((self.in_attempt.get((job, attempt)) or {}).values())
        return times[size - 1] if len(times) >= size else None

    def seen_all(self, pods: list[str]) -> float | None:
        """When the last of ``pods`` was first seen, once all were."""
        times = [self.first_seen.get(p) for p in pods]
        return max(times) if all(t is not None for t in times) else None  # type: ignore[type-var]


@dataclass(frozen=True)
class Bench:
    """The cluster the benchmark runs on: the one client of tools and tests (``tools/kubeapi``),
    its kubeconfig (for the operator processes) and a tag that keeps this run's names apart."""

    kube: Kube
    kubeconfig: str
    tag: str

    def add_node(self, name: str, pool: str, *, kwok: bool) -> None:
        """A fake node of 64 CPUs in ``pool`` (kwok plays its kubelet when ``kwok``), once Ready."""
        self.kube.make_node(name, pool, cpu="64", kwok=kwok)
        wait(f"{name} ready", lambda: self.kube.node_ready(name), 60)

    def submit_job(self, ns: str, pool: str) -> str:
        """A ``REPLICAS``-rank ResumableTrainingJob pinned to ``pool``; returns its name."""
        self.kube.create_job(rtj("bench", ns, pool, REPLICAS))
        return "bench"


def apply_crds(kube: Kube) -> None:
    """Install the project's CRDs (create or replace), then give the API server time to serve
    them."""
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        kube.apply_file(path)
    time.sleep(2)


def start_operator(
    kubeconfig: str,
    namespaces: str,
    log_path: Path,
    *peering: str,
    quiet: bool = True,
    profile: Path | None = None,
) -> subprocess.Popen[bytes]:
    """The operator as it runs in production (a separate process); standalone unless
    ``peering`` arguments are given; warnings only when ``quiet`` (the chart's default logs
    at INFO); under cProfile, its stats written to ``profile`` at exit, when given."""
    env = {
        **os.environ,
        "KUBECONFIG": kubeconfig,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")]),
    }
    handle = log_path.open("ab")
    return subprocess.Popen(
        [
            sys.executable,
            *(("-m", "cProfile", "-o", str(profile)) if profile else ()),
            "-m",
            "rtj_operator",
            "--namespace",
            namespaces,
            *(peering or ("--standalone",)),
            *(("--quiet",) if quiet else ()),
            "--metrics-port",
            "0",
        ],
        env=env,
        stdout=handle,
        stderr=subprocess.STDOUT,
    )


def clean_up(
    bench: Bench, operator: subprocess.Popen[bytes] | None, nodes: list[str], ns: str
) -> None:
    """Stop the operator (SIGTERM, then SIGKILL after 15 s), delete the nodes and the namespace."""
    if operator is not None:
        operator.terminate()
        try:
            operator.wait(15)
        except subprocess.TimeoutExpired:
            operator.kill()
    for node in nodes:
        bench.kube.delete_node(node)
    bench.kube.delete_namespace(ns)


def measure_operator(bench: Bench, preemptions: int, log_path: Path) -> list[float]:
    """N node deletions under a 4-rank job; seconds until the next gang was fully created."""
    ns = f"rtj-bench-op-{bench.tag}"
    pool = f"op-{bench.tag}"
    kube = bench.kube
    kube.create_namespace(ns)
    operator = start_operator(bench.kubeconfig, "rtj-bench-op-*", log_path)
    watch = PodWatch(kube, ns)
    watch.start()
    watch.ready.wait(10)
    for index in range(REPLICAS):
        bench.add_node(f"{pool}-{index}", pool, kwok=True)
    job = bench.submit_job(ns, pool)
    samples: list[float] = []
    serial = REPLICAS
    try:
        for attempt in range(preemptions + 1):
            gang = [names.pod_name(job, attempt, r) for r in range(REPLICAS)]
            wait(
                f"attempt {attempt} running",
                lambda g=gang: all(
                    (p := kube.pod(ns, n)) and p["status"].get("phase") == "Running" for n in g
                ),
                90,
            )
            if attempt == preemptions:
                break
            time.sleep(0.3)
            victim = kube.pod(ns, gang[attempt % REPLICAS])["spec"]["nodeName"]  # type: ignore[index]
            following = [names.pod_name(job, attempt + 1, r) for r in range(REPLICAS)]
            started = time.monotonic()
            kube.delete_node(victim)
            done = wait(
                f"attempt {attempt + 1} created",
                lambda f=following: watch.seen_all(f),
                30,
                interval=0.002,
            )
            samples.append(done - started)
            log(f"preemption {attempt + 1}/{preemptions}: {samples[-1] * 1000:.0f} ms")
            bench.add_node(f"{pool}-{serial}", pool, kwok=True)
            serial += 1
    finally:
        watch.stopped = True
        clean_up(bench, operator, [f"{pool}-{index}" for index in range(serial)], ns)
    return samples


RESTART_PRIORITY = "100"
"""Both variants keep one priority, so a dead record of another identity always blocks (kopf
pauses for a peer of the same priority); with random priorities it blocks half the time."""
RESTART_VARIANTS = {
    # What the chart runs now: the pod name as a stable identity, 15 s record lifetime.
    "stable_id": lambda: ("--id", "rtj-operator-bench-pod", "--peering-lifetime", "15"),
    # Before: kopf's default, a new identity per process and 60 s lifetime.
    "new_id": lambda: (
        "--id",
        f"rtj-operator@bench/{uuid.uuid4().hex[:6]}",
        "--peering-lifetime",
        "60",
    ),
}


def measure_restarts(bench: Bench, restarts: int, log_path: Path) -> dict[str, list[float]]:
    """Operator restart -> first action, with peering on, both identity schemes interleaved.

    Each sample: the operator runs a 4-rank job; it is SIGKILLed (its peering record stays
    behind, as after a crash); a node of the gang is deleted while no operator runs; the operator
    is started again with the same identity scheme. Measured: from that start (process spawn,
    so Python and kopf start-up count) to the watch seeing every pod of the next attempt.
    """
    ns = f"rtj-bench-rs-{bench.tag}"
    pool = f"rs-{bench.tag}"
    kube = bench.kube
    kube.create_namespace(ns)
    for variant in RESTART_VARIANTS:
        kube.req(
            "POST",
            f"/apis/kopf.dev/v1/namespaces/{ns}/kopfpeerings",
            body={
                "apiVersion": "kopf.dev/v1",
                "kind": "KopfPeering",
                "metadata": {"name": f"bench-{variant.replace('_', '-')}", "namespace": ns},
            },
        )
    watch = PodWatch(kube, ns)
    watch.start()
    watch.ready.wait(10)
    serial = 0

    def add_node() -> None:
        nonlocal serial
        bench.add_node(f"{pool}-{serial}", pool, kwok=True)
        serial += 1

    for _ in range(REPLICAS):
        add_node()
    job = bench.submit_job(ns, pool)
    samples: dict[str, list[float]] = {v: [] for v in RESTART_VARIANTS}
    samples.update({f"{v}_from_up": [] for v in RESTART_VARIANTS})
    operator: subprocess.Popen[bytes] | None = None
    health = "http://127.0.0.1:18431/healthz"

    def spawn(variant: str) -> subprocess.Popen[bytes]:
        return start_operator(
            bench.kubeconfig,
            ns,
            log_path,
            "--peering",
            f"bench-{variant.replace('_', '-')}",
            "--priority",
            RESTART_PRIORITY,
            "--liveness",
            health,
            *RESTART_VARIANTS[variant](),
        )

    def up() -> bool:
        try:
            with urllib.request.urlopen(health, timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def gang_running(attempt: int) -> bool:
        gang = [names.pod_name(job, attempt, r) for r in range(REPLICAS)]
        return all((p := kube.pod(ns, n)) and p["status"].get("phase") == "Running" for n in gang)

    attempt = 0
    try:
        for index in range(2 * restarts):
            variant = list(RESTART_VARIANTS)[index % 2]
            # A fresh, unhindered operator of this variant (a graceful exit leaves no record).
            if operator is not None:
                operator.terminate()
                operator.wait(30)
            for name in RESTART_VARIANTS:
                path = (
                    f"/apis/kopf.dev/v1/namespaces/{ns}/kopfpeerings/bench-{name.replace('_', '-')}"
                )
                current = kube.req("GET", path).get("status") or {}
                if current:
                    kube.req(
                        "PATCH", path, content_type=MERGE, body={"status": dict.fromkeys(current)}
                    )
            operator = spawn(variant)
            wait(f"attempt {attempt} running", lambda a=attempt: gang_running(a), 120)
            time.sleep(3.0)  # its peering record is written and refreshed
            operator.kill()
            operator.wait(10)
            victim = kube.pod(ns, names.pod_name(job, attempt, attempt % REPLICAS))["spec"][
                "nodeName"
            ]  # type: ignore[index]
            kube.delete_node(victim)
            add_node()
            following = [names.pod_name(job, attempt + 1, r) for r in range(REPLICAS)]
            started = time.monotonic()
            operator = spawn(variant)
            wait("operator up", up, 120, 0.02)
            ready = time.monotonic()
            done = wait(
                f"attempt {attempt + 1} created", lambda f=following: watch.seen_all(f), 120, 0.005
            )
            samples[variant].append(done - started)
            samples[f"{variant}_from_up"].append(done - ready)
            log(
                f"restart {index + 1}/{2 * restarts} ({variant}): {done - started:.2f} s from "
                f"spawn, {done - ready:.2f} s from up"
            )
            attempt += 1
    finally:
        watch.stopped = True
        clean_up(bench, operator, [f"{pool}-{index}" for index in range(serial)], ns)
    return samples


def measure_job_controller(bench: Bench, count: int) -> list[float]:
    """M single-pod Jobs whose node is deleted; seconds until the replacement pod exists."""
    ns = f"rtj-bench-jobs-{bench.tag}"
    pool = f"jc-{bench.tag}"
    kube = bench.kube
    kube.create_namespace(ns)
    watch = PodWatch(kube, ns)
    watch.start()
    watch.ready.wait(10)
    nodes = [f"{pool}-{i}" for i in range(count)]
    try:
        for node in nodes:
            bench.add_node(node, pool, kwok=False)
        first: dict[str, str] = {}
        for index, node in enumerate(nodes):
            kube.req(
                "POST",
                f"/apis/batch/v1/namespaces/{ns}/jobs",
                body={
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": f"baseline-{index}"},
                    "spec": {
                        "parallelism": 1,
                        "completions": 1,
                        "backoffLimit": 100,
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "terminationGracePeriodSeconds": 1,
                                "nodeSelector": {"kubernetes.io/hostname": node},
                                "containers": [{"name": "trainer", "image": "x"}],
                            }
                        },
                    },
                },
            )
        for index, node in enumerate(nodes):
            selector = f"job-name=baseline-{index}"

            def bound(sel: str = selector, n: str = node) -> str | None:
                items = kube.req(
                    "GET", f"/api/v1/namespaces/{ns}/pods", query={"labelSelector": sel}
                )["items"]
                hits = [p for p in items if p["spec"].get("nodeName") == n]
                return hits[0]["metadata"]["name"] if hits else None

            first[node] = wait(f"baseline pod on {node}", bound, 60)
            now = iso(utcnow())
            # The kubelet's report that the container runs (no kubelet runs these nodes).
            kube.req(
                "PATCH",
                f"/api/v1/namespaces/{ns}/pods/{first[node]}/status",
                content_type=MERGE,
                body={
                    "status": {
                        "phase": "Running",
                        "startTime": now,
                        "conditions": [
                            {"type": "Ready", "status": "True", "lastTransitionTime": now}
                        ],
                        "containerStatuses": [
                            {
                                "name": "trainer",
                                "image": "x",
                                "imageID": "",
                                "ready": True,
                                "restartCount": 0,
                                "started": True,
                                "state": {"running": {"startedAt": now}},
                            }
                        ],
                    }
                },
            )
        started: dict[str, float] = {}
        for node in nodes:
            started[node] = time.monotonic()
            kube.delete_node(node)
        samples: list[float] = []
        for index, node in enumerate(nodes):
            prefix = f"baseline-{index}-"

            def replaced(p: str = prefix, old: str = first[node]) -> float | None:
                times = [t for n, t in watch.first_seen.items() if n.startswith(p) and n != old]
                return min(times) if times else None

            done = wait(f"replacement of {first[node]}", replaced, 300, interval=0.05)
            samples.append(done - started[node])
            log(f"job controller {index + 1}/{count}: {samples[-1]:.1f} s")
        return samples
    finally:
        watch.stopped = True
        clean_up(bench, None, nodes, ns)


def cluster_kubeconfig(keep: bool) -> tuple[str, ControlPlane | None]:
    """KUBECONFIG to use, and the local control plane this run brought up (to take it down)."""
    if os.environ.get("KUBECONFIG"):
        return os.environ["KUBECONFIG"], None
    plane = ControlPlane(os.environ.get("RTJ_CLUSTER_NAME", "rtj-bench"), keep=keep)
    log("bringing up the local control plane (hack/cluster/cluster.sh up)")
    return plane.up(nodes=0), plane


@dataclass
class Session:
    """A benchmark's cluster, client and operator log, as ``open_session`` sets them up."""

    bench: Bench
    plane: ControlPlane | None
    version: str | None
    log_path: Path


def open_session(keep_cluster: bool, json_path: Path) -> Session:
    """The cluster (brought up here unless KUBECONFIG names one), the CRDs applied, and the
    operator's log file beside ``json_path``."""
    kubeconfig, plane = cluster_kubeconfig(keep_cluster)
    kube = Kube(kubeconfig)
    bench = Bench(kube, kubeconfig, uuid.uuid4().hex[:6])
    version = kube.req("GET", "/version").get("gitVersion")
    apply_crds(kube)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    return Session(bench, plane, version, json_path.with_suffix(".operator.log"))


def main(argv: list[str] | None = None) -> int:
    """Run both measurements and write the JSON report."""
    args_given = sys.argv[1:] if argv is None else argv
    if "--mass-reclaim" in args_given:  # many jobs, many nodes at once: its own module
        import mass_reclaim  # noqa: PLC0415 (it imports this module)

        return mass_reclaim.main([a for a in args_given if a != "--mass-reclaim"])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, required=True, help="where to write the results")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer samples (10 preemptions, 3 Job-controller samples)",
    )
    parser.add_argument("--preemptions", type=int, default=None, help="default 30 (quick: 10)")
    parser.add_argument("--baseline", type=int, default=None, help="default 10 (quick: 3)")
    parser.add_argument(
        "--restarts",
        type=int,
        default=None,
        help="restarts per identity scheme, default 8 (quick: 3)",
    )
    parser.add_argument(
        "--keep-cluster", action="store_true", help="leave a cluster this run started"
    )
    args = parser.parse_args(argv)
    preemptions = args.preemptions or (10 if args.quick else 30)
    baseline = args.baseline or (3 if args.quick else 10)
    restarts = args.restarts or (3 if args.quick else 8)

    session = open_session(args.keep_cluster, args.json)
    version = session.version
    bench, plane, log_path = session.bench, session.plane, session.log_path
    try:
        log(f"operator: {preemptions} preemptions of a {REPLICAS}-rank job")
        operator = measure_operator(bench, preemptions, log_path)
        log(f"job controller: {baseline} pods lost the same way (runs in parallel)")
        job_controller = measure_job_controller(bench, baseline)
        log(f"operator restarts: {restarts} per identity scheme, interleaved")
        restart = measure_restarts(bench, restarts, log_path)
    finally:
        if plane is not None:
            plane.down()
    op, jc = summary(operator), summary(job_controller)
    stable, fresh = summary(restart["stable_id_from_up"]), summary(restart["new_id_from_up"])
    report = {
        "benchmark": "operator_latency",
        "time": iso(utcnow()),
        "quick": args.quick,
        "what": "seconds from a node DELETE to the whole replacement gang (operator) or the "
        "replacement pod (Job controller) being created, as seen by a pod watch",
        "cluster": {"server": version, "replicas": REPLICAS},
        "host": {
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
            "python": platform.python_version(),
        },
        "operator": op,
        "job_controller": jc,
        "ratio_p50": round(jc["p50_s"] / op["p50_s"], 1) if op["p50_s"] else None,
        "ratio_p95": round(jc["p95_s"] / op["p95_s"], 1) if op["p95_s"] else None,
        "restart_to_first_action": {
            "what": "seconds from the operator restarted after a SIGKILL being up (liveness "
            "answers; peering on, same priority, a node of the gang deleted meanwhile) to the "
            "watch seeing the whole next gang",
            "stable_id": stable,
            "new_id_kopf_default_lifetime": fresh,
            "from_spawn": {
                "stable_id": summary(restart["stable_id"]),
                "new_id_kopf_default_lifetime": summary(restart["new_id"]),
            },
            "ratio_p50": round(fresh["p50_s"] / stable["p50_s"], 1) if stable["p50_s"] else None,
            "ratio_p95": round(fresh["p95_s"] / stable["p95_s"], 1) if stable["p95_s"] else None,
        },
        "targets": {
            "p50_s": TARGET_P50,
            "p95_s": TARGET_P95,
            "met": op["p50_s"] <= TARGET_P50 and op["p95_s"] <= TARGET_P95,
        },
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    log(
        f"operator p50 {op['p50_s'] * 1000:.0f} ms, p95 {op['p95_s'] * 1000:.0f} ms; "
        f"job controller p50 {jc['p50_s']:.1f} s, p95 {jc['p95_s']:.1f} s; "
        f"ratio p50 {report['ratio_p50']}x; targets met: {report['targets']['met']}"
    )
    log(
        f"restart -> first action: stable id p50 {stable['p50_s']:.2f} s, p95 "
        f"{stable['p95_s']:.2f} s, max {stable['max_s']:.2f} s; new id p50 {fresh['p50_s']:.2f} s,"
        f" p95 {fresh['p95_s']:.2f} s, max {fresh['max_s']:.2f} s"
    )
    return 0


if __name__ == "__main__":
    interrupt.run(main)
