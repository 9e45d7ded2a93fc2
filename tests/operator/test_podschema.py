"""The OpenAPI -> structural conversion of the embedded core pod schema, and its overlay."""

from __future__ import annotations

import pytest

from rtj_operator.api import podschema
from rtj_operator.api.schema import embed


def doc(**schemas):
    return {"components": {"schemas": schemas}}


REF = "#/components/schemas/"


def test_references_are_inlined_and_patch_markers_dropped():
    openapi = doc(
        Root={
            "type": "object",
            "description": "dropped",
            "properties": {
                "items": {
                    "type": "array",
                    "items": {"allOf": [{"$ref": REF + "Item"}], "default": {}},
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "x-kubernetes-patch-merge-key": "name",
                },
                "size": {"$ref": REF + "Quantity"},
                "port": {"$ref": REF + "IntOrString"},
                "raw": {"type": "object"},
                "labels": {
                    "type": "object",
                    "additionalProperties": {"type": "string", "default": ""},
                },
            },
        },
        Item={
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "format": "x"}},
        },
        Quantity={"oneOf": [{"type": "string"}, {"type": "number"}]},
        IntOrString={"format": "int-or-string", "oneOf": [{"type": "integer"}, {"type": "string"}]},
    )
    out = podschema.structural(openapi, "Root")
    assert out == {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": {"type": "string"}},
                },
            },
            "size": {"x-kubernetes-int-or-string": True},
            "port": {"x-kubernetes-int-or-string": True},
            "raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }


def test_recursion_and_real_unions_are_refused():
    with pytest.raises(podschema.SchemaError, match="recursive"):
        podschema.structural(doc(A={"properties": {"a": {"$ref": REF + "A"}}}), "A")
    with pytest.raises(podschema.SchemaError, match="union"):
        podschema.structural(doc(A={"oneOf": [{"type": "object"}, {"type": "array"}]}), "A")
    with pytest.raises(podschema.SchemaError, match="not among"):
        podschema.structural(doc(), "Missing")


def test_overlay_keeps_core_types_and_adds_the_models_constraints():
    core = {
        "type": "object",
        "required": ["containers"],
        "properties": {
            "containers": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "image": {"type": "string"}},
                },
            },
            "tolerations": {"type": "array", "items": {"type": "object"}},
        },
    }
    ours = {
        "type": "object",
        "description": "ours",
        "x-kubernetes-preserve-unknown-fields": True,
        "required": ["containers"],
        "properties": {
            "containers": {
                "type": "array",
                "maxItems": 64,
                "items": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": True,
                    "properties": {"name": {"type": "string", "pattern": "^x$"}},
                },
            }
        },
    }
    out = embed(core, ours)
    assert "x-kubernetes-preserve-unknown-fields" not in out
    assert out["description"] == "ours" and out["required"] == ["containers"]
    assert out["properties"]["tolerations"] == core["properties"]["tolerations"]
    containers = out["properties"]["containers"]
    assert containers["maxItems"] == 64
    assert "x-kubernetes-preserve-unknown-fields" not in containers["items"]
    assert containers["items"]["properties"]["name"]["pattern"] == "^x$"
    assert containers["items"]["properties"]["image"] == {"type": "string"}


def test_the_stored_schema_is_a_pod_template_spec_of_the_supported_version():
    schema = podschema.load()
    assert set(schema["properties"]) == {"metadata", "spec"}
    assert schema["properties"]["spec"]["required"] == ["containers"]
    assert podschema.stored_version().startswith("v1.")
