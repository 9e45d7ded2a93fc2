"""Elastic gangs: the sizing rules alone, then the whole story through the state machine."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from rtj_operator.api import names
from rtj_operator.api.envvars import NOTICE_ANNOTATION, PROGRESS_ANNOTATION
from rtj_operator.api.spec_types import JobSpec, grow_min_interval_seconds, shrink_after_seconds
from rtj_operator.api.status_types import CheckpointRecord, GrowRequest, JobStatus
from rtj_operator.api.timeutil import iso
from rtj_operator.decide.capacity import fitting_pods, node_accepts, parse_quantity, pods_per_node
from rtj_operator.decide.elastic import (
    GROW_REASON,
    SCHEDULING_GRACE_SECONDS,
    GrowAction,
    StartReason,
    grow_step,
    reshrink_step,
    start_size,
)
from rtj_operator.decide.nodes import node_view
from rtj_operator.decide.plan_types import Plan
from rtj_operator.decide.progress import trained_since_resume
from rtj_operator.decide.reconcile import reconcile
from rtj_operator.decide.transitions import committed_and_lost

from .fakes import T0, FakeCluster, make_node, make_pod, progress

POOL = {"pool": "spot"}
REQUESTS = {"requests": {"cpu": "4", "memory": "1Gi"}}
TEMPLATE = {
    "spec": {
        "nodeSelector": POOL,
        "containers": [{"name": "trainer", "image": "img", "resources": REQUESTS}],
    }
}


def spec(replicas: int = 4, **elastic: Any) -> JobSpec:
    body: dict[str, Any] = {
        "replicas": replicas,
        "checkpoint": {"dir": "s3://bucket/c"},
        "template": TEMPLATE,
    }
    if elastic:
        body["elastic"] = elastic
    return JobSpec.model_validate(body)


def node(name: str, *, cpu: str = "4", labels: dict[str, str] | None = None, **kw: Any):
    body = make_node(name, **kw)
    body["metadata"]["labels"] = dict(POOL if labels is None else labels)
    body["status"]["allocatable"] = {"cpu": cpu, "memory": "8Gi", "pods": "110"}
    return body


# -- capacity -------------------------------------------------------------------------------


def test_quantities_parse_like_kubernetes():
    assert parse_quantity("500m") == 0.5
    assert parse_quantity("2Gi") == 2 * 2**30
    assert parse_quantity("1e3") == 1000
    assert parse_quantity("lots") is None


def test_only_ready_schedulable_matching_nodes_accept_the_pod():
    tspec = TEMPLATE["spec"]
    assert node_accepts(node_view("a", node("a")), tspec)
    assert not node_accepts(node_view("b", node("b", ready="False")), tspec)
    assert not node_accepts(node_view("c", node("c", labels={"pool": "other"})), tspec)
    cordoned = node("d")
    cordoned["spec"]["unschedulable"] = True
    assert not node_accepts(node_view("d", cordoned), tspec)
    tainted = node("e", taints=[{"key": "gpu", "effect": "NoSchedule"}])
    assert not node_accepts(node_view("e", tainted), tspec)
    tolerant = {**tspec, "tolerations": [{"key": "gpu", "operator": "Exists"}]}
    assert node_accepts(node_view("e", tainted), tolerant)
    assert not node_accepts(node_view("gone", None), tspec)


def test_pods_per_node_is_limited_by_the_scarcest_resource():
    assert pods_per_node(node_view("a", node("a", cpu="9")), {"cpu": 4.0}) == 2
    assert pods_per_node(node_view("a", node("a", cpu="3")), {"cpu": 4.0}) == 0
    assert pods_per_node(node_view("a", node("a")), {"nvidia.com/gpu": 1.0}) == 0
    views = [node_view(n, node(n, cpu="8")) for n in ("a", "b", "c")]
    assert fitting_pods(views, TEMPLATE["spec"], limit=4) == 4
    assert fitting_pods(views[:1], TEMPLATE["spec"], limit=4) == 2


def test_required_node_affinity_is_evaluated_like_the_scheduler():
    term = {"key": "zone", "operator": "In", "values": ["a", "b"]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [term]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["x"]}]},
                ]
            }
        }
    }
    tspec = {**TEMPLATE["spec"], "affinity": affinity}
    zoned = {**POOL, "zone": "a"}
    assert node_accepts(node_view("n1", node("n1", labels=zoned)), tspec)
    assert not node_accepts(node_view("n2", node("n2", labels={**POOL, "zone": "c"})), tspec)
    assert not node_accepts(node_view("n3", node("n3")), tspec)
    assert node_accepts(node_view("x", node("x")), tspec), "matchFields on the node's name"
    empty = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{}]}}}  # fmt: skip
    assert not node_accepts(node_view("n1", node("n1", labels=zoned)), {**tspec, "affinity": empty})
    gpu = {"key": "gpus", "operator": "Gt", "values": ["3"]}
    wide = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [gpu]}]}}}  # fmt: skip
    with_gpus = {**TEMPLATE["spec"], "affinity": wide}
    assert node_accepts(node_view("g", node("g", labels={**POOL, "gpus": "8"})), with_gpus)
    assert not node_accepts(node_view("g", node("g", labels={**POOL, "gpus": "2"})), with_gpus)


def test_an_anti_affinity_over_the_jobs_own_pods_counts_one_pod_per_node():
    """Small requests fit many pods per node; a required anti-affinity per hostname that selects
    the job's pods keeps them one per node, so a lost node is lost capacity."""
    views = [node_view(n, node(n, cpu="64")) for n in ("a", "b", "c")]
    own = {names.LABEL_JOB: "train", "team": "ml"}

    def apart(selector: dict[str, Any] | None, key: str = "kubernetes.io/hostname") -> dict:
        term = {"topologyKey": key, "labelSelector": selector}
        anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
        return {**TEMPLATE["spec"], "affinity": anti}

    assert fitting_pods(views, TEMPLATE["spec"], limit=8, pod_labels=own) == 8
    assert fitting_pods(views, apart({"matchLabels": {names.LABEL_JOB: "train"}}), 8, own) == 3
    exists = {"matchExpressions": [{"key": "team", "operator": "Exists"}]}
    assert fitting_pods(views, apart(exists), 8, own) == 3
    assert fitting_pods(views, apart({}), 8, own) == 3, "an empty selector selects every pod"
    assert fitting_pods(views, apart(None), 8, own) == 8, "a null selector selects none"
    other = {"matchLabels": {names.LABEL_JOB: "another-job"}}
    assert fitting_pods(views, apart(other), 8, own) == 8
    zone = apart({"matchLabels": {names.LABEL_JOB: "train"}}, key="topology.kubernetes.io/zone")
    assert fitting_pods(views, zone, 8, own) == 8, "only a per-node spread is counted"


