"""Checkpoint engines compared: the sharded runtime engine vs plain DCP vs torch.save.

    python benchmarks/checkpoint_engines.py --json OUT [--quick] [--rounds 5] [--dir FOLDER]
        [--configs single,ddp4,fsdp4]

For one state (a Linear/LayerNorm stack plus Adam, about 1 GiB in total; 96 MiB with --quick)
and each configuration (1 process; 4-rank DDP, where the state is replicated; 4-rank FSDP2,
where it is sharded) it starts real gloo processes and measures, in interleaved rounds (the
engine order rotates each round):

- save: a synchronous durable save (the runtime's includes its manifest commit);
- stall: how long an async save holds training up: the save call plus the time the next
  optimizer step waits for staging (``dcp.async_save`` stages inside the call);
- persist: from the async save call until it is durable;
- load: page cache dropped, then the load call (the runtime's verifies every chunk);
- resume: load plus the first training step's extra time over an idle step;
- raw read: page cache dropped, each rank reads as many bytes of the same files as its load;
- bytes written per checkpoint.

Times are the slowest rank's. The report gives median, min and max over rounds and the ratios
the runtime is held to. Rank processes are this module run with ``--worker``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer_runtime.dist import Coordinator
from trainer_runtime.layout import RunFolder
from trainer_runtime.manifest import Manifest
from trainer_runtime.sharded import ShardedCheckpointer, ShardedEngine
from trainer_runtime.sharded.staging import copy_into_live
from trainer_runtime.state import Components
from trainer_runtime.timestamp import Timestamp

MiB = 1 << 20
CONFIGS = {"single": ("single", 1), "ddp4": ("ddp", 4), "fsdp4": ("fsdp", 4)}
ENGINES = ("runtime", "dcp", "torch")


# ---------------------------------------------------------------------------- the state
def build(layout: str, total_bytes: int, world: int) -> tuple[nn.Module, nn.Module, Any]:
    width = 2048 if total_bytes >= 512 * MiB else 512
    blocks = max(1, total_bytes // 3 // ((width * width + 3 * width) * 4))
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.Linear(width, width), nn.LayerNorm(width)]
    model = nn.Sequential(*layers)
    wrapped: nn.Module = model
    if layout == "ddp":
        wrapped = nn.parallel.DistributedDataParallel(model)
    elif layout == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
        from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

        mesh = init_device_mesh("cpu", (world,))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    return model, wrapped, opt


def forward_backward(wrapped: nn.Module, width: int) -> None:
    wrapped(torch.randn(8, width)).square().mean().backward()


def train_step(wrapped: nn.Module, opt: Any, width: int) -> None:
    forward_backward(wrapped, width)
    opt.step()
    opt.zero_grad(set_to_none=False)


def local_tree(tree: Any) -> Any:
    """DTensors replaced by their local shards (what torch.save can write per rank)."""
    if hasattr(tree, "to_local"):
        return tree.to_local()
    if isinstance(tree, dict):
        return {k: local_tree(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [local_tree(v) for v in tree]
    return tree


def tensor_bytes(tree: Any) -> int:
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(tensor_bytes(v) for v in tree.values())
    if isinstance(tree, list | tuple):
        return sum(tensor_bytes(v) for v in tree)
    return 0


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---------------------------------------------------------------------------- one rank
class Rank:
    def __init__(self, args: argparse.Namespace) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        if self.world > 1:
            dist.init_process_group("gloo")
        self.rank = dist.get_rank() if self.world > 1 else 0
        self.coord = Coordinator()
        self.root = Path(args.dir)
        self.model, self.wrapped, self.opt = build(args.layout, args.bytes, self.world)
        self.width = self.model[0].in_features
        train_step(self.wrapped, self.opt, self.width)
        self.engine = ShardedEngine(
            Components(model=self.model, optimizers={"adam": self.opt}),
            self.coord,
            commit_coord=Coordinator(),
        )
        self.ckpt = ShardedCheckpointer(self.engine, RunFolder(self.root / "runtime"), run_name="b")
        steps = []
        for _ in range(3):
            t = time.perf_counter()
            train_step(self.wrapped, self.opt, self.width)
            steps.append(time.perf_counter() - t)
        self.idle_step = self.slowest(statistics.median(steps))
        state = {"model": self.sd_model(), "optim": self.sd_optim()}
        local = tensor_bytes(local_tree(state))
        if args.layout == "fsdp":
            self.state_bytes = int(sum(self.coord.all_gather(local)))
        else:
            self.state_bytes = local

    def slowest(self, value: float) -> float:
        return max(self.coord.all_gather(value))

    def barrier(self) -> None:
        self.coord.barrier()

    def sd_model(self) -> dict[str, Any]:
        return get_model_state_dict(self.model)

    def sd_optim(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.model, self.opt)

    def name(self, engine: str, round_: int) -> Path:
        return self.root / engine / f"r{round_}"

    # -- saves ---------------------------------------------------------------
    def save(self, engine: str, round_: int) -> None:
        path = self.name(engine, round_)
        if engine == "runtime":
            self.ckpt.save(path.name, timestamp=Timestamp(batch=round_))
        elif engine == "dcp":
            dcp.save({"model": self.sd_model(), "optim": self.sd_optim()}, checkpoint_id=path)
        else:
            path.mkdir(parents=True, exist_ok=True)
            state = local_tree({"model": self.sd_model(), "optim": self.sd_optim()})
            file = path / f"rank{self.rank}.pt"
            with open(file, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())

    def async_save(self, engine: str, round_: int) -> tuple[float, float, float]:
        """(call, stall, persist) for one async save followed by one training step."""
        path = self.name(engine, round_).with_name(f"a{round_}")
        t0 = time.perf_counter()
        if engine == "runtime":
            self.ckpt.save_async(path.name, timestamp=Timestamp(batch=round_))
        elif engine == "dcp":
            state = {"model": self.sd_model(), "optim": self.sd_optim()}
            fut = dcp.async_save(state, checkpoint_id=path, process_group=self.ckpt.coord.group)
        else:
            return 0.0, 0.0, 0.0
        call = time.perf_counter() - t0
        forward_backward(self.wrapped, self.width)
        t1 = time.perf_counter()
        if engine == "runtime":
            self.ckpt.wait_for_staging()
        waited = time.perf_counter() - t1
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)
        if engine == "runtime":
            self.ckpt.wait()
        else:
            fut.result()
        persist = time.perf_counter() - t0
        return self.slowest(call), self.slowest(call + waited), self.slowest(persist)

    # -- loads ---------------------------------------------------------------
    def load(self, engine: str, round_: int) -> int:
        """Load the round's checkpoint; returns the bytes this rank read."""
        path = self.name(engine, round_)
        if engine == "runtime":
            _, report = self.engine.load(path, Manifest.read(path))
            return report.bytes_read
        if engine == "dcp":
            state = {"model": self.sd_model(), "optim": self.sd_optim()}
            dcp.load(state, checkpoint_id=path)
            set_model_state_dict(self.model, state["model"])
            set_optimizer_state_dict(self.model, self.opt, state["optim"])
            return 0
        file = path / f"rank{self.rank}.pt"
        loaded = torch.load(file, map_location="cpu", weights_only=True)
        live = {"model": self.sd_model(), "optim": self.sd_optim()}
        copy_into_live(live, loaded, on_mismatch=lambda p, why: None)
        return file.stat().st_size

    def raw_read(self, engine: str, round_: int, nbytes: int) -> None:
        path = self.name(engine, round_)
        files = sorted(p for p in path.iterdir() if p.suffix in (".distcp", ".pt"))
        files = files[self.rank % len(files) :] + files[: self.rank % len(files)]
        buf = bytearray(64 * MiB)
        left = nbytes
        for file in files:
            with open(file, "rb", buffering=0) as f:
                while left > 0 and (n := f.readinto(buf)):
                    left -= n
            if left <= 0:
                break

    def cold(self) -> None:
        self.barrier()
        if self.rank == 0:
            drop_caches()
        self.barrier()

    def timed(self, fn, *a) -> tuple[float, Any]:
        self.barrier()
        t = time.perf_counter()
        out = fn(*a)
        self.barrier()
        return time.perf_counter() - t, out

    def round(self, round_: int) -> dict[str, dict[str, float]]:
        order = ENGINES[round_ % 3 :] + ENGINES[: round_ % 3]
        fig: dict[str, dict[str, float]] = {e: {} for e in ENGINES}
        for e in order:
            fig[e]["save_s"], _ = self.timed(self.save, e, round_)
            if self.rank == 0:
                fig[e]["bytes"] = folder_bytes(self.name(e, round_))
        for e in order:
            if e != "torch":
                call, stall, persist = self.async_save(e, round_)
                fig[e]["call_s"], fig[e]["stall_s"], fig[e]["persist_s"] = call, stall, persist
        for e in order:
            self.cold()
            fig[e]["load_s"], nread = self.timed(self.load, e, round_)
            t = time.perf_counter()
            train_step(self.wrapped, self.opt, self.width)
            extra = max(0.0, self.slowest(time.perf_counter() - t) - self.idle_step)
            fig[e]["resume_s"] = fig[e]["load_s"] + extra
            if e == "runtime":
                self.cold()
                fig[e]["raw_read_s"], _ = self.timed(self.raw_read, e, round_, nread)
        for e in ENGINES:
            self.barrier()
            if self.rank == 0:
                shutil.rmtree(self.name(e, round_), ignore_errors=True)
                shutil.rmtree(self.name(e, round_).with_name(f"a{round_}"), ignore_errors=True)
        return fig


