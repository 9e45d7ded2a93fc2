"""Classify how each rank's pod is doing, and what that means for the gang (docs/operator.md).

The one question that matters for a spot job: did this pod end because the infrastructure took it
(a *preemption*: restart at once, never touch the failure budget) or because the training code
failed (a *failure*: count it and back off)? The Kubernetes signals are scattered, so the order
of the checks below is the policy:

1. a pod that succeeded, or whose training container exited 0, stays a success whatever happens
   to its node (or its other containers) afterwards;
2. the pod's node is deleted (spot reclaim) -> preemption, even though the pod still says Running,
   because no kubelet will ever report on it again (PodGC only cleans up ~40 s later);
3. a ``DisruptionTarget`` condition (scheduler preemption, taint eviction, the Eviction API,
   PodGC, kubelet shutdown) -> preemption, whatever the exit code; so is Kueue's
   ``TerminationTarget`` (Kueue evicted the gang's Workload: a higher-priority workload took
   its quota, or the quota was reclaimed), which Kueue sets right before it deletes the pods;
4. kubelet reasons (``Evicted``, node shutdown, admission rejections) -> preemption, except an
   eviction for exceeding the pod's own storage limits or its own ``activeDeadlineSeconds``
   (they recur: a failure);
5. a pod being deleted that the operator did not delete -> preemption (it is going away);
6. a non-zero exit -> failure, *unless* the pod's node was announced for termination or is not
   ready: a rank killed by a dying node is not the code's fault;
7. a node whose kubelet went silent (its Lease unrenewed for half its duration) while a rank of
   the gang reported a failed collective (``resumable.dev/peer-lost``) -> preemption at once:
   the machine died without its Node being deleted, and the peers' report confirms it;
8. a NotReady node -> preemption once ``nodeNotReadySeconds`` have passed, otherwise wait.

At the gang level a preemption of any rank wins over failures of the others, because the
surviving ranks of a broken gang typically crash (NCCL timeouts) right after one goes. A failed
gang is described by the rank that ended first, for the same reason: the others' exits are
usually its consequence. What a failure then does (count, retry, fail the job) is the user's
policy, ``resumePolicy.exitCodeRules``, applied in exit_policy.py to that rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from ..api.spec_types import TaintSelector
from ..api.status_types import Cause
from ..api.timeutil import parse_time
from .nodes import NodeView
from .notice import termination_taint

KUBELET_TERMINATION = "TerminationByKubelet"
"""The DisruptionTarget reason of every pod the kubelet ends: a graceful node shutdown (pod
reason ``Terminated``), a node-pressure eviction (``Evicted``) or a critical pod's admission
(``Preempting``)."""

DISRUPTION_CAUSES = {
    "PreemptionByScheduler": Cause.SCHEDULER_PREEMPTION,
    "PreemptionByKubeScheduler": Cause.SCHEDULER_PREEMPTION,
    "DeletionByTaintManager": Cause.TAINT_EVICTION,
    "EvictionByEvictionAPI": Cause.EVICTED,
    "DeletionByPodGC": Cause.POD_GC,
    KUBELET_TERMINATION: Cause.NODE_SHUTDOWN,
}
"""DisruptionTarget reasons the control plane uses, and the cause they mean."""

KUEUE_TERMINATION = "TerminationTarget"
"""The condition Kueue's pod integration sets on every pod of a Workload it stops (reason
``WorkloadEvicted`` for a preemption or reclaim, with the Workload's eviction message), then it
deletes the pods. Read as its own signal rather than as a deletion by someone: the message then
names Kueue and why it evicted the gang."""

KUBELET_REASONS = {
    "Evicted": Cause.EVICTED,
    "Preempting": Cause.EVICTED,
    "Shutdown": Cause.NODE_SHUTDOWN,
    "NodeShutdown": Cause.NODE_SHUTDOWN,
    "Terminated": Cause.NODE_SHUTDOWN,
    "NodeLost": Cause.NODE_NOT_READY,
}
"""``status.reason`` values the kubelet/node controller set on pods it ended."""

OWN_LIMIT_EVICTIONS = (
    "exceeded its local ephemeral storage limit",
    "ephemeral local storage usage exceeds the total limit",
    "Usage of EmptyDir volume",
)
"""Phrases of the kubelet's messages when it evicts a pod for exceeding a limit of its own
(a container's or the pod's ``ephemeral-storage``, an ``emptyDir`` ``sizeLimit``). Such an
eviction has reason ``Evicted`` but no ``DisruptionTarget`` condition, and it recurs in every
attempt: the training's fault, so a failure, or the job would be resubmitted for ever."""