# -- start size -----------------------------------------------------------------------------


def test_a_fixed_job_always_starts_at_replicas():
    decision = start_size(spec(), 1, waiting_since=None, now=T0)
    assert decision.size == 4 and decision.reason is StartReason.FIXED


def test_elastic_starts_full_when_everything_fits():
    decision = start_size(spec(minReplicas=2), 4, waiting_since=T0, now=T0)
    assert decision.size == 4 and decision.reason is StartReason.FULL_SIZE


def test_elastic_waits_for_the_full_gang_then_shrinks_to_what_fits():
    s = spec(minReplicas=2, shrinkAfterSeconds=60)
    waiting = start_size(s, 3, waiting_since=T0, now=T0 + timedelta(seconds=59))
    assert waiting.size is None and waiting.reason is StartReason.WAITING_FOR_FULL_GANG
    assert waiting.recheck_after == pytest.approx(1.0)
    shrunk = start_size(s, 3, waiting_since=T0, now=T0 + timedelta(seconds=60))
    assert shrunk.size == 3 and shrunk.reason is StartReason.SHRUNK


def test_the_wait_for_the_full_gang_defaults_to_60s_and_to_none_when_survivors_stay():
    replace_spec = spec(minReplicas=2)
    stay = stay_spec()
    assert shrink_after_seconds(replace_spec) == 60
    waiting = start_size(replace_spec, 3, waiting_since=T0, now=T0 + timedelta(seconds=59))
    assert waiting.size is None and waiting.reason is StartReason.WAITING_FOR_FULL_GANG
    # Kept pods would idle through the wait, and the grow back is a warm join: start at once.
    assert shrink_after_seconds(stay) == 0
    at_once = start_size(stay, 3, waiting_since=None, now=T0)
    assert at_once.size == 3 and at_once.reason is StartReason.SHRUNK
    # The spec's own value wins, with Stay too.
    patient = stay.model_copy(
        update={"elastic": stay.elastic.model_copy(update={"shrink_after_seconds": 30})}
    )
    assert shrink_after_seconds(patient) == 30
    assert start_size(patient, 3, waiting_since=None, now=T0).size is None
    assert shrink_after_seconds(spec()) == 0  # not elastic: nothing to wait for


def stay_spec(**recovery: Any) -> JobSpec:
    """An elastic 4-pod job (``minReplicas`` 2) with ``survivors: Stay`` and ``recovery``."""
    trainer = {**TEMPLATE["spec"]["containers"][0], "command": ["python", "train.py"]}
    return JobSpec.model_validate(
        {
            "replicas": 4,
            "checkpoint": {"dir": "s3://bucket/c"},
            "template": {"spec": {**TEMPLATE["spec"], "containers": [trainer]}},
            "elastic": {"minReplicas": 2},
            "recovery": {"survivors": "Stay", **recovery},
        }
    )


def test_the_wait_before_a_grow_defaults_to_300s_and_to_none_with_the_in_process_switch():
    """A grow that switches in process restarts nothing: the gang grows as soon as it trained
    (``onlyWhenItPays`` still weighs the pause); a grow that restarts the workers waits 300 s."""

    def asks(s: JobSpec, trained_s: float) -> bool:
        decision = grow_step(
            s,
            size=2,
            fit=4,
            all_running=True,
            trained_since=T0,
            abandoned_at=None,
            room_since=None,
            request=None,
            committed_step=10,
            now=T0 + timedelta(seconds=trained_s),
        )
        return decision.action is GrowAction.REQUEST

    restarting, switching = stay_spec(), stay_spec(inProcessSwitch=True)
    assert grow_min_interval_seconds(restarting) == 300
    assert not asks(restarting, 299) and asks(restarting, 300)
    assert grow_min_interval_seconds(switching) == 0
    assert asks(switching, 0)
    patient = stay_spec(inProcessSwitch=True)
    patient.elastic.grow.min_interval_seconds = 120  # the spec's own value wins
    assert not asks(patient, 119) and asks(patient, 120)


def test_elastic_never_starts_below_min_replicas():
    s = spec(minReplicas=3, shrinkAfterSeconds=0)
    decision = start_size(s, 2, waiting_since=T0, now=T0 + timedelta(hours=5))
    assert decision.size is None and decision.reason is StartReason.MIN_REPLICAS_UNREACHABLE
    assert "minReplicas=3" in decision.message


