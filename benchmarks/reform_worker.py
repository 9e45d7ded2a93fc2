"""A DDP training process that re-forms its process group without ending: the fourth mechanism
that ``inplace_restart.py --mechanisms`` measures, a prototype of what the product does not do.

The same model, global batch and step time as tests/multiproc/survivor_worker.py, without the
checkpoint manager. When a collective fails (a peer's connection closed), the process keeps
everything it holds. It drops every reference to its process group, which closes the group's
connections: another survivor may be blocked in the same collective on a receive from *this*
one rather than from the lost peer, and only a closed connection ends such a receive (gloo's
``abort()`` and ``shutdown()`` do not, measured with torch 2.15). It waits for a newer membership
in ``--membership`` (JSON: ``epoch``, ``rank``, ``world``, written by the benchmark as the
operator writes the pod's annotation), forms the new group on the benchmark's store (standing
for the agent's rendezvous store, under a key prefix of the new epoch) and wraps the same module
in a new ``DistributedDataParallel``.

The survivors may not have stopped at the same step: one may have finished the last all-reduce
(and its update) while another's last chunk never came. So they compare their steps, and the
first of those furthest on sends its weights and momentum to the others (the "heal" of
in-process recovery); all go on from its step. A survivor's weights are never half-updated (the
all-reduce ends before ``optimizer.step()``), so no finished step is lost and nothing is loaded.

Limit, measured: a failed backward can leave other gradient buckets' all-reduces in flight,
and they hold the group, so its connections stay open; a survivor blocked on this one then waits
for the group's timeout (60 s here). One bucket (the default ``--width``) fails everywhere at
once; 153 MiB of weights (``--width 4000000``, several buckets) do not. Each rank writes
``<out>/first-<epoch>-<rank>`` with the wall time of its first step in each membership.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tools.emulated_step import end_step

GLOBAL_BATCH = 12
POLL_S = 0.01


def membership(path: Path, newer_than: int, timeout_s: float = 60.0) -> tuple[int, int, int]:
    """The first membership in ``path`` whose epoch is above ``newer_than``."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            doc = {}
        if int(doc.get("epoch", -1)) > newer_than:
            return int(doc["epoch"]), int(doc["rank"]), int(doc["world"])
        time.sleep(POLL_S)
    raise TimeoutError(f"no membership newer than epoch {newer_than} in {path}")


def form(store: dist.Store, epoch: int, rank: int, world: int) -> None:
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore(f"epoch-{epoch}", store),
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )


def heal(inner: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> int:
    """The step every member goes on from; the weights and momentum of the first member that
    reached it, sent to the others when they differ in step."""
    steps = [torch.zeros(1, dtype=torch.long) for _ in range(dist.get_world_size())]
    dist.all_gather(steps, torch.tensor([step]))
    reached = [int(t.item()) for t in steps]
    furthest = max(reached)
    if min(reached) == furthest:
        return step
    source = reached.index(furthest)
    for param in inner.parameters():
        momentum = opt.state[param].setdefault("momentum_buffer", torch.zeros_like(param))
        dist.broadcast(param.data, source)
        dist.broadcast(momentum, source)
    return furthest


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--membership", required=True)
    ap.add_argument("--store-port", type=int, required=True)
    ap.add_argument("--steps", type=int, default=100000)
    ap.add_argument("--step-s", type=float, default=0.1)
    ap.add_argument("--width", type=int, default=16, help="the hidden layer (the state's size)")
    args = ap.parse_args()
    out = Path(args.out)
    epoch, rank, world = 1, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(
        "127.0.0.1", args.store_port, None, False, timeout=datetime.timedelta(seconds=60)
    )
    form(store, epoch, rank, world)
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(8, args.width), torch.nn.Linear(args.width, 1))
    model = DistributedDataParallel(inner, find_unused_parameters=True)
    opt = torch.optim.SGD(inner.parameters(), lr=0.05, momentum=0.9)
    step, first = 0, True
    while step < args.steps:
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(GLOBAL_BATCH, 8, generator=gen)[rank::world]
        try:
            model(x).square().mean().backward()
            failed = False
        except RuntimeError:  # a peer is gone
            failed = True
        if failed:  # keep the state, re-form, train this step again
            opt.zero_grad()
            del model  # the old reducer and its autograd hooks
            gc.collect()
            dist.destroy_process_group()  # the last reference: its connections close
            epoch, rank, world = membership(Path(args.membership), epoch)
            form(store, epoch, rank, world)
            step = heal(inner, opt, step)
            model = DistributedDataParallel(inner, find_unused_parameters=True)
            first = True
            continue
        end_step(opt, args.step_s, out / f"first-{epoch}-{rank}" if first else None)
        first = False
        with open(out / f"steps-{epoch}-{rank}.txt", "a") as log:
            log.write(f"{epoch} {step} {rank}\n")
        step += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
