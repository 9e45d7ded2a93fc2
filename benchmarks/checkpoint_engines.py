"""Checkpoint engines compared: the sharded runtime engine vs plain DCP vs torch.save.

    python benchmarks/checkpoint_engines.py --json OUT [--quick | --size-mib N] [--rounds 5]
        [--dir FOLDER] [--configs single,ddp4,fsdp4] [--device cpu|cuda]

For one state (a Linear/LayerNorm stack plus Adam, about 1 GiB in total; 96 MiB with --quick)
and each configuration (1 process; 4-rank DDP, where the state is replicated; 4-rank FSDP2,
where it is sharded) it starts real gloo processes and measures, in interleaved rounds (at
least 3; the engine order rotates each round):

- save: a synchronous durable save (the runtime's includes its manifest commit), page cache
  dropped first; against ``raw.write_s``: each rank writes and fdatasyncs as many bytes as its
  runtime data file, from a buffer filled before timing;
- stall: how long an async save holds training up: the save call plus the time the next
  optimizer step waits for staging (``dcp.async_save`` stages inside the call);
- persist: from the async save call until it is durable;
- load: a relaunched job's load, timed in a fresh set of rank processes started for it (one
  child per rank, on a gloo group of their own, so no load reuses heap memory that earlier
  operations touched): into a freshly built model and an optimizer without state (built and
  initialised before the clock starts), page cache dropped and torch's code re-warmed, then
  the load call (the runtime's verifies every chunk; DCP's includes
  ``get_*_state_dict``/``set_*_state_dict``; torch's is ``torch.load`` + ``load_state_dict``);
- resume: load plus the first training step's extra time over a steady step of the same model;
- raw read: relaunched ranks, page cache dropped, each reads as many bytes of the runtime's
  files as its load, into a 64 MiB buffer touched before the clock (``raw.read``: the disk's
  bandwidth), or into one newly allocated buffer of that size (``raw.read_fresh``: what any
  loader of a relaunched job pays at least). Both are relaunched like the loads, so all three
  start from the same process state; read inside the long-lived benchmark ranks, at the end of
  a round, the touched-buffer read took 0.44-1.70 s on a 2-core VM where relaunched it took
  0.39-0.56 s;
- bytes written per checkpoint; the 1-minute load average at the start of every round.

``--device cuda`` keeps the model and optimizer state on GPU ``LOCAL_RANK`` (a configuration
needs a GPU per rank: one GPU runs ``single``): saves copy device to host, loads host to
device, and every timed step ends with a device synchronize. The raw read and write stay host
I/O, the disk's bandwidth.

Times are the slowest rank's. The rounds, medians, cache drops, conditions (CPUs, load average,
versions) and target checks are ``harness.py``'s, shared with ``checkpoint.py``. The JSON has,
per configuration, ``figures`` (median/min/max/n), ``ratios`` and ``targets`` (each with its
bound and whether it was met). Rank processes are this module run with ``--worker``.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import interrupt  # first of the third-party imports: Ctrl-C during them ends quietly
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
from torch.distributed.tensor import DTensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import (
    MIN_ROUNDS,
    RESUME_MARK,
    MiB,
    Samples,
    Targets,
    conditions,
    drop_whole_page_cache,
    judge,
    load_average,
    print_report,
    round_order,
    scratch_folder,
    timed,
    write_json,
)

from tools.ports import free_port
from trainer_runtime.run.dist import Coordinator
from trainer_runtime.run_folder.layout import RunFolder
from trainer_runtime.save.manifest import Manifest
from trainer_runtime.save.rank_contents import Components
from trainer_runtime.sharded import ShardedCheckpointer, ShardedEngine
from trainer_runtime.sharded import load as load_module
from trainer_runtime.timestamp import Timestamp

MIN_ENGINE_ROUNDS = 3
"""Fewer than ``harness.MIN_ROUNDS``: three 4-rank configurations of 1 GiB at 5 rounds each do
not fit the 15 minutes a benchmark may hold the shared machine; 3 rounds still give a median
that one outlier cannot move."""
CONFIGS = {"single": ("single", 1), "ddp4": ("ddp", 4), "fsdp4": ("fsdp", 4)}
ENGINES = ("runtime", "dcp", "torch")
VIA_HOST = "runtime-host"
"""With ``--device cuda``, also the runtime's load of the same files through host staging
buffers, as every load took before loads went straight to the GPU (``device_ring``)."""
DEVICE = torch.device("cpu")
"""Where the state lives: ``--device`` in every benchmark process, GPU ``LOCAL_RANK`` for cuda."""


def use_device(kind: str) -> None:
    global DEVICE  # noqa: PLW0603 - one per process, set once from its arguments
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device is available here")
        DEVICE = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(DEVICE)


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


# ---------------------------------------------------------------------------- the state
def init_group() -> None:
    if DEVICE.type == "cuda":
        dist.init_process_group("cpu:gloo,cuda:nccl", device_id=DEVICE)
    else:
        dist.init_process_group("gloo")


def build(layout: str, total_bytes: int, world: int) -> tuple[nn.Module, nn.Module, Any]:
    width = 2048 if total_bytes >= 512 * MiB else 512
    blocks = max(1, total_bytes // 3 // ((width * width + 3 * width) * 4))
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(blocks):
        layers += [nn.Linear(width, width), nn.LayerNorm(width)]
    model = nn.Sequential(*layers).to(DEVICE)
    wrapped: nn.Module = model
    if layout == "ddp":
        wrapped = nn.parallel.DistributedDataParallel(model)
    elif layout == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
        from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

        mesh = init_device_mesh(DEVICE.type, (world,))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    return model, wrapped, opt


def forward_backward(wrapped: nn.Module, width: int) -> None:
    wrapped(torch.randn(8, width, device=DEVICE)).square().mean().backward()


def train_step(wrapped: nn.Module, opt: Any, width: int) -> None:
    forward_backward(wrapped, width)
    opt.step()
    opt.zero_grad(set_to_none=False)
    sync()


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


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---------------------------------------------------------------------------- one rank
class Rank:
    def __init__(self, args: argparse.Namespace) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        if self.world > 1:
            init_group()
        self.rank = dist.get_rank() if self.world > 1 else 0
        self.coord = Coordinator()
        self.root = Path(args.dir)
        self.layout, self.total, self.rounds = args.layout, args.bytes, args.rounds
        self.model, self.wrapped, self.opt = build(args.layout, args.bytes, self.world)
        self.width = self.model[0].in_features
        train_step(self.wrapped, self.opt, self.width)
        self.engine = ShardedEngine(
            Components(model=self.model, optimizers={"adam": self.opt}),
            self.coord,
            commit_coord=Coordinator(),
        )
        self.ckpt = ShardedCheckpointer(self.engine, RunFolder(self.root / "runtime"), run_name="b")
        self.raw_buffer = memoryview(bytearray(os.urandom(64 * MiB)))  # touched before timing
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
        else:  # what a torch.save user writes: each rank its own (local) state dicts
            path.mkdir(parents=True, exist_ok=True)
            state = {"model": self.model.state_dict(), "optim": self.opt.state_dict()}
            with open(path / f"rank{self.rank}.pt", "wb") as f:
                torch.save(local_tree(state), f)
                f.flush()
                os.fsync(f.fileno())

    def raw_write(self, round_: int, nbytes: int) -> None:
        """This rank's share of a runtime save's bytes, written and fdatasync'ed."""
        path = self.root / "raw" / f"r{round_}-{self.rank}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb", buffering=0) as f:
            left = nbytes
            while left > 0:
                left -= f.write(self.raw_buffer[: min(left, len(self.raw_buffer))])
            os.fdatasync(f.fileno())

    def async_save(self, engine: str, round_: int) -> tuple[float, float, float]:
        """(call, stall, persist) for one async save followed by one training step."""
        path = self.name(engine, round_).with_name(f"a{round_}")
        t0 = time.perf_counter()
        if engine == "runtime":
            self.ckpt.save_async(path.name, timestamp=Timestamp(batch=round_))
        else:
            state = {"model": self.sd_model(), "optim": self.sd_optim()}
            fut = dcp.async_save(state, checkpoint_id=path, process_group=self.ckpt.coord.group)
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

    # -- resumes -------------------------------------------------------------
    def resume(self, engine: str, round_: int) -> tuple[float, float, int]:
        """(load, first step's extra time, bytes read), timed in relaunched rank processes."""
        return self.relaunched(engine, round_, 0)

    def raw_read(self, how: str, round_: int, nbytes: int) -> float:
        """Each rank reads its share of the runtime's bytes, relaunched: ``raw-touched`` or
        ``raw-fresh`` (see ``raw_reader``)."""
        return self.relaunched(how, round_, nbytes)[0]

    def relaunched(self, what: str, round_: int, nbytes: int) -> tuple[float, float, int]:
        """Run one resume contender in a fresh set of rank processes, one child per rank, on
        a gloo group of their own: a relaunched job's memory is memory it never touched.
        Timing it inside these long-lived ranks instead hands the load the heap that earlier
        operations touched and freed (see relaunched_resume.py)."""
        port = self.coord.broadcast(free_port() if self.rank == 0 else 0)
        env = {**os.environ, "MASTER_PORT": str(port)}
        cmd = [sys.executable, __file__, "--resume-worker", what, "--layout", self.layout]
        cmd += ["--device", DEVICE.type]
        cmd += ["--bytes", str(self.total), "--dir", str(self.root), "--round", str(round_)]
        cmd += ["--read-bytes", str(nbytes)]
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=600, check=False
        )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESUME_MARK)]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(
                f"relaunched {what} on rank {self.rank} failed (exit {proc.returncode}): "
                f"{(proc.stderr or proc.stdout)[-2000:]}"
            )
        fig = json.loads(lines[-1][len(RESUME_MARK) :])
        return self.slowest(fig["load_s"]), self.slowest(fig["extra_s"]), int(fig["bytes_read"])

    def progress(self, round_: int, what: str, started: float) -> None:
        """Rank 0 says what of the round is done: a round of relaunched loads takes minutes
        on 2 shared cores, and a run that prints nothing in that time looks hung."""
        if self.rank == 0:
            took = time.perf_counter() - started
            print(f"[bench]   round {round_ + 1}/{self.rounds}: {what} ({took:.0f} s)", flush=True)

    def cold(self) -> None:
        self.barrier()
        if self.rank == 0:
            drop_whole_page_cache()
        self.barrier()

    def timed(self, fn, *a) -> tuple[float, Any]:
        self.barrier()
        t = time.perf_counter()
        out = fn(*a)
        sync()
        self.barrier()
        return time.perf_counter() - t, out

    def round(self, round_: int) -> dict[str, float]:
        order = round_order(ENGINES, round_)
        started = time.perf_counter()
        fig: dict[str, float] = {"load_average_1m": load_average()}
        for e in order:
            self.cold()
            fig[f"{e}.save_s"], _ = self.timed(self.save, e, round_)
            if self.rank == 0:
                fig[f"{e}.bytes"] = folder_bytes(self.name(e, round_))
        mine = sum(p.stat().st_size for p in self.name("runtime", round_).glob(f"__{self.rank}_*"))
        self.cold()
        fig["raw.write_s"], _ = self.timed(self.raw_write, round_, mine)
        self.progress(round_, "sync saves and the raw write", started)
        for e in order:
            if e != "torch":
                call, stall, persist = self.async_save(e, round_)
                fig[f"{e}.call_s"], fig[f"{e}.stall_s"], fig[f"{e}.persist_s"] = (
                    call,
                    stall,
                    persist,
                )
        self.progress(round_, "async saves", started)
        nread = 0
        for e in order:
            load_s, extra, got = self.resume(e, round_)
            fig[f"{e}.load_s"], fig[f"{e}.resume_s"] = load_s, load_s + extra
            if e == "runtime":
                nread = got
            self.progress(round_, f"{e} resume, relaunched", started)
        if DEVICE.type == "cuda":
            load_s, extra, _ = self.resume(VIA_HOST, round_)
            fig[f"{VIA_HOST}.load_s"], fig[f"{VIA_HOST}.resume_s"] = load_s, load_s + extra
        fig["raw.read_s"] = self.raw_read("raw-touched", round_, nread)
        fig["raw.read_fresh_s"] = self.raw_read("raw-fresh", round_, nread)
        self.progress(round_, "raw reads, relaunched", started)
        self.barrier()
        if self.rank == 0:
            for e in ENGINES:
                shutil.rmtree(self.name(e, round_), ignore_errors=True)
                shutil.rmtree(self.name(e, round_).with_name(f"a{round_}"), ignore_errors=True)
            shutil.rmtree(self.root / "raw", ignore_errors=True)
        return fig


