"""Build every object the operator creates for a job: rank pods, headless Service, trainer RBAC.

Pure functions from a parsed job to API dictionaries, so the exact pod a rank gets (names,
labels, the environment contract, the notice volume) is unit-tested without a cluster. The user's
template is copied verbatim and only the fields the contract needs are overridden.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from ..api import envvars, names, rbac
from ..api.api_types import Job
from ..api.spec_types import Survivors, shrink_after_seconds
from ..api.status_types import JobStatus
from .mtbi import interruptions, mtbi_seconds
from .resume import run_root

AGENT_COMMAND = ("python", "-m", "trainer_runtime.agent", "--")
"""Put in front of the training container's command when survivors stay."""

RANK_WRITTEN_ANNOTATIONS = frozenset(
    {envvars.NOTICE_ANNOTATION, envvars.PROGRESS_ANNOTATION, envvars.MEMBERSHIP_ANNOTATION}
)
"""Annotations each pod gets from the operator (the notice) and its runtime (the progress
report), never from the template: a template copied from a pod's YAML carried that pod's
progress report, which the operator read as a commit of the new gang's and resumed from."""


def owner_reference(job: Job) -> dict[str, Any]:
    """Controller reference to the job, so deleting the job garbage-collects what it owns."""
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "name": job.ref.name,
        "uid": job.ref.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(job: Job, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": job.ref.namespace,
        "labels": {names.LABEL_JOB: job.ref.name, **(labels or {})},
        "ownerReferences": [owner_reference(job)],
    }


def training_container_index(job: Job) -> int:
    """Index of the training container in the template (containerName, else the first)."""
    containers = (job.raw_template.get("spec") or {}).get("containers") or []
    for index, container in enumerate(containers):
        if container.get("name") == job.spec.container_name:
            return index
    return 0


def grace_period_seconds(job: Job) -> int:
    """The ranks' termination grace period (the time they have to save on SIGTERM)."""
    value = (job.raw_template.get("spec") or {}).get("terminationGracePeriodSeconds")
    return names.DEFAULT_GRACE_PERIOD_SECONDS if value is None else int(value)


def save_budget_seconds(job: Job) -> int:
    """How long a rank has to save after SIGTERM (``RTJ_GRACE_PERIOD_SECONDS``): the grace period,
    and with several processes per pod at most torchrun's own wait before it SIGKILLs its
    workers, since that kill comes first when the grace period is longer."""
    grace = grace_period_seconds(job)
    if job.spec.processes_per_pod > 1:
        return min(grace, names.TORCHRUN_SHUTDOWN_SECONDS)
    return grace


def rejoin_seconds(job: Job) -> int:
    """How long a kept pod's agent waits for its new membership (``RTJ_REJOIN_SECONDS``): an
    elastic job's next attempt may first wait ``shrinkAfterSeconds`` for the full gang."""
    return names.REJOIN_SECONDS + shrink_after_seconds(job.spec)


def loss_hold_seconds(job: Job) -> int:
    """``RTJ_LOSS_HOLD_SECONDS`` of ``job``'s pods (``hold_after_failed_collective``)."""
    signals = job.spec.preemption_signals
    return round(
        hold_after_failed_collective(shrink_after_seconds(job.spec), signals.node_not_ready_seconds)
    )


def hold_after_failed_collective(shrink_after_s: float, node_not_ready_s: float) -> float:
    """How long a worker whose collective failed (a peer lost without notice) waits for its new
    membership: the rank's failure comes at once, but a node that dies silently and is not
    deleted is seen only once it turned NotReady and stayed so for ``nodeNotReadySeconds``, and
    an elastic job's next attempt may first wait ``shrinkAfterSeconds``. A worker that gave up
    earlier would lose its step: the gang then restarts from the newest commit instead of
    rejoining or saving from memory."""
    silent_loss = names.NODE_MONITOR_GRACE_SECONDS + node_not_ready_s
    return names.REJOIN_SECONDS + shrink_after_s + silent_loss