def test_the_wait_for_the_full_gang_starts_when_min_replicas_first_fit():
    """The wait was counted from the attempt's first wait, also while fewer than minReplicas fit:
    after a long wait below the minimum, three of four nodes came back within 0.7 s and the gang
    started at 3 pods 187 ms before the fourth node registered (and grew 20 s later)."""
    s = spec(minReplicas=2, shrinkAfterSeconds=60)
    below = start_size(s, 1, waiting_since=T0, now=T0 + timedelta(hours=1))
    assert below.size is None and below.wait_since is None  # no wait for the full gang yet
    now = T0 + timedelta(hours=2)
    first = start_size(s, 3, waiting_since=None, now=now)
    assert first.size is None and first.reason is StartReason.WAITING_FOR_FULL_GANG
    assert first.wait_since == now and first.recheck_after == pytest.approx(5.0)
    later = now + timedelta(seconds=59)
    assert start_size(s, 3, waiting_since=now, now=later).wait_since == now
    assert start_size(s, 3, waiting_since=now, now=now + timedelta(seconds=60)).size == 3
    assert start_size(s, 4, waiting_since=now, now=later).wait_since is None


def test_after_a_grow_the_larger_size_starts_without_waiting():
    s = spec(minReplicas=1, shrinkAfterSeconds=60)
    decision = start_size(s, 3, waiting_since=T0, now=T0, grown_from=2)
    assert decision.size == 3 and decision.reason is StartReason.GROWN


def test_min_replicas_above_replicas_is_rejected_by_the_schema():
    from rtj_operator.api.crdgen import crd

    text = str(crd())
    assert "self.elastic.minReplicas <= self.replicas" in text


# -- grow -----------------------------------------------------------------------------------


def grow(**kw: Any):
    args: dict[str, Any] = {
        "size": 2,
        "fit": 4,
        "all_running": True,
        "trained_since": T0,
        "abandoned_at": None,
        "room_since": None,
        "request": None,
        "committed_step": None,
        "now": T0 + timedelta(seconds=301),
    }
    args.update(kw)
    return grow_step(spec(minReplicas=2, grow=args.pop("policy", {})), **args)


def test_grow_is_requested_only_past_the_interval_with_every_rank_running():
    assert grow().action is GrowAction.REQUEST and grow().target == 4
    assert grow(now=T0 + timedelta(seconds=299)).action is GrowAction.NONE
    assert grow(trained_since=None).action is GrowAction.NONE  # not trained since its resume
    assert grow(abandoned_at=T0 + timedelta(seconds=2)).action is GrowAction.NONE
    assert grow(abandoned_at=T0 - timedelta(seconds=2)).action is GrowAction.REQUEST
    assert grow(all_running=False).action is GrowAction.NONE
    assert grow(fit=2).action is GrowAction.NONE
    assert grow(policy={"enabled": False}).action is GrowAction.NONE


def test_a_grow_to_a_partial_size_waits_settle_seconds_for_room_for_the_full_gang():
    now = T0 + timedelta(seconds=301)
    first = grow(fit=3, policy={"settleSeconds": 30})
    assert first.action is GrowAction.NONE and first.room_since == now
    assert first.recheck_after == pytest.approx(5.0)
    since = now - timedelta(seconds=29)
    waiting = grow(fit=3, room_since=since, policy={"settleSeconds": 30})
    assert waiting.action is GrowAction.NONE and waiting.room_since == since
    assert waiting.recheck_after == pytest.approx(1.0)
    settled = grow(fit=3, room_since=now - timedelta(seconds=30), policy={"settleSeconds": 30})
    assert settled.action is GrowAction.REQUEST and settled.target == 3
    full = grow(fit=4, room_since=since, policy={"settleSeconds": 30})  # the full size: at once
    assert full.action is GrowAction.REQUEST and full.target == 4 and full.room_since is None
    assert grow(fit=2, room_since=since).room_since is None  # the room went away
    assert grow(fit=3, policy={"settleSeconds": 0}).action is GrowAction.REQUEST


RESUMED = CheckpointRecord(name="ep0-ba100", step=100, epoch=0, sample=800)


@pytest.mark.parametrize(
    ("annotation", "trained"),
    [
        (None, False),
        ("not json", False),
        ('{"current_step": 51}', True),  # a step before the first commit (rescaled: below 100)
        (progress("ep0-ba100", 100, current=100), False),  # a save at the resume point
        (progress("ep0-ba100", 100, current=101), True),
        (progress("ep0-ba120", 120), True),  # a newer commit
        (progress("ep0-ba90", 90), False),  # an older checkpoint than the resume point
        ('{"current_step": 51, "attempt": 3}', True),  # the gang of this attempt (3)
        # A kept pod's old workers, relabelled into attempt 3: their steps and their save
        # are not the new gang's training.
        ('{"current_step": 151, "attempt": 2}', False),
        (progress("ep0-ba120", 120)[:-1] + ', "attempt": 2}', False),
    ],
)
def test_a_gang_has_trained_once_its_progress_passes_its_resume_point(
    annotation: str | None, trained: bool
) -> None:
    pod = make_pod(annotations={PROGRESS_ANNOTATION: annotation} if annotation else None)
    assert (
        trained_since_resume(pod, attempt=3, resume_checkpoint="ep0-ba100", resumed=RESUMED)
        is trained
    )


def test_grow_restarts_only_after_a_commit_past_the_request():
    request = GrowRequest(requested_at=T0, target_size=4, after_step=100)
    assert grow(request=request, committed_step=100).action is GrowAction.NONE
    decision = grow(request=request, committed_step=120)
    assert decision.action is GrowAction.RESTART and decision.target == 4
    assert grow(request=request, committed_step=120, fit=2).action is GrowAction.ABANDON


def test_grow_without_the_checkpoint_is_abandoned_after_the_timeout():
    request = GrowRequest(requested_at=T0, target_size=4, after_step=100)
    late = T0 + timedelta(seconds=600)
    assert grow(request=request, now=late).action is GrowAction.ABANDON


def reshrink(**kw: Any):
    args: dict[str, Any] = {
        "size": 4,
        "fit": 4,
        "scheduled": 0,
        "waiting_since": T0,
        "now": T0 + timedelta(seconds=30),
    }
    args.update(kw)
    return reshrink_step(spec(minReplicas=2, shrinkAfterSeconds=30), **args)


