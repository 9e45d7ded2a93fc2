"""What the agent runs: the container's own command, read so that a restart can skip the imports.

A worker restarted in place is cheap only if it does not pay for the interpreter and ``import
torch`` again (seconds on a fast machine, more than ten on a loaded one: most of a restart). So
the agent imports them once and forks each worker from itself, then runs the training script in
the child as ``python`` would (``runpy``). That is possible for the commands a training
container runs in practice, which this module recognises:

- ``python [-u] train.py ARGS`` and ``python -m package.module ARGS`` (any ``python*`` binary);
- ``train.py ARGS`` (a script path);
- ``torchrun [--nproc-per-node K] [--standalone] train.py ARGS`` (or ``-m module``): the agent
  then plays torchrun's part on its pod, K workers with their local ranks; torchrun's other
  options are refused with a message, since the agent would silently drop them.

Anything else (a shell script, a binary) runs as a plain child process: a restart in place then
still skips the new pod, its scheduling and image pull, but not the interpreter's start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import ConfigError

FORK = "fork"
EXEC = "exec"


@dataclass(frozen=True)
class WorkerCommand:
    """How to start one worker: a script or module run in a forked child, or a command."""

    mode: str
    """``fork`` (``target`` is a script path or, with ``module``, a module name) or ``exec``."""
    target: str
    args: tuple[str, ...]
    module: bool = False
    nproc_per_node: int | None = None
    """Workers per pod: torchrun's ``--nproc-per-node``; None: its ``PET_NPROC_PER_NODE``
    (torchrun) or 1."""

    @property
    def argv(self) -> list[str]:
        """``sys.argv`` of the worker (fork) or the command line (exec)."""
        return [self.target, *self.args]


_TORCHRUN_FLAGS_WITH_VALUE = ("--nproc-per-node", "--nproc_per_node")
_TORCHRUN_FLAGS_IGNORED = ("--standalone",)


def parse(argv: list[str]) -> WorkerCommand:
    """The worker command for the container command ``argv`` (after the agent's ``--``)."""
    if not argv:
        raise ConfigError("agent: no command given: expected e.g. `-- python train.py ARGS`")
    head = os.path.basename(argv[0])
    if head.startswith("python"):
        return _python(argv[1:], argv)
    if head == "torchrun":
        return _torchrun(argv[1:])
    if argv[0].endswith(".py"):
        return WorkerCommand(FORK, argv[0], tuple(argv[1:]))
    return WorkerCommand(EXEC, argv[0], tuple(argv[1:]))


def _python(rest: list[str], whole: list[str]) -> WorkerCommand:
    while rest and rest[0] == "-u":
        rest = rest[1:]
    if len(rest) >= 2 and rest[0] == "-m":
        return WorkerCommand(FORK, rest[1], tuple(rest[2:]), module=True)
    if rest and not rest[0].startswith("-"):
        return WorkerCommand(FORK, rest[0], tuple(rest[1:]))
    return WorkerCommand(EXEC, whole[0], tuple(whole[1:]))  # -c, other flags: run it as it is


def _torchrun(rest: list[str]) -> WorkerCommand:
    nproc: int | None = None
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        flag, _, value = rest[0].partition("=")
        if flag in _TORCHRUN_FLAGS_IGNORED:
            rest = rest[1:]
            continue
        if flag not in _TORCHRUN_FLAGS_WITH_VALUE:
            raise ConfigError(
                f"agent: torchrun option {flag!r} is not supported in place of torchrun "
                "(the operator sets the rendezvous; only --nproc-per-node and --standalone "
                "are understood): drop it, or turn recovery.survivors off"
            )
        if not value:
            if len(rest) < 2:
                raise ConfigError(f"agent: torchrun {flag}: expected a number of processes")
            value, rest = rest[1], rest[2:]
        else:
            rest = rest[1:]
        if not value.isdigit() or int(value) < 1:
            raise ConfigError(f"agent: torchrun {flag}={value!r}: expected an integer >= 1")
        nproc = int(value)
    if len(rest) >= 2 and rest[0] == "-m":
        return WorkerCommand(FORK, rest[1], tuple(rest[2:]), module=True, nproc_per_node=nproc)
    if not rest:
        raise ConfigError("agent: torchrun without a training script")
    return WorkerCommand(FORK, rest[0], tuple(rest[1:]), nproc_per_node=nproc)
