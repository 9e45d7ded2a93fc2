"""What one reconcile reads about a job besides the job itself: its pods, their nodes, and the
objects beside the gang (support objects, the attempt's PodGroup, Kueue's Workload and
ClusterQueue).

Everything that decides is read from the API server (consistent reads, controller.py), with two
exceptions. The nodes come from the node watch's cache, where a miss falls back to a GET. The
support objects (ServiceAccount, Role, RoleBinding, Service) are read again only when the last
read is older than ``SUPPORT_RECHECK_S``, and only a read that found every one of them, each the
job's own, stands in for the next ones: those four GETs were two thirds of the operator's
requests while a mass reclaim's pod events woke every job hit several times. A read that stands
in takes in the updates a pass makes (the Role's pod names, with each attempt), and is dropped
when the pass creates a support object or fails (``forget_support``), so a pass after a refusal
(a ServiceAccount deleted by hand) reads again. Objects the decision cannot use
are not read at all: nothing beside a job that has ended, is deleted or suspended.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..api.api_types import Job
from ..api.status_types import TERMINAL_PHASES
from ..decide import gang, kueue_quota, kueue_workload, spares, support, survivors
from ..decide.gang_mechanisms import of_status
from ..decide.nodes import NodeView, node_view, with_lease
from ..decide.podstate import pod_attempt
from . import kueue_reads
from .discovery import ApiDiscovery
from .executor import foreign_pods
from .kube import KubeApi
from .watch_cache import WatchCache
from .workqueue import Key

SUPPORT_RECHECK_S = 30.0
"""How long a clean read of a job's support objects (every one there and the job's own) stands
in for reading them again: how soon one deleted by hand while its gang runs is made again."""


FORGET_RENEWALS_SECONDS = 600.0
"""A Lease renewal read longer ago than this is forgotten (its node's report is long settled)."""


@dataclass(frozen=True)
class _SupportRead:
    uid: str
    observed: support.Observed
    at: float


@dataclass
class JobInputs:
    """What the reconcile of one job is decided from, besides the job."""

    pods: list[dict[str, Any]]
    observed: support.Observed
    nodes: dict[str, NodeView]


class JobReader:
    """Reads the inputs of a job's reconcile for one operator process."""

    def __init__(self, api: KubeApi, discovery: ApiDiscovery, watched: WatchCache):
        self.api = api
        self.discovery = discovery
        self.watched = watched
        self.support_reads: dict[Key, _SupportRead] = {}
        self.renewals_seen: dict[str, tuple[str, datetime]] = {}
        """Per node: the Lease renewal last read, and when it was first read."""

    async def read(self, job: Job, labelled: list[dict[str, Any]]) -> JobInputs:
        """The job's pods (``labelled``: listed by the job's label, read beside the job; with any
        unlabelled pod holding a name of its attempt), its support objects as they are now, and
        the nodes its pods run on."""
        observed, holders = await asyncio.gather(
            self.support(job), self.unlabelled_holders(job, labelled)
        )
        pods = labelled + holders
        return JobInputs(pods=pods, observed=observed, nodes=await self.node_views(job, pods))

    async def node_views(self, job: Job, pods: list[dict[str, Any]]) -> dict[str, NodeView]:
        """The nodes of the attempt's pods and spares: from the node watch (which also knows
        the nodes it saw deleted), else a GET."""
        wanted = {
            (p.get("spec") or {}).get("nodeName")
            for p in pods
            if support.controlled_by(p, job.ref.uid)
            and (pod_attempt(p) == job.status.attempt or spares.is_spare(p))
        } - {None, ""}
        views: dict[str, NodeView] = {}
        missing = []
        for name in wanted:
            cached = self.watched.node(name)
            if cached is not None:
                views[name] = cached
            else:
                missing.append(name)
        fetched = await asyncio.gather(*(self.api.get_node(n) for n in missing))
        for name, body in zip(missing, fetched, strict=True):
            views[name] = node_view(name, body)
        if survivors.reports_lost_peer(pods, job.status.attempt):
            await self.read_leases(views)
        return views

    async def read_leases(self, views: dict[str, NodeView]) -> None:
        """Add their Leases to the views of the nodes that exist: a rank reported a lost peer,
        and a node whose kubelet stopped renewing is the one that went (``decide/classify``).
        Read only then, never watched: every kubelet renews its Lease every 10 s."""
        named = [name for name, view in views.items() if not view.gone]
        leases = await asyncio.gather(*(self.api.get_node_lease(n) for n in named))
        now = datetime.now(UTC)
        for name, lease in zip(named, leases, strict=True):
            renewal = str(((lease or {}).get("spec") or {}).get("renewTime") or "")
            last = self.renewals_seen.get(name)
            if last is None or last[0] != renewal:
                last = self.renewals_seen[name] = (renewal, now)
            views[name] = with_lease(views[name], lease, last[1])
        for name, (_, seen) in list(self.renewals_seen.items()):
            if (now - seen).total_seconds() > FORGET_RENEWALS_SECONDS:
                del self.renewals_seen[name]

    async def unlabelled_holders(
        self, job: Job, listed: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """Pods without the job's labels (made by hand) that hold a pod name of the attempt
        still to be created: the label selector cannot see them, and creating the rank's pod
        would answer 409 as if it were the job's own. Read only while a gang is created."""
        st = job.status
        if job.ref.deleting or st.phase in TERMINAL_PHASES or job.spec.suspend or st.gang_created:
            return []
        wanted = set(survivors.attempt_pod_names(job)) - {p["metadata"]["name"] for p in listed}
        return await foreign_pods(self.api, job.ref.namespace, wanted, job.ref.uid)

    async def support(self, job: Job) -> support.Observed:
        """The job's support objects as they are now (not read once the job has ended)."""
        if job.ref.deleting or job.status.phase in TERMINAL_PHASES or job.spec.suspend:
            return {}
        observed = await self.support_objects(job)
        if not job.status.gang_created and await self.discovery.pod_groups():
            # Its name may still be held by the group of a deleted job of the same name.
            group = gang.group_name(job.ref.name, job.status.attempt)
            observed = {
                **observed,
                support.POD_GROUP: await self.api.get_object(
                    self.api.pod_group_path(job.ref.namespace, group)
                ),
            }
        if job.status.gang_created and of_status(job.status.gang_scheduling).queued:
            # A queue admits the gang: Kueue's Workload says whether it did, and why not.
            workload = await kueue_reads.read_workload(self.api, job)
            if workload is not False:
                observed = {**observed, kueue_workload.WORKLOAD: workload}
        if job.spec.elastic is not None and job.spec.queue_name and await self.discovery.kueue():
            # Elastic sizing counts the queue's free quota as well as node room.
            queue = await kueue_reads.read_cluster_queue(self.api, job)
            if queue is not False:
                observed = {**observed, kueue_quota.CLUSTER_QUEUE: queue}
        return observed

    async def support_objects(self, job: Job) -> support.Observed:
        """The ServiceAccount, Role, RoleBinding and Service as read now, or as read less than
        ``SUPPORT_RECHECK_S`` ago when that read found all of them, each the job's own."""
        key = (job.ref.namespace, job.ref.name)
        last = self.support_reads.get(key)
        if (
            last is not None
            and last.uid == job.ref.uid
            and time.monotonic() - last.at < SUPPORT_RECHECK_S
        ):
            return dict(last.observed)
        wanted = {
            kind: body["metadata"]["name"]
            for kind, body in support.desired(job, job.status.attempt).items()
        }
        observed = await self.api.get_support(job.ref.namespace, wanted)
        if all(b is not None and support.controlled_by(b, job.ref.uid) for b in observed.values()):
            self.support_reads[key] = _SupportRead(job.ref.uid, observed, time.monotonic())
        else:
            self.support_reads.pop(key, None)
        return observed

    def note_written(self, key: Key, writes: list[support.SupportWrite]) -> None:
        """The pass wrote these support objects, and the API server took every write. A kept
        read of the job takes in the updates (the Role's pod names move with every attempt: a
        resubmission need not be followed by four GETs); a creation makes the next pass read."""
        last = self.support_reads.get(key)
        if last is None or not writes:
            return
        if any(not write.update for write in writes):
            self.forget_support(key)
            return
        observed = dict(last.observed)
        for write in writes:
            observed[write.kind] = _merged(observed.get(write.kind) or {}, write.patch)
        self.support_reads[key] = _SupportRead(last.uid, observed, last.at)

    def forget_support(self, key: Key) -> None:
        """The next pass of this job reads its support objects again (this pass wrote one, or
        failed, or the job is gone)."""
        self.support_reads.pop(key, None)


def _merged(body: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``body`` after a JSON merge patch (RFC 7386) without deletions: what the server stores."""
    merged = dict(body)
    for key, value in patch.items():
        before = merged.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            merged[key] = _merged(before, value)
        else:
            merged[key] = value
    return merged
