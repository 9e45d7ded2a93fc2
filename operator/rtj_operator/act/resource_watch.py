"""List, then watch, one collection of objects (the jobs' pods, the nodes) in a thread of its own;
the events reach the event loop in batches.

Why not kopf's event handlers, which watched them before: kopf runs every watch event through
its whole handler machinery (causes, a per-object worker, a logger, the handler's invocation),
about 1.1 ms of the event loop per event here, on top of decoding it. A mass reclaim of 115
four-rank gangs brings about 2,800 pod events in the seconds the resubmissions are due, and those
milliseconds came before the resubmissions in the one event loop. Here an event costs its JSON
decoding (in this thread) and a dictionary update and a kick (in the loop). kopf still watches
the jobs themselves, and does the peering and the liveness endpoint.

The protocol, as Kubernetes clients follow it:

- a list (paginated, a consistent read) delivers every object as an event of type ``None``
  (kopf's type for a listed object); with ``report_vanished``, an object seen before and absent
  from the new list is delivered as ``DELETED`` with its last state (nodes: a node deleted while
  no watch ran must not stay in the node cache);
- then a watch from the list's resourceVersion, with bookmarks; a stream the server ends is
  watched again from the last version seen; an expired version (410 Gone) lists again;
- any other failure is logged, and the list is done again after a pause (1 s, doubling to 30 s).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import urllib3

from .kube_transport import ApiError, Transport

log = logging.getLogger(__name__)

Event = tuple[str | None, dict[str, Any]]
"""A watch event's type (``None`` for a listed object) and the object."""

LIST_PAGE = 500
"""Objects per page of a list."""

WATCH_SECONDS = 300
"""How long the server keeps one watch stream open before it is opened again."""

READ_MARGIN_S = 30.0
"""A stream silent this long past its server-side timeout is taken as a dead connection."""

RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0


GLOB_CHARACTERS = frozenset("*?[]!,")
"""A ``--namespace`` value with one of these is a pattern (kopf's syntax), not a name."""


def pod_watch_paths(namespaces: tuple[str, ...] | None) -> list[str]:
    """Where the jobs' pods are watched: one watch per served namespace (what a Role in each of
    them allows), or one cluster-wide (every namespace served, or any of them given as a
    pattern, which only kopf resolves; the controller kicks only the jobs kopf reported)."""
    if namespaces is None or any(GLOB_CHARACTERS & set(ns) for ns in namespaces):
        return ["/api/v1/pods"]
    return [f"/api/v1/namespaces/{quote(ns)}/pods" for ns in sorted(set(namespaces))]


class ExpiredError(Exception):
    """The watch's resourceVersion is too old (410): list again."""


def _version(body: Mapping[str, Any]) -> str | None:
    return (body.get("metadata") or {}).get("resourceVersion")


def _identity(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


class ResourceWatch:
    """One collection (``path``, optionally filtered by a label ``selector``), listed and watched
    in a daemon thread; ``handler(type, object)`` is called in ``loop`` for every event."""

    def __init__(
        self,
        transport: Transport,
        path: str,
        handler: Callable[[str | None, dict[str, Any]], None],
        loop: asyncio.AbstractEventLoop,
        *,
        selector: str | None = None,
        report_vanished: bool = False,
    ) -> None:
        self.transport = transport
        self.path = path
        self.handler = handler
        self.loop = loop
        self.selector = selector
        self.report_vanished = report_vanished
        self.known: dict[tuple[str, str], dict[str, Any]] = {}
        self.lists = 0
        """Lists done so far (the first one, and one after each expiry or failure)."""
        self._stopping = threading.Event()
        self._response: urllib3.BaseHTTPResponse | None = None
        self._thread = threading.Thread(target=self._run, name=f"watch {path}", daemon=True)

    def start(self) -> None:
        """Start listing and watching."""
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop, and wait up to ``timeout_s`` for the thread (an open stream is shut down)."""
        self._stopping.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()
            except Exception as err:  # a stream closing anyway: nothing more to do
                log.debug("shutting down the watch of %s: %s", self.path, err)
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        version: str | None = None
        pause = RETRY_FIRST_S
        while not self._stopping.is_set():
            try:
                if version is None:
                    version = self._list()
                version = self._watch(version)
                pause = RETRY_FIRST_S
            except ExpiredError:
                version = None
            except Exception as err:  # any failure: list again after a pause
                if self._stopping.is_set():
                    break
                log.warning(
                    "watch of %s failed (%s); listing again in %.0f s", self.path, err, pause
                )
                version = None
                self._stopping.wait(pause)
                pause = min(pause * 2, RETRY_MAX_S)

    def _query(self, **extra: Any) -> dict[str, Any]:
        query: dict[str, Any] = {"labelSelector": self.selector} if self.selector else {}
        return {**query, **extra}

    def _list(self) -> str:
        """List every object (delivered as listed, the vanished as deleted); the version."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = self.transport.request(
                "GET", self.path, query=self._query(limit=LIST_PAGE, **{"continue": token})
            )
            items += page.get("items") or []
            meta = page.get("metadata") or {}
            token = meta.get("continue") or None
            if token is None:
                break
        self.lists += 1
        events: list[Event] = [(None, item) for item in items]
        if self.report_vanished:
            listed = {_identity(item): item for item in items}
            events += [("DELETED", body) for key, body in self.known.items() if key not in listed]
            self.known = listed
        self._deliver(events)
        return str(meta.get("resourceVersion") or "")

    def _watch(self, version: str) -> str:
        """Follow one watch stream from ``version`` until the server ends it; the last version
        seen. Raises ``ExpiredError`` when the version has expired."""
        query = self._query(
            watch="true",
            resourceVersion=version,
            allowWatchBookmarks="true",
            timeoutSeconds=WATCH_SECONDS,
        )
        response = self.transport.stream(
            self.path, query, read_timeout_s=WATCH_SECONDS + READ_MARGIN_S
        )
        self._response = response
        ended = False
        try:
            if self._stopping.is_set():  # stop() came before the response was there to shut
                return version
            if response.status == 410:
                raise ExpiredError
            if response.status >= 300:
                raise Transport.error_of(response, "WATCH", self.path)
            pending = b""
            for chunk in response.stream(65536):
                if self._stopping.is_set():
                    return version
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                events: list[Event] = []
                try:
                    for line in lines:
                        if line.strip():
                            version = self._event(json.loads(line), events) or version
                finally:
                    self._deliver(events)  # the events before an expiry or a bad line too
            ended = True
            return version
        finally:
            self._response = None
            if not ended:  # unread data may follow: the connection is not reused
                response.close()
            response.release_conn()

    def _event(self, event: dict[str, Any], events: list[Event]) -> str | None:
        """Add one watch event to ``events``; the version it carries."""
        kind, body = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if body.get("code") == 410:
                raise ExpiredError
            raise ApiError(int(body.get("code") or 500), body, "WATCH", self.path)
        if kind != "BOOKMARK":
            events.append((kind, body))
            if self.report_vanished:
                if kind == "DELETED":
                    self.known.pop(_identity(body), None)
                else:
                    self.known[_identity(body)] = body
        return _version(body)

    def _deliver(self, events: list[Event]) -> None:
        if events and not self._stopping.is_set():
            try:
                self.loop.call_soon_threadsafe(self._dispatch, events)
            except RuntimeError:  # the loop is closed: the operator is stopping
                self._stopping.set()

    # -- the event loop --------------------------------------------------------------------

    def _dispatch(self, events: list[Event]) -> None:
        for kind, body in events:
            try:
                self.handler(kind, body)
            except Exception:
                log.exception("handling a %s event of %s", kind, self.path)
