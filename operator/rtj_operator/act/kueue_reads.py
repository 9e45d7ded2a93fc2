"""Reading Kueue's objects for a reconcile pass: the job's ClusterQueue and its gang's Workload.

The controller reads them with the job's other support objects, so the decisions stay pure
functions of what was read: the ClusterQueue's free quota caps elastic sizing
(``decide/kueue_quota.py``), the Workload's admission becomes the job's ``Admitted`` condition
(``decide/kueue_workload.py``). A forbidden read is not an error: the operator goes on without
the object and says so once in the log.
"""

from __future__ import annotations

import logging
from typing import Any

from ..api.api_types import Job
from ..decide import gang
from ..decide.kueue_workload import ADMITTED
from .kube import ApiError, KubeApi

log = logging.getLogger(__name__)

API_VERSION = "v1beta2"

Obj = dict[str, Any]


def local_queue_path(namespace: str, name: str) -> str:
    """The API path of a LocalQueue."""
    return f"/apis/{gang.KUEUE_GROUP}/{API_VERSION}/namespaces/{namespace}/localqueues/{name}"


def cluster_queue_path(name: str) -> str:
    """The API path of a ClusterQueue."""
    return f"/apis/{gang.KUEUE_GROUP}/{API_VERSION}/clusterqueues/{name}"


def workload_path(namespace: str, group: str) -> str:
    """The API path of a pod group's Workload."""
    return f"/apis/{gang.KUEUE_GROUP}/{API_VERSION}/namespaces/{namespace}/workloads/{group}"


_queues_forbidden_said = False
_workloads_forbidden_said = False


async def read_cluster_queue(api: KubeApi, job: Job) -> Obj | bool | None:
    """The ClusterQueue behind the job's LocalQueue; None when either does not exist (Kueue
    says so on the Workload), False when the operator may not read them (said once in the log:
    sizing then counts node room only)."""
    global _queues_forbidden_said  # noqa: PLW0603 - one warning per process, not per job and pass
    try:
        local = await api.get_object(local_queue_path(job.ref.namespace, job.spec.queue_name or ""))
        name = ((local or {}).get("spec") or {}).get("clusterQueue")
        if not name:
            return None
        return await api.get_object(cluster_queue_path(str(name)))
    except ApiError as err:
        if not err.forbidden:
            raise
        if not _queues_forbidden_said:
            _queues_forbidden_said = True
            log.warning(
                "cannot read Kueue LocalQueues or ClusterQueues (%s): elastic jobs in a queue "
                "are sized by node room only; grant get on localqueues and "
                "clusterqueues.kueue.x-k8s.io to size them by the queue's free quota too",
                err.message,
            )
        return False


async def read_workload(api: KubeApi, job: Job) -> Obj | bool | None:
    """The current attempt's Workload (None: Kueue has not made it yet), or False when it need
    not or cannot be read: this attempt's gang was already seen admitted, or the operator may
    not read Workloads (said once in the log)."""
    global _workloads_forbidden_said  # noqa: PLW0603 - one warning per process, not per job and pass
    group = gang.group_name(job.ref.name, job.status.attempt)
    for entry in job.status.conditions:
        seen = entry.type == ADMITTED and entry.status == "True"
        if seen and f"Workload {group} " in (entry.message or ""):
            return False
    try:
        return await api.get_object(workload_path(job.ref.namespace, group))
    except ApiError as err:
        if not err.forbidden:
            raise
        if not _workloads_forbidden_said:
            _workloads_forbidden_said = True
            log.warning(
                "cannot read Kueue Workloads (%s): the Admitted condition is left out; grant "
                "get on workloads.kueue.x-k8s.io to show why queued gangs wait",
                err.message,
            )
        return False
