"""recovery.survivors Stay: a preempted gang keeps its healthy pods (survivors.py)."""

from __future__ import annotations

import json

import pytest

from rtj_operator.api import names
from rtj_operator.api.envvars import (
    AGENT_READY_ANNOTATION,
    MEMBERSHIP_ANNOTATION,
    MEMBERSHIP_CHANGED,
    NOTICE_ANNOTATION,
    PROGRESS_ANNOTATION,
    STANDBY,
)
from rtj_operator.decide.plan_types import Plan
from rtj_operator.decide.reconcile import reconcile
from rtj_operator.decide.restore import RESTORE_WAIT_SECONDS
from rtj_operator.decide.survivors import STANDBY_WAIT_SECONDS

from .fakes import FakeCluster
from .test_elastic import SpotCluster, lose_two_nodes, node, spot

TEMPLATE = {
    "spec": {
        "containers": [{"name": "trainer", "image": "img", "command": ["python"], "args": ["t.py"]}]
    }
}


ONE_POD_PER_NODE = {
    "spec": {
        "containers": [
            {**TEMPLATE["spec"]["containers"][0], "resources": {"requests": {"cpu": "3"}}}
        ]
    }
}
"""A template of which one pod fits a test node (4 CPUs)."""


def running(replicas: int = 3, **spec) -> FakeCluster:
    cluster = FakeCluster.start(
        replicas=replicas, template=TEMPLATE, recovery={"survivors": "Stay"}, **spec
    )
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    return cluster


def test_a_lost_node_keeps_the_other_pods_and_replaces_only_the_lost_one():
    cluster = running()
    kept_env = cluster.env(2)  # the pod of rank 2, kept as rank 1, as it was created
    cluster.report(0, "ep0-ba100", 100, current=130)
    cluster.step()
    del cluster.nodes["node-1"]
    plan = cluster.step(1)
    st = cluster.status
    assert st["attempt"] == 1 and st["preemptions"] == 1 and st["failures"] == 0
    assert st["keptPods"] == ["train-a0-r0", "train-a0-r2"]
    assert {d.name for d in plan.deletions} == {"train-a0-r1"}
    assert [p["metadata"]["name"] for p in plan.creations] == ["train-a1-r2"]
    assert [(m.pod, m.labels[names.LABEL_RANK]) for m in plan.memberships] == [
        ("train-a0-r0", "0"),
        ("train-a0-r2", "1"),
    ]
    # The new pod joins pods that may still be saving: its download waits for their word.
    assert cluster.env(2)[MEMBERSHIP_CHANGED] == "1" and MEMBERSHIP_CHANGED not in kept_env
    kept = cluster.pods["train-a0-r2"]
    assert kept["metadata"]["labels"][names.LABEL_ATTEMPT] == "1"
    assert PROGRESS_ANNOTATION not in kept["metadata"]["annotations"]
    told = json.loads(kept["metadata"]["annotations"][MEMBERSHIP_ANNOTATION])
    env_of_new = cluster.env(2)
    assert told == {
        "epoch": 1,
        "attempt": 1,
        "nnodes": 3,
        "nodeRank": 1,
        "masterAddr": "train-a0-r0.train",
        "masterPort": 29500,
        "resumeFrom": "s3://bucket/ckpt/train/ep0-ba100",
        "stop": "kill",
        # the interval's figures as the new pod gets them, not those of the kept pod's creation
        "mtbiSeconds": int(env_of_new["RTJ_MTBI_SECONDS"]),
        "interruptions": int(env_of_new["RTJ_INTERRUPTIONS"]),
        "savers": 2,  # both kept pods hold the state: a large one is saved in shares
    }
    assert told["interruptions"] == 1  # the loss rolled work back (130 > 100): counted
    assert told["mtbiSeconds"] < int(kept_env["RTJ_MTBI_SECONDS"])
    env = cluster.env(2)
    assert env["MASTER_ADDR"] == "train-a0-r0.train" and env["RANK"] == "2"
    assert env["RTJ_MEMBERSHIP_EPOCH"] == "1"
    assert any(e.reason == "SurvivorsStay" for e in plan.events)
    role_pods = cluster.support["Role"]["rules"][0]["resourceNames"]
    assert {"train-a0-r0", "train-a0-r2", "train-a1-r2"} <= set(role_pods)
    cluster.schedule_and_run()
    plan = cluster.step()
    assert cluster.status["phase"] == "Running"
    assert not plan.deletions  # the kept pods are the attempt's, not old ones to clean up
    assert len(cluster.current_pods()) == 3


