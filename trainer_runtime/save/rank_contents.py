"""What goes into a rank's checkpoint file, and how it comes back out.

The file holds one dict: ``{"format_version", "state": {...}, "rng": {...}}``. ``state`` has the
model, optimizers, schedulers, grad scaler, the timestamp, every registered stateful object
(samplers, datasets, metrics objects), plain metrics, the run name and user extras. Keys can be
dropped on load with slash paths such as ``state/optimizers`` or ``state/model/head.*``.
"""

from __future__ import annotations

import fnmatch
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from ..errors import ConfigError, IncompatibleCheckpointError
from ..resume import full_to_sharded
from ..run import rng
from ..sampler import ResumableSampler

log = logging.getLogger("trainer_runtime")

FILE_FORMAT_VERSION = 1
_MAX_LISTED = 12


@runtime_checkable
class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> Any: ...


STATEFUL = "an object with state_dict() and load_state_dict()"


def named(objs: Any, what: str) -> dict[str, Any]:
    """Normalise one object, a sequence or a mapping of them into a name -> object dict; a
    ``ConfigError`` names ``what`` (and the entry) when one of them has no state to save."""
    if objs is None:
        return {}
    if isinstance(objs, Mapping):
        found = {str(k): v for k, v in objs.items()}
        where = "{what}[{key!r}]"
    elif isinstance(objs, list | tuple):
        found = {str(i): v for i, v in enumerate(objs)}
        where = "{what}[{key}]"
    else:
        found, where = {"0": objs}, "{what}"
    for key, obj in found.items():
        if not isinstance(obj, Stateful):
            raise ConfigError(
                f"{where.format(what=what, key=key)}: expected {STATEFUL} (or a list or dict "
                f"of them), got {type(obj).__name__}"
            )
    return found


def unwrap(model: nn.Module) -> nn.Module:
    """The module whose keys are saved: without DDP/FSDP-like wrappers (``module.``) and
    ``torch.compile`` wrappers (``_orig_mod.``), in any nesting, so a checkpoint loads into the
    plain model."""
    seen: set[int] = set()
    while id(model) not in seen:
        seen.add(id(model))
        compiled = getattr(model, "_orig_mod", None)  # torch._dynamo OptimizedModule
        if isinstance(compiled, nn.Module):
            model = compiled
            continue
        inner = getattr(model, "module", None)
        if isinstance(inner, nn.Module):
            model = inner
    return model


@dataclass
class Components:
    """Live training objects the manager saves and restores."""

    model: nn.Module | None = None
    optimizers: dict[str, Any] = field(default_factory=dict)
    schedulers: dict[str, Any] = field(default_factory=dict)
    scaler: Any = None
    stateful: dict[str, Any] = field(default_factory=dict)

    def model_state(self) -> dict[str, torch.Tensor]:
        return {} if self.model is None else unwrap(self.model).state_dict()

    def parameter_names(self) -> set[str]:
        if self.model is None:
            return set()
        return {n for n, _ in unwrap(self.model).named_parameters()}


def checked_components(
    *, model: Any, optimizer: Any, scheduler: Any, scaler: Any, stateful: Any, sampler: Any
) -> Components:
    """The manager's live objects, each checked once, at construction: a ``ConfigError``
    names the argument instead of an ``AttributeError`` at the first save."""
    if model is not None and not isinstance(model, nn.Module):
        raise ConfigError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    if scaler is not None and not isinstance(scaler, Stateful):
        raise ConfigError(f"scaler: expected {STATEFUL}, got {type(scaler).__name__}")
    if stateful is not None and not isinstance(stateful, Mapping):
        raise ConfigError(
            f"stateful: expected a dict of name -> {STATEFUL}, got {type(stateful).__name__}"
        )
    if sampler is not None and not isinstance(sampler, ResumableSampler):
        raise ConfigError(
            f"sampler: expected a trainer_runtime.ResumableSampler, got {type(sampler).__name__}"
        )
    return Components(
        model=model,
        optimizers=named(optimizer, "optimizer"),
        schedulers=named(scheduler, "scheduler"),
        scaler=scaler,
        stateful={
            **named(stateful, "stateful"),
            **({"sampler": sampler} if sampler is not None else {}),
        },
    )


