"""Where a relaunched load's time goes: the phases of ``ShardedEngine.load`` and plain reads of
the same file in several patterns, measured in the same rounds.

    python benchmarks/load_phases.py --json OUT [--device cpu|cuda] [--size-mib 1024]
        [--rounds 5] [--dir FOLDER]

One process saves the benchmark state (``checkpoint_engines.build``: a Linear/LayerNorm stack
plus Adam) once with the runtime. Then, in interleaved rounds, each contender runs in a fresh
process of its own. Each process sets up (builds the model, and so on), then drops the page cache
(as root) and warms torch's code with a tiny step, so every contender's clock starts the same
few seconds after the drop: on a VM whose freed memory goes back to the host, the page cache a
read fills costs more the longer after a drop it is filled.

- ``load``: the runtime's load into a freshly built model and an optimizer without state, with
  the time of each phase (metadata, making the targets, DCP's planning, the read loop and
  within it ``pread``, hashing and the GPU ring, the commit into the live state);
- ``load-plain``: the same load without the phase timers (what they cost);
- ``load-handoff``: with ``--device cuda``, the load with the GPU path's reads as before
  ``RingReads`` (``handoff_reads.py``: the loading thread hands the reading thread one block at
  a time); on the CPUs the same as ``load``;
- ``load-16slots``: with ``--device cuda``, the load with a ring of 16 slots instead of
  ``device_ring.RING_SLOTS`` (whether the reading thread's waits for a free slot cost time); on
  the CPUs the same as ``load``;
- ``load-1lane``, ``load-2lanes``: with ``--device cuda``, the load with one reading thread, or
  two each reading every other block into its own half of the ring's slots
  (``DeviceRing(lanes=N)``), whatever ``device_ring.RING_LANES`` says; on the CPUs the same as
  ``load``;
- ``load-warm``: the load in a process whose state already exists (one training step, then one
  untimed load of a second checkpoint of the same state, so no block of the timed one was read
  last by this process): what a running job pays to
  load a checkpoint (``CheckpointManager.load``), into memory it has touched;
- ``load-<size>-blocks``, ``load-warm-<size>-blocks``: those loads with the host path's reads
  in blocks of that size instead of ``reading.READ_BLOCK``;
- ``load-warm-copy``: ``load-warm`` with the optimizer state copied from the verified staging
  buffers into the live tensors, as before the load handed the buffers over instead
  (``optim_target.exchanges`` finds none);
- ``read-fresh``: the data file read into one buffer of its size allocated inside the clock, 16
  MiB a call (what any loader in a relaunched process pays: memory it never touched);
- ``read-<size>``: the data file read into one touched buffer in requests of that size, with
  ``POSIX_FADV_SEQUENTIAL`` as the load asks for (``read-64m`` is ``checkpoint_engines``' raw
  touched read plus that advice), ``-hash`` adding the xxh3-128 the load computes, ``-direct``
  with ``O_DIRECT`` (and no advice);
- ``read-whole-<size>[-hash]``: the same into one buffer of the file's size touched before the
  clock, a different part of it each call: where a load into host memory must put the bytes,
  as many as the state, in a process whose memory for them already exists;
- ``read-whole-<size>-hash-behind``: the same, hashed, with the reads on a thread of their own
  that runs ahead and the hash a block behind on the timed thread;
- ``ring-<size>``: the file read and hashed in blocks of that size through ``DeviceRing`` into
  one tensor on the device (``ring-4m`` is the load's GPU path without DCP around it;
  ``ring-4m-handoff`` the same with the reads as before ``RingReads``, ``ring-4m-1lane`` with
  one reading thread).

``--same-process``: loads in one process that keeps its model and optimizer (a running job, or
one that loads more than once): the runtime's verified load (``CheckpointManager.load`` of a
committed checkpoint folder: manifest, every chunk's digest, then the live state) against DCP's
documented load of the same state, unverified (``dcp.save``d once beside it;
``get_*_state_dict``, ``dcp.load``, ``set_*_state_dict``), alternating in a seeded order, each
followed by the first training step and two steady ones (the first step's extra time counts: a
load that leaves memory for the step to fault in is not done). Both checkpoints are saved by
that process (the runtime's by its manager) before the rounds; one untimed load of each first,
so the memory either load reuses exists. The page cache is dropped before every timed load, as
for the contenders above (``--warm``: not dropped, both sides reading from the page cache).
Each sample has the phase timers of ``instrument``.

Medians [min-max] of the rounds, seconds; the JSON has every sample.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import mmap
import os
import queue
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import interrupt  # first of the third-party imports: Ctrl-C during them ends quietly
import torch.distributed.checkpoint as dcp
import xxhash
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkpoint_engines as bench
from handoff_reads import HandoffReads
from harness import (
    MiB,
    conditions,
    drop_whole_page_cache,
    load_average,
    round_order,
    write_json,
)

from trainer_runtime import CheckpointManager
from trainer_runtime.run.dist import Coordinator
from trainer_runtime.run_folder.layout import RunFolder
from trainer_runtime.save.manifest import Manifest
from trainer_runtime.save.rank_contents import Components
from trainer_runtime.sharded import ShardedCheckpointer, ShardedEngine, optim_target, reading
from trainer_runtime.sharded import load as load_module
from trainer_runtime.sharded.device_ring import RING_LANES, DeviceRing
from trainer_runtime.sharded.ring_reads import RingChunk, RingReads
from trainer_runtime.timestamp import Timestamp

MARK = "LOAD_PHASES "
READS = {  # name: (request bytes, hash each request, O_DIRECT, destination: see plain_read)
    "read-64m": (64 * MiB, False, False, "reused"),
    "read-fresh": (16 * MiB, False, False, "fresh"),
    "read-1m": (MiB, False, False, "reused"),
    "read-1m-hash": (MiB, True, False, "reused"),
    "read-4m-hash": (4 * MiB, True, False, "reused"),
    "read-16m-hash": (16 * MiB, True, False, "reused"),
    "read-16m-hash-direct": (16 * MiB, True, True, "reused"),
    "read-whole-64m": (64 * MiB, False, False, "whole"),
    "read-whole-1m-hash": (MiB, True, False, "whole"),
    "read-whole-8m-hash": (8 * MiB, True, False, "whole"),
}


class Phases:
    """Seconds spent in wrapped functions, by name (nested calls are counted in both)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def timing(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - t

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        inner = getattr(owner, attr)

        def timed(*a: Any, **kw: Any) -> Any:
            with self.timing(name):
                return inner(*a, **kw)

        setattr(owner, attr, timed)


class _TimedDigest:
    def __init__(self, phases: Phases) -> None:
        self._d = xxhash.xxh3_128()
        self._phases = phases

    def update(self, data: Any) -> None:
        with self._phases.timing("read.hash"):
            self._d.update(data)

    def hexdigest(self) -> str:
        return self._d.hexdigest()


def instrument(phases: Phases) -> None:
    """Phase timers around the load's steps (this process only)."""
    phases.wrap(load_module.ShardedLoader, "_agreed_metadata", "metadata")
    phases.wrap(load_module, "load_targets", "targets")
    phases.wrap(load_module.dcp, "load", "dcp.load")
    phases.wrap(reading.VerifyingReader, "read_data", "read")
    phases.wrap(reading.os, "preadv", "read.pread")
    phases.wrap(DeviceRing, "acquire", "read.ring_acquire")  # the reading thread's wait for a slot
    phases.wrap(DeviceRing, "send", "read.ring_send")
    phases.wrap(DeviceRing, "close", "read.ring_close")
    phases.wrap(load_module, "copy_into_live", "copy_into_live")
    phases.wrap(optim_target, "adopt", "adopt")
    phases.wrap(optim_target, "exchange", "exchange")
    phases.wrap(load_module.state_mod, "restore", "small_state")
    shim = type("xxhash_shim", (), {})()
    shim.xxh3_128 = lambda: _TimedDigest(phases)  # type: ignore[attr-defined]
    reading.xxhash = shim  # type: ignore[assignment]


def data_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix == ".distcp")


