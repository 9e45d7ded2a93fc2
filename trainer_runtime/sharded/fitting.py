"""Fitting a checkpoint to the live components before a load: what to read, and into what.

``load_ignore_keys`` patterns drop keys from the load target; ``fit_model`` checks the live
model against the checkpoint's metadata (strictly, or skipping missing and mis-shaped keys);
``optimizer_state`` gives the live optimizers' state as a target without the skipped
parameters; ``restore_param_groups`` puts back the hyperparameters once the load verified.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from ..errors import IncompatibleCheckpointError
from ..save import rank_contents as state_mod
from . import optim_target
from .keys import MODEL_KEY, OPTIM_KEY


def optimizers_ignored(patterns: list[str]) -> bool:
    """Whether the patterns leave out every optimizer."""
    return state_mod.path_ignored(("state", "optimizers"), patterns)


def optimizer_path_ignored(path: tuple[Any, ...], patterns: list[str]) -> bool:
    """Whether the patterns leave out ``path`` of the optimizers' subtree: ``(OPTIM_KEY, name,
    'state', fqn, key)``, ``(OPTIM_KEY, name, 'param_groups')`` or a path above them."""
    return state_mod.path_ignored(("state", "optimizers", *map(str, path[1:])), patterns)


def model_key_ignored(key: str, patterns: list[str]) -> bool:
    return state_mod.path_ignored(("state", "model", key), patterns)


def drop_ignored(live: dict[str, Any], patterns: list[str]) -> list[str]:
    """Remove from the load target what the ``load_ignore_keys`` patterns leave out; returns
    the model keys removed (their parameters' optimizer state is left out too: it belongs to
    the values that are not loaded)."""
    if not patterns:
        return []
    if optimizers_ignored(patterns):
        live.pop(OPTIM_KEY, None)
    model = live.get(MODEL_KEY, {})
    dropped = [k for k in model if model_key_ignored(k, patterns)]
    for key in dropped:
        del model[key]
    return dropped


def fit_model(
    model: dict[str, Any], metadata: Metadata, *, strict: bool, ignored: list[str]
) -> list[str]:
    """Raise when the model does not fit; not ``strict``, drop from ``model`` the keys the
    checkpoint lacks and those whose shape differs, and return the latter."""
    prefix = f"{MODEL_KEY}."
    saved = {
        k[len(prefix) :]: torch.empty(tuple(md.size), device="meta")
        for k, md in metadata.state_dict_metadata.items()
        if k.startswith(prefix)
        and isinstance(md, TensorStorageMetadata)
        and not model_key_ignored(k[len(prefix) :], ignored)
    }  # an ignored key is neither loaded nor expected
    skipped = state_mod.check_model_fits(model, saved, strict=strict, ignored=ignored)
    if not strict:
        for key in [k for k in model if k not in saved or k in skipped]:
            del model[key]
    return skipped


def optimizer_state(
    components: state_mod.Components,
    metadata: Metadata,
    *,
    skip: set[str],
    ignored: list[str],
) -> dict[str, Any]:
    """The live optimizers' state to load into: without the parameters in ``skip``, without
    what the ``ignored`` patterns leave out, and without the state entries the checkpoint does
    not hold. Those stay as they are: a parameter that ``strict=False`` leaves out of the load
    (the checkpoint lacks it) keeps its live value, and its optimizer state with it. Read into,
    they would get whatever the unread buffer held."""
    if components.model is None or not components.optimizers:
        return {}
    saved = _saved_paths(metadata)

    def loaded(path: tuple[str, ...]) -> bool:
        return (saved is None or path in saved) and not optimizer_path_ignored(path, ignored)

    tree = {}
    for name, opt in components.optimizers.items():
        if optimizer_path_ignored((OPTIM_KEY, name), ignored):
            continue  # it keeps its state (taking its state dict would initialise it)
        osd = get_optimizer_state_dict(components.model, opt, options=StateDictOptions())
        if optimizer_path_ignored((OPTIM_KEY, name, optim_target.GROUPS), ignored):
            osd.pop(optim_target.GROUPS, None)
        state = osd.get(optim_target.STATE, {})
        for fqn in list(state):
            # A new dict: the entries' dict is the optimizer's own state of the parameter.
            kept = {
                k: v
                for k, v in state[fqn].items()
                if loaded((OPTIM_KEY, name, optim_target.STATE, fqn, str(k)))
            }
            if fqn in skip or not kept:
                del state[fqn]
            else:
                state[fqn] = kept
        tree[name] = osd
    return {OPTIM_KEY: tree}


def _saved_paths(metadata: Metadata) -> set[tuple[str, ...]] | None:
    """Every state-dict path the checkpoint holds, or None where its metadata does not say."""
    mappings = metadata.planner_data
    if not isinstance(mappings, dict):
        return None
    return {tuple(map(str, path)) for path in mappings.values()}


def restore_param_groups(optimizers: dict[str, Any], loaded: dict[str, Any]) -> None:
    """Hyperparameters (lr, betas...) per group, as ``Optimizer.load_state_dict`` does."""
    for name, opt in optimizers.items():
        groups = loaded.get(name, {}).get("param_groups")
        if not groups:
            continue
        if len(groups) != len(opt.param_groups):
            raise IncompatibleCheckpointError(
                f"optimizer {name!r} has {len(opt.param_groups)} param groups, the "
                f"checkpoint {len(groups)}"
            )
        for live_group, saved_group in zip(opt.param_groups, groups, strict=True):
            for key, value in saved_group.items():
                if key != "params":
                    live_group[key] = value