def test_reshrink_waits_the_shrink_wait_for_the_gang_to_be_scheduled():
    early = reshrink(now=T0 + timedelta(seconds=29))
    assert early.size is None and early.recheck_after == pytest.approx(1.0)
    assert reshrink(scheduled=4).size is None
    assert reshrink(waiting_since=None).size is None
    assert reshrink_step(spec(), size=4, fit=4, scheduled=0, waiting_since=T0, now=T0).size is None
    # A shrinkAfterSeconds of 0 still gives the scheduler its grace to bind the gang.
    no_wait = spec(minReplicas=2, shrinkAfterSeconds=0)
    soon = reshrink_step(no_wait, size=4, fit=4, scheduled=0, waiting_since=T0, now=T0)
    assert soon.size is None and soon.recheck_after == pytest.approx(SCHEDULING_GRACE_SECONDS)
    later = T0 + timedelta(seconds=SCHEDULING_GRACE_SECONDS)
    assert reshrink_step(no_wait, size=4, fit=4, scheduled=0, waiting_since=T0, now=later).size == 3


def test_reshrink_goes_to_what_the_evidence_says_fits_never_below_min_replicas():
    # A native gang binds nothing: one fewer than now, at most what the capacity count says.
    assert reshrink().size == 3
    assert reshrink(fit=2).size == 2
    # The operator's own fallback binds pod by pod: the pods that bound fit.
    assert reshrink(scheduled=3).size == 3
    assert reshrink(scheduled=1).size == 2
    assert reshrink(size=3, fit=1).size == 2
    assert reshrink(size=2).size is None  # already at minReplicas: it waits there
    assert "only 0 of 4 pods were scheduled within 30s" in reshrink().message


# -- the story through the state machine ----------------------------------------------------


class SpotCluster(FakeCluster):
    """The fake cluster with capacity: pods bind only to free, matching nodes."""

    def step(self, advance: float = 0.0) -> Plan:
        self.now += timedelta(seconds=advance)
        plan = reconcile(
            self.job,
            list(self.pods.values()),
            self.node_views(),
            self.now,
            observed_support=dict(self.support),
            cluster_nodes=[node_view(n, b) for n, b in self.nodes.items()],
        )
        self.apply(plan)
        self.plans.append(plan)
        return plan

    def schedule_and_run(self) -> None:
        used = {p["spec"].get("nodeName") for p in self.pods.values()}
        free = [n for n in self.nodes if n not in used]
        for pod in self.pods.values():
            if pod["status"].get("phase") == "Pending" and free:
                pod["spec"]["nodeName"] = free.pop(0)
                pod["status"] = {
                    "phase": "Running",
                    "containerStatuses": [{"name": "trainer", "state": {"running": {}}}],
                }


def spot(replicas: int = 4, nodes: int = 4, **elastic: Any) -> SpotCluster:
    cluster = SpotCluster(
        body={
            **FakeCluster.start(replicas=replicas, template=TEMPLATE).body,
        }
    )
    if elastic:
        cluster.body["spec"]["elastic"] = elastic
    for i in range(nodes):
        cluster.nodes[f"node-{i}"] = node(f"node-{i}")
    return cluster


def lose_two_nodes(cluster: SpotCluster) -> SpotCluster:
    """Start ``cluster``'s 4-pod job, train it past a commit at step 100, then delete two of its
    nodes and let the operator see it."""
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    cluster.report(0, "ep0-ba100", 100, current=110)
    cluster.step(1)
    for lost in ("node-2", "node-3"):
        del cluster.nodes[lost]
    cluster.step(1)
    cluster.step(1)
    return cluster


def reasons(plan: Plan) -> list[str]:
    return [e.reason for e in plan.events]


def test_shrink_after_the_wait_then_grow_back_after_the_requested_checkpoint():
    cluster = spot(minReplicas=2, shrinkAfterSeconds=60, grow={"minIntervalSeconds": 30})
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    st = cluster.status
    assert st["phase"] == "Running" and st["gangSize"] == 4 and st["worldSize"] == 4
    cluster.report(0, "ep0-ba100", 100, current=110)
    cluster.step(1)

    for lost in ("node-2", "node-3"):
        del cluster.nodes[lost]
    plan = cluster.step(1)
    st = cluster.status
    assert st["attempt"] == 1 and st["preemptions"] == 1 and not plan.creations
    assert st["phase"] == "Pending" and "gangSize" not in st and "worldSize" not in st
    capacity = {c["type"]: c for c in st["conditions"]}["CapacityAvailable"]
    assert capacity["status"] == "False" and capacity["reason"] == "WaitingForFullGang"
    assert "WaitingForCapacity" in reasons(plan)

    assert not cluster.step(59).creations
    plan = cluster.step(1)
    assert len(plan.creations) == 2 and "Shrunk" in reasons(plan)
    env = cluster.env(1)
    assert env["WORLD_SIZE"] == "2" and env["RANK"] == "1"
    assert env["RTJ_RESUME_FROM"] == "s3://bucket/ckpt/train/ep0-ba100"
    st = cluster.status
    assert st["gangSize"] == 2 and st["worldSize"] == 2
    full, shrunk = st["sizeHistory"]
    assert full["size"] == 4 and full["seconds"] == pytest.approx(62.0)
    assert shrunk["size"] == 2 and shrunk["reason"] == "Shrunk" and shrunk["stepsLost"] == 10
    cluster.schedule_and_run()
    cluster.step()
    assert cluster.status["phase"] == "Running"

    cluster.nodes["node-4"] = node("node-4")
    cluster.nodes["node-5"] = node("node-5")
    assert not cluster.step(40).notices  # Running, but no step since the resume yet
    cluster.report_step(0, 101)
    assert not cluster.step(1).notices  # trained, but not yet minIntervalSeconds
    plan = cluster.step(30)
    assert "GrowRequested" in reasons(plan) and len(plan.notices) == 2
    assert all(GROW_REASON in n.payload for n in plan.notices)
    assert cluster.status["grow"]["targetSize"] == 4
    plan = cluster.step(1)
    assert not plan.deletions  # nothing restarts before the requested checkpoint commits
    cluster.report(0, "ep0-ba130", 130, current=130)
    plan = cluster.step(1)
    assert {d.name for d in plan.deletions} == {"train-a1-r0", "train-a1-r1"}
    assert len(plan.creations) == 4 and "Grown" in reasons(plan)
    st = cluster.status
    assert st["attempt"] == 2 and st["preemptions"] == 1 and st["failures"] == 0
    assert st["interruptions"][-1]["cause"] == "Grow" and not st["interruptions"][-1]["preemption"]
    assert cluster.env(3)["WORLD_SIZE"] == "4"
    assert cluster.env(3)["RTJ_RESUME_FROM"] == "s3://bucket/ckpt/train/ep0-ba130"
    last = st["sizeHistory"][-1]
    assert last["size"] == 4 and last["reason"] == "Grown" and last["stepsLost"] == 0
    assert "grow" not in st


