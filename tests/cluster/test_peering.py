"""Two operator replicas with kopf peering: the lower priority stands by, one gang is created."""

from __future__ import annotations

import time
import urllib.request

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


def _reconciles(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=5) as response:  # noqa: S310 (local URL)
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("rtj_reconcile_seconds_count"):
            return float(line.split()[-1])
    return 0.0


def test_a_replica_paused_by_a_higher_priority_one_stops_reconciling(
    kube, kubeconfig, pool, tmp_path
):
    """The active replica that a higher-priority one pauses (a rolling update, a new standby
    with a higher priority) must stop acting, timers included: its node cache stops being
    updated while kopf pauses its watches, so a decision it took from it could end a healthy
    gang."""
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
    low = start_operator(
        kubeconfig, low_log, "--namespace", ns, "--priority", "10", "--resync-seconds", "1"
    )
    high = None
    try:
        pool.add(2)
        name = unique("job")
        kube.create_job(rtj(name, ns, pool.name, 2))
        wait_for("attempt 0 running", lambda: kube.running(ns, name, 0, 2), 60, on_timeout=low.tail)
        assert _reconciles(low.metrics) > 0
        high = start_operator(kubeconfig, high_log, "--namespace", ns, "--priority", "20")
        wait_for(
            "the low-priority replica to pause",
            lambda: "Pausing" in low_log.read_text(),
            30,
            on_timeout=lambda: low.tail() + "\n---\n" + high.tail(),
        )
        time.sleep(2)  # a reconcile in flight at the pause ends
        before = _reconciles(low.metrics)
        time.sleep(5)  # five of its resync periods
        assert _reconciles(low.metrics) == before, low.tail()
    finally:
        low.stop()
        if high is not None:
            high.stop()
        kube.delete_namespace(ns)
