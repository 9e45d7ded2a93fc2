"""Size and shape limits on the product's code: no import circle, no huge class or function.

An import circle means two modules can be understood (and tested) only together, and its
import order decides which one sees the other half-initialised; every import counts, those
inside functions too (deferring one hides the circle, it does not end it). A class over 300
lines or a function over 60 is one that a change has to read whole; a function may stay long
when its docstring says why ("Long on purpose:"), e.g. an ordered sequence whose order is the
safety argument. The operator's layering (``act`` -> ``decide`` -> ``api``) is
tests/operator/test_layers.py's; the direction tests -> tools -> product is
test_import_direction.py's. Pure ``ast``: nothing is imported.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {
    "trainer_runtime": REPO / "trainer_runtime",
    "rtj_operator": REPO / "operator" / "rtj_operator",
}
MAX_CLASS = 300
MAX_FUNCTION = 60
LONG_ON_PURPOSE = "Long on purpose:"

# Known offenders in the operator while it is being shrunk: (kind, "module:qualname") -> its
# lines now, e.g. ("class", "rtj_operator.act.controller:Controller"): 304. An entry may only
# shrink or go (a fixed one must leave); a new offender, or one that grew, fails. Empty: the
# operator has none left.
OPERATOR_ALLOWED: dict[tuple[str, str], int] = {}


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def modules(package: str) -> dict[str, Path]:
    """Dotted module name (``trainer_runtime.sharded.load``) -> file, for one package."""
    root = PACKAGES[package]
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in the file.

    ``from . import x`` is an edge to the submodule ``x`` when x is one, else to the package.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def add(module: str) -> None:
        while module and module not in known:
            module = module.rpartition(".")[0]
        if module and module != name:
            found.add(module)

    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in known else base)
    return found


def cycles(package: str) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan)."""
    known = modules(package)
    graph = {name: imports(name, path, known) for name, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def sizes(package: str) -> dict[tuple[str, str], int]:
    """(kind, "module:qualname") -> lines, for every class over MAX_CLASS and every function
    over MAX_FUNCTION whose docstring does not say "Long on purpose:"."""
    found = {}

    def walk(node: ast.AST, module: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                qualname = f"{prefix}{child.name}"
                lines = child.end_lineno - child.lineno + 1
                if isinstance(child, ast.ClassDef):
                    if lines > MAX_CLASS:
                        found[("class", f"{module}:{qualname}")] = lines
                elif lines > MAX_FUNCTION and LONG_ON_PURPOSE not in (
                    ast.get_docstring(child) or ""
                ):
                    found[("function", f"{module}:{qualname}")] = lines
                walk(child, module, f"{qualname}.")
            else:
                walk(child, module, prefix)

    for name, path in modules(package).items():
        walk(parsed(path), name, "")
    return found


def test_every_import_is_an_edge_those_inside_functions_too():
    """The checks below see what they claim to: a deferred import and ``from . import x``."""
    known = modules("trainer_runtime")
    name = "trainer_runtime.resume.sharded_format"
    assert "trainer_runtime.sharded.reading" in imports(name, known[name], known)  # in a function
    manager = imports("trainer_runtime.manager", known["trainer_runtime.manager"], known)
    assert {"trainer_runtime.events", "trainer_runtime.run.setup"} <= manager


def test_no_import_circles_in_the_runtime():
    assert cycles("trainer_runtime") == []


def test_no_import_circles_in_the_operator():
    assert cycles("rtj_operator") == []


def test_no_long_classes_or_functions_in_the_runtime():
    assert sizes("trainer_runtime") == {}


def test_no_new_long_classes_or_functions_in_the_operator():
    grown = {
        key: lines
        for key, lines in sizes("rtj_operator").items()
        if lines > OPERATOR_ALLOWED.get(key, 0)
    }
    assert grown == {}


def test_the_operator_allowlist_names_only_offenders():
    """A fixed offender leaves the list, so that it cannot grow back unnoticed."""
    offenders = sizes("rtj_operator")
    assert sorted(set(OPERATOR_ALLOWED) - set(offenders)) == []
