"""How many of a job's pods the cluster's nodes could take now: the input of elastic sizing.

An elastic job chooses its gang size from the nodes that are Ready, schedulable (not cordoned,
no untolerated NoSchedule/NoExecute taint), match the template's ``nodeSelector`` and required
node affinity, and whose allocatable resources hold the pod's requests; a required pod
anti-affinity that keeps the job's own pods apart per node (topology ``kubernetes.io/hostname``)
makes it one pod per node. Without that, a job that spreads its ranks by anti-affinity with small
requests would count several pods per node, never see that capacity is gone, and never shrink.
Asking the scheduler instead (create the full gang and see what binds) was rejected: the pods
that bind hold nodes while doing nothing, which is exactly what a gang must not do, and it takes
a scheduling round per guess.

The count is an upper bound: pods of other workloads are not subtracted (the operator watches
nodes, not every pod in the cluster). An overestimate is harmless with native gang scheduling
(no pod of the gang binds; the attempt waits with PodsScheduled=False and the scheduler's
reason) and costs one pending gang without it; it never loses work.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from .nodes import NodeView

_SUFFIX = {
    "": 1,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")

UNBOUNDED = 1 << 20
"""Pods per node when nothing limits them (no requests and no ``pods`` allocatable)."""
HOSTNAME = "kubernetes.io/hostname"


def parse_quantity(text: Any) -> float | None:
    """A Kubernetes resource quantity (``500m``, ``2Gi``, ``4``) as a number; None if invalid."""
    match = _QUANTITY.match(str(text).strip())
    if match is None:
        return None
    return float(match.group(1)) * _SUFFIX[match.group(2) or ""]


def pod_requests(template_spec: dict[str, Any]) -> dict[str, float]:
    """Resources one pod requests: the sum over its containers, at least any init container's
    (the scheduler's effective request), limits standing in for absent requests."""
    total: dict[str, float] = {}
    for container in template_spec.get("containers") or []:
        for key, value in _container_requests(container).items():
            total[key] = total.get(key, 0.0) + value
    for container in template_spec.get("initContainers") or []:
        for key, value in _container_requests(container).items():
            total[key] = max(total.get(key, 0.0), value)
    return total


def _container_requests(container: dict[str, Any]) -> dict[str, float]:
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    out = {}
    for key, value in merged.items():
        number = parse_quantity(value)
        if number is not None and number > 0:
            out[str(key)] = number
    return out


def _tolerated(taint: dict[str, Any], tolerations: Iterable[dict[str, Any]]) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key")
        if toleration.get("operator") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (toleration.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def node_accepts(node: NodeView, template_spec: dict[str, Any]) -> bool:
    """Whether the scheduler may place the job's pod on ``node`` at all."""
    if node.gone or node.ready is not True or node.unschedulable:
        return False
    labels = dict(node.labels)
    selector = template_spec.get("nodeSelector") or {}
    if any(labels.get(key) != value for key, value in selector.items()):
        return False
    if not _node_affinity_accepts(node, _affinity(template_spec, "nodeAffinity")):
        return False
    tolerations = template_spec.get("tolerations") or []
    return all(
        taint.get("effect") not in ("NoSchedule", "NoExecute") or _tolerated(taint, tolerations)
        for taint in node.taints
    )


def pods_per_node(node: NodeView, requests: dict[str, float]) -> int:
    """How many of the pods fit into the node's allocatable resources."""
    allocatable = {k: parse_quantity(v) for k, v in node.allocatable}
    count = UNBOUNDED
    pods = allocatable.get("pods")
    if pods is not None:
        count = min(count, int(pods))
    for key, need in requests.items():
        have = allocatable.get(key)
        if have is None:
            return 0  # an extended resource (a GPU) the node does not have
        count = min(count, math.floor(have / need + 1e-9))
    return max(count, 0)


def fitting_pods(
    nodes: Iterable[NodeView],
    template_spec: dict[str, Any],
    limit: int,
    pod_labels: dict[str, str] | None = None,
) -> int:
    """How many pods of the template the nodes could take, capped at ``limit``; ``pod_labels``:
    the labels every pod of the job carries (for the template's pod anti-affinity)."""
    requests = pod_requests(template_spec)
    apart = one_per_node(template_spec, pod_labels or {})
    total = 0
    for node in nodes:
        if node_accepts(node, template_spec):
            fits = pods_per_node(node, requests)
            total += min(fits, 1) if apart else fits
            if total >= limit:
                return limit
    return total


def one_per_node(template_spec: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    """Whether a required pod anti-affinity term over the node (``kubernetes.io/hostname``)
    selects the job's own pods, so that no two of them share a node."""
    anti = _affinity(template_spec, "podAntiAffinity")
    terms = anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []
    return any(
        term.get("topologyKey") == HOSTNAME
        and selector_matches(term.get("labelSelector"), pod_labels)
        for term in terms
        if isinstance(term, dict)
    )


def selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A label selector against labels, as the scheduler reads one in an affinity term: a null
    selector selects nothing, an empty one everything."""
    if selector is None:
        return False
    wanted = selector.get("matchLabels") or {}
    if any(labels.get(key) != value for key, value in wanted.items()):
        return False
    return all(_expression(e, labels) for e in selector.get("matchExpressions") or [])


def _affinity(template_spec: dict[str, Any], kind: str) -> dict[str, Any]:
    return (template_spec.get("affinity") or {}).get(kind) or {}


def _node_affinity_accepts(node: NodeView, node_affinity: dict[str, Any]) -> bool:
    """The required node affinity: any of its terms, each all of its expressions (an empty term
    matches no node, as the scheduler has it)."""
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    labels, fields = dict(node.labels), {"metadata.name": node.name}
    for term in terms:
        expressions = term.get("matchExpressions") or []
        by_field = term.get("matchFields") or []
        if (expressions or by_field) and (
            all(_expression(e, labels) for e in expressions)
            and all(_expression(e, fields) for e in by_field)
        ):
            return True
    return False


def _expression(expression: dict[str, Any], values: dict[str, str]) -> bool:
    """One requirement (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``)."""
    have = values.get(expression.get("key", ""))
    operator, given = expression.get("operator"), expression.get("values") or []
    if operator == "In":
        return have is not None and have in given
    if operator == "NotIn":
        return have is None or have not in given
    if operator == "Exists":
        return have is not None
    if operator == "DoesNotExist":
        return have is None
    if operator in ("Gt", "Lt") and have is not None and len(given) == 1:
        try:
            ours, theirs = int(have), int(given[0])
        except ValueError:
            return False
        return ours > theirs if operator == "Gt" else ours < theirs
    return False
