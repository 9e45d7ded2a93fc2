"""A training process that saves every batch, for the kill and multi-rank tests.

Writes one JSON line per event to ``--events`` (per rank): what it resumed from and each batch.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

from trainer_runtime import CheckpointManager
from trainer_runtime import events as events_module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--folder", required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--async-save", action="store_true")
    ap.add_argument("--keep", type=int, default=-1)
    ap.add_argument("--events", required=True)
    ap.add_argument("--async-policy", default="wait")
    ap.add_argument(
        "--slow-commit-report-s",
        type=float,
        default=0.0,
        help="rank 0 reports each commit this much later: its background save ends last",
    )
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    if args.slow_commit_report_s and rank == 0:
        report = events_module.committed

        def slow_report(*a, **kw):
            time.sleep(args.slow_commit_report_s)
            return report(*a, **kw)

        events_module.committed = slow_report
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width) for _ in range(4)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ckpt = CheckpointManager(
        model=model,
        optimizer=opt,
        folder=args.folder,
        run_name="kill",
        interval="1ba",
        async_save=args.async_save,
        async_policy=args.async_policy,
        num_checkpoints_to_keep=args.keep,
    )
    res = ckpt.resume()
    events = open(f"{args.events}.rank{rank}", "a")  # noqa: SIM115 - lives as long as the process
    events.write(
        json.dumps(
            {
                "event": "resumed",
                "path": res.path,
                "batch": ckpt.timestamp.batch,
                "pid": os.getpid(),
                "t": time.time(),
            }
        )
        + "\n"
    )
    events.flush()
    while ckpt.timestamp.batch < args.steps:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.001)
        x = torch.ones(8, args.width)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        ckpt.batch_end(num_samples=8 * world)
        events.write(
            json.dumps({"event": "batch", "batch": ckpt.timestamp.batch, "t": time.time()}) + "\n"
        )
        events.flush()
        time.sleep(0.01)
    ckpt.close()
    done = {"event": "done", "batch": ckpt.timestamp.batch, "skipped": ckpt.skipped_saves}
    events.write(json.dumps(done) + "\n")
    events.close()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
