"""Two operator replicas with kopf peering: the lower priority stands by, one gang is created."""

from __future__ import annotations

import time

from tools.waiting import wait_for

from .conftest import start_operator
from .kubeclient import rtj, unique


def test_two_replicas_one_active(kube, kubeconfig, pool, tmp_path):
    ns = unique("rtj-peer")
    kube.create_namespace(ns)
    kube.apply(
        {
            "apiVersion": "kopf.dev/v1",
            "kind": "KopfPeering",
            "metadata": {"name": "rtj-operator", "namespace": ns},
        }
    )
    low_log, high_log = tmp_path / "low.log", tmp_path / "high.log"
    low = start_operator(kubeconfig, low_log, "--namespace", ns, "--priority", "10")
    high = start_operator(kubeconfig, high_log, "--namespace", ns, "--priority", "20")
    try:
        wait_for(
            "the low-priority replica to pause",
            lambda: "Pausing" in low_log.read_text(),
            30,
            on_timeout=lambda: low.tail() + "\n---\n" + high.tail(),
        )
        pool.add(2)
        name = unique("job")
        kube.create_job(rtj(name, ns, pool.name, 2))
        wait_for(
            "attempt 0 running", lambda: kube.running(ns, name, 0, 2), 60, on_timeout=high.tail
        )
        time.sleep(1)
        assert len(kube.pods(ns, name)) == 2
        assert kube.status(ns, name)["attempt"] == 0
        assert name in high_log.read_text() and name not in low_log.read_text()
    finally:
        low.stop()
        high.stop()
        kube.delete_namespace(ns)