def test_min_replicas_unreachable_waits_pending_and_never_fails():
    cluster = spot(replicas=4, nodes=1, minReplicas=2, shrinkAfterSeconds=5)
    for _ in range(20):
        plan = cluster.step(60)
        assert not plan.creations
    st = cluster.status
    assert st["phase"] == "Pending" and st["preemptions"] == 0 and st["failures"] == 0
    phase_reason = {c["type"]: c for c in st["conditions"]}["CapacityAvailable"]["reason"]
    assert phase_reason == "MinReplicasUnreachable"
    waits = [p for p in cluster.plans if "WaitingForCapacity" in reasons(p)]
    assert len(waits) == 1  # one event per reason, not one per pass
    cluster.nodes["node-9"] = node("node-9")
    plan = cluster.step(1)  # minReplicas fit: now the wait for the full gang begins
    assert not plan.creations and "WaitingForCapacity" in reasons(plan)
    plan = cluster.step(5)
    assert len(plan.creations) == 2 and cluster.env(0)["WORLD_SIZE"] == "2"


def test_a_wait_below_min_replicas_does_not_count_towards_shrink_after_seconds():
    """Replayed spot trace: after a long wait with room below minReplicas, 3 of 4 nodes came
    back; the gang started at 3 at once and 0.2 s later the fourth node came: a grow (a full
    restart) 20 s later. The wait for the full gang starts when minReplicas first fit."""
    cluster = spot(replicas=4, nodes=1, minReplicas=2, shrinkAfterSeconds=60)
    for _ in range(10):
        assert not cluster.step(60).creations
    assert "capacityWaitSince" not in cluster.status
    cluster.nodes["node-7"] = node("node-7")
    cluster.nodes["node-8"] = node("node-8")
    plan = cluster.step(0.3)
    assert not plan.creations  # room for 3: the wait for the full gang begins now
    st = cluster.status
    capacity = {c["type"]: c for c in st["conditions"]}["CapacityAvailable"]
    assert capacity["reason"] == "WaitingForFullGang"
    assert st["capacityWaitSince"] == iso(cluster.now)
    cluster.nodes["node-9"] = node("node-9")
    plan = cluster.step(0.4)
    assert len(plan.creations) == 4 and cluster.status["gangSize"] == 4
    assert [h["reason"] for h in cluster.status["sizeHistory"]] == ["FullSize"]


def test_the_wait_for_the_full_gang_restarts_when_room_falls_below_min_replicas():
    cluster = spot(replicas=4, nodes=2, minReplicas=2, shrinkAfterSeconds=60)
    assert not cluster.step().creations
    assert cluster.status["capacityWaitSince"] == iso(cluster.now)
    assert not cluster.step(40).creations
    del cluster.nodes["node-1"]
    assert not cluster.step(10).creations
    assert "capacityWaitSince" not in cluster.status
    cluster.nodes["node-1"] = node("node-1")
    assert not cluster.step(20).creations  # 70 s since the first wait, 0 s since 2 fit again
    assert not cluster.step(59).creations
    assert len(cluster.step(1).creations) == 2


def test_a_first_attempt_that_starts_small_says_shrunk():
    cluster = spot(replicas=4, nodes=2, minReplicas=2, shrinkAfterSeconds=10)
    plan = cluster.step()
    assert not plan.creations and "WaitingForCapacity" in reasons(plan)
    plan = cluster.step(10)
    assert len(plan.creations) == 2
    (shrunk,) = [e for e in plan.events if e.reason == "Shrunk"]
    assert shrunk.type == "Warning" and "attempt 0: 4 -> 2 pods (world size 2)" in shrunk.message
    assert cluster.status["sizeHistory"][-1]["reason"] == "Shrunk"


def test_a_fixed_job_ignores_capacity_and_creates_the_whole_gang():
    cluster = spot(replicas=4, nodes=1)
    plan = cluster.step()
    assert len(plan.creations) == 4 and cluster.status["gangSize"] == 4


def test_a_real_notice_overwrites_a_grow_notice():
    cluster = spot(minReplicas=1, shrinkAfterSeconds=0, grow={"minIntervalSeconds": 0}, nodes=2)
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    assert cluster.status["gangSize"] == 2
    cluster.report_step(0, 1)
    cluster.nodes["node-7"] = node("node-7")
    cluster.nodes["node-8"] = node("node-8")
    cluster.step(1)
    pod = cluster.pod(0)
    assert GROW_REASON in pod["metadata"]["annotations"][NOTICE_ANNOTATION]
    where = pod["spec"]["nodeName"]
    cluster.nodes[where]["spec"]["taints"] = [{"key": "karpenter.sh/disrupted"}]
    cluster.step(1)
    assert "karpenter.sh/disrupted" in cluster.pod(0)["metadata"]["annotations"][NOTICE_ANNOTATION]
    assert names.pod_name("train", 0, 0) == pod["metadata"]["name"]