def uses_trainer_identity(job: Job) -> bool:
    """Whether the pods run as the operator-made ServiceAccount (the template names none)."""
    spec = job.raw_template.get("spec") or {}
    return not (spec.get("serviceAccountName") or spec.get("serviceAccount"))


def rank_environment(
    job: Job,
    attempt: int,
    rank: int,
    *,
    resume_from: str,
    quarantined: list[str],
    report_file: str,
    size: int | None = None,
    master_addr: str | None = None,
    status: JobStatus | None = None,
    pod_name: str | None = None,
) -> list[dict[str, str]]:
    """The pod environment contract for one pod (``rank`` is the pod's index, torchrun's
    node rank), in contract order.

    RANK and WORLD_SIZE count processes: WORLD_SIZE is ``size * processesPerPod`` (``size`` is the
    attempt's gang size: ``replicas``, or fewer for a shrunk elastic gang) and RANK is
    the global rank of the pod's first process (LOCAL_RANK 0), which is the process's rank when a
    pod runs one process. With several, torchrun overwrites RANK, LOCAL_RANK and WORLD_SIZE for
    each worker it starts from the ``PET_*`` variables.
    """
    status = job.status if status is None else status
    per_pod = job.spec.processes_per_pod
    size = job.spec.replicas if size is None else size
    master_addr = master_addr or names.master_addr(job.ref.name, attempt)
    values = {
        envvars.RANK: str(rank * per_pod),
        envvars.WORLD_SIZE: str(size * per_pod),
        envvars.LOCAL_RANK: "0",
        envvars.MASTER_ADDR: master_addr,
        envvars.MASTER_PORT: str(job.spec.master_port),
        envvars.TORCHRUN_NNODES: str(size),
        envvars.TORCHRUN_NPROC_PER_NODE: str(per_pod),
        envvars.TORCHRUN_NODE_RANK: str(rank),
        envvars.TORCHRUN_MASTER_ADDR: master_addr,
        envvars.TORCHRUN_MASTER_PORT: str(job.spec.master_port),
        envvars.JOB_NAME: job.ref.name,
        envvars.NAMESPACE: job.ref.namespace,
        envvars.RUN_NAME: job.run_name,
        envvars.ATTEMPT: str(attempt),
        envvars.POD_NAME: pod_name or names.pod_name(job.ref.name, attempt, rank),
        envvars.CHECKPOINT_DIR: job.spec.checkpoint.dir,
        envvars.RESUME_FROM: resume_from,
        envvars.QUARANTINED: ",".join(quarantined),
        envvars.NOTICE_FILE: names.NOTICE_FILE,
        envvars.GRACE_PERIOD_SECONDS: str(save_budget_seconds(job)),
        envvars.REPORT_FILE: report_file,
        # The gang's membership epoch: each attempt's rank 0 raises the run's fence to it, so
        # a gang of an earlier attempt (cut off, slow to die) can no longer commit.
        envvars.MEMBERSHIP_EPOCH: str(attempt),
        envvars.MEMBERSHIP_FILE: names.MEMBERSHIP_FILE,
        envvars.REJOIN_SECONDS: str(rejoin_seconds(job)),
        envvars.LOSS_HOLD_SECONDS: str(loss_hold_seconds(job)),
        envvars.MTBI_SECONDS: str(round(mtbi_seconds(status))),
        envvars.INTERRUPTIONS: str(interruptions(status)),
    }
    return [{"name": key, "value": value} for key, value in values.items()]


