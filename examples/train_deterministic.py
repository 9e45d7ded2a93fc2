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
``--in-process-switch`` builds it for ``recovery.inProcessSwitch`` (docs/survivors.md): the
model is wrapped, and the data iterated, anew after each ``MembershipSwitched``, and after a
failed step that ``ckpt.rejoin`` took in process (a rank lost without notice).
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
from typing import TextIO

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

from trainer_runtime import CheckpointManager, MembershipSwitched, batching
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
    ap.add_argument(
        "--in-process-switch",
        action="store_true",
        help="take a grow's new membership in the running process (recovery.inProcessSwitch)",
    )
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0

    split = plan_batches(args, world)
    dataset = Synthetic(args.dataset_size)
    model = build_model(dataset.dim)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    sampler = ResumableSampler(dataset, shuffle=True, seed=17, batch_size=split.per_rank_samples)
    folder = args.folder and f"{args.folder}/{{run_name}}"
    ckpt = CheckpointManager(
        model=model,  # the module: DistributedDataParallel wraps it after resume() (train())
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
        in_process_switch=args.in_process_switch,
    )
    resumed = ckpt.resume()
    records = Records(args, rank, attempt_record())
    records.resumed(resumed.source, resumed.path, ckpt, world, state_digest(model, opt))
    while True:
        try:
            train(args, ckpt, model=model, opt=opt, sched=sched, dataset=dataset, records=records)
            break
        except MembershipSwitched as switched:  # same position, new ranks: wrap, iterate again
            rank, world = switched.rank, switched.world_size
            records.rank = rank
            records.attempt = attempt_record()  # the switch's environment names the new one
            records.resumed("switch", None, ckpt, world, state_digest(model, opt))
        except Exception as exc:  # a rank lost without notice: rejoin in process, or raise
            if not args.in_process_switch:
                raise
            ckpt.rejoin(exc)
            rank, world = dist.get_rank(), dist.get_world_size()
            records.rank = rank
            records.attempt = attempt_record()
            records.resumed("rejoin", None, ckpt, world, state_digest(model, opt))
    records.saving(ckpt.close, ckpt, world, lambda: state_digest(model, opt))
    if rank == 0 and args.out:
        torch.save(model.state_dict(), Path(args.out))
        print(f"final weights written to {args.out} at step {ckpt.timestamp.batch}")
    if dist.is_initialized():
        # Last collective without tensors of ours: no gloo thread frees one after exit begins
        # (docs/runtime.md, "End of training").
        dist.barrier()
        dist.destroy_process_group()


def attempt_record() -> dict[str, int]:
    """Under the operator, trace and digest records name their attempt (absent by hand)."""
    return {"attempt": int(os.environ[ATTEMPT])} if os.environ.get(ATTEMPT) else {}


def plan_batches(args: argparse.Namespace, world: int) -> batching.BatchPlan:
    return batching.plan(
        global_batch_size=args.global_batch_size or args.batch_size * world,
        world_size=world,
        micro_batch_size=args.batch_size,
    )


class Records:
    """The ``--trace`` and ``--digests`` files of this rank (none without the flags)."""

    def __init__(self, args: argparse.Namespace, rank: int, attempt: dict[str, int]) -> None:
        self.args, self.rank, self.attempt = args, rank, attempt
        self.files: dict[str, TextIO] = {}

    def _write(self, kind: str, record: dict[str, object]) -> None:
        base = getattr(self.args, kind)
        if not base:
            return
        name = f"{base}.rank{self.rank}"
        if name not in self.files:
            self.files[name] = open(name, "a")  # noqa: SIM115 - kept open for the run
        self.files[name].write(json.dumps({**record, **self.attempt}) + "\n")
        self.files[name].flush()

    def resumed(
        self, source: str, path: str | None, ckpt: CheckpointManager, world: int, digest: str
    ) -> None:
        at = {"step": ckpt.timestamp.batch, "world": world}
        self._write(
            "digests", {"event": "resume", "source": source, "path": path, **at, "digest": digest}
        )
        self._write("trace", {"resumed_at_sample": ckpt.timestamp.sample, "world": world})

    def step(self, ckpt: CheckpointManager, ids: torch.Tensor, global_batch: int) -> None:
        done = ckpt.timestamp.sample + global_batch
        self._write(
            "trace", {"batch": ckpt.timestamp.batch + 1, "sample": done, "ids": ids.tolist()}
        )

    def saving(
        self,
        call: Callable[[], object],
        ckpt: CheckpointManager,
        world: int,
        digest: Callable[[], str],
    ) -> None:
        """Run a manager call; record the digest of a checkpoint it saved (batch_end's interval
        save, epoch_end's save at an epoch boundary, close()'s final save, or the emergency save
        on SIGTERM, which ends in SystemExit and is recorded too)."""
        saves = len(ckpt.saved)
        try:
            call()
        finally:
            if len(ckpt.saved) > saves:
                at = {"step": ckpt.timestamp.batch, "world": world}
                name = ckpt.saved[-1].name
                self._write(
                    "digests", {"event": "save", "checkpoint": name, **at, "digest": digest()}
                )


def train(
    args: argparse.Namespace,
    ckpt: CheckpointManager,
    *,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    sched: object,
    dataset: Dataset,
    records: Records,
) -> None:
    """The epochs left, at the current world size: the wrapper and the loader belong to it."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    split = plan_batches(args, world)
    # find_unused_parameters=True keeps DDP's first gradient-bucket layout for the whole run. By
    # default DDP re-lays its buckets out after its first step, so the first step after a resume
    # would all-reduce in another order: at more than 2 ranks, weights then differ from an
    # uninterrupted run in the last bits (docs/runtime.md, "Exact resume at more than two ranks").
    ddp = DistributedDataParallel(model, find_unused_parameters=True) if world > 1 else model
    loader = DataLoader(
        dataset,
        batch_size=split.micro_batch_size,
        sampler=ckpt.sampler,
        num_workers=args.workers,
        prefetch_factor=4 if args.workers else None,
        # Workers forked once per process, not at every epoch: a fork while other threads run
        # (gloo's, the runtime's) can hang the new worker in fork() (docs/runtime.md).
        persistent_workers=args.workers > 0,
        generator=torch.Generator().manual_seed(0),  # keeps the global RNG stream untouched
    )
    digest = lambda: state_digest(model, opt)  # noqa: E731
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
            records.step(ckpt, torch.cat([p[0] for p in parts]), split.global_batch_size)
            end = lambda: ckpt.batch_end(num_samples=split.global_batch_size)  # noqa: E731
            records.saving(end, ckpt, world, digest)
            if args.step_sleep:
                time.sleep(args.step_sleep)
        records.saving(ckpt.epoch_end, ckpt, world, digest)


if __name__ == "__main__":
    main()
