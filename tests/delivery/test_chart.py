"""The Helm chart without a cluster: lint, rendering, values checks, RBAC and CRD sources.

What needs an API server (server-side dry runs, install/upgrade/uninstall) is in
``test_chart_cluster.py``.
"""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from rtj_operator.__main__ import parse_args
from rtj_operator.api import admission, envvars, rbac

from . import chart_sync
from .conftest import CHART, ROOT, render, run, template_fails

STANDARD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)

NAMESPACES = ("--set", "watch.mode=namespaces", "--set", "watch.namespaces={team-a,team-b}")
STANDALONE = ("--set", "peering.enabled=false")

# Value sets every rendering test runs with (the server-side dry run uses them too).
VALUE_SETS: dict[str, tuple[str, ...]] = {
    "default": (),
    "namespaces": NAMESPACES,
    "standalone": STANDALONE,
    "ha-debug": (
        "--set",
        "replicas=3",
        "--set",
        "operator.logLevel=debug",
        "--set",
        "metrics.enabled=false",
    ),
}


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The rendered objects of one kind."""
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The single rendered object of one kind."""
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator container of the rendered Deployment."""
    return one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def rule_set(rules: list[dict[str, Any]]) -> set[tuple[str, str, tuple[str, ...]]]:
    """Rules as comparable (group, resource, sorted verbs) triples."""
    return {
        (g, r, tuple(sorted(rule["verbs"])))
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }


def operator_rules(
    rules: tuple[tuple[list[str], list[str], list[str], str], ...], drop: set[str]
) -> set[tuple[str, str, tuple[str, ...]]]:
    """rbac.py's rules minus the resources the chart leaves out in this configuration."""
    return {
        (g, r, tuple(sorted(verbs)))
        for groups, resources, verbs, _ in rules
        for g in groups
        for r in resources
        if r not in drop
    }


def test_generated_parts_are_in_sync() -> None:
    problems = chart_sync.crd_problems() + chart_sync.doc_problems()
    assert not problems, (
        "\n".join(problems) + f"\nrun: {chart_sync.SYNC_COMMAND}  (from the repository root)"
    )


