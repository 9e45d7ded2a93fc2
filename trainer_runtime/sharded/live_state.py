"""The live state as the sharded engine sees it: the tensor tree DCP saves and loads, and the
small components saved beside it.

Both the save side (``engine.py``) and the load side (``load.py``) take the same tree, so they
are built here once: the model state dict, and one optimizer state dict per optimizer, keyed by
parameter name through ``torch.distributed.checkpoint.state_dict`` (so DDP, FSDP2 and
single-process layouts are interchangeable).
"""

from __future__ import annotations

from typing import Any

from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from ..save import rank_contents as state_mod
from .keys import MODEL_KEY, OPTIM_KEY


def tensor_state(components: state_mod.Components, *, weights_only: bool) -> dict[str, Any]:
    """``{model: ..., optim: {name: ...}}`` with live tensor references; the optimizers are
    left out with ``weights_only`` (taking an optimizer's state dict initialises its state)."""
    out: dict[str, Any] = {}
    if components.model is None:
        return out
    opts = StateDictOptions()
    out[MODEL_KEY] = get_model_state_dict(components.model, options=opts)
    if not weights_only and components.optimizers:
        out[OPTIM_KEY] = {
            name: get_optimizer_state_dict(components.model, opt, options=opts)
            for name, opt in components.optimizers.items()
        }
    return out


def small_components(components: state_mod.Components) -> state_mod.Components:
    """The components saved in each rank's small state (``ranks/<r>``), not by DCP."""
    return state_mod.Components(
        schedulers=components.schedulers,
        scaler=components.scaler,
        stateful=components.stateful,
    )
