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

``--mechanisms`` compares, for the shrink above, the mechanisms the survivors could use (the
choice docs/survivors.md records), each from the loss to the last surviving rank's first step:

- the product's agent (``in_place`` above: the pod stays, its workers are forked anew and
  resume from the newest commit);
- a cold start of the processes (``cold`` above): what a container restart rule
  (``restartPolicyRules``) has the kubelet do, without the kubelet's own part;
- torchrun's elastic agent: each pod runs ``torchrun --nnodes 2:3 --rdzv-backend c10d`` (pod 0
  hosts the rendezvous), and torchrun itself notices the failed workers, holds a new rendezvous
  round and starts new worker processes (it restarts them cold: no fork from a warm parent).
  ``last_call_timeout=1`` (default 30 s, the wait for more members once 2 are there) and
  ``--monitor-interval 0.1`` are set in its favour; a run whose workers do not train again
  within ``TORCHRUN_WAIT_S`` counts as failed;
- the process group re-formed inside the running processes (``reform_worker.py``, a prototype
  the product does not have): nothing restarts and nothing is loaded, the failed step is
  trained again.

A node loss there is SIGKILL to every process of the pod (torchrun starts its workers in
sessions of their own).

``--grow`` measures a warm join instead (2 -> 3 pods; the worker built with
``in_process_switch=True``): the third pod waits in standby while the gang trains, then every pod
is told the membership of 3, either with ``stop: save`` (the kept workers save, the agent
restarts them, every rank resumes from that commit) or with ``stop: switch`` (the running
workers switch in process and send the new rank the state: ``recovery.inProcessSwitch``). The
figure is the time from that announcement to the last rank's first step at 3.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.agentpods import ROOT, WORKER, Pods
from tools.ports import free_port

TORCHRUN_WAIT_S = 300.0
"""How long torchrun's survivors get to train again before the run counts as failed."""
REFORM_WORKER = Path(__file__).resolve().parent / "reform_worker.py"
MECHANISMS = {
    "in_place": "the product's agent: workers forked anew in the kept pods",
    "cold": "the processes cold-started in the pods (a container restart rule)",
    "torchrun": "torchrun's elastic agent (c10d rendezvous)",
    "in_process": "process group re-formed in the running processes (prototype)",
}


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


