"""The operator killed at the worst moments never duplicates a gang nor loses a job."""

from __future__ import annotations

import random
import signal
import time

import pytest

from tools.kubeapi import rtj, unique
from tools.waiting import wait_for

from .conftest import start_operator
from .crashing_operator import EXIT_CODE
from .scenario import node_of, pod_report, wait_phase


@pytest.fixture
def own_ns(kube):
    """A namespace the session operator does not serve (these tests run their own)."""
    name = unique("rtj-kill")
    kube.create_namespace(name)
    yield name
    kube.delete_namespace(name)


def attempts(kube, ns, name) -> dict[int, int]:
    """Pods per attempt label."""
    counts: dict[int, int] = {}
    for pod in kube.pods(ns, name):
        attempt = int(pod["metadata"]["labels"]["resumable.dev/attempt"])
        counts[attempt] = counts.get(attempt, 0) + 1
    return counts


@pytest.mark.parametrize("point", ["after-status", "mid-creation"])
def test_killed_mid_resubmission_then_restarted_completes_the_same_attempt(
    *, kube, kubeconfig, own_ns, pool, tmp_path, point
):
    ns = own_ns
    replicas = 4
    pool.add(replicas)
    log = tmp_path / "operator.log"
    crashy = start_operator(kubeconfig, log, "--namespace", ns, "--standalone", crash_at=point)
    try:
        name = unique("job")
        kube.create_job(rtj(name, ns, pool.name, replicas))
        wait_for(
            "attempt 0 running",
            lambda: kube.running(ns, name, 0, replicas),
            60,
            on_timeout=crashy.tail,
        )
        kube.delete_node(node_of(kube, ns, name, 0, 2))
        wait_for(
            "operator crashed at the hook", lambda: not crashy.alive(), 30, on_timeout=crashy.tail
        )
        assert crashy.proc.returncode == EXIT_CODE, crashy.tail()
        status = kube.status(ns, name)
        assert status["attempt"] == 1 and not status.get("gangCreated")
        assert attempts(kube, ns, name).get(1, 0) == (0 if point == "after-status" else 1)
    finally:
        crashy.stop()

    restarted = start_operator(kubeconfig, log, "--namespace", ns, "--standalone")
    try:
        wait_for(
            "attempt 1 complete",
            lambda: (
                attempts(kube, ns, name).get(1) == replicas
                and kube.status(ns, name).get("gangCreated")
            ),
            30,
            on_timeout=restarted.tail,
        )
        time.sleep(2)  # give a buggy operator the chance to create a second gang
        status = kube.status(ns, name)
        assert status["attempt"] == 1 and status["preemptions"] == 1
        assert 2 not in attempts(kube, ns, name)
        assert attempts(kube, ns, name)[1] == replicas
    finally:
        restarted.stop()


def test_sigkill_at_random_moments_keeps_one_gang_per_attempt(
    kube, kubeconfig, own_ns, pool, tmp_path
):
    ns = own_ns
    replicas = 3
    pool.add(replicas + 4)
    log = tmp_path / "operator.log"
    rng = random.Random(5)
    name = unique("job")
    kube.create_job(rtj(name, ns, pool.name, replicas))
    op = start_operator(kubeconfig, log, "--namespace", ns, "--standalone")
    expected_preemptions = 0
    try:
        wait_for(
            "attempt 0 running", lambda: kube.running(ns, name, 0, replicas), 60, on_timeout=op.tail
        )
        for _ in range(4):
            attempt = kube.status(ns, name)["attempt"]
            kube.delete_node(node_of(kube, ns, name, attempt, rng.randrange(replicas)))
            expected_preemptions += 1
            time.sleep(rng.uniform(0.0, 0.15))
            op.proc.send_signal(signal.SIGKILL)
            op.proc.wait(10)
            op = start_operator(kubeconfig, log, "--namespace", ns, "--standalone")
            wait_for(
                f"attempt {attempt + 1} running",
                lambda a=attempt + 1: kube.running(ns, name, a, replicas),
                60,
                on_timeout=lambda o=op: f"{pod_report(kube, ns, name)}\n{o.tail()}",
            )
            for counted_attempt, pods in attempts(kube, ns, name).items():
                assert pods <= replicas, (counted_attempt, pods)
        wait_phase(kube, ns, name, "Running", 30, op=op)
        status = kube.status(ns, name)
        assert status["attempt"] == expected_preemptions
        assert status["preemptions"] == expected_preemptions
    finally:
        op.stop()
