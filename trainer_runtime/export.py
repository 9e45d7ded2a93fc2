"""Exporting a checkpoint's model weights as a plain ``state_dict`` file.

A rank file holds much more than weights (optimizer, RNG, data position, runtime bookkeeping)
in the runtime's own layout. For inference, fine-tuning elsewhere or sharing, people want what
``torch.save(model.state_dict(), path)`` would have written: ``rtj-checkpoints export`` (and
``export_weights``) write exactly that, from a verified checkpoint, so
``model.load_state_dict(torch.load(path, weights_only=True))`` works on the plain model.
Model weights are replicated across data-parallel ranks, so rank 0's file is the source.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import atomic
from .errors import ManifestError, NoCheckpointError
from .layout import RunFolder
from .manifest import MANIFEST_NAME, Manifest
from .serialization import load_file


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint folder as given, or a run folder's newest checkpoint that verifies."""
    if (path / MANIFEST_NAME).exists():
        return path
    folder = RunFolder(path)
    for manifest in folder.committed():
        if folder.verify(manifest, [0]) is None:
            return path / manifest.name
    raise NoCheckpointError(f"{str(path)!r} holds no checkpoint whose rank 0 file verifies")


def export_weights(source: Path, out: Path, *, trusted: bool = False) -> Path:
    """Write the model ``state_dict`` of ``source`` (checkpoint or run folder) to ``out``;
    returns the checkpoint folder it came from."""
    ckpt = resolve_checkpoint(Path(source))
    manifest = Manifest.read(ckpt)
    reason = RunFolder(ckpt.parent).verify(manifest, [0])
    if reason is not None:
        raise NoCheckpointError(f"checkpoint {ckpt} does not verify: {reason}")
    entries = manifest.files_for_rank(0)
    if not entries:
        raise ManifestError(f"{ckpt}/{MANIFEST_NAME} lists no file for rank 0")
    data = load_file(ckpt / entries[0].path, trusted=trusted)
    weights = data.get("state", {}).get("model")
    if not isinstance(weights, dict) or not weights:
        raise NoCheckpointError(f"checkpoint {ckpt} holds no model weights")
    plain = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in weights.items()}
    out = Path(out)
    atomic.makedirs_durable(out.parent.resolve())
    atomic.write_atomic(out, lambda f: torch.save(plain, f))
    return ckpt
