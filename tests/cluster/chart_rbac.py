"""Run the operator with exactly the permissions the Helm chart grants it.

The chart is rendered with ``helm template`` in ``namespaces`` mode for the test's namespace and
everything except the operator's own Deployment and Services is applied: the ServiceAccount, the
ClusterRole and Role with their bindings, the KopfPeering, the aggregated user roles and the
trainer admission policy. The operator subprocess then gets a kubeconfig holding a token of that
ServiceAccount, so any permission the chart lacks shows up as a 403 in the test.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import IN_CI, require
from tools.kubeapi import ApiError, Kube

from .conftest import ROOT

CHART = ROOT / "charts" / "resumable-training-operator"
BUILD_SH = ROOT / "hack" / "cluster" / "build.sh"
RELEASE_NAMESPACE = "rtj-chart-system"
ACCOUNT = "rtj-operator"
_SKIPPED_KINDS = {"Deployment", "Service", "ServiceMonitor"}
_PLURALS = {
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
}


def helm_binary() -> str:
    """The helm the project builds (hack/cluster/build.sh), else one on PATH."""
    if BUILD_SH.exists():
        check = subprocess.run([str(BUILD_SH), "--check"], capture_output=True, check=False)
        if check.returncode == 0:
            bindir = subprocess.run(
                [str(BUILD_SH), "--print-bindir"], capture_output=True, text=True, check=True
            ).stdout.strip()
            if (Path(bindir) / "helm").exists():
                return str(Path(bindir) / "helm")
    found = shutil.which("helm")
    require(found is not None or IN_CI, "helm not found: run hack/cluster/build.sh")
    assert found is not None, "helm not found"
    return found


def rendered_chart(namespace: str, *values: str) -> list[dict[str, Any]]:
    """The chart's objects for an operator serving ``namespace`` (peering on)."""
    proc = subprocess.run(
        [
            helm_binary(),
            "template",
            "rtj-operator",
            str(CHART),
            "--namespace",
            RELEASE_NAMESPACE,
            "--set",
            "watch.mode=namespaces",
            "--set",
            f"watch.namespaces={{{namespace}}}",
            *values,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _apply(kube: Kube, doc: dict[str, Any]) -> None:
    kind = doc["kind"]
    if kind not in _PLURALS:
        kube.apply(doc)
        return
    api_version = doc["apiVersion"]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    ns = doc["metadata"].get("namespace")
    base = f"{prefix}/namespaces/{ns}/{_PLURALS[kind]}" if ns else f"{prefix}/{_PLURALS[kind]}"
    current = kube.get(f"{base}/{doc['metadata']['name']}")
    if current is None:
        kube.req("POST", base, body=doc)
    else:
        meta = {**doc["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}
        kube.req("PUT", f"{base}/{doc['metadata']['name']}", body={**doc, "metadata": meta})


def token_for(kube: Kube, namespace: str, account: str, seconds: int = 3600) -> str:
    """A bound token of a ServiceAccount (TokenRequest API)."""
    return kube.req(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        },
    )["status"]["token"]


def kubeconfig_with_token(admin_kubeconfig: str, token: str, path: Path) -> Path:
    """A kubeconfig for the same cluster that authenticates with ``token`` only."""
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    cluster = admin["clusters"][0]
    limited = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "limited", "user": {"token": token}}],
        "contexts": [
            {"name": "limited", "context": {"cluster": cluster["name"], "user": "limited"}}
        ],
        "current-context": "limited",
    }
    path.write_text(yaml.safe_dump(limited))
    return path


def install_chart_rbac(kube: Kube, admin_kubeconfig: str, namespace: str, tmp: Path) -> Path:
    """Apply the chart's RBAC, peering object and policies for ``namespace``; the kubeconfig of
    the chart's operator ServiceAccount."""
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RELEASE_NAMESPACE}})
    for doc in rendered_chart(namespace):
        if doc["kind"] not in _SKIPPED_KINDS:
            _apply(kube, doc)
    token = token_for(kube, RELEASE_NAMESPACE, ACCOUNT)
    return kubeconfig_with_token(admin_kubeconfig, token, tmp / f"operator-{namespace}.kubeconfig")


_CLUSTER_PLURALS = {
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
}


def remove_chart_rbac(kube: Kube, namespace: str) -> None:
    """Delete the cluster-scoped objects ``install_chart_rbac`` applied.

    The control plane is shared by the whole test session, and a later suite installs the chart
    with Helm, which refuses to adopt a ClusterRole it did not create.
    """
    for doc in rendered_chart(namespace):
        kind = doc["kind"]
        if kind not in _CLUSTER_PLURALS or doc["metadata"].get("namespace"):
            continue
        api_version = doc["apiVersion"]
        prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        try:
            kube.req("DELETE", f"{prefix}/{_CLUSTER_PLURALS[kind]}/{doc['metadata']['name']}")
        except ApiError as err:
            if not err.not_found:
                raise
