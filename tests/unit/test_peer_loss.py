"""A kept worker's report of a lost peer (pod/peer_loss.py), as the operator reads it.

The report's way to the API server is the pod's own service account (``pod/own_pod.py``); the
local-cluster test ``tests/e2e/test_survivors_story.py`` (a node that dies silently) sends it
for real. Here: what is written is what the operator reads, only for the gang it names, and a
refused patch is tried again.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from rtj_operator.api.envvars import PEER_LOST_ANNOTATION as OPERATOR_KEY
from rtj_operator.api.names import LABEL_ATTEMPT, LABEL_RANK
from rtj_operator.decide.survivors import reports_lost_peer
from trainer_runtime import envvars
from trainer_runtime.pod import own_pod, peer_loss
from trainer_runtime.pod.own_pod import OwnPod


def pod_with(text: str, attempt: int = 3, rank: str | None = "1") -> dict[str, Any]:
    labels = {LABEL_ATTEMPT: str(attempt)} | ({LABEL_RANK: rank} if rank is not None else {})
    return {"metadata": {"labels": labels, "annotations": {envvars.PEER_LOST_ANNOTATION: text}}}


def test_the_operator_reads_the_report_of_the_gang_it_names_only():
    assert envvars.PEER_LOST_ANNOTATION == OPERATOR_KEY
    reported = pod_with(peer_loss.payload(3))
    assert reports_lost_peer([{}, reported], 3)
    assert not reports_lost_peer([reported], 4), "an older gang's report is stale"
    assert not reports_lost_peer([pod_with("not json")], 3)
    moved = pod_with(peer_loss.payload(3), attempt=4)
    assert not reports_lost_peer([moved], 3), "a pod of another attempt is not of this gang"
    assert not reports_lost_peer([pod_with(peer_loss.payload(3), rank=None)], 3), "no rank"


def test_outside_a_pod_nothing_is_sent(tmp_path):
    assert peer_loss.report({envvars.SERVICEACCOUNT_DIR: str(tmp_path)}, 1) is None


def test_a_refused_patch_is_tried_again(tmp_path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "token").write_text("t")
    environ = {
        envvars.POD_NAME: "job-a1-r0",
        envvars.NAMESPACE: "ns",
        envvars.KUBERNETES_SERVICE_HOST: "127.0.0.1",
        envvars.SERVICEACCOUNT_DIR: str(tmp_path),
    }
    sent: list[dict[str, str | None]] = []

    def annotate(self: OwnPod, annotations: dict[str, str | None]) -> None:
        sent.append(dict(annotations))
        if len(sent) < 3:
            raise OSError("connection refused")

    monkeypatch.setattr(OwnPod, "annotate", annotate)
    monkeypatch.setattr(own_pod.time, "sleep", lambda s: None)
    thread = peer_loss.report(environ, 2)
    assert thread is not None
    thread.join(5)
    assert len(sent) == 3
    value = sent[-1][envvars.PEER_LOST_ANNOTATION] or ""
    assert reports_lost_peer([pod_with(value, attempt=2)], 2)


def pod_environ(tmp_path, monkeypatch: pytest.MonkeyPatch, epoch: str) -> None:
    (tmp_path / "token").write_text("t")
    for key, value in {
        envvars.POD_NAME: "job-a4-r1",
        envvars.NAMESPACE: "ns",
        envvars.KUBERNETES_SERVICE_HOST: "127.0.0.1",
        envvars.SERVICEACCOUNT_DIR: str(tmp_path),
        envvars.MEMBERSHIP_EPOCH: epoch,
    }.items():
        monkeypatch.setenv(key, value)


def test_a_worker_that_ends_on_a_failed_collective_reports_it_first(
    tmp_path, monkeypatch: pytest.MonkeyPatch
):
    """A worker of a job without ``Stay`` ends at once on a failed collective: its report is
    written before the interpreter's hook prints the traceback, once, with the gang's epoch;
    a script's own error is not reported."""
    pod_environ(tmp_path, monkeypatch, "4")
    printed: list[BaseException] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, exc, tb: printed.append(exc))
    monkeypatch.setattr(peer_loss.ExitReport, "_installed", None)
    sent: list[dict[str, str | None]] = []
    monkeypatch.setattr(OwnPod, "annotate", lambda self, a: sent.append(dict(a)))
    assert peer_loss.ExitReport.install(world_size=1) is None, "alone: no peer to lose"
    installed = peer_loss.ExitReport.install(world_size=2)
    assert installed is not None and peer_loss.ExitReport.install(world_size=2) is installed
    own_error = ValueError("a bug in the script")
    sys.excepthook(ValueError, own_error, None)
    assert sent == [] and printed == [own_error]
    lost = RuntimeError("[gloo/transport/tcp/pair.cc:561] Connection closed by peer")
    sys.excepthook(RuntimeError, lost, None)
    assert printed == [own_error, lost]
    (written,) = sent
    value = written[envvars.PEER_LOST_ANNOTATION] or ""
    assert reports_lost_peer([pod_with(value, attempt=4)], 4)
    peer_loss.failed(lost)  # the same failure seen again in CheckpointManager.__exit__
    assert len(sent) == 1


def test_outside_a_pod_no_hook_is_installed(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(envvars.MEMBERSHIP_EPOCH, "0")
    monkeypatch.setenv(envvars.SERVICEACCOUNT_DIR, str(tmp_path))
    monkeypatch.setattr(peer_loss.ExitReport, "_installed", None)
    hook = sys.excepthook
    assert peer_loss.ExitReport.install(world_size=4) is None
    assert sys.excepthook is hook