OWN_DEADLINE_REASONS = frozenset({"DeadlineExceeded"})
"""Pod reasons of a kubelet that failed the pod for a limit of its own (``activeDeadlineSeconds``,
which counts from the pod's start, image pull included): never an admission rejection, also
before the training container started, since every attempt would hit the same deadline."""


class Outcome(StrEnum):
    """Where one rank stands."""

    ACTIVE = "Active"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    PREEMPTED = "Preempted"


@dataclass(frozen=True)
class RankOutcome:
    """The classification of one rank's pod."""

    rank: int
    outcome: Outcome
    pod: str | None = None
    node: str | None = None
    cause: Cause | None = None
    exit_code: int | None = None
    message: str = ""
    running: bool = False
    """The pod is in phase Running (used for the gang's Running phase)."""
    notice: dict[str, Any] | None = None
    """The termination taint on this rank's node, when there is one."""
    node_trouble: Cause | None = None
    """The node is announced for termination or not ready (while the pod still runs)."""
    recheck_after: float | None = None
    """Seconds until this classification may change by time alone (NotReady grace)."""
    finished_at: datetime | None = None
    """When the training container terminated, if it did."""
    exit_reason: str | None = None
    """The training container's termination reason (``OOMKilled``, ``Error``, ...), if it
    terminated."""
    lease_check_s: float | None = None
    """The longest the check of this rank's node's Lease takes (rule 7), while it runs."""
    own_exit: bool = False
    """A failure that is the training container's own exit: it terminated with a non-zero code
    and the kubelet did not fail the pod itself (a pod reason such as ``DeadlineExceeded``, or
    ``Evicted`` for its own limits, means its kill made the code). Only such a failure is
    matched against ``resumePolicy.exitCodeRules`` (exit_policy.py)."""


@dataclass(frozen=True)
class Signals:
    """The job's settings that classification depends on."""

    termination_taints: Sequence[TaintSelector]
    node_not_ready_seconds: float
    container_name: str | None = None
    failure_settle_seconds: float = 0.0
    peer_lost_ranks: frozenset[int] = frozenset()
    """The ranks of the current gang whose pods reported a failed collective (a peer is gone):
    the gang's nodes' Leases were read, a silent one is taken as lost (rule 7), and a failure
    of those ranks alone waits for that check (``gang_verdict``)."""

    @property
    def peer_lost(self) -> bool:
        return bool(self.peer_lost_ranks)


def training_container_name(pod: dict[str, Any], configured: str | None) -> str | None:
    """The container whose exit decides the rank: the configured one, else the first."""
    if configured:
        return configured
    containers = (pod.get("spec") or {}).get("containers") or []
    return containers[0].get("name") if containers else None


def terminated_state(pod: dict[str, Any], container: str | None) -> dict[str, Any] | None:
    """The ``state.terminated`` of the training container, if it terminated."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return (status.get("state") or {}).get("terminated")
    return None


def disruption_condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pod's ``DisruptionTarget`` condition when it is True."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return cond
    return None


def kueue_stop(pod: dict[str, Any]) -> dict[str, Any] | None:
    """Kueue's ``TerminationTarget`` condition when it is True (Kueue stopped the pod)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == KUEUE_TERMINATION and cond.get("status") == "True":
            return cond
    return None


def _node_trouble(node: NodeView | None, signals: Signals) -> tuple[Cause | None, dict | None]:
    if node is None or not node.exists:
        return None, None
    taint = termination_taint(node.taints, signals.termination_taints)
    if taint is not None:
        return Cause.TERMINATION_NOTICE, taint
    if node.ready is not True:
        return Cause.NODE_NOT_READY, None
    return None, None


