"""A DDP or FSDP2 training process under CheckpointManager, for world-size changes.

Trains ``--steps`` batches (a save after each) or, when the run folder holds a checkpoint at
that step already, only resumes from it. Rank 0 writes ``<out>/<tag>.pt``: the full
(gathered) model and optimizer state after resuming and training, and ``<tag>.json``: what it
resumed from and the world size, so a test can compare a resumed state with the saved one.
"""

from __future__ import annotations

import argparse
import json
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
from torch.nn.parallel import DistributedDataParallel

from tests.multiproc.rank_exit import end_fsdp_rank
from trainer_runtime import CheckpointManager

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["ddp", "fsdp"], required=True)
    ap.add_argument("--folder", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--keep", type=int, default=-1, help="num_checkpoints_to_keep")
    ap.add_argument("--load-path", default=None, help="load_path")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    inner = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(3)])
    if args.mode == "fsdp":
        mesh = init_device_mesh("cpu", (world,))
        for layer in inner:
            fully_shard(layer, mesh=mesh)
        model = fully_shard(inner, mesh=mesh)
    else:
        model = DistributedDataParallel(inner)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ckpt = CheckpointManager(
        model=model,
        optimizer=opt,
        folder=args.folder,
        run_name="resize",
        interval="1ba",
        num_checkpoints_to_keep=args.keep,
        load_path=args.load_path,
    )
    resumed = ckpt.resume()
    while ckpt.timestamp.batch < args.steps:
        gen = torch.Generator().manual_seed(1000 * ckpt.timestamp.batch + rank)
        model(torch.randn(8, args.width, generator=gen)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        ckpt.batch_end(num_samples=8 * world)
    ckpt.close()
    full = {
        "model": get_model_state_dict(model, options=FULL),
        "optim": get_optimizer_state_dict(model, opt, options=FULL),
    }
    if rank == 0:
        out = Path(args.out)
        torch.save(full, out / f"{args.tag}.pt")
        info = {"resumed_from": resumed.path, "source": resumed.source, "world": world}
        (out / f"{args.tag}.json").write_text(json.dumps(info))
    end_fsdp_rank()


if __name__ == "__main__":
    main()
