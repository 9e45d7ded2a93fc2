"""How long an async save holds training up when the state is on a GPU, two staging designs.

    python benchmarks/gpu_staging_stall.py --json OUT [--size-mib 1024] [--rounds 5]
        [--device cuda|cpu]   (cpu: a smoke run of the script, both async designs alike)

One process, the state (a Linear/LayerNorm stack plus Adam, as ``checkpoint_engines.py``
builds it) on GPU 0. Each round, in rotating order:

- ``sync``: a synchronous save, page cache dropped first (the denominator of the stall target);
- ``stream``: an async save as the runtime makes it: the staging copies run on a stream of
  their own, ordered after the work queued before the save and beside the next forward and
  backward;
- ``device``: the same save with the staging as it was before: copies on the device's current
  stream and a wait for the whole device (so the wait includes the next step's queued work).

The stall is ``checkpoint_engines.py``'s: the save call plus the time the next optimizer step
waits for staging, after a forward and backward. Medians of the rounds, and the stall of each
design as a share of the sync save.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import interrupt  # first of the third-party imports: Ctrl-C during them ends quietly
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoint_engines as bench
from harness import MiB, conditions, drop_whole_page_cache, round_order, write_json

from trainer_runtime.run.dist import Coordinator
from trainer_runtime.run_folder.layout import RunFolder
from trainer_runtime.save.rank_contents import Components
from trainer_runtime.sharded import ShardedCheckpointer, ShardedEngine
from trainer_runtime.sharded.staging import HostStager
from trainer_runtime.timestamp import Timestamp

MODES = ("sync", "stream", "device")


def device_wide(stack: ExitStack) -> None:
    """Staging as it was before its own stream: the current stream, the whole device waited."""

    def current(self: HostStager, device: torch.device) -> torch.cuda.Stream:
        self._devices.add(device)
        return torch.cuda.current_stream(device)

    def wait_device(self: HostStager) -> None:
        for device in self._devices:
            torch.cuda.synchronize(device)
        self._devices.clear()

    stack.enter_context(mock.patch.object(HostStager, "mark_save_point", lambda *_: None))
    stack.enter_context(mock.patch.object(HostStager, "_copy_stream", current))
    stack.enter_context(mock.patch.object(HostStager, "synchronize", wait_device))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = ap.parse_args()
    bench.use_device(args.device)
    model, wrapped, opt = bench.build("single", args.size_mib * MiB, 1)
    width = model[0].in_features
    bench.train_step(wrapped, opt, width)
    root = args.dir or Path(tempfile.mkdtemp(prefix="rtj-stall-"))
    engine = ShardedEngine(Components(model=model, optimizers={"adam": opt}), Coordinator())
    ckpt = ShardedCheckpointer(engine, RunFolder(root), run_name="stall")
    ckpt.save_async("warm", timestamp=Timestamp(batch=0)).result()  # staging buffers made
    shutil.rmtree(root / "warm", ignore_errors=True)
    dropped = drop_whole_page_cache()
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    for round_ in range(args.rounds):
        for mode in round_order(MODES, round_):
            name = f"r{round_}-{mode}"
            if mode == "sync":
                drop_whole_page_cache()
                t = time.perf_counter()
                ckpt.save(name, timestamp=Timestamp(batch=round_))
                samples[mode].append(time.perf_counter() - t)
                shutil.rmtree(root / name, ignore_errors=True)
                continue
            with ExitStack() as stack:
                if mode == "device":
                    device_wide(stack)
                bench.sync()
                t0 = time.perf_counter()
                ckpt.save_async(name, timestamp=Timestamp(batch=round_))
                call = time.perf_counter() - t0
                bench.forward_backward(wrapped, width)
                t1 = time.perf_counter()
                ckpt.wait_for_staging()
                samples[mode].append(call + time.perf_counter() - t1)
                opt.step()
                opt.zero_grad(set_to_none=False)
                ckpt.wait()
            shutil.rmtree(root / name, ignore_errors=True)
        figures = ", ".join(f"{m}={samples[m][-1]:.4f}" for m in MODES)
        print(f"[stall] round {round_ + 1}: {figures}", flush=True)
    if args.dir is None:
        shutil.rmtree(root, ignore_errors=True)
    medians = {m: statistics.median(v) for m, v in samples.items()}
    shares = {m: medians[m] / medians["sync"] for m in ("stream", "device")}
    for m in MODES:
        print(f"{m:8s} median {medians[m]:.4f} s  [{min(samples[m]):.4f}-{max(samples[m]):.4f}]")
    for m, share in shares.items():
        print(f"stall of {m} staging: {share:.2%} of a sync save (target <= 2%)")
    if args.json:
        write_json(
            args.json,
            {
                "benchmark": "gpu_staging_stall",
                "device": bench.device_name(args.device),
                "size_mib": args.size_mib,
                "conditions": conditions(page_cache_dropped=dropped),
                "samples": samples,
                "medians": medians,
                "stall_vs_sync_save": shares,
            },
        )


if __name__ == "__main__":
    interrupt.run(main)
