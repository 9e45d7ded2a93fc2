"""A rank that saves or loads sharded checkpoints, for the resharding tests.

``--jobs`` is a comma-separated list of ``save:<layout>:<name>``, ``load:<layout>:<name>`` and
``warmload:<layout>:<name>`` run in order in one process (starting processes is the slow part).
Layouts: ``single`` (no wrapper), ``ddp`` (DistributedDataParallel), ``fsdp`` (FSDP2
``fully_shard``). A save trains a few steps first and writes, on rank 0, the full (gathered)
model and optimizer state to ``<out>/<name>.ref.pt``; a load writes what it found to
``<out>/<name>.<layout>.w<world>.json``. A warm load is a running process's: it trains one step
first, so its optimizer has state (``<layout>-warm`` in the file name).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from trainer_runtime.errors import CorruptCheckpointError
from trainer_runtime.run.dist import Coordinator
from trainer_runtime.run_folder.layout import RunFolder
from trainer_runtime.sampler import ResumableSampler
from trainer_runtime.save.manifest import Manifest
from trainer_runtime.save.rank_contents import Components
from trainer_runtime.sharded import ShardedCheckpointer, ShardedEngine
from trainer_runtime.timestamp import Timestamp

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def build(layout: str, width: int, world: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(module to train, module whose parameters the optimizer holds)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])
    if layout == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        return wrapped, wrapped
    if layout == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model, model


def full_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    return {
        "model": get_model_state_dict(model, options=FULL),
        "optim": get_optimizer_state_dict(model, opt, options=FULL),
    }


def compare(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths where two state trees differ (bitwise for tensors)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        ok = (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
        return [] if ok else [path]
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}/{k}: missing" for k in set(a) ^ set(b)]
        for k in set(a) & set(b):
            out += compare(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        return [
            m
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for m in compare(x, y, f"{path}/{i}")
        ]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def storages(tensors: Any) -> set[int]:
    """Where the tensors' memory starts (a DTensor by its local shard)."""
    out = set()
    with torch.no_grad():
        for t in tensors:
            if isinstance(t, torch.Tensor):
                local = t.to_local() if hasattr(t, "to_local") else t
                out.add(local.untyped_storage().data_ptr())
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", required=True)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    coord = Coordinator()
    out = Path(args.out)
    for job in args.jobs.split(","):
        kind, layout, name = job.split(":")
        model, wrapped = build(layout, args.width, world)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        sampler = ResumableSampler(10_000, batch_size=4, num_replicas=world, rank=rank)
        engine = ShardedEngine(
            Components(model=model, optimizers={"adam": opt}, stateful={"sampler": sampler}), coord
        )
        folder = RunFolder(Path(args.root))
        if kind == "save":
            torch.manual_seed(100 + rank)  # per-rank data and RNG streams
            for _ in range(args.steps):
                wrapped(torch.randn(4, args.width)).square().mean().backward()
                opt.step()
                opt.zero_grad()
                sampler.advance(4 * world)
            ckpt = ShardedCheckpointer(engine, folder, run_name="sharded")
            torch.save(torch.get_rng_state(), out / f"{name}.rng{rank}.pt")
            ts = Timestamp(batch=args.steps, sample=args.steps * 4 * world)
            # A first save shows DCP's assignment of replicated tensors to ranks, so the async
            # save after it stages only this rank's share: the tests load that one.
            ckpt.save(f"{name}-first", timestamp=ts)
            ckpt.save_async(name, timestamp=ts, latest_link=f"latest-rank{rank}")
            ckpt.wait()
            ckpt.close()
            ref = full_state(model, opt)
            if rank == 0:
                torch.save(ref, out / f"{name}.ref.pt")
        else:
            if kind == "warmload":  # a running process: its optimizer has state
                wrapped(torch.randn(4, args.width)).square().mean().backward()
                opt.step()
                opt.zero_grad()
                layout += "-warm"
            held = {id(v) for st in opt.state.values() for v in st.values()}
            before = full_state(model, opt)
            result: dict[str, Any] = {"rank": rank, "world": world}
            try:
                _, report = engine.load(folder.path(name), Manifest.read(folder.path(name)))
                result.update(rng=report.rng, source=report.source_rank)
                result["rng_state"] = torch.get_rng_state()[:64].tolist()
            except CorruptCheckpointError as exc:
                result["error"] = f"CorruptCheckpointError: {exc}"
            after = full_state(model, opt)
            live = [v for st in opt.state.values() for v in st.values()]
            result["handed_over"] = sum(id(v) not in held for v in live)
            live += list(model.parameters())
            result["aliased"] = len(storages(engine.stager._buffers.values()) & storages(live))
            result["sampler"] = [sampler.epoch, sampler.offset]
            result["lr"] = opt.param_groups[0]["lr"]
            if rank == 0:
                ref_name = name.split("-torn")[0]
                ref = torch.load(out / f"{ref_name}.ref.pt", weights_only=True)
                result["mismatches"] = compare(ref, after)[:20]
                result["unchanged"] = not compare(before, after)
            tag = f"{name}.{layout}.w{world}.rank{rank}.json"
            (out / tag).write_text(json.dumps(result))
        if world > 1:
            dist.barrier()
    coord.close()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