def make_loader(
    engine: str,
    path: Path,
    *,
    layout: str,
    rank: int,
    coord: Coordinator,
    model: nn.Module,
    opt: Any,
) -> Any:
    """The load of a relaunched process into ``model``/``opt`` (fresh, optimizer without
    state); returns a function doing it that returns the bytes this rank read."""
    if engine in ("runtime", VIA_HOST):
        if engine == VIA_HOST:  # this process only: every target made on the host
            load_module.load_targets = lambda make: make(False)
        target = ShardedEngine(Components(model=model, optimizers={"adam": opt}), coord)
        return lambda: target.load(path, Manifest.read(path))[1].bytes_read

    if engine == "dcp":

        def load_dcp() -> int:  # DCP's documented resume
            state = {
                "model": get_model_state_dict(model),
                "optim": get_optimizer_state_dict(model, opt),
            }
            dcp.load(state, checkpoint_id=path)
            set_model_state_dict(model, state["model"])
            set_optimizer_state_dict(model, opt, state["optim"])
            return 0

        return load_dcp

    def load_torch() -> int:
        file = path / f"rank{rank}.pt"
        data = torch.load(file, map_location="cpu", weights_only=True)
        if layout == "fsdp":
            torch_load_sharded(model, opt, data)
        else:
            model.load_state_dict(data["model"])
            opt.load_state_dict(data["optim"])
        return file.stat().st_size

    return load_torch