def build_pod(
    job: Job,
    attempt: int,
    rank: int,
    *,
    resume_from: str,
    quarantined: list[str],
    size: int | None = None,
    master_addr: str | None = None,
    status: JobStatus | None = None,
    standby: bool = False,
    joins_kept: bool = False,
    name: str | None = None,
) -> dict[str, Any]:
    """The pod of one rank in one attempt of a gang of ``size`` pods (default ``replicas``);
    ``master_addr``: the gang's rendezvous when it is not this attempt's own rank 0 (a kept
    pod, survivors.py); ``standby``: its agent starts no worker before a membership names it
    (a warm grow, survivors.py); ``joins_kept``: it joins kept pods that may still be saving the
    last finished step, so its workers' download waits for their word (``MEMBERSHIP_CHANGED``);
    ``name``: the pod's name and hostname when it is not the rank's (a spare,
    spares.py)."""
    size = job.spec.replicas if size is None else size
    name = name or names.pod_name(job.ref.name, attempt, rank)
    template = copy.deepcopy(job.raw_template)
    tmeta = template.get("metadata") or {}
    spec: dict[str, Any] = template.get("spec") or {}

    spec["restartPolicy"] = "Never"
    spec["hostname"] = name
    spec["subdomain"] = names.service_name(job.ref.name)
    if uses_trainer_identity(job):
        spec["serviceAccountName"] = names.trainer_identity_name(job.ref.name)

    spec["volumes"] = _volumes(job, spec.get("volumes") or [])

    containers = spec.get("containers") or []
    container = containers[training_container_index(job)]
    report_file = container.get("terminationMessagePath") or names.DEFAULT_TERMINATION_MESSAGE_PATH
    container["terminationMessagePath"] = report_file
    container.setdefault("terminationMessagePolicy", "File")
    env = rank_environment(
        job,
        attempt,
        rank,
        size=size,
        resume_from=resume_from,
        quarantined=quarantined,
        report_file=report_file,
        master_addr=master_addr,
        status=status,
        pod_name=name,
    )
    if standby:
        env.append({"name": envvars.STANDBY, "value": "1"})
    elif joins_kept:
        env.append({"name": envvars.MEMBERSHIP_CHANGED, "value": "1"})
    _finish_container(job, container, env)

    metadata = _rank_metadata(job, name, tmeta, attempt, rank)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _finish_container(job: Job, container: dict[str, Any], env: list[dict[str, Any]]) -> None:
    """Give the training container the rank's ``env`` (before the user's own), the agent's
    command under ``survivors: Stay``, and the operator's mounts."""
    injected = {item["name"] for item in env}
    # Ours first: user variables may refer to them with $(RANK) and similar.
    user_env = [e for e in container.get("env") or [] if e.get("name") not in injected]
    container["env"] = env + user_env
    if job.spec.recovery.survivors is Survivors.STAY:
        # The agent keeps the workers warm across membership changes (docs/survivors.md).
        command = [*(container.get("command") or []), *(container.pop("args", None) or [])]
        container["command"] = [*AGENT_COMMAND, *command]
    container["volumeMounts"] = _mounts(job, container.get("volumeMounts") or [])


_OUR_VOLUMES = {names.NOTICE_VOLUME, names.CHECKPOINT_VOLUME}
"""Volumes the operator adds to every rank (a template's own of these names is replaced)."""


def _volumes(job: Job, template_volumes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The template's volumes, then the notice volume (the pod's notice and membership
    annotations as files) and the checkpoint volume, if the job names one."""
    volumes = [v for v in template_volumes if v.get("name") not in _OUR_VOLUMES]
    volumes.append(
        {
            "name": names.NOTICE_VOLUME,
            "downwardAPI": {
                "items": [
                    {
                        "path": names.NOTICE_FILE_NAME,
                        "fieldRef": {
                            "fieldPath": f"metadata.annotations['{envvars.NOTICE_ANNOTATION}']"
                        },
                    },
                    {
                        "path": names.MEMBERSHIP_FILE_NAME,
                        "fieldRef": {
                            "fieldPath": (
                                f"metadata.annotations['{envvars.MEMBERSHIP_ANNOTATION}']"
                            )
                        },
                    },
                ]
            },
        }
    )
    if job.spec.checkpoint.volume_source:
        volumes.append({"name": names.CHECKPOINT_VOLUME, **job.spec.checkpoint.volume_source})
    return volumes


def _mounts(job: Job, template_mounts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The training container's mounts: its own, then the notice and checkpoint volumes."""
    mounts = [m for m in template_mounts if m.get("name") not in _OUR_VOLUMES]
    mounts.append(
        {"name": names.NOTICE_VOLUME, "mountPath": names.NOTICE_MOUNT_DIR, "readOnly": True}
    )
    if job.spec.checkpoint.volume_source:
        mounts.append({"name": names.CHECKPOINT_VOLUME, "mountPath": job.spec.checkpoint.dir})
    return mounts


