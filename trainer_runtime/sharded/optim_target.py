"""Load targets for an optimizer that has no state yet, adopted as its state once verified.

A resume usually meets a freshly built optimizer: no ``exp_avg``, no ``exp_avg_sq``. DCP's
``get_optimizer_state_dict`` would first create that state (zero gradients and one optimizer
step with the learning rate at zero), then the load reads into host staging buffers and copies
them over it. That touches the optimizer's state twice in fresh memory (the created state and
the staging copy), plus a gradient per parameter, where ``torch.load`` touches it once; on VMs
that charge for the first touch of fresh memory, that made resume slower than ``torch.load``.

Instead the target of the optimizer's part is built from the checkpoint's own metadata: one
new tensor per saved entry, with the saved dtype and size (a ``DTensor`` laid out like its
parameter when the parameter is one), and no optimizer step. The load reads and verifies into
these private tensors; only after every chunk of every rank verified are they handed to the
optimizer as its state (``adopt``). A failed load therefore leaves the optimizer as it was:
empty. The tensors are never the stager's reused buffers, so a later async save cannot stage
over the live state.

An optimizer that already has state (a running process) is read into the stager's buffers like
the model. Once everything verified, ``exchanges``/``exchange`` hand each buffer over as the
optimizer's state and give the tensor it replaces to the stager as that path's buffer: a swap
of two tensors of the same layout instead of a copy, so no buffer is ever live state and the
memory in use stays the same. Only a CPU tensor that owns its whole storage is swapped (a view
into a larger storage, as flattened optimizers keep, or GPU state is copied into in place).

``plan`` returns None, and the caller takes the copy-in-place path, whenever the checkpoint and
the optimizer do not line up exactly (an optimizer that already has state, a parameter name the
model lacks, a state entry whose size fits no rule here): that path reports mismatches clearly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import _get_fqns
from torch.distributed.tensor import DTensor

STATE = "state"
GROUPS = "param_groups"


def params_by_fqn(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Parameters by the names DCP's state dicts use (wrapper prefixes removed)."""
    out: dict[str, torch.nn.Parameter] = {}
    for name, param in model.named_parameters():
        fqns = _get_fqns(model, name)
        if len(fqns) != 1:
            return {}
        out[next(iter(fqns))] = param
    return out


def plan(
    model: torch.nn.Module,
    optimizers: dict[str, torch.optim.Optimizer],
    metadata: Metadata,
    optim_key: str,
    *,
    skip: set[str] | frozenset[str] = frozenset(),
    skip_path: Callable[[tuple[Any, ...]], bool] = lambda _path: False,
    gpu_on_gpu: bool = False,
) -> dict[str, Any] | None:
    """The ``optim`` subtree to load into (fresh tensors), or None to take the copy path.
    Parameters named in ``skip`` (model keys not loaded), and paths for which ``skip_path`` is
    true (``load_ignore_keys``), get nothing from the checkpoint.
    With ``gpu_on_gpu`` the state of a parameter on a GPU is made on that GPU (the load reads
    it there through ``device_ring``); otherwise every tensor is made on the host."""
    if not optimizers or any(opt.state for opt in optimizers.values()):
        return None
    mappings = metadata.planner_data
    if not isinstance(mappings, dict):
        return None
    params = params_by_fqn(model)
    owned = {
        name: {id(p) for g in opt.param_groups for p in g["params"]}
        for name, opt in optimizers.items()
    }
    tree: dict[str, Any] = {}
    for key, md in metadata.state_dict_metadata.items():
        path = mappings.get(key)
        if not path or path[0] != optim_key:
            continue
        if len(path) < 3 or path[1] not in optimizers or path[2] not in (STATE, GROUPS):
            return None
        if skip_path(tuple(path)):
            continue
        if path[2] == GROUPS:
            set_element(tree, path[1:], None)  # hyperparameters: restored from their bytes
            continue
        if len(path) > 3 and str(path[3]) in skip:
            continue
        if not isinstance(md, TensorStorageMetadata):
            set_element(tree, path[1:], None)  # a plain value (a float step count)
            continue
        if len(path) != 5:
            return None
        param = params.get(str(path[3]))
        if param is None or id(param) not in owned[path[1]]:
            return None
        tensor = _target(param, md, gpu_on_gpu=gpu_on_gpu)
        if tensor is None:
            return None
        set_element(tree, path[1:], tensor)
    return tree or None


def _target(
    param: torch.Tensor, md: TensorStorageMetadata, *, gpu_on_gpu: bool
) -> torch.Tensor | None:
    size, dtype = tuple(md.size), md.properties.dtype
    local_param = param.to_local() if isinstance(param, DTensor) else param
    on_gpu = gpu_on_gpu and local_param.device.type == "cuda" and size != ()
    device = local_param.device if on_gpu else torch.device("cpu")
    if isinstance(param, DTensor):
        if size == tuple(param.shape):
            local = torch.empty(local_param.shape, dtype=dtype, device=device)
            return DTensor.from_local(
                local,
                param.device_mesh,
                param.placements,
                run_check=False,
                shape=param.shape,
                stride=param.stride(),
            )
        if size != ():
            return None  # a factored or otherwise reshaped state of a sharded parameter
    return torch.empty(size, dtype=dtype, device=device)