def capture(
    comps: Components,
    *,
    timestamp: dict[str, Any],
    run_name: str,
    metrics: dict[str, Any],
    extras: dict[str, Any],
    weights_only: bool,
) -> dict[str, Any]:
    """The checkpoint dict with *live* tensor references; copy before training moves on."""
    state: dict[str, Any] = {
        "model": comps.model_state(),
        "timestamp": dict(timestamp),
        "run_name": run_name,
    }
    if not weights_only:
        state["optimizers"] = {k: o.state_dict() for k, o in comps.optimizers.items()}
        state["schedulers"] = {k: s.state_dict() for k, s in comps.schedulers.items()}
        state["scaler"] = None if comps.scaler is None else comps.scaler.state_dict()
        state["stateful"] = {k: s.state_dict() for k, s in comps.stateful.items()}
        state["metrics"] = dict(metrics)
        state["extras"] = dict(extras)
    out: dict[str, Any] = {"format_version": FILE_FORMAT_VERSION, "state": state}
    if not weights_only:
        out["rng"] = rng.capture()
    return out


def copy_tree(
    obj: Any,
    *,
    skip: Callable[[torch.Tensor], bool] | None = None,
    staging: dict[str, torch.Tensor] | None = None,
    path: str = "",
) -> Any:
    """Deep copy of containers with every tensor cloned to host memory.

    Tensors for which ``skip`` is true are kept as references (the caller copies them later).
    With ``staging``, copies go into buffers kept from the previous snapshot (keyed by path)
    when shape and dtype match: no allocation, no page faults, just a memcpy.
    """
    if isinstance(obj, torch.Tensor):
        if skip is not None and skip(obj):
            return obj
        if isinstance(obj, DTensor):
            # FSDP2 / tensor-parallel shard: copy this rank's local part only (no collective)
            # and re-wrap it with the same mesh and placements.
            local = copy_tree(local_tensor(obj), staging=staging, path=path)
            return DTensor.from_local(
                local,
                obj.device_mesh,
                obj.placements,
                run_check=False,
                shape=obj.shape,
                stride=obj.stride(),
            )
        if staging is None:
            return obj.detach().to("cpu", copy=True)
        buf = staging.get(path)
        if buf is None or buf.shape != obj.shape or buf.dtype != obj.dtype:
            buf = torch.empty(obj.shape, dtype=obj.dtype, device="cpu")
            staging[path] = buf
        buf.copy_(obj.detach())
        return buf
    if isinstance(obj, dict):
        out = {
            k: copy_tree(v, skip=skip, staging=staging, path=f"{path}/{k}") for k, v in obj.items()
        }
        if isinstance(obj, OrderedDict):
            out = OrderedDict(out)
            meta = getattr(obj, "_metadata", None)
            if meta is not None:
                out._metadata = meta  # type: ignore[attr-defined]  # module versions
        return out
    if isinstance(obj, list | tuple):
        items = [
            copy_tree(v, skip=skip, staging=staging, path=f"{path}/{i}") for i, v in enumerate(obj)
        ]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor that holds this rank's data: a DTensor's local shard, else ``t`` itself.

    A DTensor is a wrapper subclass without storage of its own (``untyped_storage()`` on it
    raises), so storage identity and host copies go through the local shard.
    """
    return t.to_local().detach() if isinstance(t, DTensor) else t.detach()


def iter_tensors(obj: Any) -> Iterable[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from iter_tensors(v)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from iter_tensors(v)


def path_ignored(parts: tuple[str, ...], patterns: list[str]) -> bool:
    """Whether the ``load_ignore_keys`` patterns leave out the path ``parts`` (``("state",
    "model", key)``...): a pattern that matches it or any path above it, as ``drop_keys``
    drops a whole subtree. Both formats' loads use this rule."""
    return any(
        fnmatch.fnmatchcase("/".join(parts[:n]), p)
        for n in range(1, len(parts) + 1)
        for p in patterns
    )


