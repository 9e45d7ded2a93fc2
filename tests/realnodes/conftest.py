"""Fixtures for tests on real nodes: kubelet + containerd joined to the local control plane.

One session brings up the control plane (``hack/cluster/cluster.sh``, no fake nodes, API server
bound to every address so pods and nodes in other network namespaces reach it), three real nodes
with CoreDNS (``hack/cluster/nodes.sh``), and loads the project's images, built by buildah
without a registry (``hack/images/build.sh``), into the nodes: ``tools/realnodes.py``, the
bring-up ``make demo NODES=real`` uses too. The runtime image (torch, several
GiB) goes to nodes 1 and 3, where the tests that need it run; the job story loses node 3.

The suite is part of ``make test`` (and of a plain ``pytest``); ``make test-realnodes`` runs it
alone. It needs root: without root, or without the Debian tools and the built images, it is
skipped with the reason, except under ``CI=true``, where it installs and builds what is missing
(tens of minutes cold) and fails when it cannot.

Tests drive the cluster with ``kubectl``, as a user would (``logs``, ``exec``, ``delete``),
rather than through a client library: what is checked is what a user sees.

``RTJ_REALNODES_KEEP=1`` keeps the cluster and its nodes after the session and reuses them in
the next one (images already imported are not imported again); ``RTJ_REALNODES_CLUSTER_NAME``
names the cluster (default ``rtj-realnodes``).

This is the one suite that does not use the session's shared control plane
(``tests/conftest.py``): its API server must listen beyond 127.0.0.1 for kubelets and pods in
other network namespaces, and real nodes in the shared cluster would be offered the pods of the
kwok and pod-runner suites, whose images do not exist.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import IN_CI, require
from tools.realnodes import (
    REPO,
    RealCluster,
    RealNodes,
    RealNodesError,
    artifacts,
    build_all,
    install_tools,
    missing_prerequisites,
    operator_release,
)
from tools.waiting import wait_for

__all__ = ["REPO", "RealCluster", "operator_release", "wait_for"]

CLUSTER_NAME = os.environ.get("RTJ_REALNODES_CLUSTER_NAME", "rtj-realnodes")
SESSION_TIMEOUT_S = 2400
LOSE = ("test_job_story.py", "test_realnodes.py", "test_node_comes_back.py")
"""Files whose tests lose a node for good, in the order they run, after every other file's."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in this folder runs on real nodes.

    Their time limit covers the session fixture too, which the first test pays: bringing up
    the nodes and importing the runtime image (several GiB) into two of them takes minutes.
    """
    here = Path(__file__).parent
    ours = [i for i, item in enumerate(items) if here in Path(str(item.fspath)).parents]
    for i in ours:
        items[i].add_marker(pytest.mark.realnodes)
        items[i].add_marker(pytest.mark.timeout(SESSION_TIMEOUT_S))

    # The tests that lose a node run last: test_realnodes.py loses node 2 (where the chart's
    # operator runs), the job story node 3, and test_node_comes_back.py node 1; the others need
    # all three.
    def lose_order(item: pytest.Item) -> int:
        name = Path(str(item.fspath)).name
        return LOSE.index(name) + 1 if name in LOSE else 0

    block = sorted((items[i] for i in ours), key=lose_order)
    for i, item in zip(ours, block, strict=True):
        items[i] = item


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[RealCluster]:
    """The control plane with three real nodes, CoreDNS, and the project's images loaded."""
    missing = missing_prerequisites()
    if missing and IN_CI and os.geteuid() == 0:
        try:
            install_tools()
        except RealNodesError as err:
            pytest.fail(str(err))
        missing = missing_prerequisites()
    require(not missing, f"real nodes need {', '.join(missing)}")
    nodes = RealNodes(CLUSTER_NAME, keep=os.environ.get("RTJ_REALNODES_KEEP") == "1")
    built = artifacts(nodes.env)
    if built.missing:
        # Under CI they are built here (tens of minutes cold); locally, by `make images tools`.
        require(IN_CI, f"not built: {', '.join(built.missing)} (make images tools)")
    try:
        archives = build_all(nodes.env)
        with nodes.up(archives) as cluster:
            yield cluster
    except RealNodesError as err:
        pytest.fail(str(err))


@pytest.fixture
def ns(real_cluster: RealCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards."""
    name = f"rn-{request.node.name.replace('_', '-')[5:40].strip('-')}-{os.getpid() % 1000}"
    real_cluster.create_namespace(name)
    yield name
    real_cluster.kubectl_run("delete", "namespace", name, "--wait=false", check=False)
