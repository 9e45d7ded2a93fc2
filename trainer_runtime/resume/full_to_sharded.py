"""Full tensors laid out like live sharded state, before ``load_state_dict`` takes them.

A format-version-1 rank file and a plain ``state_dict`` file (what ``rtj-checkpoints export``
writes) hold full, unsharded tensors. Under FSDP2 (``fully_shard``) the live parameters and
their optimizer state are ``DTensor`` shards, and ``load_state_dict`` cannot copy a plain
tensor into one (torch raises "got mixed torch.Tensor and DTensor"). Every rank holds the
same full tensor here, so each one keeps its own shard of it, without communication
(``distribute_tensor(..., src_data_rank=None)``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor


def is_sharded(model: nn.Module) -> bool:
    """Whether any parameter of ``model`` is a ``DTensor`` (FSDP2, tensor parallel)."""
    return any(isinstance(p, DTensor) for p in model.parameters())


def model_state_like(live: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` with each full tensor whose live counterpart is a ``DTensor`` sharded
    like it; everything else as it is (mismatches are the caller's to report)."""
    return {key: _like(live.get(key), value) for key, value in saved.items()}


def optimizer_state_like(opt: torch.optim.Optimizer, saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` (an optimizer ``state_dict``, parameters by position as
    ``Optimizer.load_state_dict`` pairs them) with each full state tensor of a ``DTensor``
    parameter (``exp_avg``, ``exp_avg_sq``..., the parameter's shape) sharded like it."""
    live = [p for group in opt.param_groups for p in group["params"]]
    ids = [i for group in saved.get("param_groups", []) for i in group["params"]]
    param_of = dict(zip(ids, live, strict=False))
    state = {
        index: (
            {key: _like(param_of.get(index), value) for key, value in entry.items()}
            if isinstance(entry, dict)
            else entry
        )
        for index, entry in saved.get("state", {}).items()
    }
    return {**saved, "state": state}


def _like(live: object, value: object) -> object:
    full = isinstance(value, torch.Tensor) and not isinstance(value, DTensor)
    if not (full and isinstance(live, DTensor) and value.shape == live.shape):
        return value
    local = value.to(device=live.to_local().device)
    return distribute_tensor(local, live.device_mesh, live.placements, src_data_rank=None)