def plain_read(
    files: list[Path], request: int, digest: bool, direct: bool, dest: str
) -> Callable[[], int]:
    """Read ``files`` whole, ``request`` bytes a call, into (``dest``) one buffer of ``request``
    bytes touched now, over and over (``reused``), or each call into the next part of one
    buffer of the files' size: made inside the timed call (``fresh``) or before it and touched
    (``whole``: where a running process's load reads)."""
    import torch  # noqa: PLC0415

    size = sum(f.stat().st_size for f in files)
    touched = None
    if dest == "reused":
        buf = mmap.mmap(-1, request)  # page-aligned, for O_DIRECT
        buf.write(b"\1" * request)
        touched = memoryview(buf)
    whole = torch.ones(size, dtype=torch.uint8) if dest == "whole" else None

    def read() -> int:
        fresh_buf = whole if dest != "fresh" else torch.empty(size, dtype=torch.uint8)
        view = touched if touched is not None else memoryview(fresh_buf.numpy())
        total = 0
        for file in files:
            fd = os.open(file, os.O_RDONLY | (os.O_DIRECT if direct else 0))
            try:
                if not direct:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                h = xxhash.xxh3_128() if digest else None
                at = 0
                while True:
                    into = view if touched is not None else view[total + at :][:request]
                    n = os.preadv(fd, [into], at)
                    if n <= 0:
                        break
                    if h is not None:
                        h.update(into[:n])
                    at += n
                total += at
            finally:
                os.close(fd)
        return total

    return read


