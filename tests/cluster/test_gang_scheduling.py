"""All-or-nothing scheduling on the real control plane: what a queue name does without Kueue.

The local control plane serves the PodGroup API (hack/cluster/cluster.sh) and has no Kueue.
"""

from __future__ import annotations

import time

from tools.waiting import wait_for

from .kubeclient import rtj, unique
from .scenario import wait_events, wait_phase


def test_a_queue_name_without_kueue_is_gang_scheduled_natively_and_says_so(
    kube, ns, pool, operator
):
    """Before: the pods got Kueue's labels, nothing gated them (no Kueue), three of four
    ranks bound and ran on the three nodes there were, no event said why, and status said
    gangScheduling Kueue."""
    pool.add(3, cpu="4")
    name = unique("queued")
    template = {
        "containers": [{"name": "trainer", "image": "x", "resources": {"requests": {"cpu": "4"}}}]
    }
    kube.create_job(rtj(name, ns, pool.name, 4, queueName="team-a", template_spec=template))
    wait_events(kube, ns, name, {"QueueNotServed"})
    warning = next(e for e in kube.events(ns, name) if e["reason"] == "QueueNotServed")
    assert warning["type"] == "Warning"
    assert "spec.queueName team-a" in warning["message"] and "kueue.x-k8s.io" in warning["message"]
    assert kube.status(ns, name)["gangScheduling"] == "PodGroup"
    pods = wait_for("4 pods", lambda: p if len(p := kube.pods(ns, name, 0)) == 4 else None, 20)
    for pod in pods:
        assert not any(k.startswith("kueue.x-k8s.io/") for k in pod["metadata"]["labels"])
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": f"{name}-a0"}
    time.sleep(3)  # the scheduler has had its chance: all-or-nothing binds none of the 4
    assert not [p["metadata"]["name"] for p in kube.pods(ns, name, 0) if p["spec"].get("nodeName")]

    pool.add(1, cpu="4")
    wait_phase(kube, ns, name, "Running", 30, op=operator)
