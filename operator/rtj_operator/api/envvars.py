"""Names of every environment variable the operator injects: the operator half of the pod contract.

The runtime reads the same names from ``trainer_runtime.envvars`` (docs/operator.md). This copy
exists so the operator never imports the runtime package; a contract test compares both modules,
so a name changes in both halves at once or the suite fails.
"""

from __future__ import annotations

# torch.distributed conventions.
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"

# torchrun's own options, read from PET_<OPTION> (torch.distributed.argparse_util.env): with
# these, ``torchrun train.py`` in the container needs no rendezvous flags. A pod is one node.
TORCHRUN_NNODES = "PET_NNODES"
TORCHRUN_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
TORCHRUN_NODE_RANK = "PET_NODE_RANK"
TORCHRUN_MASTER_ADDR = "PET_MASTER_ADDR"
TORCHRUN_MASTER_PORT = "PET_MASTER_PORT"

# Identity of the job and of this attempt.
JOB_NAME = "RTJ_JOB_NAME"
NAMESPACE = "RTJ_NAMESPACE"
RUN_NAME = "RTJ_RUN_NAME"
ATTEMPT = "RTJ_ATTEMPT"
POD_NAME = "RTJ_POD_NAME"

# Where checkpoints live and where to resume from.
CHECKPOINT_DIR = "RTJ_CHECKPOINT_DIR"
RESUME_FROM = "RTJ_RESUME_FROM"
# Comma-separated checkpoint names the operator quarantined: the runtime never resumes from these.
QUARANTINED = "RTJ_QUARANTINED"

# Preemption handling.
NOTICE_FILE = "RTJ_NOTICE_FILE"
GRACE_PERIOD_SECONDS = "RTJ_GRACE_PERIOD_SECONDS"

# Membership without a restart (docs/survivors.md): the gang's epoch (only grows; the runtime
# fences every commit with it), the downward-API file of the membership annotation, how long a
# survivor waits for a new membership after its worker stopped, and how long a worker whose
# collective failed waits for it (as long as this operator may take to see a silent loss).
MEMBERSHIP_EPOCH = "RTJ_MEMBERSHIP_EPOCH"
MEMBERSHIP_FILE = "RTJ_MEMBERSHIP_FILE"
REJOIN_SECONDS = "RTJ_REJOIN_SECONDS"
LOSS_HOLD_SECONDS = "RTJ_LOSS_HOLD_SECONDS"
# "1" on the pods a warm grow adds (survivors.py): their agent warms up, says so in
# AGENT_READY_ANNOTATION and starts no worker before a membership names the pod. Not in
# ALL_RTJ: only those pods get it.
STANDBY = "RTJ_STANDBY"

# "1" on the new pods of an attempt that keeps survivors (survivors.py): a kept pod may still be
# saving the last finished step when they start, so their workers' download at import waits
# until node rank 0's agent says the old gang's saves are over. The agent sets it itself on the
# workers it restarts. Not in ALL_RTJ: only those pods get it.
MEMBERSHIP_CHANGED = "RTJ_MEMBERSHIP_CHANGED"
# Where the runtime writes its one-line progress report (the container's terminationMessagePath).
REPORT_FILE = "RTJ_REPORT_FILE"

# The job's observed mean time between interruptions, in seconds (mtbi.mtbi_seconds): the
# runtime's ``interval="auto"`` sets its save interval from it.
MTBI_SECONDS = "RTJ_MTBI_SECONDS"
# With it: the interruptions it was computed over, those that rolled work back (the runtime
# grows the MTBI by its own time up over this count plus one, as the operator would).
INTERRUPTIONS = "RTJ_INTERRUPTIONS"
# Not injected: a user may set it in the template; the runtime reports it as the job's total steps.
TOTAL_STEPS = "RTJ_TOTAL_STEPS"

TORCH = (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)
"""The torch.distributed variables, in the order the operator writes them."""

TORCHRUN = (
    TORCHRUN_NNODES,
    TORCHRUN_NPROC_PER_NODE,
    TORCHRUN_NODE_RANK,
    TORCHRUN_MASTER_ADDR,
    TORCHRUN_MASTER_PORT,
)
"""torchrun's options, in the order the operator writes them (a contract test compares)."""

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
"""Every RTJ_* variable the operator injects, in the runtime's order (a contract test compares)."""

# Pod annotations shared with the runtime.
NOTICE_ANNOTATION = "resumable.dev/preemption-notice"
"""Written by the operator when the pod's node is about to go; read by the runtime as a file."""
PROGRESS_ANNOTATION = "resumable.dev/progress"
"""Written by the runtime after every committed checkpoint; read by the operator."""
MEMBERSHIP_ANNOTATION = "resumable.dev/membership"
"""Written by the operator on each pod of a gang whose membership changes in place; read by the
in-pod agent as the file RTJ_MEMBERSHIP_FILE."""
AGENT_READY_ANNOTATION = "resumable.dev/agent-ready"
"""Written by a standby pod's agent once it is warm (the epoch it waits for); read by the
operator, which then gives every pod of the gang its new membership."""
PEER_LOST_ANNOTATION = "resumable.dev/peer-lost"
"""Written by a kept worker on its own pod when a collective of its gang failed (JSON: the epoch
of that gang); read by the operator, which then looks at the Leases of the gang's nodes
(``decide/nodes.py``) to find a node whose kubelet stopped renewing."""

# Read by the operator itself, from its own pod.
OPERATOR_POD_ID = "POD_ID"
"""The operator replica's peering identity; the chart's Deployment sets it to the pod name."""
IN_CLUSTER_HOST = "KUBERNETES_SERVICE_HOST"
"""Set by the kubelet in every pod: the operator then takes the in-cluster credentials of its
ServiceAccount, else a kubeconfig (``kube_transport.load_configuration``)."""
