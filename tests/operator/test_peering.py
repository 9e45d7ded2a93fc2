"""Peering pause detection: kopf's rule mirrored from the peering object, and when a pause stops
being expected (the liveness probe's decision)."""

from __future__ import annotations

from datetime import timedelta

from rtj_operator.act.peering import PauseWatch, blockers, parse_records, peering_path

from .fakes import T0


def record(lastseen=T0, priority=10, lifetime=15):
    return {"priority": priority, "lifetime": lifetime, "lastseen": lastseen.isoformat()}


def test_blockers_follow_kopfs_rule():
    status = {
        "me": record(priority=5),
        "higher-live": record(priority=9),
        "same-live": record(priority=5),
        "lower": record(priority=4),
        "higher-expired": record(T0 - timedelta(seconds=20), priority=9),
        "garbage": "x",
    }
    found = blockers(parse_records(status), "me", 5, T0 + timedelta(seconds=1))
    assert sorted(r.identity for r in found) == ["higher-live", "same-live"]


def test_own_record_never_blocks_a_restarted_replica_with_the_same_identity():
    """The 31-61 s blind spot: a new random identity found its previous record in the way."""
    status = {"rtj-operator-abc": record(priority=999_999, lifetime=60)}
    assert blockers(parse_records(status), "rtj-operator-abc", 1, T0) == []
    assert len(blockers(parse_records(status), "rtj-operator@host/123", 1, T0)) == 1


def test_a_standby_paused_by_a_refreshing_peer_stays_healthy():
    watch = PauseWatch(max_pause=30)
    for second in range(0, 300, 10):
        now = T0 + timedelta(seconds=second)
        live = parse_records({"active": record(now - timedelta(seconds=2))})
        assert watch.observe(blockers(live, "standby", 1, now), now) is None


def test_a_pause_by_a_silent_record_is_reported_after_max_pause():
    watch = PauseWatch(max_pause=30)
    stuck = parse_records({"ghost": record(T0, lifetime=3600)})
    results = [
        watch.observe(
            blockers(stuck, "me", 1, T0 + timedelta(seconds=s)), T0 + timedelta(seconds=s)
        )
        for s in (0, 10, 20, 30, 31, 45)
    ]
    assert results[:4] == [None, None, None, None]
    assert results[4] == 31 and results[5] == 45
    # The pause ends: healthy again, and the clock restarts.
    assert watch.observe([], T0 + timedelta(seconds=50)) is None
    assert watch.observe(blockers(stuck, "me", 1, T0), T0 + timedelta(seconds=60)) is None


def test_max_pause_zero_never_reports():
    watch = PauseWatch(max_pause=0)
    stuck = parse_records({"ghost": record(T0, lifetime=3600)})
    watch.observe(blockers(stuck, "me", 1, T0), T0)
    later = T0 + timedelta(hours=1)
    assert watch.observe(blockers(stuck, "me", 1, T0), later) is None


def test_peering_paths():
    assert peering_path("p", None) == "/apis/kopf.dev/v1/clusterkopfpeerings/p"
    assert peering_path("p", "team") == "/apis/kopf.dev/v1/namespaces/team/kopfpeerings/p"


def test_cli_identity_defaults_to_the_pod_name(monkeypatch):
    from rtj_operator.__main__ import parse_args

    monkeypatch.setenv("POD_ID", "rtj-operator-7c9d-x2x4q")
    args = parse_args(["-A"])
    assert args.id == "rtj-operator-7c9d-x2x4q" and args.peering_lifetime == 15
    monkeypatch.delenv("POD_ID")
    assert parse_args(["-A", "--id", "x"]).id == "x"


def test_the_probe_reads_the_peering_objects_kopf_decides_from():
    from rtj_operator.act.handlers import PeeringOptions

    def options(namespaces):
        return PeeringOptions("p", "me", 1, 15, 30.0, namespaces)

    assert options(None).paths() == ["/apis/kopf.dev/v1/clusterkopfpeerings/p"]
    assert options(("team-a", "ml-*")).paths() == [
        "/apis/kopf.dev/v1/namespaces/team-a/kopfpeerings/p"
    ]


def test_a_paused_replica_reconciles_nothing_and_forgets_its_node_cache(monkeypatch):
    """kopf's pause stops only its watches: the replica's own timers (resync, backoff, grace
    periods) must not act beside the active replica, from node states no event refreshes."""
    import asyncio
    import time

    from rtj_operator.act import handlers, metrics
    from rtj_operator.act.controller import PAUSED_RECHECK, Controller
    from rtj_operator.act.handlers import PeeringOptions, build_registry
    from rtj_operator.api.timeutil import utcnow

    from .fake_api import FakeApi
    from .fakes import job_body, make_node

    api = FakeApi()
    api.put_job(job_body(replicas=2))
    api.nodes["node-0"] = make_node("node-0")
    ctrl = Controller(api, resync_seconds=0)  # type: ignore[arg-type]
    options = PeeringOptions("rtj-operator", "me", 10, 15, 30.0, None)
    build_registry(ctrl, api=api, peering=options)  # type: ignore[arg-type]
    monkeypatch.setattr(handlers, "PAUSE_CHECK_TTL", 0.0)
    path = peering_path("rtj-operator", None)
    ctrl.on_node_event(None, make_node("node-0"))
    ctrl.on_job_event(None, api.job())
    assert ctrl.nodes and metrics.PHASES.phases

    def sync():
        return asyncio.run(ctrl.sync(("ns", "train"), time.monotonic()))

    api.objects[path] = {"status": {"active": record(utcnow(), priority=20)}}
    api.calls.clear()
    assert sync() == PAUSED_RECHECK
    assert api.calls == ["get_object"] and not api.pods() and ctrl.paused
    assert not ctrl.nodes  # stale while paused: a miss falls back to a GET afterwards
    assert not metrics.PHASES.phases  # rtj_jobs: only the active replica counts the jobs

    # The active replica's record lapses (or names this replica): the pause is over.
    api.objects[path] = {"status": {"me": record(utcnow(), priority=10)}}
    sync()
    assert not ctrl.paused and api.pods()


def test_a_tie_of_priorities_is_reported_even_while_the_peer_refreshes():
    """kopf pauses every replica of a tie (two replicas given the same ``--priority``): both
    stand by for good, so the liveness probe must not call that pause expected."""
    watch = PauseWatch(max_pause=30, priority=10)
    results = []
    for second in range(0, 50, 10):
        now = T0 + timedelta(seconds=second)
        twin = parse_records({"twin": record(now - timedelta(seconds=2), priority=10)})
        results.append(watch.observe(blockers(twin, "me", 10, now), now))
    assert results[:4] == [None, None, None, None] and results[4] == 40
    # A refreshing peer of a higher priority is still an expected pause.
    watch = PauseWatch(max_pause=30, priority=10)
    for second in range(0, 300, 10):
        now = T0 + timedelta(seconds=second)
        active = parse_records({"active": record(now - timedelta(seconds=2), priority=11)})
        assert watch.observe(blockers(active, "me", 10, now), now) is None
