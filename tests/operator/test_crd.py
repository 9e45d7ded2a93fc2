"""The CRD is generated from the models, structural, and carries the documented API surface."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from rtj_operator.api import crdgen, envvars, names
from rtj_operator.api.api_types import parse_job

from .fakes import job_body

ROOT = Path(__file__).resolve().parents[2]


def _walk(schema: dict[str, Any], path: str = ""):
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def _schema() -> dict[str, Any]:
    return crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_generated_files_are_up_to_date():
    """Drift test: edit a model without running `python -m rtj_operator.api.crdgen` and this
    fails."""
    assert crdgen.main(["--check", "--root", str(ROOT)]) == 0


def test_crd_file_parses_as_the_generated_object():
    docs = list(yaml.safe_load_all((ROOT / crdgen.CRD_FILE).read_text()))
    assert docs == [crdgen.crd()]


def test_schema_is_structural():
    """Every node has a type (or preserves unknown fields) and no JSON-Schema-only keyword."""
    forbidden = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "const", "title"}
    for path, node in _walk(_schema()):
        assert not forbidden & node.keys(), path
        assert (
            "type" in node
            or node.get("x-kubernetes-preserve-unknown-fields")
            or node.get("x-kubernetes-int-or-string")
        ), path
        if node.get("x-kubernetes-preserve-unknown-fields"):
            assert "additionalProperties" not in node, path


def test_every_spec_and_status_field_is_documented():
    from rtj_operator.api.schema import structural_schema
    from rtj_operator.api.spec_types import JobSpec
    from rtj_operator.api.status_types import JobStatus

    # The models' own fields (the embedded core pod schema carries no descriptions).
    ours = {
        "properties": {
            "spec": structural_schema(JobSpec),
            "status": structural_schema(JobStatus),
        }
    }
    for path, node in _walk(ours):
        is_field = not path.endswith(("[]", "{}"))
        if is_field and path.count(".") >= 2 and path.startswith((".spec", ".status")):
            assert node.get("description"), f"{path} has no description"


def test_names_short_name_status_subresource_and_columns():
    spec = crdgen.crd()["spec"]
    assert spec["group"] == "resumable.dev"
    assert spec["names"]["plural"] == "resumabletrainingjobs"
    assert spec["names"]["shortNames"] == ["rtj"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase"
    assert columns["Attempt"] == ".status.attempt"
    assert columns["Preemptions"] == ".status.preemptions"
    assert columns["Failures"] == ".status.failures"
    assert columns["Retries"] == ".status.retries"
    assert columns["Step"] == ".status.lastCommittedCheckpoint.step"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_defaults_are_applied_by_the_api_server():
    spec = _schema()["properties"]["spec"]["properties"]
    assert spec["masterPort"]["default"] == 29500
    assert spec["suspend"]["default"] is False
    assert spec["resumePolicy"]["default"]["backoffLimit"] == 6
    policy = spec["resumePolicy"]["properties"]
    assert policy["backoffLimit"]["default"] == 6
    assert "default" not in policy["maxPreemptions"]  # unlimited
    taints = spec["preemptionSignals"]["properties"]["terminationTaints"]["default"]
    keys = {t["key"] for t in taints}
    assert {
        "node.kubernetes.io/out-of-service",
        "ToBeDeletedByClusterAutoscaler",
        "aws-node-termination-handler/spot-itn",
        "cloud.google.com/impending-node-termination",
    } <= keys


def test_processes_per_pod_defaults_to_one_is_bounded_and_immutable():
    field = _schema()["properties"]["spec"]["properties"]["processesPerPod"]
    assert (field["default"], field["minimum"], field["maximum"]) == (1, 1, 256)
    assert [r["message"] for r in field["x-kubernetes-validations"]] == [
        "processesPerPod is immutable"
    ]
    assert parse_job(job_body()).spec.processes_per_pod == 1
    with pytest.raises(ValidationError, match=r"processes_per_pod|processesPerPod"):
        parse_job(job_body(processesPerPod=0))


def test_cel_rules_name_their_fields():
    root = _schema()
    rules = [r["message"] for r in root["x-kubernetes-validations"]]
    assert any("metadata.name" in m for m in rules)
    spec = root["properties"]["spec"]
    paths = {r.get("fieldPath") for r in spec["x-kubernetes-validations"]}
    assert {".containerName", ".runName"} <= paths
    policy = spec["properties"]["resumePolicy"]["x-kubernetes-validations"][0]
    assert policy["fieldPath"] == ".backoffBaseSeconds"  # the value the user set
    assert "(600 when not set)" in policy["message"]
    # A field's own rule (immutability) adds to its type's rules instead of replacing them.
    checkpoint = [r["rule"] for r in spec["properties"]["checkpoint"]["x-kubernetes-validations"]]
    assert "self == oldSelf" in checkpoint and any("volumeSource" in r for r in checkpoint)


def test_status_conditions_are_a_map_list():
    conds = _schema()["properties"]["status"]["properties"]["conditions"]
    assert conds["x-kubernetes-list-type"] == "map"
    assert conds["x-kubernetes-list-map-keys"] == ["type"]


def test_env_contract_names():
    assert all(name.startswith("RTJ_") for name in envvars.ALL_RTJ)
    assert len(set(envvars.ALL_RTJ)) == len(envvars.ALL_RTJ)
    assert envvars.NOTICE_ANNOTATION == "resumable.dev/preemption-notice"
    assert envvars.PROGRESS_ANNOTATION == "resumable.dev/progress"
    assert names.CRD_NAME == "resumabletrainingjobs.resumable.dev"


def test_rbac_manifest_lists_what_the_operator_writes():
    docs = list(yaml.safe_load_all((ROOT / crdgen.RBAC_FILE).read_text()))
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    jobs = {
        (g, r): set(rule["verbs"])
        for rule in roles["rtj-operator-jobs"]["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert {"create", "delete", "patch", "list", "watch"} <= jobs[("", "pods")]
    assert "patch" in jobs[("resumable.dev", "resumabletrainingjobs/status")]
    assert "patch" not in jobs[("resumable.dev", "resumabletrainingjobs")]  # never writes spec
    cluster = {r for rule in roles["rtj-operator-cluster"]["rules"] for r in rule["resources"]}
    assert "nodes" in cluster


def test_the_pod_template_is_a_typed_core_pod_template_spec():
    """Unknown fields inside the template are rejected, not kept: nothing is open any more."""
    template = _schema()["properties"]["spec"]["properties"]["template"]
    for path, node in _walk(template, ".spec.template"):
        if node.get("x-kubernetes-preserve-unknown-fields"):
            assert path.endswith(".fieldsV1"), path  # managedFields' free-form payload only
    pod = template["properties"]["spec"]["properties"]
    assert {"tolerations", "nodeSelector", "affinity", "initContainers", "volumes"} <= set(pod)
    container = pod["containers"]["items"]["properties"]
    assert "resources" in container and "resourcez" not in container
    assert container["name"]["pattern"] == "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
    assert pod["restartPolicy"]["enum"] == ["Never"]
    assert pod["terminationGracePeriodSeconds"]["maximum"] == 86400
    assert pod["containers"]["maxItems"] == 64  # keeps the CEL cost of containerName bounded
    limits = container["resources"]["properties"]["limits"]["additionalProperties"]
    assert limits == {"x-kubernetes-int-or-string": True}


TAINT_KEYS_OK = [
    "ToBeDeletedByClusterAutoscaler",
    "karpenter.sh/disrupted",
    "example.com/Spot_Reclaim.v2",
    "a",
    "x" * 63,
    "p" * 253 + "/" + "n" * 63,
]
TAINT_KEYS_BAD = [
    "spot reclaim",  # a space
    "-leading-dash",
    "trailing.",
    "Example.com/upper-case-prefix",
    "example.com/",  # empty name
    "/no-prefix",
    "a/b/c",
    "x" * 64,  # name over 63
    "p" * 254 + "/name",  # prefix over 253
    "exa mple.com/name",
]


def _taint_body(key: str) -> dict[str, Any]:
    return job_body(preemptionSignals={"terminationTaints": [{"key": key}]})


@pytest.mark.parametrize("key", TAINT_KEYS_OK)
def test_termination_taint_keys_that_kubernetes_accepts_pass(key):
    job = parse_job(_taint_body(key))
    assert [t.key for t in job.spec.preemption_signals.termination_taints] == [key]


@pytest.mark.parametrize("key", TAINT_KEYS_BAD)
def test_termination_taint_keys_that_are_no_taint_key_are_rejected(key):
    """The operator's own parse rejects them, naming the field and the expected form."""
    with pytest.raises(ValidationError) as caught:
        parse_job(_taint_body(key))
    text = str(caught.value)
    assert "terminationTaints" in text and "key" in text
    assert "taint key" in text and "at most 63 characters" in text


