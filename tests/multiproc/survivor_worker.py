"""A DDP training process for membership changes in place (run under trainer_runtime.agent).

Each step takes the global batch ``step`` (the same samples whatever the world size; this rank's
share by rank), appends ``epoch step rank ids`` to ``<out>/steps-<epoch>-<rank>.txt`` once the
gradients' all-reduce is done (from then on the step's update holds every rank's samples, and a
survivor may save it: trainer_runtime/save/survivor.py), and sleeps ``--step-s`` (the emulated
step time). Rank 0 writes ``<out>/final.pt`` (the model and
optimizer state) at the end, and every rank writes ``<out>/first-<epoch>-<rank>`` with the wall
time of its first step, so a test can time how long a membership change took, and
``<out>/inherited-<epoch>-<rank>`` says whether it started with ``torch._inductor`` imported.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tools.emulated_step import end_step
from trainer_runtime import CheckpointManager

GLOBAL_BATCH = 12  # divisible by 1, 2, 3, 4 and 6 ranks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--step-s", type=float, default=0.1)
    ap.add_argument("--interval", default="5ba")
    ap.add_argument("--width", type=int, default=16, help="the hidden layer (the state's size)")
    args = ap.parse_args()
    out = Path(args.out)
    # torchrun's elastic agent restarts the workers with the same environment but for its count
    epoch = str(
        int(os.environ.get("RTJ_MEMBERSHIP_EPOCH", "0"))
        + int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    )
    inherited = "torch._inductor" in sys.modules  # the agent's preload (trainer_runtime/agent)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
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
    first = True
    for step in ckpt.steps(args.steps):
        ids = list(range(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH))[rank::world]
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(GLOBAL_BATCH, 8, generator=gen)[rank::world]
        loss = model(x).square().mean()
        loss.backward()
        # the gradients' all-reduce is done: every rank's samples are in this step's update
        with open(out / f"steps-{epoch}-{rank}.txt", "a") as log:
            log.write(f"{epoch} {step} {rank} {','.join(map(str, ids))}\n")
        end_step(opt, args.step_s, out / f"first-{epoch}-{rank}" if first else None)
        first = False
        ckpt.batch_end(num_samples=GLOBAL_BATCH)
    ckpt.close()
    if rank == 0:
        torch.save(
            {"model": model.module.state_dict(), "optim": opt.state_dict()}, out / "final.pt"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
