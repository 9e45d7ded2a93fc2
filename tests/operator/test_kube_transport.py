"""The transport both Kubernetes clients share, against a real HTTP server on 127.0.0.1 that
answers what an API server (or a proxy in front of one) can answer."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
import urllib3
from kubernetes import client as k8s_client

from rtj_operator.act.kube import KubeApi
from rtj_operator.act.kube_transport import ApiError, Transport
from tools.kubeapi import Kube

ANSWERS: dict[str, tuple[int, str, bytes]] = {
    "/readyz": (200, "text/plain", b"ok"),
    "/conflict": (
        409,
        "application/json",
        json.dumps(
            {"kind": "Status", "reason": "AlreadyExists", "message": "pods exists"}
        ).encode(),
    ),
    "/proxy-error": (502, "text/html", b"<html>bad gateway</html>"),
    "/gone": (
        410,
        "application/json",
        json.dumps({"kind": "Status", "reason": "Expired", "message": "too old"}).encode(),
    ),
    "/empty": (200, "application/json", b""),
}


class _Handler(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        _Handler.seen.append(
            {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
        )
        path = self.path.split("?", 1)[0]
        status, kind, data = ANSWERS.get(path, (200, "application/json", b'{"kind": "Pod"}'))
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def do_PATCH(self) -> None:
        self._answer()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _Handler.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _transport(host: str, token: str = "Bearer t0k3n") -> Transport:  # noqa: S107 - a test token
    cfg = k8s_client.Configuration()
    cfg.host = host
    cfg.api_key = {"authorization": token}
    return Transport(
        cfg, user_agent="ua-test", max_connections=2, timeout=urllib3.Timeout(connect=2, read=5)
    )


def test_a_request_carries_the_credentials_and_leaves_out_empty_query_values(server: str) -> None:
    api = _transport(server)
    found = api.request(
        "PATCH",
        "/api/v1/namespaces/a/pods/p",
        query={"fieldManager": "x", "dryRun": None},
        body={"metadata": {"labels": {"k": "v"}}},
        content_type="application/merge-patch+json",
    )
    assert found == {"kind": "Pod"}
    seen = _Handler.seen[-1]
    assert seen["path"] == "/api/v1/namespaces/a/pods/p?fieldManager=x"
    assert seen["headers"]["Authorization"] == "Bearer t0k3n"
    assert seen["headers"]["User-Agent"] == "ua-test"
    assert seen["headers"]["Content-Type"] == "application/merge-patch+json"
    assert json.loads(seen["body"]) == {"metadata": {"labels": {"k": "v"}}}


def test_a_bare_token_gets_its_bearer_prefix(server: str) -> None:
    _transport(server, token="bare").request("GET", "/api/v1/pods")  # noqa: S106
    assert _Handler.seen[-1]["headers"]["Authorization"] == "Bearer bare"
    assert "Content-Type" not in _Handler.seen[-1]["headers"]  # no body, no content type


def test_plain_text_and_empty_answers(server: str) -> None:
    api = _transport(server)
    assert api.request("GET", "/readyz") == {"message": "ok"}
    assert api.request("GET", "/empty") == {}


def test_a_status_answer_is_an_api_error_with_its_reason(server: str) -> None:
    with pytest.raises(ApiError) as caught:
        _transport(server).request("POST", "/conflict", body={})
    err = caught.value
    assert (err.status, err.reason, err.message) == (409, "AlreadyExists", "pods exists")
    assert err.conflict and not err.not_found
    assert str(err) == "POST /conflict: 409 AlreadyExists: pods exists"


def test_a_proxy_error_page_is_an_api_error_with_its_text(server: str) -> None:
    with pytest.raises(ApiError) as caught:
        _transport(server).request("GET", "/proxy-error")
    assert caught.value.status == 502
    assert caught.value.message == "<html>bad gateway</html>"


def test_a_watch_refused_as_too_old_is_gone(server: str) -> None:
    api = _transport(server)
    response = api.stream("/gone", {"watch": "true"}, read_timeout_s=5)
    try:
        err = Transport.error_of(response, "WATCH", "/gone")
    finally:
        response.release_conn()
    assert err.gone and err.reason == "Expired"


def test_both_clients_raise_the_one_error_type(server: str, tmp_path: Any) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "abc"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    tools_client = Kube(str(kubeconfig))
    with pytest.raises(ApiError):
        tools_client.request("GET", "/conflict")
    assert _Handler.seen[-1]["headers"]["Authorization"] == "Bearer abc"
    operator_client = KubeApi(tools_client.transport.cfg, workers=1)
    try:
        with pytest.raises(ApiError):
            operator_client.request_sync("GET", "/conflict")
    finally:
        operator_client.close()
    assert _Handler.seen[-1]["headers"]["User-Agent"] == "rtj-operator"
