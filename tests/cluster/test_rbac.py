"""The generated RBAC (operator/deploy/rbac.yaml) is exactly what the operator needs.

Enough: the operator runs a job through creation, a preemption notice, the loss of a node and
success on it alone, with no 403. Nothing more: the local control plane's audit log
(hack/cluster/cluster.sh records the requests of ServiceAccounts in ``rtj-system``) shows the
operator using every verb it is granted.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from rtj_operator.api import envvars, names, rbac
from tests.conftest import IN_CI, require
from tools.kubeapi import ApiError, rtj, unique
from tools.waiting import wait_for

from .conftest import ROOT, start_operator
from .scenario import node_of, wait_attempt, wait_phase

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


# Granted but never requested in this run, each for its reason.
NOT_REQUESTED = {
    # The operator's own Role for a job's ranks grants get on pods: creating it passes the API
    # server's escalation check only because the operator holds that verb itself.
    ("", "pods", "get"): "escalation check",
    # Checked by the OwnerReferencesPermissionEnforcement admission plugin when an object names
    # its job as owner with blockOwnerDeletion; no such request exists.
    (names.GROUP, f"{names.PLURAL}/finalizers", "update"): "admission check",
    # A queued job's Workload (spec.queueName); this control plane runs no Kueue. Kueue's own
    # control plane exercises it (tests/cluster/test_kueue.py: the Admitted condition).
    ("kueue.x-k8s.io", "workloads", "get"): "needs Kueue",
    # An elastic queued job's LocalQueue and ClusterQueue (kueue_quota.py), likewise.
    ("kueue.x-k8s.io", "localqueues", "get"): "needs Kueue",
    ("kueue.x-k8s.io", "clusterqueues", "get"): "needs Kueue",
    # A node is read by GET only when the node watch has not seen it (right after a start, or
    # after a peering pause); in this run the watch knows every node, the deleted one too.
    ("", "nodes", "get"): "node watch",
    # A node's Lease is read only while a kept rank reports a lost peer (docs/survivors.md);
    # tests/e2e/test_survivors_story.py exercises it.
    ("coordination.k8s.io", "leases", "get"): "no peer lost in this run",
    # The all-namespaces peering; this run serves one namespace (kopfpeerings are used).
    **{
        ("kopf.dev", "clusterkopfpeerings", verb): "all-namespaces mode"
        for verb in ("get", "list", "watch", "patch")
    },
}


def granted_verbs() -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every rule of rtj-operator-cluster and rtj-operator-jobs."""
    return {
        (group, resource, verb)
        for groups, resources, verbs, _ in (*rbac.CLUSTER_RULES, *rbac.JOB_RULES)
        for group in groups
        for resource in resources
        for verb in verbs
    }


def audit_log(kubeconfig: str) -> Path:
    """The audit log that hack/cluster/cluster.sh sets up next to the cluster's kubeconfig."""
    path = Path(kubeconfig).parent / "logs" / "audit.log"
    require(path.exists() or IN_CI, f"no audit log at {path}: a cluster not made by cluster.sh")
    assert path.exists(), f"no audit log at {path}: run hack/cluster/cluster.sh up"
    return path


def requests_of(log: Path, offset: int, user: str) -> list[dict[str, str]]:
    """The completed requests of ``user`` logged after byte ``offset``."""
    with log.open("rb") as handle:
        handle.seek(offset)
        lines = handle.read().decode().splitlines()
    found = []
    for line in lines:
        event = json.loads(line)
        if event.get("stage") != "ResponseComplete" or event["user"]["username"] != user:
            continue
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "")
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        code = (event.get("responseStatus") or {}).get("code", 0)
        found.append(
            {
                "group": ref.get("apiGroup", ""),
                "resource": resource,
                "verb": event["verb"],
                "code": code,
            }
        )
    return found


def _notice_sent(kube, ns: str, pod: str) -> bool:
    annotations = (kube.pod(ns, pod) or {}).get("metadata", {}).get("annotations") or {}
    return bool(annotations.get(envvars.NOTICE_ANNOTATION))


def test_operator_works_with_exactly_the_documented_permissions(
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
    audit = audit_log(kubeconfig)
    offset = audit.stat().st_size

    ns = unique("rtj-rbac")
    kube.create_namespace(ns)
    peering = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering"}
    kube.apply({**peering, "metadata": {"name": "rtj-operator", "namespace": ns}})
    log = tmp_path / "operator.log"
    op = start_operator(str(path), log, "--namespace", ns, "--peering", "rtj-operator")
    try:
        pool.add(3)
        name = unique("job")
        kube.create_job(rtj(name, ns, pool.name, 2))
        wait_for("attempt 0 running", lambda: kube.running(ns, name, 0, 2), 60, on_timeout=op.tail)
        kube.report_progress(ns, f"{name}-a0-r1", "ep1-ba10", 10)
        node = node_of(kube, ns, name, 0, 0)
        kube.taint(node, "ToBeDeletedByClusterAutoscaler", "NoSchedule", str(int(time.time())))
        wait_for("notice", lambda: _notice_sent(kube, ns, f"{name}-a0-r0"), 30, on_timeout=op.tail)
        kube.patch_job(ns, name, {"masterPort": 23456})  # the Service's port follows it
        kube.delete_node(node)
        wait_attempt(kube, ns, name, 1, 2, op=op)
        service = kube.get(f"/api/v1/namespaces/{ns}/services/{name}")
        assert [p["port"] for p in service["spec"]["ports"]] == [23456]
        wait_for("attempt 1 running", lambda: kube.running(ns, name, 1, 2), 60, on_timeout=op.tail)
        for rank in (0, 1):
            kube.end_container(ns, f"{name}-a1-r{rank}", 0, reason="Completed")
        wait_phase(kube, ns, name, "Succeeded", 30, op=op)
        wait_for("events posted", lambda: kube.events(ns, name), 10)
    finally:
        op.stop()
        kube.delete_namespace(ns)
    # Each line without its timestamp: "01:25:18,403" is not an HTTP 403.
    messages = [line.split("] ", 1)[-1] for line in log.read_text().splitlines()]
    denied = [m for m in messages if re.search(r"\b403\b|Forbidden", m)]
    assert not denied, op.tail()

    user = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    requests = requests_of(audit, offset, user)
    assert not [r for r in requests if r["code"] == 403], requests
    used = {(r["group"], r["resource"], r["verb"]) for r in requests}
    unused = granted_verbs() - used - set(NOT_REQUESTED)
    assert not unused, f"granted but never used: {sorted(unused)}"