def adopt(
    model: torch.nn.Module, optimizers: dict[str, torch.optim.Optimizer], loaded: dict[str, Any]
) -> None:
    """Make the verified tensors of ``loaded`` (the subtree ``plan`` built) the live state,
    placed as ``Optimizer.load_state_dict`` places them (a no-op on a CPU run)."""
    params = params_by_fqn(model)
    for name, opt in optimizers.items():
        group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
        for fqn, entries in loaded.get(name, {}).get(STATE, {}).items():
            param = params[fqn]
            group = group_of[id(param)]
            opt.state[param] = {k: _placed(param, group, k, v) for k, v in entries.items()}


def _placed(param: torch.Tensor, group: dict[str, Any], key: str, value: Any) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    if key == "step":
        if group.get("capturable") or group.get("fused"):
            return value.to(dtype=torch.float32, device=param.device)
        return value
    if param.is_floating_point():
        return value.to(dtype=param.dtype, device=param.device)
    return value.to(device=param.device)


@dataclass(frozen=True)
class Exchange:
    """One optimizer state tensor of a running process, to be replaced by its verified
    staging buffer (``exchanges``)."""

    path: str
    """The stager's path for it (``/optim/<name>/state/<fqn>/<key>``)."""
    slot: dict[str, Any]
    """The optimizer's state of its parameter."""
    key: str
    loaded: torch.Tensor
    """The staging buffer (a ``DTensor`` over it under FSDP2), holding the verified bytes."""
    old_local: torch.Tensor
    """The live tensor (its local shard) it replaces; the stager keeps it as the buffer."""


def exchanges(
    model: torch.nn.Module,
    optimizers: dict[str, torch.optim.Optimizer],
    live: dict[str, Any],
    staged: dict[str, Any],
    *,
    prefix: str,
    holds: Callable[[str, torch.Tensor], bool],
) -> list[Exchange]:
    """The optimizer state tensors a verified load may hand over instead of copying into.

    ``live`` and ``staged`` are the ``optim`` subtrees of the load (live state dicts and the
    stager's buffers); ``prefix`` their path; ``holds(path, tensor)`` tells a buffer of the
    stager. A tensor qualifies only when the optimizer holds exactly that object, it lives on
    the CPU, owns its whole storage (not a view into a larger one another object may hold),
    and its buffer matches it in shape, dtype and strides: then nothing but the optimizer's
    slot refers to either, and swapping them changes no other object's view of memory.
    """
    params = params_by_fqn(model)
    found: list[Exchange] = []
    with torch.no_grad():  # a DTensor's local shard itself, not an autograd view of it
        for name, opt in optimizers.items():
            saved_state = staged.get(name, {}).get(STATE, {})
            for fqn, entries in live.get(name, {}).get(STATE, {}).items():
                slot = opt.state.get(params[fqn]) if fqn in params else None
                if not slot or fqn not in saved_state:
                    continue
                for key, value in entries.items():
                    path = f"{prefix}/{name}/{STATE}/{fqn}/{key}"
                    loaded = saved_state[fqn].get(key)
                    old = _exchangeable(value, loaded, slot.get(key), path, holds)
                    if old is not None:
                        found.append(Exchange(path, slot, key, loaded, old))
    return found


def _exchangeable(
    live: Any, loaded: Any, held: Any, path: str, holds: Callable[[str, torch.Tensor], bool]
) -> torch.Tensor | None:
    """The live local tensor when ``loaded`` may replace ``live`` (see ``exchanges``)."""
    if not isinstance(live, torch.Tensor) or held is not live or type(loaded) is not type(live):
        return None
    old = live.to_local() if isinstance(live, DTensor) else live
    new = loaded.to_local() if isinstance(loaded, DTensor) else loaded
    if not holds(path, new) or old.device.type != "cpu" or old.requires_grad:
        return None
    if (old.shape, old.dtype, old.stride()) != (new.shape, new.dtype, new.stride()):
        return None
    whole = old.numel() * old.element_size()
    if old.storage_offset() != 0 or old.untyped_storage().nbytes() != whole:
        return None
    return old


def exchange(found: list[Exchange], keep: Callable[[str, torch.Tensor], None]) -> None:
    """Make each verified buffer the optimizer's state, and hand what it replaces to ``keep``
    (the stager, as the buffer for that path): after it, no buffer is live state."""
    for item in found:
        item.slot[item.key] = item.loaded
        keep(item.path, item.old_local)
