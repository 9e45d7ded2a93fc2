"""A cluster that serves the PodGroup API while its scheduler does not enforce it.

The API (``scheduling.k8s.io/v1alpha2``) is served under the ``GenericWorkload`` feature gate;
the scheduler's gang plugin needs ``GangScheduling`` too. API discovery sees only the first, so
the operator chooses ``PodGroup`` either way. This module starts a second local control plane
with ``GangScheduling=false`` (``RTJ_KUBE_FEATURE_GATES`` of ``hack/cluster/cluster.sh``) and
checks what docs/operator.md says happens there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.controlplane import ControlPlane, ControlPlaneError
from tools.kubeapi import Kube, rtj, unique
from tools.waiting import wait_for

from .conftest import ROOT, OperatorProcess, Pool, start_operator
from .scenario import condition, wait_phase

GATES_WITHOUT_GANG_PLUGIN = "GenericWorkload=true,GangScheduling=false"


@pytest.fixture(scope="module")
def gate_off_cluster(control_plane: ControlPlane) -> Iterator[tuple[Kube, str]]:
    """A second local control plane whose scheduler runs without GangScheduling, CRDs
    installed: (client, kubeconfig). (``control_plane`` first: it checks the binaries.)"""
    plane = ControlPlane(
        "rtj-test-nogang", extra_env={"RTJ_KUBE_FEATURE_GATES": GATES_WITHOUT_GANG_PLUGIN}
    )
    try:
        kubeconfig = plane.up(nodes=0)
    except ControlPlaneError as err:
        pytest.fail(str(err))
    try:
        kube = Kube(kubeconfig)
        wait_for("the API server", lambda: kube.get("/readyz") is not None, 60)
        for crd in sorted((ROOT / "crds").glob("*.yaml")):
            kube.apply_file(crd)
        wait_for(
            "the job API served",
            lambda: (kube.get("/apis/resumable.dev/v1alpha1") or {}).get("resources"),
            30,
        )
        yield kube, kubeconfig
    finally:
        plane.down(wait=30)


@pytest.fixture(scope="module")
def gate_off_operator(
    gate_off_cluster: tuple[Kube, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[OperatorProcess, str]]:
    """The operator serving one namespace of that cluster: (operator, namespace)."""
    kube, kubeconfig = gate_off_cluster
    ns = unique("rtj-nogang")
    kube.create_namespace(ns)
    log: Path = tmp_path_factory.mktemp("operator-nogang") / "operator.log"
    op = start_operator(kubeconfig, log, "--namespace", ns, "--standalone")
    yield op, ns
    op.stop()
    print(f"\noperator log: {log}")


def test_ranks_bound_one_by_one_under_an_unenforced_pod_group_are_reported(
    gate_off_cluster, gate_off_operator
):
    """Before: the job said gangScheduling PodGroup and PodsScheduled "all-or-nothing: PodGroup
    <job>-a0 binds no pod until all 3 fit" while 2 of its 3 ranks were bound and running."""
    kube, _ = gate_off_cluster
    op, ns = gate_off_operator
    pool = Pool(kube, unique("pool"))
    try:
        pool.add(2, cpu="4")
        name = unique("nogang")
        template = {
            "containers": [
                {"name": "trainer", "image": "x", "resources": {"requests": {"cpu": "4"}}}
            ]
        }
        kube.create_job(rtj(name, ns, pool.name, 3, template_spec=template))
        # The scheduler binds the two ranks that fit one at a time: a pass between the two
        # bindings reports one bound, and the next pass (on the second binding) reports both.
        expected = (
            "1 of 3 ranks cannot be scheduled and 2 are bound although PodGroup "
            f"{name}-a0 should bind none until all 3 fit"
        )
        scheduled = wait_for(
            "PodsScheduled=False naming the unenforced PodGroup, both fitting ranks bound",
            lambda: (
                c
                if (c := condition(kube, ns, name, "PodsScheduled"))
                .get("message", "")
                .startswith(expected)
                else None
            ),
            40,
            on_timeout=lambda: f"{kube.status(ns, name)}\n{op.tail()}",
        )
        assert scheduled["status"] == "False" and scheduled["reason"] == "Unschedulable"
        assert "does not enforce" in scheduled["message"], scheduled
        assert kube.status(ns, name)["gangScheduling"] == "PodGroup"
        pods = kube.pods(ns, name, 0)
        assert all(p["spec"]["schedulingGroup"] == {"podGroupName": f"{name}-a0"} for p in pods)
        assert sum(1 for p in pods if p["spec"].get("nodeName")) == 2
        # WorkloadAwarePreemption is off too: the API server drops the group's disruptionMode
        # (its default, Pod: ranks may be preempted one by one) and the gang is created anyway
        group = kube.get(f"/apis/scheduling.k8s.io/v1alpha2/namespaces/{ns}/podgroups/{name}-a0")
        assert group["spec"].get("disruptionMode", "Pod") == "Pod", group["spec"]

        pool.add(1, cpu="4")
        wait_phase(kube, ns, name, "Running", 30, op=op)
        wait_for(
            "PodsScheduled=True",
            lambda: condition(kube, ns, name, "PodsScheduled").get("status") == "True",
            10,
        )
    finally:
        pool.cleanup()
