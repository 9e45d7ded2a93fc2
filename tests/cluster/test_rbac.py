"""The generated RBAC (operator/deploy/rbac.yaml) is enough: the operator runs on it alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tools.kubeapi import ApiError
from tools.waiting import wait_for

from .conftest import ROOT, start_operator
from .kubeclient import rtj, unique
from .scenario import node_of, wait_attempt

_PLURALS = {
    "ServiceAccount": "serviceaccounts",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "Role": "roles",
    "RoleBinding": "rolebindings",
}


@pytest.fixture
def documented_rbac(kube):
    """operator/deploy/rbac.yaml's objects, removed afterwards: the control plane is shared by
    the session, and Helm (tests/delivery, tests/e2e) refuses to adopt objects it did not make."""
    docs = [
        d for d in yaml.safe_load_all((ROOT / "operator" / "deploy" / "rbac.yaml").read_text()) if d
    ]
    yield docs
    for doc in docs:
        if doc["kind"] not in _PLURALS:
            continue
        prefix = "/api/v1" if doc["apiVersion"] == "v1" else f"/apis/{doc['apiVersion']}"
        ns = doc["metadata"].get("namespace")
        base = f"{prefix}/namespaces/{ns}" if ns else prefix
        try:
            kube.req("DELETE", f"{base}/{_PLURALS[doc['kind']]}/{doc['metadata']['name']}")
        except ApiError as err:
            if not err.not_found:
                raise


def test_operator_works_with_only_the_documented_permissions(
    kube, kubeconfig, pool, tmp_path, documented_rbac
):
    docs = documented_rbac
    account = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]
    kube.apply(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": account["namespace"]}}
    )
    for doc in docs:
        kube.apply(doc)
    token = kube.req(
        "POST",
        f"/api/v1/namespaces/{account['namespace']}/serviceaccounts/{account['name']}/token",
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )["status"]["token"]
    admin = yaml.safe_load(Path(kubeconfig).read_text())
    limited = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": "rtj-operator", "user": {"token": token}}],
        "contexts": [
            {
                "name": "rtj-operator",
                "context": {"cluster": admin["clusters"][0]["name"], "user": "rtj-operator"},
            }
        ],
        "current-context": "rtj-operator",
    }
    path = tmp_path / "operator.kubeconfig"
    path.write_text(yaml.safe_dump(limited))

    ns = unique("rtj-rbac")
    kube.create_namespace(ns)
    log = tmp_path / "operator.log"
    op = start_operator(str(path), log, "--namespace", ns, "--standalone")
    try:
        pool.add(2)
        name = unique("job")
        kube.create_job(rtj(name, ns, pool.name, 2))
        wait_for("attempt 0 running", lambda: kube.running(ns, name, 0, 2), 60, on_timeout=op.tail)
        kube.delete_node(node_of(kube, ns, name, 0, 0))
        wait_attempt(kube, ns, name, 1, 2, op=op)
        wait_for("events posted", lambda: kube.events(ns, name), 10)
        # Each line without its timestamp: "01:25:18,403" is not an HTTP 403.
        messages = [line.split("] ", 1)[-1] for line in log.read_text().splitlines()]
        denied = [m for m in messages if re.search(r"\b403\b|Forbidden", m)]
        assert not denied, op.tail()
    finally:
        op.stop()
        kube.delete_namespace(ns)
