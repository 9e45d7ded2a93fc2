"""docs/operator.md's classification, row by row: each pod ending, and the gang's verdict."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from rtj_operator.api.spec_types import DEFAULT_TERMINATION_TAINTS
from rtj_operator.api.status_types import Cause
from rtj_operator.api.timeutil import iso
from rtj_operator.decide.classify import Outcome, RankOutcome, Signals, classify_rank, gang_verdict
from rtj_operator.decide.nodes import node_view, with_lease

from .fakes import T0, make_node, make_pod

SIGNALS = Signals(termination_taints=DEFAULT_TERMINATION_TAINTS, node_not_ready_seconds=60)
READY = node_view("node-0", make_node())


def classify(pod, node=READY, now=T0):
    return classify_rank(0, pod, node, signals=SIGNALS, now=now, expected_pod="train-a0-r0")


def disruption(reason: str) -> dict:
    return {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": "m"}


def test_running_pod_on_a_ready_node_is_active():
    out = classify(make_pod())
    assert out.outcome is Outcome.ACTIVE and out.running and out.notice is None


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ("PreemptionByScheduler", Cause.SCHEDULER_PREEMPTION),
        ("DeletionByTaintManager", Cause.TAINT_EVICTION),
        ("EvictionByEvictionAPI", Cause.EVICTED),
        ("DeletionByPodGC", Cause.POD_GC),
        ("TerminationByKubelet", Cause.NODE_SHUTDOWN),
        ("SomethingNew", Cause.DISRUPTION),
    ],
)
def test_disruption_target_is_a_preemption_whatever_the_exit_code(reason, cause):
    pod = make_pod(phase="Failed", exit_code=137, conditions=[disruption(reason)])
    out = classify(pod)
    assert out.outcome is Outcome.PREEMPTED and out.cause is cause
    assert out.exit_code == 137


def test_false_disruption_condition_is_ignored():
    cond = {**disruption("EvictionByEvictionAPI"), "status": "False"}
    assert classify(make_pod(conditions=[cond])).outcome is Outcome.ACTIVE


def test_deleted_node_is_a_preemption_even_while_the_pod_says_running():
    out = classify(make_pod(), node=node_view("node-0", None))
    assert out.outcome is Outcome.PREEMPTED and out.cause is Cause.NODE_DELETED
    assert "node-0 was deleted" in out.message


def test_node_being_deleted_is_a_preemption():
    out = classify(make_pod(), node=node_view("node-0", make_node(deleting=True)))
    assert out.cause is Cause.NODE_DELETED


def test_not_ready_node_waits_for_the_grace_period_then_preempts():
    node = node_view("node-0", make_node(ready="False", since=T0))
    early = classify(make_pod(), node=node, now=T0 + timedelta(seconds=20))
    assert early.outcome is Outcome.ACTIVE
    # lastTransitionTime has whole seconds: the grace period counts from one second later.
    assert early.recheck_after == pytest.approx(41)
    assert early.node_trouble is Cause.NODE_NOT_READY
    edge = classify(make_pod(), node=node, now=T0 + timedelta(seconds=60.5))
    assert edge.outcome is Outcome.ACTIVE, "never before the grace period has surely passed"
    late = classify(make_pod(), node=node, now=T0 + timedelta(seconds=61))
    assert late.outcome is Outcome.PREEMPTED and late.cause is Cause.NODE_NOT_READY


REPORTED = dataclasses.replace(SIGNALS, peer_lost_ranks=frozenset({0}))


def lease(renewed_ago: float, *, seen_ago: float, duration: int = 40):
    """A Lease (``kube-node-lease``) renewed ``renewed_ago`` s before T0, first read by the
    operator ``seen_ago`` s before T0."""
    body = {
        "spec": {
            "renewTime": iso(T0 - timedelta(seconds=renewed_ago)),
            "leaseDurationSeconds": duration,
        }
    }
    return body, T0 - timedelta(seconds=seen_ago)


def test_a_silent_node_is_lost_at_once_when_a_peer_reported_the_failed_collective():
    body, seen = lease(21, seen_ago=12)
    node = with_lease(node_view("node-0", make_node()), body, seen)
    out = classify_rank(0, make_pod(), node, signals=REPORTED, now=T0)
    assert out.outcome is Outcome.PREEMPTED and out.cause is Cause.NODE_SILENT, out
    assert "silent for 21s" in out.message
    # Without the peers' report the node stays Ready and its rank active: a Lease alone is no loss.
    alone = classify_rank(0, make_pod(), node, signals=SIGNALS, now=T0)
    assert alone.outcome is Outcome.ACTIVE and alone.recheck_after is None


@pytest.mark.parametrize(
    ("renewed_ago", "seen_ago", "left"),
    [
        (5, 5, 15),  # renewed 5 s ago: half the duration (20 s) not reached
        (30, 2, 8),  # looks old by the kubelet's clock, but the operator read it 2 s ago
    ],
)
def test_a_node_whose_lease_may_still_be_renewed_is_waited_for(renewed_ago, seen_ago, left):
    body, seen = lease(renewed_ago, seen_ago=seen_ago)
    node = with_lease(node_view("node-0", make_node()), body, seen)
    out = classify_rank(0, make_pod(), node, signals=REPORTED, now=T0)
    assert out.outcome is Outcome.ACTIVE and out.recheck_after == pytest.approx(left)


def test_a_silent_node_already_not_ready_is_lost_before_its_grace_period():
    body, seen = lease(25, seen_ago=25)
    not_ready = node_view("node-0", make_node(ready="Unknown", since=T0 - timedelta(seconds=5)))
    out = classify_rank(0, make_pod(), with_lease(not_ready, body, seen), signals=REPORTED, now=T0)
    assert out.cause is Cause.NODE_SILENT
    fresh_body, fresh_seen = lease(1, seen_ago=1)
    waiting = classify_rank(
        0, make_pod(), with_lease(not_ready, fresh_body, fresh_seen), signals=REPORTED, now=T0
    )
    assert waiting.outcome is Outcome.ACTIVE
    assert waiting.recheck_after == pytest.approx(19), "the Lease's check comes before the grace's"


def test_a_node_without_a_lease_keeps_the_not_ready_rules():
    node = with_lease(node_view("node-0", make_node()), None, T0)
    out = classify_rank(0, make_pod(), node, signals=REPORTED, now=T0 + timedelta(minutes=5))
    assert out.outcome is Outcome.ACTIVE and out.recheck_after is None


def test_unknown_readiness_counts_as_not_ready():
    node = node_view("node-0", make_node(ready="Unknown", since=T0))
    out = classify(make_pod(), node=node, now=T0 + timedelta(minutes=5))
    assert out.cause is Cause.NODE_NOT_READY and "Unknown" in out.message


@pytest.mark.parametrize(
    ("status_reason", "cause"),
    [
        ("Evicted", Cause.EVICTED),
        ("Terminated", Cause.NODE_SHUTDOWN),
        ("Shutdown", Cause.NODE_SHUTDOWN),
    ],
)
def test_kubelet_endings_are_preemptions(status_reason, cause):
    pod = make_pod(phase="Failed", exit_code=143, status_reason=status_reason)
    assert classify(pod).cause is cause


def test_kubelet_admission_rejection_is_not_the_codes_fault():
    pod = make_pod(phase="Failed", status_reason="OutOfnvidia.com/gpu")
    pod["status"]["containerStatuses"] = []
    out = classify(pod)
    assert out.outcome is Outcome.PREEMPTED and out.cause is Cause.KUBELET_REJECTED


def test_pod_deleted_by_someone_else_is_a_preemption():
    out = classify(make_pod(deleting=True))
    assert out.outcome is Outcome.PREEMPTED and out.cause is Cause.POD_DELETED


def test_vanished_pod_is_a_preemption():
    out = classify(None, node=None)
    assert out.outcome is Outcome.PREEMPTED and out.cause is Cause.POD_REMOVED
    assert out.pod == "train-a0-r0"


@pytest.mark.parametrize(("exit_code", "reason"), [(1, "Error"), (137, "OOMKilled")])
def test_nonzero_exit_without_disruption_is_a_failure(exit_code, reason):
    out = classify(make_pod(phase="Failed", exit_code=exit_code, reason=reason))
    assert out.outcome is Outcome.FAILED and out.cause is Cause.FAILURE
    assert out.exit_code == exit_code and reason in out.message


def test_training_exit_zero_is_a_success_even_when_a_sidecar_fails_the_pod():
    """The table's first row: the training container exited 0 is a success. A sidecar that
    exits 1 on shutdown leaves the pod Failed; that used to count a failure and retry (and at
    backoffLimit fail) a finished training."""
    pod = make_pod(phase="Failed", exit_code=0, reason="Completed")
    pod["status"]["containerStatuses"].append(
        {"name": "log-shipper", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}
    )
    assert classify(pod).outcome is Outcome.SUCCEEDED


def test_a_failed_init_container_is_named_instead_of_exit_code_none():
    pod = make_pod(phase="Failed")
    pod["status"]["containerStatuses"] = [
        {"name": "trainer", "state": {"waiting": {"reason": "PodInitializing"}}}
    ]
    pod["status"]["initContainerStatuses"] = [
        {"name": "fetch-data", "state": {"terminated": {"exitCode": 2, "reason": "Error"}}}
    ]
    out = classify(pod)
    assert out.outcome is Outcome.FAILED and out.cause is Cause.FAILURE
    assert out.exit_code is None
    assert out.message == "init container fetch-data exited 2 (Error)"


def test_failure_while_the_node_is_announced_for_termination_is_a_preemption():
    taint = {"key": "aws-node-termination-handler/spot-itn", "effect": "NoSchedule"}
    node = node_view("node-0", make_node(taints=[taint]))
    out = classify(make_pod(phase="Failed", exit_code=143), node=node)
    assert out.outcome is Outcome.PREEMPTED and out.cause is Cause.TERMINATION_NOTICE


def test_success_is_final_even_if_the_node_is_gone_afterwards():
    pod = make_pod(phase="Succeeded", exit_code=0, reason="Completed")
    assert classify(pod, node=node_view("node-0", None)).outcome is Outcome.SUCCEEDED


def test_training_container_exit_zero_is_success_while_sidecars_linger():
    pod = make_pod(phase="Running", exit_code=0)
    assert classify(pod).outcome is Outcome.SUCCEEDED


def test_termination_taint_gives_a_notice_but_no_ending():
    taint = {"key": "ToBeDeletedByClusterAutoscaler", "value": "123", "effect": "NoSchedule"}
    out = classify(make_pod(), node=node_view("node-0", make_node(taints=[taint])))
    assert out.outcome is Outcome.ACTIVE
    assert out.notice == taint and out.node_trouble is Cause.TERMINATION_NOTICE


def test_unrelated_taint_is_no_notice():
    taint = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
    out = classify(make_pod(), node=node_view("node-0", make_node(taints=[taint])))
    assert out.notice is None and out.node_trouble is None


def test_configured_training_container_decides():
    pod = make_pod(phase="Running")
    pod["spec"]["containers"] = [{"name": "sidecar"}, {"name": "trainer"}]
    pod["status"]["containerStatuses"] = [
        {"name": "sidecar", "state": {"running": {}}},
        {"name": "trainer", "state": {"terminated": {"exitCode": 2}}},
    ]
    signals = Signals(DEFAULT_TERMINATION_TAINTS, 60, container_name="trainer")
    out = classify_rank(0, pod, READY, signals=signals, now=T0)
    assert out.outcome is Outcome.FAILED and out.exit_code == 2


def _o(rank, outcome, **kw):
    return RankOutcome(rank, outcome, pod=f"p{rank}", node=f"n{rank}", **kw)


def test_gang_preemption_wins_over_failures_of_other_ranks():
    verdict = gang_verdict(
        [
            _o(0, Outcome.FAILED, cause=Cause.FAILURE, exit_code=1),
            _o(1, Outcome.PREEMPTED, cause=Cause.NODE_DELETED),
        ]
    )
    assert verdict.outcome is Outcome.PREEMPTED and verdict.trigger.rank == 1


def test_gang_failure_with_a_troubled_node_elsewhere_is_a_preemption():
    verdict = gang_verdict(
        [
            _o(0, Outcome.FAILED, cause=Cause.FAILURE, exit_code=1, message="exit code 1"),
            _o(1, Outcome.ACTIVE, node_trouble=Cause.NODE_NOT_READY),
        ]
    )
    assert verdict.outcome is Outcome.PREEMPTED
    assert verdict.trigger.cause is Cause.NODE_NOT_READY and verdict.trigger.rank == 0


def test_gang_plain_failure():
    verdict = gang_verdict([_o(0, Outcome.FAILED, cause=Cause.FAILURE), _o(1, Outcome.ACTIVE)])
    assert verdict.outcome is Outcome.FAILED and verdict.trigger.rank == 0


def test_a_failed_gang_is_described_by_the_rank_that_ended_first():
    def failed(rank, after=None):
        ended = None if after is None else T0 + timedelta(seconds=after)
        return _o(rank, Outcome.FAILED, cause=Cause.FAILURE, finished_at=ended)

    assert gang_verdict([failed(0, 2), failed(1, 1), failed(2, 3)]).trigger.rank == 1
    assert gang_verdict([failed(0, 1), failed(1, 1)]).trigger.rank == 0  # same second
    assert gang_verdict([failed(0), failed(1, 5)]).trigger.rank == 1  # no time: last
    assert gang_verdict([failed(0), failed(1)]).trigger.rank == 0


def test_the_training_containers_own_exit_is_told_apart_from_the_kubelets_kill():
    """What exit code rules may match: the container's own exit, with its reason."""
    out = classify(make_pod(phase="Failed", exit_code=137, reason="OOMKilled"))
    assert (out.exit_code, out.exit_reason, out.own_exit) == (137, "OOMKilled", True)
    past_deadline = make_pod(phase="Failed", exit_code=137, status_reason="DeadlineExceeded")
    out = classify(past_deadline)
    assert out.outcome is Outcome.FAILED and not out.own_exit
    before_the_container_ended = make_pod(phase="Failed")
    out = classify(before_the_container_ended)
    assert out.outcome is Outcome.FAILED and not out.own_exit


