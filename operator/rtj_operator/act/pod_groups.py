"""The attempt's PodGroup on the API server: created before its pods, the previous one removed.

Under ``gangScheduling: PodGroup`` (decide/gang.py) the plan carries the attempt's group. It is
created before any pod, as the scheduler holds a pod whose group does not exist. A group of that
name that the job does not control (a deleted job's of the same name, one made by hand) is never
used: the gang is left unmarked and the next pass blocks the job naming it. The previous
attempt's group is deleted once this attempt's exists, beside the pods' creation.

The group asks to be preempted whole (``gang.WHOLE_GANG_FIELDS``); an API server without the
WorkloadAwarePreemption feature gate refuses those fields, and from then on this process creates
groups without them (the gang is still scheduled all or nothing).
"""

from __future__ import annotations

import logging
from typing import Any

from ..api.api_types import Job
from ..decide import gang
from ..decide.plan_types import Plan
from ..decide.support import POD_GROUP, controlled_by
from .kube import ApiError, KubeApi

log = logging.getLogger(__name__)


class PodGroupWriter:
    """Creates and removes the attempts' PodGroups for one operator process."""

    def __init__(self, api: KubeApi):
        self.api = api
        self.whole_gang_preemption = True
        """Whether the API server took PodGroups preempted whole (``gang.WHOLE_GANG_FIELDS``);
        False once it refused them: the feature gate is off, and it stays off."""

    async def create_for(self, job: Job, plan: Plan) -> list[str]:
        """Create the attempt's PodGroup before its pods. A group of that name that the job
        does not control is never used: ``["PodGroup <name>"]`` when one holds it (409), else
        []."""
        if plan.pod_group is None:
            return []
        ns = job.ref.namespace
        name = plan.pod_group["metadata"]["name"]
        if not await self._create(ns, plan.pod_group):
            held = await self.api.get_object(self.api.pod_group_path(ns, name))
            if held is not None and not controlled_by(held, job.ref.uid):
                return [f"{POD_GROUP} {name}"]
        return []

    async def delete_previous(self, job: Job, plan: Plan) -> None:
        """Delete the previous attempt's PodGroup once this attempt's exists (best effort: the
        job's deletion collects any left); one the job does not control is left alone."""
        attempt = plan.after_creation.attempt if plan.after_creation else 0
        if plan.pod_group is None or attempt == 0:
            return
        previous = self.api.pod_group_path(
            job.ref.namespace, gang.group_name(job.ref.name, attempt - 1)
        )
        try:
            found = await self.api.get_object(previous)
            if found is not None and controlled_by(found, job.ref.uid):
                await self.api.delete_object(previous, uid=found["metadata"].get("uid"))
        except ApiError as err:
            log.warning("could not delete the PodGroup of attempt %d: %s", attempt - 1, err)

    async def _create(self, namespace: str, group: dict[str, Any]) -> bool:
        """Create the group, preempted whole where the cluster serves that; else as before."""
        path = self.api.pod_group_path(namespace)
        if self.whole_gang_preemption:
            try:
                return await self.api.create(path, group)
            except ApiError as err:
                if not (err.invalid and gang.refuses_whole_gang_fields(err.message)):
                    raise
                self.whole_gang_preemption = False
                log.info(
                    "the API server refuses PodGroup %s: gangs are scheduled all or "
                    "nothing but may be preempted pod by pod (feature gate "
                    "WorkloadAwarePreemption off)",
                    ", ".join(gang.WHOLE_GANG_FIELDS),
                )
        return await self.api.create(path, gang.without_whole_gang_fields(group))
