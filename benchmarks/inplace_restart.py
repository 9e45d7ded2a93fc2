"""Loss of a pod -> every surviving rank training again: in place (the agent) against a cold start.

Both sides run the same DDP trainer (tests/multiproc/survivor_worker.py, 0.1 s steps, a commit
every 5 steps) as 3 pods on this machine; a node loss is SIGKILL to one pod's session, and the
gang goes on as 2 (a shrink: no replacement to wait for, so the figure is the survivors' own).

- in place: each pod runs under ``python -m trainer_runtime.agent``; the benchmark writes the new
  membership into the two staying pods' files the moment the third is lost;
- cold: the two staying processes are killed and two new ones started (what a whole-gang
  resubmission does inside the new pods, without the Kubernetes part: no pod deletion,
  scheduling, image pull or container start, so the cold side is a lower bound).

The figure is the time from the loss to the last surviving rank's first step after resuming,
median of ``--repeats`` runs, and the ratio cold / in place. ``--json`` writes the samples.

``--replace`` measures the fixed-size case instead: the gang stays at 3, so the lost place needs
a new pod, and the survivors (in place, under the agent) wait for it. Two sides:

- cold pod: the replacement starts when the loss is seen (a new pod's process: the interpreter,
  ``import torch``; no scheduling, container or image, so again a lower bound of the gap);
- warm spare: a standby pod (``RTJ_STANDBY=1``, what ``recovery.spares`` keeps) started before
  the loss is named into the gang at once.

The figure is then the time from the loss to the last rank of the new gang of 3 (the
replacement included) at its first step.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.agentpods import Pods
from tools.ports import free_port


def wait_first_steps(pods: Pods, epoch: int, ranks: int, timeout: float = 180) -> float:
    end = time.monotonic() + timeout
    paths = [pods.out / f"first-{epoch}-{r}" for r in range(ranks)]
    while not all(p.exists() for p in paths):
        if time.monotonic() > end:
            raise TimeoutError(pods.logs())
        time.sleep(0.02)
    return max(float(p.read_text()) for p in paths)


def stop(pods: Pods) -> None:
    for name, proc in pods.pods.items():
        if name not in pods.lost and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def one(tmp: Path, *, in_place: bool) -> float:
    pods = Pods(tmp, steps=100000, step_s=0.1)
    port = free_port()
    for r in range(3):
        pods.start(f"pod{r}", node_rank=r, nnodes=3, port=port, epoch=1, agent=in_place)
    try:
        pods.wait_steps(1, 8)
        lost_at = pods.lose("pod2")
        port2 = free_port()
        if in_place:
            for r in range(2):
                pods.announce(f"pod{r}", epoch=2, nnodes=2, nodeRank=r, masterPort=port2)
        else:
            for r in range(2):
                os.killpg(pods.pods[f"pod{r}"].pid, signal.SIGKILL)
                pods.pods[f"pod{r}"].wait(10)
                pods.lost.add(f"pod{r}")
            for r in range(2):
                pods.start(f"new{r}", node_rank=r, nnodes=2, port=port2, epoch=2, agent=False)
        return wait_first_steps(pods, 2, 2) - lost_at
    finally:
        stop(pods)


def wait_standby(pods: Pods, name: str, timeout: float = 120) -> None:
    log = pods.tmp / f"{name}.log"
    end = time.monotonic() + timeout
    while "waiting to be named" not in (log.read_text() if log.exists() else ""):
        if time.monotonic() > end:
            raise TimeoutError(pods.logs())
        time.sleep(0.05)


def one_replacement(tmp: Path, *, spare: bool) -> float:
    pods = Pods(tmp, steps=100000, step_s=0.1)
    port, port2 = free_port(), free_port()
    for r in range(3):
        pods.start(f"pod{r}", node_rank=r, nnodes=3, port=port, epoch=1)
    try:
        if spare:
            pods.start("spare", node_rank=2, nnodes=3, port=port2, epoch=2, RTJ_STANDBY="1")
            wait_standby(pods, "spare")
        pods.wait_steps(1, 8)
        lost_at = pods.lose("pod2")
        for r in range(2):
            pods.announce(f"pod{r}", epoch=2, nnodes=3, nodeRank=r, masterPort=port2)
        if spare:
            pods.announce("spare", epoch=2, nnodes=3, nodeRank=2, masterPort=port2)
        else:
            pods.start("new2", node_rank=2, nnodes=3, port=port2, epoch=2)
        return wait_first_steps(pods, 2, 3) - lost_at
    finally:
        stop(pods)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--replace", action="store_true", help="fixed size: a cold replacement pod or a warm spare"
    )
    args = ap.parse_args()
    if args.replace:
        sides = {"warm_spare": "warm spare (standby)", "cold_pod": "cold replacement pod"}
        title = "recovery after a pod loss, replaced (3 -> 3 ranks)"
    else:
        sides = {"in_place": "in place (agent)", "cold": "cold start of the processes"}
        title = "recovery after a pod loss (3 -> 2 ranks)"
    samples: dict[str, list[float]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="rtj-inplace-") as root:
        for i in range(args.repeats):
            for side in sides:  # alternated, so load drifts hit both
                tmp = Path(root) / f"{side}-{i}"
                if args.replace:
                    seconds = one_replacement(tmp, spare=side == "warm_spare")
                else:
                    seconds = one(tmp, in_place=side == "in_place")
                samples[side].append(seconds)
                print(f"run {i + 1}/{args.repeats} {side}: {seconds:.2f} s", flush=True)
    fast, slow = (statistics.median(samples[side]) for side in sides)
    print(f"| {title} | median s | samples |")
    print("|---|---:|---|")
    for side, label in sides.items():
        med = statistics.median(samples[side])
        print(f"| {label} | {med:.2f} | {', '.join(f'{s:.2f}' for s in samples[side])} |")
    names = list(sides)
    print(f"{names[1]} / {names[0]}: {slow / fast:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"samples": samples, "ratio": slow / fast}, indent=2))


if __name__ == "__main__":
    main()
