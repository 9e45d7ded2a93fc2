"""The spot story for a job with several processes per pod, started by a flagless ``torchrun``.

``tools/localstack.py`` tells the one-process-per-pod story: its reference run starts one plain
process per pod and its ``Story`` loses a node by reclaim or by notice. A torchrun job needs
three more things, kept here rather than in that module (which the demo shares):

* the reference run at the job's world size (``replicas * processesPerPod``), as plain
  processes with ``RANK``/``WORLD_SIZE`` set: torchrun only starts processes, it does not change
  what they compute, and without it the reference cannot fail for a launcher reason;
* a third way to lose a node, ``shutdown``: a graceful node shutdown with no notice first, so the
  only warning the ranks get is the SIGTERM torchrun forwards to them;
* the exit code a container ended with, which the pod runner logs (the pod object is gone by the
  time the story ends).

Rejected: a ``--world`` parameter on ``localstack.start_reference_run`` and a third mode inside
``Story.run``; both would grow the shared module for one scenario.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tools.localstack import (
    REPO,
    LocalStack,
    ReferenceRun,
    Story,
    StoryResult,
    training_command,
)
from tools.ports import free_port

LAUNCHERS = ("torchrun",)
"""``argv[0]`` names that start ``torch.distributed.run`` (as the pod runner maps them)."""


def job_spec(manifest: Path) -> dict:
    """The ``spec`` of the manifest's ResumableTrainingJob."""
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    return dict(next(d for d in docs if d.get("kind") == "ResumableTrainingJob")["spec"])


def world_size(manifest: Path) -> int:
    """``replicas * processesPerPod`` of the manifest's job."""
    spec = job_spec(manifest)
    return int(spec["replicas"]) * int(spec.get("processesPerPod", 1))


def script_command(manifest: Path) -> list[str]:
    """The training command with its launcher replaced by this interpreter: ``torchrun x.py``
    and ``python x.py`` both become ``<python> x.py`` (paths under ``/app`` mapped here)."""
    argv = training_command(manifest)
    if Path(argv[0]).name in LAUNCHERS or Path(argv[0]).name.startswith("python"):
        argv = [sys.executable, *argv[1:]]
    else:
        raise ValueError(f"{manifest}: command {argv[0]!r}: expected torchrun or python")
    return [a.replace("/app/", f"{REPO}/") for a in argv]


def start_reference_run(manifest: Path, workdir: Path) -> ReferenceRun:
    """The manifest's training, uninterrupted, as ``world_size`` plain local processes.

    Same script and arguments, except what cannot change the weights: no ``--step-sleep``, a
    local checkpoint folder instead of the operator's environment, ``--out`` here.
    """
    world = world_size(manifest)
    argv = [a for a in script_command(manifest) if not a.startswith(("--out=", "--step-sleep="))]
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "reference.pt"
    argv += ["--folder", str(workdir / "checkpoints"), "--run-name", "reference", "--out", str(out)]
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RTJ_", "AWS_", "KUBERNETES_", "PET_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        and k not in ("MASTER_ADDR", "MASTER_PORT")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    port = str(free_port())
    log = workdir / "reference.log"
    procs = []
    with open(log, "ab") as handle:
        for rank in range(world):
            rank_env = {
                **env,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
            }
            procs.append(
                subprocess.Popen(
                    argv,
                    env=rank_env,
                    cwd=REPO,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    return ReferenceRun(procs, out, log)


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


def container_exit(stack: LocalStack, node: str, pod: str, container: str = "trainer") -> int:
    """The exit code the pod runner of ``node`` logged for a container of ``pod``."""
    log = (stack.node_workdir(node) / "agent.log").read_text(errors="replace")
    pattern = re.compile(
        rf"{re.escape(stack.cfg.namespace)}/{re.escape(pod)}: (?:exited|killed) "
        rf"{re.escape(container)} pid=\d+ exit=(\d+)"
    )
    found = pattern.findall(log)
    if not found:
        raise AssertionError(f"no exit of {pod}/{container} in the agent log of {node}")
    return int(found[-1])
