"""The operator's layers import only downwards: ``act`` -> ``decide`` -> ``api``.

``decide`` is the pure state machine: were it to import ``act`` (a client, the controller, the
metrics), a decision could reach the API server or the process's state, and the unit tests
would no longer cover what the operator does. ``api`` is the custom resource's contract and
the CRD generator, readable on its own. Every import counts, those inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "rtj_operator"
LAYERS = ("api", "decide", "act")
ALLOWED = {
    # ``python -m rtj_operator.api.podschema --server`` refetches the stored pod schema from a
    # live cluster: a maintainer's command, never run when the CRD is generated.
    ("api.podschema", "act.kube"),
}


def module_name(path: Path) -> str:
    """``decide.reconcile`` for operator/rtj_operator/decide/reconcile.py ("" for the root)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str) -> bool:
    path = PACKAGE.joinpath(*name.split(".")) if name else PACKAGE
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def package_imports(path: Path) -> set[str]:
    """The modules of the package a file imports (relative to the package), anywhere in it."""
    name = module_name(path)
    own = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {
                a.name.removeprefix("rtj_operator").lstrip(".")
                for a in node.names
                if a.name.split(".")[0] == "rtj_operator"
            }
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if (node.module or "").split(".")[0] != "rtj_operator":
                    continue
                base = node.module.removeprefix("rtj_operator").lstrip(".")
            else:
                anchor = own.split(".") if own else []
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}" if base else alias.name
                found.add(sub if is_module(sub) else base)
    return found


def layer(name: str) -> str:
    top = name.partition(".")[0]
    return top if top in LAYERS else ""


def edges() -> set[tuple[str, str]]:
    return {
        (module_name(path), target)
        for path in sorted(PACKAGE.rglob("*.py"))
        for target in package_imports(path)
    }


def test_every_module_lives_in_a_layer():
    """Only the package's own entry points (``__init__``, ``__main__``) sit outside a layer."""
    loose = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if not layer(module_name(path)) and path.name not in ("__init__.py", "__main__.py")
    )
    assert loose == []


def test_decide_never_imports_act():
    bad = sorted((a, b) for a, b in edges() if layer(a) == "decide" and layer(b) == "act")
    assert bad == []


def test_api_imports_neither_decide_nor_act():
    bad = {(a, b) for a, b in edges() if layer(a) == "api" and layer(b) in ("decide", "act")}
    assert sorted(bad - ALLOWED) == []
    assert bad == ALLOWED, "an allowed import is gone: drop it from ALLOWED"


def test_decide_talks_to_no_server():
    """No client library in the pure layer either (a function-level import included)."""
    clients = {"kopf", "kubernetes", "urllib3", "prometheus_client", "requests", "aiohttp"}
    bad = []
    for path in sorted((PACKAGE / "decide").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                mods = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                mods = {node.module.split(".")[0]}
            else:
                continue
            bad += [f"{path.name} imports {m}" for m in sorted(mods & clients)]
    assert bad == []


def test_the_walk_sees_imports_inside_functions():
    """The allowed import is a function-level one: the walk must find it."""
    assert ("api.podschema", "act.kube") in edges()