BEHIND = {"read-whole-1m-hash-behind": MiB, "read-whole-4m-hash-behind": 4 * MiB}


def read_behind(files: list[Path], request: int) -> Callable[[], int]:
    """``read-whole-<size>-hash`` with the reads on a thread of their own, running ahead, and the
    hash on this thread, a block behind the reads (the host path's reads if its reading thread
    never waited for its hashing)."""
    import torch  # noqa: PLC0415

    size = sum(f.stat().st_size for f in files)
    whole = torch.ones(size, dtype=torch.uint8)
    view = memoryview(whole.numpy())

    def read() -> int:
        landed: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
        fds = [os.open(file, os.O_RDONLY) for file in files]

        def reader() -> None:
            total = 0
            for fd in fds:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                at = 0
                while (n := os.preadv(fd, [view[total + at :][:request]], at)) > 0:
                    landed.put((total + at, n))
                    at += n
                landed.put((-1, 0))  # end of this file
                total += at

        thread = threading.Thread(target=reader)
        thread.start()
        total = 0
        try:
            for _ in fds:
                h = xxhash.xxh3_128()
                while (got := landed.get())[0] >= 0:
                    h.update(view[got[0] : got[0] + got[1]])
                    total += got[1]
        finally:
            thread.join()
            for fd in fds:
                os.close(fd)
        return total

    return read


# name: the host path's read block (reading.READ_BLOCK)
BLOCKS = {"4m": 4 * MiB, "8m": 8 * MiB, "16m": 16 * MiB, "64m": 64 * MiB}
RINGS = {"ring-1m": MiB, "ring-4m": 4 * MiB, "ring-16m": 16 * MiB}  # name: block (and slot) size
RINGS["ring-4m-handoff"] = RINGS["ring-4m-1lane"] = RINGS["ring-4m"]


