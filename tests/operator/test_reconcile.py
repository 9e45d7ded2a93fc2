"""The job state machine, driven end to end through the in-memory cluster."""

from __future__ import annotations

import json
from datetime import timedelta

from rtj_operator.api import names
from rtj_operator.api.envvars import NOTICE_ANNOTATION, PROGRESS_ANNOTATION
from rtj_operator.api.status_types import Cause
from rtj_operator.api.timeutil import iso
from rtj_operator.decide.reconcile import reconcile

from .fakes import FakeCluster, make_node, make_pod, progress


def resume_from_the_second_of_two_commits(cluster: FakeCluster) -> None:
    """Two commits, then rank 0's node goes: the next attempt resumes from ep0-ba200."""
    cluster.report(0, "ep0-ba100", 100)
    cluster.step()
    cluster.report(0, "ep0-ba200", 200)
    cluster.step()
    cluster.nodes.pop("node-0")
    cluster.step(1)
    assert cluster.status["resumeCheckpoint"] == "ep0-ba200"


def running(replicas: int = 2, **spec) -> FakeCluster:
    """A job whose first gang is created, scheduled and running."""
    cluster = FakeCluster.start(replicas=replicas, **spec)
    cluster.step()
    cluster.schedule_and_run()
    cluster.step()
    assert cluster.status["phase"] == "Running"
    return cluster


def reasons(plan) -> list[str]:
    return [e.reason for e in plan.events]


def test_first_reconcile_creates_the_gang_and_records_attempt_zero():
    cluster = FakeCluster.start(replicas=3)
    plan = cluster.step()
    assert [p["metadata"]["name"] for p in plan.creations] == [
        "train-a0-r0",
        "train-a0-r1",
        "train-a0-r2",
    ]
    assert [w.kind for w in plan.support] == ["ServiceAccount", "Role", "RoleBinding", "Service"]
    role = next(w.body for w in plan.support if w.kind == "Role")
    assert role["rules"][0]["resourceNames"] == [p["metadata"]["name"] for p in plan.creations]
    st = cluster.status
    assert st["phase"] == "Pending" and st["attempt"] == 0 and st["gangCreated"]
    assert st["runName"] == "train" and st["resumeFrom"] == ""
    assert "Started" in reasons(plan)
    assert cluster.env(0)["RTJ_RESUME_FROM"] == ""


def test_running_when_every_rank_runs_and_steady_state_is_a_no_op():
    cluster = running()
    cond = {c["type"]: c for c in cluster.status["conditions"]}
    assert cond["Running"]["status"] == "True"
    plan = cluster.step(5)
    assert plan.status is None and not plan.creations and not plan.deletions


def test_node_deleted_resubmits_the_whole_gang_at_once_with_the_resume_path():
    cluster = running(replicas=3)
    cluster.report(0, "ep0-ba100", 100, current=130)
    cluster.step()
    del cluster.nodes["node-1"]  # spot reclaim
    plan = cluster.step(1)
    st = cluster.status
    assert st["attempt"] == 1 and st["preemptions"] == 1 and st["failures"] == 0
    assert st["phase"] == "Restarting" and st["gangCreated"]
    assert {d.name for d in plan.deletions} == {"train-a0-r0", "train-a0-r1", "train-a0-r2"}
    assert [p["metadata"]["name"] for p in plan.creations] == [
        "train-a1-r0",
        "train-a1-r1",
        "train-a1-r2",
    ]
    assert plan.resubmission == "preemption" and plan.requeue_after is None
    env = cluster.env(2)
    assert env["RTJ_ATTEMPT"] == "1"
    assert env["RTJ_RESUME_FROM"] == "s3://bucket/ckpt/train/ep0-ba100"
    (event,) = [e for e in plan.events if e.reason == "Preempted"]
    assert "node-1" in event.message and event.type == "Warning"
    (interruption,) = st["interruptions"]
    assert interruption["cause"] == Cause.NODE_DELETED and interruption["rank"] == 1
    assert interruption["preemption"] and interruption["node"] == "node-1"
    assert interruption["lastCommittedStep"] == 100 and interruption["stepsLost"] == 30
    assert st["lastCommittedCheckpoint"]["name"] == "ep0-ba100"
    cluster.schedule_and_run()
    cluster.step()
    assert cluster.status["phase"] == "Running"