class OvercountedCluster(SpotCluster):
    """Nodes in ``occupied`` count as free (capacity does not subtract foreign pods) but take no
    pod; the gang binds all or nothing, like a native PodGroup."""

    occupied: frozenset[str] = frozenset()

    def schedule_gang(self) -> bool:
        pending = [p for p in self.current_pods() if p["status"].get("phase") == "Pending"]
        used = {p["spec"].get("nodeName") for p in self.pods.values()}
        free = [n for n in self.nodes if n not in used and n not in self.occupied]
        if len(free) < len(pending):
            for pod in pending:
                pod["status"]["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": f"0/{len(self.nodes)} nodes are available",
                    }
                ]
            return False
        for pod in pending:
            pod["spec"]["nodeName"] = free.pop(0)
            pod["status"] = {
                "phase": "Running",
                "containerStatuses": [{"name": "trainer", "state": {"running": {}}}],
            }
        return True


def overcounted(occupied: set[str], **elastic: Any) -> OvercountedCluster:
    cluster = OvercountedCluster(body=spot(**elastic).body, nodes=spot(**elastic).nodes)
    cluster.occupied = frozenset(occupied)
    return cluster


def test_a_gang_that_cannot_be_scheduled_within_the_wait_is_resubmitted_smaller():
    cluster = overcounted({"node-3"}, minReplicas=2, shrinkAfterSeconds=30)
    plan = cluster.step()
    assert len(plan.creations) == 4  # the capacity count says all 4 fit
    assert not cluster.schedule_gang()
    cluster.step(1)
    assert not cluster.step(29).deletions  # still within the wait
    plan = cluster.step(1)
    assert {d.name for d in plan.deletions} == {f"train-a0-r{r}" for r in range(4)}
    assert len(plan.creations) == 3 and "Shrunk" in reasons(plan)
    st = cluster.status
    assert st["attempt"] == 1 and st["gangSize"] == 3 and st["worldSize"] == 3
    assert st["preemptions"] == 0 and st["failures"] == 0
    (interruption,) = st["interruptions"]
    assert interruption["cause"] == "Unschedulable" and interruption["preemption"] is False
    assert "only 0 of 4 pods were scheduled within 30s" in interruption["message"]
    history = [(h["size"], h["reason"]) for h in st["sizeHistory"]]
    assert history == [(4, "FullSize"), (3, "Shrunk")]
    assert cluster.env(2)["WORLD_SIZE"] == "3"
    assert cluster.schedule_gang()
    cluster.step(1)
    assert cluster.status["phase"] == "Running" and cluster.status["gangSize"] == 3


def test_a_reshrink_never_goes_below_min_replicas():
    cluster = overcounted({"node-2", "node-3"}, minReplicas=3, shrinkAfterSeconds=10)
    cluster.step()
    cluster.schedule_gang()
    for _ in range(10):
        cluster.step(10)
        cluster.schedule_gang()
    st = cluster.status
    assert st["attempt"] == 1 and st["gangSize"] == 3  # 4 -> 3, then it waits at minReplicas
    assert st["preemptions"] == 0 and st["failures"] == 0
    scheduled = {c["type"]: c for c in st["conditions"]}["PodsScheduled"]
    assert scheduled["status"] == "False"


class TerminatingCluster(OvercountedCluster):
    """Deleted pods stay, holding their nodes, until ``finish_terminating`` (a grace period)."""

    def apply(self, plan: Plan, *, crash_after_creations: int | None = None) -> None:
        doomed = {d.name: self.pods[d.name] for d in plan.deletions if d.name in self.pods}
        super().apply(plan, crash_after_creations=crash_after_creations)
        for name, pod in doomed.items():
            pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            self.pods[name] = pod

    def finish_terminating(self) -> None:
        for name in [n for n, p in self.pods.items() if p["metadata"].get("deletionTimestamp")]:
            del self.pods[name]


def test_a_gang_waiting_for_its_predecessors_pods_is_not_reshrunk():
    base = spot(minReplicas=2, shrinkAfterSeconds=5, nodes=5)
    cluster = TerminatingCluster(body=base.body, nodes=base.nodes)
    cluster.step()
    assert cluster.schedule_gang()
    cluster.step()
    del cluster.nodes[cluster.pod(3)["spec"]["nodeName"]]  # rank 3's node is reclaimed
    plan = cluster.step(1)
    assert len(plan.creations) == 4  # 4 nodes left: the full gang at once
    # The old ranks are still terminating on their nodes: the new gang cannot bind yet, and its
    # wait for scheduling has not begun.
    for _ in range(6):
        assert not cluster.schedule_gang()
        assert not cluster.step(5).deletions
    assert cluster.status["attempt"] == 1 and "capacityWaitSince" not in cluster.status
    cluster.finish_terminating()
    assert cluster.schedule_gang()
    cluster.step(1)
    assert cluster.status["phase"] == "Running" and cluster.status["gangSize"] == 4


def test_a_wait_for_scheduling_does_not_carry_over_to_the_next_attempt():
    cluster = overcounted({"node-3"}, minReplicas=2, shrinkAfterSeconds=30)
    cluster.step()
    cluster.schedule_gang()
    cluster.step(1)
    assert "capacityWaitSince" in cluster.status
    cluster.step(28)
    cluster.body["spec"]["suspend"] = True
    cluster.step(1)
    del cluster.nodes["node-0"]
    cluster.body["spec"]["suspend"] = False
    plan = cluster.step(1)
    # Room for 3 of 4 now: the new attempt waits its own shrinkAfterSeconds for the full gang.
    assert not plan.creations and cluster.status["attempt"] == 1
    capacity = {c["type"]: c for c in cluster.status["conditions"]}["CapacityAvailable"]
    assert capacity["reason"] == "WaitingForFullGang"


