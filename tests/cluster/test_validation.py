"""Invalid manifests are refused by the API server itself, with the offending field named."""

from __future__ import annotations

import pytest

from rtj_operator.api import podschema
from tools.kubeapi import ApiError, rtj
from tools.waiting import wait_for

from .scenario import wait_phase


def rejected(kube, body) -> str:
    with pytest.raises(ApiError) as info:
        kube.create_job(body)
    assert info.value.status == 422, info.value
    return info.value.message


CASES = [
    ("zero replicas", {"replicas": 0}, "spec.replicas"),
    (
        "zero processes per pod",
        {"processesPerPod": 0},
        "spec.processesPerPod: Invalid value: 0: spec.processesPerPod in body should be "
        "greater than or equal to 1",
    ),
    ("too many processes per pod", {"processesPerPod": 257}, "spec.processesPerPod"),
    ("bad checkpoint dir", {"checkpoint": {"dir": "relative/path"}}, "spec.checkpoint.dir"),
    (
        "volume needs a path",
        {"checkpoint": {"dir": "s3://bucket", "volumeSource": {"emptyDir": {}}}},
        "spec.checkpoint.dir",
    ),
    (
        "empty checkpoint volume source",
        {"checkpoint": {"dir": "/mnt/ck", "volumeSource": {}}},
        "spec.checkpoint.volumeSource: Invalid value: 0: spec.checkpoint.volumeSource in body "
        "should have at least 1 properties",
    ),
    (
        "two checkpoint volume sources",
        {"checkpoint": {"dir": "/mnt/ck", "volumeSource": {"emptyDir": {}, "nfs": {}}}},
        "spec.checkpoint.volumeSource: Too many: 2",
    ),
    ("unknown container", {"containerName": "nope"}, "spec.containerName"),
    (
        "exit code 0 in a rule",
        {"resumePolicy": {"exitCodeRules": [{"exitCodes": [0], "action": "Retry"}]}},
        "spec.resumePolicy.exitCodeRules[0].exitCodes",
    ),
    (
        "exit code above 255",
        {"resumePolicy": {"exitCodeRules": [{"exitCodes": [256], "action": "Retry"}]}},
        "spec.resumePolicy.exitCodeRules[0].exitCodes",
    ),
    (
        "an exit code rule matching nothing",
        {"resumePolicy": {"exitCodeRules": [{"action": "FailJob"}]}},
        "spec.resumePolicy.exitCodeRules[0]",
    ),
    (
        "an unknown exit code action",
        {"resumePolicy": {"exitCodeRules": [{"exitCodes": [75], "action": "Ignore"}]}},
        "spec.resumePolicy.exitCodeRules[0].action",
    ),
    (
        "backoff cap below base",
        {"resumePolicy": {"backoffBaseSeconds": 60, "backoffMaxSeconds": 10}},
        "spec.resumePolicy.backoffBaseSeconds",
    ),
    (
        "backoff base above the default cap",
        {"resumePolicy": {"backoffBaseSeconds": 700}},
        "spec.resumePolicy.backoffBaseSeconds: Invalid value: backoffBaseSeconds must not "
        "exceed backoffMaxSeconds (600 when not set)",
    ),
    ("root checkpoint dir", {"checkpoint": {"dir": "/"}}, "must not be the root directory"),
    (
        "checkpoint dir in a scheme the runtime cannot read",
        {"checkpoint": {"dir": "gs://bucket/prefix"}},
        "the runtime reads s3:// URIs only",
    ),
    (
        "checkpoint dir in a bucket the runtime refuses",
        {"checkpoint": {"dir": "s3://My_Checkpoints/run"}},
        'spec.checkpoint.dir: Invalid value: "s3://My_Checkpoints/run": checkpoint.dir must '
        "name a valid bucket",
    ),
    (
        "checkpoint dir in a one-letter bucket",
        {"checkpoint": {"dir": "s3://b/run"}},
        "checkpoint.dir must name a valid bucket",
    ),
    (
        "checkpoint dir in a bucket named by an IP address",
        {"checkpoint": {"dir": "s3://10.0.0.1/run"}},
        "checkpoint.dir must name a valid bucket",
    ),
    (
        "checkpoint dir with a query string",
        {"checkpoint": {"dir": "s3://bucket/run?versionId=1"}},
        "checkpoint.dir must not contain ? or #",
    ),
    ("checkpoint dir with ..", {"checkpoint": {"dir": "/.."}}, "must not contain . or .."),
    ("checkpoint dir with .", {"checkpoint": {"dir": "/mnt/./ck"}}, "must not contain . or .."),
    (
        "checkpoint dir message is plain",
        {"checkpoint": {"dir": "relative/path"}},
        "must be an object-store URI such as s3://bucket/prefix or an absolute path",
    ),
    (
        "container name not a DNS label",
        {"template": {"spec": {"containers": [{"name": "Trainer", "image": "i"}]}}},
        "spec.template.spec.containers[0].name",
    ),
    (
        "grace period without bound",
        {
            "template": {
                "spec": {
                    "terminationGracePeriodSeconds": 10**12,
                    "containers": [{"name": "t", "image": "i"}],
                }
            }
        },
        "spec.template.spec.terminationGracePeriodSeconds",
    ),
    (
        "wrong type inside the pod template",
        {"template": {"spec": {"containers": [{"name": "t", "image": "i", "ports": "80"}]}}},
        "spec.template.spec.containers[0].ports",
    ),
    (
        "negative max preemptions",
        {"resumePolicy": {"maxPreemptions": -1}},
        "spec.resumePolicy.maxPreemptions",
    ),
    (
        "bad taint effect",
        {"preemptionSignals": {"terminationTaints": [{"key": "k", "effect": "Sometimes"}]}},
        "spec.preemptionSignals.terminationTaints[0].effect",
    ),
    (
        "taint key with a space",
        {"preemptionSignals": {"terminationTaints": [{"key": "spot notice"}]}},
        "spec.preemptionSignals.terminationTaints[0].key",
    ),
    (
        "taint value with a space",
        {"preemptionSignals": {"terminationTaints": [{"key": "k", "value": "not now"}]}},
        "spec.preemptionSignals.terminationTaints[0].value",
    ),
    (
        "taint key prefix over 253 characters",
        {"preemptionSignals": {"terminationTaints": [{"key": "a" * 254 + "/notice"}]}},
        "spec.preemptionSignals.terminationTaints[0].key",
    ),
    (
        "restart policy",
        {
            "template": {
                "spec": {"restartPolicy": "Always", "containers": [{"name": "t", "image": "i"}]}
            }
        },
        "spec.template.spec.restartPolicy",
    ),
    ("no containers", {"template": {"spec": {"containers": []}}}, "spec.template.spec.containers"),
    ("bad run name", {"runName": "has spaces"}, "spec.runName"),
]