def drop_keys(tree: dict[str, Any], patterns: Iterable[str]) -> list[str]:
    """Delete every path matching a pattern (fnmatch over ``a/b/c`` paths); returns them."""
    patterns = [p.strip("/") for p in patterns]
    dropped: list[str] = []

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key in list(node):
            path = f"{prefix}{key}"
            if any(fnmatch.fnmatchcase(path, p) for p in patterns):
                del node[key]
                dropped.append(path)
            elif isinstance(node[key], dict):
                walk(node[key], path + "/")

    walk(tree, "")
    return dropped


def _shape(t: Any) -> tuple[int, ...] | None:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else None


def check_model_fits(
    model_state: Mapping[str, Any],
    saved: Mapping[str, Any],
    *,
    strict: bool,
    ignored: Iterable[str] = (),
) -> list[str]:
    """Raise one error that names every missing, unexpected and mis-shaped key; not
    ``strict``, the mis-shaped keys are returned instead (with a warning), to be skipped."""
    ignored = set(ignored)
    missing = sorted(k for k in model_state if k not in saved and f"state/model/{k}" not in ignored)
    unexpected = sorted(k for k in saved if k not in model_state)
    mis_shaped = sorted(
        k for k, v in model_state.items() if k in saved and _shape(saved[k]) != _shape(v)
    )
    shapes = [
        f"{k}: checkpoint {_shape(saved[k])} vs model {_shape(model_state[k])}" for k in mis_shaped
    ]
    if shapes and not strict:
        log.warning(
            "load_strict=False: not loading %d model key(s) whose shape differs (they keep "
            "their current values, their optimizer state too): %s",
            len(shapes),
            _listing(shapes),
        )
        return mis_shaped
    problems: list[str] = []
    if shapes:
        problems.append("shape mismatch: " + _listing(shapes))
    if strict and missing:
        problems.append("missing from checkpoint: " + _listing(missing))
    if strict and unexpected:
        problems.append("not in model: " + _listing(unexpected))
    if problems:
        hint = "" if not strict else " (pass load_strict=False to load the keys that do match)"
        raise IncompatibleCheckpointError(
            "checkpoint does not fit the model; " + "; ".join(problems) + hint
        )
    return []