@pytest.mark.parametrize(
    ("committed", "current", "expected"),
    [
        (0, 7, (0, 7)),
        (12, 20, (12, 8)),
        (12, 9, (12, 0)),
        (None, 7, (None, None)),
        (4, None, (4, None)),
    ],
)
def test_steps_lost_count_from_a_checkpoint_at_step_zero_like_any_other(
    committed: int | None, current: int | None, expected: tuple[int | None, int | None]
) -> None:
    status = JobStatus(
        current_step=current,
        last_committed_checkpoint=(
            None if committed is None else CheckpointRecord(name=f"ba{committed}", step=committed)
        ),
    )
    assert committed_and_lost(status) == expected


def test_removing_elastic_drops_a_pending_grow_and_the_next_attempt_is_full_size():
    cluster = spot(replicas=4, nodes=2, minReplicas=2, shrinkAfterSeconds=10)
    cluster.step()
    cluster.step(10)
    cluster.schedule_and_run()
    cluster.step()
    cluster.report(0, "ep0-ba10", 10, current=12)
    cluster.step(1)
    cluster.nodes["node-4"] = node("node-4")
    cluster.nodes["node-5"] = node("node-5")
    plan = cluster.step(400)
    assert "GrowRequested" in reasons(plan) and cluster.status["grow"]["targetSize"] == 4
    del cluster.body["spec"]["elastic"]
    plan = cluster.step(1)
    assert "grow" not in cluster.status and not plan.deletions  # no restart for the edit
    assert cluster.status["gangSize"] == 2
    node_of_rank_1 = cluster.pod(1)["spec"]["nodeName"]
    del cluster.nodes[node_of_rank_1]
    plan = cluster.step(1)
    assert len(plan.creations) == 4 and cluster.status["gangSize"] == 4
    assert cluster.env(3)["WORLD_SIZE"] == "4"


def test_a_suspend_ends_the_wait_for_the_full_gang_and_the_resume_waits_anew():
    """Suspended during the wait for the full gang, the job said "CapacityAvailable=False,
    waiting up to 60s" and kept capacityWaitSince; resumed after the wait had run out while
    suspended, it started shrunk at once instead of waiting shrinkAfterSeconds for the full gang."""
    cluster = spot(nodes=3, minReplicas=2, shrinkAfterSeconds=60)
    cluster.step()
    assert cluster.status["phase"] == "Pending" and "capacityWaitSince" in cluster.status
    cluster.step(10)
    cluster.body["spec"]["suspend"] = True
    cluster.step(1)
    st = cluster.status
    assert st["phase"] == "Suspended" and "capacityWaitSince" not in st
    assert "CapacityAvailable" not in {c["type"] for c in st["conditions"]}

    cluster.body["spec"]["suspend"] = False
    plan = cluster.step(600)
    assert not plan.creations and cluster.status["phase"] == "Pending"
    capacity = {c["type"]: c for c in cluster.status["conditions"]}["CapacityAvailable"]
    assert capacity["status"] == "False" and capacity["reason"] == "WaitingForFullGang"
    assert not cluster.step(59).creations
    plan = cluster.step(1)
    assert len(plan.creations) == 3 and "Shrunk" in reasons(plan)


