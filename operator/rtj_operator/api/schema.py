"""Turn a pydantic model into a Kubernetes *structural* OpenAPI v3 schema.

pydantic emits JSON Schema 2020-12: ``$ref``/``$defs``, ``anyOf`` with ``null`` for optionals,
``const``, ``additionalProperties: true`` for open models, and no ``default`` for fields built by
a factory. The API server accepts none of that in a CRD, so this module rewrites it: references
are inlined, optionals become plain (non-required) fields, open models become
``x-kubernetes-preserve-unknown-fields``, and factory defaults are materialised so the API server
applies them. Anything it cannot express structurally (a real union) raises instead of emitting a
schema the API server would reject or, worse, silently prune data with.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import PydanticUndefined, core_schema, to_jsonable_python

_DROPPED_KEYS = frozenset({"title", "examples"})


class _FactoryDefaults(GenerateJsonSchema):
    """Emit a ``default`` for ``default_factory`` fields (pydantic leaves it out).

    A model-valued default is written out in full rather than as ``{}``: the API server checks
    the CEL rules of an object default before it fills in the nested defaults, so ``{}`` would
    fail a rule such as ``backoffMaxSeconds >= backoffBaseSeconds``.
    """

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        factory = schema.get("default_factory")
        if factory is None or schema.get("default_factory_takes_data"):
            return super().default_schema(schema)
        value = factory()  # type: ignore[call-arg]
        out = self.generate_inner(schema["schema"])
        if value is PydanticUndefined:
            return out
        out["default"] = to_jsonable_python(value, by_alias=True, exclude_none=True)
        return out


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of ``model`` (validation mode, camelCase aliases)."""
    raw = model.model_json_schema(
        by_alias=True, mode="validation", schema_generator=_FactoryDefaults
    )
    defs = raw.pop("$defs", {})
    return _convert(raw, defs, path=model.__name__)


def clean_description(text: str) -> str:
    """Docstrings are wrapped and RST-flavoured; descriptions read better as one plain line."""
    text = re.sub(r"\s*\n\s*", " ", text.strip())
    return text.replace("``", "`")


_RULES = "x-kubernetes-validations"


def _overlay(base: dict[str, Any], field: dict[str, Any]) -> dict[str, Any]:
    """A field's own keywords over its type's, keeping the CEL rules of both."""
    merged = {**base, **field}
    if _RULES in base and _RULES in field:
        merged[_RULES] = [*base[_RULES], *field[_RULES]]
    return merged


def _convert(node: dict[str, Any], defs: dict[str, Any], path: str) -> dict[str, Any]:
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        return _convert(_overlay(target, node), defs, path)
    if "allOf" in node:
        (only,) = node.pop("allOf")
        return _convert(_overlay(only, node), defs, path)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"{path}: unions cannot be expressed in a structural schema")
        return _convert(_overlay(options[0], node), defs, path)

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS or (key == "default" and value is None):
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out[key] = {name: _convert(sub, defs, f"{path}.{name}") for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs, f"{path}[]")
        elif key == "additionalProperties":
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, dict):
                out[key] = _convert(value, defs, f"{path}{{}}")
        elif key == "description":
            out[key] = clean_description(value)
        else:
            out[key] = value
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def embed(core: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """``ours`` (a model's structural schema) laid over ``core`` (a Kubernetes type's schema).

    Every field keeps the core type and gains the model's description, constraints and CEL
    rules; fields only the core schema has stay as the core defines them. The model's "open"
    marker (preserve unknown fields) is dropped: the core schema types every field, so unknown
    ones are rejected instead of kept.
    """
    out = dict(core)
    for key, value in ours.items():
        if key == "properties":
            merged = dict(core.get("properties") or {})
            for name, sub in value.items():
                merged[name] = embed(merged[name], sub) if name in merged else sub
            out[key] = merged
        elif key in ("items", "additionalProperties") and isinstance(core.get(key), dict):
            out[key] = embed(core[key], value)
        elif key == "required":
            out[key] = list(dict.fromkeys([*(core.get("required") or []), *value]))
        elif key == "x-kubernetes-preserve-unknown-fields":
            continue
        else:
            out[key] = value
    if "properties" in out:
        out.pop("x-kubernetes-preserve-unknown-fields", None)
    return out
