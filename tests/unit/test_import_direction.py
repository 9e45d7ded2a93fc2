"""Imports point down the layers: tests use the tools, never the other way round.

The tools (``tools/``), the benchmarks and the examples are run on their own (``make demo``,
``make bench``); code they need from the test tree would make ``tests/`` a library with its own
users. What both need (the S3 server, the Kubernetes client) lives in ``tools/``. The product
packages import neither.
"""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def top_level_imports(path: Path) -> set[str]:
    """The top-level packages a file imports, anywhere in it (function-level imports too)."""
    mods: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods.add(node.module.split(".")[0])
    return mods


def offenders(folders: tuple[str, ...], forbidden: set[str]) -> list[str]:
    found = []
    for folder in folders:
        for path in sorted((REPO / folder).rglob("*.py")):
            if ".work" in path.parts:  # hack/cluster/.work: downloaded sources
                continue
            bad = top_level_imports(path) & forbidden
            if bad:
                found.append(f"{path.relative_to(REPO)} imports {sorted(bad)}")
    return found


def test_tools_benchmarks_and_examples_never_import_the_tests():
    assert offenders(("tools", "benchmarks", "examples", "hack"), {"tests"}) == []


def test_the_product_never_imports_the_tests_or_the_tools():
    found = offenders(("trainer_runtime", "operator/rtj_operator"), {"tests", "tools"})
    assert found == []