@pytest.mark.parametrize(("case", "spec", "field"), CASES, ids=[c[0] for c in CASES])
def test_invalid_spec_is_rejected_naming_the_field(kube, ns, case, spec, field):
    body = rtj("bad", ns, "none")
    body["spec"].update(spec)
    message = rejected(kube, body)
    assert field in message, message


@pytest.mark.parametrize("field", ["name", "namespace", "finalizers", "generateName"])
def test_pod_template_metadata_the_operator_sets_is_rejected(kube, ns, field):
    """Pod names, namespace and finalizers are the operator's; a template that sets them is
    refused at apply time (they were silently dropped when the pods were built)."""
    body = rtj("meta", ns, "none")
    value = ["example.com/keep"] if field == "finalizers" else "x"
    body["spec"]["template"]["metadata"] = {"labels": {"team": "a"}, field: value}
    message = rejected(kube, body)
    assert "spec.template.metadata" in message and field in message, message


@pytest.mark.parametrize(
    ("typo", "where"),
    [
        ({"tolerations_": [{"key": "k", "operator": "Exists"}]}, "spec.template.spec.tolerations_"),
        (
            {
                "containers": [
                    {"name": "trainer", "image": "i", "resourcez": {"limits": {"cpu": "1"}}}
                ]
            },
            "spec.template.spec.containers[0].resourcez",
        ),
        ({"nodeSelectr": {"a": "b"}}, "spec.template.spec.nodeSelectr"),
    ],
    ids=["tolerations_", "resourcez", "nodeSelectr"],
)
def test_typos_in_the_pod_template_are_rejected_like_kubectl_does_for_a_deployment(
    kube, ns, typo, where
):
    """kubectl asks for strict field validation; the embedded PodTemplateSpec schema makes the
    API server find the unknown field (before, the template was open and kept it, and it was
    dropped silently when the pods were created)."""
    body = rtj("typo", ns, "none", template_spec=typo)
    with pytest.raises(ApiError) as info:
        kube.req("POST", kube.job_path(ns), body=body, query={"fieldValidation": "Strict"})
    # What kubectl shows as: Error from server (BadRequest): ... strict decoding error.
    assert info.value.status == 400, info.value
    assert f'strict decoding error: unknown field "{where}"' in info.value.message, info.value


