"""Read the Dockerfile and replay its build stages without a Docker engine.

No Docker engine runs on the machines that test this project, so the image builds themselves
cannot run. What can run is every instruction of the build stages, in order, on this machine:
``ENV`` sets the environment, ``WORKDIR`` and absolute paths live under a temporary directory that
stands in for the image's root filesystem, ``COPY`` copies from the build context (filtered by
``.dockerignore``, as Docker sends it), and ``RUN`` runs the very same shell command. A build
stage that uses any other instruction fails the replay, so the test can never silently skip part
of what Docker would run. The only differences are listed in ``Replay.overrides``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


@dataclass
class Instruction:
    """One Dockerfile instruction: its keyword (upper case), flags and the rest of the line."""

    keyword: str
    flags: dict[str, str]
    args: str
    line: int


@dataclass
class Stage:
    """One FROM ... AS name block."""

    name: str
    base: str
    instructions: list[Instruction] = field(default_factory=list)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    out, buf, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if not buf:
            start = number
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append((start, buf + line))
        buf = ""
    return out


def _expand(value: str, variables: dict[str, str]) -> str:
    def sub(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return variables.get(name, "")

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, value)


def parse(path: Path = DOCKERFILE) -> tuple[dict[str, str], dict[str, Stage]]:
    """Global ARG defaults and the stages by name (in file order)."""
    global_args: dict[str, str] = {}
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for number, line in _logical_lines(path.read_text()):
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        flags: dict[str, str] = {}
        rest = rest.strip()
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            key, _, value = flag[2:].partition("=")
            flags[key] = value
            rest = rest.strip()
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else f"#{len(stages)}"
            current = Stage(name=name, base=_expand(words[0], global_args))
            stages[name] = current
        elif current is None:
            if keyword == "ARG":
                key, _, value = rest.partition("=")
                global_args[key] = _expand(value, global_args)
        else:
            current.instructions.append(Instruction(keyword, flags, rest, number))
    return global_args, stages


def stage_chain(stages: dict[str, Stage], name: str) -> list[Stage]:
    """The stage and the stages it is built FROM, outermost first."""
    chain = [stages[name]]
    while chain[0].base in stages:
        chain.insert(0, stages[chain[0].base])
    return chain


# --- .dockerignore ------------------------------------------------------------------------------


def _glob_regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out)


def ignore_patterns(path: Path = DOCKERIGNORE) -> list[tuple[bool, re.Pattern[str]]]:
    """(is an exception, regex) per line, in order."""
    patterns = []
    for raw in path.read_text().splitlines() if path.exists() else []:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        cleaned = os.path.normpath(line.lstrip("!").strip().lstrip("/"))
        patterns.append((negate, _glob_regex(cleaned)))
    return patterns


def is_ignored(rel: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parents decides."""
    parts = rel.strip("/").split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    ignored = False
    for negate, regex in patterns:
        if any(regex.fullmatch(p) for p in prefixes):
            ignored = not negate
    return ignored


def context_files(src: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> list[Path]:
    """Files of the build context under ``src`` (a file or a folder), as Docker would send."""
    base = ROOT / src
    candidates = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
    return [p for p in candidates if not is_ignored(str(p.relative_to(ROOT)), patterns)]


# --- replay -------------------------------------------------------------------------------------


@dataclass
class Replay:
    """Runs the ENV/WORKDIR/COPY/RUN instructions of a build stage under ``fs_root``."""

    fs_root: Path
    uv: str
    overrides: dict[str, str | None]
    """Environment set after every ENV: the interpreter to use, the uv cache policy. None unsets."""
    log: list[str] = field(default_factory=list)

    def path(self, container_path: str) -> Path:
        """Where a path of the image lives on this machine."""
        return self.fs_root / container_path.lstrip("/")

    def run_stage(self, stages: dict[str, Stage], name: str, global_args: dict[str, str]) -> None:
        """Replay ``name`` and the stages it builds on; raise on any failure."""
        env = {
            k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV" and not k.startswith("UV_")
        }
        env["PATH"] = f"{Path(self.uv).parent}{os.pathsep}{env.get('PATH', '')}"
        variables = dict(global_args)
        workdir = self.fs_root
        patterns = ignore_patterns()
        for stage in stage_chain(stages, name):
            for ins in stage.instructions:
                where = f"Dockerfile:{ins.line} ({stage.name})"
                if ins.keyword == "ARG":
                    key, _, value = ins.args.partition("=")
                    variables.setdefault(key, value)
                elif ins.keyword == "ENV":
                    for item in shlex.split(ins.args):
                        key, _, value = item.partition("=")
                        value = _expand(value, {**env, **variables})
                        env[key] = str(self.path(value)) if value.startswith("/") else value
                        variables[key] = env[key]
                    for key, value in self.overrides.items():
                        if value is None:
                            env.pop(key, None)
                        else:
                            env[key] = value
                elif ins.keyword == "WORKDIR":
                    workdir = (
                        self.path(ins.args) if ins.args.startswith("/") else workdir / ins.args
                    )
                    workdir.mkdir(parents=True, exist_ok=True)
                elif ins.keyword == "COPY" and "from" in ins.flags:
                    # Only the uv binary comes from another image; the host's uv stands in.
                    if ins.flags["from"] != "uv":
                        raise AssertionError(
                            f"{where}: COPY --from={ins.flags['from']} in a "
                            "build stage cannot be replayed"
                        )
                elif ins.keyword == "COPY":
                    *sources, dest = shlex.split(ins.args)
                    target = self.path(dest) if dest.startswith("/") else workdir / dest
                    for src in sources:
                        files = context_files(src, patterns)
                        if not files:
                            raise AssertionError(f"{where}: COPY {src}: nothing in the context")
                        for file in files:
                            inner = (
                                file.relative_to(ROOT / src)
                                if (ROOT / src).is_dir()
                                else Path(file.name)
                            )
                            out = target / inner
                            out.parent.mkdir(parents=True, exist_ok=True)
                            shutil.copy2(file, out)
                elif ins.keyword == "RUN":
                    self.log.append(f"$ {ins.args}")
                    proc = subprocess.run(
                        ["/bin/sh", "-c", ins.args],
                        cwd=workdir,
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=900,
                        check=False,
                    )
                    self.log.append(proc.stdout[-2000:] + proc.stderr[-4000:])
                    if proc.returncode != 0:
                        raise AssertionError(
                            f"{where}: RUN {ins.args} exited "
                            f"{proc.returncode}\n" + "\n".join(self.log)
                        )
                elif ins.keyword not in ("LABEL",):
                    raise AssertionError(
                        f"{where}: {ins.keyword} cannot be replayed; keep build "
                        "stages to ENV, WORKDIR, COPY and RUN"
                    )