def test_status_is_written_before_the_pods_and_the_mark_after():
    cluster = running()
    del cluster.nodes["node-0"]
    plan = reconcile(cluster.job, list(cluster.pods.values()), cluster.node_views(), cluster.now)
    assert plan.status.attempt == 1 and not plan.status.gang_created
    assert plan.after_creation.attempt == 1 and plan.after_creation.gang_created


def test_operator_killed_mid_resubmission_completes_the_same_attempt():
    cluster = running(replicas=4)
    del cluster.nodes["node-2"]
    plan = reconcile(cluster.job, list(cluster.pods.values()), cluster.node_views(), cluster.now)
    cluster.apply(plan, crash_after_creations=2)  # killed after two of four creations
    assert cluster.status["attempt"] == 1 and not cluster.status["gangCreated"]
    again = cluster.step(3)  # the restarted operator
    assert [p["metadata"]["name"] for p in again.creations] == ["train-a1-r2", "train-a1-r3"]
    assert cluster.status["attempt"] == 1 and cluster.status["gangCreated"]
    assert cluster.status["preemptions"] == 1
    assert sorted(p["metadata"]["name"] for p in cluster.current_pods()) == [
        f"train-a1-r{r}" for r in range(4)
    ]
    assert not any(
        p["metadata"]["labels"][names.LABEL_ATTEMPT] == "2" for p in cluster.pods.values()
    )


def test_killed_after_every_creation_but_before_the_mark_creates_nothing_new():
    cluster = running()
    del cluster.nodes["node-0"]
    plan = reconcile(cluster.job, list(cluster.pods.values()), cluster.node_views(), cluster.now)
    plan.after_creation = None
    cluster.apply(plan)
    again = cluster.step(1)
    assert not again.creations and cluster.status["gangCreated"]
    assert cluster.status["attempt"] == 1


