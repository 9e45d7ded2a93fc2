"""The job's support objects (trainer ServiceAccount, Role, RoleBinding, headless Service):
what should exist, compared with what does. No side effects.

They are reconciled like the pods, level-triggered on every pass: the controller reads them, this
module says which writes bring them to the desired state, and the executor applies those writes
in dependency order before it creates any pod. Creating them only together with the pods (the
earlier design) lost the RoleBinding for good whenever its creation failed once: the retry found
every pod in place and created nothing, so the first attempt's trainer could never report.

An object with the right name that the job does not control (no controller ownerReference with
the job's uid) is never written: it belongs to someone else, and overwriting a user's Role would
silently change what it grants. The job is blocked with a condition that names the object
instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api import names
from ..api.api_types import Job
from .manifests import (
    build_role,
    build_role_binding,
    build_service,
    build_service_account,
    uses_trainer_identity,
)

SERVICE_ACCOUNT = "ServiceAccount"
ROLE = "Role"
ROLE_BINDING = "RoleBinding"
SERVICE = "Service"

DEPENDENCY_ORDER = (SERVICE_ACCOUNT, ROLE, ROLE_BINDING, SERVICE)
"""Creation order: a RoleBinding is refused while its Role is unknown to the authorizer, and
admission refuses a pod whose ServiceAccount does not exist."""

Observed = Mapping[str, dict[str, Any] | None]
"""Support objects as read from the API server, by kind (None: it does not exist)."""


@dataclass(frozen=True)
class SupportWrite:
    """Create a missing support object, or update the job's own one where it drifted: the
    Role's pod names (they move with each attempt), the Service's port (``spec.masterPort``)."""

    kind: str
    body: dict[str, Any]
    update: bool = False

    @property
    def name(self) -> str:
        """The object's name."""
        return str(self.body["metadata"]["name"])

    @property
    def patch(self) -> dict[str, Any]:
        """The merge patch of an update: the only part of the object the operator keeps."""
        if self.kind == SERVICE:
            return {"spec": {"ports": self.body["spec"]["ports"]}}
        return {"rules": self.body["rules"]}


@dataclass
class SupportDecision:
    """What the support objects need."""

    writes: list[SupportWrite] = field(default_factory=list)
    """In dependency order."""
    conflicts: list[str] = field(default_factory=list)
    """Objects that exist under the job's names but belong to someone else (kind/name)."""

    @property
    def ready(self) -> bool:
        """Whether the pods may be created once ``writes`` succeeded."""
        return not self.conflicts


def desired(job: Job, attempt: int, kept: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """Every support object the job needs for ``attempt`` (which keeps the pods ``kept``), by
    kind, in dependency order."""
    wanted: dict[str, dict[str, Any]] = {}
    if uses_trainer_identity(job):
        wanted[SERVICE_ACCOUNT] = build_service_account(job)
        wanted[ROLE] = build_role(job, attempt, kept)
        wanted[ROLE_BINDING] = build_role_binding(job)
    wanted[SERVICE] = build_service(job)
    return wanted


def _ports(service: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """A Service's ports as the operator sets them (the API server adds nothing to these
    fields of a headless Service, but compare only them)."""
    ports = (service.get("spec") or {}).get("ports") or []
    return [(p.get("name"), p.get("port"), p.get("targetPort"), p.get("protocol")) for p in ports]


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether the job with ``uid`` (this incarnation of the name) is the controller of the
    object: a pod, a PodGroup, a support object."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == uid and ref.get("controller") for ref in refs)


def decide(job: Job, attempt: int, observed: Observed, kept: Sequence[str] = ()) -> SupportDecision:
    """Compare the desired support objects with the observed ones."""
    decision = SupportDecision()
    for kind, body in desired(job, attempt, kept).items():
        found = observed.get(kind)
        if found is None:
            decision.writes.append(SupportWrite(kind, body))
        elif not controlled_by(found, job.ref.uid):
            decision.conflicts.append(f"{kind} {body['metadata']['name']}")
        elif kind == ROLE and found.get("rules") != body["rules"]:
            decision.writes.append(SupportWrite(kind, body, update=True))
        elif kind == SERVICE and _ports(found) != _ports(body):
            # spec.masterPort may change; the next attempt's ranks rendezvous on the new port.
            decision.writes.append(SupportWrite(kind, body, update=True))
    if decision.conflicts:
        # Nothing is written around a foreign object: a RoleBinding created next to a foreign
        # Role would grant the job's ranks whatever that Role allows.
        decision.writes = []
    return decision


POD = "Pod"
"""A rank's pod name held by a pod the job does not control (conflicts only, never written)."""
POD_GROUP = "PodGroup"
"""The attempt's PodGroup (native gang scheduling), read before the gang is created; the
executor creates it (conflicts only here)."""


def conflict_message(job: Job, conflicts: list[str]) -> str:
    """The Blocked condition's message: which objects, and the ways out."""
    listed = ", ".join(conflicts)
    kinds = {c.split(" ", 1)[0] for c in conflicts}
    fix = "delete or rename them"
    if kinds & {SERVICE_ACCOUNT, ROLE, ROLE_BINDING}:
        identity = names.trainer_identity_name(job.ref.name)
        fix += f", or set template.spec.serviceAccountName so that no {identity} is needed"
    if POD in kinds:
        fix += (
            " (the pods of a deleted job of the same name are removed by the garbage collector "
            "once their grace period ends; the job starts when they are gone)"
        )
    if POD_GROUP in kinds:
        fix += (
            " (the PodGroup of a deleted job of the same name is removed once its pods are "
            "gone; the job starts when it is gone)"
        )
    verb, pronoun = ("exists", "is") if len(conflicts) == 1 else ("exist", "are")
    return (
        f"{listed} already {verb} in namespace {job.ref.namespace} and {pronoun} not controlled "
        f"by this job; the operator never modifies objects it does not own: {fix}"
    )


def taken_pod_names(
    job: Job, attempt: int, size: int, foreign: Iterable[Mapping[str, Any]]
) -> list[str]:
    """The attempt's pod names that pods the job does not control hold (``Pod <name>``).

    Creating such a pod answers 409, which would pass for the rank's own pod: the gang would
    count as created and the rank, never found, as lost to a preemption that did not happen.
    """
    wanted = {names.pod_name(job.ref.name, attempt, rank) for rank in range(size)}
    held = {str((p.get("metadata") or {}).get("name")) for p in foreign}
    return [f"{POD} {name}" for name in sorted(wanted & held)]


def taken_pod_group(job: Job, observed: Observed) -> list[str]:
    """The attempt's PodGroup when a group the job does not control holds its name
    (``PodGroup <name>``).

    Creating it answers 409, which would pass for the job's own group: the pods would join a
    group with another job's ``minCount`` (or one being deleted, which leaves pods not yet bound
    waiting for a group that no longer exists).
    """
    found = observed.get(POD_GROUP)
    if found is None or controlled_by(found, job.ref.uid):
        return []
    return [f"{POD_GROUP} {(found.get('metadata') or {}).get('name')}"]