def test_gang_success_needs_every_rank():
    assert (
        gang_verdict([_o(0, Outcome.SUCCEEDED), _o(1, Outcome.ACTIVE, running=True)]).outcome
        is Outcome.ACTIVE
    )
    assert (
        gang_verdict([_o(0, Outcome.SUCCEEDED), _o(1, Outcome.SUCCEEDED)]).outcome
        is Outcome.SUCCEEDED
    )


def test_gang_all_running_and_earliest_recheck():
    verdict = gang_verdict(
        [
            _o(0, Outcome.ACTIVE, running=True, recheck_after=30.0),
            _o(1, Outcome.ACTIVE, running=True, recheck_after=5.0),
        ]
    )
    assert verdict.all_running and verdict.recheck_after == 5.0
    assert not gang_verdict(
        [_o(0, Outcome.ACTIVE, running=True), _o(1, Outcome.ACTIVE)]
    ).all_running


def test_a_failure_while_others_run_settles_before_it_counts():
    """failureSettleSeconds: a rank that crashed because its peer's node died silently is
    not a failure once that node turns NotReady; without node trouble it is, after the wait."""
    crashed = _o(0, Outcome.FAILED, cause=Cause.FAILURE, exit_code=1, finished_at=T0)
    running = _o(1, Outcome.ACTIVE, running=True)
    at = T0 + timedelta(seconds=10)
    waiting = gang_verdict([crashed, running], settle_seconds=90, now=at)
    assert waiting.outcome is Outcome.ACTIVE and waiting.recheck_after == pytest.approx(80)
    assert not waiting.all_running
    # The peer's node turned NotReady meanwhile: a preemption, not a failure.
    troubled = _o(1, Outcome.ACTIVE, running=True, node_trouble=Cause.NODE_NOT_READY)
    verdict = gang_verdict([crashed, troubled], settle_seconds=90, now=at)
    assert verdict.outcome is Outcome.PREEMPTED and verdict.trigger.cause is Cause.NODE_NOT_READY
    # Nothing happened to the peer within the wait: the failure counts.
    late = gang_verdict([crashed, running], settle_seconds=90, now=T0 + timedelta(seconds=91))
    assert late.outcome is Outcome.FAILED and late.trigger.rank == 0
    # The peer ended too (both crashed, as after a bug): no wait.
    ended = _o(1, Outcome.FAILED, cause=Cause.FAILURE, exit_code=1, finished_at=T0)
    assert gang_verdict([crashed, ended], settle_seconds=90, now=at).outcome is Outcome.FAILED
    # Off (the default) or without an exit time: at once.
    assert gang_verdict([crashed, running], now=at).outcome is Outcome.FAILED
    no_time = _o(0, Outcome.FAILED, cause=Cause.FAILURE, exit_code=1)
    assert gang_verdict([no_time, running], settle_seconds=90, now=at).outcome is Outcome.FAILED