@pytest.mark.parametrize(
    ("value", "ok"),
    [("true", True), ("", True), ("spot-1.a_b", True), ("has space", False), ("-x", False)],
)
def test_termination_taint_values_are_label_values(value, ok):
    """Kubernetes takes a label value as a taint value; any other string never matches a
    node's taint, and only its length was checked."""
    body = job_body(preemptionSignals={"terminationTaints": [{"key": "k", "value": value}]})
    if ok:
        taints = parse_job(body).spec.preemption_signals.termination_taints
        assert [t.value for t in taints] == [value]
        return
    with pytest.raises(ValidationError) as caught:
        parse_job(body)
    assert "terminationTaints" in str(caught.value) and "value" in str(caught.value)


def test_the_crd_checks_termination_taint_keys_like_the_api_server_checks_taints():
    """The API server applies the key's schema pattern and CEL rule: every key Kubernetes takes
    as a taint key passes the pattern, the others fail it or the prefix length rule."""
    import re

    items = _schema()["properties"]["spec"]["properties"]["preemptionSignals"]["properties"][
        "terminationTaints"
    ]["items"]
    key = items["properties"]["key"]
    pattern = re.compile(key["pattern"])
    for ok in TAINT_KEYS_OK:
        assert pattern.search(ok) and len(ok) <= key["maxLength"], ok
    (rule,) = key["x-kubernetes-validations"]
    assert "253" in rule["message"] and "prefix" in rule["message"]
    long_prefix = re.compile(rule["rule"].removeprefix("!self.matches('").removesuffix("')"))
    for bad in TAINT_KEYS_BAD:
        too_long = len(bad) > key["maxLength"] or long_prefix.search(bad)
        assert not pattern.search(bad) or too_long, bad
    assert "taint key" in key["description"]


