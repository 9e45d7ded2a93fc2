"""Checkpoint core benchmark: durable save, async stall, load, against raw I/O baselines.

    python benchmarks/checkpoint.py --json OUT [--quick] [--dir FOLDER]

Builds a state like a real model plus Adam (about 1 GiB; 96 MiB with --quick), then measures on
one filesystem in one run: a raw write of the same bytes with fdatasync, a synchronous durable
save, an async save's stall (the save call plus the wait at the next optimizer step), its
background persist time, step throughput while the persist runs vs idle, a raw read, and a
verified load. Prints a table and writes a flat JSON of figures and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer_runtime import CheckpointManager
from trainer_runtime.manifest import Manifest

MiB = 1 << 20


WIDTH = 2048


def build_state(total_bytes: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Blocks of Linear + LayerNorm (matrices, vectors, biases); Adam triples the bytes."""
    width = WIDTH if total_bytes >= 512 * MiB else 512
    per_block = (width * width + 3 * width) * 4
    blocks = max(1, total_bytes // 3 // per_block)
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.Linear(width, width), nn.LayerNorm(width)]
    model = nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    train_step(model, opt)  # materialise exp_avg / exp_avg_sq
    return model, opt


def train_step(model: nn.Module, opt: torch.optim.Optimizer, batch: int = 16) -> None:
    """A real step of the benchmark model: forward, backward, optimizer update."""
    width = model[0].in_features
    x = torch.randn(batch, width)
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=False)


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def raw_write(path: Path, nbytes: int) -> float:
    buf = memoryview(os.urandom(64 * MiB))
    t = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        left = nbytes
        while left:
            n = f.write(buf[: min(left, len(buf))])
            left -= n
        os.fdatasync(f.fileno())
    return time.perf_counter() - t


def raw_read(path: Path) -> float:
    buf = bytearray(64 * MiB)
    t = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return time.perf_counter() - t


def steps_per_second(model, opt, seconds: float, until=None) -> float:
    n, t0 = 0, time.perf_counter()
    while True:
        train_step(model, opt)
        n += 1
        elapsed = time.perf_counter() - t0
        if (until is None and elapsed >= seconds) or (until is not None and until()):
            return n / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, type=Path)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dir", type=Path, default=Path("out/bench-checkpoint"))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    total = (96 if args.quick else 1024) * MiB
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    print(f"[bench] building a {total / MiB:.0f} MiB model+Adam state", flush=True)
    model, opt = build_state(total)
    state_bytes = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    state_bytes += sum(
        t.numel() * t.element_size()
        for s in opt.state.values()
        for t in s.values()
        if isinstance(t, torch.Tensor)
    )
    figures: dict[str, float | int | str | bool] = {"state_bytes": state_bytes}

    def fresh_manager(name: str, **kw) -> CheckpointManager:
        return CheckpointManager(
            model=model,
            optimizer=opt,
            folder=args.dir / name,
            run_name=name,
            interval="1ba",
            autoresume=False,
            **kw,
        )

    # Synchronous durable save vs raw write + fdatasync of the same byte count.
    sync_times, raw_w = [], []
    ck = fresh_manager("sync")
    for i in range(args.repeat):
        ck.timestamp.batch = i + 1
        t = time.perf_counter()
        saved = ck.save(blocking=True)
        sync_times.append(time.perf_counter() - t)
        assert saved is not None
        file_bytes = Manifest.read(saved.path).files[0].size
        raw_w.append(raw_write(args.dir / f"raw-{i}.bin", file_bytes))
        (args.dir / f"raw-{i}.bin").unlink()
    ck.close()
    figures["file_bytes"] = file_bytes
    figures["sync_save_s"] = statistics.median(sync_times)
    figures["raw_write_fdatasync_s"] = statistics.median(raw_w)
    figures["sync_save_MBps"] = file_bytes / MiB / figures["sync_save_s"]
    figures["raw_write_MBps"] = file_bytes / MiB / figures["raw_write_fdatasync_s"]
    figures["ratio_sync_vs_raw_write"] = figures["sync_save_MBps"] / figures["raw_write_MBps"]

    # Async: stall = the save() call + whatever the next training step takes beyond an idle one
    # (its optimizer.step() waits if the background copy of the weights is not finished).
    idle_sps = steps_per_second(model, opt, 5.0)
    idle_step = 1.0 / idle_sps
    ck = fresh_manager("async", async_save=True)
    stalls, calls, persists, busy_sps = [], [], [], []
    for i in range(args.repeat):
        ck.timestamp.batch = i + 1
        t0 = time.perf_counter()
        ck.save()
        call = time.perf_counter() - t0
        pending = ck._pending
        t1 = time.perf_counter()
        train_step(model, opt)
        first_step = time.perf_counter() - t1
        calls.append(call)
        stalls.append(call + max(0.0, first_step - idle_step))
        if pending is not None and not pending.done():
            busy_sps.append(steps_per_second(model, opt, 0, until=pending.done))
        ck.wait()
        persists.append(time.perf_counter() - t0)
        time.sleep(1.0)
    ck.close()
    figures["train_step_idle_s"] = idle_step
    figures["async_save_call_s"] = statistics.median(calls)
    figures["async_stall_s"] = statistics.median(stalls)
    figures["async_persist_s"] = statistics.median(persists)
    figures["ratio_async_stall_vs_sync"] = figures["async_stall_s"] / figures["sync_save_s"]
    figures["idle_steps_per_s"] = idle_sps
    figures["persisting_steps_per_s"] = statistics.median(busy_sps) if busy_sps else 0.0
    figures["ratio_throughput_persisting_vs_idle"] = figures["persisting_steps_per_s"] / idle_sps

    # Load (verify + read + restore) vs a raw read of the same file.
    path = args.dir / "sync"
    newest = max(path.glob("ep*-ba*"), key=lambda p: Manifest.read(p).timestamp.batch)
    cold = drop_caches()
    loads, reads = [], []
    for _ in range(args.repeat):
        drop_caches()
        reads.append(raw_read(newest / "rank0.pt"))
        drop_caches()
        loader = CheckpointManager(
            model=model, optimizer=opt, folder=args.dir / "load", run_name="load", autoresume=False
        )
        t = time.perf_counter()
        loader.load(newest)
        loads.append(time.perf_counter() - t)
        loader.close()
    figures["page_cache_dropped"] = cold
    figures["load_s"] = statistics.median(loads)
    figures["raw_read_s"] = statistics.median(reads)
    figures["load_MBps"] = file_bytes / MiB / figures["load_s"]
    figures["raw_read_MBps"] = file_bytes / MiB / figures["raw_read_s"]
    figures["ratio_load_vs_raw_read"] = figures["load_MBps"] / figures["raw_read_MBps"]
    figures["quick"] = args.quick
    figures["cpus"] = os.cpu_count() or 0

    print(f"\n{'figure':40s} value")
    for k, v in figures.items():
        print(f"{k:40s} {v:.4f}" if isinstance(v, float) else f"{k:40s} {v}")
    targets = {
        "ratio_async_stall_vs_sync": ("<=", 0.02),
        "ratio_sync_vs_raw_write": (">=", 0.90),
        "ratio_load_vs_raw_read": (">=", 0.80),
        "ratio_throughput_persisting_vs_idle": (">=", 0.85),
    }
    print()
    for k, (op, bound) in targets.items():
        v = figures[k]
        ok = v <= bound if op == "<=" else v >= bound
        print(f"target {k} {op} {bound}: {v:.3f} {'met' if ok else 'MISSED'}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=2) + "\n")
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