def test_a_failure_of_ranks_that_reported_a_lost_peer_waits_for_the_lease_check():
    """Without failureSettleSeconds: ranks that ended on a failed collective said so on their
    pods; while the Lease of a running rank's node is being checked (rule 7) the failure waits,
    and the silent node makes it a preemption. A rank that ended on its own error reported
    nothing: its failure counts at once."""
    crashed = _o(0, Outcome.FAILED, cause=Cause.FAILURE, exit_code=1, finished_at=T0)
    body, seen = lease(5, seen_ago=5)
    node = with_lease(node_view("node-1", make_node(name="node-1")), body, seen)
    checked = classify_rank(1, make_pod(), node, signals=REPORTED, now=T0)
    assert checked.outcome is Outcome.ACTIVE and checked.lease_check_s == pytest.approx(30)
    at = T0 + timedelta(seconds=5)
    waiting = gang_verdict([crashed, checked], now=at, reporters=frozenset({0}))
    assert waiting.outcome is Outcome.ACTIVE, waiting
    assert waiting.recheck_after == pytest.approx(15), "the Lease's own recheck comes first"
    # The Lease was renewed all along: the failure counts once the check's longest wait passed.
    after = T0 + timedelta(seconds=31)
    late = gang_verdict([crashed, checked], now=after, reporters=frozenset({0}))
    assert late.outcome is Outcome.FAILED and late.trigger.rank == 0
    # The failed rank reported nothing (its own error): no wait, whatever the others do.
    assert gang_verdict([crashed, checked], now=at).outcome is Outcome.FAILED
    # The running rank's node fell silent: a preemption, not a failure.
    silent_body, silent_seen = lease(21, seen_ago=12)
    silent = with_lease(node_view("node-1", make_node(name="node-1")), silent_body, silent_seen)
    lost = classify_rank(1, make_pod(), silent, signals=REPORTED, now=T0 + timedelta(seconds=1))
    verdict = gang_verdict([crashed, lost], now=at, reporters=frozenset({0}))
    assert verdict.outcome is Outcome.PREEMPTED and verdict.trigger.cause is Cause.NODE_SILENT


