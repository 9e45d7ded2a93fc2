"""The end of one emulated training step, shared by the multi-process trainers of the tests and
benchmarks (tests/multiproc/survivor_worker.py, benchmarks/reform_worker.py)."""

from __future__ import annotations

import time
from pathlib import Path

import torch


def end_step(opt: torch.optim.Optimizer, step_s: float, first_marker: Path | None) -> None:
    """Apply the update, sleep the emulated step time, and when this is the process's first step
    in its membership, write its wall time into ``first_marker`` (how a membership change is
    timed)."""
    opt.step()
    opt.zero_grad()
    time.sleep(step_s)
    if first_marker is not None:
        first_marker.write_text(repr(time.time()))
