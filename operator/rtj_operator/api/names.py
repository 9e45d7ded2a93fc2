"""API coordinates, label keys and the deterministic names of everything the operator creates.

Deterministic names are the operator's idempotency mechanism: a restarted operator recomputes the
same pod names for the attempt recorded in status, so "create, and treat 409 as done" can never
produce a second gang. Keeping every name in one module makes that property easy to audit.
"""

from __future__ import annotations

GROUP = "resumable.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ResumableTrainingJob"
PLURAL = "resumabletrainingjobs"
SINGULAR = "resumabletrainingjob"
SHORT_NAMES = ("rtj",)
CRD_NAME = f"{PLURAL}.{GROUP}"

LABEL_JOB = f"{GROUP}/job-name"
LABEL_ATTEMPT = f"{GROUP}/attempt"
LABEL_RANK = f"{GROUP}/rank"
LABEL_ROLE = f"{GROUP}/role"
"""On a spare pod (value ``ROLE_SPARE``): a started rank waiting to take a lost one's place."""
ROLE_SPARE = "spare"

COMPONENT = "rtj-operator"
"""Reported as the source of Kubernetes Events and as the field manager of API writes."""

MAX_JOB_NAME_LENGTH = 48
"""Pod names are ``<job>-a<attempt>-r<rank>`` and double as DNS hostnames (at most 63 characters):
48 leaves room for seven attempt digits and four rank digits."""

NOTICE_VOLUME = "rtj-preemption-notice"
NOTICE_MOUNT_DIR = "/etc/resumable"
NOTICE_FILE_NAME = "preemption-notice"
NOTICE_FILE = f"{NOTICE_MOUNT_DIR}/{NOTICE_FILE_NAME}"
MEMBERSHIP_FILE_NAME = "membership"
MEMBERSHIP_FILE = f"{NOTICE_MOUNT_DIR}/{MEMBERSHIP_FILE_NAME}"
"""The membership annotation as a file (the agent reads it; docs/survivors.md)."""
REJOIN_SECONDS = 30
"""How long a pod's agent waits for a new membership after its worker stopped."""
NODE_MONITOR_GRACE_SECONDS = 50
"""How long the node controller waits for a silent kubelet before it marks the node NotReady
(kube-controller-manager's ``--node-monitor-grace-period``, 50 s by default since v1.32): a node
that dies without notice and is not deleted is first seen then."""
NODE_LEASE_NAMESPACE = "kube-node-lease"
"""Where each kubelet renews its node's Lease (the heartbeat the node controller watches)."""
CHECKPOINT_VOLUME = "rtj-checkpoints"
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
DEFAULT_GRACE_PERIOD_SECONDS = 30
TORCHRUN_SHUTDOWN_SECONDS = 30
"""How long torchrun waits for its workers after forwarding SIGTERM before it SIGKILLs them
(fixed in torch.distributed.elastic, not settable from the command line)."""


def pod_name(job: str, attempt: int, rank: int) -> str:
    """Name (and DNS hostname) of one rank's pod in one attempt."""
    return f"{job}-a{attempt}-r{rank}"


def spare_name(job: str, attempt: int, index: int) -> str:
    """Name (and DNS hostname) of a spare pod started during ``attempt`` (``recovery.spares``).
    It keeps the name when it takes a rank."""
    return f"{job}-a{attempt}-s{index}"


def service_name(job: str) -> str:
    """The headless Service that gives rank 0 a DNS name; one per job, stable across attempts."""
    return job


def trainer_identity_name(job: str) -> str:
    """Name shared by the job's ServiceAccount, Role and RoleBinding (the runtime's credentials)."""
    return f"{job}-trainer"


def master_addr(job: str, attempt: int) -> str:
    """Rank 0's DNS name, ``<hostname>.<subdomain>``, resolved through the pod's search path."""
    return f"{pod_name(job, attempt, 0)}.{service_name(job)}"


def job_selector(job: str) -> str:
    """Label selector for every pod of a job, across attempts."""
    return f"{LABEL_JOB}={job}"
