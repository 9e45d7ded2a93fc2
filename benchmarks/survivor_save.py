"""What the save from a survivor's memory costs (trainer_runtime/save/survivor.py).

Two DDP ranks (gloo, CPU) train a model of ``--params-m`` million parameters with AdamW under a
``CheckpointManager`` armed as under the in-pod agent. Measured, medians of ``--repeats``:

- **per step**: the boundary the runtime notes at every ``batch_end()`` (the small state
  captured, the buffers copied), against the step itself (forward, backward, optimizer);
- **the save**: the one a named survivor makes alone (world size 1, every byte from one
  process), against the gang's own collective save of the same state (``save(blocking=True)``,
  each rank writing its share) and ``torch.save`` of the model and optimizer state by one rank;
- **the save in shares** (``save/survivor_group.py``): both ranks write the boundary together,
  each its share, as the kept pods do with a large replica; and apart, what the savers pay to
  meet after a loss: the store that says the epoch found, the old process group left, the
  savers' gloo group formed.

    python benchmarks/survivor_save.py [--params-m 50] [--steps 30] [--repeats 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MARK = "RESULT "


def worker(args: argparse.Namespace) -> None:
    import torch  # noqa: PLC0415 - the parent needs no torch
    import torch.distributed as dist  # noqa: PLC0415
    from torch.nn.parallel import DistributedDataParallel  # noqa: PLC0415

    from trainer_runtime import CheckpointManager  # noqa: PLC0415
    from trainer_runtime.run.dist import Coordinator  # noqa: PLC0415
    from trainer_runtime.save.survivor import write_boundary  # noqa: PLC0415

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    width = 1024
    layers = max(1, round(args.params_m * 1e6 / (width * width + width)))
    inner = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
    model = DistributedDataParallel(inner)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ckpt = CheckpointManager(
        model=model, optimizer=opt, folder=args.folder, run_name="bench", interval="100000ba"
    )
    guard = ckpt._survivor
    assert guard is not None, "not armed"
    steps, boundaries = [], []
    for _ in range(args.steps):
        began = time.perf_counter()
        model(torch.randn(8, width)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        steps.append(time.perf_counter() - began)
        ckpt.batch_end(num_samples=16)
        began = time.perf_counter()
        guard.boundary()
        boundaries.append(time.perf_counter() - began)
    gang_saves, torch_saves, alone, shared = [], [], [], []
    coord = Coordinator()  # over the gang's healthy group: the shares' write alone
    folder = Path(args.folder)
    for i in range(args.repeats):  # interleaved, each on a page cache written back first
        model(torch.randn(8, width)).square().mean().backward()
        opt.step()
        opt.zero_grad()
        ckpt.batch_end(num_samples=16)
        gang_saves.append(timed(rank, ckpt.save, blocking=True)[0])
        state = {"model": model.module.state_dict(), "optim": opt.state_dict()}
        path = folder / f"torch-{i}.pt"
        seconds, _ = timed(rank, torch.save, state, path, rank0_only=True)
        guard.boundary()
        small, tensors, at = guard._boundary
        boundary = (ckpt._ctx, small, tensors, at)
        # at the gang's own epoch: one newer would fence the gang's next saves out of the run
        alone_s, name = timed(rank, write_boundary, *boundary, epoch=1, stall_s=60, rank0_only=True)
        shared_s, shared_name = timed(
            rank, write_boundary, *boundary, epoch=1, stall_s=60, coord=coord
        )
        dist.barrier()
        if rank == 0:
            torch_saves.append(seconds)
            alone.append(alone_s)
            path.unlink()
            shutil.rmtree(folder / name)
            shutil.rmtree(folder / shared_name)
        shared.append(shared_s)
    meet = savers_meet(rank, args)
    if rank == 0:
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        figures = {
            "params": sum(p.numel() for p in model.parameters()),
            "state_bytes": size * 3,  # weights, exp_avg, exp_avg_sq
            "step_s": steps,
            "boundary_s": boundaries,
            "gang_save_s": gang_saves,
            "torch_save_s": torch_saves,
            "survivor_save_s": alone,
            "shared_save_s": shared,
            "savers_meet_s": meet,
        }
        print(MARK + json.dumps(figures), flush=True)
    ckpt._survivor.close()
    dist.barrier()
    dist.destroy_process_group()


def timed(rank: int, fn: Any, *args: Any, rank0_only: bool = False, **kwargs: Any) -> Any:
    """Seconds ``fn`` took and what it returned, started on every rank at once (or on rank 0
    only) after the page cache was written back: a save of GBs right after another one would
    wait for the first one's writeback. Every rank calls it."""
    import torch.distributed as dist  # noqa: PLC0415

    dist.barrier()
    if rank == 0:
        os.sync()
    dist.barrier()
    if rank0_only and rank != 0:
        return 0.0, None
    began = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - began, result