OPERATOR_SET_METADATA = {
    "name": "pinned",
    "generateName": "rank-",
    "namespace": "elsewhere",
    "finalizers": ["example.com/keep"],
    "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u"}],
    "uid": "0000",
    "resourceVersion": "7",
}


@pytest.mark.parametrize("field", sorted(OPERATOR_SET_METADATA))
def test_template_metadata_the_operator_sets_is_rejected_naming_the_field(field):
    """Pod names, namespace, owners, finalizers are the operator's: a value there used to be
    dropped without a word; the operator's parse now refuses it, naming the field."""
    body = job_body()
    body["spec"]["template"]["metadata"] = {
        "labels": {"team": "a"},
        field: OPERATOR_SET_METADATA[field],
    }
    with pytest.raises(ValidationError) as caught:
        parse_job(body)
    assert f"template.metadata.{field}" in str(caught.value)


def test_template_metadata_labels_and_annotations_pass():
    body = job_body()
    body["spec"]["template"]["metadata"] = {"labels": {"a": "b"}, "annotations": {"c": "d"}}
    assert parse_job(body).spec.template.metadata.labels == {"a": "b"}


def test_the_crd_rejects_every_template_metadata_field_but_labels_and_annotations():
    """One CEL rule per ObjectMeta field the operator does not copy, with the field's path, so
    the API server refuses it at apply time; a field a future schema adds fails this test."""
    meta = _schema()["properties"]["spec"]["properties"]["template"]["properties"]["metadata"]
    rules = meta["x-kubernetes-validations"]
    guarded = {r["fieldPath"].removeprefix("."): r for r in rules}
    assert set(meta["properties"]) - {"labels", "annotations"} == set(guarded)
    for field, rule in guarded.items():
        assert rule["rule"] == f"!has(self.{field})"
        assert rule["message"].startswith(f"template.metadata.{field} ")
    assert "owner" in guarded["ownerReferences"]["message"]
    assert "finalizer" in guarded["finalizers"]["message"]
