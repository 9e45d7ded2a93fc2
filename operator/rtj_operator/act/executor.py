"""Apply a reconcile plan to the API server, in the order that keeps a crash harmless.

1. status (compare-and-swap on resourceVersion): the decision is recorded before anything acts
   on it, and a decision based on a stale read is refused; beside that write, what only
   prepares for a gang and that nothing acts on until a pod exists: the support objects in
   dependency order (ServiceAccount, Role and Service, then the RoleBinding once its Role
   exists) and the attempt's PodGroup (a refused decision leaves at most a Role naming the next
   attempt's pods and an unused group, both the job's own, which the next pass corrects or
   uses);
2. once the status is written: pod deletions and notices, concurrently with
3. once the support objects and the group exist: the gang's pods (every rank in parallel,
   beside the previous attempt's group's removal; a 409 is checked: a pod or group the job does
   not control under that name leaves the gang unmarked, and the next pass blocks the job
   naming it);
4. the "gang created" mark, only when every pod exists.

A crash or an API error between any two steps leaves a status from which the next reconcile
does the rest: support objects are compared with the desired state on every pass, so one that
failed to be created is created by the next pass, whether or not any pod is still missing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..api.api_types import Job, JobRef
from ..api.envvars import NOTICE_ANNOTATION
from ..api.status_types import JobStatus, Phase
from ..decide import conditions as cond
from ..decide.invalid_spec import INVALID_SPEC
from ..decide.plan_types import EventSpec, Plan
from ..decide.support import (
    DEPENDENCY_ORDER,
    POD,
    ROLE_BINDING,
    SupportWrite,
    controlled_by,
)
from . import metrics
from .events import EventPoster
from .kube import ApiError, KubeApi
from .pod_groups import PodGroupWriter

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
    """Applies plans for one operator process. The attempts' PodGroups (``pod_groups.py``) and
    the Events (``events.py``) are collaborators of their own; the order of the steps is here."""

    def __init__(self, api: KubeApi):
        self.api = api
        self.events = EventPoster(api)
        self.pod_groups = PodGroupWriter(api)

    async def write_status(self, job: Job, old: dict[str, Any], new: JobStatus, rv: str) -> str:
        """Write ``new`` over the stored ``old`` (CAS on ``rv``); returns the new version."""
        patch = merge_patch(old, status_dump(new))
        if not patch:
            return rv
        result = await self.api.patch_job_status(job.ref.namespace, job.ref.name, patch, rv)
        return str((result.get("metadata") or {}).get("resourceVersion") or rv)

    async def report_invalid(
        self,
        ref: JobRef,
        conditions: list[dict[str, Any]],
        message: str,
        now: datetime,
    ) -> str | None:
        """A job that does not parse: write its status conditions (CAS on its resourceVersion;
        raises on a conflict), then one Warning event. Nothing else is written. Returns the new
        resourceVersion, or None when the status write was refused otherwise (a status the API
        server will not take back): the event still goes out, as the only word the user gets."""
        version: str | None = None
        try:
            result = await self.api.patch_job_status(
                ref.namespace, ref.name, {"conditions": conditions}, ref.resource_version
            )
            version = str((result.get("metadata") or {}).get("resourceVersion") or "")
        except ApiError as err:
            if err.conflict:
                raise
            log.warning("could not record that %s does not parse: %s", ref.name, err)
        self.events.post(ref, [EventSpec("Warning", INVALID_SPEC, message)], now)
        return version

    async def apply(self, job: Job, plan: Plan, now: datetime) -> Applied:
        """Apply ``plan`` (computed from ``job``); raises on conflicts and API errors."""
        ns = job.ref.namespace
        rv, status, stored = job.ref.resource_version, job.status, job.raw_status
        # Beside the status write, not after it: one round trip less before the pods of every
        # resubmission (the module's docstring says why nothing is lost if the write is refused).
        prepared = asyncio.ensure_future(self._prepare(job, plan))
        try:
            if plan.status is not None:
                rv = await self.write_status(job, stored, plan.status, rv)
                status, stored = plan.status, status_dump(plan.status)
        except BaseException:
            await asyncio.gather(prepared, return_exceptions=True)
            raise
        applied = Applied(resource_version=rv, status=status)

        side_task = asyncio.ensure_future(self._gather(self._side_writes(ns, plan)))
        try:
            invalid, foreign = await self._create_gang(job, plan, prepared)
        except ApiError as err:
            if err.forbidden and plan.after_creation is not None:
                await self._record_refusal(
                    job, plan, err, stored=stored, status=status, rv=rv, now=now
                )
            # The status written above records the transitions these events describe, so the
            # retry will not plan them again: they go out now (the creation's own event waits).
            self._post_events(job, plan, now, only_recorded=True)
            raise
        except BaseException:
            self._post_events(job, plan, now, only_recorded=True)
            raise
        finally:
            await side_task
        if foreign:
            # A name of this attempt is held by an object the job does not control: the gang
            # is not created; the next pass reads the holder and blocks the job naming it.
            log.warning(
                "%s/%s: %s not controlled by the job; the gang is not marked created",
                ns,
                job.ref.name,
                ", ".join(foreign),
            )
            self._post_events(job, plan, now, only_recorded=True)
            return applied
        if plan.after_creation is not None:
            applied.created = len(plan.creations)
            applied.gang_complete_at = time.monotonic()
            final = _creation_outcome(job, plan, plan.after_creation, invalid, now)
            applied.resource_version = await self.write_status(job, stored, final, rv)
            applied.status = final

        self._post_events(job, plan, now)
        return applied

    def _side_writes(self, namespace: str, plan: Plan) -> list[Any]:
        """The writes that go beside the gang's creation: pod deletions, notices (and their
        withdrawals), membership relabels and spares."""
        side = [self.api.delete_pod(namespace, d.name, d.uid) for d in plan.deletions]
        side += [
            self.api.annotate_pod(namespace, n.pod, {NOTICE_ANNOTATION: n.payload})
            for n in plan.notices
        ]
        side += [
            self.api.relabel_pod(namespace, m.pod, m.labels, m.annotations)
            for m in plan.memberships
        ]
        side += [self._create_spare(namespace, pod) for pod in plan.spares]
        metrics.NOTICES.inc(sum(1 for n in plan.notices if n.payload))  # not the withdrawals
        return side

    async def _prepare(self, job: Job, plan: Plan) -> list[str]:
        """The support objects and (when the plan creates a gang) its PodGroup, concurrently;
        the foreign holder of the group's name, if any (``PodGroupWriter.create_for``)."""
        if plan.after_creation is None:
            await self._apply_support(job.ref.namespace, plan.support)
            return []
        _, foreign = await asyncio.gather(
            self._apply_support(job.ref.namespace, plan.support),
            self.pod_groups.create_for(job, plan),
        )
        return foreign

    async def _create_gang(
        self, job: Job, plan: Plan, prepared: asyncio.Future[list[str]]
    ) -> tuple[str | None, list[str]]:
        """Once ``prepared`` (``_prepare``) is done, the gang's pods, beside the previous
        attempt's group's removal. Returns ``_create_pods``'s answer: the invalid template's
        message, the foreign holders."""
        foreign = await prepared
        if plan.after_creation is None or foreign:
            return None, foreign
        created, _ = await asyncio.gather(
            self._create_pods(job, plan), self.pod_groups.delete_previous(job, plan)
        )
        return created

    async def _record_refusal(
        self,
        job: Job,
        plan: Plan,
        refusal: ApiError,
        *,
        stored: dict[str, Any],
        status: JobStatus,
        rv: str,
        now: datetime,
    ) -> None:
        """Admission refused a pod (403): say so in ``Blocked`` and an event, once per message.
        What refuses it (a missing ServiceAccount, a quota, Pod Security) is fixed outside the
        job, so the pass is retried with the work queue's backoff."""
        message = (
            f"the API server refused a pod of attempt {status.attempt}: {refusal.message}; retrying"
        )
        had = cond.condition(status, cond.BLOCKED)
        if had is not None and had.status == "True" and had.message == message:
            return
        blocked = status.model_copy(deep=True)
        cond.set_condition(
            blocked,
            cond.BLOCKED,
            True,
            reason=cond.POD_CREATION_REFUSED,
            message=message,
            now=now,
            generation=job.ref.generation,
        )
        plan.event("Warning", cond.POD_CREATION_REFUSED, message)
        try:
            await self.write_status(job, stored, blocked, rv)
        except ApiError as err:
            log.warning("could not record the refusal of %s's pods: %s", job.ref.name, err)

    async def _apply_support(self, namespace: str, writes: list[SupportWrite]) -> None:
        """Create or update support objects in dependency order; raises when one fails, so
        no pod is created before its identity exists (the work queue retries the pass)."""
        first = [w for w in writes if w.kind != ROLE_BINDING]
        first.sort(key=lambda w: DEPENDENCY_ORDER.index(w.kind))
        await self._gather([self._write_support(namespace, w) for w in first])
        # A RoleBinding is checked against its Role by the API server's escalation check.
        await self._gather(
            [self._write_support(namespace, w) for w in writes if w.kind == ROLE_BINDING]
        )

    async def _write_support(self, namespace: str, write: SupportWrite) -> None:
        path = self.api.support_path(namespace, write.kind)
        if write.update:
            await self.api.merge_patch(path, write.name, write.patch)
        else:
            # 409: created meanwhile; the next pass checks that the job controls it.
            await self.api.create(path, write.body)
        log.info(
            "%s/%s: %s %s",
            namespace,
            write.name,
            "updated" if write.update else "created",
            write.kind,
        )

    async def _create_spare(self, namespace: str, pod: dict[str, Any]) -> None:
        """Create a spare pod; a refusal (a quota, admission) costs the job only the spare."""
        try:
            await self.api.create(self.api.core_path(namespace, "pods"), pod)
        except ApiError as err:
            log.warning("%s/%s: spare not created: %s", namespace, pod["metadata"]["name"], err)

    async def _create_pods(self, job: Job, plan: Plan) -> tuple[str | None, list[str]]:
        """Create every missing rank. Returns the API server's message when the template is
        invalid (a permanent error), else None, and the pods (``Pod <name>``) whose creation
        answered 409 because a pod the job does not control holds the name."""
        if not plan.creations:
            return None, []
        ns = job.ref.namespace
        pods_path = self.api.core_path(ns, "pods")
        creations = list(plan.creations)
        results = await asyncio.gather(
            *(self.api.create(pods_path, pod) for pod in creations),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        for error in errors:
            if isinstance(error, ApiError) and error.invalid:
                return error.message, []
        if errors:  # a refusal first: the job says why its pods do not exist
            raise next((e for e in errors if isinstance(e, ApiError) and e.forbidden), errors[0])
        existed = [
            pod["metadata"]["name"]
            for pod, made in zip(creations, results, strict=True)
            if made is False  # 409: a pod of that name exists
        ]
        held = await foreign_pods(self.api, ns, existed, job.ref.uid)
        return None, [f"{POD} {pod['metadata']['name']}" for pod in held]

    @staticmethod
    async def _gather(calls: list[Any]) -> None:
        results = await asyncio.gather(*calls, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    def _post_events(
        self, job: Job, plan: Plan, now: datetime, *, only_recorded: bool = False
    ) -> None:
        """Fire and forget: an Event must never delay or fail a resubmission."""
        events = [e for e in plan.events if not (only_recorded and e.with_creation)]
        self.events.post(job.ref, events, now)


def _creation_outcome(
    job: Job, plan: Plan, created: JobStatus, invalid: str | None, now: datetime
) -> JobStatus:
    """The status that marks the gang ``created``; a template the API server calls invalid (a
    permanent error) fails the job instead, saying why."""
    if invalid is None:
        return created
    final = created.model_copy(deep=True)
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
    return final


async def foreign_pods(
    api: KubeApi, namespace: str, pod_names: Iterable[str], uid: str
) -> list[dict[str, Any]]:
    """The pods of these names that exist and that the job with ``uid`` does not control (a
    pod made by hand under a rank's name): read by name, as the job's label selector cannot
    see a pod without its labels."""
    found = await asyncio.gather(
        *(api.get_object(api.core_path(namespace, "pods", n)) for n in pod_names)
    )
    return [p for p in found if p is not None and not controlled_by(p, uid)]
