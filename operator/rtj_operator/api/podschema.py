"""The core/v1 PodTemplateSpec schema that the CRD embeds, so a pod template is validated as one.

Before, ``spec.template.spec`` was an open object: the API server kept whatever it was given, and
a typo (``tolerations_``, ``resourcez``) passed ``kubectl apply`` and was then silently dropped
when the operator created the pods, changing where and how a rank runs. Embedding the real schema
(what Kubeflow's and JobSet's CRDs do) makes the API server reject unknown fields with their
path, like it does for a Deployment. A server-side dry-run of the pod at admission was the
alternative; it needs a webhook, so a running operator, to accept a job at all.

The schema comes from the OpenAPI v3 document a kube-apiserver publishes (``/openapi/v3/api/v1``)
and is stored, converted, in ``schemas/podtemplatespec.json`` with the version it came from;
``crdgen`` embeds it under the operator's own constraints, and a cluster test checks it against
the live server. Regenerate it when the supported Kubernetes version moves:

    python -m rtj_operator.api.podschema --server --version v1.36.3   (the KUBECONFIG cluster)

(``--openapi FILE`` reads a saved document instead; note that ``api__v1_openapi.json`` in the
``k8s.io/kubernetes`` sources lacks the enums the server publishes.)

The conversion makes the OpenAPI schema *structural* for a CRD: references inlined, Quantity and
IntOrString as ``x-kubernetes-int-or-string``, free-form objects (managedFields) marked to keep
their fields, and dropped: descriptions (the CRD must stay under the 256 KiB that client-side
``kubectl apply`` can annotate), defaults (the pod's own defaulting applies when it is created),
formats, and list/map merge markers (they describe strategic merge patch of pods, not of jobs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SCHEMA_FILE = Path(__file__).with_name("schemas") / "podtemplatespec.json"
ROOT_TYPE = "io.k8s.api.core.v1.PodTemplateSpec"
_PREFIX = "#/components/schemas/"
_DROPPED = frozenset(
    {
        "description",
        "default",
        "format",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-patch-merge-key",
        "x-kubernetes-patch-strategy",
        "x-kubernetes-unions",
        "x-kubernetes-group-version-kind",
    }
)


class SchemaError(ValueError):
    """The OpenAPI document has a shape the conversion cannot make structural."""


def structural(openapi: dict[str, Any], root: str = ROOT_TYPE) -> dict[str, Any]:
    """The structural schema of ``root`` from an OpenAPI v3 document."""
    schemas = (openapi.get("components") or {}).get("schemas") or {}
    if root not in schemas:
        raise SchemaError(f"{root} is not among the document's components.schemas")
    return _convert(schemas[root], schemas, (root,))


def _convert(
    node: dict[str, Any], schemas: dict[str, Any], path: tuple[str, ...]
) -> dict[str, Any]:
    node = dict(node)
    if "$ref" in node:
        name = node.pop("$ref").removeprefix(_PREFIX)
        if name in path:
            raise SchemaError(f"recursive type {name} (via {' > '.join(path)})")
        return _convert({**schemas[name], **node}, schemas, (*path, name))
    if "allOf" in node:
        parts = node.pop("allOf")
        if len(parts) != 1:
            raise SchemaError(f"allOf with {len(parts)} parts at {' > '.join(path)}")
        return _convert({**parts[0], **node}, schemas, path)
    if "oneOf" in node or "anyOf" in node:
        options = node.pop("oneOf", None) or node.pop("anyOf")
        kinds = {o.get("type") for o in options}
        if kinds <= {"integer", "number", "string"} and "string" in kinds:
            return {"x-kubernetes-int-or-string": True}  # Quantity, IntOrString
        raise SchemaError(f"union of {sorted(map(str, kinds))} at {' > '.join(path)}")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "properties":
            out[key] = {k: _convert(v, schemas, path) for k, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _convert(value, schemas, path)
        else:
            out[key] = value
    if (
        out.get("type") == "object"
        and "properties" not in out
        and "additionalProperties" not in out
    ):
        out["x-kubernetes-preserve-unknown-fields"] = True  # free-form (managedFields)
    return out


def load() -> dict[str, Any]:
    """The stored PodTemplateSpec schema."""
    return json.loads(SCHEMA_FILE.read_text())["schema"]


def stored_version() -> str:
    """The Kubernetes version the stored schema was taken from."""
    return str(json.loads(SCHEMA_FILE.read_text())["kubernetesVersion"])


def render(openapi: dict[str, Any], version: str, source: str) -> str:
    """The stored file's content."""
    payload = {
        "comment": "Generated by `python -m rtj_operator.api.podschema`; do not edit.",
        "kubernetesVersion": version,
        "source": source,
        "schema": structural(openapi),
    }
    return json.dumps(payload, indent=1, sort_keys=True) + "\n"


def _from_server() -> dict[str, Any]:
    # The one import of act/ from api/: regenerating the stored file from a live cluster is a
    # maintainer's command, never part of building the CRD (tests/operator/test_layers.py).
    from ..act.kube import KubeApi  # noqa: PLC0415

    api = KubeApi()
    try:
        return api.request_sync("GET", "/openapi/v3/api/v1")
    finally:
        api.close()


def main(argv: list[str] | None = None) -> int:
    """Regenerate the stored schema from an OpenAPI v3 document."""
    parser = argparse.ArgumentParser(
        prog="python -m rtj_operator.api.podschema",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--openapi", type=Path, help="an api__v1_openapi.json file")
    source.add_argument(
        "--server", action="store_true", help="read /openapi/v3/api/v1 of the KUBECONFIG cluster"
    )
    parser.add_argument("--version", required=True, help="Kubernetes version, e.g. v1.36.3")
    args = parser.parse_args(argv)
    if args.server:
        doc, origin = _from_server(), "kube-apiserver /openapi/v3/api/v1"
    else:
        doc, origin = (
            json.loads(args.openapi.read_text()),
            "api/openapi-spec/v3/api__v1_openapi.json",
        )
    SCHEMA_FILE.parent.mkdir(exist_ok=True)
    SCHEMA_FILE.write_text(render(doc, args.version, f"{origin} of Kubernetes {args.version}"))
    sys.stdout.write(f"wrote {SCHEMA_FILE.name} ({SCHEMA_FILE.stat().st_size} bytes)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
