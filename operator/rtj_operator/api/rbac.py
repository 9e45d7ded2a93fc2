"""The operator's RBAC needs, written down once and generated into ``operator/deploy/rbac.yaml``.

Two ClusterRoles instead of one so that "watch a list of namespaces" stays least-privilege:
``rtj-operator-cluster`` holds only what is cluster-scoped by nature (nodes, namespaces for
namespace globs, cluster peering) and is always bound cluster-wide; ``rtj-operator-jobs`` holds
everything namespaced and is bound either cluster-wide (``--all-namespaces``) or with one
RoleBinding per watched namespace. Each rule says which code path needs it.
"""

from __future__ import annotations

from typing import Any

from . import names

OPERATOR_NAME = "rtj-operator"
OPERATOR_NAMESPACE = "rtj-system"

# (apiGroups, resources, verbs, why)
CLUSTER_RULES: tuple[tuple[list[str], list[str], list[str], str], ...] = (
    (
        [""],
        ["nodes"],
        ["get", "list", "watch"],
        "termination taints, deletion and readiness of the nodes that run ranks",
    ),
    (
        ["coordination.k8s.io"],
        ["leases"],
        ["get"],
        "the Leases in kube-node-lease of a gang's nodes, read when a rank reports a lost peer:"
        " a node whose kubelet went silent is taken as lost before it turns NotReady",
    ),
    (
        [""],
        ["namespaces"],
        ["list", "watch"],
        "kopf resolves --namespace globs against the existing namespaces",
    ),
    (
        ["kopf.dev"],
        ["clusterkopfpeerings"],
        ["get", "list", "watch", "patch"],
        "kopf peering between operator replicas in --all-namespaces mode",
    ),
    (
        ["apiextensions.k8s.io"],
        ["customresourcedefinitions"],
        ["list", "watch"],
        "kopf discovers the ResumableTrainingJob and peering CRDs",
    ),
    (
        ["kueue.x-k8s.io"],
        ["clusterqueues"],
        ["get"],
        "an elastic job with spec.queueName starts at (and grows to) what its ClusterQueue's free"
        " quota holds",
    ),
)

JOB_RULES: tuple[tuple[list[str], list[str], list[str], str], ...] = (
    (
        [names.GROUP],
        [names.PLURAL],
        ["get", "list", "watch"],
        "the jobs themselves (the operator never writes their spec)",
    ),
    (
        [names.GROUP],
        [f"{names.PLURAL}/status"],
        ["patch"],
        "status is the operator's record of truth (a merge patch conditional on resourceVersion)",
    ),
    (
        [names.GROUP],
        [f"{names.PLURAL}/finalizers"],
        ["update"],
        "the objects it creates for a job name it as their owner with blockOwnerDeletion, which"
        " the OwnerReferencesPermissionEnforcement admission plugin allows only to this verb",
    ),
    (
        [""],
        ["pods"],
        ["get", "list", "watch", "create", "delete", "patch"],
        "the gang: create ranks, delete an interrupted gang, write the preemption notice",
    ),
    (
        [""],
        ["services"],
        ["get", "create", "patch"],
        "the headless Service for MASTER_ADDR; its port follows spec.masterPort",
    ),
    (
        ["scheduling.k8s.io"],
        ["podgroups"],
        ["get", "create", "delete"],
        "one gang-scheduled PodGroup per attempt where the cluster serves the API; read first, as "
        "its name may still be held by a deleted job's group",
    ),
    (
        ["kueue.x-k8s.io"],
        ["workloads"],
        ["get"],
        "the Admitted condition of a job with spec.queueName: why Kueue keeps its gang waiting",
    ),
    (
        ["kueue.x-k8s.io"],
        ["localqueues"],
        ["get"],
        "which ClusterQueue an elastic job's spec.queueName submits to (its free quota sizes the"
        " gang)",
    ),
    ([""], ["serviceaccounts"], ["get", "create"], "the ranks' own identity"),
    (
        ["rbac.authorization.k8s.io"],
        ["roles"],
        ["get", "create", "patch"],
        "let the ranks patch their own pod's progress annotation (and nothing else); the rules"
        " move to each new attempt's pods",
    ),
    (
        ["rbac.authorization.k8s.io"],
        ["rolebindings"],
        ["get", "create"],
        "bind that Role to the job's ServiceAccount",
    ),
    ([""], ["events"], ["create"], "an Event for every interruption and resubmission (and kopf's)"),
    (
        ["kopf.dev"],
        ["kopfpeerings"],
        ["get", "list", "watch", "patch"],
        "kopf peering between operator replicas in --namespace mode",
    ),
)

