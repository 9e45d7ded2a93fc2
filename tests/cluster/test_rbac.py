"""The generated RBAC (operator/deploy/rbac.yaml) is enough: the operator runs on it alone."""

from __future__ import annotations

from pathlib import Path

import yaml

from tools.waiting import wait_for

from .conftest import ROOT, start_operator
from .kubeclient import rtj, unique
from .scenario import node_of, wait_attempt


def test_operator_works_with_only_the_documented_permissions(kube, kubeconfig, pool, tmp_path):
    docs = list(yaml.safe_load_all((ROOT / "operator" / "deploy" / "rbac.yaml").read_text()))
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
        text = log.read_text()
        assert "403" not in text and "Forbidden" not in text, op.tail()
    finally:
        op.stop()
        kube.delete_namespace(ns)
