"""The whole system on one machine: control plane, chart, S3, pod-runner nodes and the operator.

Shared by ``make demo`` (``examples/demo_cluster.py``) and the e2e suite (``tests/e2e``), so the
demo a user runs and the test CI runs are the same code path:

1. the cluster binaries (``hack/cluster/build.sh``) and MinIO (``hack/s3/build-minio.sh``),
   built once into the user's cache, or reused (``binaries``);
2. the local control plane (``hack/cluster/cluster.sh up``, its own cluster name) (``cluster``);
3. the operator's Helm chart, installed as a user would, with the Deployment scaled to 0: no
   container runtime runs here, so the operator runs as a local process instead, **with the
   chart's ServiceAccount token and the Deployment's own arguments** (``chart``);
4. an S3 server on 127.0.0.1 (``tools/s3server.py``: MinIO, else moto) (``workspace``);
5. one pod-runner agent process per Node (``tools/podrunner``), so a node can be lost alone
   (``nodes``).

On top of the stack: the uninterrupted reference run (``reference``) and the narrator
(``narrator``). What they know about the runtime they read from its structured events
(``facts``; ``trainer_runtime/events.py``), never from its log wording. The spot story runs on
the stack through ``tools.spotcluster.PodRunnerCluster`` (``tools/stories/spot.py``).

This package's root re-exports every public name, so ``from tools.localstack import ...`` does
not depend on which module a name lives in. Nothing here is product code: it is not in the wheel
and must never be pointed at a cluster with real nodes (the pod runner would run pods there as
local processes).
"""

from __future__ import annotations

import sys

from .common import REPO

if str(REPO) not in sys.path:  # imported from a script outside the repository (the demo)
    sys.path.insert(0, str(REPO))

from .base import StackBase, StackConfig, Timings
from .binaries import build_cluster_binaries, build_minio, minio_ready
from .common import (
    CHART,
    MINIO_SH,
    NODE_PREFIX,
    NOT_SCHEDULABLE,
    OPERATOR_DIR,
    OPERATOR_NAMESPACE,
    RELEASE,
    RESULTS_CLAIM,
    S3_SECRET,
    Obj,
    Say,
    StackError,
    run_streaming,
)
from .facts import (
    EMERGENCY,
    committed_steps,
    emergency_save,
    fetched_from,
    interval_steps,
    last_resume,
    notice_checkpoint,
    resumed_step,
    started_fresh,
    training_command,
)
from .narrator import Narrator
from .process import Proc
from .reference import (
    ReferenceRun,
    script_command,
    start_reference_run,
    weights_equal,
    world_size,
)
from .stack import LocalStack

__all__ = [
    "CHART",
    "EMERGENCY",
    "MINIO_SH",
    "NODE_PREFIX",
    "NOT_SCHEDULABLE",
    "OPERATOR_DIR",
    "OPERATOR_NAMESPACE",
    "RELEASE",
    "REPO",
    "RESULTS_CLAIM",
    "S3_SECRET",
    "LocalStack",
    "Narrator",
    "Obj",
    "Proc",
    "ReferenceRun",
    "Say",
    "StackBase",
    "StackConfig",
    "StackError",
    "Timings",
    "build_cluster_binaries",
    "build_minio",
    "committed_steps",
    "emergency_save",
    "fetched_from",
    "interval_steps",
    "last_resume",
    "minio_ready",
    "notice_checkpoint",
    "resumed_step",
    "run_streaming",
    "script_command",
    "start_reference_run",
    "started_fresh",
    "training_command",
    "weights_equal",
    "world_size",
]