def worker(args: argparse.Namespace) -> None:
    r = Rank(args)
    rounds = [r.round(i) for i in range(args.rounds)]
    r.ckpt.close()
    if r.rank == 0:
        out = {"state_bytes": r.state_bytes, "idle_step_s": r.idle_step, "rounds": rounds}
        Path(args.result).write_text(json.dumps(out))
    r.coord.close()
    r.ckpt.coord.close()
    if r.world > 1:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------- driver
def run_config(name: str, args: argparse.Namespace, total: int) -> dict[str, Any]:
    layout, world = CONFIGS[name]
    result = args.dir / f"{name}.json"
    base = [sys.executable, __file__, "--worker", "--layout", layout, "--bytes", str(total)]
    base += ["--rounds", str(args.rounds), "--dir", str(args.dir / name), "--result", str(result)]
    port = 29500 + os.getpid() % 1000
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        procs.append(subprocess.Popen(base, env=env))
    codes = [p.wait() for p in procs]
    if codes != [0] * world:
        raise SystemExit(f"{name}: rank exit codes {codes}")
    return json.loads(result.read_text())


def summarise(raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"state_bytes": raw["state_bytes"], "idle_step_s": raw["idle_step_s"]}
    for engine in ENGINES:
        for metric in raw["rounds"][0][engine]:
            vals = [r[engine][metric] for r in raw["rounds"]]
            out[f"{engine}.{metric}"] = {
                "median": statistics.median(vals),
                "min": min(vals),
                "max": max(vals),
            }
    med = {k: v["median"] for k, v in out.items() if isinstance(v, dict)}
    out["ratios"] = {
        "runtime_bytes_vs_state": med["runtime.bytes"] / raw["state_bytes"],
        "runtime_save_vs_dcp": med["runtime.save_s"] / med["dcp.save_s"],
        "runtime_load_vs_dcp": med["runtime.load_s"] / med["dcp.load_s"],
        "runtime_resume_vs_dcp": med["runtime.resume_s"] / med["dcp.resume_s"],
        "runtime_stall_vs_runtime_sync": med["runtime.stall_s"] / med["runtime.save_s"],
        "dcp_async_stall_vs_dcp_sync": med["dcp.stall_s"] / med["dcp.save_s"],
        "runtime_load_vs_raw_read_speed": med["runtime.raw_read_s"] / med["runtime.load_s"],
    }
    return out


