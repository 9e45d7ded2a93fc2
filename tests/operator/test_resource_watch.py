"""The list-then-watch loop of the pods and nodes (resource_watch.py), against a real HTTP server
on 127.0.0.1 that answers as an API server does: paginated lists, chunked watch streams with
events split across chunks, bookmarks, an expired version, a failing request, a silent stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import urllib3
from kubernetes import client as k8s_client

from rtj_operator.act import resource_watch
from rtj_operator.act.kube_transport import Transport
from rtj_operator.act.resource_watch import ResourceWatch, pod_watch_paths

Answer = Callable[[BaseHTTPRequestHandler, dict[str, str]], None]


def node(name: str, version: str, ready: str = "True") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": version},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }


def send_json(handler: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def send_stream(
    handler: BaseHTTPRequestHandler, chunks: list[bytes], hold: threading.Event | None = None
) -> None:
    """A chunked watch stream; with ``hold``, left open (silent) until it is set."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    for chunk in chunks:
        handler.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        handler.wfile.flush()
    if hold is not None:
        hold.wait(30)
    with contextlib.suppress(OSError):  # the client may have gone away
        handler.wfile.write(b"0\r\n\r\n")


def events(*items: tuple[str, dict[str, Any]]) -> bytes:
    return b"".join(json.dumps({"type": t, "object": o}).encode() + b"\n" for t, o in items)


class Script:
    """The server's answers, in order; every request's query is recorded."""

    def __init__(self, answers: list[Answer]) -> None:
        self.answers = answers
        self.queries: list[dict[str, str]] = []
        self.lock = threading.Lock()

    def next(self, handler: BaseHTTPRequestHandler) -> None:
        query = {k: v[0] for k, v in parse_qs(urlsplit(handler.path).query).items()}
        with self.lock:
            self.queries.append(query)
            answer = self.answers.pop(0) if self.answers else None
        if answer is None:  # the script is over: a stream that stays silent
            send_stream(handler, [], hold=threading.Event())
            return
        answer(handler, query)


@pytest.fixture
def serve() -> Iterator[Callable[[Script], Transport]]:
    servers: list[ThreadingHTTPServer] = []

    def start(script: Script) -> Transport:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                script.next(self)

            def log_message(self, *_: Any) -> None:
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        cfg = k8s_client.Configuration()
        cfg.host = f"http://127.0.0.1:{httpd.server_address[1]}"
        return Transport(
            cfg, user_agent="test", max_connections=4, timeout=urllib3.Timeout(5.0, 10.0)
        )

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def follow(
    transport: Transport,
    until: Callable[[list[tuple[str | None, dict[str, Any]]]], bool],
    **options: Any,
) -> tuple[list[tuple[str | None, dict[str, Any]]], ResourceWatch]:
    """Run a watch of /api/v1/nodes in an event loop until ``until(seen)``; the events seen."""
    seen: list[tuple[str | None, dict[str, Any]]] = []

    async def run() -> ResourceWatch:
        loop = asyncio.get_running_loop()
        watch = ResourceWatch(
            transport, "/api/v1/nodes", lambda t, o: seen.append((t, o)), loop, **options
        )
        watch.start()
        deadline = time.monotonic() + 15
        while not until(seen):
            assert time.monotonic() < deadline, f"events seen: {seen}"
            await asyncio.sleep(0.01)
        started = time.monotonic()
        await asyncio.to_thread(watch.stop)
        assert time.monotonic() - started < 3, "stop() did not end a silent stream"
        return watch

    return seen, asyncio.run(run())


def test_list_pages_then_the_stream_then_an_expired_version_lists_again(serve):
    one, two, three = node("n1", "5"), node("n2", "6"), node("n3", "9")
    split = events(("MODIFIED", node("n1", "7", ready="False")), ("BOOKMARK", node("", "8")))
    script = Script(
        [
            lambda h, q: send_json(h, 200, {"metadata": {"continue": "page2"}, "items": [one]}),
            lambda h, q: send_json(h, 200, {"metadata": {"resourceVersion": "6"}, "items": [two]}),
            # One event split across two chunks, a bookmark, then the server ends the stream.
            lambda h, q: send_stream(h, [split[:25], split[25:]]),
            # The next watch starts from the bookmark's version: one event, then it is told it
            # expired, in the same chunk (the event still counts).
            lambda h, q: send_stream(
                h,
                [
                    events(
                        ("MODIFIED", node("n1", "8")),
                        ("ERROR", {"kind": "Status", "code": 410, "reason": "Expired"}),
                    )
                ],
            ),
            # The list after expiry: n2 is gone while no watch ran, n3 is new.
            lambda h, q: send_json(
                h, 200, {"metadata": {"resourceVersion": "9"}, "items": [one, three]}
            ),
        ]
    )
    seen, watch = follow(
        serve(script),
        lambda s: any(t == "DELETED" for t, _ in s),
        selector="example.com/job",
        report_vanished=True,
    )
    names = [(t, o["metadata"]["name"]) for t, o in seen]
    assert names == [
        (None, "n1"),
        (None, "n2"),
        ("MODIFIED", "n1"),  # the bookmark is not an event
        ("MODIFIED", "n1"),  # before the expiry in its chunk
        (None, "n1"),
        (None, "n3"),
        ("DELETED", "n2"),
    ]
    assert seen[-1][1] == two  # the vanished node's last state
    lists = [q for q in script.queries if "watch" not in q]
    watches = [q for q in script.queries if "watch" in q]
    assert [q.get("continue") for q in lists[:2]] == [None, "page2"]
    assert all(q["labelSelector"] == "example.com/job" for q in script.queries)
    assert [w["resourceVersion"] for w in watches[:2]] == ["6", "8"]
    assert watches[0]["allowWatchBookmarks"] == "true"
    assert watch.lists == 2


def test_a_failed_list_is_retried_after_a_pause_and_stop_ends_a_silent_stream(serve, monkeypatch):
    monkeypatch.setattr(resource_watch, "RETRY_FIRST_S", 0.05)
    script = Script(
        [
            lambda h, q: send_json(h, 500, {"kind": "Status", "message": "etcd is down"}),
            lambda h, q: send_json(
                h, 200, {"metadata": {"resourceVersion": "3"}, "items": [node("n1", "3")]}
            ),
            # then the script's end: a stream that stays open and silent
        ]
    )
    seen, watch = follow(serve(script), lambda s: len(s) == 1)
    assert seen == [(None, node("n1", "3"))]
    assert watch.lists == 1
    assert len(script.queries) >= 3  # the failed list, the list, the silent watch


def test_pods_are_watched_per_served_namespace_or_cluster_wide_for_patterns():
    assert pod_watch_paths(None) == ["/api/v1/pods"]
    assert pod_watch_paths(("team-b", "team-a", "team-a")) == [
        "/api/v1/namespaces/team-a/pods",
        "/api/v1/namespaces/team-b/pods",
    ]
    assert pod_watch_paths(("team-a", "ml-*")) == ["/api/v1/pods"]
    assert pod_watch_paths(("!kube-system",)) == ["/api/v1/pods"]