def _listing(items: list[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    more = len(items) - _MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def check_data_position(comps: Components, data: dict[str, Any], patterns: Iterable[str]) -> None:
    """Before anything live changes: a ``DataPositionError`` when the sampler's saved position
    is another dataset's (it was raised after the weights had been loaded, leaving a model of
    the checkpoint beside a fresh position)."""
    sampler = comps.stateful.get("sampler")
    saved = data.get("state", {}).get("stateful", {}).get("sampler")
    check = getattr(sampler, "check_state", None)
    key = ("state", "stateful", "sampler")
    if check is None or not isinstance(saved, dict):
        return
    if path_ignored(key, [p.strip("/") for p in patterns]):
        return
    check(saved)


def restore(
    comps: Components,
    data: dict[str, Any],
    *,
    weights_only: bool,
    strict: bool,
    ignore_keys: Iterable[str] = (),
) -> dict[str, Any]:
    """Load ``data`` into the live components; returns the (filtered) saved ``state`` dict."""
    patterns = [p.strip("/") for p in ignore_keys]
    if not weights_only:  # a weights-only load leaves the sampler as it is
        check_data_position(comps, data, patterns)
    dropped = set(drop_keys(data, patterns)) if patterns else set()
    state = data.get("state", {})
    ignored = _ignored_params(comps.model, patterns)
    skipped: list[str] = []
    if comps.model is not None and "model" in state:
        target = unwrap(comps.model)
        saved = state["model"]
        skipped = check_model_fits(target.state_dict(), saved, strict=strict, ignored=dropped)
        if skipped:
            saved = {k: v for k, v in saved.items() if k not in skipped}
        if full_to_sharded.is_sharded(target):  # FSDP2: full tensors into DTensor shards
            saved = full_to_sharded.model_state_like(target.state_dict(), saved)
        target.load_state_dict(saved, strict=strict and not dropped)
    if skipped or ignored:  # not loaded: their parameters keep their optimizer state too
        _keep_live_optimizer_state(comps, state.get("optimizers", {}), [*skipped, *ignored])
    if weights_only:
        return state
    for name, opt in comps.optimizers.items():
        saved_opt = state.get("optimizers", {}).get(name)
        if saved_opt is None:
            continue
        if isinstance(saved_opt, dict) and not {"state", "param_groups"} <= saved_opt.keys():
            # load_ignore_keys left out its state or its param groups: those keep their live
            # values (both keyed by position, as the saved ones are).
            saved_opt = {**opt.state_dict(), **saved_opt}
        if _optimizer_fits(name, opt, saved_opt, strict=strict):
            opt.load_state_dict(full_to_sharded.optimizer_state_like(opt, saved_opt))
    for name, sched in comps.schedulers.items():
        if name in state.get("schedulers", {}):
            sched.load_state_dict(state["schedulers"][name])
    if comps.scaler is not None and state.get("scaler") is not None:
        comps.scaler.load_state_dict(state["scaler"])
    for name, obj in comps.stateful.items():
        if name in state.get("stateful", {}):
            obj.load_state_dict(state["stateful"][name])
    if "rng" in data:
        rng.restore(data["rng"])
    return state


def _ignored_params(model: nn.Module | None, patterns: list[str]) -> list[str]:
    """The model's parameters that the ``load_ignore_keys`` patterns leave out."""
    if model is None or not patterns:
        return []
    params = unwrap(model).named_parameters()
    return [n for n, _ in params if path_ignored(("state", "model", n), patterns)]


def _optimizer_fits(
    name: str, opt: torch.optim.Optimizer, saved: Mapping[str, Any], *, strict: bool
) -> bool:
    """Whether the saved optimizer state has the live optimizer's parameter groups, of the
    same sizes (``Optimizer.load_state_dict`` pairs parameters by position and refuses
    anything else). Otherwise strict: ``IncompatibleCheckpointError``; not strict: a warning,
    and the optimizer keeps its current state."""
    groups = saved.get("param_groups") if isinstance(saved, Mapping) else None
    if not isinstance(groups, list):
        return True  # not a torch optimizer's state dict: its own load_state_dict judges
    saved_sizes = [len(g.get("params", ())) for g in groups]
    live_sizes = [len(g["params"]) for g in opt.param_groups]
    if saved_sizes == live_sizes:
        return True
    why = (
        f"optimizer {name!r}: the checkpoint's parameter groups hold {saved_sizes} "
        f"parameters, the live optimizer's {live_sizes} (the model gained or lost parameters)"
    )
    if strict:
        raise IncompatibleCheckpointError(
            f"checkpoint does not fit the {why} (pass load_strict=False to load the model "
            "and leave this optimizer's state as it is)"
        )
    log.warning("load_strict=False: not loading the state of %s; it keeps its current state", why)
    return False


def _keep_live_optimizer_state(
    comps: Components, saved_optimizers: Mapping[str, Any], skipped: Iterable[str]
) -> None:
    """Put the live optimizer state of the parameters named in ``skipped`` (their shape
    changed) in place of their saved state, so loading keeps it. Saved state is keyed by
    position: the n-th parameter of the saved groups is the n-th of the live ones, as
    ``Optimizer.load_state_dict`` pairs them."""
    by_name = dict(unwrap(comps.model).named_parameters()) if comps.model is not None else {}
    skipped_ids = {id(by_name[k]) for k in skipped if k in by_name}
    for name, opt in comps.optimizers.items():
        saved = saved_optimizers.get(name)
        if not saved or not skipped_ids:
            continue
        live = [p for group in opt.param_groups for p in group["params"]]
        saved_ids = [i for group in saved.get("param_groups", []) for i in group["params"]]
        saved_state = saved.setdefault("state", {})
        for param, saved_id in zip(live, saved_ids, strict=False):
            if id(param) not in skipped_ids:
                continue
            saved_state.pop(saved_id, None)
            if opt.state.get(param):
                saved_state[saved_id] = dict(opt.state[param])
