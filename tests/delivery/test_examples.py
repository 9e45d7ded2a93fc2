"""The plain job manifests of examples/jobs/: statically, then through the real API server.

Statically: every job parses with the operator's own model, runs examples/train_deterministic.py
with flags that script accepts, and refers only to objects its file defines. Against the API
server: ``kubectl apply --dry-run=server -f examples/jobs/`` (the CRD's schema and CEL rules,
strict field validation), and the rank-0 pod the operator would build from each job
(``rtj_operator.decide.manifests.build_pod``) through a server-side dry run too, so a bad pod
template fails here rather than when the operator creates the gang.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rtj_operator.api import names
from rtj_operator.api.api_types import parse_job
from rtj_operator.decide.manifests import build_pod

from .conftest import ROOT, Cluster, apply_chart_crds

EXAMPLES = ROOT / "examples" / "jobs"
SCRIPT = ROOT / "examples" / "train_deterministic.py"
FILES = sorted(EXAMPLES.glob("*.yaml"))
NAMESPACE = "rtj-delivery-examples"


def documents(path: Path) -> list[dict[str, Any]]:
    """The objects of one example file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def jobs(path: Path) -> list[dict[str, Any]]:
    """The ResumableTrainingJobs of one example file."""
    return [d for d in documents(path) if d["kind"] == names.KIND]


def script_flags() -> set[str]:
    """The long options examples/train_deterministic.py defines (read from its source)."""
    flags = set()
    for node in ast.walk(ast.parse(SCRIPT.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            flags |= {
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and str(a.value).startswith("--")
            }
    return flags


def test_the_examples_exist() -> None:
    assert {p.name for p in FILES} >= {"s3-job.yaml", "pvc-job.yaml"}
    for path in FILES:
        assert len(jobs(path)) == 1, f"{path.name}: one job per example"


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_job_parses_with_the_operator_model_and_runs_the_example_script(path: Path) -> None:
    (doc,) = jobs(path)
    assert doc["apiVersion"] == names.API_VERSION
    job = parse_job({**doc, "metadata": {**doc["metadata"], "namespace": "x"}})
    container = doc["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    assert command[:2] == ["python", "/app/examples/train_deterministic.py"], (
        "the runtime image ships examples/ under /app/examples"
    )
    unknown = {c.split("=")[0] for c in command[2:]} - script_flags()
    assert not unknown, f"{path.name}: train_deterministic.py has no {sorted(unknown)}"
    # The checkpoint location comes from the operator's environment, not from a flag.
    assert not any(c.startswith(("--folder", "--run-name")) for c in command)
    assert job.spec.replicas >= 2


def test_s3_example_takes_credentials_from_its_secret() -> None:
    docs = documents(EXAMPLES / "s3-job.yaml")
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    (job,) = jobs(EXAMPLES / "s3-job.yaml")
    assert job["spec"]["checkpoint"]["dir"].startswith("s3://")
    assert "volumeSource" not in job["spec"]["checkpoint"]
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        ref = env[key]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]


def test_shared_volume_example_mounts_its_claim() -> None:
    docs = documents(EXAMPLES / "pvc-job.yaml")
    (claim,) = [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    (job,) = jobs(EXAMPLES / "pvc-job.yaml")
    checkpoint = job["spec"]["checkpoint"]
    assert checkpoint["dir"].startswith("/")
    assert (
        checkpoint["volumeSource"]["persistentVolumeClaim"]["claimName"]
        == claim["metadata"]["name"]
    )
    # Ranks on different nodes, and a resumed gang on others again: the claim is shared.
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


@pytest.mark.cluster
def test_examples_pass_server_side_dry_run(cluster: Cluster) -> None:
    apply_chart_crds(cluster)
    cluster.ensure_namespace(NAMESPACE)
    proc = cluster.kubectl(
        "apply", "--dry-run=server", "-n", NAMESPACE, "-f", str(EXAMPLES), check=False
    )
    assert proc.returncode == 0, proc.stderr
    for path in FILES:
        for doc in documents(path):
            kind, name = doc["kind"].lower(), doc["metadata"]["name"]
            applied = [
                out
                for out in proc.stdout.splitlines()
                if out.startswith(kind) and f"/{name} " in out and "(server dry run)" in out
            ]
            assert applied, f"{kind}/{name} not applied:\n{proc.stdout}"


@pytest.mark.cluster
def test_examples_are_rejected_when_broken(cluster: Cluster) -> None:
    """The dry run above validates against the schema: a broken copy fails with the field."""
    apply_chart_crds(cluster)
    cluster.ensure_namespace(NAMESPACE)
    (doc,) = jobs(EXAMPLES / "pvc-job.yaml")
    broken = json.loads(json.dumps(doc))
    broken["spec"]["checkpoint"]["dir"] = "relative/path"
    broken["spec"]["replicass"] = 2
    proc = cluster.kubectl(
        "apply",
        "--dry-run=server",
        "-n",
        NAMESPACE,
        "-f",
        "-",
        stdin=json.dumps(broken),
        check=False,
    )
    assert proc.returncode != 0
    assert "spec.replicass" in proc.stderr or "spec.checkpoint.dir" in proc.stderr, proc.stderr


@pytest.mark.cluster
@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_rank_pod_of_each_example_passes_server_side_dry_run(cluster: Cluster, path: Path) -> None:
    apply_chart_crds(cluster)
    cluster.ensure_namespace(NAMESPACE)
    (doc,) = jobs(path)
    body = {
        **doc,
        "metadata": {
            **doc["metadata"],
            "namespace": NAMESPACE,
            "uid": "00000000-0000-0000-0000-000000000000",
        },
    }
    job = parse_job(body)
    pod = build_pod(job, 0, 0, resume_from="", quarantined=[])
    # The operator creates the ranks' ServiceAccount before their pods; so does this test.
    account = pod["spec"].get("serviceAccountName")
    if account and cluster.get("serviceaccount", account, "-n", NAMESPACE) is None:
        cluster.kubectl("create", "serviceaccount", account, "-n", NAMESPACE)
    proc = cluster.kubectl(
        "create", "--dry-run=server", "-f", "-", stdin=json.dumps(pod), check=False
    )
    assert proc.returncode == 0, f"{path.name}: rank pod rejected:\n{proc.stderr}"