TARGETS = {
    "runtime_bytes_vs_state": ("<=", 1.05),
    "runtime_save_vs_dcp": ("<=", 1.1),
    "runtime_load_vs_dcp": ("<=", 1.1),
    "runtime_resume_vs_dcp": ("<=", 1.1),
    "runtime_stall_vs_runtime_sync": ("<=", 0.02),
    "runtime_load_vs_raw_read_speed": (">=", 0.8),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=str, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=Path("out/bench-engines"))
    ap.add_argument("--configs", default="single,ddp4,fsdp4")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--layout", default="single")
    ap.add_argument("--bytes", type=int, default=0)
    ap.add_argument("--result", default="")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if not args.json:
        ap.error("--json OUT is required")
    total = (96 if args.quick else 1024) * MiB
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    report: dict[str, Any] = {"quick": args.quick, "rounds": args.rounds, "cpus": os.cpu_count()}
    report["page_cache_droppable"] = drop_caches()
    for name in args.configs.split(","):
        print(f"[bench] {name}: {total / MiB:.0f} MiB state, {args.rounds} rounds", flush=True)
        report[name] = summarise(run_config(name, args, total))
        print_config(name, report[name])
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    shutil.rmtree(args.dir, ignore_errors=True)


def print_config(name: str, fig: dict[str, Any]) -> None:
    print(f"\n== {name}: state {fig['state_bytes'] / MiB:.1f} MiB")
    print(f"{'figure':28s} {'median':>10s} {'min':>10s} {'max':>10s}")
    for k, v in fig.items():
        if isinstance(v, dict) and "median" in v:
            scale = MiB if k.endswith("bytes") else 1
            print(
                f"{k:28s} {v['median'] / scale:10.3f} {v['min'] / scale:10.3f} "
                f"{v['max'] / scale:10.3f}"
            )
    for k, (op, bound) in TARGETS.items():
        v = fig["ratios"][k]
        ok = v <= bound if op == "<=" else v >= bound
        print(f"target {k} {op} {bound}: {v:.3f} {'met' if ok else 'MISSED'}")
    for k, v in fig["ratios"].items():
        if k not in TARGETS:
            print(f"ratio {k}: {v:.3f}")


if __name__ == "__main__":
    main()