def ring_read(
    files: list[Path], block_bytes: int, handoff: bool = False, lanes: int = RING_LANES
) -> Callable[[], int]:
    """The load's GPU path without DCP: blocks read by ``RingReads``' thread into ``DeviceRing``
    slots (of at least 4 MiB), each copied into one tensor on the device and hashed here."""
    import torch  # noqa: PLC0415

    size = sum(f.stat().st_size for f in files)
    dst = torch.empty(size, dtype=torch.uint8, device=bench.DEVICE)
    ring = DeviceRing(bench.DEVICE, slot_bytes=max(block_bytes, 4 * MiB), lanes=lanes)

    def read() -> int:
        fds = [os.open(file, os.O_RDONLY) for file in files]
        chunks, at = [], 0
        for fd, file in zip(fds, files, strict=True):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            chunks.append(RingChunk(fd, file.name, 0, file.stat().st_size, ring))
        reads = (HandoffReads if handoff else RingReads)(chunks, block=block_bytes)
        try:
            for chunk in chunks:
                reads.copy_next(dst[at : at + chunk.length], xxhash.xxh3_128())
                at += chunk.length
        finally:
            reads.close()
            for fd in fds:
                os.close(fd)
        ring.close()
        return at

    return read


def worker(args: argparse.Namespace) -> None:
    bench.use_device(args.device)
    folder = Path(args.dir) / "runtime" / "r0"
    what = args.worker
    phases = Phases()
    # Every contender's process builds the same model first (untimed, touched), the reads'
    # too: on a VM that hands freed memory back to its host, which pages the page cache gets
    # after a drop, and what they cost, depends on what the process allocated before.
    model, wrapped, opt = bench.build("single", args.bytes, 1)
    if what in READS:
        read = plain_read(data_files(folder), *READS[what])
    elif what in BEHIND:
        read = read_behind(data_files(folder), BEHIND[what])
    elif what in RINGS:
        lanes = 1 if what.endswith(("-1lane", "-handoff")) else RING_LANES
        read = ring_read(data_files(folder), RINGS[what], what.endswith("-handoff"), lanes)
    else:
        engine = ShardedEngine(Components(model=model, optimizers={"adam": opt}), Coordinator())
        if what == "load-warm-copy":
            optim_target.exchanges = lambda *_, **__: []  # type: ignore[assignment]
        if what.startswith("load-warm"):  # state and the load's staging buffers exist
            bench.train_step(wrapped, opt, model[0].in_features)
            other = folder.with_name("w0")
            engine.load(other, Manifest.read(other))
        if what == "load-handoff":  # the GPU path's reads as before RingReads
            reading.RingReads = HandoffReads  # type: ignore[misc]
            reading.DeviceRing = functools.partial(DeviceRing, lanes=1)  # type: ignore[misc]
        if what == "load-16slots":  # the GPU path with four times the ring's slots
            reading.DeviceRing = functools.partial(DeviceRing, slots=16)  # type: ignore[misc]
        if what in ("load-1lane", "load-2lanes"):  # the GPU path with one or two reading threads
            lanes = int(what[len("load-")])
            reading.DeviceRing = functools.partial(DeviceRing, lanes=lanes)  # type: ignore[misc]
        if what.endswith("-blocks"):  # the host path's reads in larger blocks
            reading.READ_BLOCK = BLOCKS[what.split("-")[-2]]
        if what != "load-plain":
            instrument(phases)

        def read() -> int:
            return engine.load(folder, Manifest.read(folder))[1].bytes_read

    dropped = drop_whole_page_cache()
    tiny, _, tiny_opt = bench.build("single", MiB, 1)
    bench.train_step(tiny, tiny_opt, tiny[0].in_features)  # torch's code warm
    t = time.perf_counter()
    nbytes = read()
    bench.sync()
    took = time.perf_counter() - t
    figures = {"seconds": took, "bytes": nbytes, "dropped": dropped, **dict(phases.seconds)}
    print(MARK + json.dumps(figures), flush=True)
    os._exit(0)


