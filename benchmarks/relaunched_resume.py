"""One resume contender of ``checkpoint.py``, timed in a fresh interpreter: a relaunched process.

    python benchmarks/relaunched_resume.py CONTENDER --ckpt PATH --width W --blocks N --dir D

A resume happens in a process that was just started: the model is built and initialised, the
optimizer has no state, and every byte the load allocates is memory the process has never
touched (on the VMs measured, the first touch of fresh memory costs about 0.4-1.8 s/GiB).
Timing the resumes inside the long-lived benchmark process instead, as earlier versions of
``checkpoint.py`` did, hands each contender whatever heap memory the previous operations
touched and freed (glibc serves 16 MiB tensors from its heap once a freed chunk has raised
its mmap threshold), in amounts that depend on the order of the round and on when the garbage
collector ran. That measured ``torch.load`` at 0.68 s where a relaunched process takes 1.1-1.3 s
for the same file, and made the comparison depend on who ran after whom. Here every contender
starts from the same state: a fresh interpreter, the model built, torch's code warm, the page
cache dropped; only the load and the first training steps are timed.

Contenders: ``runtime`` (``CheckpointManager.load``), ``torch.load`` (+ ``load_state_dict``),
``dcp.load`` (DCP's documented resume), and ``raw read (fresh memory)``: the checkpoint's data
files read, in 16 MiB reads, into one newly allocated buffer of their size, which is what any
reader of those bytes into a relaunched process's memory pays at least.

The child prints one line, ``RESUME_FIGURES <json>``; ``checkpoint.run_relaunched`` starts it
and returns the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path

import interrupt  # first of the third-party imports: Ctrl-C during them ends quietly
import torch
import torch.distributed.checkpoint as dcp
from checkpoint import build_empty, dcp_state, train_step, warm_code
from harness import RESUME_MARK, PageCache, timed
from torch.distributed.checkpoint.state_dict import (
    set_model_state_dict,
    set_optimizer_state_dict,
)

from trainer_runtime import CheckpointManager

CONTENDERS = {
    "runtime": "resume",
    "torch.load": "torchload",
    "dcp.load": "dcpload",
    "raw read (fresh memory)": "raw_read_fresh",
}
_READ_BLOCK = 16 << 20


def _loader(args: argparse.Namespace, model: object, opt: object) -> Callable[[], None]:
    """The contender's load, prepared (objects built) before the clock starts."""
    if args.contender == "runtime":
        ck = CheckpointManager(  # built before the clock starts, like the user's own objects
            model=model,
            optimizer=opt,
            folder=args.dir / "resume-target",
            run_name="resume",
            autoresume=False,
            handle_sigterm=False,
            final_save=False,
        )
        return lambda: ck.load(args.ckpt)
    if args.contender == "torch.load":

        def torch_load() -> None:
            data = torch.load(args.ckpt, map_location="cpu", weights_only=True)
            model.load_state_dict(data["model"])
            opt.load_state_dict(data["optim"])

        return torch_load
    if args.contender == "dcp.load":

        def dcp_load() -> None:  # DCP's documented resume: state dicts, load, set
            state = dcp_state(model, opt)
            dcp.load(state, checkpoint_id=args.ckpt)
            set_model_state_dict(model, state["model"])
            set_optimizer_state_dict(model, opt, state["optim"])

        return dcp_load
    files = sorted(p for p in args.ckpt.iterdir() if p.is_file() and p.name != "manifest.json")

    def raw_read_fresh() -> None:
        total = sum(p.stat().st_size for p in files)
        view = memoryview(torch.empty(total, dtype=torch.uint8).numpy())
        at = 0
        for path in files:
            with open(path, "rb", buffering=0) as f:
                while n := f.readinto(view[at : at + _READ_BLOCK]):
                    at += n

    return raw_read_fresh


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("contender", choices=sorted(CONTENDERS))
    ap.add_argument("--ckpt", type=Path, required=True)
    ap.add_argument("--width", type=int, required=True)
    ap.add_argument("--blocks", type=int, required=True)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    prefix = CONTENDERS[args.contender]
    model, opt = build_empty(args.width, args.blocks)
    warm_code()
    load = _loader(args, model, opt)
    PageCache(args.dir, warm=warm_code).drop()
    took = timed(load)
    figures = {f"{prefix}_s" if prefix.startswith("raw") else f"{prefix}_load_s": took}
    if not prefix.startswith("raw"):
        first = timed(lambda: train_step(model, opt))
        steady = statistics.median(timed(lambda: train_step(model, opt)) for _ in range(3))
        extra = max(0.0, first - steady)
        figures[f"{prefix}_first_step_extra_s"] = extra
        figures[f"{prefix}_effective_s"] = took + extra
    print(RESUME_MARK + json.dumps(figures), flush=True)
    os._exit(0)  # nothing to tear down; skip freeing a GiB of tensors


if __name__ == "__main__":
    interrupt.run(main)