def test_classify_records_when_the_training_container_ended():
    pod = make_pod(phase="Running")
    pod["status"]["containerStatuses"] = [
        {
            "name": "trainer",
            "state": {"terminated": {"exitCode": 3, "finishedAt": "2030-01-01T12:00:07Z"}},
        }
    ]
    signals = Signals(DEFAULT_TERMINATION_TAINTS, 60, container_name="trainer")
    out = classify_rank(0, pod, READY, signals=signals, now=T0)
    assert out.outcome is Outcome.FAILED and out.finished_at == T0 + timedelta(seconds=7)


@pytest.mark.parametrize(
    ("pod_reason", "cause"),
    [
        ("Evicted", Cause.EVICTED),  # node pressure (memory, disk)
        ("Preempting", Cause.EVICTED),  # a critical pod's admission
        ("Terminated", Cause.NODE_SHUTDOWN),  # graceful node shutdown
        (None, Cause.NODE_SHUTDOWN),
    ],
)
def test_the_kubelets_disruption_is_told_apart_by_the_pods_reason(pod_reason, cause):
    """The kubelet marks every pod it ends DisruptionTarget TerminationByKubelet: a memory
    pressure eviction was recorded as NodeShutdown."""
    pod = make_pod(
        phase="Failed",
        exit_code=137,
        conditions=[disruption("TerminationByKubelet")],
        status_reason=pod_reason,
    )
    out = classify(pod)
    assert out.outcome is Outcome.PREEMPTED and out.cause is cause