def resume_worker(args: argparse.Namespace) -> None:
    """One rank of a relaunched job: build the model, then time one contender's load and the
    first step's extra time (or, for ``raw-*``, a raw read: see ``raw_reader``)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        init_group()
    rank = dist.get_rank() if world > 1 else 0
    coord = Coordinator()
    model, wrapped, opt = build(args.layout, args.bytes, world)  # untimed, touched
    width = model[0].in_features
    tiny, _, tiny_opt = build("single", MiB, 1)  # for warming torch's code, local only
    raw = args.resume_worker in RAW_READS
    engine_dir = "runtime" if raw or args.resume_worker == VIA_HOST else args.resume_worker
    path = Path(args.dir) / engine_dir / f"r{args.round}"

    def cold() -> None:
        coord.barrier()
        if rank == 0:
            drop_whole_page_cache()
        train_step(tiny, tiny_opt, tiny[0].in_features)  # torch's code back in memory
        coord.barrier()

    extra = 0.0
    if raw:
        read = raw_reader(path, rank, args.read_bytes, fresh=args.resume_worker == "raw-fresh")
    else:
        read = make_loader(
            args.resume_worker,
            path,
            layout=args.layout,
            rank=rank,
            coord=coord,
            model=model,
            opt=opt,
        )
    cold()  # ends at a barrier: every rank starts the clock together
    t = time.perf_counter()
    nread = read()
    sync()
    coord.barrier()
    took = time.perf_counter() - t
    if not raw:
        first = timed(lambda: train_step(wrapped, opt, width))
        steady = statistics.median(timed(lambda: train_step(wrapped, opt, width)) for _ in range(2))
        extra = max(0.0, first - steady)
    fig = {"load_s": took, "extra_s": extra, "bytes_read": nread}
    print(RESUME_MARK + json.dumps(fig), flush=True)
    coord.barrier()
    os._exit(0)  # nothing to tear down; skip freeing the state


RAW_READS = ("raw-touched", "raw-fresh")


def raw_reader(folder: Path, rank: int, nbytes: int, *, fresh: bool) -> Callable[[], int]:
    """A plain read of ``nbytes`` of the runtime's data files (this rank's first): into one
    buffer of that size allocated inside the timed call, 16 MiB a call (``fresh``), or over and
    over into one 64 MiB buffer touched now, before the clock, a whole buffer a call."""
    files = sorted(p for p in folder.iterdir() if p.suffix == ".distcp")
    files = files[rank % len(files) :] + files[: rank % len(files)]
    touched = None if fresh else memoryview(bytearray(64 * MiB))  # zero-filled: touched

    def read() -> int:
        if touched is not None:  # 64 MiB a call, always into the same buffer (`dd bs=64M`)
            view, step = touched, len(touched)
        else:  # 16 MiB a call, each into the next part of one buffer of nbytes
            view, step = memoryview(torch.empty(nbytes, dtype=torch.uint8).numpy()), 16 * MiB
        at = 0
        for file in files:
            with open(file, "rb", buffering=0) as f:
                while at < nbytes:
                    start = 0 if view is touched else at
                    n = f.readinto(view[start : start + min(step, nbytes - at)])
                    if not n:
                        break
                    at += n
            if at >= nbytes:
                break
        return at

    return read


def torch_load_sharded(model: nn.Module, opt: Any, data: dict[str, Any]) -> None:
    """torch.load's resume for FSDP2: local shards into the parameters, optimizer state
    adopted and re-wrapped as DTensors laid out like their parameters."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.to_local().copy_(data["model"][name])
    opt.load_state_dict(data["optim"])
    for p, st in opt.state.items():
        if isinstance(p, DTensor):
            for k, v in st.items():
                if isinstance(v, torch.Tensor) and v.dim():
                    st[k] = DTensor.from_local(
                        v,
                        p.device_mesh,
                        p.placements,
                        run_check=False,
                        shape=p.shape,
                        stride=p.stride(),
                    )


