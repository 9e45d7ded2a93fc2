"""Fixtures of the full-story e2e: the whole system on the local control plane, once per module.

The stack (``tools/localstack/``, shared with ``make demo``) needs the pod runner, which runs
pods as local processes on Nodes it registers: that only makes sense on the project's own local
control plane, so this suite always runs on the session's shared local control plane
(``control_plane`` in ``tests/conftest.py``) and ignores ``KUBECONFIG``; the stack removes what
it created there (its namespace, nodes, PersistentVolume and Helm release) when it stops.
Locally a missing prerequisite skips it; with ``CI=true`` it fails (``make test`` builds the
binaries first: ``make tools``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require
from tools import localstack
from tools.controlplane import CLUSTER_SH, ControlPlane, binaries_ready
from tools.localstack import LocalStack, ReferenceRun, StackConfig

MANIFEST = Path(__file__).parent / "manifests" / "spot-job.yaml"


def say(line: str) -> None:
    """Narration goes to stdout: shown with ``-s``, and in the report of a failing test."""
    print(line, flush=True)


@pytest.fixture(scope="module")
def prerequisites() -> None:
    """Cluster binaries (``hack/cluster/build.sh``) and an S3 server (MinIO, else moto)."""
    from tools.s3server import minio_binary, moto_available

    if os.environ.get("KUBECONFIG"):
        say(
            "note: KUBECONFIG is ignored here: the full story runs on its own local control "
            "plane (the pod runner must never serve a cluster with real nodes)"
        )
    require(CLUSTER_SH.exists(), "hack/cluster/cluster.sh is missing")
    require(
        binaries_ready(),
        "control-plane binaries not built: run hack/cluster/build.sh",
    )
    require(
        minio_binary() is not None or moto_available(),
        "no S3 server: run hack/s3/build-minio.sh (or install moto[server])",
    )


@pytest.fixture(scope="module")
def reference(
    prerequisites: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ReferenceRun]:
    """The same training run uninterrupted, as plain processes, started before the cluster so
    it overlaps with the bring-up; tests ``wait()`` for its weights."""
    run = localstack.start_reference_run(MANIFEST, tmp_path_factory.mktemp("reference"))
    yield run
    run.kill()


@pytest.fixture(scope="module")
def stack(
    reference: ReferenceRun, control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalStack]:
    """Control plane, chart, S3, operator and three pod-runner nodes; always torn down."""
    with LocalStack(stack_config(control_plane, tmp_path_factory.mktemp("stack"))) as running:
        yield running


def stack_config(
    control_plane: ControlPlane, workdir: Path, prefix: str = "rtj-story", **extra: Any
) -> StackConfig:
    """A stack on the session's shared control plane, in a namespace of its own."""
    return StackConfig(
        workdir=workdir,
        cluster_name=control_plane.name,
        kubeconfig=Path(control_plane.kubeconfig),
        namespace=f"{prefix}-{uuid.uuid4().hex[:6]}",
        say=say,
        **extra,
    )
