"""The kopf handlers: each one only routes an event into the controller (no decisions here).

They are coroutines on purpose: kopf runs plain functions on a thread pool, and the controller's
queue and caches belong to the event loop.

No handler is a change-detecting one (``on.create``/``on.update``), so kopf never adds a
finalizer or its own annotations to a job: deleting a job is never blocked by an absent operator,
and ownerReferences let the garbage collector remove the gang.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import kopf

from ..api import names
from ..api.timeutil import utcnow
from . import peering as peering_module
from .controller import Controller
from .kube import ApiError, KubeApi
from .resource_watch import ResourceWatch, pod_watch_paths

log = logging.getLogger(__name__)

PAUSE_CHECK_TTL = 1.0
"""Seconds an answer of the pause check is reused (one peering read a second at most)."""


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's diff base, for change-detecting handlers: this registry has none, yet kopf builds
    the "essence" of every object on every watch event (a deep copy of the body, then of its
    labels and annotations) to compare it with a stored one. With a few hundred jobs that was
    most of the event loop's time while a mass reclaim's pod events poured in (the ranks'
    resubmissions waited behind it). Nothing is built, fetched or stored."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        """An empty essence (no handler reads it)."""
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        """Nothing was stored."""
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        """Nothing to store (kopf calls it only after change-detecting handlers)."""


class NoProgress(kopf.ProgressStorage):
    """kopf's per-handler progress, for retried change-detecting handlers and daemons: none
    here. The default one deep-copies both essences on every event to clear its own fields."""

    def fetch(self, *, key: Any, body: kopf.Body) -> kopf.ProgressRecord | None:
        """Nothing was stored."""
        return None

    def store(self, *, key: Any, record: Any, body: kopf.Body, patch: kopf.Patch) -> None:
        """Nothing to store."""

    def purge(self, *, key: Any, body: kopf.Body, patch: kopf.Patch) -> None:
        """Nothing to purge."""

    def touch(self, *, body: kopf.Body, patch: kopf.Patch, value: str | None) -> None:
        """Nothing to touch."""

    def clear(self, *, essence: kopf.BodyEssence) -> kopf.BodyEssence:
        """The essence as it is (it holds no progress fields)."""
        return essence


EVENT_HANDLERS = ("job_event",)
"""The names of the event handlers below (kopf's handler ids end with them). The pods and nodes
are watched by ``resource_watch.py``, not by kopf."""


class QuietEventHandlers(logging.Filter):
    """Drops kopf's "Handler '...' succeeded." INFO line of the event handlers (on the
    ``kopf.objects`` logger): one per watch event, thousands a minute while many jobs' pods
    change, and formatting and writing them cost the event loop as much as the reconciles did.
    Their failures are still logged, and ``--verbose`` keeps every line. (kopf itself logs its
    indexers, called as often, only from WARNING up.)"""

    ENDINGS = tuple(f".{name}' succeeded." for name in EVENT_HANDLERS)

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is kept."""
        msg = record.msg
        return not (
            record.levelno == logging.INFO
            and isinstance(msg, str)
            and msg.startswith("Handler '")
            and msg.endswith(self.ENDINGS)
        )


@dataclass(frozen=True)
class PeeringOptions:
    """How this replica takes part in kopf peering (None in build_registry: standalone)."""

    name: str
    identity: str
    priority: int
    lifetime: int
    max_pause: float
    """Liveness fails after a pause this long in which no blocking replica showed life."""
    namespaces: tuple[str, ...] | None
    """Served namespaces (one KopfPeering each); None: cluster-wide (ClusterKopfPeering)."""

    def paths(self) -> list[str]:
        """The peering objects kopf decides from (namespace globs cannot be read directly)."""
        if self.namespaces is None:
            return [peering_module.peering_path(self.name, None)]
        return [
            peering_module.peering_path(self.name, ns)
            for ns in self.namespaces
            if not any(c in ns for c in "*?[]!")
        ]


async def _blocking_records(
    api: KubeApi, options: PeeringOptions
) -> list[peering_module.PeerRecord]:
    """The live records of the peering objects that pause this replica (kopf's rule)."""
    now = utcnow()
    blocking: list[peering_module.PeerRecord] = []
    for path in options.paths():
        body = await api.get_object(path)
        _note_missing(path, body is None)
        records = peering_module.parse_records((body or {}).get("status"))
        blocking += peering_module.blockers(records, options.identity, options.priority, now)
    return blocking


_MISSING: set[str] = set()
"""Peering objects found missing (warned once until they exist)."""


def _note_missing(path: str, missing: bool) -> None:
    """kopf keeps a replica's watches paused, without a word, while its peering object does not
    exist: say so once, naming the object and the fix."""
    if missing and path not in _MISSING:
        _MISSING.add(path)
        log.warning(
            "peering object %s does not exist: kopf handles no job until it does; create it "
            "(the chart does with peering.create=true; operator/deploy/peering.yaml) or run "
            "with --standalone",
            path,
        )
    elif not missing and path in _MISSING:
        _MISSING.discard(path)
        log.info("peering object %s exists now", path)


