"""A tiny model, optimizer, scheduler and step used by the single-process runtime tests."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn

from trainer_runtime import CheckpointManager


class Counter:
    """A user object with state, like a dataset cursor."""

    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


def make(seed: int = 0, hidden: int = 8):
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    model = nn.Sequential(
        nn.Linear(4, hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Linear(hidden, 1)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    return model, opt, sched, scaler


def step(model, opt, sched, counter: Counter | None = None) -> None:
    """One step that draws from every RNG, so restored RNG state is observable."""
    noise = random.random() + float(np.random.rand())
    x = torch.randn(16, 4) + noise
    loss = model(torch.nn.functional.dropout(x, 0.1)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    if counter is not None:
        counter.value += 1


def saved_weights(checkpoint) -> dict[str, torch.Tensor]:
    """The model weights stored in a format-version-2 checkpoint folder (read and verified)."""
    from trainer_runtime import Manifest
    from trainer_runtime.export import read_sharded_weights

    return read_sharded_weights(checkpoint, Manifest.read(checkpoint))


def saved_keys(checkpoint) -> list[str]:
    """Every state-dict key a version-2 checkpoint holds (from its verified DCP metadata)."""
    from trainer_runtime.sharded.storage import read_metadata_bytes

    meta = read_metadata_bytes((checkpoint / ".metadata").read_bytes(), trusted=False)
    return sorted(meta.state_dict_metadata)


def params(model) -> list[torch.Tensor]:
    return [t.detach().clone() for t in model.state_dict().values()]


def manager(tmp_path, comps, *, interval: str = "1ba", **kw):
    """A ``CheckpointManager`` over every component of ``make()``, in ``tmp_path / "ck"``."""
    model, opt, sched, scaler = comps[:4]
    return CheckpointManager(
        model=model,
        optimizer=opt,
        scheduler=sched,
        scaler=scaler,
        folder=tmp_path / "ck",
        run_name="run",
        interval=interval,
        **kw,
    )


def saved_after_one_step(tmp_path):
    """``make()``'s components after one step, committed as a format-2 checkpoint in
    ``tmp_path / "ck"`` (run ``run``)."""
    comps = make()
    ck = manager(tmp_path, comps)
    step(*comps[:3])
    ck.batch_end(16)
    ck.close()
    return comps
