"""Every random number generator a training step may draw from, captured and restored.

States are stored as plain lists and tensors (no numpy objects) so checkpoints load with
``torch.load(weights_only=True)``, which refuses arbitrary pickles.
"""

from __future__ import annotations

import random
from typing import Any

import torch

try:
    import numpy as np
except ImportError:  # numpy is optional for users; the runtime works without it
    np = None  # type: ignore[assignment]


def capture() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss": gauss},
        "torch": torch.get_rng_state(),
    }
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state["numpy"] = {
            "kind": str(kind),
            "keys": torch.from_numpy(keys.astype("int64")),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> None:
    py = state.get("python")
    if py is not None:
        random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    npst = state.get("numpy")
    if npst is not None and np is not None:
        np.random.set_state(
            (
                npst["kind"],
                npst["keys"].numpy().astype("uint32"),
                npst["pos"],
                npst["has_gauss"],
                npst["cached_gaussian"],
            )
        )
    if "cuda" in state and torch.cuda.is_available():
        states = state["cuda"]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
