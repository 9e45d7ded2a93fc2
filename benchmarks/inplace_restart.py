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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    samples: dict[str, list[float]] = {"in_place": [], "cold": []}
    with tempfile.TemporaryDirectory(prefix="rtj-inplace-") as root:
        for i in range(args.repeats):
            for side in ("in_place", "cold"):  # alternated, so load drifts hit both
                seconds = one(Path(root) / f"{side}-{i}", in_place=side == "in_place")
                samples[side].append(seconds)
                print(f"run {i + 1}/{args.repeats} {side}: {seconds:.2f} s", flush=True)
    inplace, cold = statistics.median(samples["in_place"]), statistics.median(samples["cold"])
    print("| recovery after a pod loss (3 -> 2 ranks) | median s | samples |")
    print("|---|---:|---|")
    for side, med in (("in place (agent)", inplace), ("cold start of the processes", cold)):
        key = "in_place" if side.startswith("in") else "cold"
        print(f"| {side} | {med:.2f} | {', '.join(f'{s:.2f}' for s in samples[key])} |")
    print(f"cold / in place: {cold / inplace:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"samples": samples, "ratio": cold / inplace}, indent=2))


if __name__ == "__main__":
    main()