def test_eviction_and_disruption_target_are_preemptions():
    cluster = running()
    cluster.pod(0)["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    ]
    cluster.pod(0)["metadata"]["deletionTimestamp"] = "2030-01-01T12:00:00Z"
    cluster.step()
    assert cluster.status["interruptions"][-1]["cause"] == Cause.EVICTED
    assert cluster.status["preemptions"] == 1 and cluster.status["attempt"] == 1


def test_preemptions_never_touch_the_failure_budget():
    cluster = running(resumePolicy={"backoffLimit": 0})
    for attempt in range(1, 6):
        cluster.nodes.pop("node-0")
        cluster.step(1)
        assert cluster.status["attempt"] == attempt
        cluster.schedule_and_run()
        cluster.step()
    assert cluster.status["preemptions"] == 5 and cluster.status["failures"] == 0
    assert cluster.status["phase"] == "Running"


def test_max_preemptions_fails_the_job():
    cluster = running(resumePolicy={"maxPreemptions": 1})
    cluster.nodes.pop("node-0")
    cluster.step(1)
    cluster.schedule_and_run()
    cluster.step()
    cluster.nodes.pop("node-1")
    plan = cluster.step(1)
    st = cluster.status
    assert st["phase"] == "Failed" and st["preemptions"] == 2
    failed = {c["type"]: c for c in st["conditions"]}["Failed"]
    assert failed["reason"] == "PreemptionLimitExceeded"
    assert not plan.creations and "JobFailed" in reasons(plan)


def test_failure_backs_off_exponentially_then_exhausts_the_budget():
    cluster = running(
        resumePolicy={"backoffLimit": 2, "backoffBaseSeconds": 10, "backoffMaxSeconds": 600}
    )
    cluster.terminate(1, 1)
    plan = cluster.step(1)
    st = cluster.status
    assert st["failures"] == 1 and st["attempt"] == 1 and st["phase"] == "Restarting"
    assert not st["gangCreated"] and not plan.creations and plan.requeue_after == 10
    assert "train-a0-r0" in {d.name for d in plan.deletions}  # the surviving rank is stopped
    assert "BackingOff" in reasons(plan) and "RankFailed" in reasons(plan)
    assert not cluster.step(5).creations  # still backing off
    assert len(cluster.step(5).creations) == 2
    cluster.schedule_and_run()
    cluster.step()
    cluster.terminate(0, 137, "OOMKilled")
    plan = cluster.step(1)
    assert cluster.status["failures"] == 2 and plan.requeue_after == 20
    cluster.step(20)
    cluster.schedule_and_run()
    cluster.step()
    cluster.terminate(0, 3)
    plan = cluster.step(1)
    st = cluster.status
    assert st["phase"] == "Failed" and st["failures"] == 3
    failed = {c["type"]: c for c in st["conditions"]}["Failed"]
    assert failed["reason"] == "BackoffLimitExceeded" and "exit code 3" in failed["message"]
    assert st["completionTime"]
    assert cluster.step(100).status is None  # terminal is terminal


def test_quarantine_resumes_from_the_checkpoint_before():
    cluster = running(
        resumePolicy={"backoffLimit": 10, "backoffBaseSeconds": 0, "quarantineThreshold": 2}
    )
    resume_from_the_second_of_two_commits(cluster)
    for expected in (1, 2):
        cluster.schedule_and_run()
        cluster.step()
        cluster.terminate(0, 1)  # crashes soon after resuming, no new commit
        plan = cluster.step(30)
        assert cluster.status["failures"] == expected
    st = cluster.status
    assert st["quarantinedCheckpoints"] == ["ep0-ba200"] and st["quarantined"] == 1
    assert st["resumeCheckpoint"] == "ep0-ba100"
    assert "CheckpointQuarantined" in reasons(plan)
    env = cluster.env(0)
    assert env["RTJ_RESUME_FROM"].endswith("/ep0-ba100")
    assert env["RTJ_QUARANTINED"] == "ep0-ba200"


def test_progress_after_resume_clears_the_quarantine_suspicion():
    cluster = running(resumePolicy={"backoffBaseSeconds": 0, "quarantineThreshold": 2})
    cluster.report(0, "ep0-ba100", 100)
    cluster.step()
    cluster.nodes.pop("node-0")
    cluster.step(1)
    cluster.schedule_and_run()
    cluster.step()
    cluster.terminate(1, 1)
    cluster.step(10)
    assert cluster.status["resumeFailures"]["count"] == 1
    cluster.schedule_and_run()
    cluster.step()
    cluster.report(1, "ep0-ba150", 150)
    cluster.step()
    assert "resumeFailures" not in cluster.status
    assert cluster.status["attemptCheckpoint"] == "ep0-ba150"
    cluster.terminate(1, 1)
    cluster.step(10)
    assert cluster.status["quarantined"] == 0


def test_notice_is_written_once_and_restart_waits_for_the_pod_to_go():
    cluster = running()
    cluster.nodes["node-1"] = make_node(
        "node-1",
        taints=[
            {
                "key": "node.kubernetes.io/out-of-service",
                "effect": "NoExecute",
                "timeAdded": "2030-01-01T12:00:05Z",
            }
        ],
    )
    plan = cluster.step(1)
    (notice,) = plan.notices
    assert notice.pod == "train-a0-r1"
    assert json.loads(notice.payload) == {
        "time": "2030-01-01T12:00:05Z",
        "reason": "node.kubernetes.io/out-of-service",
        "node": "node-1",
    }
    assert cluster.pod(1)["metadata"]["annotations"][NOTICE_ANNOTATION] == notice.payload
    assert cluster.status["attempt"] == 0 and not plan.creations
    cond = {c["type"]: c for c in cluster.status["conditions"]}["PreemptionNotice"]
    assert cond["status"] == "True"
    assert not cluster.step(1).notices  # idempotent
    cluster.nodes.pop("node-1")
    cluster.step(1)
    assert cluster.status["attempt"] == 1 and cluster.status["preemptions"] == 1


def test_a_withdrawn_notice_is_emptied_so_the_next_one_is_new_to_the_runtime():
    """The notice file is empty when there is no notice. A scale-down cancelled after its
    notice left the old notice in place, and a later termination of the same node then sent
    nothing: the rank was 'already told', and the runtime acts only on new content."""
    cluster = running()
    taint = {"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"}
    cluster.nodes["node-1"] = make_node("node-1", taints=[taint])
    (first,) = cluster.step(1).notices
    cluster.nodes["node-1"] = make_node("node-1")  # the scale-down is cancelled
    plan = cluster.step(1)
    assert [(n.pod, n.payload) for n in plan.notices] == [("train-a0-r1", "")]
    assert cluster.pod(1)["metadata"]["annotations"][NOTICE_ANNOTATION] == ""
    cond = {c["type"]: c for c in cluster.status["conditions"]}["PreemptionNotice"]
    assert cond["status"] == "False"
    assert not cluster.step(1).notices  # emptied once
    cluster.nodes["node-1"] = make_node("node-1", taints=[taint])  # now it really goes
    (second,) = cluster.step(5).notices
    assert second.pod == "train-a0-r1" and second.payload and second.payload != first.payload
    assert cluster.status["attempt"] == 0


def test_not_ready_node_requeues_until_the_grace_expires():
    cluster = running(preemptionSignals={"nodeNotReadySeconds": 30})
    cluster.nodes["node-0"] = make_node("node-0", ready="False", since=cluster.now)
    plan = cluster.step(10)
    # The whole-second lastTransitionTime is read as one second later (never end early).
    assert plan.requeue_after == 21 and cluster.status["attempt"] == 0
    cluster.step(22)
    assert cluster.status["attempt"] == 1
    assert cluster.status["interruptions"][-1]["cause"] == Cause.NODE_NOT_READY


def test_success_when_every_rank_exits_zero():
    cluster = running()
    cluster.terminate(0, 0, "Completed", message='{"checkpoint": "final", "step": 900}')
    assert cluster.step().status is None or cluster.status["phase"] != "Succeeded"
    cluster.terminate(1, 0, "Completed")
    plan = cluster.step()
    st = cluster.status
    assert st["phase"] == "Succeeded" and st["completionTime"]
    assert st["lastCommittedCheckpoint"]["step"] == 900
    assert "Succeeded" in reasons(plan) and not plan.deletions


def test_suspend_deletes_the_gang_keeps_state_and_resume_starts_the_next_attempt():
    cluster = running()
    cluster.report(0, "ep0-ba50", 50)
    cluster.step()
    cluster.body["spec"]["suspend"] = True
    plan = cluster.step(1)
    assert {d.name for d in plan.deletions} == {"train-a0-r0", "train-a0-r1"}
    st = cluster.status
    assert st["phase"] == "Suspended" and st["attempt"] == 0
    assert st["interruptions"][-1]["cause"] == Cause.SUSPENDED
    assert st["preemptions"] == 0 and st["failures"] == 0
    assert cluster.step(60).status is None and not cluster.pods
    cluster.body["spec"]["suspend"] = False
    plan = cluster.step(1)
    st = cluster.status
    assert st["attempt"] == 1 and st["phase"] == "Restarting" and len(plan.creations) == 2
    assert plan.resubmission == "resume"
    assert cluster.env(0)["RTJ_RESUME_FROM"].endswith("/ep0-ba50")


def test_resuming_a_gang_suspended_mid_creation_never_counts_a_preemption():
    """Suspended while only part of the gang exists (the rest refused by a full quota, say) and
    resumed while those pods still terminate: the next attempt gets new names. Reusing the
    attempt took the terminating pod for the new gang's rank and ended it as PodDeleted."""
    cluster = FakeCluster.start(replicas=2)
    cluster.apply(reconcile_once(cluster), crash_after_creations=1)
    assert set(cluster.pods) == {"train-a0-r0"} and not cluster.status.get("gangCreated")
    cluster.body["spec"]["suspend"] = True
    cluster.step(1)
    assert cluster.status["phase"] == "Suspended"
    terminating = make_pod(rank=0, phase="Running", deleting=True)  # its grace period runs
    cluster.pods["train-a0-r0"] = terminating
    cluster.body["spec"]["suspend"] = False
    plan = cluster.step(1)
    assert [p["metadata"]["name"] for p in plan.creations] == ["train-a1-r0", "train-a1-r1"]
    cluster.schedule_and_run()
    cluster.step(1)
    st = cluster.status
    assert st["attempt"] == 1 and st["preemptions"] == 0 and st["failures"] == 0, st
    assert [i["cause"] for i in st.get("interruptions", [])] == []


def reconcile_once(cluster):
    return reconcile(cluster.job, list(cluster.pods.values()), cluster.node_views(), cluster.now)


def test_suspended_from_the_start_creates_nothing_until_resumed():
    cluster = FakeCluster.start(suspend=True)
    plan = cluster.step()
    assert not plan.creations and cluster.status["phase"] == "Suspended"
    cluster.body["spec"]["suspend"] = False
    plan = cluster.step()
    assert cluster.status["attempt"] == 0 and len(plan.creations) == 2


def _trainer_done_sidecar_running(cluster: FakeCluster, rank: int) -> None:
    """The training container exited 0; a regular sidecar container keeps the pod Running."""
    pod = cluster.pod(rank)
    pod["spec"]["containers"].append({"name": "log-shipper"})
    pod["status"]["containerStatuses"] = [
        {"name": "trainer", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
        {"name": "log-shipper", "state": {"running": {}}},
    ]
    pod["status"]["phase"] = "Running"


def test_success_deletes_the_pods_a_regular_sidecar_keeps_running():
    """A rank is done when its training container exits 0, whatever its other containers do;
    once the job Succeeded, a pod a sidecar still keeps Running (holding its node) is deleted,
    while a pod that ended is kept for its logs."""
    cluster = running(replicas=3)
    _trainer_done_sidecar_running(cluster, 0)
    _trainer_done_sidecar_running(cluster, 1)
    plan = cluster.step()
    assert cluster.status["phase"] == "Running" and not plan.deletions
    cluster.terminate(2, 0, "Completed")
    plan = cluster.step()
    assert cluster.status["phase"] == "Succeeded"
    assert sorted(d.name for d in plan.deletions) == ["train-a0-r0", "train-a0-r1"]
    assert {d.reason for d in plan.deletions} == {"job ended"}
    assert sorted(cluster.pods) == ["train-a0-r2"]
    assert cluster.step(5).deletions == []


def test_success_deletes_a_sidecar_pod_found_after_the_job_ended():
    """A Succeeded job whose pod still runs (an operator that marked it Succeeded without
    deleting that pod, before an upgrade) frees the node on its next pass."""
    cluster = running(replicas=2)
    cluster.terminate(0, 0, "Completed")
    cluster.terminate(1, 0, "Completed")
    cluster.step()
    assert cluster.status["phase"] == "Succeeded"
    _trainer_done_sidecar_running(cluster, 1)  # as if the pod still ran
    plan = cluster.step()
    assert [d.name for d in plan.deletions] == ["train-a0-r1"]


def test_native_sidecars_end_with_the_pod_and_the_pods_are_kept():
    """Native sidecars (init containers with restartPolicy Always) stop when the training
    container exits, so the pod ends Succeeded: kept for its logs, nothing deleted."""
    cluster = running(replicas=2)
    for rank in range(2):
        cluster.pod(rank)["spec"]["initContainers"] = [{"name": "proxy", "restartPolicy": "Always"}]
        cluster.terminate(rank, 0, "Completed")
        cluster.pod(rank)["status"]["initContainerStatuses"] = [
            {"name": "proxy", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
        ]
    plan = cluster.step()
    assert cluster.status["phase"] == "Succeeded" and not plan.deletions
    assert len(cluster.pods) == 2


def test_created_suspended_says_suspended_not_created():
    """A job created with suspend: true never ran: its Running condition says why (Suspended),
    not the reason of a first gang being created."""
    cluster = FakeCluster.start(suspend=True)
    cluster.step()
    cond = {c["type"]: c for c in cluster.status["conditions"]}
    assert cond["Running"]["status"] == "False" and cond["Running"]["reason"] == "Suspended"
    assert cond["Suspended"]["status"] == "True" and cond["Suspended"]["reason"] == "Suspended"
    assert "Created" not in {c["reason"] for c in cluster.status["conditions"]}
    cluster.body["spec"]["suspend"] = False
    cluster.step()
    cond = {c["type"]: c for c in cluster.status["conditions"]}
    assert cond["Suspended"]["status"] == "False" and cond["Running"]["status"] == "False"
    assert cluster.status["phase"] == "Pending"
    # Why no rank runs now: the resume, not the suspend that is over.
    assert cond["Running"]["reason"] == cond["Suspended"]["reason"] == "Resumed"


def test_pods_of_another_incarnation_are_never_touched():
    """A rank's pod that turns out to be another incarnation's once the gang counts as created
    is not ours: never deleted; the job moves past it to a fresh attempt (new names) instead of
    adopting it. (Before creation such a name blocks the job: test_support.py.)"""
    cluster = FakeCluster.start()
    cluster.step()
    cluster.pod(0)["metadata"]["ownerReferences"][0]["uid"] = "previous-incarnation"
    plan = cluster.step()
    assert "train-a0-r0" not in {d.name for d in plan.deletions}
    assert cluster.status["attempt"] == 1
    assert cluster.status["interruptions"][-1]["cause"] == Cause.POD_REMOVED


def test_old_attempt_pods_are_cleaned_up_but_recent_failures_kept_for_logs():
    cluster = running(resumePolicy={"backoffBaseSeconds": 0, "backoffLimit": 10})
    for _ in range(4):
        cluster.terminate(0, 1)
        cluster.pod(1)["status"]["phase"] = "Failed"
        cluster.step(1)
        cluster.schedule_and_run()
        cluster.step()
    attempts = {p["metadata"]["labels"][names.LABEL_ATTEMPT] for p in cluster.pods.values()}
    # Ended pods are not deleted by the fake until the plan says so; attempts < 4-2 are gone.
    assert attempts <= {"2", "3", "4"}


def test_deleting_job_plans_nothing():
    cluster = running()
    cluster.body["metadata"]["deletionTimestamp"] = "2030-01-01T12:00:00Z"
    del cluster.nodes["node-0"]
    plan = cluster.step()
    assert plan.status is None and not plan.creations and not plan.deletions


def test_a_pod_removed_before_it_was_seen_is_classified_from_its_last_state():
    cluster = running()
    last = cluster.pods.pop("train-a0-r0")  # evicted and deleted within milliseconds
    last["status"]["conditions"] = [
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    ]
    plan = reconcile(
        cluster.job,
        list(cluster.pods.values()),
        cluster.node_views(),
        cluster.now,
        departed={"train-a0-r0": last},
    )
    assert plan.interruption.cause == Cause.EVICTED
    plan = reconcile(cluster.job, list(cluster.pods.values()), cluster.node_views(), cluster.now)
    assert plan.interruption.cause == Cause.POD_REMOVED


def test_an_epoch_end_save_at_the_step_of_the_save_before_it_is_the_newest():
    """The last batch's save and the epoch-end save after it share a step: ``ep7-ba96`` and
    ``ep8-ba96``. The status kept the first; the second is the newer checkpoint."""
    cluster = running()
    cluster.report(0, "ep7-ba96", 96)
    cluster.step(1)
    annotation = json.loads(cluster.pod(0)["metadata"]["annotations"][PROGRESS_ANNOTATION])
    annotation.update(checkpoint="ep8-ba96", epoch=8, uri="s3://bucket/ckpt/train/ep8-ba96")
    cluster.pod(0)["metadata"]["annotations"][PROGRESS_ANNOTATION] = json.dumps(annotation)
    cluster.step(1)
    st = cluster.status
    assert st["lastCommittedCheckpoint"]["name"] == "ep8-ba96", st["lastCommittedCheckpoint"]
    assert [k["name"] for k in st["knownCheckpoints"]][:2] == ["ep8-ba96", "ep7-ba96"]


def test_suspended_job_shows_no_gang_size_or_mechanism_and_resume_chooses_them_again():
    """``kubectl get rtj`` showed Size 2 for a Suspended job whose gang was deleted."""
    cluster = running()
    assert cluster.status["gangSize"] == 2 and cluster.status["gangScheduling"] == "Operator"
    cluster.body["spec"]["suspend"] = True
    cluster.step(1)
    st = cluster.status
    assert st["phase"] == "Suspended"
    assert "gangSize" not in st and "worldSize" not in st and "gangScheduling" not in st, st
    cluster.body["spec"]["suspend"] = False
    plan = cluster.step(1)
    st = cluster.status
    assert len(plan.creations) == 2 and st["gangSize"] == 2 and st["worldSize"] == 2
    assert st["gangScheduling"] == "Operator"


def failed_into_backoff() -> FakeCluster:
    """A running job whose rank 1 failed: attempt 1 backs off for 30 s."""
    cluster = running(resumePolicy={"backoffBaseSeconds": 30})
    cluster.terminate(1, 1)
    cluster.step(1)
    st = cluster.status
    assert st["phase"] == "Restarting" and st["attempt"] == 1 and st["restartAfter"], st
    return cluster


def test_gang_scheduling_is_absent_during_a_failure_backoff():
    """It said the ended attempt's mechanism (set when its pods were created) while the next
    attempt, which chooses its own, backed off."""
    cluster = failed_into_backoff()
    assert "gangScheduling" not in cluster.status and "gangSize" not in cluster.status
    plan = cluster.step(30)
    assert len(plan.creations) == 2 and cluster.status["gangScheduling"] == "Operator"


def test_suspend_during_a_failure_backoff_says_no_gang_exists():
    """The Suspended event said "deleting the gang" while no pod of the attempt existed."""
    cluster = failed_into_backoff()
    restart_after = cluster.status["restartAfter"]
    cluster.body["spec"]["suspend"] = True
    plan = cluster.step(1)
    event = next(e for e in plan.events if e.reason == "Suspended")
    assert "deleting" not in event.message, event.message
    assert "no gang exists" in event.message and "backing off" in event.message
    suspended = next(c for c in cluster.status["conditions"] if c["type"] == "Suspended")
    assert "no gang exists" in suspended["message"] and "deleting" not in suspended["message"]
    assert cluster.status["restartAfter"] == restart_after


def test_suspend_of_a_running_gang_says_it_deletes_it():
    cluster = running()
    cluster.body["spec"]["suspend"] = True
    plan = cluster.step(1)
    event = next(e for e in plan.events if e.reason == "Suspended")
    assert event.message == "attempt 0: deleting the gang" and len(plan.deletions) == 2


def test_a_checkpoint_committed_during_a_failure_backoff_is_the_next_attempts_resume_point():
    """RTJ_RESUME_FROM is the newest committed checkpoint the operator knows of. The resume
    point was fixed when the failure was counted, so the emergency save the surviving rank
    committed during the backoff was known but not named, and status.resumeCheckpoint (what
    quarantine blames) named the older checkpoint, while the runtime loaded the newer one."""
    cluster = running(resumePolicy={"backoffBaseSeconds": 30})
    cluster.report(0, "ep0-ba100", 100)
    cluster.step()
    survivor = cluster.pod(0)
    cluster.terminate(1, 1)
    plan = cluster.step(1)
    assert cluster.status["resumeCheckpoint"] == "ep0-ba100" and not plan.creations
    # The surviving rank saves on its SIGTERM and reports it while it terminates.
    survivor["metadata"]["deletionTimestamp"] = "2030-01-01T12:00:02Z"
    survivor["metadata"]["annotations"][PROGRESS_ANNOTATION] = progress("ep0-ba130", 130)
    cluster.pods[survivor["metadata"]["name"]] = survivor
    assert not cluster.step(5).creations
    assert cluster.status["lastCommittedCheckpoint"]["name"] == "ep0-ba130"
    plan = cluster.step(25)
    assert len(plan.creations) == 2
    assert cluster.status["resumeCheckpoint"] == "ep0-ba130"
    assert cluster.status["resumeFrom"] == "s3://bucket/ckpt/train/ep0-ba130"
    assert cluster.env(0)["RTJ_RESUME_FROM"] == "s3://bucket/ckpt/train/ep0-ba130"


def test_quarantine_counts_a_failure_by_when_it_happened_not_when_its_wait_ended():
    """quarantineWindowSeconds: a failure counts when it *happens* within the window of the
    attempt's start. With failureSettleSeconds the failure is counted only after the wait, and
    that later time was checked against the window: crashes 30 s into each attempt, counted
    90 s later, never quarantined the checkpoint they resumed from."""
    cluster = running(
        resumePolicy={
            "backoffBaseSeconds": 0,
            "quarantineThreshold": 2,
            "quarantineWindowSeconds": 60,
        },
        preemptionSignals={"failureSettleSeconds": 90},
    )
    resume_from_the_second_of_two_commits(cluster)
    for expected in (1, 2):
        cluster.schedule_and_run()
        cluster.step()
        started = cluster.now
        cluster.step(30)
        cluster.terminate(1, 1)  # crashes 30 s in; rank 0 still runs
        ended = cluster.pod(1)["status"]["containerStatuses"][0]["state"]["terminated"]
        ended["finishedAt"] = iso(started + timedelta(seconds=30))
        cluster.step(1)
        assert cluster.status["failures"] == expected - 1  # the settle wait
        cluster.step(90)
        assert cluster.status["failures"] == expected
    st = cluster.status
    assert st["quarantinedCheckpoints"] == ["ep0-ba200"]
    assert st["resumeCheckpoint"] == "ep0-ba100"