def test_a_rich_pod_template_is_accepted_and_kept(kube, ns):
    spec = {
        "initContainers": [
            {"name": "sidecar", "image": "i", "restartPolicy": "Always"},
            {"name": "fetch", "image": "i", "command": ["true"]},
        ],
        "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "a", "operator": "In", "values": ["b"]}]}
                    ]
                }
            }
        },
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}],
        "containers": [
            {
                "name": "trainer",
                "image": "i",
                "resources": {"limits": {"cpu": 2, "memory": "1Gi", "nvidia.com/gpu": "1"}},
                "ports": [{"containerPort": 29500}],
                "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
                "readinessProbe": {"tcpSocket": {"port": "http"}},
            }
        ],
    }
    body = rtj("rich", ns, "none", template_spec=spec)
    created = kube.req("POST", kube.job_path(ns), body=body, query={"fieldValidation": "Strict"})
    kept = created["spec"]["template"]["spec"]
    for key in ("initContainers", "tolerations", "affinity", "topologySpreadConstraints"):
        assert kept[key] == body["spec"]["template"]["spec"][key], key
    assert kept["containers"][0]["resources"]["limits"]["cpu"] == 2
    assert kept["containers"][0]["readinessProbe"]["tcpSocket"]["port"] == "http"


def test_missing_required_fields(kube, ns):
    body = rtj("bad", ns, "none")
    del body["spec"]["checkpoint"]
    assert "spec.checkpoint" in rejected(kube, body)


@pytest.mark.parametrize("name", ["x" * 49, "9starts-with-digit"])
def test_names_that_cannot_become_pod_hostnames(kube, ns, name):
    message = rejected(kube, rtj(name, ns, "none"))
    assert "metadata.name" in message, message


def test_immutable_fields(kube, ns, operator):
    kube.create_job(rtj("immutable", ns, "none", runName="a"))
    for spec, field in (
        ({"replicas": 3}, "replicas is immutable"),
        ({"processesPerPod": 2}, "processesPerPod is immutable"),
        ({"checkpoint": {"dir": "s3://other"}}, "checkpoint is immutable"),
        ({"runName": "b"}, "runName is immutable"),
    ):
        with pytest.raises(ApiError) as info:
            kube.patch_job(ns, "immutable", spec)
        assert info.value.status == 422 and field in info.value.message, info.value.message
    # A mutable field still changes.
    kube.patch_job(ns, "immutable", {"resumePolicy": {"backoffLimit": 1}})


def test_defaults_are_filled_in_by_the_server(kube, ns, operator):
    created = kube.create_job(rtj("defaults", ns, "none"))
    spec = created["spec"]
    assert spec["masterPort"] == 29500 and spec["suspend"] is False
    assert spec["resumePolicy"]["backoffLimit"] == 6
    assert "maxPreemptions" not in spec["resumePolicy"]
    keys = {t["key"] for t in spec["preemptionSignals"]["terminationTaints"]}
    assert "node.kubernetes.io/out-of-service" in keys
    wait_for(
        "status from the operator",
        lambda: kube.status(ns, "defaults").get("runName"),
        20,
        on_timeout=operator.tail,
    )


def test_pod_template_errors_the_schema_cannot_see_fail_the_job_with_the_servers_message(
    kube, ns, pool, operator
):
    """What only pod validation sees is checked when pods are created, and an invalid template
    ends the job (reason InvalidPodTemplate) instead of crash-looping."""
    pool.add(1)
    body = rtj("badpod", ns, pool.name, template_spec={"containers": [{"name": "trainer"}]})
    kube.create_job(body)  # no image: the OpenAPI schema allows it, pod validation does not
    wait_phase(kube, ns, "badpod", "Failed", 20, op=operator)
    failed = {c["type"]: c for c in kube.status(ns, "badpod")["conditions"]}["Failed"]
    assert failed["reason"] == "InvalidPodTemplate"
    assert "spec.containers[0].image" in failed["message"], failed


def test_the_embedded_pod_schema_is_the_live_servers(kube):
    """The stored PodTemplateSpec schema (rtj_operator/api/schemas) is what this API server
    publishes, converted the same way; when this fails, regenerate it with
    `python -m rtj_operator.api.podschema --server --version <the server's version>`."""
    live = kube.req("GET", "/openapi/v3/api/v1")
    assert podschema.structural(live) == podschema.load()