USER_EDIT_RULES: tuple[tuple[list[str], list[str], list[str], str], ...] = (
    (
        [names.GROUP],
        [names.PLURAL],
        ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        "people with the built-in edit or admin role manage jobs in their namespaces",
    ),
    ([names.GROUP], [f"{names.PLURAL}/status"], ["get", "list", "watch"], "and read their status"),
)
"""Aggregated into the built-in ``admin`` and ``edit`` ClusterRoles."""

USER_VIEW_RULES: tuple[tuple[list[str], list[str], list[str], str], ...] = (
    (
        [names.GROUP],
        [names.PLURAL, f"{names.PLURAL}/status"],
        ["get", "list", "watch"],
        "people with the built-in view role read jobs and their status",
    ),
)
"""Aggregated into the built-in ``view`` ClusterRole."""

AGGREGATE_LABEL = "rbac.authorization.k8s.io/aggregate-to-{role}"

TRAINER_VERBS = ["get", "patch"]
"""What a job's own ServiceAccount may do, on its current and previous attempt's pods only."""


def _rules(rules: tuple[tuple[list[str], list[str], list[str], str], ...]) -> list[dict[str, Any]]:
    return [{"apiGroups": g, "resources": r, "verbs": v} for g, r, v, _ in rules]


def rbac_documents() -> list[dict[str, Any]]:
    """ServiceAccount, both ClusterRoles and cluster-wide bindings (the all-namespaces setup),
    and the ClusterRoles aggregated into the built-in admin, edit and view roles."""
    subject = {"kind": "ServiceAccount", "name": OPERATOR_NAME, "namespace": OPERATOR_NAMESPACE}
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": OPERATOR_NAME, "namespace": OPERATOR_NAMESPACE},
        }
    ]
    for suffix, rules in (("cluster", CLUSTER_RULES), ("jobs", JOB_RULES)):
        role = f"{OPERATOR_NAME}-{suffix}"
        docs.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": role},
                "rules": _rules(rules),
            }
        )
        docs.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": role},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [subject],
            }
        )
    for suffix, rules, into in (
        ("edit", USER_EDIT_RULES, ("admin", "edit")),
        ("view", USER_VIEW_RULES, ("view",)),
    ):
        docs.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {
                    "name": f"{OPERATOR_NAME}-{suffix}",
                    "labels": {AGGREGATE_LABEL.format(role=r): "true" for r in into},
                },
                "rules": _rules(rules),
            }
        )
    return docs


def rbac_comment() -> str:
    """The YAML header: why each rule exists, so reviewers need not read the code."""
    lines = ["Why each rule exists:"]
    for title, rules in (
        ("rtj-operator-cluster", CLUSTER_RULES),
        ("rtj-operator-jobs", JOB_RULES),
        ("rtj-operator-edit (aggregated into admin and edit)", USER_EDIT_RULES),
        ("rtj-operator-view (aggregated into view)", USER_VIEW_RULES),
    ):
        lines.append(f"  {title}:")
        for groups, resources, verbs, why in rules:
            group = groups[0] or "core"
            lines.append(f"    {group}/{','.join(resources)} [{','.join(verbs)}]: {why}")
    lines += [
        "To watch only some namespaces (--namespace a --namespace b), replace the",
        "rtj-operator-jobs ClusterRoleBinding by one RoleBinding per namespace that refers to",
        "the same ClusterRole; rtj-operator-cluster stays cluster-wide (nodes are cluster-scoped).",
    ]
    return "\n".join(lines)
