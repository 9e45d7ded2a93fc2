"""Two operator replicas with kopf peering: the lower priority stands by, one gang is created."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

from tools.kubeapi import rtj, unique
from tools.waiting import wait_for

from .conftest import start_operator


def peering_namespace(kube) -> str:
    """A new namespace with the ``rtj-operator`` KopfPeering the replicas share."""
    ns = unique("rtj-peer")
    kube.create_namespace(ns)
    kube.apply(
        {
            "apiVersion": "kopf.dev/v1",
            "kind": "KopfPeering",
            "metadata": {"name": "rtj-operator", "namespace": ns},
        }
    )
    return ns


def test_two_replicas_one_active(kube, kubeconfig, pool, tmp_path):
    ns = peering_namespace(kube)
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
    ns = peering_namespace(kube)
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
        # The pass that created the pods is counted when it ends, after they may run already.
        wait_for("a reconcile counted", lambda: _reconciles(low.metrics) > 0, 10)
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


def _health(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (local URL)
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return 0, ""


def test_two_replicas_with_the_same_priority_fail_liveness_naming_the_tie(
    kube, kubeconfig, tmp_path
):
    """kopf pauses every replica of a priority tie, and both keep refreshing their records:
    without this, both stood by, healthy, and no job was ever served."""
    ns = peering_namespace(kube)
    args = ("--namespace", ns, "--priority", "10", "--max-pause-seconds", "3")
    one = start_operator(kubeconfig, tmp_path / "one.log", *args)
    two = start_operator(kubeconfig, tmp_path / "two.log", *args)
    try:
        wait_for(
            "liveness 500 naming the tie",
            lambda: (
                _health(one.liveness)[0] == 500
                and "has the same priority 10" in (tmp_path / "one.log").read_text()
            ),
            90,
            0.5,
            on_timeout=lambda: one.tail() + "\n---\n" + repr(_health(one.liveness)),
        )
    finally:
        one.stop()
        two.stop()
        kube.delete_namespace(ns)


def test_a_missing_peering_object_is_named_at_start_and_jobs_run_once_it_exists(
    kube, kubeconfig, pool, tmp_path
):
    """kopf handles nothing while its peering object is missing, and says nothing about it:
    the operator names the object and the fix at start, and reconciles once it exists."""
    ns = unique("rtj-nopeer")
    kube.create_namespace(ns)
    log = tmp_path / "operator.log"
    operator = start_operator(kubeconfig, log, "--namespace", ns)
    try:
        wait_for(
            "a warning naming the missing peering object",
            lambda: (
                "kopfpeerings/rtj-operator does not exist" in log.read_text()
                and "--standalone" in log.read_text()
            ),
            30,
            on_timeout=operator.tail,
        )
        kube.apply(
            {
                "apiVersion": "kopf.dev/v1",
                "kind": "KopfPeering",
                "metadata": {"name": "rtj-operator", "namespace": ns},
            }
        )
        pool.add(1)
        name = unique("job")
        kube.create_job(rtj(name, ns, pool.name, 1))
        wait_for(
            "attempt 0 running", lambda: kube.running(ns, name, 0, 1), 90, on_timeout=operator.tail
        )
        assert "kopfpeerings/rtj-operator exists now" in log.read_text()
    finally:
        operator.stop()
        kube.delete_namespace(ns)
