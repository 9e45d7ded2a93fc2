"""How long a stopping pod's containers get, and how the pod object is finally removed.

Shared by the pod worker (a deletion while its containers run) and the agent (a pod already
being deleted when the agent first sees it, with nothing of it running here), so both follow
the kubelet's rules from one place: the deletion's grace period, else the spec's, never under
the kubelet's minimum; then a delete with ``gracePeriodSeconds=0`` and a UID precondition.

Rejected: deleting with the pod's own grace period. The containers have already had it, and
without the UID precondition a new pod of the same name could be deleted instead.
"""

from __future__ import annotations

from tools.kubeapi import ApiError, Kube, Obj

DEFAULT_GRACE_S = 30.0
MIN_GRACE_S = 2.0
"""The kubelet's minimumGracePeriodInSeconds: no container gets less between SIGTERM and
SIGKILL, not even in a force deletion (grace 0) or when its pod object vanished."""


def is_deleting(pod: Obj) -> bool:
    """Whether the pod has a deletionTimestamp."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def grace_seconds(pod: Obj) -> float:
    """The deletion's grace period, else the spec's."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    for value in (
        meta.get("deletionGracePeriodSeconds"),
        spec.get("terminationGracePeriodSeconds"),
    ):
        if value is not None:
            return float(value)
    return DEFAULT_GRACE_S


def finalize_deletion(kube: Kube, pod: Obj) -> bool:
    """Remove a pod whose containers are all stopped, as the kubelet does (grace 0, same uid).

    False when it was gone already (or replaced by a pod of the same name): the agent's watch
    may hand over a pod its worker has just removed, and the removal is logged once."""
    meta = pod["metadata"]
    try:
        kube.request(
            "DELETE",
            f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
            body={
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "gracePeriodSeconds": 0,
                "preconditions": {"uid": meta["uid"]},
            },
        )
    except ApiError as err:
        if not (err.not_found or err.conflict):
            raise
        return False
    return True
