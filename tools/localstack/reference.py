"""The uninterrupted run to compare with, and the bitwise comparison of final weights.

The e2e story's claim is "the same weights as if nothing had happened"; this module is the
"as if nothing had happened": the manifest's own training command, run as plain local processes
next to the stack (it overlaps with the bring-up), then ``weights_equal`` on the two results.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from tools.ports import free_port

from .common import REPO, StackError
from .facts import training_command


@dataclass
class ReferenceRun:
    """The same training, uninterrupted, as plain local processes: the weights to compare with."""

    procs: list[subprocess.Popen[bytes]]
    out: Path
    log: Path

    def wait(self, timeout: float = 300) -> Path:
        """Wait for every rank; the final weights (StackError when a rank failed)."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                code = proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise StackError(f"the reference run took longer than {timeout:.0f}s") from None
            if code != 0:
                self.kill()
                tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
                raise StackError(f"the reference run failed (exit {code}):\n{tail}")
        return self.out

    def kill(self) -> None:
        """Stop it (tear-down)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)


LAUNCHERS = ("torchrun",)
"""``argv[0]`` names that start ``torch.distributed.run`` (as the pod runner maps them)."""


def world_size(manifest: Path) -> int:
    """``replicas * processesPerPod`` of the manifest's ResumableTrainingJob."""
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    spec = next(d for d in docs if d.get("kind") == "ResumableTrainingJob")["spec"]
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
    local checkpoint folder instead of the operator's environment, ``--out`` here. A torchrun
    job runs as its ``replicas * processesPerPod`` processes with ``RANK``/``WORLD_SIZE`` set:
    torchrun only starts processes, it does not change what they compute.
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


def weights_equal(a: Path, b: Path) -> tuple[bool, str]:
    """Whether two saved state dicts are bitwise equal; a one-line explanation."""
    import torch  # noqa: PLC0415 - only the comparison needs it

    left = torch.load(a, weights_only=True)
    right = torch.load(b, weights_only=True)
    if left.keys() != right.keys():
        return False, f"different keys: {sorted(left)} vs {sorted(right)}"
    for key in left:
        x, y = left[key], right[key]
        if x.dtype != y.dtype or x.shape != y.shape:
            return False, f"{key}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}"
        if not torch.equal(x.view(-1).view(torch.uint8), y.view(-1).view(torch.uint8)):
            diff = (x.double() - y.double()).abs().max().item()
            return False, f"{key}: differs (max abs difference {diff:.3g})"
    return True, f"{len(left)} tensors, bit for bit"