def test_the_training_command_runs_under_the_agent():
    cluster = running(replicas=2)
    container = cluster.pod(0)["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "trainer_runtime.agent", "--", "python", "t.py"]
    assert "args" not in container


def test_a_second_loss_keeps_the_kept_pods_again():
    cluster = running()
    del cluster.nodes["node-1"]
    cluster.step(1)
    cluster.schedule_and_run()
    cluster.step()
    del cluster.nodes["node-0"]  # rank 0 of attempt 1: the kept train-a0-r0
    plan = cluster.step(1)
    assert cluster.status["attempt"] == 2
    assert cluster.status["keptPods"] == ["train-a0-r2", "train-a1-r2"]
    assert [p["metadata"]["name"] for p in plan.creations] == ["train-a2-r2"]
    told = json.loads(cluster.pods["train-a1-r2"]["metadata"]["annotations"][MEMBERSHIP_ANNOTATION])
    assert (
        told["epoch"] == 2 and told["nodeRank"] == 1 and told["masterAddr"] == "train-a0-r2.train"
    )


def test_a_failure_replaces_the_whole_gang():
    cluster = running()
    cluster.terminate(1, 1)
    plan = cluster.step(1)
    assert cluster.status["failures"] == 1 and not cluster.status.get("keptPods")
    assert {d.name for d in plan.deletions} == {"train-a0-r0", "train-a0-r2"}


def test_without_stay_the_gang_is_replaced_whole():
    cluster = FakeCluster.start(replicas=3, template=TEMPLATE)
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    del cluster.nodes["node-1"]
    plan = cluster.step(1)
    assert len(plan.creations) == 3 and not plan.memberships
    assert cluster.pod(0)["spec"]["containers"][0]["command"] == ["python"]
    assert all(MEMBERSHIP_CHANGED not in cluster.env(r) for r in range(3))  # nothing to wait for


def test_under_native_gang_scheduling_the_new_podgroup_holds_only_the_new_pods():
    cluster = FakeCluster.start(replicas=3, template=TEMPLATE, recovery={"survivors": "Stay"})
    cluster.native_gang = True
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    assert cluster.status["gangScheduling"] == "PodGroup"
    del cluster.nodes["node-2"]
    plan = cluster.step(1)
    assert cluster.status["keptPods"] == ["train-a0-r0", "train-a0-r1"]
    assert [p["metadata"]["name"] for p in plan.creations] == ["train-a1-r2"]
    assert plan.pod_group is not None
    assert plan.pod_group["spec"]["schedulingPolicy"]["gang"]["minCount"] == 1
    assert plan.creations[0]["spec"]["schedulingGroup"]["podGroupName"].endswith("a1")


def test_a_kept_pod_that_ended_before_its_adoption_makes_the_attempt_replace_every_pod():
    cluster = running()
    del cluster.nodes["node-1"]
    plan = reconcile(cluster.job, list(cluster.pods.values()), cluster.node_views(), cluster.now)
    # the operator dies right after writing the status: nothing else of the plan happens
    cluster.apply(Plan(status=plan.status))
    assert cluster.status["keptPods"] == ["train-a0-r0", "train-a0-r2"]
    cluster.pods["train-a0-r2"]["status"]["phase"] = "Failed"  # its agent gave up meanwhile
    plan = cluster.step(1)
    assert not cluster.status.get("keptPods") and not plan.memberships
    assert "train-a0-r0" in {d.name for d in plan.deletions}
    assert [p["metadata"]["name"] for p in plan.creations] == [
        "train-a1-r0",
        "train-a1-r1",
        "train-a1-r2",
    ]


def stay_job_losing_two_nodes(template: dict = ONE_POD_PER_NODE, **elastic: object) -> SpotCluster:
    """A 4-pod elastic job with Stay, trained past a commit, that has just lost two of its
    nodes (one pod fits a node: no room is left for the lost places' pods)."""
    cluster = spot(**elastic)
    cluster.body["spec"]["template"] = template
    cluster.body["spec"]["recovery"] = {"survivors": "Stay"}
    return lose_two_nodes(cluster)


def shrunk_to_two_with_room_for_four(**recovery: object) -> SpotCluster:
    """A 4-pod elastic job that lost two nodes, shrank to its two kept pods, trained, and now
    has room for all four again, ``grow.minIntervalSeconds`` after it resumed: its next pass
    grows."""
    cluster = stay_job_losing_two_nodes(minReplicas=2, grow={"minIntervalSeconds": 30})
    cluster.body["spec"]["recovery"].update(recovery)
    assert cluster.status["gangSize"] == 2 and len(cluster.status["keptPods"]) == 2
    cluster.schedule_and_run()
    cluster.step()
    cluster.report_step(0, 111)
    cluster.nodes["node-4"] = node("node-4")
    cluster.nodes["node-5"] = node("node-5")
    cluster.step(1)  # trained since the resume
    assert not cluster.step(29).events  # the grow is due on the next pass
    cluster.report_step(0, 130)
    return cluster


def losing_one_of_four_nodes_with_one_to_spare(**recovery: object) -> SpotCluster:
    """A 4-pod elastic job with Stay on five nodes (one pod each), trained past a commit, that
    has just lost the node of rank 3: the spare node has room for the lost place's pod."""
    cluster = spot(nodes=5, minReplicas=2)
    cluster.body["spec"]["template"] = ONE_POD_PER_NODE
    cluster.body["spec"]["recovery"] = {"survivors": "Stay", **recovery}
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    cluster.report(0, "ep0-ba100", 100, current=110)
    cluster.step(1)
    del cluster.nodes[cluster.pods["train-a0-r3"]["spec"]["nodeName"]]
    return cluster


@pytest.mark.parametrize("in_process", [False, True])
def test_a_loss_with_room_left_trains_on_as_the_kept_pods_and_grows_back_when_warm(in_process):
    """The kept ranks do not wait for the lost place's new pod to cold-start: they go on alone
    at once, the new pod starts in standby beside them, and the gang grows back as soon as it
    is warm (no grow interval), every pod told the new membership on the next pass."""
    cluster = losing_one_of_four_nodes_with_one_to_spare(inProcessSwitch=in_process)
    plan = cluster.step(1)
    st = cluster.status
    assert st["attempt"] == 1 and st["gangSize"] == 3 and st["restore"]["size"] == 4
    assert st["keptPods"] == ["train-a0-r0", "train-a0-r1", "train-a0-r2"] and not plan.creations
    shrunk = next(e for e in plan.events if e.reason == "Shrunk")
    assert "3 kept pods train on at once; 1 pods for the lost places start in standby" in (
        shrunk.message
    )
    assert st["sizeHistory"][-1]["reason"] == "SurvivorsFirst"
    # Every place of the shrunk gang is a kept pod: with the in-process switch they rejoin in
    # process (their workers re-form from the failed collective), else their workers restart.
    stops = {json.loads(m.annotations[MEMBERSHIP_ANNOTATION])["stop"] for m in plan.memberships}
    assert stops == {"rejoin" if in_process else "kill"}
    plan = cluster.step(1)
    assert [p["metadata"]["name"] for p in plan.spares] == ["train-a1-s0"]
    env = cluster.pods["train-a1-s0"]["spec"]["containers"][0]["env"]
    assert {"name": STANDBY, "value": "1"} in env
    cluster.schedule_and_run()  # the standby pod takes the spare node
    cluster.report_step(0, 112, attempt=1)  # the kept pods train at 3
    assert not cluster.step(1).memberships  # the standby pod is not warm yet
    ready(cluster, "train-a1-s0", 2)
    plan = cluster.step(1)
    grew = next(e for e in plan.events if e.reason == "Growing")
    assert "all 1 standby pods for the lost places are warm" in grew.message
    st = cluster.status
    assert st["attempt"] == 2 and "restore" not in st and st["gangSize"] == 4
    assert st["keptPods"] == ["train-a0-r0", "train-a0-r1", "train-a0-r2", "train-a1-s0"]
    assert not plan.creations and not plan.deletions
    assert st["interruptions"][-1]["cause"] == "Grow" and st["interruptions"][-1]["stepsLost"] == 0
    plan = cluster.step(1)  # nothing to wait for: every pod is told at once
    told = {m.pod: json.loads(m.annotations[MEMBERSHIP_ANNOTATION]) for m in plan.memberships}
    assert [told[p]["nodeRank"] for p in st["keptPods"]] == [0, 1, 2, 3]
    assert {t["stop"] for t in told.values()} == {"switch" if in_process else "save"}
    assert {(t["epoch"], t["nnodes"], t["savers"]) for t in told.values()} == {(2, 4, 3)}
    assert names.LABEL_ROLE not in cluster.pods["train-a1-s0"]["metadata"]["labels"]
    switched = next(e for e in plan.events if e.reason == "MembershipSwitched")
    assert "every pod runs already" in switched.message and "the 3 kept pods that" in (
        switched.message
    )


def test_a_placed_standby_pod_slow_to_get_warm_is_waited_for_longer():
    """A standby pod on a node but not warm after the warm join's wait (a slow image pull) is
    still coming: the gang waits up to RESTORE_WAIT_SECONDS for it, then gives it up."""
    cluster = losing_one_of_four_nodes_with_one_to_spare()
    cluster.step(1)
    cluster.step(1)
    cluster.schedule_and_run()
    cluster.report_step(0, 112, attempt=1)
    plan = cluster.step(STANDBY_WAIT_SECONDS + 10)
    assert "RestoreAbandoned" not in [e.reason for e in plan.events]
    assert cluster.status["restore"]["size"] == 4
    plan = cluster.step(RESTORE_WAIT_SECONDS - STANDBY_WAIT_SECONDS)
    assert "RestoreAbandoned" in [e.reason for e in plan.events]
    # From here the grow policy decides: its interval is over, so it grows as it would have.
    assert "restore" not in cluster.status and "Growing" in [e.reason for e in plan.events]


def test_a_loss_waits_for_the_new_pods_where_one_more_join_would_cost_more():
    """A job whose grows pause it about as long as a cold start (GPU-scale restarts): going
    on alone and joining later does not pay (grow_payoff.survivors_first_pays), so the loss
    gives the lost place a new pod at once, as without a warm join."""
    cluster = losing_one_of_four_nodes_with_one_to_spare()
    cluster.status["goodput"].update(
        startingSeconds=150.0, plannedRestartingSeconds=101.0, plannedRestarts=1
    )
    plan = cluster.step(1)
    st = cluster.status
    assert st["attempt"] == 1 and st["gangSize"] == 4 and "restore" not in st
    assert [p["metadata"]["name"] for p in plan.creations] == ["train-a1-r3"]


def test_standby_pods_for_the_lost_places_not_warm_in_time_are_given_up():
    """A loss that seems to leave room (this fake scheduler places one pod per node, though
    the nodes' CPUs fit more): the kept pods go on alone at once, and the standby pods that
    no node takes are deleted after the wait; the gang then grows as its grow policy says."""
    cluster = stay_job_losing_two_nodes(template=TEMPLATE, minReplicas=2)
    st = cluster.status
    assert st["gangSize"] == 2 and len(st["keptPods"]) == 2 and st["restore"]["size"] == 4
    assert len([p for p in cluster.pods if "-s" in p]) == 2  # started, never placed
    cluster.step(STANDBY_WAIT_SECONDS - 5)
    assert "restore" in cluster.status
    abandoned = next(e for e in cluster.step(5).events if e.reason == "RestoreAbandoned")
    assert "none of the 2 standby pods is warm after 121s" in abandoned.message
    assert "restore" not in cluster.status and cluster.status["gangSize"] == 2
    assert {d.name for d in cluster.step(1).deletions} == {"train-a1-s0", "train-a1-s1"}


def ready(cluster: SpotCluster, pod_name: str, epoch: int) -> None:
    annotations = cluster.pods[pod_name]["metadata"].setdefault("annotations", {})
    annotations[AGENT_READY_ANNOTATION] = json.dumps({"epoch": epoch})


def test_a_grow_keeps_the_gang_training_until_its_new_pods_are_warm():
    cluster = shrunk_to_two_with_room_for_four()
    plan = cluster.step(1)
    reasons = [e.reason for e in plan.events]  # no checkpoint first: the kept pods save later
    assert "Growing" in reasons and "GrowRequested" not in reasons and not plan.notices
    growing = next(e for e in plan.events if e.reason == "Growing")
    assert "stay and train on, with no checkpoint first" in growing.message
    st = cluster.status
    assert st["attempt"] == 2 and st["keptPods"] == ["train-a0-r0", "train-a0-r1"]
    assert st["membershipPendingSince"] is not None
    assert not plan.deletions and len(plan.creations) == 2
    assert st["interruptions"][-1]["cause"] == "Grow" and st["interruptions"][-1]["stepsLost"] == 0
    # The new pods start in standby; the kept ones are relabelled but told nothing yet.
    assert cluster.env(2)[STANDBY] == "1" and cluster.env(3)[STANDBY] == "1"
    assert MEMBERSHIP_CHANGED not in cluster.env(2)  # its agent marks the switch's workers
    for name in st["keptPods"]:
        annotations = cluster.pods[name]["metadata"]["annotations"]
        assert json.loads(annotations[MEMBERSHIP_ANNOTATION])["epoch"] == 1  # the shrink's
        assert NOTICE_ANNOTATION not in annotations  # no grow's request to answer
        assert cluster.pods[name]["metadata"]["labels"][names.LABEL_ATTEMPT] == "2"
    cluster.schedule_and_run()
    ready(cluster, "train-a2-r2", 2)
    assert not cluster.step(1).memberships  # one new pod is still cold
    ready(cluster, "train-a2-r3", 1)  # an earlier epoch's word does not count
    assert not cluster.step(1).memberships
    ready(cluster, "train-a2-r3", 2)
    plan = cluster.step(1)
    told = {m.pod: json.loads(m.annotations[MEMBERSHIP_ANNOTATION]) for m in plan.memberships}
    assert set(told) == {"train-a0-r0", "train-a0-r1", "train-a2-r2", "train-a2-r3"}
    assert [told[p]["nodeRank"] for p in sorted(told)] == [0, 1, 2, 3]
    assert {told[p]["stop"] for p in ("train-a0-r0", "train-a0-r1")} == {"save"}
    assert all(
        t["resumeFrom"] == "" and t["epoch"] == 2 and t["nnodes"] == 4 for t in told.values()
    )
    assert "MembershipSwitched" in [e.reason for e in plan.events]
    assert "membershipPendingSince" not in cluster.status
    assert not cluster.step(1).memberships  # said once


def test_a_gang_that_rejoined_in_process_counts_only_the_step_it_had_not_finished():
    """The kept workers rejoined in process from the last step they finished (109), which
    nobody committed: rank 0 reports ``continued_from`` and the loss counts only the step after
    it that the gang had reached (110), not every step since the commit (100)."""
    cluster = losing_one_of_four_nodes_with_one_to_spare(inProcessSwitch=True)
    cluster.step(1)
    st = cluster.status
    assert st["attempt"] == 1 and st["interruptions"][-1]["stepsLost"] == 10
    assert st["sizeHistory"][-1]["stepsLost"] == 10
    cluster.report_step(0, 111, attempt=0)  # the old workers' word is not the new gang's
    cluster.pod(0)["metadata"]["annotations"][PROGRESS_ANNOTATION] = json.dumps(
        {"current_step": 111, "continued_from": 109, "attempt": 0}
    )
    cluster.step(1)
    assert cluster.status["interruptions"][-1]["stepsLost"] == 10
    cluster.pod(0)["metadata"]["annotations"][PROGRESS_ANNOTATION] = json.dumps(
        {"current_step": 111, "continued_from": 109, "attempt": 1}
    )
    cluster.step(1)
    st = cluster.status
    assert st["interruptions"][-1]["stepsLost"] == 1
    assert st["sizeHistory"][-1]["attempt"] == 1 and st["sizeHistory"][-1]["stepsLost"] == 1


def test_an_in_process_switch_tells_every_pod_to_switch():
    """``recovery.inProcessSwitch``: the warm join's membership says ``stop: switch`` to every
    pod: the kept pods' workers switch in process, the new ones take the state from them."""
    cluster = shrunk_to_two_with_room_for_four(inProcessSwitch=True)
    cluster.step(1)
    assert cluster.status["attempt"] == 2 and cluster.status["interruptions"][-1]["stepsLost"] == 0
    cluster.schedule_and_run()
    ready(cluster, "train-a2-r2", 2)
    ready(cluster, "train-a2-r3", 2)
    plan = cluster.step(1)
    told = {m.pod: json.loads(m.annotations[MEMBERSHIP_ANNOTATION]) for m in plan.memberships}
    assert {t["stop"] for t in told.values()} == {"switch"} and len(told) == 4
    assert [told[p]["nodeRank"] for p in sorted(told)] == [0, 1, 2, 3]
    switched = next(e for e in plan.events if e.reason == "MembershipSwitched")
    assert "switch in process and send the others the state" in switched.message


def test_a_loss_during_a_warm_join_counts_only_the_trained_pods_as_savers():
    """The standby pods of a pending warm join are running but hold no state: kept at a loss,
    they take ranks after the trained pods and are no savers (savers that never come would
    hold node rank 0's save until the rejoin wait ends)."""
    cluster = shrunk_to_two_with_room_for_four()
    cluster.step(1)
    cluster.schedule_and_run()
    ready(cluster, "train-a2-r2", 2)
    assert cluster.status["membershipPendingSince"] is not None
    del cluster.nodes[cluster.pods["train-a0-r1"]["spec"]["nodeName"]]
    plan = cluster.step(1)
    st = cluster.status
    assert st["attempt"] == 3 and st["keptPods"] == ["train-a0-r0", "train-a2-r2", "train-a2-r3"]
    told = {m.pod: json.loads(m.annotations[MEMBERSHIP_ANNOTATION]) for m in plan.memberships}
    assert {t["savers"] for t in told.values()} == {1}
    assert [told[p]["nodeRank"] for p in st["keptPods"]] == [0, 1, 2]
    # Once told a membership, a pod that began in standby has trained and holds the state.
    cluster.schedule_and_run()
    cluster.step()
    del cluster.nodes[cluster.pods["train-a0-r0"]["spec"]["nodeName"]]
    plan = cluster.step(1)
    told = {m.pod: json.loads(m.annotations[MEMBERSHIP_ANNOTATION]) for m in plan.memberships}
    assert cluster.status["keptPods"][:2] == ["train-a2-r2", "train-a2-r3"]
    assert told["train-a2-r2"]["savers"] == 2


def test_a_loss_during_a_warm_join_leaves_the_standby_pods_to_join_when_warm():
    """A loss of a standby pod's node during a warm join, the two trained pods enough for
    ``minReplicas``: they go on alone at once (survivors first); the standby pod still
    starting is not made a member they would wait for, but waits beside them as a spare and
    joins when warm."""
    cluster = shrunk_to_two_with_room_for_four()
    cluster.step(1)
    cluster.schedule_and_run()
    assert cluster.status["membershipPendingSince"] is not None
    del cluster.nodes[cluster.pods["train-a2-r3"]["spec"]["nodeName"]]
    plan = cluster.step(1)
    st = cluster.status
    assert st["attempt"] == 3 and st["gangSize"] == 2 and st["restore"]["size"] == 3
    assert st["keptPods"] == ["train-a0-r0", "train-a0-r1"] and not plan.creations
    standby = cluster.pods["train-a2-r2"]["metadata"]["labels"]
    assert standby[names.LABEL_ROLE] == names.ROLE_SPARE and names.LABEL_ATTEMPT not in standby
    assert "train-a2-r2" not in {d.name for d in plan.deletions}
    cluster.report_step(0, 140, attempt=3)  # the two train at once
    assert not cluster.step(1).spares  # the standby pod is the spare: none is started
    ready(cluster, "train-a2-r2", 2)
    plan = cluster.step(1)
    assert "Growing" in [e.reason for e in plan.events]
    assert cluster.status["keptPods"] == ["train-a0-r0", "train-a0-r1", "train-a2-r2"]


def test_a_warm_join_trains_until_the_switch_and_then_accounts_its_restart_as_planned():
    """The kept pods train on under their old membership while the new ones start: that is
    training time. The switch stops them (save, every worker restarted); the time until the
    new gang trains is the grow's restart, the pause ``grow.onlyWhenItPays`` weighs. The old
    workers' steps and their save at the switch, reported on the relabelled pods, say their
    own attempt and are not taken for the new gang's training."""
    cluster = shrunk_to_two_with_room_for_four()
    cluster.step(1)  # the grow: attempt 2, its new pods in standby
    cluster.schedule_and_run()
    before = dict(cluster.status["goodput"])
    cluster.report_step(0, 140, attempt=1)  # the kept pods' old workers train on
    cluster.step(30)
    goodput = cluster.status["goodput"]
    assert goodput["activity"] == "Training" and "trainingSince" not in cluster.status
    ready(cluster, "train-a2-r2", 2)
    ready(cluster, "train-a2-r3", 2)
    assert "MembershipSwitched" in [e.reason for e in cluster.step(1).events]
    switched = dict(cluster.status["goodput"])
    assert switched["activity"] == "Restarting"
    assert switched["trainingSeconds"] >= before["trainingSeconds"] + 31  # the wait trained
    assert switched["restartingSeconds"] == before["restartingSeconds"]
    cluster.report(0, "ep0-ba141", 141, current=141, attempt=1)  # the switch's save
    cluster.step(8)
    assert cluster.status["goodput"]["activity"] == "Restarting"
    cluster.report_step(0, 142, attempt=2)  # the re-formed gang's first step
    cluster.step(4)
    goodput = cluster.status["goodput"]
    assert goodput["activity"] == "Training" and "trainingSince" in cluster.status
    planned = goodput["plannedRestartingSeconds"] - switched.get("plannedRestartingSeconds", 0)
    assert planned == pytest.approx(12.0)


def test_a_grow_whose_new_pods_never_get_warm_switches_after_the_wait():
    cluster = shrunk_to_two_with_room_for_four()
    cluster.step(1)
    cluster.schedule_and_run()
    assert not cluster.step(STANDBY_WAIT_SECONDS - 5).memberships
    plan = cluster.step(5)
    assert len(plan.memberships) == 4
    switched = next(e for e in plan.events if e.reason == "MembershipSwitched")
    assert "0 of 2 new pods are warm" in switched.message


def test_a_running_gang_starts_its_spares_in_standby_under_their_own_names():
    cluster = running()
    cluster.body["spec"]["recovery"] = {"survivors": "Stay", "spares": 2}
    plan = cluster.step(1)
    assert [p["metadata"]["name"] for p in plan.spares] == ["train-a0-s0", "train-a0-s1"]
    spare = cluster.pods["train-a0-s0"]
    labels = spare["metadata"]["labels"]
    assert labels[names.LABEL_ROLE] == names.ROLE_SPARE
    assert names.LABEL_ATTEMPT not in labels and names.LABEL_RANK not in labels
    env = {e["name"]: e.get("value") for e in spare["spec"]["containers"][0]["env"]}
    assert env[STANDBY] == "1" and env["RTJ_POD_NAME"] == "train-a0-s0"
    assert env["RTJ_MEMBERSHIP_EPOCH"] == "1"  # it can join attempt 1 or any later one
    command = spare["spec"]["containers"][0]["command"]
    assert command[:3] == ["python", "-m", "trainer_runtime.agent"]
    assert spare["spec"]["hostname"] == "train-a0-s0"
    role_pods = cluster.support["Role"]["rules"][0]["resourceNames"]
    assert {"train-a0-s0", "train-a0-s1"} <= set(role_pods)
    assert not cluster.step(1).spares  # started once
    assert len(cluster.current_pods()) == 3  # the gang does not count them


def test_a_warm_spare_takes_the_lost_rank_and_a_new_spare_is_started():
    cluster = running()
    cluster.body["spec"]["recovery"] = {"survivors": "Stay", "spares": 1}
    cluster.step(1)
    cluster.schedule_and_run()
    ready(cluster, "train-a0-s0", 1)
    cluster.report(0, "ep0-ba100", 100, current=130)
    cluster.step(1)
    del cluster.nodes["node-1"]
    plan = cluster.step(1)
    st = cluster.status
    assert st["keptPods"] == ["train-a0-r0", "train-a0-r2", "train-a0-s0"]
    assert not plan.creations  # every place is taken by a pod that is already up
    spare = cluster.pods["train-a0-s0"]["metadata"]
    assert spare["labels"][names.LABEL_RANK] == "2" and names.LABEL_ROLE not in spare["labels"]
    told = json.loads(spare["annotations"][MEMBERSHIP_ANNOTATION])
    assert told["nodeRank"] == 2 and told["epoch"] == 1 and told["stop"] == "kill"
    assert told["savers"] == 2  # the survivors hold the state; the spare holds none
    plan = cluster.step(1)
    assert cluster.status["phase"] == "Running" and len(cluster.current_pods()) == 3
    assert [p["metadata"]["name"] for p in plan.spares] == ["train-a1-s0"]

    # A later loss: the spare that took a rank holds the state like any survivor and saves with
    # them; the new spare that takes the lost place now holds none.
    cluster.schedule_and_run()
    ready(cluster, "train-a1-s0", 2)
    cluster.report(0, "ep0-ba150", 150, current=160)
    cluster.step(1)
    del cluster.nodes["node-2"]  # train-a0-r2, rank 1
    cluster.step(1)
    st = cluster.status
    assert st["keptPods"] == ["train-a0-r0", "train-a0-s0", "train-a1-s0"], st
    told = json.loads(cluster.pods["train-a0-s0"]["metadata"]["annotations"][MEMBERSHIP_ANNOTATION])
    assert told["nodeRank"] == 1 and told["epoch"] == 2 and told["savers"] == 2


def test_a_cold_spare_does_not_take_a_place():
    cluster = running()
    cluster.body["spec"]["recovery"] = {"survivors": "Stay", "spares": 1}
    cluster.step(1)
    cluster.schedule_and_run()  # Running, but its agent has not said it is warm
    del cluster.nodes["node-1"]
    plan = cluster.step(1)
    assert cluster.status["keptPods"] == ["train-a0-r0", "train-a0-r2"]
    assert [p["metadata"]["name"] for p in plan.creations] == ["train-a1-r2"]


def test_an_unplaced_spare_yields_to_a_waiting_rank_and_all_go_when_the_job_ends():
    cluster = running()
    cluster.body["spec"]["recovery"] = {"survivors": "Stay", "spares": 1}
    cluster.step(1)  # the spare is created, and no node takes it
    del cluster.nodes["node-1"]
    cluster.step(1)  # the lost rank's new pod waits for a node too
    plan = cluster.step(1)
    assert "train-a0-s0" in {d.name for d in plan.deletions}
    assert "train-a0-s0" not in cluster.pods
    cluster.schedule_and_run()
    cluster.step(1)
    cluster.schedule_and_run()
    ready(cluster, sorted(p for p in cluster.pods if "-s" in p)[0], 2)
    for pod in cluster.current_pods():
        pod["status"] = {
            "phase": "Succeeded",
            "containerStatuses": [
                {"name": "trainer", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
            ],
        }
    plan = cluster.step(1)
    assert cluster.status["phase"] == "Succeeded"
    assert [d.name for d in plan.deletions if "-s" in d.name]
