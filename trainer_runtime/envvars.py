"""Names of every environment variable the runtime reads: the runtime half of the pod contract.

The operator injects these into each rank's container (docs/operator.md); its own copy of the
names lives in ``rtj_operator.api.envvars`` and a test checks that both halves agree. Keeping the
names here, and nowhere else in the runtime, is what makes that check meaningful.
"""

from __future__ import annotations

# torch.distributed conventions (set by torchrun or by the operator).
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
# Set by torchrun (the processes it started on this node); the operator does not inject it.
# The load runs its page-mapping helper thread only when a process has a CPU to spare by it.
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
# torch's contract with torchrun's agent: "True" when the agent of node rank 0 serves the
# rendezvous store, so rank 0's worker starts none (agent/rendezvous_store.py sets it).
USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"

# torchrun's options as the operator injects them (a pod is one torchrun node). The runtime
# never reads these itself: torchrun turns them into each worker's RANK, LOCAL_RANK and
# WORLD_SIZE. They are listed here so the contract test covers the whole pod environment.
TORCHRUN_NNODES = "PET_NNODES"
TORCHRUN_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
TORCHRUN_NODE_RANK = "PET_NODE_RANK"
TORCHRUN_MASTER_ADDR = "PET_MASTER_ADDR"
TORCHRUN_MASTER_PORT = "PET_MASTER_PORT"
TORCHRUN = (
    TORCHRUN_NNODES,
    TORCHRUN_NPROC_PER_NODE,
    TORCHRUN_NODE_RANK,
    TORCHRUN_MASTER_ADDR,
    TORCHRUN_MASTER_PORT,
)

# Identity of the job and of this attempt.
JOB_NAME = "RTJ_JOB_NAME"
NAMESPACE = "RTJ_NAMESPACE"
RUN_NAME = "RTJ_RUN_NAME"
ATTEMPT = "RTJ_ATTEMPT"
POD_NAME = "RTJ_POD_NAME"

# Where checkpoints live and where to resume from.
CHECKPOINT_DIR = "RTJ_CHECKPOINT_DIR"
RESUME_FROM = "RTJ_RESUME_FROM"
# Comma-separated checkpoint names the operator quarantined: never resume from these.
QUARANTINED = "RTJ_QUARANTINED"

# Preemption handling.
NOTICE_FILE = "RTJ_NOTICE_FILE"
GRACE_PERIOD_SECONDS = "RTJ_GRACE_PERIOD_SECONDS"

# Membership without a restart (trainer_runtime/pod/membership.py, docs/survivors.md): the epoch of
# the gang this process belongs to (it only grows; every commit is fenced by it), the downward
# API file the in-pod agent watches for a new membership, how long a survivor whose worker
# stopped waits for one before it gives up and exits (the operator then replaces the gang), and
# how long a worker whose collective failed (a peer lost without notice) waits for it: as long
# as the operator may take to see a node that died silently (default: REJOIN_SECONDS).
MEMBERSHIP_EPOCH = "RTJ_MEMBERSHIP_EPOCH"
MEMBERSHIP_FILE = "RTJ_MEMBERSHIP_FILE"
REJOIN_SECONDS = "RTJ_REJOIN_SECONDS"
LOSS_HOLD_SECONDS = "RTJ_LOSS_HOLD_SECONDS"
# Set to "1" on a pod the operator adds to a gang that trains on meanwhile (a warm grow): its
# agent imports torch and the runtime, says so in AGENT_READY_ANNOTATION on its own pod, and
# starts no worker until a membership names it. Not in ALL_RTJ: only such pods get it.
STANDBY = "RTJ_STANDBY"
# Modules the in-pod agent imports for the workers it forks (agent/preload.py): comma-separated
# module names; unset: torch._inductor.config (what torch.compile and deterministic algorithms
# import on first use); empty: none. Set by the user, never by the operator: not in ALL_RTJ.
AGENT_PRELOAD = "RTJ_AGENT_PRELOAD"
# Saving the last finished step from a survivor's memory (save/survivor.py): the agent gives
# each worker a file to say it can (SURVIVOR_SAVE_FILE, the agent's own, not the user's; the
# saver writes the bytes it has moved there) and waits for that worker's save as long as the
# count grows, at most SURVIVOR_SAVE_SECONDS without a byte; the user sets SURVIVOR_SAVE=0 to
# turn the save off. Not in ALL_RTJ: the operator injects none of them.
SURVIVOR_SAVE = "RTJ_SURVIVOR_SAVE"
SURVIVOR_SAVE_FILE = "RTJ_SURVIVOR_SAVE_FILE"
SURVIVOR_SAVE_SECONDS = "RTJ_SURVIVOR_SAVE_SECONDS"
# From how many MiB of replicated state the survivors' save is split over the kept pods (each
# kept pod's local rank 0 worker writes a share; save/survivor_group.py). Not in ALL_RTJ either.
SURVIVOR_SPLIT_MIB = "RTJ_SURVIVOR_SPLIT_MIB"
# The in-process switch (switch.py, docs/survivors.md): the agent gives each worker a file
# (SWITCH_FILE, the agent's own); a manager built with in_process_switch=True writes
# "<file>.ready" beside it, and the agent writes the new membership into the file instead of
# restarting the worker. PEER_STATE is "1" on the workers an agent starts for a membership that
# switches in process (new pods, and kept ones that could not switch): their resume() first
# asks the new rank 0 whether it sends the state. Neither is in ALL_RTJ: the agent sets both.
SWITCH_FILE = "RTJ_SWITCH_FILE"
PEER_STATE = "RTJ_PEER_STATE"

# Where the runtime reports its last committed checkpoint (the container's termination
# message path, so the operator reads it from the pod status).
REPORT_FILE = "RTJ_REPORT_FILE"

