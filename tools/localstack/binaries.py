"""Building, or finding in the cache, what the stack runs: the cluster binaries and MinIO.

Apart from the stack itself because the demo builds them before anything starts (and narrates
the slow first build), while the e2e suite only checks that they are there.
"""

from __future__ import annotations

import subprocess

from tools.controlplane import BUILD_SH
from tools.controlplane import binaries_ready as cluster_binaries_ready

from .common import MINIO_SH, Say, StackError, _quiet, run_streaming


def build_cluster_binaries(say: Say = _quiet) -> None:
    """Build or reuse the control plane (slow only the first time), narrating its progress."""
    if cluster_binaries_ready():
        say("cluster binaries: cached")
        return
    say(
        "cluster binaries: building Kubernetes, etcd, kwok and helm from the Go module proxy "
        "(about 30 minutes the first time on 2 cores; cached afterwards)"
    )
    run_streaming([str(BUILD_SH)], say, "  build: ")


def minio_ready() -> bool:
    """Whether the pinned MinIO is built."""
    return (
        subprocess.run([str(MINIO_SH), "--path"], capture_output=True, check=False).returncode == 0
    )


def build_minio(say: Say = _quiet) -> bool:
    """Build or reuse MinIO; False (with a note) when it cannot be built here (no Go)."""
    if minio_ready():
        say("MinIO: cached")
        return True
    say("MinIO: building from source (about 20 minutes the first time; cached afterwards)")
    try:
        run_streaming([str(MINIO_SH)], say, "  minio: ")
    except StackError as err:
        say(f"MinIO: build failed, falling back to moto ({str(err).splitlines()[0]})")
        return False
    return True
