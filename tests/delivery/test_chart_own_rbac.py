"""docs/install.md, RBAC: the chart with ``rbac.create: false`` on top of operator/deploy/rbac.yaml,
installed with the commands the doc gives, against the local control plane."""

from __future__ import annotations

import pytest

from rtj_operator.api import rbac

from .conftest import CHART, ROOT, Cluster, apply_chart_crds

pytestmark = pytest.mark.cluster

RBAC_FILE = ROOT / "operator" / "deploy" / "rbac.yaml"


def test_the_chart_runs_on_the_plain_rbac_file(cluster: Cluster) -> None:
    ns, account = rbac.OPERATOR_NAMESPACE, rbac.OPERATOR_NAME
    apply_chart_crds(cluster)
    cluster.ensure_namespace(ns)
    cluster.kubectl("apply", "-f", str(RBAC_FILE))
    try:
        install = cluster.helm(
            "install",
            "rtj-operator",
            str(CHART),
            "-n",
            ns,
            "--set",
            "rbac.create=false",
            "--set",
            "serviceAccount.create=false",
            "--set",
            f"serviceAccount.name={account}",
            check=False,
        )
        assert install.returncode == 0, install.stderr
        deploy = cluster.get("deployment", "rtj-operator", "-n", ns) or {}
        assert deploy["spec"]["template"]["spec"]["serviceAccountName"] == account
        # The chart made no RBAC of its own: the roles are the file's, not Helm's.
        role = cluster.get("clusterrole", f"{account}-jobs") or {}
        labels = role["metadata"].get("labels") or {}
        assert labels.get("app.kubernetes.io/managed-by") != "Helm"
    finally:
        cluster.helm("uninstall", "rtj-operator", "-n", ns, "--ignore-not-found", "--wait")
        cluster.kubectl("delete", "-f", str(RBAC_FILE), "--ignore-not-found")