def test_a_gang_held_by_scheduling_gates_is_not_reshrunk():
    """A gang waiting for Kueue's admission (its pods gated) was ended after the wait as
    'Unschedulable' and resubmitted one pod smaller, again and again down to minReplicas: each
    new gang queued again from the back."""
    cluster = overcounted(set(), minReplicas=2, shrinkAfterSeconds=10)
    cluster.step()
    for pod in cluster.current_pods():
        pod["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
        pod["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
        ]
    for _ in range(6):
        assert not cluster.step(10).deletions
    st = cluster.status
    assert st["attempt"] == 0 and st["gangSize"] == 4 and not st["interruptions"]
    scheduled = {c["type"]: c for c in st["conditions"]}["PodsScheduled"]
    assert scheduled["reason"] == "SchedulingGated"
    assert "kueue.x-k8s.io/admission" in scheduled["message"]

    for pod in cluster.current_pods():  # admitted: the gates go, the gang binds
        del pod["spec"]["schedulingGates"]
        pod["status"]["conditions"] = []
    assert cluster.schedule_gang()
    cluster.step(1)
    assert cluster.status["phase"] == "Running" and cluster.status["gangSize"] == 4


def test_an_abandoned_grow_is_tried_again_only_after_min_interval_seconds():
    """grow.checkpointTimeoutSeconds: without the commit the grow is abandoned and tried again
    after minIntervalSeconds. The request came back on the very next pass instead: the wait
    was counted from the last size change, long past."""
    cluster = spot(
        replicas=4,
        nodes=2,
        minReplicas=2,
        shrinkAfterSeconds=0,
        grow={"minIntervalSeconds": 100, "checkpointTimeoutSeconds": 20},
    )
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    assert cluster.status["gangSize"] == 2
    cluster.report_step(0, 1)
    cluster.step()
    cluster.nodes["node-4"] = node("node-4")
    cluster.nodes["node-5"] = node("node-5")
    plan = cluster.step(100)
    assert "GrowRequested" in reasons(plan)
    plan = cluster.step(20)
    assert "GrowAbandoned" in reasons(plan) and "grow" not in cluster.status
    for _ in range(9):
        plan = cluster.step(10)
        assert "GrowRequested" not in reasons(plan) and not plan.notices
    plan = cluster.step(10)
    assert "GrowRequested" in reasons(plan)


def test_a_grow_is_asked_only_min_interval_seconds_after_the_gang_first_trained():
    """Replayed spot trace: a gang was asked to grow 20 s after it was created
    (minIntervalSeconds counted from the size change, and every pod Running says nothing of the
    trainer), reached its first step 13 s later, trained 2 steps and was replaced. The interval
    now counts from the gang's first progress after its resume, and a gang that has not trained
    since its resume is never asked to grow."""
    cluster = spot(
        replicas=4, nodes=2, minReplicas=2, shrinkAfterSeconds=0, grow={"minIntervalSeconds": 20}
    )
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    assert cluster.status["phase"] == "Running" and cluster.status["gangSize"] == 2
    cluster.nodes["node-4"] = node("node-4")
    cluster.nodes["node-5"] = node("node-5")
    for _ in range(12):  # Running for a minute, loading: no step yet
        plan = cluster.step(5)
        assert "GrowRequested" not in reasons(plan) and not plan.notices
    assert "trainingSince" not in cluster.status
    cluster.report_step(0, 1)  # the first step
    plan = cluster.step(1)
    assert cluster.status["trainingSince"] == iso(cluster.now) and not plan.notices
    assert not cluster.step(19).notices
    plan = cluster.step(1)
    assert "GrowRequested" in reasons(plan) and len(plan.notices) == 2


def test_a_resumed_gang_trains_past_its_resume_point_before_it_may_grow():
    """The progress annotation of the new gang's rank 0 repeating the checkpoint it resumed from
    is no training; a step past it, a newer commit, or a step before the first commit is (also
    at a step below the resumed one: a resume at another world size rescales the step)."""
    cluster = spot(
        replicas=4, nodes=4, minReplicas=2, shrinkAfterSeconds=0, grow={"minIntervalSeconds": 0}
    )
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    cluster.report(0, "ep0-ba100", 100, current=110)
    cluster.step(1)
    assert cluster.status["trainingSince"] == iso(cluster.now)
    del cluster.nodes["node-2"], cluster.nodes["node-3"]
    cluster.step(1)
    cluster.schedule_and_run()
    cluster.step(1)
    st = cluster.status
    assert st["attempt"] == 1 and st["gangSize"] == 2 and st["resumeCheckpoint"] == "ep0-ba100"
    assert "trainingSince" not in st  # the new attempt has not trained yet
    cluster.nodes["node-4"] = node("node-4")
    cluster.nodes["node-5"] = node("node-5")
    cluster.report(0, "ep0-ba100", 100, current=100)
    assert not cluster.step(30).notices and "trainingSince" not in cluster.status
    cluster.report_step(0, 51)
    plan = cluster.step(1)
    assert "trainingSince" in cluster.status and "GrowRequested" in reasons(plan)


def two_running_of_four(**grow: Any) -> SpotCluster:
    cluster = spot(replicas=4, nodes=2, minReplicas=2, shrinkAfterSeconds=0, grow=grow)
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    cluster.report(0, "ep0-ba10", 10, current=12)
    cluster.step(1)
    assert cluster.status["gangSize"] == 2 and "trainingSince" in cluster.status
    return cluster


def test_nodes_coming_back_one_by_one_make_one_grow_not_two():
    """Replayed spot trace: the gang grew 2 -> 3 when a third node came back, then 3 -> 4
    twenty seconds later when the fourth did: two full restarts where one would do. A grow to a
    partial size now waits grow.settleSeconds (default 60) for room for the full gang."""
    cluster = two_running_of_four(minIntervalSeconds=0)
    cluster.nodes["node-4"] = node("node-4")
    plan = cluster.step(1)
    assert "GrowRequested" not in reasons(plan) and not plan.notices
    assert cluster.status["growRoomSince"] == iso(cluster.now)
    assert not cluster.step(20).notices
    cluster.nodes["node-5"] = node("node-5")
    plan = cluster.step(1)  # room for the full gang: no settling
    assert "GrowRequested" in reasons(plan) and cluster.status["grow"]["targetSize"] == 4
    assert "growRoomSince" not in cluster.status
    cluster.report(0, "ep0-ba20", 20, current=20)
    plan = cluster.step(1)
    assert len(plan.creations) == 4 and "Grown" in reasons(plan)
    history = [(h["size"], h["reason"]) for h in cluster.status["sizeHistory"]]
    assert history == [(2, "Shrunk"), (4, "Grown")]


def test_a_partial_grow_comes_once_the_room_settled():
    cluster = two_running_of_four(minIntervalSeconds=0, settleSeconds=30)
    cluster.nodes["node-4"] = node("node-4")
    assert not cluster.step(1).notices and "growRoomSince" in cluster.status
    del cluster.nodes["node-4"]  # the room goes away: the settling starts again when it is back
    assert not cluster.step(20).notices and "growRoomSince" not in cluster.status
    cluster.nodes["node-4"] = node("node-4")
    assert not cluster.step(1).notices
    assert not cluster.step(29).notices
    plan = cluster.step(1)
    assert "GrowRequested" in reasons(plan) and cluster.status["grow"]["targetSize"] == 3


def test_a_suspend_during_a_grow_drops_the_grow_request():
    """status.grow is the grow in progress: a suspend deletes the gang the grow was asked of,
    but the request stayed in status for as long as the job was suspended."""
    cluster = spot(replicas=4, nodes=2, minReplicas=2, shrinkAfterSeconds=0)
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    cluster.report_step(0, 1)
    cluster.step()
    cluster.nodes["node-4"] = node("node-4")
    cluster.nodes["node-5"] = node("node-5")
    assert "GrowRequested" in reasons(cluster.step(400)) and "grow" in cluster.status
    cluster.body["spec"]["suspend"] = True
    cluster.step(1)
    assert cluster.status["phase"] == "Suspended" and "grow" not in cluster.status
