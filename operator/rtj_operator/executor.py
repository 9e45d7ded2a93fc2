"""Apply a reconcile plan to the API server, in the order that keeps a crash harmless.

1. status (compare-and-swap on resourceVersion): the decision is recorded before anything acts
   on it, and a decision based on a stale read is refused;
2. pod deletions and notices, concurrently with
3. the trainer identity and the gang's pods (every rank in parallel; 409 means it exists);
4. the "gang created" mark, only when every pod exists.

A crash between any two steps leaves a status from which the next reconcile does the rest.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from . import conditions as cond
from . import metrics, names, testhooks
from .api_types import Job
from .envvars import NOTICE_ANNOTATION
from .kube import ApiError, KubeApi
from .manifests import (
    build_role_binding,
    build_service,
    build_service_account,
    uses_trainer_identity,
)
from .plan_types import Plan
from .status_types import JobStatus, Phase
from .timeutil import iso

log = logging.getLogger(__name__)


def status_dump(status: JobStatus) -> dict[str, Any]:
    """The wire form of a status."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge patch turning ``old`` into ``new`` (removed keys become null)."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif value != before:
            patch[key] = value
    return patch


@dataclass
class Applied:
    """What applying a plan produced."""

    resource_version: str
    status: JobStatus
    created: int = 0
    gang_complete_at: float | None = None
    """Monotonic time when the last pod of a new gang was created."""


class Executor:
    """Applies plans for one operator process."""

    def __init__(self, api: KubeApi):
        self.api = api
        self._event_tasks: set[asyncio.Task[None]] = set()

    async def write_status(self, job: Job, old: dict[str, Any], new: JobStatus, rv: str) -> str:
        """Write ``new`` over the stored ``old`` (CAS on ``rv``); returns the new version."""
        patch = merge_patch(old, status_dump(new))
        if not patch:
            return rv
        result = await self.api.patch_job_status(job.ref.namespace, job.ref.name, patch, rv)
        return str((result.get("metadata") or {}).get("resourceVersion") or rv)

    async def apply(self, job: Job, plan: Plan, now: datetime) -> Applied:
        """Apply ``plan`` (computed from ``job``); raises on conflicts and API errors."""
        ns = job.ref.namespace
        rv, status, stored = job.ref.resource_version, job.status, job.raw_status
        if plan.status is not None:
            rv = await self.write_status(job, stored, plan.status, rv)
            status, stored = plan.status, status_dump(plan.status)
            if plan.creations:
                testhooks.crash_point("after-status", status.attempt)

        side = [self.api.delete_pod(ns, d.name, d.uid) for d in plan.deletions]
        side += [
            self.api.annotate_pod(ns, n.pod, {NOTICE_ANNOTATION: n.payload}) for n in plan.notices
        ]
        metrics.NOTICES.inc(len(plan.notices))
        applied = Applied(resource_version=rv, status=status)

        if plan.after_creation is None:
            await self._gather(side)
        else:
            side_task = asyncio.ensure_future(self._gather(side))
            invalid = await self._create_gang(job, plan)
            await side_task
            applied.created = len(plan.creations)
            applied.gang_complete_at = time.monotonic()
            final = plan.after_creation
            if invalid is not None:
                final = plan.after_creation.model_copy(deep=True)
                final.gang_created = False
                final.completion_time = now
                cond.set_phase(
                    final,
                    Phase.FAILED,
                    reason="InvalidPodTemplate",
                    message=invalid,
                    now=now,
                    generation=job.ref.generation,
                )
                plan.event("Warning", "JobFailed", f"InvalidPodTemplate: {invalid}")
            applied.resource_version = await self.write_status(job, stored, final, rv)
            applied.status = final

        self._post_events(job, plan, now)
        return applied

    async def _create_gang(self, job: Job, plan: Plan) -> str | None:
        """Create the trainer identity and every missing rank; the API server's message when
        the template is invalid (a permanent error), else None."""
        ns = job.ref.namespace
        if plan.creations:
            attempt = plan.after_creation.attempt if plan.after_creation else 0
            support = [self.api.create(self.api.core_path(ns, "services"), build_service(job))]
            if uses_trainer_identity(job):
                account = self.api.create(
                    self.api.core_path(ns, "serviceaccounts"), build_service_account(job)
                )
                if attempt == 0:
                    # Admission refuses a pod whose ServiceAccount does not exist yet. Later
                    # attempts find it in place, so it is not on the resubmission's critical
                    # path (were it deleted, the pods fail, the retry recreates it).
                    await account
                else:
                    support.append(account)
                if plan.role is not None:
                    support += [
                        self.api.apply_role(ns, plan.role),
                        self.api.create(
                            self.api.rbac_path(ns, "rolebindings"), build_role_binding(job)
                        ),
                    ]
            pods_path = self.api.core_path(ns, "pods")
            creations = list(plan.creations)
            if testhooks.armed("mid-creation", attempt):
                await self.api.create(pods_path, creations.pop(0))
                testhooks.crash_point("mid-creation", attempt)
            results = await asyncio.gather(
                *(self.api.create(pods_path, pod) for pod in creations),
                *support,
                return_exceptions=True,
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            for error in errors:
                if isinstance(error, ApiError) and error.invalid:
                    return error.message
            if errors:
                raise errors[0]
        return None

    @staticmethod
    async def _gather(calls: list[Any]) -> None:
        results = await asyncio.gather(*calls, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def _post_events(self, job: Job, plan: Plan, now: datetime) -> None:
        """Fire and forget: an Event must never delay or fail a resubmission."""
        if not plan.events:
            return
        involved = {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "name": job.ref.name,
            "namespace": job.ref.namespace,
            "uid": job.ref.uid,
        }

        async def post() -> None:
            for event in plan.events:
                try:
                    await self.api.post_event(
                        involved, event.type, event.reason, event.message, iso(now)
                    )
                except Exception as err:
                    log.warning(
                        "could not post event %s for %s: %s", event.reason, job.ref.name, err
                    )

        task = asyncio.ensure_future(post())
        self._event_tasks.add(task)
        task.add_done_callback(self._event_tasks.discard)
