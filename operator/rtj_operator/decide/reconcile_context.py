"""The state of one reconcile pass, shared by the state machine's modules.

The job, the copy of its status being decided, the plan being built, the clock and what was
observed (its pods, their nodes, the cluster's nodes, the support objects). One object passed to
every step keeps their signatures short and makes it impossible for two steps to decide from
different observations; passing each piece separately was rejected for exactly that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..api.api_types import Job
from ..api.status_types import JobStatus, Phase
from . import conditions as cond
from . import kueue_quota, support
from .capacity import fitting_pods
from .manifests import job_pod_labels
from .nodes import NodeView
from .plan_types import Plan
from .podstate import pod_attempt, pod_rank


@dataclass
class ReconcileContext:
    """One reconcile pass: the job, the status being decided, the plan, the clock, what was
    seen."""

    job: Job
    status: JobStatus
    plan: Plan
    now: datetime
    owned: list[dict[str, Any]]
    nodes: Mapping[str, NodeView]
    departed: Mapping[str, dict[str, Any]]
    observed_support: support.Observed
    cluster_nodes: Sequence[NodeView] | None = None
    native_gang: bool = False
    kueue: bool = False
    foreign: Sequence[dict[str, Any]] = ()
    """Pods the job does not control under its pod names: with its label (an earlier job of the
    same name's ranks, still terminating) or without (made by hand, read by name while a gang
    is created). Their names are taken until they are gone."""

    @property
    def generation(self) -> int:
        return self.job.ref.generation

    @property
    def size(self) -> int:
        """Pods in the current attempt's gang."""
        return self.status.gang_size or self.job.spec.replicas

    def fit(self, limit: int | None = None) -> int:
        """How many of the job's pods the cluster's nodes could take now, at most ``limit``
        (default ``replicas``; all of them when the caller passed no node list), and at most
        what its Kueue ClusterQueue's free quota holds when the controller read it
        (kueue_quota.py)."""
        limit = self.job.spec.replicas if limit is None else limit
        template_spec = self.job.raw_template.get("spec") or {}
        count = (
            limit
            if self.cluster_nodes is None
            else fitting_pods(self.cluster_nodes, template_spec, limit, job_pod_labels(self.job))
        )
        quota = kueue_quota.room(
            self.observed_support.get(kueue_quota.CLUSTER_QUEUE), template_spec, self.owned
        )
        return count if quota is None else min(count, quota)

    def phase(self, phase: Phase, reason: str, message: str) -> None:
        cond.set_phase(
            self.status,
            phase,
            reason=reason,
            message=message,
            now=self.now,
            generation=self.generation,
        )

    def current_pods(self) -> dict[int, dict[str, Any]]:
        found: dict[int, dict[str, Any]] = {}
        for pod in self.owned:
            rank = pod_rank(pod)
            if pod_attempt(pod) == self.status.attempt and rank is not None:
                found[rank] = pod
        return found