def prepare(args: argparse.Namespace) -> None:
    """Save the state once with the runtime (one training step first, so Adam has state)."""
    bench.use_device(args.device)
    model, wrapped, opt = bench.build("single", args.bytes, 1)
    bench.train_step(wrapped, opt, model[0].in_features)
    engine = ShardedEngine(Components(model=model, optimizers={"adam": opt}), Coordinator())
    ckpt = ShardedCheckpointer(engine, RunFolder(Path(args.dir) / "runtime"), run_name="b")
    ckpt.save("r0", timestamp=Timestamp(batch=0))
    ckpt.save("w0", timestamp=Timestamp(batch=1))  # load-warm's untimed load
    os._exit(0)


SAME = ("verified", "dcp", "read-whole-16m")
"""``--same-process``'s contenders by default: the runtime's load (``CheckpointManager.load``),
DCP's, and the runtime's data files read into touched memory of their size in 16 MiB requests
(DCP's reads are one per tensor, 16 MiB here), unhashed: the floor of any load of them. Also
``verified-<size>-blocks``: the runtime's load with the host path's reads in that size."""
SAME_ALL = (*SAME, *(f"verified-{b}-blocks" for b in BLOCKS))


def dcp_state(model: Any, opt: Any) -> dict[str, Any]:
    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}


def same_process(args: argparse.Namespace) -> None:
    """``--same-process``: both loads in this one process, alternating; one line per sample."""
    bench.use_device(args.device)
    root = Path(args.dir)
    model, wrapped, opt = bench.build("single", args.bytes, 1)
    width = model[0].in_features
    bench.train_step(wrapped, opt, width)
    manager = CheckpointManager(  # a trainer's own manager, built before any clock starts
        model=model,
        optimizer=opt,
        folder=root / "manager",
        run_name="same",
        autoresume=False,
        interval="1000000ba",
        handle_sigterm=False,
        final_save=False,
    )
    saved = manager.save(blocking=True)  # the same state twice: the runtime's and DCP's
    assert saved is not None
    dcp.save(dcp_state(model, opt), checkpoint_id=root / "dcp" / "r0")

    def verified() -> None:
        manager.load(saved.path)

    def plain() -> None:  # DCP's documented load, reading into the live tensors
        state = dcp_state(model, opt)
        dcp.load(state, checkpoint_id=root / "dcp" / "r0")
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, opt, state["optim"])

    def with_blocks(block: int) -> Callable[[], None]:
        def load() -> None:
            reading.READ_BLOCK = block
            try:
                verified()
            finally:
                reading.READ_BLOCK = default_block

        return load

    default_block = reading.READ_BLOCK
    every = {"verified": verified, "dcp": plain}
    every |= {f"verified-{b}-blocks": with_blocks(size) for b, size in BLOCKS.items()}
    if "read-whole-16m" in args.contenders.split(","):  # a GiB more, touched: only if asked
        files = data_files(saved.path)
        every["read-whole-16m"] = plain_read(files, 16 * MiB, False, False, "whole")
    loads = {name: every[name] for name in args.contenders.split(",")}
    phases = Phases()
    instrument(phases)
    phases.wrap(sys.modules[__name__], "set_model_state_dict", "set_state_dict")
    phases.wrap(sys.modules[__name__], "set_optimizer_state_dict", "set_state_dict")
    tiny, _, tiny_opt = bench.build("single", MiB, 1)
    for load in loads.values():  # untimed: what any load reuses exists from here on
        load()
        bench.train_step(wrapped, opt, width)
    for r in range(args.rounds):
        for name in round_order(list(loads), r):
            dropped = drop_whole_page_cache() if not args.warm else False
            bench.train_step(tiny, tiny_opt, tiny[0].in_features)  # torch's code warm
            phases.seconds.clear()
            t = time.perf_counter()
            loads[name]()
            bench.sync()
            took = time.perf_counter() - t
            timings = dict(phases.seconds)
            first = timed_step(wrapped, opt, width)
            steady = statistics.median(timed_step(wrapped, opt, width) for _ in range(2))
            extra = max(0.0, first - steady)
            figures = {
                "round": r,
                "name": name,
                "seconds": took,
                "first_step_extra": extra,
                "with_first_step": took + extra,
                "steady_step": steady,
                "dropped": dropped,
                "load_average": load_average(),
                **timings,
            }
            print(MARK + json.dumps(figures), flush=True)
    os._exit(0)