def classify_rank(
    rank: int,
    pod: dict[str, Any] | None,
    node: NodeView | None,
    *,
    signals: Signals,
    now: datetime,
    expected_pod: str | None = None,
) -> RankOutcome:
    """Classify one rank; ``pod`` None means the rank's pod no longer exists.

    Long on purpose: the numbered checks are the module's policy table, and their order is the
    policy (a success before a deleted node, a disruption before an exit code, a dying node
    before a failure); split into functions, the order would be spread over several places and
    a check could move past another unseen."""
    if pod is None:
        return RankOutcome(
            rank,
            Outcome.PREEMPTED,
            pod=expected_pod,
            cause=Cause.POD_REMOVED,
            message=f"pod {expected_pod} disappeared (deleted or garbage-collected)",
        )
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    name = meta.get("name")
    node_name = (pod.get("spec") or {}).get("nodeName")
    phase = status.get("phase")
    container = training_container_name(pod, signals.container_name)
    terminated = terminated_state(pod, container)
    exit_code = terminated.get("exitCode") if terminated else None
    finished_at = parse_time(terminated.get("finishedAt")) if terminated else None
    base = {"pod": name, "node": node_name, "exit_code": exit_code}

    def preempted(cause: Cause, message: str) -> RankOutcome:
        return RankOutcome(rank, Outcome.PREEMPTED, cause=cause, message=message, **base)

    # 1. Success is final. The training container decides: its exit 0 is a success even when
    #    another container (a sidecar failing on shutdown) leaves the pod Failed.
    if phase == "Succeeded" or exit_code == 0:
        return RankOutcome(rank, Outcome.SUCCEEDED, message="exited 0", **base)
    # 2. The node is gone: nothing will ever report on this pod again.
    if node is not None and node_name and node.gone:
        what = "is being deleted" if node.exists else "was deleted"
        return preempted(Cause.NODE_DELETED, f"node {node_name} {what}")
    # 3. The control plane said it disrupted the pod.
    disruption = disruption_condition(pod)
    if disruption is not None:
        reason = disruption.get("reason") or ""
        cause = DISRUPTION_CAUSES.get(reason, Cause.DISRUPTION)
        if reason == KUBELET_TERMINATION:
            # The kubelet uses one reason for its shutdowns and its evictions (node pressure,
            # a critical pod's admission); the pod's own reason says which it was.
            cause = KUBELET_REASONS.get(status.get("reason") or "", cause)
        detail = disruption.get("message") or reason
        return preempted(cause, f"DisruptionTarget {reason}: {detail}".strip())
    stopped = kueue_stop(pod)
    if stopped is not None:
        reason = stopped.get("reason") or ""
        detail = stopped.get("message") or reason
        return preempted(Cause.KUEUE_EVICTION, f"Kueue {KUEUE_TERMINATION} {reason}: {detail}")
    # 4. The kubelet ended or rejected it.
    reason = status.get("reason") or ""
    said = f"{reason}: {status.get('message') or ''}".strip()
    own_limit = reason == "Evicted" and _own_limit_eviction(status.get("message") or "")
    if reason in KUBELET_REASONS and not own_limit:
        return preempted(KUBELET_REASONS[reason], said)
    rejected = phase == "Failed" and terminated is None and reason and not own_limit
    if rejected and reason not in OWN_DEADLINE_REASONS and not _started(pod, container):
        return preempted(Cause.KUBELET_REJECTED, said)
    # 5. Someone else is deleting it.
    if meta.get("deletionTimestamp"):
        return preempted(Cause.POD_DELETED, f"pod {name} is being deleted")

    trouble, taint = _node_trouble(node, signals)
    # 6. A non-zero exit: a failure, unless the node was dying under it.
    if (exit_code is not None and exit_code != 0) or phase == "Failed":
        how = terminated.get("reason") if terminated else None
        what = f"exit code {exit_code}" + (f" ({how})" if how else "")
        if own_limit:
            what = f"evicted for exceeding its own limit ({said})"
        elif exit_code is None:
            # The pod failed before the training container ended: say which container did.
            what = _other_failure(pod, container) or (
                f"pod Failed ({said}) before container {container} terminated"
                if reason
                else f"pod Failed before container {container} terminated"
            )
        if trouble is not None:
            return preempted(
                trouble,
                f"{what} while node {node_name} was "
                f"{'announced for termination' if taint else 'not ready'}",
            )
        return RankOutcome(
            rank,
            Outcome.FAILED,
            cause=Cause.FAILURE,
            message=what,
            finished_at=finished_at,
            exit_reason=how,
            own_exit=exit_code is not None and not reason,
            **base,
        )
    # 7. A silent node, confirmed by the peers' report.
    recheck = lease_check = None
    if signals.peer_lost and node is not None and node_name and node.exists:
        left = node.silent_in(now)
        if left is not None and left <= 0:
            quiet = (now - node.lease_renewed).total_seconds() if node.lease_renewed else 0.0
            return preempted(
                Cause.NODE_SILENT,
                f"node {node_name}'s kubelet silent for {quiet:.0f}s (its Lease not renewed) "
                "after a rank of the gang reported a failed collective",
            )
        if left is not None:
            recheck, lease_check = max(left, 0.1), node.silent_check_seconds
    # 8. NotReady nodes get a grace period.
    if node is not None and node_name and node.exists and node.ready is not True:
        since = node.not_ready_since or now
        waited = (now - since).total_seconds()
        if waited >= signals.node_not_ready_seconds:
            state = "Unknown" if node.ready is None else "NotReady"
            return preempted(Cause.NODE_NOT_READY, f"node {node_name} {state} for {waited:.0f}s")
        left = max(signals.node_not_ready_seconds - waited, 0.1)
        recheck = left if recheck is None else min(recheck, left)
    return RankOutcome(
        rank,
        Outcome.ACTIVE,
        running=phase == "Running",
        notice=taint,
        node_trouble=trouble,
        recheck_after=recheck,
        lease_check_s=lease_check,
        **base,
    )


