"""A small deterministic training job that survives being killed, using only the public API.

Run it with torchrun (or the operator, or plain processes with RANK/WORLD_SIZE/MASTER_* set):

    torchrun --nproc-per-node 2 examples/train_deterministic.py --folder /tmp/ckpt --run-name demo

Kill it at any moment (SIGKILL, SIGTERM) and run the same command again: it resumes from its
newest committed checkpoint at the exact next sample, and ends with the same weights, bit for
bit, as a run that was never interrupted. Inside a managed pod no flag is needed: the folder,
run name and resume path come from the RTJ_* environment.

For an elastic job (docs/operator.md, Elastic gangs) pass ``--elastic --global-batch-size N``:
each optimizer step then consumes N samples at every world size (gradient accumulation over
micro-batches of ``--batch-size``), and ``--digests FILE`` records a digest of the model and
optimizer state at every commit and right after every resume, to prove they are equal.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

from trainer_runtime import CheckpointManager, batching
from trainer_runtime.envvars import ATTEMPT
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


def state_digest(model: nn.Module, opt: torch.optim.Optimizer) -> str:
    """SHA-256 of the model and optimizer state, byte for byte (the state a checkpoint holds):
    every tensor's bytes in a fixed order, and the optimizer's hyperparameters."""
    digest = hashlib.sha256()

    def add(prefix: str, value: object) -> None:
        if isinstance(value, torch.Tensor):
            digest.update(prefix.encode())
            digest.update(value.detach().cpu().contiguous().numpy().tobytes())
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                add(f"{prefix}/{key}", value[key])
        elif isinstance(value, list | tuple):
            for index, item in enumerate(value):
                add(f"{prefix}/{index}", item)
        else:
            digest.update(f"{prefix}={value!r}".encode())

    add("model", model.state_dict())
    add("optimizer", opt.state_dict())
    return digest.hexdigest()


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
    ap.add_argument(
        "--global-batch-size",
        type=int,
        help="samples per optimizer step at every world size (gradient accumulation)",
    )
    ap.add_argument("--digests", help="append state digests at commits and resumes to FILE.rank<r>")
    args = ap.parse_args()
    # Under the operator, trace and digest records name their attempt (absent when run by hand).
    attempt = {"attempt": int(os.environ[ATTEMPT])} if os.environ.get(ATTEMPT) else {}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0

    split = batching.plan(
        global_batch_size=args.global_batch_size or args.batch_size * world,
        world_size=world,
        micro_batch_size=args.batch_size,
    )
    dataset = Synthetic(args.dataset_size)
    model = build_model(dataset.dim)
    # find_unused_parameters=True keeps DDP's first gradient-bucket layout for the whole run. By
    # default DDP re-lays its buckets out after its first step, so the first step after a resume
    # would all-reduce in another order: at more than 2 ranks, weights then differ from an
    # uninterrupted run in the last bits (docs/runtime.md, "Exact resume at more than two ranks").
    ddp = DistributedDataParallel(model, find_unused_parameters=True) if world > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    sampler = ResumableSampler(dataset, shuffle=True, seed=17, batch_size=split.per_rank_samples)
    loader = DataLoader(
        dataset,
        batch_size=split.micro_batch_size,
        sampler=sampler,
        num_workers=args.workers,
        prefetch_factor=4 if args.workers else None,
        # Workers forked once per process, not at every epoch: a fork while other threads run
        # (gloo's, the runtime's) can hang the new worker in fork() (docs/runtime.md).
        persistent_workers=args.workers > 0,
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
        global_batch_size=split.global_batch_size,
        # the job's total work (PROGRESS and ETA in kubectl get rtj); --epochs 0 only resumes
        epochs=args.epochs or None,
    )
    resumed = ckpt.resume()
    digests = open(f"{args.digests}.rank{rank}", "a") if args.digests else None  # noqa: SIM115
    if digests:
        digests.write(
            json.dumps(
                {
                    "event": "resume",
                    "source": resumed.source,
                    "path": resumed.path,
                    "step": ckpt.timestamp.batch,
                    "world": world,
                    "digest": state_digest(model, opt),
                    **attempt,
                }
            )
            + "\n"
        )
        digests.flush()
    trace = open(f"{args.trace}.rank{rank}", "a") if args.trace else None  # noqa: SIM115
    if trace:
        marker = {"resumed_at_sample": ckpt.timestamp.sample, "world": world, **attempt}
        trace.write(json.dumps(marker) + "\n")
        trace.flush()

    def recording_saves(call: Callable[[], object]) -> None:
        """Run a manager call; record the digest of a checkpoint it saved (batch_end's interval
        save, epoch_end's save at an epoch boundary, close()'s final save, or the emergency save
        on SIGTERM, which ends in SystemExit and is recorded too)."""
        saves = len(ckpt.saved)
        try:
            call()
        finally:
            if digests and len(ckpt.saved) > saves:
                entry = {
                    "event": "save",
                    "checkpoint": ckpt.saved[-1].name,
                    "step": ckpt.timestamp.batch,
                    "world": world,
                    "digest": state_digest(model, opt),
                    **attempt,
                }
                digests.write(json.dumps(entry) + "\n")
                digests.flush()

    for _ in range(ckpt.timestamp.epoch, args.epochs):
        micro = iter(loader)
        while True:
            parts = [b for _, b in zip(range(split.accumulation_steps), micro, strict=False)]
            if not parts:
                break
            opt.zero_grad()
            for part_index, (_, x, y) in enumerate(parts):
                loss = nn.functional.mse_loss(ddp(x), y) / len(parts)
                last = part_index == len(parts) - 1
                if world > 1 and not last:
                    with ddp.no_sync():
                        loss.backward()
                else:
                    loss.backward()
            opt.step()
            sched.step()
            if trace:
                ids = torch.cat([p[0] for p in parts])
                done = ckpt.timestamp.sample + split.global_batch_size
                record = {"batch": ckpt.timestamp.batch + 1, "sample": done, "ids": ids.tolist()}
                trace.write(json.dumps(record) + "\n")
                trace.flush()
            recording_saves(lambda: ckpt.batch_end(num_samples=split.global_batch_size))
            if args.step_sleep:
                time.sleep(args.step_sleep)
        recording_saves(ckpt.epoch_end)
    recording_saves(ckpt.close)
    if rank == 0 and args.out:
        torch.save(model.state_dict(), Path(args.out))
        print(f"final weights written to {args.out} at step {ckpt.timestamp.batch}")
    if world > 1:
        # Last collective without tensors of ours: no gloo thread frees one after exit begins
        # (docs/runtime.md, "End of training").
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
