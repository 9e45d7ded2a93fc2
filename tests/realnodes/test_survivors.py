"""Survivors stay on real nodes: one rank of a 2-rank job is evicted, the other pod stays.

The job (the job story's trainer, ``recovery.survivors: Stay``, 2 ranks) runs on node 1, both
pods there (it runs before the tests that lose nodes: conftest.py). One rank's pod is evicted
through the Eviction API, a preemption; the operator keeps the other pod (same uid, never
restarted), relabels it into the next attempt, writes its membership annotation (the kubelet
refreshes the downward-API file), and creates one pod. The kept pod's agent restarts its worker
in place, the new gang meets at the kept pod's DNS name through CoreDNS, resumes from the last
commit, and the job Succeeds with one preemption and no failure. What the user sees is read
with kubectl. (The node-loss case runs on the pod-runner cluster, tests/e2e: of the three real
nodes only nodes 1 and 3 hold the runtime image, and the job story loses node 3.)
"""

from __future__ import annotations

import json

from tools.realnodes import operator_release
from tools.stories.realnodes import JOB, job_manifest, shared_folder
from tools.waiting import wait_for
from trainer_runtime.events import read_events

from .conftest import RealCluster


def test_an_evicted_rank_is_replaced_and_the_other_pod_stays(
    real_cluster: RealCluster, ns: str
) -> None:
    k = real_cluster.kubectl_run
    node = real_cluster.node(real_cluster.runtime_nodes[0])
    with shared_folder(ns) as shared:
        manifest = job_manifest(ns, real_cluster.images["runtime"], shared, [node])
        manifest["spec"]["replicas"] = 2
        manifest["spec"]["recovery"] = {"survivors": "Stay"}

        def status() -> dict:
            return (real_cluster.get("resumabletrainingjob", JOB, ns) or {}).get("status") or {}

        def pods() -> dict[str, dict]:
            out = k("get", "pods", "-n", ns, "-l", f"resumable.dev/job-name={JOB}", "-o", "json")
            return {p["metadata"]["name"]: p for p in json.loads(out.stdout)["items"]}

        with operator_release(real_cluster, ns, node=real_cluster.steady_node):
            real_cluster.apply(manifest)
            wait_for(
                "a first commit",
                lambda: (status().get("lastCommittedCheckpoint") or {}).get("step"),
                300,
                interval=2,
            )
            first = pods()
            kept, evicted = f"{JOB}-a0-r0", f"{JOB}-a0-r1"
            eviction = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": evicted, "namespace": ns},
            }
            k(
                "create",
                "--raw",
                f"/api/v1/namespaces/{ns}/pods/{evicted}/eviction",
                "-f",
                "-",
                stdin=json.dumps(eviction),
            )
            wait_for(
                "the job to end",
                lambda: status().get("phase") in ("Succeeded", "Failed"),
                420,
                interval=2,
            )
            st = status()
            logs = k("logs", kept, "-n", ns, check=False).stdout
            assert st.get("phase") == "Succeeded", (st, logs[-3000:])
            assert st["preemptions"] == 1 and st["failures"] == 0, st
            assert st["keptPods"] == [kept], st
            now = pods()
            assert now[kept]["metadata"]["uid"] == first[kept]["metadata"]["uid"]
            assert now[kept]["metadata"]["labels"]["resumable.dev/attempt"] == "1"
            restarts = now[kept]["status"]["containerStatuses"][0].get("restartCount", 0)
            assert restarts == 0, now[kept]["status"]
            membership = read_events(logs, "membership")
            assert [e["epoch"] for e in membership] == [1], logs[-3000:]
            resumed = [e for e in read_events(logs, "resumed")]
            assert resumed, logs[-3000:]
