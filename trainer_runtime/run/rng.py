"""Every random number generator a training step may draw from, captured and restored.

States are stored as plain lists and tensors (no numpy objects) so checkpoints load with
``torch.load(weights_only=True)``, which refuses arbitrary pickles.
"""

from __future__ import annotations

import random
from typing import Any

import torch
import xxhash

try:
    import numpy as np
except ImportError:  # numpy is optional for users; the runtime works without it
    np = None  # type: ignore[assignment]


def _python_state(generator_state: tuple) -> dict[str, Any]:
    version, internal, gauss = generator_state
    return {"version": version, "state": list(internal), "gauss": gauss}


def _numpy_state(legacy_state: tuple) -> dict[str, Any]:
    """numpy's legacy generator state as plain values and a tensor (weights_only-safe)."""
    kind, keys, pos, has_gauss, cached = legacy_state
    return {
        "kind": str(kind),
        "keys": torch.from_numpy(keys.astype("int64")),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def capture() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": _python_state(random.getstate()),
        "torch": torch.get_rng_state(),
    }
    if np is not None:
        state["numpy"] = _numpy_state(np.random.get_state(legacy=True))
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
        # One state per device the saving process saw. A pod with another number of GPUs
        # restores the devices both have; a device the checkpoint lacks keeps its seed.
        for index, device_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, index)


def derived(saved: dict[str, Any], rank: int) -> dict[str, Any]:
    """Generator state for a rank that did not exist when the checkpoint was saved.

    Seeded from rank 0's saved torch generator state and the new rank, so the stream is
    reproducible (same checkpoint, same rank: same numbers) and differs from every other rank.
    CUDA generators, when the checkpoint has them and this process has CUDA, are seeded the
    same way, one per device, each device differently.
    """
    seed_src = saved["torch"].numpy().tobytes() + f"/rank{rank}".encode()
    seed = xxhash.xxh3_64_intdigest(seed_src) & ((1 << 63) - 1)
    out: dict[str, Any] = {
        "python": _python_state(random.Random(seed).getstate()),
        "torch": torch.Generator().manual_seed(seed).get_state(),
    }
    if "numpy" in saved and np is not None:
        seeded = np.random.RandomState(seed % (1 << 32))
        out["numpy"] = _numpy_state(seeded.get_state(legacy=True))
    if "cuda" in saved and torch.cuda.is_available():
        out["cuda"] = [
            torch.Generator(device=f"cuda:{index}").manual_seed(seed + 1 + index).get_state()
            for index in range(min(len(saved["cuda"]), torch.cuda.device_count()))
        ]
    return out