def savers_meet(rank: int, args: argparse.Namespace) -> list[float]:
    """``survivor_group.form`` as after a loss, ``--repeats`` times: a store that says a newer
    epoch (rank 0 hosts it, as its agent would), the process group in force left, the savers'
    group formed (each time the next epoch's)."""
    import torch.distributed as dist  # noqa: PLC0415

    from trainer_runtime.agent.rendezvous_store import EPOCH_KEY  # noqa: PLC0415
    from trainer_runtime.pod.membership import Membership  # noqa: PLC0415
    from trainer_runtime.save import survivor_group  # noqa: PLC0415

    port = args.store_port
    host = None
    if rank == 0:
        host = dist.TCPStore("127.0.0.1", port, None, True)
        host.set(EPOCH_KEY, str(10**6))
    seconds = []
    for i in range(args.repeats):
        new = Membership(2 + i, 2, rank, "127.0.0.1", port, savers=2)
        dist.barrier()
        began = time.perf_counter()
        if survivor_group.form(new, 30.0) is None:
            raise SystemExit("the savers' group did not form")
        seconds.append(time.perf_counter() - began)
    dist.barrier()
    del host
    return seconds


def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="rtj-survivor-bench-") as tmp:
        procs = []
        for rank in range(2):
            env = {
                **os.environ,
                "RANK": str(rank),
                "WORLD_SIZE": "2",
                "LOCAL_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(args.port),
                "OMP_NUM_THREADS": "1",
                "RTJ_MEMBERSHIP_EPOCH": "1",
                "RTJ_MEMBERSHIP_FILE": f"{tmp}/membership-{rank}",
                "RTJ_SURVIVOR_SAVE_FILE": f"{tmp}/survivor-{rank}",
            }
            argv = [sys.executable, __file__, "--worker", "--folder", f"{tmp}/ckpt"]
            argv += ["--params-m", str(args.params_m), "--steps", str(args.steps)]
            argv += ["--repeats", str(args.repeats), "--store-port", str(args.store_port)]
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=1800)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit(f"a worker failed: {[p.returncode for p in procs]}")
        line = next(x for x in outs[0].splitlines() if x.startswith(MARK))
        return json.loads(line[len(MARK) :])


def report(fig: dict) -> dict:
    med = {k: statistics.median(v) for k, v in fig.items() if isinstance(v, list)}
    out = {
        "params": fig["params"],
        "state_mib": round(fig["state_bytes"] / 2**20, 1),
        "medians_s": {k: round(v, 6) for k, v in med.items()},
        "boundary_per_step": round(med["boundary_s"] / med["step_s"], 5),
        "survivor_save_vs_gang_save": round(med["survivor_save_s"] / med["gang_save_s"], 3),
        "survivor_save_vs_torch_save": round(med["survivor_save_s"] / med["torch_save_s"], 3),
        "shared_save_vs_alone": round(med["shared_save_s"] / med["survivor_save_s"], 3),
    }
    print(f"model: {fig['params'] / 1e6:.1f} M parameters, {out['state_mib']} MiB of state")
    print("| figure | median | ratio |")
    print("|---|---:|---:|")
    print(f"| training step (2 ranks) | {med['step_s'] * 1e3:.1f} ms | |")
    print(
        f"| boundary at each batch_end | {med['boundary_s'] * 1e3:.3f} ms | "
        f"{out['boundary_per_step']:.4f} of a step |"
    )
    print(f"| gang's collective save (2 ranks) | {med['gang_save_s']:.3f} s | 1 |")
    print(f"| torch.save by one rank | {med['torch_save_s']:.3f} s | |")
    print(
        f"| survivor's save, alone | {med['survivor_save_s']:.3f} s | "
        f"{out['survivor_save_vs_gang_save']:.2f}x the gang's, "
        f"{out['survivor_save_vs_torch_save']:.2f}x torch.save |"
    )
    print(
        f"| survivors' save in shares (2 savers) | {med['shared_save_s']:.3f} s | "
        f"{out['shared_save_vs_alone']:.2f}x alone |"
    )
    meet = med["savers_meet_s"]
    print(f"| the savers meet (store, old group left, group formed) | {meet:.3f} s | |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params-m", type=float, default=50.0)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--store-port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    from tools.ports import free_port  # noqa: PLC0415

    args.port, args.store_port = free_port(), free_port()
    fig = run(args)
    out = report(fig)
    if args.json:
        args.json.write_text(json.dumps({"figures": fig, "summary": out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