def timed_step(wrapped: Any, opt: Any, width: int) -> float:
    t = time.perf_counter()
    bench.train_step(wrapped, opt, width)
    return time.perf_counter() - t


def run_same_process(args: argparse.Namespace) -> None:
    """The parent of ``--same-process``: one child for every round; the report, rewritten
    after every sample (a run stopped by a time limit keeps what it measured)."""
    cmd = [sys.executable, __file__, "--dir", args.dir, "--device", args.device]
    cmd += ["--size-mib", str(args.size_mib), "--rounds", str(args.rounds), "--worker", "same"]
    cmd += ["--same-process", "--contenders", args.contenders or ",".join(SAME)]
    cmd += ["--warm"] if args.warm else []
    samples: dict[str, list[dict[str, Any]]] = defaultdict(list)
    dropped = not args.warm
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        for line in child.stdout:
            if not line.startswith(MARK):
                continue
            fig = json.loads(line[len(MARK) :])
            name, r = fig.pop("name"), fig.pop("round")
            dropped = bool(fig.pop("dropped")) and dropped
            samples[name].append(fig)
            print(
                f"[phases] round {r} {name}: {fig['seconds']:.3f} s, with the first step "
                f"{fig['with_first_step']:.3f} s",
                flush=True,
            )
            if args.json:
                write_same_process(args, samples, dropped)
    if child.returncode:
        raise SystemExit(f"--same-process: the child failed ({child.returncode})")
    report = write_same_process(args, samples, dropped)
    for name, figures in report["medians"].items():
        cells = ", ".join(f"{k} {v[0]:.3f} [{v[1]:.3f}-{v[2]:.3f}]" for k, v in figures.items())
        print(f"[phases] {name}: {cells}", flush=True)
    for name, ratio in report["ratios"].items():
        cells = f"{ratio['from_medians']} from the medians, {ratio['paired']} paired"
        print(f"[phases] {name}: {cells}", flush=True)


def write_same_process(
    args: argparse.Namespace, samples: dict[str, list[dict[str, Any]]], dropped: bool
) -> dict[str, Any]:
    report = summarize(samples)
    report["ratios"] = same_process_ratios(samples)
    if args.json:
        write_json(
            args.json,
            {
                "conditions": conditions(page_cache_dropped=dropped),
                "mode": "same-process",
                "device": args.device,
                "size_mib": args.size_mib,
                "read_ahead_kb": read_ahead(),
                **report,
                "samples": samples,
            },
        )
    return report


