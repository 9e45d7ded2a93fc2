"""The install notes Helm prints say what the release runs (``helm install --dry-run=client``
against the local control plane: Helm reads the server's version, nothing is installed)."""

from __future__ import annotations

import pytest

from .conftest import CHART, Cluster, apply_chart_crds


@pytest.mark.parametrize(
    ("values", "line"),
    [
        ((), "Replicas:        1 (kopf peering"),
        (("--set", "replicas=3"), "Replicas:        3 (kopf peering"),
        (("--set", "peering.enabled=false"), "Replicas:        1 (standalone"),
        (
            ("--set", "peering.enabled=false", "--set", "replicas=0"),
            "Replicas:        0 (standalone",
        ),
    ],
)
def test_notes_name_the_replicas_the_deployment_runs(
    cluster: Cluster, values: tuple[str, ...], line: str
) -> None:
    # A client-side dry run does not install crds/ (a real install does), yet it maps every
    # object against the server's kinds: the peering CRDs must be there, whichever test ran
    # before (some delete them).
    apply_chart_crds(cluster)
    proc = cluster.helm("install", "rtj-notes", str(CHART), "--dry-run=client", *values)
    assert line in proc.stdout.split("NOTES:", 1)[1]
