"""The kopf handlers: each one only routes an event into the controller (no decisions here).

They are coroutines on purpose: kopf runs plain functions on a thread pool, and the controller's
queue and caches belong to the event loop.

No handler is a change-detecting one (``on.create``/``on.update``), so kopf never adds a
finalizer or its own annotations to a job: deleting a job is never blocked by an absent operator,
and ownerReferences let the garbage collector remove the gang.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from . import metrics, names
from .controller import Controller


def build_registry(
    controller: Controller,
    *,
    metrics_port: int | None = None,
    metrics_address: str = "0.0.0.0",  # noqa: S104
) -> kopf.OperatorRegistry:
    """A kopf registry whose handlers feed ``controller``."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # An explicit registry gets none of kopf's default login handlers.
        return kopf.login_via_client(**kwargs)

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Watch only the pods the operator made (server-side filter).
        settings.watching.label_selectors["v1", "pods"] = names.LABEL_JOB
        # Handlers log a lot at INFO; that must not become Kubernetes Events on every pod.
        settings.posting.level = logging.WARNING
        if metrics_port:
            metrics.serve(metrics_port, metrics_address)
        await controller.start()

    @kopf.on.cleanup(registry=registry)
    async def shutdown(**_: Any) -> None:
        await controller.stop()

    @kopf.on.event(names.GROUP, names.VERSION, names.PLURAL, registry=registry)
    async def job_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        controller.on_job_event(type, dict(body))

    @kopf.on.event("v1", "pods", labels={names.LABEL_JOB: kopf.PRESENT}, registry=registry)
    async def pod_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        controller.on_pod_event(type, dict(body))

    @kopf.on.event("v1", "nodes", registry=registry)
    async def node_event(type: str | None, body: kopf.Body, **_: Any) -> None:
        controller.on_node_event(type, dict(body))

    @kopf.on.probe(id="workqueue", registry=registry)
    async def workqueue(**_: Any) -> dict[str, int]:
        return controller.queue.stats()

    return registry
