"""Both halves of the pod contract (docs/operator.md) name the same variables."""

import ast
from pathlib import Path

from trainer_runtime import envvars as runtime_env

OPERATOR_ENV = (
    Path(__file__).resolve().parents[2] / "operator" / "rtj_operator" / "api" / "envvars.py"
)


def operator_constants() -> dict[str, object]:
    """Read the operator's module as source: the runtime's test env need not install kopf."""
    tree = ast.parse(OPERATOR_ENV.read_text())
    names: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            value = node.value
            if isinstance(value, ast.Constant):
                names[node.targets[0].id] = value.value
            elif isinstance(value, ast.Tuple):
                names[node.targets[0].id] = tuple(names[e.id] for e in value.elts)
    return names


def test_every_injected_variable_is_read_by_the_runtime_under_the_same_name():
    op = operator_constants()
    assert op["ALL_RTJ"] == runtime_env.ALL_RTJ
    assert op["TORCHRUN"] == runtime_env.TORCHRUN
    for name in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NOTICE_ANNOTATION",
        "PROGRESS_ANNOTATION",
        "MEMBERSHIP_ANNOTATION",
        "AGENT_READY_ANNOTATION",
        "PEER_LOST_ANNOTATION",
        "STANDBY",
        "MEMBERSHIP_CHANGED",
        "MEMBERSHIP_EPOCH",
        "MEMBERSHIP_FILE",
        "TOTAL_STEPS",
        "MTBI_SECONDS",
        "INTERRUPTIONS",
    ):
        assert op[name] == getattr(runtime_env, name), name


def imported_modules(folder: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in folder.rglob("*.py"):
        mods: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                mods |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods.add(node.module.split(".")[0])
        found[str(path)] = mods
    return found


def test_runtime_never_imports_the_operator_side():
    for path, mods in imported_modules(Path(runtime_env.__file__).parent).items():
        assert not mods & {"kopf", "kubernetes", "rtj_operator"}, path


def test_operator_never_imports_torch():
    for path, mods in imported_modules(OPERATOR_ENV.parent).items():
        assert not mods & {"torch", "trainer_runtime", "numpy"}, path