def _own_limit_eviction(message: str) -> bool:
    """Whether an ``Evicted`` pod's message is the kubelet's for a limit of the pod's own."""
    return any(phrase in message for phrase in OWN_LIMIT_EVICTIONS)


def _started(pod: dict[str, Any], container: str | None) -> bool:
    """Whether the training container ever ran: a pod the kubelet failed after that (its own
    ``activeDeadlineSeconds``: reason ``DeadlineExceeded``) was not rejected at admission."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") != container:
            continue
        state, last = status.get("state") or {}, status.get("lastState") or {}
        return bool(status.get("started") or "running" in state or "terminated" in state or last)
    return False


def _other_failure(pod: dict[str, Any], training: str | None) -> str | None:
    """The first other container (init containers first) that ended with a non-zero code."""
    status = pod.get("status") or {}
    for key, kind in (
        ("initContainerStatuses", "init container"),
        ("containerStatuses", "container"),
    ):
        for entry in status.get(key) or []:
            terminated = (entry.get("state") or {}).get("terminated") or {}
            code = terminated.get("exitCode")
            if entry.get("name") != training and code not in (None, 0):
                how = terminated.get("reason")
                return f"{kind} {entry.get('name')} exited {code}" + (f" ({how})" if how else "")
    return None


@dataclass(frozen=True)
class GangVerdict:
    """What the gang as a whole is doing."""

    outcome: Outcome
    trigger: RankOutcome | None = None
    """The rank whose signal decided the verdict: the first preempted by rank, else the failed
    rank whose training container ended first (``first_to_end``)."""
    all_running: bool = False
    recheck_after: float | None = None


def gang_verdict(
    outcomes: Iterable[RankOutcome],
    *,
    settle_seconds: float = 0.0,
    now: datetime | None = None,
    reporters: frozenset[int] = frozenset(),
) -> GangVerdict:
    """Combine the ranks: any preemption > any failure (or node trouble) > all succeeded.

    A failure while other ranks' pods still run waits up to ``settle_seconds`` after the failed
    rank's exit (``Signals.failure_settle_seconds``): their node may be dying without a word
    yet, and turns NotReady only after the node controller's grace period. A failure of ranks
    that all reported a failed collective (``reporters``: a peer went, not their own error)
    also waits while the Leases of the running ranks' nodes are checked (rule 7)."""
    ranks = sorted(outcomes, key=lambda o: o.rank)
    preempted = [o for o in ranks if o.outcome is Outcome.PREEMPTED]
    failed = [o for o in ranks if o.outcome is Outcome.FAILED]
    rechecks = [o.recheck_after for o in ranks if o.recheck_after is not None]
    recheck = min(rechecks) if rechecks else None
    if preempted:
        return GangVerdict(Outcome.PREEMPTED, preempted[0])
    if failed:
        first = first_to_end(failed)
        troubled = [o for o in ranks if o.node_trouble is not None]
        if troubled:
            culprit = troubled[0]
            state = "announced for termination" if culprit.notice else "not ready"
            return GangVerdict(
                Outcome.PREEMPTED,
                RankOutcome(
                    first.rank,
                    Outcome.PREEMPTED,
                    pod=first.pod,
                    node=first.node,
                    cause=culprit.node_trouble,
                    exit_code=first.exit_code,
                    message=f"rank {first.rank} {first.message} while rank {culprit.rank}'s node "
                    f"{culprit.node} was {state}",
                ),
            )
        left = _failure_wait(ranks, failed, settle_seconds, reporters, now)
        if left is not None:
            return GangVerdict(
                Outcome.ACTIVE, recheck_after=left if recheck is None else min(left, recheck)
            )
        return GangVerdict(Outcome.FAILED, first)
    if ranks and all(o.outcome is Outcome.SUCCEEDED for o in ranks):
        return GangVerdict(Outcome.SUCCEEDED)
    active = [o for o in ranks if o.outcome is Outcome.ACTIVE]
    all_running = (
        bool(ranks)
        and all(o.running or o.outcome is Outcome.SUCCEEDED for o in ranks)
        and bool(active)
    )
    return GangVerdict(Outcome.ACTIVE, all_running=all_running, recheck_after=recheck)