def one(tmp: Path, *, in_place: bool, extra: tuple[str, ...] = ()) -> float:
    pods = Pods(tmp, steps=100000, step_s=0.1, extra=extra)
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


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (torchrun's workers run in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def kill_tree(proc: subprocess.Popen) -> None:
    for pid in process_tree(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def _plain_env() -> dict[str, str]:
    """This process's environment without the rendezvous and runtime variables of a pod."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RTJ_", "MASTER_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE")
    }
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def one_torchrun(tmp: Path, extra: tuple[str, ...] = ()) -> float:
    """3 pods of ``torchrun --nnodes 2:3``; pod 2 lost; torchrun re-forms the gang of 2."""
    pods = Pods(tmp, steps=100000, step_s=0.1, extra=extra)
    port = free_port()
    procs: list[subprocess.Popen] = []
    env = {**_plain_env(), "RTJ_MEMBERSHIP_EPOCH": "1", "LOGLEVEL": "INFO"}
    head = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2:3"]
    head += ["--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-id", "bench"]
    head += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", "last_call_timeout=1"]
    head += ["--max-restarts", "3", "--monitor-interval", "0.1"]
    try:
        for r in range(3):
            log = open(tmp / f"torchrun{r}.log", "ab")  # noqa: SIM115 - owned by the child
            procs.append(
                subprocess.Popen(
                    [*head, str(WORKER), *pods.args],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=ROOT,
                )
            )
            time.sleep(0.5)  # pod 0 first: it hosts the rendezvous
        pods.wait_steps(1, 8)
        kill_tree(procs[2])
        lost_at = time.time()
        # torchrun's first restart is membership epoch 1 + restart count 1 in the worker's files
        return wait_first_steps(pods, 2, 2, timeout=TORCHRUN_WAIT_S) - lost_at
    finally:
        for proc in procs:
            kill_tree(proc)


def one_in_process(tmp: Path, extra: tuple[str, ...] = ()) -> float:
    """3 processes of ``reform_worker.py``; one lost; the other two re-form without ending. The
    processes are ``Pods``' (their step files, logs, loss and membership files), started as the
    prototype rather than under the agent."""
    import datetime  # noqa: PLC0415 - only this side needs them

    from torch.distributed import TCPStore  # noqa: PLC0415

    pods = Pods(tmp, steps=100000, step_s=0.1, extra=extra)
    port = free_port()
    timeout = datetime.timedelta(seconds=60)
    # the agent's rendezvous store, kept across memberships
    store = TCPStore("127.0.0.1", port, None, True, timeout=timeout, wait_for_workers=False)
    try:
        for r in range(3):
            name = f"reform{r}"
            log = open(tmp / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
            args = ["--out", str(pods.out), "--membership", str(tmp / f"membership-{name}")]
            args += ["--store-port", str(port), "--step-s", "0.1", *extra]
            pods.pods[name] = subprocess.Popen(
                [sys.executable, str(REFORM_WORKER), *args],
                env={**_plain_env(), "RANK": str(r), "WORLD_SIZE": "3"},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=ROOT,
            )
        pods.wait_steps(1, 8)
        lost_at = pods.lose("reform2")
        for r in range(2):  # the operator's membership, as in the agent's side
            pods.announce(f"reform{r}", epoch=2, rank=r, world=2)
        return wait_first_steps(pods, 2, 2, timeout=120) - lost_at
    finally:
        stop(pods)
        del store


def wait_standby(pods: Pods, name: str, timeout: float = 120) -> None:
    log = pods.tmp / f"{name}.log"
    end = time.monotonic() + timeout
    while "waiting to be named" not in (log.read_text() if log.exists() else ""):
        if time.monotonic() > end:
            raise TimeoutError(pods.logs())
        time.sleep(0.05)


def one_replacement(tmp: Path, *, spare: bool, extra: tuple[str, ...] = ()) -> float:
    pods = Pods(tmp, steps=100000, step_s=0.1, extra=extra)
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


def one_grow(tmp: Path, *, stop_mode: str, extra: tuple[str, ...] = ()) -> float:
    pods = Pods(tmp, steps=100000, step_s=0.1, extra=(*extra, "--switch"))
    port, port2 = free_port(), free_port()
    for r in range(2):
        pods.start(f"pod{r}", node_rank=r, nnodes=2, port=port, epoch=1)
    try:
        pods.start("new2", node_rank=2, nnodes=3, port=port2, epoch=2, RTJ_STANDBY="1")
        wait_standby(pods, "new2")
        pods.wait_steps(1, 8)
        announced_at = time.time()
        for r, name in enumerate(("pod0", "pod1", "new2")):
            pods.announce(name, epoch=2, nnodes=3, nodeRank=r, masterPort=port2, stop=stop_mode)
        return wait_first_steps(pods, 2, 3) - announced_at
    finally:
        stop(pods)


def run_side(side: str, tmp: Path, width: int) -> float:
    """One sample of ``side``: seconds from the loss (or the grow's announcement) to the
    measured first step."""
    extra = ("--width", str(width))
    if side in ("save", "switch"):
        return one_grow(tmp, stop_mode=side, extra=extra)
    if side in ("warm_spare", "cold_pod"):
        return one_replacement(tmp, spare=side == "warm_spare", extra=extra)
    if side == "torchrun":
        return one_torchrun(tmp, extra)
    if side == "in_process":
        return one_in_process(tmp, extra)
    return one(tmp, in_place=side == "in_place", extra=extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument(
        "--replace", action="store_true", help="fixed size: a cold replacement pod or a warm spare"
    )
    mode.add_argument(
        "--grow",
        action="store_true",
        help="a warm join 2 -> 3: the kept workers restarted (stop: save) or switched in process",
    )
    mode.add_argument(
        "--mechanisms",
        action="store_true",
        help="the shrink under each mechanism: the agent, cold processes, torchrun's elastic "
        "agent, a process group re-formed in the running processes",
    )
    ap.add_argument(
        "--width",
        type=int,
        default=16,
        help="the trainer's hidden layer (10 x width + 1 parameters): 16 (default) is 0.6 KiB of "
        "weights and as much momentum; 4000000, 153 MiB of each",
    )
    args = ap.parse_args()
    if args.grow:
        sides = {"save": "kept workers restarted (stop: save)", "switch": "in-process switch"}
        title = "warm join, announcement -> every rank training at 3 (2 -> 3 ranks)"
    elif args.replace:
        sides = {"warm_spare": "warm spare (standby)", "cold_pod": "cold replacement pod"}
        title = "recovery after a pod loss, replaced (3 -> 3 ranks)"
    elif args.mechanisms:
        sides = MECHANISMS
        title = "recovery after a pod loss (3 -> 2 ranks), by mechanism"
    else:
        sides = {"in_place": "in place (agent)", "cold": "cold start of the processes"}
        title = "recovery after a pod loss (3 -> 2 ranks)"
    samples: dict[str, list[float]] = {side: [] for side in sides}
    failures: dict[str, list[str]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="rtj-inplace-") as root:
        for i in range(args.repeats):
            for side in sides:  # alternated, so load drifts hit every side
                tmp = Path(root) / f"{side}-{i}"
                try:
                    seconds = run_side(side, tmp, args.width)
                except TimeoutError as exc:
                    if not args.mechanisms:
                        raise
                    failures[side].append(str(exc).splitlines()[0] if str(exc) else "timeout")
                    print(f"run {i + 1}/{args.repeats} {side}: did not train again", flush=True)
                    continue
                samples[side].append(seconds)
                print(f"run {i + 1}/{args.repeats} {side}: {seconds:.2f} s", flush=True)
    first = next(iter(sides))
    base = statistics.median(samples[first]) if samples[first] else float("nan")
    print(f"| {title} | median s | x {first} | samples | failed runs |")
    print("|---|---:|---:|---|---:|")
    medians: dict[str, float | None] = {}
    for side, label in sides.items():
        med = statistics.median(samples[side]) if samples[side] else None
        medians[side] = med
        shown = f"{med:.2f}" if med is not None else "-"
        ratio = f"{med / base:.2f}x" if med is not None else "-"
        listed = ", ".join(f"{s:.2f}" for s in samples[side])
        print(f"| {label} | {shown} | {ratio} | {listed} | {len(failures[side])} |")
    if args.json:
        report = {"width": args.width, "samples": samples, "medians": medians}
        report |= {"failures": failures, "base": first}
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