def worker(args: argparse.Namespace) -> None:
    r = Rank(args)
    samples = Samples()
    for i in range(args.rounds):
        fig = r.round(i)
        samples.add(fig)
        if r.rank == 0:
            shown = ", ".join(f"{k}={v:.3f}" for k, v in fig.items() if not k.endswith("bytes"))
            print(f"[bench] round {i + 1}/{args.rounds}: {shown}", flush=True)
    r.ckpt.close()
    if r.rank == 0:
        out = {
            "state_bytes": r.state_bytes,
            "idle_step_s": r.idle_step,
            "samples": dict(samples.values),
        }
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
    base += ["--device", args.device]
    base += ["--rounds", str(args.rounds), "--dir", str(args.dir / name), "--result", str(result)]
    port = 29500 + os.getpid() % 1000
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world),  # as torchrun sets it: all ranks share this node
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        procs.append(subprocess.Popen(base, env=env))
    try:
        codes = [p.wait() for p in procs]
    finally:  # interrupted or failed: no rank outlives the run
        stop_ranks(procs)
    if codes != [0] * world:
        raise SystemExit(f"{name}: rank exit codes {codes}")
    return json.loads(result.read_text())


def stop_ranks(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate every rank still running (a Ctrl-C reaches them too; this is for the rest)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def ratios(raw: dict[str, Any]) -> dict[str, float]:
    samples = Samples()
    samples.values.update(raw["samples"])
    m = samples.median
    via_host = {}
    if f"{VIA_HOST}.load_s" in raw["samples"]:
        via_host = {
            "runtime_host_load_speed_vs_raw_read": m("raw.read_s") / m(f"{VIA_HOST}.load_s"),
            "runtime_load_vs_runtime_host": m("runtime.load_s") / m(f"{VIA_HOST}.load_s"),
        }
    return via_host | {
        "runtime_bytes_vs_state": m("runtime.bytes") / raw["state_bytes"],
        "runtime_save_speed_vs_raw_write": m("raw.write_s") / m("runtime.save_s"),
        "runtime_save_vs_dcp": m("runtime.save_s") / m("dcp.save_s"),
        "runtime_load_vs_dcp": m("runtime.load_s") / m("dcp.load_s"),
        "runtime_resume_vs_torch": m("runtime.resume_s") / m("torch.resume_s"),
        "runtime_resume_vs_dcp": m("runtime.resume_s") / m("dcp.resume_s"),
        "runtime_stall_vs_runtime_sync": m("runtime.stall_s") / m("runtime.save_s"),
        "runtime_load_speed_vs_raw_read": m("raw.read_s") / m("runtime.load_s"),
        "runtime_load_speed_vs_raw_read_fresh": m("raw.read_fresh_s") / m("runtime.load_s"),
        "torch_load_speed_vs_raw_read_fresh": m("raw.read_fresh_s") / m("torch.load_s"),
        "dcp_async_stall_vs_dcp_sync": m("dcp.stall_s") / m("dcp.save_s"),
        "torch_save_vs_runtime_save": m("torch.save_s") / m("runtime.save_s"),
    }


TARGETS: Targets = {
    "runtime_bytes_vs_state": ("<=", 1.05),
    "runtime_save_speed_vs_raw_write": (">=", 0.9),
    "runtime_save_vs_dcp": ("<=", 1.1),
    "runtime_load_vs_dcp": ("<=", 1.1),
    "runtime_resume_vs_torch": ("<=", 1.0),
    "runtime_resume_vs_dcp": ("<=", 1.1),
    "runtime_stall_vs_runtime_sync": ("<=", 0.02),
    "runtime_load_speed_vs_raw_read": (">=", 0.8),
}


def device_name(kind: str) -> str:
    return torch.cuda.get_device_name(0) if kind == "cuda" else "cpu"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--quick", action="store_true", help="a 96 MiB state instead of 1 GiB")
    ap.add_argument("--size-mib", type=int, help="state size in MiB (overrides --quick)")
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    ap.add_argument("--dir", type=Path, default=Path("out/bench-engines"))
    ap.add_argument("--configs", default="single,ddp4,fsdp4")
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where the state lives (cuda: a GPU per rank)",
    )
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--resume-worker", choices=[*ENGINES, VIA_HOST, *RAW_READS])
    ap.add_argument("--round", type=int, default=0)
    ap.add_argument("--read-bytes", type=int, default=0)
    ap.add_argument("--layout", default="single")
    ap.add_argument("--bytes", type=int, default=0)
    ap.add_argument("--result", default="")
    args = ap.parse_args()
    use_device(args.device)
    if args.worker:
        worker(args)
        return
    if args.resume_worker:
        resume_worker(args)
        return
    if not args.json:
        ap.error("--json OUT is required")
    if args.rounds < MIN_ENGINE_ROUNDS:
        ap.error(
            f"--rounds={args.rounds}: at least {MIN_ENGINE_ROUNDS} rounds for a median to mean much"
        )
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        ap.error(
            f"--configs: unknown {unknown}; expected a comma-separated subset of {list(CONFIGS)}"
        )
    if args.device == "cuda":
        gpus = torch.cuda.device_count()
        short = [c for c in configs if CONFIGS[c][1] > gpus]
        if short:
            ap.error(f"--device cuda: {short} need a GPU per rank; this machine has {gpus}")
    total = (args.size_mib or (96 if args.quick else 1024)) * MiB
    with scratch_folder(args.dir):
        measure(args, configs, total)