def same_process_ratios(samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each contender against DCP's load and against the raw read: from the medians, and the
    median of the rounds' own ratios (each round has one of each)."""
    out: dict[str, Any] = {}
    for base in ("dcp", "read-whole-16m"):
        if base not in samples:
            continue
        for name, runs in samples.items():
            if name == base:
                continue
            for key in ("seconds", "with_first_step"):
                mine = [s[key] for s in runs]
                theirs = [s[key] for s in samples[base]]
                if not mine or not theirs:
                    continue
                median = statistics.median(mine) / statistics.median(theirs)
                paired = statistics.median(a / b for a, b in zip(mine, theirs, strict=False))
                out[f"{name} / {base}, {key}"] = {
                    "from_medians": round(median, 3),
                    "paired": round(paired, 3),
                }
    return out


def run_child(args: argparse.Namespace, *extra: str) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--dir",
        args.dir,
        "--device",
        args.device,
        "--size-mib",
        str(args.size_mib),
        *extra,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    for line in out.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    if out.returncode:
        raise SystemExit(f"{' '.join(extra)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="")
    ap.add_argument("--contenders", help="comma-separated subset (default: all)")
    ap.add_argument(
        "--same-process",
        action="store_true",
        help="the runtime's verified load against DCP's, in one process (see above)",
    )
    ap.add_argument("--warm", action="store_true", help="--same-process without cache drops")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.bytes = args.size_mib * MiB
    if args.worker == "same":
        return same_process(args)
    if args.worker:
        return worker(args)
    if args.prepare:
        return prepare(args)
    if args.same_process:
        unknown = sorted(set((args.contenders or "verified").split(",")) - set(SAME_ALL))
        if unknown:
            raise SystemExit(f"--contenders: unknown {unknown}; expected some of {list(SAME_ALL)}")
        own = not args.dir
        if own:
            args.dir = str(Path(os.environ.get("TMPDIR", "/var/tmp")) / f"rtj-same-{os.getpid()}")
        try:
            return run_same_process(args)
        finally:
            if own:
                shutil.rmtree(args.dir, ignore_errors=True)
    contenders = ["load", "load-plain", "load-handoff", "load-16slots"]
    contenders += ["load-1lane", "load-2lanes"]
    contenders += ["load-warm", "load-warm-copy", *READS, *BEHIND, *RINGS]
    contenders += [f"{c}-{b}-blocks" for c in ("load", "load-warm") for b in BLOCKS]
    if args.contenders:  # checked before the state is built and saved
        picked = args.contenders.split(",")
        unknown = sorted(set(picked) - set(contenders))
        if unknown:
            raise SystemExit(f"--contenders: unknown {unknown}; expected some of {contenders}")
        contenders = picked
    own = not args.dir
    if own:
        args.dir = str(Path(os.environ.get("TMPDIR", "/var/tmp")) / f"rtj-phases-{os.getpid()}")
    try:
        run_child(args, "--prepare")
        samples: dict[str, list[dict[str, Any]]] = defaultdict(list)
        dropped = True
        for r in range(args.rounds):
            for name in round_order(contenders, r):
                try:
                    fig = run_child(args, "--worker", name)
                except SystemExit as failure:  # the others' rounds still count
                    print(f"[phases] {name} dropped: {failure}", file=sys.stderr, flush=True)
                    contenders.remove(name)
                    continue
                dropped = bool(fig.pop("dropped", False)) and dropped
                samples[name].append(fig)
                print(f"[phases] round {r} {name}: {fig['seconds']:.3f} s", flush=True)
            if args.json:  # after every round: a run stopped by a time limit keeps its rounds
                write_report(args, samples, dropped)
        report = summarize(samples)
        for name, figures in report["medians"].items():
            cells = ", ".join(f"{k} {v[0]:.3f} [{v[1]:.3f}-{v[2]:.3f}]" for k, v in figures.items())
            print(f"[phases] {name}: {cells}", flush=True)
    finally:
        if own:
            shutil.rmtree(args.dir, ignore_errors=True)


def write_report(
    args: argparse.Namespace, samples: dict[str, list[dict[str, Any]]], dropped: bool
) -> None:
    write_json(
        args.json,
        {
            "conditions": conditions(page_cache_dropped=dropped),
            "device": args.device,
            "size_mib": args.size_mib,
            "read_ahead_kb": read_ahead(),
            **summarize(samples),
            "samples": samples,
        },
    )


def read_ahead() -> dict[str, int]:
    """Each block device's readahead window (KiB), loop and zram devices left out."""
    out = {}
    for f in Path("/sys/block").glob("*/queue/read_ahead_kb"):
        name = f.parent.parent.name
        if not name.startswith(("loop", "zram", "ram")):
            out[name] = int(f.read_text())
    return out


def summarize(samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    medians: dict[str, Any] = {}
    for name, runs in samples.items():
        keys = sorted({k for run in runs for k in run if k != "bytes"})
        medians[name] = {
            k: [
                round(statistics.median(v), 4),
                round(min(v), 4),
                round(max(v), 4),
            ]
            for k in keys
            if (v := [run.get(k, 0.0) for run in runs])
        }
    return {"medians": medians}


if __name__ == "__main__":
    interrupt.run(main)
