"""The controller: turns watch events into kicks, and a kick into read -> decide -> apply.

Reads that decide anything come from the API server (the job and its pods, consistent reads),
never from a cache that could be behind after a restart: a pod missing from a cold cache must not
look like a lost rank. The only caches are for *routing* (which jobs run on a node), for node
state, where a miss falls back to a GET and staleness only delays a decision by one event
(``watch_cache.py``), and a job's support objects found intact, for up to 30 s
(``job_reads.py``).

The controller keeps the work queue and what this process remembers between passes (the
versions it wrote, the invalid jobs it reported, the elastic jobs woken by node changes, the
peering pause); what one pass reads is ``job_reads.py``, and applying its plan is
``executor.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from ..api import names
from ..api.api_types import job_ref, parse_job
from ..api.spec_types import ExitCodeAction
from ..api.status_types import TERMINAL_PHASES, Cause
from ..api.timeutil import utcnow
from ..decide import invalid_spec
from ..decide.nodes import NodeView
from ..decide.plan_types import Plan
from ..decide.reconcile import reconcile
from . import metrics
from .discovery import ApiDiscovery
from .executor import Applied, Executor
from .job_reads import JobReader
from .kube import ApiError, KubeApi
from .watch_cache import WatchCache
from .workqueue import Key, WorkQueue

log = logging.getLogger(__name__)


PAUSED_RECHECK = 5.0
"""Seconds before a job skipped during a peering pause is looked at again. kopf's resumed watches
re-list every job anyway; this only guarantees that none is left behind."""


def _key(body: dict[str, Any]) -> Key:
    meta = body.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


def error_kind(err: Exception) -> str:
    """The ``kind`` label of ``rtj_reconcile_errors_total`` for a reconcile that raised."""
    if isinstance(err, ApiError):
        if err.forbidden:
            return "forbidden"
        if err.status == 429 or err.status >= 500:
            return "server"
        return "api"
    if isinstance(err, OSError | TimeoutError):
        return "connection"
    return "unexpected"


def _changes_next_decision(plan: Plan) -> bool:
    """Whether applying ``plan`` changed something the next reconcile reads."""
    return bool(
        plan.status is not None or plan.after_creation is not None or plan.support or plan.deletions
    )


def observe_applied(plan: Plan, applied: Applied, first_kick: float) -> None:
    """Metrics of one applied plan."""
    if plan.interruption is not None:
        kind = (
            "preemption"
            if plan.interruption.preemption
            else "suspend"
            if plan.interruption.cause is Cause.SUSPENDED
            else "grow"
            if plan.interruption.cause is Cause.GROW
            else "reshrink"
            if plan.interruption.cause is Cause.UNSCHEDULABLE
            else "retry"
            if plan.interruption.action is ExitCodeAction.RETRY
            else "failure"
        )
        metrics.INTERRUPTIONS.labels(plan.interruption.cause.value, kind).inc()
    if (
        plan.status is not None
        and plan.status.quarantined > 0
        and any(e.reason == "CheckpointQuarantined" for e in plan.events)
    ):
        metrics.QUARANTINES.inc()
    if plan.resubmission and plan.creations and applied.gang_complete_at is not None:
        metrics.RESUBMISSIONS.labels(plan.resubmission).inc()
        if plan.resubmission == "preemption":
            metrics.RESUBMISSION_LATENCY.observe(applied.gang_complete_at - first_kick)


class Controller:
    """One per operator process."""

    def __init__(self, api: KubeApi, resync_seconds: float = 300.0, concurrency: int = 8):
        self.api = api
        self.executor = Executor(api)
        self.queue = WorkQueue(self._counted_sync, concurrency=concurrency)
        self.resync_seconds = resync_seconds
        self.watched = WatchCache()
        # Elastic jobs, woken by any node change: capacity anywhere can start, shrink or grow them.
        self.capacity_watchers: set[Key] = set()
        self.discovery = ApiDiscovery(api)
        self.reader = JobReader(api, self.discovery, self.watched)
        self.written_versions: dict[Key, str] = {}
        # Jobs that do not parse, as reported: (uid, generation).
        self.invalid_reported: dict[Key, tuple[str, int]] = {}
        # Whether kopf peering pauses this replica now (None: standalone, never paused).
        self.pause_check: Callable[[], Awaitable[bool]] | None = None
        self.paused = False

    async def start(self) -> None:
        """Start the workers."""
        self.queue.start()

    async def stop(self) -> None:
        """Stop the workers and release the client."""
        await self.queue.stop()
        self.api.close()

    # -- event routing (called from kopf handlers) -----------------------------------------

    def on_job_event(self, event_type: str | None, body: dict[str, Any]) -> None:
        """Any change of a job kicks it, except the echo of the operator's own status write."""
        key = _key(body)
        if event_type == "DELETED":
            self.queue.forget(key)
            self.written_versions.pop(key, None)
            self.invalid_reported.pop(key, None)
            metrics.PHASES.forget(key)
            return
        metrics.PHASES.set(key, (body.get("status") or {}).get("phase"))
        version = (body.get("metadata") or {}).get("resourceVersion")
        if version is not None and self.written_versions.get(key) == version:
            return
        self.queue.kick(key)

    @property
    def nodes(self) -> dict[str, NodeView]:
        """Nodes as last seen by the node watch."""
        return self.watched.nodes

    def on_pod_event(self, event_type: str | None, body: dict[str, Any]) -> None:
        """A rank pod changed: remember its node for routing and kick its job, if kopf reported
        it (``_kick_reported``; a job's own first event reads its pods anyway)."""
        key = self.watched.pod_event(event_type, body)
        if key is not None:
            self._kick_reported(key)

    def on_node_event(self, event_type: str | None, body: dict[str, Any]) -> None:
        """Kick the jobs on a node (those kopf reported) when something that matters about it
        changed."""
        on_node = self.watched.node_event(event_type, body)
        if on_node is None:
            return
        for key in on_node:
            self._kick_reported(key)
        for key in list(self.capacity_watchers):
            self.queue.kick(key)  # an elastic job may now shrink, start or grow

    def _kick_reported(self, key: Key) -> None:
        """Kick a job the pod or node watch names, if kopf reported it: those watches may see
        the pods of namespaces this replica does not serve (a namespace glob watches them
        cluster-wide), whose jobs another operator may serve."""
        if key in self.queue.entries:
            self.queue.kick(key)

    def resync_all(self) -> None:
        """Kick every known job (the periodic safety net for anything missed)."""
        for key in list(self.queue.entries):
            self.queue.kick(key)

    # -- one reconcile ---------------------------------------------------------------------

    async def _counted_sync(self, key: Key, first_kick: float) -> float | None:
        """``sync``, counting a failure (the queue retries it) in ``rtj_reconcile_errors_total``."""
        try:
            return await self.sync(key, first_kick)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            metrics.RECONCILE_ERRORS.labels(error_kind(err)).inc()
            raise

    async def sync(self, key: Key, first_kick: float) -> float | None:
        """Reconcile one job; returns when to look again (None: on the next event)."""
        started = time.monotonic()
        if await self._paused():
            return PAUSED_RECHECK
        namespace, name = key
        # The pods are listed beside the job's read, not after it: one round trip less on every
        # pass. Both start after this job's previous pass ended, so both see what it wrote.
        body, pods = await asyncio.gather(
            self.api.get_job(namespace, name),
            self.api.list_pods(namespace, names.job_selector(name)),
        )
        if body is None:
            self._forget_job(key)
            return None
        try:
            job = parse_job(body)
        except ValidationError as err:
            # The CRD's schema refuses such objects; one gets here past a CRD older than the
            # operator, an API server that does not enforce CEL, or stored before a rule.
            metrics.RECONCILE_ERRORS.labels("invalid-spec").inc()
            return await self._report_invalid(key, body, err)
        inputs = await self.reader.read(job, pods)
        now = utcnow()
        departed = self.watched.departed_pods(key, {p["metadata"]["name"] for p in inputs.pods})
        wait = self.watched.deletion_event_wait(key, job, inputs.pods, departed)
        if wait is not None:
            return wait
        if job.spec.elastic is not None and job.status.phase not in TERMINAL_PHASES:
            self.capacity_watchers.add(key)
        else:
            self.capacity_watchers.discard(key)
        plan = reconcile(
            job,
            inputs.pods,
            inputs.nodes,
            now,
            departed=departed,
            observed_support=inputs.observed,
            cluster_nodes=list(self.nodes.values()) if job.spec.elastic is not None else None,
            # Asked on every pass (cached): a pass that ends an attempt creates the next gang
            # with the status it read, in which the old gang still counts as created.
            native_gang=await self.discovery.pod_groups(),
            kueue=await self.discovery.kueue() if job.spec.queue_name else False,
        )
        try:
            applied = await self.executor.apply(job, plan, now)
        except BaseException as err:
            self.reader.forget_support(key)
            if isinstance(err, ApiError) and err.conflict:
                metrics.RECONCILE_ERRORS.labels("conflict").inc()
                return 0.0  # someone wrote first: re-read and decide again
            raise
        self.reader.note_written(key, plan.support)
        self._record_applied(key, plan, applied, first_kick=first_kick, started=started)
        return self._next_look(plan)

    def _forget_job(self, key: Key) -> None:
        """The job is gone: drop what this process remembers of it."""
        self.capacity_watchers.discard(key)
        self.queue.forget(key)
        self.reader.forget_support(key)
        self.invalid_reported.pop(key, None)
        metrics.PHASES.forget(key)

    def _record_applied(
        self, key: Key, plan: Plan, applied: Applied, *, first_kick: float, started: float
    ) -> None:
        """Remember the version written (its echo is not a kick), count and log the pass."""
        self.written_versions[key] = applied.resource_version
        metrics.PHASES.set(key, applied.status.phase.value if applied.status.phase else None)
        observe_applied(plan, applied, first_kick)
        metrics.RECONCILE_SECONDS.observe(time.monotonic() - started)
        if plan.status is not None or plan.creations:
            log.info(
                "%s/%s: phase=%s attempt=%d created=%d deleted=%d notices=%d",
                *key,
                applied.status.phase,
                applied.status.attempt,
                applied.created,
                len(plan.deletions),
                len(plan.notices),
            )

    def _next_look(self, plan: Plan) -> float | None:
        """When to reconcile the job again after applying ``plan``."""
        requeue = plan.requeue_after
        if _changes_next_decision(plan):
            # What this pass wrote is an input of the next decision (the gang-created mark, a
            # new attempt, a support object): decide again now rather than wait for an event
            # that may never come (the operator's own status writes are not echoed).
            requeue = 0.0
        if self.resync_seconds > 0:
            requeue = self.resync_seconds if requeue is None else min(requeue, self.resync_seconds)
        return requeue

    async def _report_invalid(
        self, key: Key, body: dict[str, Any], err: ValidationError
    ) -> float | None:
        """Say on the job why it is left alone, once per generation (invalid_spec.py). The
        stored condition makes it once across operator restarts; the memory, once even when
        the API server refuses that status write."""
        ref = job_ref(body)
        message = invalid_spec.describe(err)
        seen = (ref.uid, ref.generation)
        if self.invalid_reported.get(key) == seen:
            return None
        now = utcnow()
        conditions = invalid_spec.blocked_conditions(
            body.get("status"), ref.generation, message, now
        )
        if conditions is not None:
            log.error("%s/%s: %s", *key, message)
            try:
                version = await self.executor.report_invalid(ref, conditions, message, now)
            except ApiError as write_err:
                if write_err.conflict:
                    return 0.0  # changed meanwhile: read it again
                raise
            if version:
                self.written_versions[key] = version
        self.invalid_reported[key] = seen
        return None

    async def _paused(self) -> bool:
        """Whether peering pauses this replica. kopf's pause stops only its watches; the work
        queue's timers (resync, backoff, grace periods) would go on acting, from a node cache
        that no event refreshes while paused, beside the replica that does the work."""
        if self.pause_check is None:
            return False
        paused = await self.pause_check()
        self.note_paused(paused)
        return paused

    def note_paused(self, paused: bool) -> None:
        """Peering pauses this replica now (or no longer): what it must forget on pausing."""
        if paused and not self.paused:
            log.info("paused by peering: no job is reconciled until the pause ends")
            # The next active spell decides from nothing seen before the pause: the node states
            # are forgotten (a miss falls back to a GET; the node watch refills them).
            self.watched.forget_nodes()
            metrics.PHASES.clear()  # the active replica reports the jobs
        elif self.paused and not paused:
            log.info("peering pause over: reconciling again")
        self.paused = paused
