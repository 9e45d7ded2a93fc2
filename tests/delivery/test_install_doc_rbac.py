"""The RBAC section of docs/install.md says what the chart grants, both ways.

Each table row (resource, verbs) is compared with the rules the chart renders: a verb the doc
lists must be granted, and a granted verb must be listed. Resources are compared by name (the
doc names the API group only where it is not obvious).
"""

from __future__ import annotations

import re
from typing import Any

from .conftest import ROOT, render
from .test_chart import NAMESPACES, by_kind

INSTALL_DOC = ROOT / "docs" / "install.md"
_VERB = re.compile(r"\b(get|list|watch|create|update|patch|delete|deletecollection)\b")


def _section(heading: str) -> str:
    """The text from a bold heading (``**heading**``) to the next one."""
    text = INSTALL_DOC.read_text()
    start = text.index(f"**{heading}**")
    end = text.find("\n**", start + 1)
    return text[start : end if end != -1 else len(text)]


def documented_table(title: str) -> dict[str, set[str]]:
    """resource -> verbs from the table under the heading ``title``."""
    table: dict[str, set[str]] = {}
    for line in _section(f"`{title}`").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("resource", "---"):
            continue
        resources = re.findall(r"`([a-z/]+)`", cells[0].split("(")[0])
        verbs = {v.strip() for v in cells[1].split(",")}
        for resource in resources:
            table.setdefault(resource, set()).update(verbs)
    assert table, f"no table under {title} in {INSTALL_DOC.name}"
    return table


def granted(role: dict[str, Any]) -> dict[str, set[str]]:
    """resource -> verbs of a rendered (Cluster)Role."""
    out: dict[str, set[str]] = {}
    for rule in role["rules"]:
        for resource in rule["resources"]:
            out.setdefault(resource, set()).update(rule["verbs"])
    return out


def _role(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == name]
    return found


def test_cluster_role_table_is_what_the_chart_grants(helm: str) -> None:
    documented = documented_table("rtj-operator-cluster")
    all_namespaces = granted(_role(render(helm), "ClusterRole", "rtj-operator-cluster"))
    assert documented == all_namespaces
    # "only in all-namespaces mode with peering on"
    namespaced = granted(_role(render(helm, *NAMESPACES), "ClusterRole", "rtj-operator-cluster"))
    assert "clusterkopfpeerings" not in namespaced
    assert {r: v for r, v in documented.items() if r != "clusterkopfpeerings"} == namespaced


def test_jobs_role_table_is_what_the_chart_grants(helm: str) -> None:
    documented = documented_table("rtj-operator-jobs")
    all_namespaces = granted(_role(render(helm), "ClusterRole", "rtj-operator-jobs"))
    # "kopfpeerings: only in namespaces mode with peering on"
    assert {r: v for r, v in documented.items() if r != "kopfpeerings"} == all_namespaces
    docs = render(helm, *NAMESPACES)
    for role in by_kind(docs, "Role"):
        assert granted(role) == documented, role["metadata"]["namespace"]


def test_the_aggregated_user_roles_are_described_with_every_verb(helm: str) -> None:
    """ "For people": the verbs named for rtj-operator-edit are the ones it grants on jobs."""
    docs = render(helm)
    paragraph = _section("For people").split("`rtj-operator-view`")[0]
    described = set(_VERB.findall(paragraph.split("aggregate-to-admin")[1]))
    edit = granted(_role(docs, "ClusterRole", "rtj-operator-edit"))
    assert described == edit["resumabletrainingjobs"]
    assert edit["resumabletrainingjobs/status"] == {"get", "list", "watch"}
