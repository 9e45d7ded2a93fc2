"""The chart against a real API server: server-side dry runs, and a real install lifecycle.

The cluster is the project's local control plane with one kwok node: the operator's pod is
scheduled and shown Running by kwok without any container running, so these tests assert on
the objects (CRDs established, RBAC, Deployment, Service, pod admitted under PodSecurity
"restricted"), not on the operator's behaviour, which tests/cluster covers.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import (
    CHART,
    CRDS,
    Cluster,
    apply_chart_crds,
    delete_crds,
    run,
    wait_for,
    without_symlink_notes,
)
from .test_chart import VALUE_SETS

pytestmark = pytest.mark.cluster

RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
}
RELEASE = "rtj-operator"
RELEASE_NS = "rtj-delivery-system"


@pytest.fixture
def crds(cluster: Cluster) -> Cluster:
    """The CRDs installed (idempotent), as the plain-kubectl install does it."""
    apply_chart_crds(cluster)
    return cluster


def test_plain_kubectl_installs_the_chart_crds_on_a_fresh_cluster(cluster: Cluster) -> None:
    delete_crds(cluster)
    apply_chart_crds(cluster)
    for name in CRDS:
        assert cluster.crd_established(name)


@pytest.mark.parametrize("values", list(VALUE_SETS.values()), ids=list(VALUE_SETS))
def test_rendered_manifests_pass_server_side_dry_run(
    crds: Cluster, helm: str, values: tuple[str, ...]
) -> None:
    """`helm template | kubectl apply --dry-run=server`: the install-without-Helm path."""
    cluster = crds
    cluster.ensure_namespace(RELEASE_NS, RESTRICTED)
    for ns in ("team-a", "team-b"):
        cluster.ensure_namespace(ns)
    rendered = run(
        [helm, "template", RELEASE, str(CHART), "--namespace", RELEASE_NS, *values]
    ).stdout
    proc = cluster.kubectl("apply", "--dry-run=server", "-f", "-", stdin=rendered, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "PodSecurity" not in proc.stderr, proc.stderr
    assert "deployment.apps/rtj-operator created (server dry run)" in proc.stdout


def _rules(obj: dict[str, Any] | None) -> set[str]:
    return {r for rule in (obj or {}).get("rules", []) for r in rule["resources"]}


def _deployment_available(cluster: Cluster, replicas: int) -> bool:
    deploy = cluster.get("deployment", RELEASE, "-n", RELEASE_NS) or {}
    status = deploy.get("status") or {}
    return (
        status.get("availableReplicas") == replicas
        and status.get("updatedReplicas") == replicas
        and deploy["metadata"].get("generation") == status.get("observedGeneration")
    )


def test_install_upgrade_uninstall(cluster: Cluster) -> None:
    cluster.helm("uninstall", RELEASE, "-n", RELEASE_NS, "--ignore-not-found", "--wait")
    delete_crds(cluster)
    # The operator's pod must be admitted where PodSecurity "restricted" is enforced.
    cluster.ensure_namespace(RELEASE_NS, RESTRICTED)
    cluster.ensure_namespace("team-a")

    # --- install: CRDs from crds/, then the templates --------------------------------------
    install = cluster.helm(
        "install", RELEASE, str(CHART), "-n", RELEASE_NS, "--wait", "--timeout", "180s"
    )
    assert f"kubectl -n {RELEASE_NS} rollout status deployment/{RELEASE}" in install.stdout
    for name in CRDS:
        assert cluster.crd_established(name), f"CRD {name} not established"
    assert cluster.get("serviceaccount", RELEASE, "-n", RELEASE_NS)
    cluster_role = cluster.get("clusterrole", f"{RELEASE}-cluster")
    jobs_role = cluster.get("clusterrole", f"{RELEASE}-jobs")
    assert {"nodes", "clusterkopfpeerings"} <= _rules(cluster_role)
    assert {"pods", "resumabletrainingjobs/status"} <= _rules(jobs_role)
    for name in (f"{RELEASE}-cluster", f"{RELEASE}-jobs"):
        binding = cluster.get("clusterrolebinding", name) or {}
        assert binding["subjects"][0]["namespace"] == RELEASE_NS
    assert cluster.get("clusterkopfpeering", RELEASE)
    assert _deployment_available(cluster, 1)
    service = cluster.get("service", f"{RELEASE}-metrics", "-n", RELEASE_NS) or {}
    assert service["spec"]["ports"][0]["port"] == 9090
    pods = (
        cluster.get("pods", "-n", RELEASE_NS, "-l", f"app.kubernetes.io/instance={RELEASE}") or {}
    )["items"]
    assert [p["status"]["phase"] for p in pods] == ["Running"]
    assert pods[0]["spec"]["nodeName"], "the operator pod was never scheduled"

    # --- upgrade: two replicas serving one namespace -------------------------------------
    cluster.helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        RELEASE_NS,
        "--wait",
        "--timeout",
        "180s",
        "--set",
        "replicas=2",
        "--set",
        "watch.mode=namespaces",
        "--set",
        "watch.namespaces={team-a}",
    )
    wait_for("2 replicas available", lambda: _deployment_available(cluster, 2), 120)
    deploy = cluster.get("deployment", RELEASE, "-n", RELEASE_NS) or {}
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--all-namespaces" not in args
    role = cluster.get("role", f"{RELEASE}-jobs", "-n", "team-a")
    assert "pods" in _rules(role)
    assert cluster.get("rolebinding", f"{RELEASE}-jobs", "-n", "team-a")
    assert cluster.get("clusterrolebinding", f"{RELEASE}-jobs") is None
    assert cluster.get("clusterrole", f"{RELEASE}-jobs") is None
    assert "clusterkopfpeerings" not in _rules(cluster.get("clusterrole", f"{RELEASE}-cluster"))
    assert cluster.get("kopfpeering", RELEASE, "-n", "team-a")
    assert cluster.get("clusterkopfpeering", RELEASE) is None

    # --- a bad upgrade is refused before anything changes -------------------------------
    bad = cluster.helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        RELEASE_NS,
        "--reuse-values",
        "--set",
        "replicas=-1",
        check=False,
    )
    assert bad.returncode != 0 and "/replicas" in bad.stderr, bad.stderr
    history = cluster.helm("history", RELEASE, "-n", RELEASE_NS, "-o", "json").stdout
    assert history.count('"revision"') == 2

    # --- uninstall: everything but the CRDs goes ----------------------------------------
    cluster.helm("uninstall", RELEASE, "-n", RELEASE_NS, "--wait", "--timeout", "120s")
    assert cluster.get("deployment", RELEASE, "-n", RELEASE_NS) is None
    assert cluster.get("serviceaccount", RELEASE, "-n", RELEASE_NS) is None
    assert cluster.get("service", f"{RELEASE}-metrics", "-n", RELEASE_NS) is None
    assert cluster.get("clusterrole", f"{RELEASE}-cluster") is None
    assert cluster.get("role", f"{RELEASE}-jobs", "-n", "team-a") is None
    assert cluster.get("kopfpeering", RELEASE, "-n", "team-a") is None
    for name in CRDS:
        assert cluster.crd_established(name), f"uninstall must keep CRD {name}"


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("replicas=-1", "/replicas"),
        ("watch.mode=everything", "/watch/mode"),
    ],
)
def test_bad_values_fail_helm_install(cluster: Cluster, value: str, field: str) -> None:
    release = "rtj-bad-values"
    cluster.ensure_namespace(RELEASE_NS)
    proc = cluster.helm(
        "install", release, str(CHART), "-n", RELEASE_NS, "--set", value, check=False
    )
    error = without_symlink_notes(proc.stderr)
    assert proc.returncode != 0, "helm install accepted a bad value"
    assert field in error and "schema" in error, error
    assert cluster.helm("status", release, "-n", RELEASE_NS, check=False).returncode != 0
    assert cluster.get("deployment", release, "-n", RELEASE_NS) is None
