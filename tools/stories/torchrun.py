"""The spot story for a job with several processes per pod, started by a flagless ``torchrun``.

``tools/localstack`` tells the one-process-per-pod story: its ``Story`` loses a node by reclaim
or by notice. A torchrun job needs more, kept here rather than in that package (which the demo
shares):

* the reference run at the job's world size (``replicas * processesPerPod``) comes from
  ``tools.localstack.start_reference_run``, which maps ``torchrun x.py`` to plain processes;
* a third way to lose a node, ``shutdown``: a graceful node shutdown with no notice first, so the
  only warning the ranks get is the SIGTERM torchrun forwards to them;
* the exit code a container ended with, which the pod runner logs (the pod object is gone by the
  time the story ends).

Rejected: a third mode inside ``Story.run``; it would grow the shared package for one scenario.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tools.localstack import (
    LocalStack,
    Story,
    StoryResult,
    script_command,
    start_reference_run,
    world_size,
)

__all__ = [
    "ContainerEnd",
    "TorchrunStory",
    "container_end",
    "container_exit",
    "script_command",
    "start_reference_run",
    "world_size",
]


class TorchrunStory(Story):
    """``Story`` with a third way to lose the node of pod 1: ``shutdown``, a graceful node
    shutdown without a notice (DisruptionTarget, SIGTERM to the container's first process,
    the grace period, then the Node is deleted)."""

    LOSSES = ("reclaim", "notice", "shutdown")

    def run(self, lose: str = "reclaim") -> StoryResult:
        """Submit, lose the node of pod 1 after a few checkpoints, wait for success."""
        if lose not in self.LOSSES:
            raise ValueError(f"lose={lose!r}: expected one of {', '.join(self.LOSSES)}")
        self._without_notice = lose == "shutdown"
        result = super().run("notice" if self._without_notice else lose)
        if self._without_notice:
            result.notice = None
        return result

    def _notice_then_shutdown(self, node: str) -> tuple[str, int]:
        if not self._without_notice:
            return super()._notice_then_shutdown(node)
        self._at_loss = self._status()
        self.narrator.say(
            f">>> node {node} (pod 1) shuts down without notice: its pods get SIGTERM and their "
            "grace period, then the machine is gone and its Node deleted"
        )
        self.stack.shut_down_node(node)
        return ("", -1)  # no notice checkpoint; run() clears it


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
