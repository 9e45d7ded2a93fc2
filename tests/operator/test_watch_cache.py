"""Routing of node events to jobs (watch_cache.py), and the kopf bookkeeping the handlers turn
off (handlers.py): what a mass reclaim's flood of watch events goes through."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from rtj_operator.act.handlers import NoDiffBase, NoProgress, QuietEventHandlers
from rtj_operator.act.watch_cache import WatchCache
from rtj_operator.api import names

from .fakes import make_job, make_pod


def pod(job: str, name: str, node: str | None, ns: str = "ns") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "labels": {names.LABEL_JOB: job}},
        "spec": {"nodeName": node} if node else {},
    }


def deleted_node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}}


def test_a_node_routes_to_a_job_while_any_of_its_pods_is_there():
    cache = WatchCache()
    cache.pod_event("ADDED", pod("a", "a-0", "n1"))
    cache.pod_event("ADDED", pod("a", "a-1", "n1"))
    cache.pod_event("ADDED", pod("b", "b-0", "n1"))
    assert cache.jobs_on_node["n1"] == {("ns", "a"): 2, ("ns", "b"): 1}
    cache.pod_event("MODIFIED", pod("a", "a-0", "n1"))  # the same route again: counted once
    cache.pod_event("DELETED", pod("a", "a-0", "n1"))
    assert cache.jobs_on_node["n1"] == {("ns", "a"): 1, ("ns", "b"): 1}  # a-1 is still there
    cache.pod_event("DELETED", pod("a", "a-1", "n1"))
    assert cache.jobs_on_node["n1"] == {("ns", "b"): 1}
    cache.pod_event("DELETED", pod("b", "b-0", "n1"))
    assert "n1" not in cache.jobs_on_node
    assert cache.node_event("DELETED", deleted_node("n1")) == []


def test_a_pod_bound_later_moves_its_route_to_its_node():
    cache = WatchCache()
    cache.pod_event("ADDED", pod("a", "a-0", None))  # not bound yet: no node
    assert dict(cache.jobs_on_node) == {}
    cache.pod_event("MODIFIED", pod("a", "a-0", "n2"))
    cache.pod_event("ADDED", pod("a", "a-1", "n3"))
    assert cache.node_event("DELETED", deleted_node("n2")) == [("ns", "a")]
    cache.pod_event("DELETED", pod("a", "a-0", "n2"))
    assert cache.jobs_on_node == {"n3": {("ns", "a"): 1}}


def test_many_jobs_route_by_counts_not_by_a_scan():
    cache = WatchCache()
    for job in range(300):
        for rank in range(4):
            cache.pod_event("ADDED", pod(f"j{job}", f"j{job}-{rank}", f"n{(job + rank) % 60}"))
    hit = cache.node_event("DELETED", deleted_node("n7"))
    assert sorted(hit) == sorted(("ns", f"j{j}") for j in range(300) if (7 - j) % 60 in range(4))
    for job in range(300):
        for rank in range(4):
            cache.pod_event("DELETED", pod(f"j{job}", f"j{job}-{rank}", f"n{(job + rank) % 60}"))
    assert dict(cache.jobs_on_node) == {}


def test_kopf_builds_no_diff_base_and_keeps_no_progress():
    body = kopf.Body({"metadata": {"name": "p", "labels": {"a": "b"}}, "spec": {"x": [1, 2]}})
    essence = NoDiffBase().build(body=body)
    assert essence == {}
    assert NoDiffBase().fetch(body=body) is None
    progress = NoProgress()
    assert progress.clear(essence=essence) is essence  # no copy
    assert progress.fetch(key=kopf.HandlerId("h"), body=body) is None


def record(msg: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("kopf.objects", level, __file__, 1, msg, None, None)


def test_only_the_event_handlers_success_lines_are_dropped():
    quiet = QuietEventHandlers()
    assert not quiet.filter(record("Handler 'build_registry.<locals>.job_event' succeeded."))
    # failures, other handlers and other levels are kept
    assert quiet.filter(
        record("Handler 'build_registry.<locals>.job_event' failed with an exception.")
    )
    assert quiet.filter(record("Handler 'build_registry.<locals>.configure' succeeded."))
    assert quiet.filter(
        record("Handler 'build_registry.<locals>.job_event' succeeded.", logging.WARNING)
    )


def test_a_kept_pod_is_found_under_its_own_name_so_no_pass_waits_for_a_deletion():
    """After survivors stay, rank 0 is a pod of an earlier attempt under its own name; the
    attempt's name for that rank never exists. Looking for it made every other pass wait a
    second for a DELETED event that could not come."""
    kept = make_pod(attempt=0, rank=0)
    status = {"attempt": 1, "gangCreated": True, "gangSize": 2}
    job = make_job(status={**status, "keptPods": [kept["metadata"]["name"]]})
    new = make_pod(attempt=1, rank=1)
    cache = WatchCache()
    key = ("ns", "train")
    assert cache.deletion_event_wait(key, job, [kept, new], {}) is None
    # The kept pod gone from the list with no DELETED event yet: that one is waited for.
    assert cache.deletion_event_wait(key, job, [new], {}) == 0.2


def test_a_node_the_watch_saw_deleted_is_known_gone_without_a_get(monkeypatch):
    """In a mass reclaim every pass of a hit job looked up its rank's deleted node: a GET that
    answered 404, one round trip before each resubmission. The watch's DELETED event says it."""
    from rtj_operator.act import watch_cache

    clock = [100.0]
    monkeypatch.setattr(watch_cache.time, "monotonic", lambda: clock[0])
    cache = WatchCache()
    body = {
        "metadata": {"name": "n1"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    cache.node_event("ADDED", body)
    assert cache.node("n1").exists
    assert cache.node("n2") is None  # never seen: GET it
    cache.node_event("DELETED", deleted_node("n1"))
    assert cache.node("n1") is not None and not cache.node("n1").exists
    cache.node_event("ADDED", body)  # back under the same name
    assert cache.node("n1").exists
    cache.node_event("DELETED", deleted_node("n1"))
    clock[0] += watch_cache.DEPARTED_TTL + 1
    assert cache.node("n1") is None  # too old to vouch for: GET it
    cache.node_event("DELETED", deleted_node("n3"))
    cache.forget_nodes()
    assert cache.node("n3") is None


def test_pod_and_node_events_kick_only_the_jobs_kopf_reported():
    """With a namespace glob the pods are watched cluster-wide: a job of a namespace this
    replica does not serve (another operator's) must never be kicked, by its pods' events or
    by an event of the node they run on."""
    from rtj_operator.act.controller import Controller

    from .fake_api import FakeApi

    ctrl = Controller(FakeApi(), resync_seconds=0)  # type: ignore[arg-type]
    ctrl.queue.kick(("served", "a"))  # as kopf's job event does
    ctrl.on_pod_event("ADDED", pod("a", "a-0", "n1", ns="served"))
    ctrl.on_pod_event("ADDED", pod("b", "b-0", "n1", ns="other"))
    assert set(ctrl.queue.entries) == {("served", "a")}
    ctrl.on_node_event("DELETED", deleted_node("n1"))
    assert set(ctrl.queue.entries) == {("served", "a")}