def measure(args: argparse.Namespace, configs: list[str], total: int) -> None:
    dropped = drop_whole_page_cache()
    if not dropped:
        print("[bench] WARNING: cannot drop the page cache (needs root): loads may read cached")
    report: dict[str, Any] = {
        "benchmark": "checkpoint_engines",
        "quick": args.quick,
        "size_mib": total // MiB,
        "rounds": args.rounds,
        "device": device_name(args.device),
        "conditions": conditions(page_cache_dropped=dropped),
    }
    for name in configs:
        print(f"[bench] {name}: {total / MiB:.0f} MiB state, {args.rounds} rounds", flush=True)
        raw = run_config(name, args, total)
        samples = Samples()
        samples.values.update(raw["samples"])
        derived = ratios(raw)
        verdicts = judge(derived, TARGETS)
        print(f"\n== {name}: state {raw['state_bytes'] / MiB:.1f} MiB")
        print_report(samples.summary(), derived, verdicts)
        report[name] = {
            "state_bytes": raw["state_bytes"],
            "idle_step_s": raw["idle_step_s"],
            "figures": samples.summary(),
            "ratios": derived,
            "targets": verdicts,
        }
        report["conditions"]["load_average_1m_at_end"] = load_average()
        write_json(args.json, report)  # after each configuration: a cut-short run keeps some


if __name__ == "__main__":
    interrupt.run(main)