def _pause_check(api: KubeApi, options: PeeringOptions) -> Callable[[], Awaitable[bool]]:
    """``Controller.pause_check``: whether peering pauses this replica, read at most once per
    ``PAUSE_CHECK_TTL``. An unreadable peering object counts as no pause: compare-and-swap keeps
    two active replicas safe, while a replica that wrongly stops would lose jobs."""
    cached: list[float | bool] = [float("-inf"), False]

    async def paused() -> bool:
        clock = asyncio.get_running_loop().time()
        if clock - float(cached[0]) >= PAUSE_CHECK_TTL:
            try:
                cached[1] = bool(await _blocking_records(api, options))
            except ApiError as err:
                log.warning("cannot read the peering object, acting as unpaused: %s", err)
                cached[1] = False
            cached[0] = clock
        return bool(cached[1])

    return paused


def build_registry(
    controller: Controller,
    *,
    api: KubeApi | None = None,
    peering: PeeringOptions | None = None,
    namespaces: tuple[str, ...] | None = None,
) -> kopf.OperatorRegistry:
    """A kopf registry whose handlers feed ``controller``; with ``api``, its startup also starts
    the watches of the jobs' pods (in ``namespaces``, None: every namespace) and of the nodes."""
    registry = kopf.OperatorRegistry()
    if peering is not None and api is not None:
        controller.pause_check = _pause_check(api, peering)
    _register_lifecycle(registry, controller, api, peering, namespaces)
    _register_watches(registry, controller)
    _register_peering_probe(registry, controller, api, peering)
    return registry


def _register_lifecycle(
    registry: kopf.OperatorRegistry,
    controller: Controller,
    api: KubeApi | None,
    peering_options: PeeringOptions | None,
    namespaces: tuple[str, ...] | None,
) -> None:
    """Login, the settings at startup (with the controller's workers and the pod and node
    watches), the cleanup."""
    watches: list[ResourceWatch] = []

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # An explicit registry gets none of kopf's default login handlers.
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        if peering_options is not None:
            settings.peering.lifetime = peering_options.lifetime
        # Handlers log a lot at INFO; that must not become Kubernetes Events on every pod.
        settings.posting.level = logging.WARNING
        # Only event handlers here: kopf's change-detection bookkeeping is pure cost.
        settings.persistence.diffbase_storage = NoDiffBase()
        settings.persistence.progress_storage = NoProgress()
        if peering_options is not None and api is not None:
            try:  # a missing peering object is said at start, not only by the first probe
                await _blocking_records(api, peering_options)
            except ApiError as err:
                log.warning("cannot read the peering object: %s", err)
        await controller.start()
        if api is not None:
            watches[:] = start_watches(controller, api, namespaces)

    @kopf.on.cleanup(registry=registry)
    async def shutdown(**_: Any) -> None:
        await asyncio.gather(*(asyncio.to_thread(w.stop) for w in watches))
        await controller.stop()


def start_watches(
    controller: Controller, api: KubeApi, namespaces: tuple[str, ...] | None
) -> list[ResourceWatch]:
    """Start the watches of the jobs' pods (label-selected, server side) and of the nodes."""
    loop = asyncio.get_running_loop()
    watches = [
        ResourceWatch(api.transport, path, controller.on_pod_event, loop, selector=names.LABEL_JOB)
        for path in pod_watch_paths(namespaces)
    ]
    watches.append(
        ResourceWatch(
            api.transport, "/api/v1/nodes", controller.on_node_event, loop, report_vanished=True
        )
    )
    for watch in watches:
        watch.start()
    return watches


def _register_watches(registry: kopf.OperatorRegistry, controller: Controller) -> None:
    """The event handler of jobs (it only kicks), and the work queue's probe."""

    @kopf.on.event(names.GROUP, names.VERSION, names.PLURAL, registry=registry)
    async def job_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        controller.on_job_event(type, dict(body))

    @kopf.on.probe(id="workqueue", registry=registry)
    async def workqueue(**_: Any) -> dict[str, int]:
        return controller.queue.stats()


def _register_peering_probe(
    registry: kopf.OperatorRegistry,
    controller: Controller,
    api: KubeApi | None,
    peering_options: PeeringOptions | None,
) -> None:
    """The liveness probe that says who pauses this replica, and fails a pause too long."""
    watch = peering_module.PauseWatch(
        peering_options.max_pause if peering_options else 0.0,
        priority=peering_options.priority if peering_options else None,
    )

    @kopf.on.probe(id="peering", registry=registry)
    async def peering_state(**_: Any) -> dict[str, Any]:
        """Paused by whom; fails (HTTP 500 on the liveness endpoint) when the pause lasts longer
        than expected, so the kubelet restarts a replica that peering keeps idle."""
        if peering_options is None or api is None:
            return {"standalone": True}
        now = utcnow()
        blocking = await _blocking_records(api, peering_options)
        controller.note_paused(bool(blocking))  # also while no job is due for a reconcile
        silent = watch.observe(blocking, now)
        ids = sorted({r.identity for r in blocking})
        if silent is not None:
            ties = sorted({r.identity for r in blocking if r.priority == peering_options.priority})
            if ties:
                raise kopf.PermanentError(
                    f"paused by peering for {silent:.0f}s: {', '.join(ties)} has the same "
                    f"priority {peering_options.priority}, and kopf pauses every replica of a "
                    "tie; give the replicas different --priority values, or leave it out (random)"
                )
            raise kopf.PermanentError(
                f"paused by peering for {silent:.0f}s by {', '.join(ids)}, whose records were "
                f"not refreshed (more than {peering_options.max_pause:.0f}s)"
            )
        return {"identity": peering_options.identity, "pausedBy": ids}