def job_pod_labels(job: Job) -> dict[str, str]:
    """The labels every pod of the job carries: the template's and the job's name (each rank
    adds its attempt and rank)."""
    tmeta = job.raw_template.get("metadata") or {}
    return {**(tmeta.get("labels") or {}), names.LABEL_JOB: job.ref.name}


def _rank_metadata(
    job: Job, name: str, tmeta: dict[str, Any], attempt: int, rank: int
) -> dict[str, Any]:
    """A rank pod's metadata: the job's pod labels with the attempt's and rank's, and the
    template's annotations except those the rank itself writes."""
    labels = {
        **job_pod_labels(job),
        names.LABEL_ATTEMPT: str(attempt),
        names.LABEL_RANK: str(rank),
    }
    metadata = _metadata(job, name, labels)
    annotations = {
        key: value
        for key, value in (tmeta.get("annotations") or {}).items()
        if key not in RANK_WRITTEN_ANNOTATIONS
    }
    if annotations:
        metadata["annotations"] = annotations
    return metadata


def build_service(job: Job) -> dict[str, Any]:
    """Headless Service: ``<pod>.<service>`` resolves to each rank, rank 0 being MASTER_ADDR.

    publishNotReadyAddresses, because ranks look up rank 0 before it is Ready (and training pods
    seldom have a readiness probe); hostnames are per attempt, so old pods never shadow new ones.
    """
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, names.service_name(job.ref.name)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {names.LABEL_JOB: job.ref.name},
            "ports": [
                {
                    "name": "rendezvous",
                    "port": job.spec.master_port,
                    "targetPort": job.spec.master_port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def build_service_account(job: Job) -> dict[str, Any]:
    """The ranks' identity (used only when the template names no ServiceAccount)."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(job, names.trainer_identity_name(job.ref.name)),
    }


def _spare_slots(job: Job) -> int:
    """How many spare pods an attempt of ``job`` may start: ``recovery.spares``, or for an
    elastic gang with ``Stay`` the standby pods of the places a loss left (restore.py)."""
    spec = job.spec
    if spec.elastic is not None and spec.recovery.survivors is Survivors.STAY:
        return spec.replicas - spec.elastic.min_replicas
    return spec.recovery.spares


def build_role(job: Job, attempt: int, kept: Sequence[str] = ()) -> dict[str, Any]:
    """May get and patch only the pods of the given attempt and of the one before it: the
    previous gang may still be inside its grace period, reporting its final (emergency) save;
    and the pods the attempt kept from earlier ones (``kept``, survivors.py)."""
    attempts = [attempt - 1, attempt] if attempt > 0 else [attempt]
    pods = [names.pod_name(job.ref.name, a, r) for a in attempts for r in range(job.spec.replicas)]
    pods += [
        names.spare_name(job.ref.name, a, i) for a in attempts for i in range(_spare_slots(job))
    ]  # a spare says it is warm on its own pod (spares.py, restore.py)
    pods += [name for name in kept if name not in pods]
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(job, names.trainer_identity_name(job.ref.name)),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["pods"],
                "verbs": list(rbac.TRAINER_VERBS),
                "resourceNames": pods,
            }
        ],
    }


def build_role_binding(job: Job) -> dict[str, Any]:
    """Binds the trainer Role to the trainer ServiceAccount."""
    name = names.trainer_identity_name(job.ref.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(job, name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": job.ref.namespace}],
    }


def checkpoint_root(job: Job) -> str:
    """The run's checkpoint folder (shown in events)."""
    return run_root(job.spec.checkpoint.dir, job.run_name)
