"""A DDP training process for membership changes in place (run under trainer_runtime.agent).

Each step takes the global batch ``step`` (the same samples whatever the world size; this rank's
share by rank), appends ``epoch step rank ids`` to ``<out>/fed-<epoch>-<rank>.txt`` before its
backward pass and to ``<out>/steps-<epoch>-<rank>.txt`` once the gradients' all-reduce is done
(from then on the step's update holds every rank's samples, and a survivor may save it:
trainer_runtime/save/survivor.py), and sleeps ``--step-s`` (the emulated
step time). Rank 0 writes ``<out>/final.pt`` (the model and
optimizer state) at the end, and every rank writes ``<out>/first-<epoch>-<rank>`` with the wall
time of its first step, so a test can time how long a membership change took, and
``<out>/inherited-<epoch>-<rank>`` says whether it started with ``torch._inductor`` imported.
With ``--switch`` it is built for the in-process switch (``in_process_switch=True``, the module
wrapped after ``resume()`` and again after each ``MembershipSwitched``, as docs/survivors.md
shows) and writes ``<out>/switched-<epoch>-<rank>`` (its pid and the switch's seconds) when it
switched, and ``<out>/pid-<epoch>-<rank>`` at its first step of each membership; every rank
writes ``<out>/final-<rank>.pt``. With ``--rejoin`` too, a failed step's exception goes to
``ckpt.rejoin`` (a peer lost without notice, re-formed in process), which writes
``<out>/rejoined-<epoch>-<rank>`` (its pid).
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tools.emulated_step import end_step
from trainer_runtime import CheckpointManager, MembershipSwitched

GLOBAL_BATCH = 12  # divisible by 1, 2, 3, 4 and 6 ranks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--step-s", type=float, default=0.1)
    ap.add_argument("--interval", default="5ba")
    ap.add_argument("--width", type=int, default=16, help="the hidden layer (the state's size)")
    ap.add_argument("--switch", action="store_true", help="in_process_switch=True")
    ap.add_argument(
        "--rejoin", action="store_true", help="with --switch: a failed step goes to ckpt.rejoin"
    )
    args = ap.parse_args()
    if args.switch:
        switching(args)
        return
    out = Path(args.out)
    # torchrun's elastic agent restarts the workers with the same environment but for its count
    epoch = str(
        int(os.environ.get("RTJ_MEMBERSHIP_EPOCH", "0"))
        + int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    )
    inherited = "torch._inductor" in sys.modules  # the agent's preload (trainer_runtime/agent)

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    (out / f"inherited-{epoch}-{rank}").write_text("torch._inductor" if inherited else "")
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(8, args.width), torch.nn.Linear(args.width, 1))
    # one gradient-bucket layout for the whole run: bitwise equal across a restart
    # (docs/runtime.md, "Exact resume at more than two ranks")
    model = DistributedDataParallel(inner, find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ckpt = CheckpointManager(
        model=model, optimizer=opt, folder=args.folder, run_name="survivors", interval=args.interval
    )
    ckpt.resume()
    train_steps(model, opt, ckpt, args, epoch)
    ckpt.close()
    if rank == 0:
        torch.save(
            {"model": model.module.state_dict(), "optim": opt.state_dict()}, out / "final.pt"
        )
    dist.destroy_process_group()


def train_steps(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    ckpt: CheckpointManager,
    args: argparse.Namespace,
    epoch: str,
) -> None:
    """The loop both kinds of worker run: one global batch a step, logged as fed before the
    backward pass and as trained once its gradients are all-reduced."""
    out, rank, world = Path(args.out), dist.get_rank(), dist.get_world_size()
    first = True
    for step in ckpt.steps(args.steps):
        ids = list(range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH))[rank::world]
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(GLOBAL_BATCH, 8, generator=gen)[rank::world]
        loss = model(x).square().mean()
        # the samples this rank feeds into the step, logged before its gradients leave it: a
        # rank killed right after the all-reduce has its share in the update and in this log
        with open(out / f"fed-{epoch}-{rank}.txt", "a") as log:
            log.write(f"{epoch} {step} {rank} {','.join(map(str, ids))}\n")
        loss.backward()
        # the gradients' all-reduce is done: every rank's samples are in this step's update
        with open(out / f"steps-{epoch}-{rank}.txt", "a") as log:
            log.write(f"{epoch} {step} {rank} {','.join(map(str, ids))}\n")
        if first:
            (out / f"pid-{epoch}-{rank}").write_text(str(os.getpid()))
        end_step(opt, args.step_s, out / f"first-{epoch}-{rank}" if first else None)
        first = False
        ckpt.batch_end(num_samples=GLOBAL_BATCH)


SCRIPT_TIMEOUT = timedelta(seconds=4321)


def group_timeout_s() -> float:
    """The default process group's timeout as its gloo backend holds it."""
    group = dist.distributed_c10d._get_default_group()
    return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()


def switching(args: argparse.Namespace) -> None:
    """The worker built for the in-process switch: the manager gets the module; the module is
    wrapped after resume() and again after every switch. Its process group has a timeout of
    its own (``SCRIPT_TIMEOUT``), which a switched or rejoined group keeps."""
    dist.init_process_group("gloo", timeout=SCRIPT_TIMEOUT)
    try:  # the common ending of public scripts: a leave must not make it fail
        switching_steps(args)
    finally:
        dist.destroy_process_group()


def switching_steps(args: argparse.Namespace) -> None:
    out = Path(args.out)
    epoch = os.environ.get("RTJ_MEMBERSHIP_EPOCH", "0")
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(8, args.width), torch.nn.Linear(args.width, 1))
    opt = torch.optim.SGD(inner.parameters(), lr=0.05, momentum=0.9)
    ckpt = CheckpointManager(
        model=inner,
        optimizer=opt,
        folder=args.folder,
        run_name="survivors",
        interval=args.interval,
        in_process_switch=True,
    )
    ckpt.resume()
    while True:
        model = DistributedDataParallel(inner, find_unused_parameters=True)
        try:
            train_steps(model, opt, ckpt, args, epoch)
            break
        except MembershipSwitched as switched:
            epoch = str(switched.epoch)
            own = f"{switched.epoch}-{switched.rank}"
            (out / f"switched-{own}").write_text(
                f"{os.getpid()} {switched.seconds} {group_timeout_s()}"
            )
        except Exception as exc:
            if not args.rejoin:
                raise
            ckpt.rejoin(exc)  # a peer lost without notice: the gang re-forms in process
            epoch = os.environ["RTJ_MEMBERSHIP_EPOCH"]
            (out / f"rejoined-{epoch}-{dist.get_rank()}").write_text(
                f"{os.getpid()} {group_timeout_s()}"
            )
    ckpt.close()
    torch.save(
        {"model": inner.state_dict(), "optim": opt.state_dict()},
        out / f"final-{dist.get_rank()}.pt",
    )


if __name__ == "__main__":
    main()