# Optional: a file the runtime appends its structured events to, one JSON object per line
# (events.py). The operator does not inject it: the events also go to stderr, which
# ``kubectl logs`` reads; a user sets it to keep them in a file (e.g. on a shared volume).
EVENTS_FILE = "RTJ_EVENTS_FILE"

# Optional: seconds between rank 0's reports of its current step to its pod annotation
# (pod/progress.py; default 2). A user with hundreds of jobs per API server may raise it.
PROGRESS_INTERVAL_SECONDS = "RTJ_PROGRESS_INTERVAL_SECONDS"

# Optional, set by the user: the steps the job trains in all (pod/progress.py reports it beside the
# current step, for the operator's progress and ETA); ``total_steps=`` or ``steps(total)`` win.
TOTAL_STEPS = "RTJ_TOTAL_STEPS"

# Injected by the operator: the job's observed mean time between interruptions that rolled work
# back, in seconds (a one-hour prior before the first), for ``interval="auto"``
# (save/auto_interval.py).
MTBI_SECONDS = "RTJ_MTBI_SECONDS"
# With it: the interruptions it was computed over, those that rolled work back (the runtime
# grows the MTBI by its own time up over this count plus one, as the operator would).
INTERRUPTIONS = "RTJ_INTERRUPTIONS"

# Optional: "0" turns off the download of RTJ_RESUME_FROM at import (resume/warm_start.py).
PREFETCH = "RTJ_PREFETCH"
# Set to "1" by the in-pod agent on the workers it starts for a membership it read from its
# file (a restart in place, a standby pod's start), and by the operator on the new pods of a
# gang that keeps survivors (they join pods that may still be saving): the old gang may still
# be saving, so the download at import waits until node rank 0's agent says those saves are
# over, then fetches the run's newest checkpoint (resume/warm_start.py; a process that has not
# imported torch yet fetches without the wait). Not in ALL_RTJ: only those pods get it.
MEMBERSHIP_CHANGED = "RTJ_MEMBERSHIP_CHANGED"

# Where the in-cluster service-account token and CA live (the kubelet's default; a local pod
# runner points it elsewhere). With KUBERNETES_SERVICE_HOST/PORT, used to annotate our own pod.
SERVICEACCOUNT_DIR = "RTJ_SERVICEACCOUNT_DIR"
KUBERNETES_SERVICE_HOST = "KUBERNETES_SERVICE_HOST"
KUBERNETES_SERVICE_PORT = "KUBERNETES_SERVICE_PORT"

# Local staging folder for checkpoints whose folder is an object-store URI.
LOCAL_CHECKPOINT_DIR = "RTJ_LOCAL_CHECKPOINT_DIR"

# Composer-compatible spelling of the S3 endpoint; boto3's own AWS_ENDPOINT_URL(_S3) also work.
S3_ENDPOINT_URL = "S3_ENDPOINT_URL"
# boto3's endpoint variables (it reads them itself; a set one wins over S3_ENDPOINT_URL).
AWS_ENDPOINT_URL_S3 = "AWS_ENDPOINT_URL_S3"
AWS_ENDPOINT_URL = "AWS_ENDPOINT_URL"
# The region, as the AWS CLI and most SDKs read it; botocore reads only AWS_DEFAULT_REGION.
AWS_REGION = "AWS_REGION"
# boto3's own variables, named in the messages for a value boto3 refuses.
AWS_DEFAULT_REGION = "AWS_DEFAULT_REGION"
AWS_PROFILE = "AWS_PROFILE"
AWS_DEFAULT_PROFILE = "AWS_DEFAULT_PROFILE"
AWS_REQUEST_CHECKSUM_CALCULATION = "AWS_REQUEST_CHECKSUM_CALCULATION"
AWS_RESPONSE_CHECKSUM_VALIDATION = "AWS_RESPONSE_CHECKSUM_VALIDATION"

ALL_RTJ = (
    JOB_NAME,
    NAMESPACE,
    RUN_NAME,
    ATTEMPT,
    POD_NAME,
    CHECKPOINT_DIR,
    RESUME_FROM,
    QUARANTINED,
    NOTICE_FILE,
    GRACE_PERIOD_SECONDS,
    REPORT_FILE,
    MEMBERSHIP_EPOCH,
    MEMBERSHIP_FILE,
    REJOIN_SECONDS,
    LOSS_HOLD_SECONDS,
    MTBI_SECONDS,
    INTERRUPTIONS,
)
"""Every RTJ_* variable the operator may inject; the contract test compares this tuple."""

# Annotations shared with the operator (the runtime reads the notice and the membership through
# downward API files; it writes only annotations of its own pod, pod/own_pod.py).
NOTICE_ANNOTATION = "resumable.dev/preemption-notice"
# Written by rank 0 onto its own pod: the last committed checkpoint and the current step.
PROGRESS_ANNOTATION = "resumable.dev/progress"
# Written by the operator onto every pod of a gang that changes membership in place; the agent
# reads it through the downward API file RTJ_MEMBERSHIP_FILE.
MEMBERSHIP_ANNOTATION = "resumable.dev/membership"
# Written by a standby pod's agent onto its own pod once it is warm (JSON: the epoch it waits to
# join, the seconds its start took); the operator then switches the gang to the new membership.
AGENT_READY_ANNOTATION = "resumable.dev/agent-ready"
# Written by a kept worker onto its own pod when its collective fails (a peer is gone; JSON: the
# membership epoch of the gang that broke, when). The operator then checks the gang's nodes'
# Leases, and takes a node whose kubelet went silent as lost without waiting for NotReady.
PEER_LOST_ANNOTATION = "resumable.dev/peer-lost"
