"""A 2-rank FSDP2 (``fully_shard``) training process under CheckpointManager.

Trains ``--steps`` batches with a save every batch (``--async-save`` for background saves),
each batch's input drawn from a generator seeded by batch and rank (so a resumed run sees the
same data), and closes the manager (twice: close is idempotent). With ``--out`` every rank
writes the gathered full model and optimizer state to ``<out>/<tag>.rank<r>.pt`` and what it
resumed, saved and released to ``<out>/<tag>.rank<r>.json``, so the tests can compare a
resumed run with an uninterrupted one. ``--device cuda`` puts each rank's shards on GPU
``LOCAL_RANK`` (NCCL for CUDA tensors, gloo for the rest); the data is drawn on the CPU either
way, so a CUDA run and a CPU run see the same batches."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from tests.multiproc.rank_exit import end_fsdp_rank
from trainer_runtime import CheckpointManager

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", required=True)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--async-save", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--tag", default="run")
    ap.add_argument("--load-path", help="start from this checkpoint (full state)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = ap.parse_args()

    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("cpu:gloo,cuda:nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(3)])
    model.to(device)
    mesh = init_device_mesh(device.type, (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ckpt = CheckpointManager(
        model=model,
        optimizer=opt,
        folder=args.folder,
        run_name="fsdp",
        interval="1ba",
        async_save=args.async_save,
        load_path=args.load_path,
    )
    resumed = ckpt.resume()
    while ckpt.timestamp.batch < args.steps:
        gen = torch.Generator().manual_seed(1000 * ckpt.timestamp.batch + rank)
        x = torch.randn(8, args.width, generator=gen).to(device)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        ckpt.batch_end(num_samples=8 * world)
    ckpt.close()
    released = ckpt.coord.group is None and ckpt.commit_coord.group is None
    ckpt.close()  # idempotent
    if args.out:
        full = {
            "model": get_model_state_dict(model, options=FULL),
            "optim": get_optimizer_state_dict(model, opt, options=FULL),
        }
        out = Path(args.out)
        torch.save(full, out / f"{args.tag}.rank{rank}.pt")
        info = {
            "resumed_from": resumed.path,
            "batch": ckpt.timestamp.batch,
            "saved": [s.name for s in ckpt.saved],
            "groups_released": released,
        }
        (out / f"{args.tag}.rank{rank}.json").write_text(json.dumps(info))
    end_fsdp_rank()


if __name__ == "__main__":
    main()
