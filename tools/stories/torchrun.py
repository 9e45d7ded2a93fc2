"""What the spot story needs beyond itself for a job with several processes per pod, started by
a flagless ``torchrun``.

The story is the shared one (``tools/stories/spot.py``, on ``PodRunnerCluster``); its
``shutdown`` interruption (a graceful node shutdown with no notice first) is the one where the
only warning the ranks get is the SIGTERM torchrun forwards to them. What stays here:

* the reference run at the job's world size (``replicas * processesPerPod``) comes from
  ``tools.localstack.start_reference_run``, which maps ``torchrun x.py`` to plain processes;
* the exit code a container ended with, which the pod runner logs (the pod object is gone by the
  time the story ends).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tools.localstack import (
    LocalStack,
    script_command,
    start_reference_run,
    world_size,
)

__all__ = [
    "ContainerEnd",
    "container_end",
    "container_exit",
    "script_command",
    "start_reference_run",
    "world_size",
]


@dataclass(frozen=True)
class ContainerEnd:
    """How the pod runner saw a container end."""

    stopped: bool
    """True when the runner stopped it (a deletion's SIGTERM): ``killed`` in its log; False when
    the process ended by itself (``exited``)."""
    exit_code: int
    signal: int | None
    """The signal that ended the process, when one did (its exit code is then 128+signal)."""


def container_end(
    stack: LocalStack, node: str, pod: str, container: str = "trainer"
) -> ContainerEnd:
    """The last end the pod runner of ``node`` logged for a container of ``pod``."""
    log = (stack.node_workdir(node) / "agent.log").read_text(errors="replace")
    pattern = re.compile(
        rf"{re.escape(stack.cfg.namespace)}/{re.escape(pod)}: (exited|killed) "
        rf"{re.escape(container)} pid=\d+ exit=(\d+)(?: signal=(\d+))?"
    )
    found = pattern.findall(log)
    if not found:
        raise AssertionError(f"no exit of {pod}/{container} in the agent log of {node}")
    verb, code, sig = found[-1]
    return ContainerEnd(verb == "killed", int(code), int(sig) if sig else None)


def container_exit(stack: LocalStack, node: str, pod: str, container: str = "trainer") -> int:
    """The exit code the pod runner of ``node`` logged for a container of ``pod``."""
    return container_end(stack, node, pod, container).exit_code