def test_a_pod_the_kubelet_fails_after_its_container_ran_is_not_an_admission_rejection():
    """The pod's own activeDeadlineSeconds: the kubelet marks it Failed (DeadlineExceeded)
    before its container is reported terminated. That was KubeletRejected, a preemption, so
    every attempt hit the same deadline and was resubmitted at once, with no budget."""
    pod = make_pod(phase="Failed", status_reason="DeadlineExceeded")
    pod["status"]["message"] = "Pod was active on the node longer than the specified deadline"
    out = classify(pod)
    assert out.outcome is Outcome.FAILED and out.cause is Cause.FAILURE, out
    assert "DeadlineExceeded" in out.message


@pytest.mark.parametrize(
    "message",
    [
        "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi. ",
        'Container trainer exceeded its local ephemeral storage limit "1Gi". ',
        'Usage of EmptyDir volume "scratch" exceeds the limit "2Gi". ',
    ],
)
def test_an_eviction_for_the_pods_own_storage_limit_is_a_failure(message):
    """The kubelet evicts a pod over its own ephemeral-storage or emptyDir limit with reason
    Evicted and no DisruptionTarget condition. Counted as a preemption, every attempt hit the
    same limit and was resubmitted for ever (maxPreemptions is unlimited by default)."""
    pod = make_pod(phase="Failed", exit_code=137, status_reason="Evicted")
    pod["status"]["message"] = message
    out = classify(pod)
    assert out.outcome is Outcome.FAILED and out.cause is Cause.FAILURE
    assert "its own limit" in out.message and message.strip() in out.message


