"""A notice under recovery.inProcessSwitch: the noticed pods leave, the others switch (leave.py)."""

from __future__ import annotations

import json

from rtj_operator.api import names
from rtj_operator.api.envvars import MEMBERSHIP_ANNOTATION, NOTICE_ANNOTATION
from rtj_operator.decide.leave import LEAVE_WAIT_SECONDS

from .fakes import FakeCluster
from .test_elastic import SpotCluster, spot
from .test_survivors import ONE_POD_PER_NODE, ready, running

SPOT_ITN = {"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}


def trained_gang(nodes: int = 4, min_replicas: int = 2, **recovery: object) -> SpotCluster:
    """A 4-pod elastic job with Stay (one pod per node), trained past a commit."""
    cluster = spot(nodes=nodes, minReplicas=min_replicas)
    cluster.body["spec"]["template"] = ONE_POD_PER_NODE
    cluster.body["spec"]["recovery"] = {"survivors": "Stay", "inProcessSwitch": True, **recovery}
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    cluster.report(0, "ep0-ba100", 100, current=110)
    cluster.step(1)
    return cluster


def notice_on_rank(cluster: SpotCluster, rank: int) -> str:
    """Taint the node of ``rank``'s pod as AWS's termination handler does; its name."""
    pod = f"train-a0-r{rank}"
    cluster.nodes[cluster.pods[pod]["spec"]["nodeName"]]["spec"]["taints"] = [SPOT_ITN]
    return pod


def told(cluster: SpotCluster, pod: str) -> dict:
    return json.loads(cluster.pods[pod]["metadata"]["annotations"][MEMBERSHIP_ANNOTATION])


def test_a_notice_lets_the_noticed_pod_leave_and_the_others_switch_at_once():
    cluster = trained_gang()
    leaving = notice_on_rank(cluster, 1)
    plan = cluster.step(1)
    st = cluster.status
    assert st["attempt"] == 1 and st["preemptions"] == 1
    assert st["keptPods"] == ["train-a0-r0", "train-a0-r2", "train-a0-r3"]
    assert st["leaving"]["pods"] == [leaving] and st["leaving"]["attempt"] == 1
    last = st["interruptions"][-1]
    assert last["cause"] == "TerminationNotice" and last["stepsLost"] == 0
    assert not plan.deletions  # the leaving pod ends by itself at the next step boundary
    assert NOTICE_ANNOTATION not in cluster.pods[leaving]["metadata"]["annotations"]
    said = told(cluster, leaving)
    assert (said["stop"], said["nodeRank"], said["epoch"], said["nnodes"]) == ("leave", -1, 1, 3)
    kept_event = next(e.message for e in plan.events if e.reason == "SurvivorsStay")
    assert "keeps 3 running pods" in kept_event and "noticed nodes leave" in kept_event
    assert "leave the gang at the next step boundary" in next(
        e.message for e in plan.events if e.reason == "Leaving"
    )
    # The attempt starts as the kept pods, told to switch in process (no pod is created).
    assert st["gangSize"] == 3 and not plan.creations and "restore" not in st
    assert st["sizeHistory"][-1]["reason"] == "SurvivorsFirst"
    kept = [told(cluster, p) for p in st["keptPods"]]
    assert [(k["stop"], k["nodeRank"], k["nnodes"]) for k in kept] == [
        ("switch", 0, 3),
        ("switch", 1, 3),
        ("switch", 2, 3),
    ]
    assert cluster.pods["train-a0-r2"]["metadata"]["labels"][names.LABEL_RANK] == "1"
    plan = cluster.step(LEAVE_WAIT_SECONDS / 2)
    assert leaving not in {d.name for d in plan.deletions}
    assert cluster.status["phase"] == "Running" and cluster.status["attempt"] == 1
    cluster.pods[leaving]["status"] = {
        "phase": "Succeeded",
        "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 0}}}],
    }
    cluster.step(1)
    assert "leaving" not in cluster.status and cluster.status["attempt"] == 1


def test_a_leaving_pod_still_running_after_the_wait_is_deleted():
    cluster = trained_gang()
    leaving = notice_on_rank(cluster, 3)
    cluster.step(1)
    assert not cluster.step(LEAVE_WAIT_SECONDS - 5).deletions
    plan = cluster.step(5)
    assert [d.name for d in plan.deletions] == [leaving]
    assert cluster.status["attempt"] == 1


def test_room_elsewhere_starts_the_lost_place_in_standby():
    cluster = trained_gang(nodes=5)
    notice_on_rank(cluster, 1)
    plan = cluster.step(1)
    st = cluster.status
    assert st["gangSize"] == 3 and st["restore"]["size"] == 4
    assert "1 pods for the lost places start in standby" in st["sizeHistory"][-1]["message"]
    plan = cluster.step(1)
    assert [p["metadata"]["name"] for p in plan.spares] == ["train-a1-s0"]


def test_without_enough_pods_left_or_the_switch_the_notice_is_passed_on():
    for cluster in (trained_gang(min_replicas=4), trained_gang(inProcessSwitch=False)):
        noticed = notice_on_rank(cluster, 1)
        plan = cluster.step(1)
        assert cluster.status["attempt"] == 0 and "leaving" not in cluster.status
        assert [n.pod for n in plan.notices] == [noticed]


def test_a_gang_that_has_not_trained_yet_is_passed_the_notice():
    cluster = spot(nodes=4, minReplicas=2)
    cluster.body["spec"]["template"] = ONE_POD_PER_NODE
    cluster.body["spec"]["recovery"] = {"survivors": "Stay", "inProcessSwitch": True}
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    noticed = notice_on_rank(cluster, 2)
    plan = cluster.step(1)
    assert cluster.status["attempt"] == 0 and [n.pod for n in plan.notices] == [noticed]


def fixed_gang_with_a_spare(*, warm: bool) -> FakeCluster:
    """A fixed 3-pod Stay job with one spare (warm or not), trained past a commit."""
    cluster = running()
    cluster.body["spec"]["recovery"] = {"survivors": "Stay", "spares": 1, "inProcessSwitch": True}
    cluster.step(1)
    cluster.schedule_and_run()
    if warm:
        ready(cluster, "train-a0-s0", 1)
    cluster.report(0, "ep0-ba100", 100, current=110)
    cluster.step(1)
    return cluster


def test_a_fixed_gangs_warm_spare_takes_the_noticed_place_by_the_switch():
    cluster = fixed_gang_with_a_spare(warm=True)
    leaving = notice_on_rank(cluster, 1)
    plan = cluster.step(1)
    st = cluster.status
    assert st["attempt"] == 1 and st["preemptions"] == 1 and st["gangSize"] == 3
    assert st["keptPods"] == ["train-a0-r0", "train-a0-r2", "train-a0-s0"]
    assert st["leaving"]["pods"] == [leaving]
    last = st["interruptions"][-1]
    assert last["cause"] == "TerminationNotice" and last["stepsLost"] == 0
    assert not plan.creations and not plan.deletions
    assert st["sizeHistory"][-1]["reason"] == "Fixed" and len(st["sizeHistory"]) == 1
    said = told(cluster, leaving)
    assert (said["stop"], said["nodeRank"], said["nnodes"]) == ("leave", -1, 3)
    kept = [told(cluster, p) for p in st["keptPods"]]
    assert [(k["stop"], k["nodeRank"], k["nnodes"]) for k in kept] == [
        ("switch", 0, 3),
        ("switch", 1, 3),
        ("switch", 2, 3),
    ]
    spare = cluster.pods["train-a0-s0"]["metadata"]["labels"]
    assert spare[names.LABEL_RANK] == "2" and names.LABEL_ROLE not in spare
    assert [p["metadata"]["name"] for p in cluster.step(1).spares] == ["train-a1-s0"]


def test_a_fixed_gang_without_a_warm_spare_is_passed_the_notice():
    cluster = fixed_gang_with_a_spare(warm=False)
    noticed = notice_on_rank(cluster, 1)
    plan = cluster.step(1)
    assert cluster.status["attempt"] == 0 and "leaving" not in cluster.status
    assert [n.pod for n in plan.notices] == [noticed]


def test_a_loss_without_notice_lets_the_kept_pods_and_a_warm_spare_rejoin_in_process():
    """A fixed gang with a warm spare loses a node without notice: the spare takes the place,
    every place of the next attempt is a pod already running, and all are told ``stop: rejoin``
    (the kept workers re-form from their failed collective, the spare gets rank 0's state)."""
    cluster = fixed_gang_with_a_spare(warm=True)
    del cluster.nodes[cluster.pods["train-a0-r1"]["spec"]["nodeName"]]
    plan = cluster.step(1)
    st = cluster.status
    assert st["attempt"] == 1 and st["gangSize"] == 3 and not plan.creations
    assert st["keptPods"] == ["train-a0-r0", "train-a0-r2", "train-a0-s0"]
    assert st["interruptions"][-1]["cause"] != "TerminationNotice"
    assert [(told(cluster, p)["stop"], told(cluster, p)["nodeRank"]) for p in st["keptPods"]] == [
        ("rejoin", 0),
        ("rejoin", 1),
        ("rejoin", 2),
    ]
    assert "leaving" not in st


def test_a_loss_with_a_cold_new_pod_restarts_the_kept_workers_though_they_could_switch():
    """The spare is not warm: the lost place gets a new pod, which resumes from the commit, so
    the kept workers cannot go on in process with it (``stop: kill``)."""
    cluster = fixed_gang_with_a_spare(warm=False)
    del cluster.nodes[cluster.pods["train-a0-r1"]["spec"]["nodeName"]]
    plan = cluster.step(1)
    st = cluster.status
    assert st["attempt"] == 1 and st["keptPods"] == ["train-a0-r0", "train-a0-r2"]
    assert [p["metadata"]["name"] for p in plan.creations] == ["train-a1-r2"]
    assert {told(cluster, p)["stop"] for p in st["keptPods"]} == {"kill"}
