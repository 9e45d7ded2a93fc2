"""A small deterministic training job that survives being killed, using only the public API.

Run it with torchrun (or the operator, or plain processes with RANK/WORLD_SIZE/MASTER_* set):

    torchrun --nproc-per-node 2 examples/train_deterministic.py --folder /tmp/ckpt --run-name demo

Kill it at any moment (SIGKILL, SIGTERM) and run the same command again: it resumes from its
newest committed checkpoint at the exact next sample, and ends with the same weights, bit for
bit, as a run that was never interrupted. Inside a managed pod no flag is needed: the folder,
run name and resume path come from the RTJ_* environment.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

from trainer_runtime import CheckpointManager
from trainer_runtime.sampler import ResumableSampler


class Synthetic(Dataset):
    """Sample ``i`` is a pure function of ``i``: any worker can produce it, in any order."""

    def __init__(self, size: int, dim: int = 16) -> None:
        self.size, self.dim = size, dim

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(1000 + i)
        x = torch.randn(self.dim, generator=g)
        return i, x, x.sum(dim=0, keepdim=True).tanh()


def build_model(dim: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", help="checkpoint folder (default: $RTJ_CHECKPOINT_DIR/<run>)")
    ap.add_argument("--run-name", help="stable run name (default: $RTJ_RUN_NAME)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--dataset-size", type=int, default=96)
    ap.add_argument("--batch-size", type=int, default=4, help="per rank")
    ap.add_argument("--interval", default="4ba")
    ap.add_argument("--keep", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--async-save", action="store_true")
    ap.add_argument("--elastic", action="store_true", help="allow a different world size")
    ap.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (demos)")
    ap.add_argument("--trace", help="append consumed sample ids per step to FILE.rank<r>")
    ap.add_argument("--out", help="rank 0 writes the final weights here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0

    dataset = Synthetic(args.dataset_size)
    model = build_model(dataset.dim)
    ddp = DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    sampler = ResumableSampler(dataset, shuffle=True, seed=17, batch_size=args.batch_size)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=sampler,
        num_workers=args.workers,
        prefetch_factor=4 if args.workers else None,
        generator=torch.Generator().manual_seed(0),  # keeps the global RNG stream untouched
    )
    folder = args.folder and f"{args.folder}/{{run_name}}"
    ckpt = CheckpointManager(
        model=ddp,
        optimizer=opt,
        scheduler=sched,
        sampler=sampler,
        folder=folder,
        run_name=args.run_name,
        interval=args.interval,
        num_checkpoints_to_keep=args.keep,
        async_save=args.async_save,
        elastic=args.elastic,
        global_batch_size=args.batch_size * world,
    )
    ckpt.resume()
    trace = open(f"{args.trace}.rank{rank}", "a") if args.trace else None  # noqa: SIM115
    if trace:
        marker = {"resumed_at_sample": ckpt.timestamp.sample, "world": world}
        trace.write(json.dumps(marker) + "\n")
        trace.flush()
    for _ in range(ckpt.timestamp.epoch, args.epochs):
        for ids, x, y in loader:
            loss = nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            if trace:
                done = ckpt.timestamp.sample + args.batch_size * world
                record = {"batch": ckpt.timestamp.batch + 1, "sample": done, "ids": ids.tolist()}
                trace.write(json.dumps(record) + "\n")
                trace.flush()
            ckpt.batch_end(num_samples=args.batch_size * world)
            if args.step_sleep:
                time.sleep(args.step_sleep)
        ckpt.epoch_end()
    ckpt.close()
    if rank == 0 and args.out:
        torch.save(model.state_dict(), Path(args.out))
        print(f"final weights written to {args.out} at step {ckpt.timestamp.batch}")
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