def test_a_node_pressure_eviction_without_the_condition_stays_a_preemption():
    """Kubelets before DisruptionTarget, or a pressure eviction's own message: a preemption."""
    pod = make_pod(phase="Failed", exit_code=137, status_reason="Evicted")
    pod["status"]["message"] = "The node was low on resource: memory. "
    out = classify(pod)
    assert out.outcome is Outcome.PREEMPTED and out.cause is Cause.EVICTED


def test_a_pod_past_its_own_deadline_before_its_container_started_is_a_failure():
    """activeDeadlineSeconds runs from the pod's start, image pull included: a pod whose image
    pull outlasted it was Failed (DeadlineExceeded) before the training container started, and
    was taken for a kubelet admission rejection (KubeletRejected, a preemption). Every attempt
    hit the same deadline and was resubmitted at once, with no budget to stop it."""
    pod = make_pod(phase="Failed", status_reason="DeadlineExceeded")
    pod["status"]["message"] = "Pod was active on the node longer than the specified deadline"
    pod["status"]["containerStatuses"] = [
        {"name": "trainer", "started": False, "state": {"waiting": {"reason": "ErrImagePull"}}}
    ]
    out = classify(pod)
    assert out.outcome is Outcome.FAILED and out.cause is Cause.FAILURE, out
    assert "DeadlineExceeded" in out.message