_NEVER = datetime.min.replace(tzinfo=UTC)


def first_to_end(failed: Sequence[RankOutcome]) -> RankOutcome:
    """The failed rank that speaks for the gang: the one whose training container terminated
    first (the others usually crash because it went: NCCL errors, timeouts), the lowest rank
    among those that ended in the same second (``finishedAt`` has seconds only), and ranks
    without a finish time (the pod failed before the container ended) after every timed one."""
    return min(
        failed,
        key=lambda o: (o.finished_at is None, o.finished_at or _NEVER, o.rank),
    )


def _failure_wait(
    ranks: list[RankOutcome],
    failed: list[RankOutcome],
    settle_seconds: float,
    reporters: frozenset[int],
    now: datetime | None,
) -> float | None:
    """Seconds the failure still waits (the longer of the two waits), or None: count it."""
    waits = [
        left
        for left in (
            _settle_left(ranks, failed, settle_seconds, now),
            _lease_check_left(ranks, failed, reporters, now),
        )
        if left is not None
    ]
    return max(waits) if waits else None


def _settle_left(
    ranks: list[RankOutcome],
    failed: list[RankOutcome],
    settle_seconds: float,
    now: datetime | None,
) -> float | None:
    """Seconds the failure of ``failed`` still waits for the ranks that run on, or None."""
    if settle_seconds <= 0:
        return None
    if not any(o.outcome is Outcome.ACTIVE and o.running for o in ranks):
        return None  # nobody left to wait for: the others ended too
    return _left_after_first_exit(failed, settle_seconds, now)


def _lease_check_left(
    ranks: list[RankOutcome],
    failed: list[RankOutcome],
    reporters: frozenset[int],
    now: datetime | None,
) -> float | None:
    """Seconds the failure of ``failed`` still waits for the Lease check of the nodes of the
    ranks that run on, when every failed rank reported a failed collective; None otherwise. A
    rank that ended on an error of its own reports nothing: its failure counts at once."""
    if any(o.rank not in reporters for o in failed):
        return None
    bounds = [
        o.lease_check_s
        for o in ranks
        if o.outcome is Outcome.ACTIVE and o.running and o.lease_check_s is not None
    ]
    return _left_after_first_exit(failed, max(bounds), now) if bounds else None


def _left_after_first_exit(
    failed: list[RankOutcome], seconds: float, now: datetime | None
) -> float | None:
    """What is left of ``seconds`` counted from the first failed rank's exit; None when nothing
    is, or no exit time is known."""
    exits = [o.finished_at for o in failed if o.finished_at is not None]
    if now is None or not exits:
        return None
    left = seconds - (now - min(exits)).total_seconds()
    return left if left > 0 else None