def test_chart_crds_are_the_generated_crds() -> None:
    """Parsed, the chart's CRDs are exactly the CRD documents of crds/ (nothing else)."""

    def crds(folder: Path) -> dict[str, Any]:
        out = {}
        for path in sorted(folder.glob("*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc and doc["kind"] == "CustomResourceDefinition":
                    out[doc["metadata"]["name"]] = doc
        return out

    chart_docs = [
        d for p in (CHART / "crds").glob("*.yaml") for d in yaml.safe_load_all(p.read_text()) if d
    ]
    assert all(d["kind"] == "CustomResourceDefinition" for d in chart_docs)
    assert crds(CHART / "crds") == crds(ROOT / "crds")
    assert "resumabletrainingjobs.resumable.dev" in crds(CHART / "crds")


def test_packaged_chart_embeds_the_crd_content(helm: str, tmp_path: Path) -> None:
    """The archive holds the chart's CRD file (a real file, not a link) with the generated CRD."""
    run([helm, "package", str(CHART), "--destination", str(tmp_path)])
    (archive,) = tmp_path.glob("resumable-training-operator-*.tgz")
    source = ROOT / "crds" / "resumable.dev_resumabletrainingjobs.yaml"
    with tarfile.open(archive) as tar:
        member = tar.getmember(f"resumable-training-operator/crds/{source.name}")
        assert member.isfile(), "the packaged CRD must be a file, not a link"
        extracted = tar.extractfile(member)
        assert extracted is not None
        packaged = extracted.read()
        assert packaged == (CHART / "crds" / source.name).read_bytes()
        assert yaml.safe_load(packaged) == yaml.safe_load(source.read_text())
        names = tar.getnames()
    assert "resumable-training-operator/values.schema.json" in names
    assert "resumable-training-operator/templates/NOTES.txt" in names


@pytest.mark.parametrize("values", list(VALUE_SETS.values()), ids=list(VALUE_SETS))
def test_helm_lint_strict(helm: str, values: tuple[str, ...]) -> None:
    proc = run([helm, "lint", "--strict", str(CHART), *values], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout
    assert "symbolic link" not in proc.stderr  # the chart ships real files


@pytest.mark.parametrize("values", list(VALUE_SETS.values()), ids=list(VALUE_SETS))
def test_every_object_has_the_standard_labels(helm: str, values: tuple[str, ...]) -> None:
    docs = render(helm, *values)
    for doc in docs:
        labels = doc["metadata"].get("labels") or {}
        missing = [k for k in STANDARD_LABELS if k not in labels]
        assert not missing, f"{doc['kind']}/{doc['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/instance"] == "rtj-operator"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


@pytest.mark.parametrize("values", list(VALUE_SETS.values()), ids=list(VALUE_SETS))
def test_operator_accepts_the_rendered_arguments(helm: str, values: tuple[str, ...]) -> None:
    """The Deployment's args parse with the operator's own argument parser."""
    args = parse_args(container(render(helm, *values))["args"])
    if "watch.mode=namespaces" in values:
        assert not args.all_namespaces and args.namespace == ["team-a", "team-b"]
    else:
        assert args.all_namespaces and args.namespace == []
    assert args.standalone == ("peering.enabled=false" in values)


def test_large_integers_in_a_values_file_render_as_integers(helm: str, tmp_path: Path) -> None:
    """YAML numbers reach the templates as floats: 2000000 rendered as ``2e+06``, which the
    operator's integer arguments refuse, so its pod would not start."""
    values = tmp_path / "values.yaml"
    values.write_text(
        "replicas: 1000000\noperator: {workers: 2000000}\npeering: {maxPauseSeconds: 3000000}\n"
    )
    docs = render(helm, "-f", str(values))
    assert one(docs, "Deployment")["spec"]["replicas"] == 1000000
    args = container(docs)["args"]
    assert "--workers=2000000" in args and "--max-pause-seconds=3000000" in args, args
    parsed = parse_args(args)
    assert parsed.workers == 2000000 and parsed.max_pause_seconds == 3000000


def test_default_deployment(helm: str) -> None:
    docs = render(helm)
    deploy = one(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    c = container(docs)
    args = parse_args(c["args"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}

    # Non-root, read-only root filesystem, nothing to escalate with (PodSecurity "restricted").
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])

    # The liveness probe hits the endpoint the operator is told to serve.
    assert args.liveness == f"http://0.0.0.0:{ports['health']}/healthz"
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert args.metrics_port == ports["metrics"]
    service = one(docs, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert (
        service["spec"]["selector"].items()
        <= deploy["spec"]["template"]["metadata"]["labels"].items()
    )
    assert deploy["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]

    # Peering on by default: the named peering object exists for kopf to find.
    assert args.peering == "rtj-operator" and not args.standalone
    assert one(docs, "ClusterKopfPeering")["metadata"]["name"] == args.peering
    assert deploy["spec"]["strategy"]["type"] == "RollingUpdate"
    assert one(docs, "ServiceAccount")["metadata"]["name"] == pod["serviceAccountName"]
    assert not by_kind(docs, "ServiceMonitor")


def test_rbac_all_namespaces_matches_operator_rbac(helm: str) -> None:
    docs = render(helm)
    roles = {r["metadata"]["name"]: r for r in by_kind(docs, "ClusterRole")}
    assert set(roles) == {
        "rtj-operator-cluster",
        "rtj-operator-jobs",
        "rtj-operator-edit",
        "rtj-operator-view",
    }
    assert rule_set(roles["rtj-operator-cluster"]["rules"]) == operator_rules(
        rbac.CLUSTER_RULES, drop=set()
    )
    assert rule_set(roles["rtj-operator-jobs"]["rules"]) == operator_rules(
        rbac.JOB_RULES, drop={"kopfpeerings"}
    )
    bindings = by_kind(docs, "ClusterRoleBinding")
    assert {b["roleRef"]["name"] for b in bindings} == {"rtj-operator-cluster", "rtj-operator-jobs"}
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "rtj-operator", "namespace": "rtj-system"}
        ]
    assert not by_kind(docs, "Role") and not by_kind(docs, "RoleBinding")


def test_rbac_namespaces_mode_grants_nothing_namespaced_elsewhere(helm: str) -> None:
    docs = render(helm, *NAMESPACES)
    (cluster_role,) = [
        r for r in by_kind(docs, "ClusterRole") if r["metadata"]["name"] == "rtj-operator-cluster"
    ]
    assert cluster_role["metadata"]["name"] == "rtj-operator-cluster"
    assert rule_set(cluster_role["rules"]) == operator_rules(
        rbac.CLUSTER_RULES, drop={"clusterkopfpeerings"}
    )
    assert [b["roleRef"]["name"] for b in by_kind(docs, "ClusterRoleBinding")] == [
        "rtj-operator-cluster"
    ]
    roles = by_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert rule_set(role["rules"]) == operator_rules(rbac.JOB_RULES, drop=set())
    role_bindings = by_kind(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in role_bindings) == ["team-a", "team-b"]
    for binding in role_bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "rtj-operator-jobs",
        }
        assert binding["subjects"][0]["namespace"] == "rtj-system"
    peerings = by_kind(docs, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]
    assert not by_kind(docs, "ClusterKopfPeering")


def test_standalone_has_no_peering_and_never_overlaps(helm: str) -> None:
    docs = render(helm, *STANDALONE)
    assert parse_args(container(docs)["args"]).standalone
    assert one(docs, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert not by_kind(docs, "ClusterKopfPeering") and not by_kind(docs, "KopfPeering")
    resources = {
        r
        for role in by_kind(docs, "ClusterRole")
        for rule in role["rules"]
        for r in rule["resources"]
    }
    assert not resources & {"clusterkopfpeerings", "kopfpeerings"}


def test_optional_parts(helm: str) -> None:
    docs = render(
        helm, "--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.labels.release=prom"
    )
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]

    bare = render(
        helm,
        "--set",
        "metrics.enabled=false",
        "--set",
        "rbac.create=false",
        "--set",
        "serviceAccount.create=false",
        "--set",
        "serviceAccount.name=mine",
        "--set",
        "peering.create=false",
        "--set",
        "admissionPolicy.enabled=false",
    )
    assert {d["kind"] for d in bare} == {"Deployment"}
    assert parse_args(container(bare)["args"]).metrics_port is None
    assert one(bare, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "mine"


BAD_VALUES = [
    (("--set", "replicas=-1"), "/replicas"),
    (("--set", "replicas=two"), "/replicas"),
    (("--set", "watch.mode=everything"), "/watch/mode"),
    (("--set", "watch.mode=namespaces"), "/watch/namespaces"),
    (
        ("--set", "watch.mode=namespaces", "--set", "watch.namespaces={Team_A}"),
        "/watch/namespaces/0",
    ),
    (("--set", "watch.namespaces={team-a}"), "watch.namespaces"),
    (("--set", "operator.logLevel=chatty"), "/operator/logLevel"),
    (("--set", "metrics.port=70000"), "/metrics/port"),
    (("--set", "metrics.port=8080"), "metrics.port"),
    (("--set", "image.pullPolicy=Sometimes"), "/image/pullPolicy"),
    (("--set", "replica=2"), "'replica'"),
    # Object names: a Service name starts with a letter and holds no capital or underscore.
    (("--set", "fullnameOverride=Team_A"), "/fullnameOverride"),
    (("--set", "fullnameOverride=1rtj"), "/fullnameOverride"),
    # A label value: no space.
    (("--set", "nameOverride=my app"), "/nameOverride"),
    (("--set", "peering.enabled=false", "--set", "replicas=2"), "peering.enabled"),
    (("--set", "serviceMonitor.enabled=true", "--set", "metrics.enabled=false"), "metrics.enabled"),
    (("--set", "serviceAccount.create=false"), "serviceAccount.name"),
    (
        ("--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.scrapeTimeout=1m1s"),
        "serviceMonitor.scrapeTimeout (1m1s) must not exceed serviceMonitor.interval (30s)",
    ),
]


@pytest.mark.parametrize(
    ("values", "field"), BAD_VALUES, ids=[" ".join(v[1::2]) for v, _ in BAD_VALUES]
)
def test_bad_values_fail_with_the_field_name(
    helm: str, values: tuple[str, ...], field: str
) -> None:
    error = template_fails(helm, *values)
    assert field in error, f"the error does not name {field}:\n{error}"


def test_versions_agree() -> None:
    """One version for the project (docs/install.md, Versions): the chart's version and
    appVersion, the operator's __version__ and every image tag the docs and examples give are
    pyproject.toml's."""
    import re
    import tomllib

    from rtj_operator import __version__

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert str(chart["version"]) == chart["appVersion"] == __version__ == version
    places = [ROOT / "README.md", ROOT / "Dockerfile", *sorted((ROOT / "docs").glob("*.md"))]
    places += sorted((ROOT / "examples").rglob("*.yaml"))
    tags = {
        f"{path.relative_to(ROOT)}: {m.group(0)}"
        for path in places
        for m in re.finditer(r"\brtj-(?:operator|train):(\d+\.\d+\.\d+)", path.read_text())
        if m.group(1) != version
    }
    assert not tags, f"image tags other than the project's version {version}: {sorted(tags)}"


def test_the_peering_lifetime_minimum_is_the_operators() -> None:
    """One fact in two places: the chart refuses what the operator's flag check refuses."""
    import json

    from rtj_operator.__main__ import MIN_PEERING_LIFETIME

    schema = json.loads((CHART / "values.schema.json").read_text())
    lifetime = schema["properties"]["peering"]["properties"]["lifetime"]
    assert lifetime["minimum"] == MIN_PEERING_LIFETIME


def test_aggregated_roles_match_operator_rbac(helm: str) -> None:
    roles = {r["metadata"]["name"]: r for r in by_kind(render(helm), "ClusterRole")}
    labels = roles["rtj-operator-edit"]["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert rule_set(roles["rtj-operator-edit"]["rules"]) == operator_rules(
        rbac.USER_EDIT_RULES, drop=set()
    )
    view = roles["rtj-operator-view"]
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert rule_set(view["rules"]) == operator_rules(rbac.USER_VIEW_RULES, drop=set())
    off = {
        r["metadata"]["name"]
        for r in by_kind(render(helm, "--set", "rbac.aggregate=false"), "ClusterRole")
    }
    assert "rtj-operator-edit" not in off and "rtj-operator-view" not in off


def _squeeze(value: Any) -> Any:
    """CEL expressions compared without their line breaks (YAML folding)."""
    if isinstance(value, str):
        return " ".join(value.split())
    if isinstance(value, dict):
        return {k: _squeeze(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_squeeze(v) for v in value]
    return value


def test_admission_policy_is_the_generated_one(helm: str) -> None:
    docs = render(helm)
    policy = one(docs, "ValidatingAdmissionPolicy")
    assert _squeeze(policy["spec"]) == _squeeze(admission.policy_spec())
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert not by_kind(
        render(helm, "--set", "admissionPolicy.enabled=false"), "ValidatingAdmissionPolicy"
    )


def test_a_1_29_cluster_installs_without_the_admission_policy(helm: str) -> None:
    """The chart supports 1.29 (its kubeVersion), where the policy's kind does not exist yet:
    rendering it there would fail the whole install."""
    on_1_29 = render(helm, "--kube-version", "1.29.3")
    assert not by_kind(on_1_29, "ValidatingAdmissionPolicy")
    assert not by_kind(on_1_29, "ValidatingAdmissionPolicyBinding")
    assert by_kind(on_1_29, "Deployment")
    assert one(render(helm, "--kube-version", "1.30.0"), "ValidatingAdmissionPolicy")


def test_deployment_passes_a_stable_peering_identity(helm: str) -> None:
    operator = container(render(helm))
    env = {e["name"]: e for e in operator["env"]}
    assert env[envvars.OPERATOR_POD_ID]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    args = parse_args(operator["args"])
    assert args.peering_lifetime == 15 and args.max_pause_seconds == 30
    args = parse_args(container(render(helm, "--set", "peering.maxPauseSeconds=90"))["args"])
    assert args.max_pause_seconds == 90


def _notes(helm: str, tmp_path: Path, *args: str) -> str:
    """The install notes as Helm renders them for the given ``--kube-version``: ``helm template``
    skips NOTES.txt, so a copy of the chart renders the same file through ``tpl`` into a
    ConfigMap (the same values, helpers and ``.Capabilities``)."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    (chart / "notes-as-data.txt").write_text((CHART / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "zz-notes-as-data.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: rendered-notes\n"
        'data:\n  notes: {{ tpl (.Files.Get "notes-as-data.txt") . | toJson }}\n'
    )
    proc = run([helm, "template", "rtj-operator", str(chart), *args])
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return next(d for d in docs if d["metadata"]["name"] == "rendered-notes")["data"]["notes"]


def test_the_notes_say_when_a_1_29_cluster_gets_no_admission_policy(
    helm: str, tmp_path: Path
) -> None:
    """On 1.29 the policy is left out (above), and the install notes say so, with the version;
    on 1.30, or with the policy turned off, they do not."""
    on_1_29 = _notes(helm, tmp_path / "a", "--kube-version", "1.29.3")
    assert "admissionPolicy.enabled is true, but this cluster is Kubernetes v1.29.3" in on_1_29
    assert "ValidatingAdmissionPolicy needs 1.30 or newer, so it was not installed" in on_1_29
    assert "Serving jobs in: every namespace" in on_1_29  # the rest renders as usual
    on_1_30 = _notes(helm, tmp_path / "b", "--kube-version", "1.30.0")
    assert "Serving jobs in: every namespace" in on_1_30
    assert "ValidatingAdmissionPolicy needs" not in on_1_30
    off = _notes(
        helm, tmp_path / "c", "--kube-version", "1.29.3", "--set", "admissionPolicy.enabled=false"
    )
    assert "ValidatingAdmissionPolicy needs" not in off
