"""The ValidatingAdmissionPolicy that keeps a job's trainer from detaching its own pods.

The trainer ServiceAccount must patch its pod (the runtime's progress annotation), and RBAC
grants verbs on objects, never on fields: with ``patch`` a rank could also remove its pod's
ownerReference, and that pod would then outlive the job. A dedicated subresource would be the
RBAC way, but pods have none for annotations. So a ValidatingAdmissionPolicy (CEL, GA since
Kubernetes 1.30) allows that account to change annotations only. It is written here once and
generated into ``operator/deploy/admission-policy.yaml``; the chart's template must say the
same (tests/delivery compares them).
"""

from __future__ import annotations

from typing import Any

from . import names

POLICY_NAME = "rtj-operator-trainer-pods"

_TRAINER_SUFFIX = names.trainer_identity_name("")
"""What the trainer account's name adds to the job's name ("-trainer")."""

MATCH_TRAINER = (
    f"has(oldObject.metadata.labels) && '{names.LABEL_JOB}' in oldObject.metadata.labels && "
    "request.userInfo.username == 'system:serviceaccount:' + oldObject.metadata.namespace + "
    f"':' + oldObject.metadata.labels['{names.LABEL_JOB}'] + '{_TRAINER_SUFFIX}'"
)


def _kept(field: str) -> str:
    """CEL: the field is absent in both, or equal (no ternary, so no list/map typing issue)."""
    new, old = f"object.metadata.{field}", f"oldObject.metadata.{field}"
    return f"has({new}) == has({old}) && (!has({new}) || {new} == {old})"


VARIABLES = (
    ("ownersKept", _kept("ownerReferences")),
    ("labelsKept", _kept("labels")),
    ("finalizersKept", _kept("finalizers")),
)
VALIDATION = (
    "variables.ownersKept && variables.labelsKept && variables.finalizersKept && "
    "object.spec == oldObject.spec"
)
MESSAGE = (
    "a job's trainer ServiceAccount may change only the annotations of its pods (not their "
    "ownerReferences, labels, finalizers or spec)"
)


def policy_spec() -> dict[str, Any]:
    """The ValidatingAdmissionPolicy's spec."""
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["UPDATE"],
                    "resources": ["pods"],
                }
            ],
            "objectSelector": {
                "matchExpressions": [{"key": names.LABEL_JOB, "operator": "Exists"}]
            },
        },
        "matchConditions": [{"name": "by-the-jobs-trainer", "expression": MATCH_TRAINER}],
        "variables": [{"name": n, "expression": e} for n, e in VARIABLES],
        "validations": [{"expression": VALIDATION, "message": MESSAGE, "reason": "Forbidden"}],
    }


def policy_documents(name: str = POLICY_NAME) -> list[dict[str, Any]]:
    """The policy and its binding (Deny)."""
    group = "admissionregistration.k8s.io/v1"
    return [
        {
            "apiVersion": group,
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": policy_spec(),
        },
        {
            "apiVersion": group,
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        },
    ]
