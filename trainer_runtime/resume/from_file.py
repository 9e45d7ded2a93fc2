"""A load path that is one file: what it holds, in the layout the restore code reads.

Two kinds of ``.pt`` file are loadable. A format-version-1 rank file (``{"format_version",
"state", "rng"}``) is restored as it is. A plain model ``state_dict``, what ``torch.save(
model.state_dict(), path)`` and ``rtj-checkpoints export`` write (or such a dict under a
``"model"`` key, the usual layout of hand-written training checkpoints), holds weights and
nothing else: it is wrapped as a weights-only rank file, so the model's keys and shapes are
checked exactly as a checkpoint's are. Anything else (a data file of a sharded checkpoint, a
``.metadata`` file, a dict without tensors) is a ``NoCheckpointError`` that names the argument
and what it accepts. Files are unpickled with ``weights_only`` unless ``trusted_pickle``.
(Rejected: handing whatever the file unpickles to the rank-file restore, which found no
``"state"`` key in a plain ``state_dict`` and loaded nothing, without a word.)
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import NoCheckpointError
from ..save.manifest import MANIFEST_NAME
from .verified_read import VerifiedFile, read_whole

log = logging.getLogger("trainer_runtime")

ACCEPTED = (
    "a run folder, a checkpoint folder, or a .pt file written by torch.save holding a model "
    "state_dict (what `rtj-checkpoints export` writes) or a format-1 rank file"
)


@dataclass
class SingleFile:
    """A loadable file's contents in rank-file layout, and the bytes they live in."""

    data: dict[str, Any]
    weights_only: bool
    """True for a plain state_dict: there is no position, optimizer or RNG to restore."""
    buffer: VerifiedFile


def read_single_file(path: Path, *, shown: str, arg: str, trusted: bool) -> SingleFile:
    """Read ``path`` (``shown`` as ``arg`` in errors: the name the user gave) and classify it."""
    whole = read_whole(path)
    try:
        loaded = whole.load(trusted=trusted)
    except pickle.UnpicklingError as exc:  # a class outside the weights-only allow-list
        reason = str(exc).strip().splitlines()[0]
        raise pickle.UnpicklingError(
            f"{arg} {shown!r} holds objects the weights-only unpickler refuses ({reason}); "
            "if you trust the file, pass trusted_pickle=True to CheckpointManager"
        ) from exc
    except RuntimeError as exc:  # torch's zip reader: not one torch.save archive
        reason = str(exc).split(". ")[0]
        raise NoCheckpointError(
            f"{arg} {shown!r} is not a torch.save file ({reason}){_folder_hint(path)}; "
            f"expected {ACCEPTED}"
        ) from exc
    if _is_rank_file(loaded):
        return SingleFile(loaded, weights_only=False, buffer=whole)
    weights = _model_state_dict(loaded)
    if weights is None:
        raise NoCheckpointError(
            f"{arg} {shown!r} holds {_describe(loaded)}, which is neither a model state_dict nor "
            f"a rank file; expected {ACCEPTED}"
        )
    log.info("%s %s is a plain model state_dict: loading the model weights only", arg, shown)
    return SingleFile({"state": {"model": weights}}, weights_only=True, buffer=whole)


def _is_rank_file(loaded: Any) -> bool:
    return isinstance(loaded, Mapping) and "format_version" in loaded and "state" in loaded


def _model_state_dict(loaded: Any) -> Mapping[str, Any] | None:
    """The ``state_dict`` in ``loaded``: itself, or the mapping under its ``"model"`` key."""
    if _is_state_dict(loaded):
        return loaded
    inner = loaded.get("model") if isinstance(loaded, Mapping) else None
    return inner if _is_state_dict(inner) else None


def _is_state_dict(obj: Any) -> bool:
    """String keys and at least one tensor (``_extra_state`` entries may be anything)."""
    return (
        isinstance(obj, Mapping)
        and all(isinstance(k, str) for k in obj)
        and any(isinstance(v, torch.Tensor) for v in obj.values())
    )


def _describe(loaded: Any) -> str:
    if isinstance(loaded, Mapping):
        keys = ", ".join(map(str, list(loaded)[:6]))
        return f"a dict without tensors at its top level (keys: {keys or 'none'})"
    return f"a {type(loaded).__name__}"


def _folder_hint(path: Path) -> str:
    if (path.parent / MANIFEST_NAME).exists():
        return f" (it is one file of checkpoint {str(path.parent)!r}: pass the folder)"
    return ""
