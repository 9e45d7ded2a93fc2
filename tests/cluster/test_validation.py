"""Invalid manifests are refused by the API server itself, with the offending field named."""

from __future__ import annotations

import pytest

from rtj_operator.kube import ApiError

from .kubeclient import rtj, wait_for


def rejected(kube, body) -> str:
    with pytest.raises(ApiError) as info:
        kube.create_job(body)
    assert info.value.status == 422, info.value
    return info.value.message


CASES = [
    ("zero replicas", {"replicas": 0}, "spec.replicas"),
    ("bad checkpoint dir", {"checkpoint": {"dir": "relative/path"}}, "spec.checkpoint.dir"),
    (
        "volume needs a path",
        {"checkpoint": {"dir": "s3://b", "volumeSource": {"emptyDir": {}}}},
        "spec.checkpoint.dir",
    ),
    ("unknown container", {"containerName": "nope"}, "spec.containerName"),
    (
        "backoff cap below base",
        {"resumePolicy": {"backoffBaseSeconds": 60, "backoffMaxSeconds": 10}},
        "spec.resumePolicy.backoffMaxSeconds",
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
    """The template is only partly modelled; the rest is validated when pods are created, and
    an invalid one ends the job (reason InvalidPodTemplate) instead of crash-looping."""
    pool.add(1)
    body = rtj("badpod", ns, pool.name, template_spec={"containers": [{"name": "trainer"}]})
    kube.create_job(body)  # no image: accepted by the CRD schema, refused for a Pod
    wait_for(
        "Failed",
        lambda: kube.status(ns, "badpod").get("phase") == "Failed",
        20,
        on_timeout=operator.tail,
    )
    failed = {c["type"]: c for c in kube.status(ns, "badpod")["conditions"]}["Failed"]
    assert failed["reason"] == "InvalidPodTemplate"
    assert "spec.containers[0].image" in failed["message"], failed
