"""Fixtures shared by every suite: prerequisites, the one local control plane, namespaces.

One control plane serves every suite that needs one in a test session (tests/cluster,
tests/podrunner, tests/delivery, tests/e2e): a cold start costs tens of seconds, and starting one
per suite made ``make test`` pay it four times. It is started on first use, reused when a
cluster of that name already runs, and deleted at the end of the session when the session
started it. Tests share it safely because each works in its own namespace (``namespace``
fixture) and on its own nodes. tests/realnodes keeps its own: its API server must listen on a
non-loopback address for kubelets in other network namespaces.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tools.waiting import wait_for

if TYPE_CHECKING:
    from tools.controlplane import ControlPlane

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
TEST_CLUSTER_NAME = os.environ.get("RTJ_TEST_CLUSTER_NAME", "rtj-test")
"""The shared control plane's name (``RTJ_CLUSTER_NAME`` of ``hack/cluster/cluster.sh``)."""


def require(condition: bool, reason: str) -> None:
    """Skip locally when a prerequisite is missing, but fail loudly in CI (CI=true)."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"prerequisite missing in CI: {reason}")
    pytest.skip(reason)


def unique(prefix: str) -> str:
    """A fresh DNS-safe name."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """The session's local control plane (no kwok nodes: tests add the nodes they need).

    ``RTJ_TEST_KEEP_CLUSTER=1`` leaves it up at the end (and the next session reuses it).
    """
    # Imported here, not at the top: the runtime's suites (tests/unit, tests/multiproc) run
    # with the runtime extra alone, without the operator's Kubernetes client.
    from tools.controlplane import (
        CLUSTER_SH,
        ControlPlane,
        ControlPlaneError,
        binaries_ready,
    )

    require(CLUSTER_SH.exists(), f"{CLUSTER_SH} is missing")
    if not IN_CI:
        # Locally, never start a tens-of-minutes build from a test run.
        require(
            binaries_ready(),
            "control-plane binaries not built: run hack/cluster/build.sh",
        )
    plane = ControlPlane(TEST_CLUSTER_NAME, keep=os.environ.get("RTJ_TEST_KEEP_CLUSTER") == "1")
    try:
        plane.up(nodes=0, timeout=1800 if IN_CI else 540)
    except ControlPlaneError as err:
        pytest.fail(str(err))
    yield plane
    plane.down(wait=30)


@pytest.fixture(scope="session")
def kubeconfig(request: pytest.FixtureRequest) -> str:
    """KUBECONFIG of the cluster under test: ``KUBECONFIG`` when set, else the shared local
    control plane (started only then). Suites that must run on the local control plane
    (tests/delivery, tests/e2e) use ``control_plane`` directly."""
    given = os.environ.get("KUBECONFIG")
    if given:
        require(Path(given).exists(), f"KUBECONFIG={given} does not exist")
        return given
    plane: ControlPlane = request.getfixturevalue("control_plane")
    return plane.kubeconfig


NamespaceFactory = Callable[..., str]


@pytest.fixture
def make_namespace(kubeconfig: str) -> Iterator[NamespaceFactory]:
    """Create namespaces in the cluster under test; each is deleted after the test.

    ``make_namespace(prefix, labels=None)`` waits for the namespace's default ServiceAccount
    (pods need it) and returns the name.
    """
    from tools.kubeapi import ApiError, Kube

    kube = Kube(kubeconfig)
    made: list[str] = []

    def make(prefix: str = "rtj-test", labels: dict[str, str] | None = None) -> str:
        name = unique(prefix)
        meta: dict[str, object] = {"name": name}
        if labels:
            meta["labels"] = labels
        kube.request("POST", "/api/v1/namespaces", body={"apiVersion": "v1", "metadata": meta})
        made.append(name)
        wait_for(
            f"namespace {name}'s default ServiceAccount",
            lambda: kube.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
            60,
        )
        return name

    yield make
    for name in made:
        try:
            kube.request("DELETE", f"/api/v1/namespaces/{name}")
        except ApiError as err:
            if not err.not_found:
                raise
